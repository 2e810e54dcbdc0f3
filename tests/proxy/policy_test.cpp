// The authorization policy (proxy/grants/src/policy.cpp): the file, a token's grants from its claims, a
// request checked against them (403, never a silent narrowing), and the events they let through.
#include "walgate/proxy/auth.hpp"
#include "walgate/proxy/event_filter.hpp"
#include "walgate/proxy/policy.hpp"

#include "temp_dir.hpp"

#include <boost/json/parse.hpp>

#include <doctest/doctest.h>

#include <fstream>
#include <thread>

using namespace walgate;
using namespace walgate::proxy;
namespace json = boost::json;

namespace {

policy parsed(const std::string& toml) {
  std::string error;
  auto p = policy::parse(toml, error);
  REQUIRE_MESSAGE(p, error);
  return std::move(*p);
}

std::string parse_error(const std::string& toml) {
  std::string error;
  CHECK_FALSE(policy::parse(toml, error));
  return error;
}

std::shared_ptr<const grants> of(const policy& p, const std::string& claims) {
  return p.grants_for(json::parse(claims).as_object());
}

stream_request request(const std::string& query) {
  request_error err;
  auto r = parse_stream_query(query.empty() ? std::string("/v1/stream") : "/v1/stream?" + query, err);
  REQUIRE_MESSAGE(r, err.message);
  return *r;
}

logged_event event(const std::string& schema, const std::string& table, transform::op kind) {
  logged_event e;
  e.schema = schema;
  e.table = table;
  e.kind = kind;
  return e;
}

const char* sales_policy = R"(
[[grant]]
when = { role = "sales" }
tables = ["public.orders", "public.order_lines"]
ops = ["insert", "update"]

[[grant]]
when = { groups = ["audit", "admin"] }
tables = ["audit.*"]
ops = ["insert", "message"]

[[grant]]
tables = ["public.products"]
)";

}  // namespace

TEST_CASE("policy: a token's grants are the union of the grants its claims match") {
  auto p = parsed(sales_policy);
  CHECK(p.size() == 3);
  auto sales = of(p, R"({"role":"sales"})");
  REQUIRE(sales);
  CHECK(sales->allows("public", "orders", 'c'));
  CHECK(sales->allows("public", "order_lines", 'u'));
  CHECK_FALSE(sales->allows("public", "orders", 'd'));
  CHECK(sales->allows("public", "products", 'd'));   // the grant for every token: all ops
  CHECK_FALSE(sales->allows("audit", "log", 'c'));
  CHECK_FALSE(sales->allows("", "", 'm'));
  CHECK(sales->allows_table("public", "orders"));
  CHECK_FALSE(sales->allows_table("public", "customers"));
  // An array claim holding one of the values; several grants at once.
  auto auditor = of(p, R"({"role":"sales","groups":["staff","audit"]})");
  REQUIRE(auditor);
  CHECK(auditor->allows("audit", "anything", 'c'));
  CHECK_FALSE(auditor->allows("audit", "anything", 'u'));
  CHECK(auditor->allows("", "", 'm'));
  CHECK(auditor->allows("public", "orders", 'c'));
  // Values compare by kind: the string "1" is not the number 1.
  auto numbers = parsed("[[grant]]\nwhen = { level = 3, beta = true }\ntables = [\"public.t\"]\n");
  CHECK(of(numbers, R"({"level":3,"beta":true})"));
  CHECK(of(numbers, R"({"level":3.0,"beta":true})"));
  CHECK_FALSE(of(numbers, R"({"level":"3","beta":true})"));
  CHECK_FALSE(of(numbers, R"({"level":3})"));
  // Only the grant for every token: a token without role still has it.
  auto anyone = of(p, R"({})");
  REQUIRE(anyone);
  CHECK(anyone->tables.size() == 1);
  CHECK_FALSE(of(parsed("[[grant]]\nwhen = { role = \"x\" }\ntables = [\"public.t\"]\n"), R"({"role":"y"})"));
  // 64-bit ids compare exactly (9007199254740993 is not a double).
  auto ids = parsed("[[grant]]\nwhen = { uid = 9007199254740993 }\ntables = [\"public.t\"]\n");
  CHECK(of(ids, R"({"uid":9007199254740993})"));
  CHECK_FALSE(of(ids, R"({"uid":9007199254740992})"));
  CHECK(of(ids, R"({"uid":[1, 9007199254740993]})"));
}

