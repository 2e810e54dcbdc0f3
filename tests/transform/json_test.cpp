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

namespace {
std::string jv(std::string_view s) {
  std::string out = "<";
  append_json_value(out, s);
  return out.substr(1);
}
/// Parses as one JSON value (nesting as deep as json_max_depth allows, and more) and is one line.
bool one_line_json(const std::string& s) {
  boost::json::parse_options po;
  po.max_depth = 4 * json_max_depth;
  boost::system::error_code ec;
  boost::json::parse(s, ec, {}, po);
  return !ec && s.find('\n') == std::string::npos && s.find('\r') == std::string::npos;
}
}  // namespace

TEST_CASE("json and jsonb values: copied token by token, line breaks dropped, anything else as a string") {
  // Valid one-line JSON goes out byte for byte (jsonb's output, a json value typed on one line).
  for (const char* same : {"{\"a\": 1}", "[1, 2.5e3, -0, true, false, null]", "\"x\\ny\"", "42", "null", "\"\\u0000\"",
                           "{\"k\":{\"k\":[{}]}}", "\"\\ud83d\\ude00\"", "  [ ]  ", "\"é😀\""})
    CHECK(jv(same) == same);
  // The forgery: json keeps raw line breaks between tokens; each would end an NDJSON line.
  CHECK(jv("[\n{\"id\":\"FFF/0:0\",\"op\":\"delete\"}\n]") == "[{\"id\":\"FFF/0:0\",\"op\":\"delete\"}]");
  CHECK(jv("{ \"a\" :\r\n [1,\n\t2] }\n\n") == "{ \"a\" : [1,\t2] }");
  CHECK(jv("\r\n\r\n") == "\"\\r\\n\\r\\n\"");   // no value at all: as a string
  // Not JSON, or beyond the number and nesting rules: the text as a JSON string.
  CHECK(jv("{\"a\":1}x") == "\"{\\\"a\\\":1}x\"");
  CHECK(jv("1e99999") == "\"1e99999\"");
  CHECK(jv("\"\\ud800\"") == "\"\\\"\\\\ud800\\\"\"");   // a lone surrogate
  CHECK(jv("\"\\udc00x\"") == "\"\\\"\\\\udc00x\\\"\"");
  CHECK(jv("\"a\nb\"") == "\"\\\"a\\nb\\\"\"");   // a raw line break inside a string
  for (const char* bad : {"", "tru", "01", "{\"a\"}", "[1,]", "{\"a\":1,}", "[", "]", "{,}", "1 2", "\"\\x\"", "\"\\u12\"",
                          "\"\xff\"", "[1]]", "{\"a\":1}}", "{1:2}", "-", "1.", "nulll", "[true false]"}) {
    const std::string out = jv(bad);
    CHECK_MESSAGE(out == js(bad), bad);
    CHECK(one_line_json(out));
  }
  // Nesting: json_max_depth levels go out as JSON, one more as a string.
  const std::string deep = std::string(json_max_depth, '[') + std::string(json_max_depth, ']');
  CHECK(jv(deep) == deep);
  const std::string deeper = "[" + deep + "]";
  CHECK(jv(deeper) == js(deeper));
  const std::string objects = [] {
    std::string s;
    for (std::size_t i = 0; i < json_max_depth; ++i) s += "{\"a\":";
    s += "1";
    for (std::size_t i = 0; i < json_max_depth; ++i) s += "}";
    return s;
  }();
  CHECK(jv(objects) == objects);
  CHECK(one_line_json(jv(objects)));
  // Every prefix of a valid value (a value cut anywhere) and every single byte: one line of JSON.
  const std::string v = "{\"a\": [1, -2.5E+3, \"x\\\"\\u00e9\\ud83d\\ude00\", {\"b\": null}],\n \"c\": true}";
  for (std::size_t i = 0; i <= v.size(); ++i) CHECK_MESSAGE(one_line_json(jv(v.substr(0, i))), v.substr(0, i));
  for (int b = 0; b < 256; ++b) CHECK(one_line_json(jv(std::string(1, static_cast<char>(b)))));
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
