// Row predicates (proxy/grants/src/predicate.cpp): the language, claims, and comparison by type.
#include "walgate/proxy/predicate.hpp"

#include <boost/json/parse.hpp>

#include <doctest/doctest.h>

#include "alloc_counter.hpp"

#include <string>
#include <vector>

using namespace walgate::proxy::predicate;
namespace json = boost::json;

namespace {

node parsed(const std::string& text) {
  std::string error;
  auto n = parse(text, error);
  REQUIRE_MESSAGE(n, text << ": " << error);
  return *n;
}

std::string parse_error(const std::string& text) {
  std::string error;
  auto n = parse(text, error);
  CHECK_MESSAGE(!n, text);
  return error;
}

/// A table of columns (name, type oid) and a row of values (nullopt: null; "\x01": unchanged TOAST).
struct table {
  std::vector<column_info> cols;
  bool eval(const std::string& text, const std::vector<std::optional<std::string>>& row,
            const std::string& claims = "{}") const {
    auto n = instantiate(parsed(text), json::parse(claims).as_object());
    std::string error;
    auto b = bind_to(n, cols, error);
    REQUIRE_MESSAGE(b, error);
    std::vector<cell> cells;
    for (const auto& v : row) {
      if (!v) cells.push_back({cell::state::null, {}});
      else if (*v == "\x01") cells.push_back({cell::state::unchanged, {}});
      else cells.push_back({cell::state::text, *v});
    }
    return b->evaluate(cells);
  }
};

}  // namespace

TEST_CASE("predicates: the language, written back as text that reads the same") {
  for (const std::string t : {"tenant_id = {claims.tenant}", "a = 1 and b != 'x' or c < 2.5",
                              "(a = 1 or b = 2) and c >= -3e2", "org_id in {claims.orgs}", "status in ('open', 'it''s')",
                              "deleted_at is null", "\"Created At\" is not null and \"a\"\"b\" <> 'q'",
                              "x = {claims.\"https://example.com/roles\".admin}", "flag = true or flag = FALSE",
                              "A = 1 AND (B = 2 OR (C = 3 AND (D IN (1,2,3))))"}) {
    INFO(t);
    auto n = parsed(t);
    const std::string text = to_string(n);
    CHECK(to_string(parsed(text)) == text);
  }
  // Never deeper when written back: 32 levels read, 32 written.
  std::string deep = "a = 1";
  for (int i = 0; i < 32; ++i) deep = "a = 1 or (" + deep + ")";
  auto d = parsed(deep);
  CHECK(to_string(parsed(to_string(d))) == to_string(d));
  CHECK(to_string(parsed("(a = 1 or b = 2) and c = 3")) == "(\"a\" = 1 or \"b\" = 2) and \"c\" = 3");
  CHECK(parse_error("a = +.e5") == "at 4: a number without digits");
  // and binds tighter than or.
  auto n = parsed("a = 1 or b = 2 and c = 3");
  REQUIRE(n.k == node::kind::any);
  CHECK(n.children[1].k == node::kind::all);
  CHECK(columns(parsed("a = 1 or (b = 2 and a = 3) or \"C\" is null")) == std::vector<std::string>{"a", "b", "C"});
}