TEST_CASE("policy: rows limit a grant's tables, with the token's claims in the predicate") {
  auto p = parsed("[[grant]]\ntables = [\"public.items\"]\nrows = \"tenant = {claims.tenant}\"\n"
                  "[[grant]]\nwhen = { role = \"admin\" }\ntables = [\"public.items\"]\nops = [\"delete\"]\n");
  auto user = of(p, R"({"tenant":"acme"})");
  REQUIRE(user->rows.size() == 1);
  REQUIRE(user->rows[0]);
  CHECK(walgate::proxy::predicate::to_string(*user->rows[0]) == "\"tenant\" = 'acme'");
  CHECK(user->row_filtered("public", "items", 'c'));
  CHECK(user->row_filtered("public", "items", 'r'));
  CHECK_FALSE(user->row_filtered("public", "other", 'c'));
  auto admin = of(p, R"({"tenant":"acme","role":"admin"})");
  CHECK(admin->row_filtered("public", "items", 'u'));
  CHECK_FALSE(admin->row_filtered("public", "items", 'd'));   // one grant of every row for deletes
  auto none = of(p, R"({})");   // no tenant claim: no row
  REQUIRE(none->rows[0]);
  CHECK(none->rows[0]->k == walgate::proxy::predicate::node::kind::constant);
}

TEST_CASE("policy: the rows that exist go with insert; a grant without ops gives its tables every op, not messages") {
  auto p = parsed(sales_policy);
  auto sales = of(p, R"({"role":"sales"})");
  CHECK(sales->allows("public", "orders", 'r'));   // the log's initial snapshot rows, a snapshot's rows
  CHECK(sales->allows_table("public", "orders"));
  auto deletes = of(parsed("[[grant]]\ntables = [\"public.t\"]\nops = [\"delete\"]\n"), "{}");
  CHECK(deletes->allows("public", "t", 'd'));
  CHECK_FALSE(deletes->allows("public", "t", 'r'));
  CHECK_FALSE(deletes->allows_table("public", "t"));   // no snapshot of it
  auto all = of(parsed("[[grant]]\ntables = [\"public.t\"]\n"), "{}");
  for (char op : {'c', 'u', 'd', 't', 'r'}) CHECK(all->allows("public", "t", op));
  CHECK_FALSE(all->allows("", "", 'm'));
  auto messages = of(parsed("[[grant]]\nops = [\"message\"]\n"), "{}");
  CHECK(messages->allows("", "", 'm'));
  CHECK(messages->tables.empty());
}

TEST_CASE("policy: a request within its grants is served with them; outside them, 403 naming why") {
  auto p = parsed(sales_policy);
  auto sales = of(p, R"({"role":"sales"})");
  auto r = request("tables=public.orders&ops=insert");
  CHECK_FALSE(authorize(sales, r));
  REQUIRE(r.granted);
  r = request("");   // no tables, no ops: what it may see
  CHECK_FALSE(authorize(sales, r));
  CHECK(matches(r, event("public", "orders", transform::op::insert)));
  CHECK_FALSE(matches(r, event("public", "orders", transform::op::delete_)));
  CHECK_FALSE(matches(r, event("public", "customers", transform::op::insert)));
  CHECK(matches(r, event("public", "products", transform::op::truncate)));
  CHECK_FALSE(matches(r, event("", "", transform::op::message)));
  r = request("tables=public.customers");
  auto no = authorize(sales, r);
  REQUIRE(no);
  CHECK(no->first == "tables");
  CHECK(no->second == "table \"public\".\"customers\" is not granted to this token");
  CHECK_FALSE(r.granted);
  r = request("tables=public.orders&ops=delete");
  no = authorize(sales, r);
  REQUIRE(no);
  CHECK(no->first == "ops");
  r = request("tables=public.*");   // a schema's every table: only with a grant of schema.*
  no = authorize(sales, r);
  REQUIRE(no);
  CHECK(no->first == "tables");
  r = request("ops=message");
  no = authorize(sales, r);
  REQUIRE(no);
  CHECK(no->second == "logical messages are not granted to this token");
  r = request("ops=delete");   // some table of its grants has delete (products)
  CHECK_FALSE(authorize(sales, r));
  CHECK(matches(r, event("public", "products", transform::op::delete_)));
  CHECK_FALSE(matches(r, event("public", "orders", transform::op::delete_)));
  auto auditor = of(p, R"({"groups":["audit"]})");
  r = request("tables=audit.*&ops=insert,message");
  CHECK_FALSE(authorize(auditor, r));
  r = request("tables=audit.log");   // one table of a granted schema
  CHECK_FALSE(authorize(auditor, r));
  CHECK(matches(r, event("audit", "log", transform::op::insert)));
  CHECK_FALSE(matches(r, event("audit", "log", transform::op::update)));
}

