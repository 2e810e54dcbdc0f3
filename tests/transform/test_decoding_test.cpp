#include "walgate/transform/test_decoding.hpp"
#include "walgate/transform/record.hpp"

#include "tuple_columns.hpp"

#include <doctest/doctest.h>

using namespace walgate;
using namespace walgate::transform;
namespace pg = walgate::protocol::pgoutput;
using protocol::lsn;

namespace {
const auto t = test::text_column;
const auto null = test::null_column;
const auto toast = test::unchanged_toast_column;

struct sample {
  pg::cached_relation rel;
  pg::type_cache types;
  protocol::transaction_info txn;
  std::vector<pg::tuple_column> row, old_key;
  sample() {
    rel.oid = 16384;
    rel.nspname = "public";
    rel.relname = "Order Lines";
    rel.columns = {{"id", 23, -1, true},          {"note", 25, -1, false},  {"amount", 1700, (12 << 16 | 2) + 4, false},
                   {"paid", 16, -1, false},       {"flags", 1560, 4, false}, {"code", 1042, 7, false},
                   {"user", 1043, 24, false},     {"mood", 70001, -1, false}, {"at", 1184, -1, false},
                   {"doc", 25, -1, false}};
    types.update(pg::type{std::nullopt, 70001, "app", "mood"});
    txn.xid = 8841;
    txn.commit_lsn = lsn{0x1A2B3C8};
    txn.end_lsn = lsn{0x1A2B3F0};
    txn.commit_time = protocol::unix_us_to_pg(1757413200123450LL);
    row = {t("42"), t("it's"), t("149.90"), t("t"), t("1010"), t("ab     "), t("x"), t("happy"),
           t("2025-09-09 10:20:00.12345+00"), toast()};
    old_key = {t("41"), null(), null(), null(), null(), null(), null(), null(), null(), null()};
  }
  change make(op k) const {
    change c;
    c.kind = k;
    c.txn = &txn;
    c.change_lsn = lsn{0x1A2B3C4};
    c.relation = &rel;
    c.types = &types;
    if (k != op::delete_) c.after = row;
    return c;
  }
};
}  // namespace

TEST_CASE("test_decoding: quote_identifier as PostgreSQL's — lower-case words pass, keywords and the rest are quoted") {
  CHECK(pg_quote_identifier("orders") == "orders");
  CHECK(pg_quote_identifier("_x1") == "_x1");
  CHECK(pg_quote_identifier("1x") == "\"1x\"");
  CHECK(pg_quote_identifier("Orders") == "\"Orders\"");
  CHECK(pg_quote_identifier("a\"b") == "\"a\"\"b\"");
  CHECK(pg_quote_identifier("user") == "\"user\"");          // reserved
  CHECK(pg_quote_identifier("integer") == "\"integer\"");    // a column-name keyword
  CHECK(pg_quote_identifier("left") == "\"left\"");          // a type/function-name keyword
  CHECK(pg_quote_identifier("data") == "data");              // unreserved: not quoted
  CHECK(pg_quote_identifier("xmltable") == "\"xmltable\"");  // the list's last
  CHECK(pg_quote_identifier("all") == "\"all\"");            // and its first
  CHECK(pg_quote_identifier("caf\xc3\xa9") == "\"caf\xc3\xa9\"");
  CHECK(pg_quote_identifier("") == "\"\"");
}

TEST_CASE("test_decoding: options parsed as the plugin does, with its error texts") {
  auto p = parse_test_decoding_options({{"include-xids", "0"}, {"skip-empty-xacts", "on"}, {"include-timestamp", std::nullopt}});
  CHECK(p.error.empty());
  CHECK_FALSE(p.options.include_xids);
  CHECK(p.options.skip_empty_xacts);
  CHECK(p.options.include_timestamp);
  CHECK(parse_test_decoding_options({{"include-xids", "tr"}}).options.include_xids);
  CHECK(parse_test_decoding_options({{"include-xids", "o"}}).error == "could not parse value \"o\" for parameter \"include-xids\"");
  CHECK(parse_test_decoding_options({{"nope", "1"}}).error == "option \"nope\" = \"1\" is unknown");
  CHECK(parse_test_decoding_options({{"nope", std::nullopt}}).error == "option \"nope\" = \"(null)\" is unknown");
  CHECK(parse_test_decoding_options({{"include-rewrites", "1"}, {"stream-changes", "0"}, {"force-binary", "0"}}).error.empty());
}