TEST_CASE("predicates: malformed text is an error that says where and what") {
  CHECK(parse_error("") == "at 0: expected a column name or '(', found the end");
  CHECK(parse_error("a =") == "at 3: expected a string ('…'), a number, true, false or a claim ({claims.name}), found the end");
  CHECK(parse_error("a = 'x") == "at 4: an unterminated string");
  CHECK(parse_error("a == 1") == "at 3: expected a string ('…'), a number, true, false or a claim ({claims.name}), found '='");
  CHECK(parse_error("a = 1 b = 2") == "at 6: expected and, or or the end, found 'b'");
  CHECK(parse_error("(a = 1") == "at 6: expected ')', found the end");
  CHECK(parse_error("a in ()") == "at 6: expected a string ('…'), a number, true, false or a claim ({claims.name}), found ')'");
  CHECK(parse_error("a = {tenant}") == "at 5: expected claims, found 'tenant'");
  CHECK(parse_error("a = {claims}") == "at 11: expected '.' and a claim's name, found '}'");
  CHECK(parse_error("a is 1") == "at 5: expected null, found '1'");
  CHECK(parse_error("and = 1") == "at 0: expected a column name or '(', found 'and'");
  CHECK(parse_error("a = 1; drop table t") == "at 5: unexpected character ';'");
  CHECK(parse_error("\"\" = 1") == "at 0: an empty quoted name");
  CHECK(parse_error(std::string("a = '\0'", 7)) == "a predicate holds no NUL byte");
  CHECK(parse_error(std::string(4097, ' ')) == "a predicate is at most 4096 bytes");
  CHECK(parse_error(std::string(33, '(') + "a = 1" + std::string(33, ')')).find("more than 32 levels") != std::string::npos);
  std::string deep_error;
  CHECK(parse(std::string(32, '(') + "a = 1" + std::string(32, ')'), deep_error));
  std::string many = "a = 0";
  for (int i = 1; i <= 256; ++i) many += " or a = " + std::to_string(i);
  CHECK(parse_error(many).find("more than 256 comparisons") != std::string::npos);
  CHECK(parse_error("a = {claims.a.b.c.d.e.f.g.h.i}").find("more than 8 names") != std::string::npos);
  CHECK(parse_error(std::string(64, 'c') + " = 1") == "at 0: a column name is at most 63 bytes");
}

TEST_CASE("predicates: claims substituted per token; a missing one matches nothing") {
  table t{{{"tenant", 25}, {"org", 20}, {"admin", 16}}};
  const std::vector<std::optional<std::string>> row = {"acme", "7", "t"};
  CHECK(t.eval("tenant = {claims.tenant}", row, R"({"tenant":"acme"})"));
  CHECK_FALSE(t.eval("tenant = {claims.tenant}", row, R"({"tenant":"other"})"));
  CHECK_FALSE(t.eval("tenant = {claims.tenant}", row, R"({})"));
  CHECK_FALSE(t.eval("tenant != {claims.tenant}", row, R"({})"));   // missing: false either way
  CHECK_FALSE(t.eval("tenant = {claims.tenant}", row, R"({"tenant":{"id":"acme"}})"));
  CHECK(t.eval("tenant = {claims.app.tenant}", row, R"({"app":{"tenant":"acme"}})"));
  CHECK(t.eval("org in {claims.orgs}", row, R"({"orgs":[3,7,9]})"));
  CHECK_FALSE(t.eval("org in {claims.orgs}", row, R"({"orgs":[3,9]})"));
  CHECK_FALSE(t.eval("org in {claims.orgs}", row, R"({"orgs":[]})"));
  CHECK(t.eval("org in {claims.org}", row, R"({"org":7})"));   // one value: a list of one
  CHECK(t.eval("org = {claims.org}", row, R"({"org":"7"})"));   // a string claim read as the column's number
  CHECK(t.eval("org = {claims.org}", row, R"({"org":7.0})"));   // a double claim: its shortest digits
  table n{{{"x", 1700}}};
  CHECK(n.eval("x = {claims.x}", {"0.1"}, R"({"x":0.1})"));
  CHECK(n.eval("x = {claims.x}", {"1000000000000000000000"}, R"({"x":1e21})"));
  CHECK(t.eval("admin = {claims.admin}", row, R"({"admin":true})"));
  CHECK(t.eval("org = {claims.n} or tenant = 'acme'", row, R"({})"));   // the other branch decides
}