TEST_CASE("policy: a file that is wrong is an error naming the grant") {
  CHECK(parse_error("").find("no [[grant]]") != std::string::npos);
  CHECK(parse_error("[grant]\ntables = [\"public.t\"]\n").find("no [[grant]]") != std::string::npos);
  CHECK(parse_error("x = 1\n") == "unknown key 'x': a policy is a list of [[grant]]");
  CHECK(parse_error("[[grant]]\ntables = [\"public.t\"\n").find("(line 2") != std::string::npos);
  CHECK(parse_error("[[grant]]\nwhen = { role = \"a\" }\n") == "grant 1: no tables (and no message op): it grants nothing");
  CHECK(parse_error("[[grant]]\ntables = [\"public.t\"]\n[[grant]]\ntables = [\"t\"]\n") ==
        "grant 2: tables: malformed table name 't': use schema.table or schema.* (names may be quoted: \"My Schema\".\"Order Items\", \"a\"\"b\" for a\"b)");
  CHECK(parse_error("[[grant]]\ntables = [\"public.t\"]\nops = [\"select\"]\n") ==
        "grant 1: ops: use insert, update, delete, truncate, message");
  CHECK(parse_error("[[grant]]\ntables = [\"public.t\"]\nrows = \"tenant = \"\n") ==
        "grant 1: rows: at 9: expected a string ('…'), a number, true, false or a claim ({claims.name}), found the end");
  CHECK(parse_error("[[grant]]\nops = [\"message\"]\nrows = \"a = 1\"\n") == "grant 1: rows without tables: rows limit a grant's tables");
  CHECK(parse_error("[[grant]]\ntables = [\"public.t\"]\ncolumns = []\n") ==
        "grant 1: columns is a non-empty list of column names: columns = [\"id\", \"name\"]");
  CHECK(parse_error("[[grant]]\ntables = [\"public.t\"]\ncolumns = [\"id\", 1]\n") ==
        "grant 1: columns holds column names as stored (1 to 63 bytes, case kept)");
  CHECK(parse_error("[[grant]]\nops = [\"message\"]\ncolumns = [\"id\"]\n") ==
        "grant 1: columns without tables: columns limit a grant's tables");
  CHECK(parse_error("[[grant]]\ntables = [\"public.t\"]\nwhen = { role = 1.5 }\n") ==
        "grant 1: when.role: a string, an integer or a boolean, or a list of them");
  CHECK(parse_error("[[grant]]\ntables = [\"public.t\"]\nwhen = { role = [] }\n") ==
        "grant 1: when.role: an empty list matches nothing");
  CHECK(parse_error("[[grant]]\ntables = [\"public.t\"]\nwhen = \"role\"\n").find("when is a table of claims") != std::string::npos);
  CHECK(parse_error("[[grant]]\ntables = [\"public.t\"]\nschema = \"x\"\n") == "grant 1: unknown key 'schema' (when, tables, ops, rows, columns)");
  CHECK(parse_error("[[grant]]\ntables = [\"audit.*\"]\nops = [\"message\"]\n") ==
        "grant 1: ops has no op of a table (insert, update, delete, truncate) for its tables: give message a grant of its own");
  CHECK(parse_error("[[grant]]\nwhen = {}\ntables = [\"public.t\"]\n") ==
        "grant 1: when = {} matches every token: leave when out to say so");
}

