#include "walgate/transform/json.hpp"
#include "walgate/transform/pg_array.hpp"

#include <boost/json/parse.hpp>
#include <doctest/doctest.h>

#include <string>

using namespace walgate::transform;
using namespace std::string_literals;

namespace {
std::string js(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}
bool parses(const std::string& s) {
  boost::system::error_code ec;
  boost::json::parse(s, ec);
  return !ec;
}
struct collect final : array_visitor {
  std::string log;
  void begin_array() override { log += "["; }
  void end_array() override { log += "]"; }
  void element(std::string_view v) override { log += "<" + std::string(v) + ">"; }
  void null() override { log += "N"; }
};
std::string arr(std::string_view text, char delim = ',') {
  collect c;
  if (!parse_pg_array(text, delim, c)) return "invalid";
  return c.log;
}
}  // namespace

TEST_CASE("JSON strings: quotes, backslashes, control characters, UTF-8 and invalid bytes") {
  CHECK(js("plain") == "\"plain\"");
  CHECK(js("a\"b\\c") == "\"a\\\"b\\\\c\"");
  CHECK(js("\n\r\t\b\f") == "\"\\n\\r\\t\\b\\f\"");
  CHECK(js("\x01\x1f"s) == "\"\\u0001\\u001f\"");
  CHECK(js("\0x"s) == "\"\\u0000x\"");
  CHECK(js("\x7f") == "\"\x7f\"");
  CHECK(js("é€😀") == "\"é€😀\"");          // 2-, 3- and 4-byte sequences kept
  CHECK(js("\xff") == "\"\\ufffd\"");        // invalid byte
  CHECK(js("a\xc3") == "\"a\\ufffd\"");      // truncated sequence
  CHECK(js("\xc0\xaf") == "\"\\ufffd\\ufffd\"");   // overlong
  CHECK(js("\xed\xa0\x80") == "\"\\ufffd\\ufffd\\ufffd\"");   // surrogate
  CHECK(js("\xf4\x90\x80\x80") == "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");   // above U+10FFFF
  for (int b = 0; b < 256; ++b) CHECK(parses(js(std::string(1, static_cast<char>(b)))));
}

TEST_CASE("JSON numbers are recognised exactly") {
  for (const char* ok : {"0", "-0", "12", "-12.5", "1e10", "1E+10", "1.5e-3", "123456789012345678901234567890.123"})
    CHECK_MESSAGE(is_json_number(ok), ok);
  for (const char* bad : {"", "-", "01", "1.", ".5", "1e", "NaN", "Infinity", "-Infinity", "+1", "1 ", "0x10",
                          "-123456E789071234567001"})
    CHECK_MESSAGE(!is_json_number(bad), bad);
}

TEST_CASE("array literals: nesting, quoting, NULL, dimensions, delimiters") {
  CHECK(arr("{}") == "[]");
  CHECK(arr("{1,2,NULL}") == "[<1><2>N]");
  CHECK(arr("{{1,2},{3,4}}") == "[[<1><2>][<3><4>]]");
  CHECK(arr(R"({"a b","c\"d","NULL",null,"back\\slash"})") == "[<a b><c\"d><NULL>N<back\\slash>]");
  CHECK(arr("[0:1]={7,8}") == "[<7><8>]");
  CHECK(arr("{(1,2),(0,0);(3,4),(1,1)}", ';') == "[<(1,2),(0,0)><(3,4),(1,1)>]");
  CHECK(arr("{1,2") == "invalid");
  CHECK(arr("{1,,2}") == "invalid");
  CHECK(arr("{1}x") == "invalid");
  CHECK(arr("1,2") == "invalid");
  CHECK(arr(R"({"unterminated})") == "invalid");
  CHECK(arr("{{{{{{{1}}}}}}}") == "invalid");   // 7 dimensions
}
