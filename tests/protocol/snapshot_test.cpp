// pg_current_snapshot()'s text and the visibility of a 32-bit xid in it; COPY text rows.
#include "walgate/protocol/snapshot.hpp"

#include <doctest/doctest.h>

using namespace walgate::protocol;

namespace {
std::vector<std::pair<char, std::string>> row(std::string_view line) {
  std::string storage, error;
  std::vector<pgoutput::tuple_column> cols;
  REQUIRE_MESSAGE(parse_copy_text_row(line, storage, cols, error), error);
  std::vector<std::pair<char, std::string>> out;
  for (const auto& c : cols) out.emplace_back(static_cast<char>(c.kind), std::string(as_string_view(c.value)));
  return out;
}
bool malformed(std::string_view line) {
  std::string storage, error;
  std::vector<pgoutput::tuple_column> cols;
  bool ok = parse_copy_text_row(line, storage, cols, error);
  CHECK((ok || !error.empty()));
  return !ok;
}
}  // namespace

TEST_CASE("pg_current_snapshot text: parsed, printed back, malformed refused") {
  auto s = parse_pg_snapshot("740:750:741,745");
  REQUIRE(s);
  CHECK(s->xmin == 740);
  CHECK(s->xmax == 750);
  CHECK(s->xip == std::vector<std::uint64_t>{741, 745});
  CHECK(s->to_string() == "740:750:741,745");
  auto empty = parse_pg_snapshot("12:12:");
  REQUIRE(empty);
  CHECK(empty->xip.empty());
  for (const char* bad : {"", "1", "1:2", "5:4:", "1:9:0", "1:9:9", "1:9:3,3", "1:9:4,3", "1:9:3,", "a:9:", "1:9:3,x",
                          "1:99999999999999999999999:", "-1:9:"}) {
    INFO(bad);
    CHECK_FALSE(parse_pg_snapshot(bad));
  }
}

TEST_CASE("a transaction's visibility in a snapshot, by its 32-bit xid across an epoch") {
  auto s = *parse_pg_snapshot("740:750:741,745");
  CHECK(s.sees(100));     // long finished
  CHECK(s.sees(739));
  CHECK(s.sees(740));     // not listed as running (a real snapshot lists xmin when it runs)
  CHECK_FALSE(s.sees(741));   // running at the snapshot (a long-running writer)
  CHECK(s.sees(742));
  CHECK_FALSE(s.sees(745));
  CHECK_FALSE(s.sees(750));   // began after it
  CHECK_FALSE(s.sees(9000));
  // Epoch 3: a snapshot at 3·2^32 + 5, with 2^32 - 2 (epoch 2) still running.
  const std::uint64_t e3 = std::uint64_t{3} << 32;
  auto w = *parse_pg_snapshot(std::to_string(e3 - 2) + ":" + std::to_string(e3 + 5) + ":" + std::to_string(e3 - 2));
  CHECK(w.widen(0xfffffffe) == e3 - 2);
  CHECK(w.widen(3) == e3 + 3);
  CHECK(w.widen(7) == e3 + 7);
  CHECK_FALSE(w.sees(0xfffffffe));   // the long-running writer of the previous epoch
  CHECK(w.sees(0xffffffff));         // finished, previous epoch
  CHECK(w.sees(4));
  CHECK_FALSE(w.sees(5));
  CHECK_FALSE(w.sees(6));
  // Epoch 0: nothing below zero.
  auto z = *parse_pg_snapshot("3:10:");
  CHECK(z.widen(0xfffffff0) == 0xfffffff0);
  CHECK_FALSE(z.sees(0xfffffff0));
}

TEST_CASE("COPY text rows: tabs, \\N, every escape COPY writes and those it reads") {
  using P = std::vector<std::pair<char, std::string>>;
  CHECK(row("1\tone\n") == P{{'t', "1"}, {'t', "one"}});
  CHECK(row("1\tone") == P{{'t', "1"}, {'t', "one"}});
  CHECK(row("\\N\t\t\\N") == P{{'n', ""}, {'t', ""}, {'n', ""}});
  CHECK(row("") == P{{'t', ""}});
  CHECK(row("a\\tb\\nc\\\\d\\re\\bf\\fg\\vh") == P{{'t', "a\tb\nc\\d\re\bf\fg\vh"}});
  CHECK(row("\\101\\x41\\x4a\\7\\q") == P{{'t', "AAJ\7q"}});
  CHECK(row("\\xg") == P{{'t', "xg"}});
  CHECK(row("\\\\N") == P{{'t', "\\N"}});   // an escaped backslash then N: the text \N, not NULL
  CHECK(row("\\Nx") == P{{'t', "Nx"}});
  CHECK(row("é\t{\"a\": 1}") == P{{'t', "é"}, {'t', "{\"a\": 1}"}});
  CHECK(malformed("abc\\"));
  std::string wide;
  for (int i = 0; i < 1700; ++i) wide += "x\t";
  CHECK(malformed(wide));
}

TEST_CASE("COPY text rows: every prefix of a row parses or is refused, never read past its end") {
  const std::string line = "42\t\\N\ta\\tb\\\\\t\\x41\\101\t";
  for (std::size_t n = 0; n <= line.size(); ++n) {
    std::string storage, error;
    std::vector<pgoutput::tuple_column> cols;
    bool ok = parse_copy_text_row(std::string_view(line).substr(0, n), storage, cols, error);
    INFO(n);
    CHECK((ok ? !cols.empty() : !error.empty()));
  }
}