TEST_CASE("policy: read with the keys, again when it changes; one that cannot be used keeps the one in use") {
  walgate::test::temp_dir dir;
  const auto secret = dir.path / "secret", pol = dir.path / "policy.toml";
  std::ofstream(secret) << std::string(32, 'k');
  std::ofstream(pol) << "[[grant]]\ntables = [\"public.a\"]\n";
  auth_options o;
  o.secret_file = secret;
  o.policy_file = pol;
  authenticator auth(o);
  std::string error;
  REQUIRE_MESSAGE(auth.reload(error), error);
  REQUIRE(auth.has_policy());
  identity who;
  CHECK(auth.grants_for(who)->allows("public", "a", 'c'));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::ofstream(pol, std::ios::trunc) << "[[grant]]\ntables = [\"public.b\"]\n";
  CHECK(auth.reload_if_changed(error) == 1);
  CHECK(auth.grants_for(who)->allows("public", "b", 'c'));
  CHECK_FALSE(auth.grants_for(who)->allows("public", "a", 'c'));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::ofstream(pol, std::ios::trunc) << "[[grant]]\ncolumns = [\"x\"]\n";
  CHECK(auth.reload_if_changed(error) == -1);
  CHECK(error.find("policy.toml: grant 1: no tables") != std::string::npos);
  CHECK(auth.grants_for(who)->allows("public", "b", 'c'));   // the one in use stays
}

TEST_CASE("policy: columns — per op the union of the grants' lists; a grant with rows may not show fewer; where= only on columns shown") {
  auto p = parsed(R"(
[[grant]]
tables = ["public.emp"]
columns = ["id", "name"]

[[grant]]
when = { role = "hr" }
tables = ["public.emp"]
ops = ["insert"]
columns = ["id", "salary"]

[[grant]]
when = { role = "boss" }
tables = ["public.emp"]

[[grant]]
when = { team = "x" }
tables = ["public.emp"]
rows = "team = 'x'"
columns = ["id"]

[[grant]]
when = { self = "yes" }
tables = ["public.emp"]
rows = "id = 7"
)");
  const std::vector<table_rows::column> cols = {{"id", 23, true}, {"name", 25, false}, {"salary", 1700, false}, {"team", 25, false}};
  auto rows_of = [&](const std::string& claims, const std::string& query = "") {
    auto r = request(query);
    r.granted = of(p, claims);
    return table_rows::make(r, "public", "emp", cols, 'f', true);
  };
  auto plain = rows_of("{}");
  CHECK(plain.failed.empty());
  CHECK(plain.mask('c') == "1100");
  CHECK(plain.mask('u') == "1100");
  CHECK(plain.limits_columns());
  auto hr = rows_of(R"({"role":"hr"})");
  CHECK(hr.mask('c') == "1110");   // (its insert grant adds salary)
  CHECK(hr.mask('r') == "1110");
  CHECK(hr.mask('u') == "1100");
  auto boss = rows_of(R"({"role":"boss"})");
  CHECK_FALSE(boss.limits_columns());   // a grant without columns: every column
  // A grant with rows showing fewer columns than another of the same table: refused.
  auto team = rows_of(R"({"team":"x"})");
  CHECK(team.failed == "grants of public.emp: the columns a row shows would depend on which grant holds it (name is shown by "
                       "some of its grants, one of them limits rows): give every grant of the table the same columns");
  // Nor wider: names of every row, and every column of the token's own row, would show every
  // row's salary.
  auto self = rows_of(R"({"self":"yes"})");
  CHECK(self.failed.find("(salary is shown by some of its grants, one of them limits rows)") != std::string::npos);
  // where= on a column the token does not see would tell its values.
  CHECK(rows_of("{}", "where=salary%20%3E%20100").failed == "where= on public.emp: column salary is not granted to this token");
  CHECK(rows_of("{}", "where=name%20%3D%20'a'").failed.empty());
  CHECK(rows_of(R"({"role":"boss"})", "where=salary%20%3E%20100").failed.empty());
}