TEST_CASE("predicates: compared as the column's type") {
  table t{{{"i", 23}, {"n", 1700}, {"f", 701}, {"b", 16}, {"ts", 1184}, {"t", 1114}, {"d", 1082}, {"c", 1042},
           {"u", 2950}, {"s", 25}, {"j", 3802}}};
  auto row = [](std::vector<std::pair<std::size_t, std::string>> set) {
    std::vector<std::optional<std::string>> r(11);
    for (auto& [i, v] : set) r[i] = v;
    return r;
  };
  // Numbers as numbers: 10 > 9 (as text it would not be).
  CHECK(t.eval("i > 9", row({{0, "10"}})));
  CHECK(t.eval("i = '10'", row({{0, "10"}})));
  CHECK_FALSE(t.eval("i > 'x'", row({{0, "10"}})));   // not a number: never matches
  CHECK(t.eval("n = 1.1", row({{1, "1.10"}})));
  CHECK(t.eval("n = 0", row({{1, "-0.000"}})));
  CHECK(t.eval("n > 99999999999999999999.1", row({{1, "99999999999999999999.10000000000000000001"}})));
  CHECK(t.eval("n < -1.5", row({{1, "-2"}})));
  CHECK_FALSE(t.eval("n > 1e30", row({{1, "5"}})));   // (1e30 is not numeric's text: never matches)
  CHECK_FALSE(t.eval("n < 1e30", row({{1, "5"}})));
  CHECK(t.eval("n > 123456789012345678901234567890", row({{1, "NaN"}})));   // NaN above every number
  CHECK(t.eval("n > 5", row({{1, "Infinity"}})));
  CHECK(t.eval("f = 0.5", row({{2, "0.5"}})));
  CHECK(t.eval("f > 1e300", row({{2, "Infinity"}})));
  CHECK(t.eval("f < 2.5e-3", row({{2, "1e-05"}})));
  // Booleans, instants.
  CHECK(t.eval("b = true", row({{3, "t"}})));
  CHECK(t.eval("b = 'f'", row({{3, "f"}})));
  CHECK(t.eval("ts = '2026-01-01T00:00:00Z'", row({{4, "2026-01-01 01:00:00+01"}})));
  CHECK(t.eval("ts < '2026-01-01T00:00:00.000001Z'", row({{4, "2026-01-01 00:00:00+00"}})));
  CHECK(t.eval("ts > '2025-12-31 23:59:59.5-05:30'", row({{4, "2026-01-01 05:29:59.6+00"}})));
  CHECK(t.eval("t >= '2026-03-01'", row({{5, "2026-03-01 00:00:00"}})));
  CHECK(t.eval("d < '2000-01-01'", row({{6, "1999-12-31"}})));
  CHECK(t.eval("d > '2999-01-01'", row({{6, "infinity"}})));
  CHECK_FALSE(t.eval("d > '2000-13-01'", row({{6, "2026-01-01"}})));   // a bad literal matches nothing
  CHECK_FALSE(t.eval("d < '2026-02-30'", row({{6, "2026-01-01"}})));
  CHECK(t.eval("d < '2024-02-29'", row({{6, "2024-02-28"}})));       // a leap day
  CHECK(t.eval("d > '294277-01-01'", row({{6, "5874897-12-31"}})));  // PostgreSQL's last date: no overflow
  CHECK(t.eval("ts < '393999-12-31'", row({{4, "5603-01-01 00:00:00+00"}})));
  // A timestamp without time zone ignores a literal's offset (as PostgreSQL's cast does).
  CHECK(t.eval("t = '2026-03-01 10:00:00+05'", row({{5, "2026-03-01 10:00:00"}})));
  CHECK(t.eval("ts = '2026-03-01 10:00:00.0000004Z'", row({{4, "2026-03-01 10:00:00+00"}})));   // rounded
  CHECK(t.eval("ts = '2026-03-01 10:00:00.9999996Z'", row({{4, "2026-03-01 10:00:01+00"}})));
  CHECK(t.eval("ts = '2026-03-01 24:00:00Z'", row({{4, "2026-03-02 00:00:00+00"}})));
  CHECK_FALSE(t.eval("ts = '2026-03-01 24:00:01Z'", row({{4, "2026-03-02 00:00:01+00"}})));
  // char(n) without its padding, uuid in any case, text byte by byte.
  CHECK(t.eval("c = 'ab'", row({{7, "ab   "}})));
  CHECK(t.eval("u = 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", row({{8, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"}})));
  CHECK(t.eval("s < 'b'", row({{9, "B"}})));   // 'B' (0x42) < 'b' (0x62)
  CHECK_FALSE(t.eval("s = 'a '", row({{9, "a"}})));
  CHECK(t.eval("s > 9", row({{9, "10"}})) == false);   // text: "10" < "9"
  CHECK(t.eval("j = '{\"a\":1}'", row({{10, "{\"a\":1}"}})));   // other types: as text
}

// Assumption: a bound predicate reads a row's values as views; evaluating it allocates nothing,
// whatever the type or length of the values (long texts, uuids, 40-digit numbers are past any
// small-string buffer).
TEST_CASE("predicates: evaluating a bound predicate allocates nothing, for every type and any value length") {
  const std::vector<column_info> cols{{"i", 23}, {"n", 1700}, {"f", 701}, {"b", 16}, {"ts", 1184}, {"t", 1114},
                                      {"d", 1082}, {"c", 1042}, {"u", 2950}, {"s", 25}, {"j", 3802}};
  const std::string text =
      "n > 1234567890123456789012345678901234567890.5 and f < 1e300 and b = true and ts > '2000-01-01 00:00:00Z' "
      "and t >= '2000-01-01' and d < '3000-01-01' and c = 'a character value longer than sixteen bytes' "
      "and u in ('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', 'b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11') "
      "and s != 'a text value that no small-string buffer holds, whatever the library' and j != 'x' and i is not null "
      "and (i < 0 or i in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10))";
  std::string error;
  auto parsed_text = parse(text, error);
  REQUIRE_MESSAGE(parsed_text, error);
  auto b = bind_to(*parsed_text, cols, error);
  REQUIRE_MESSAGE(b, error);
  const std::vector<std::string> values{
      "7", "99999999999999999999999999999999999999999999.000000000000000000000000000001", "1.5e+20", "t",
      "2026-03-01 10:00:00.123456+05:30", "2026-03-01 10:00:00", "2026-03-01",
      "a character value longer than sixteen bytes          ", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
      "another text value that no small-string buffer holds, whatever the library", R"({"a": [1, 2, 3]})"};
  std::vector<cell> row;
  for (const auto& v : values) row.push_back(cell{cell::state::text, v});
  std::vector<cell> other = row;
  other[0].text = "70";   // i in (1..10) fails: the other branch of every `and`
  std::size_t matched = 0, allocations = 0;
  {
    walgate::test::counting_allocations counter;
    for (int k = 0; k < 1000; ++k) matched += (b->evaluate(row) ? 1 : 0) + (b->evaluate(other) ? 1 : 0);
    allocations = counter.count();
  }
  CHECK(matched == 1000);   // the first row matches, the second does not: both evaluated in full
  CHECK(allocations == 0);
  // The counter does count (a test of the test).
  {
    walgate::test::counting_allocations counter;
    auto again = bind_to(*parsed_text, cols, error);
    CHECK(again);
    CHECK(counter.count() > 0);
  }
}

TEST_CASE("predicates: nulls and unchanged TOAST values match nothing but is [not] null") {
  table t{{{"a", 25}, {"b", 25}}};
  const std::vector<std::optional<std::string>> nulls = {std::nullopt, "\x01"};
  CHECK(t.eval("a is null", nulls));
  CHECK_FALSE(t.eval("a is not null", nulls));
  CHECK_FALSE(t.eval("a = 'x'", nulls));
  CHECK_FALSE(t.eval("a != 'x'", nulls));
  CHECK_FALSE(t.eval("a in ('x', 'y')", nulls));
  CHECK(t.eval("b is not null", nulls));
  CHECK_FALSE(t.eval("b is null", nulls));
  CHECK_FALSE(t.eval("b = 'x'", nulls));
  CHECK_FALSE(t.eval("b != 'x'", nulls));
}

TEST_CASE("predicates: bound to a relation; a column it lacks is an error") {
  std::vector<column_info> cols = {{"id", 23}, {"Tenant Id", 25}};
  std::string error;
  CHECK(bind_to(parsed("\"Tenant Id\" = 'a' and id > 1"), cols, error));
  CHECK_FALSE(bind_to(parsed("tenant_id = 'a'"), cols, error));
  CHECK(error == "no column \"tenant_id\"");
  CHECK_FALSE(bind_to(parsed("id = {claims.x}"), cols, error));
  CHECK(error == "a claim left in a predicate being bound (instantiate it first)");
}

TEST_CASE("predicates: the SQL a snapshot's SELECT carries holds where the gateway's comparison means the same") {
  const std::vector<column_info> cols = {{"id", 23},   {"tenant", 25}, {"code", 1042}, {"u", 2950}, {"ok", 16},
                                         {"at", 1184}, {"f", 701},     {"j", 114},     {"o", 26},   {"My \"Col\"", 1700}};
  auto sql = [&](const std::string& text, const std::string& claims = "{}") {
    auto n = instantiate(parsed(text), json::parse(claims).as_object());
    std::string error;
    auto b = bind_to(n, cols, error);
    REQUIRE_MESSAGE(b, error);
    return b->sql(cols, [](std::string_view v) { return "'" + std::string(v) + "'"; });
  };
  CHECK(sql("tenant = {claims.t}", R"({"t":"acme"})") == "\"tenant\" = 'acme'");
  CHECK(sql("id = {claims.t}", R"({"t":42})") == "\"id\" = 42");
  CHECK(sql("id = '0042.50'") == "\"id\" = '42.5'::numeric");
  CHECK(sql("id >= -7 and id != 3") == "(\"id\" >= -7) AND (\"id\" <> 3)");
  CHECK(sql("id = 1234567890123456789") == "\"id\" = '1234567890123456789'::numeric");   // (past 18 digits)
  CHECK(sql("id in {claims.ids}", R"({"ids":[1,2]})") == "\"id\" IN (1, 2)");
  CHECK(sql("code = 'ab  '") == "\"code\" = 'ab'");
  CHECK(sql("u = 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'") == "\"u\" = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid");
  CHECK(sql("u = 'not a uuid'").empty());   // (PostgreSQL would refuse the literal: the gateway alone decides)
  CHECK(sql("ok = true and tenant is not null") == "(\"ok\" = true) AND (\"tenant\" IS NOT NULL)");
  CHECK(sql("\"My \"\"Col\"\"\" < 1.5") == "\"My \"\"Col\"\"\" < '1.5'::numeric");
  // Left out: text order (collations differ), instants, floats, other types read as text, oid;
  // in an `and` the rest stays, in an `or` the whole `or` goes.
  CHECK(sql("tenant < 'm'").empty());
  CHECK(sql("at > '2026-01-01T00:00:00Z'").empty());
  CHECK(sql("f = 1").empty());
  CHECK(sql("j = '{}'").empty());
  CHECK(sql("o = 5").empty());
  CHECK(sql("tenant = 'a' and f = 1") == "(\"tenant\" = 'a')");
  CHECK(sql("tenant = 'a' or f = 1").empty());
  CHECK(sql("tenant = 'a' or id = 1") == "(\"tenant\" = 'a') OR (\"id\" = 1)");
  // A claim the token lacks: false.
  CHECK(sql("tenant = {claims.t}") == "false");
  CHECK(sql("id = 'x'") == "false");   // (no integer reads as x)
}