TEST_CASE("test_decoding: BEGIN, COMMIT and each change, exact") {
  sample s;
  test_decoding_options o;
  CHECK(test_decoding_begin(o, 8841) == "BEGIN 8841");
  CHECK(test_decoding_commit(o, 8841, s.txn.commit_time) == "COMMIT 8841");
  o.include_xids = false;
  o.include_timestamp = true;
  CHECK(test_decoding_begin(o, 8841) == "BEGIN");
  CHECK(test_decoding_commit(o, 8841, s.txn.commit_time) == "COMMIT (at 2025-09-09 10:20:00.12345+00)");

  std::string out;
  test_decoding_change(out, s.make(op::insert));
  CHECK(out ==
        "table public.\"Order Lines\": INSERT: id[integer]:42 note[text]:'it''s' amount[numeric]:149.90 paid[boolean]:true "
        "flags[bit]:B'1010' code[character]:'ab     ' \"user\"[character varying]:'x' mood[app.mood]:'happy' "
        "at[timestamp with time zone]:'2025-09-09 10:20:00.12345+00' doc[text]:unchanged-toast-datum");

  auto u = s.make(op::update);
  u.before_kind = 'K';
  u.before = s.old_key;
  out.clear();
  test_decoding_change(out, u);
  CHECK(out.rfind("table public.\"Order Lines\": UPDATE: old-key: id[integer]:41 new-tuple: id[integer]:42 note[text]:'it''s'", 0) == 0);
  u.before_kind = 0;
  out.clear();
  test_decoding_change(out, u);
  CHECK(out.rfind("table public.\"Order Lines\": UPDATE: id[integer]:42 ", 0) == 0);

  auto d = s.make(op::delete_);
  d.before_kind = 'K';
  d.before = s.old_key;
  out.clear();
  test_decoding_change(out, d);
  CHECK(out == "table public.\"Order Lines\": DELETE: id[integer]:41");

  // NULLs: printed in a new tuple, skipped in an old one.
  std::vector<pg::tuple_column> nulls = s.row;
  nulls[1] = null();
  auto n = s.make(op::insert);
  n.after = nulls;
  out.clear();
  test_decoding_change(out, n);
  CHECK(out.find(" note[text]:null ") != std::string::npos);

  pg::message m{std::nullopt, true, lsn{5}, "pfx", protocol::as_bytes(std::string_view("a\0b", 3))};
  change mc;
  mc.kind = op::message;
  mc.message = &m;
  out.clear();
  test_decoding_change(out, mc);
  CHECK(out == "message: transactional: 1 prefix: pfx, sz: 3 content:" + std::string("a\0b", 3));

  pg::cached_relation other = s.rel;
  other.nspname = "Sales";
  other.relname = "t";
  out.clear();
  test_decoding_truncate(out, {&s.rel, &other}, 0);
  CHECK(out == "table public.\"Order Lines\", \"Sales\".t: TRUNCATE: (no-flags)");
  out.clear();
  test_decoding_truncate(out, {&other}, 3);
  CHECK(out == "table \"Sales\".t: TRUNCATE: restart_seqs cascade");
}

TEST_CASE("test_decoding: format_type_be's names of built-in types and their arrays") {
  sample s;
  s.rel.columns = {{"a", 3643, -1, false}, {"b", 3905, -1, false}, {"c", 3221, -1, false}, {"d", 1015, 12, false},
                   {"e", 1014, 5, false}, {"f", 22, -1, false}, {"g", 6150, -1, false}};
  std::vector<pg::tuple_column> row(7, null());
  auto c = s.make(op::insert);
  c.after = row;
  std::string out;
  test_decoding_change(out, c);
  CHECK(out ==
        "table public.\"Order Lines\": INSERT: a[tsvector[]]:null b[int4range[]]:null c[pg_lsn[]]:null "
        "d[character varying[]]:null e[character[]]:null f[int2vector]:null g[int4multirange[]]:null");
}

TEST_CASE("records keep a truncate's CASCADE and RESTART IDENTITY") {
  sample s;
  for (std::uint8_t options = 0; options < 4; ++options) {
    auto c = s.make(op::truncate);
    c.after = {};
    c.truncate_options = options;
    std::string bytes;
    write_record(bytes, c);
    auto v = read_record(protocol::as_bytes(std::string_view(bytes)));
    REQUIRE(v.has_value());
    CHECK((*v)->get().truncate_options == options);
  }
}
