// wal2json (2.5) as walgate emulates it, exact bytes: each callback's output in both formats,
// the plugin's quirks kept (format 1's leading comma of a non-transactional message, `"char"`
// unescaped, no truncate in format 1), its option parser with its error texts, escape_json.
// The same output against the real plugin: tests/proxy/replication_server_test.cpp.
#include "walgate/transform/wal2json_plugin.hpp"
#include "walgate/transform/pg_types.hpp"

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

struct written {
  lsn at;
  std::string bytes;
};

struct sample {
  pg::cached_relation rel, small, full;
  pg::type_cache types;
  protocol::transaction_info txn;
  plugin_transaction info;
  std::vector<pg::tuple_column> row, old_key, small_row, full_new, full_old;
  std::vector<written> out;
  sample() {
    rel.oid = 16384;
    rel.nspname = "public";
    rel.relname = "Order Lines";
    rel.columns = {{"id", 23, -1, true},          {"note", 25, -1, false},  {"amount", 1700, (12 << 16 | 2) + 4, false},
                   {"paid", 16, -1, false},       {"flags", 1560, 4, false}, {"code", 1042, 7, false},
                   {"user", 1043, 24, false},     {"mood", 70001, -1, false}, {"at", 1184, -1, false},
                   {"doc", 25, -1, false}};
    small.oid = 16390;
    small.nspname = "public";
    small.relname = "t";
    small.columns = {{"id", 23, -1, true}, {"v", 25, -1, false}};
    full.oid = 16400;
    full.nspname = "s";
    full.relname = "f";
    full.replica_identity = 'f';
    full.columns = {{"id", 23, -1, true}, {"ch", 18, -1, true}, {"by", 17, -1, true}, {"x", 701, -1, true}};
    types.update(pg::type{std::nullopt, 70001, "app", "mood"});
    txn.xid = 8841;
    txn.commit_lsn = lsn{0x1A2B3C8};
    txn.commit_time = protocol::unix_us_to_pg(1757413200123450LL);
    info.xid = txn.xid;
    info.commit_lsn = txn.commit_lsn;
    info.end_lsn = lsn{0x1A2B3F0};
    info.commit_time = txn.commit_time;
    row = {t("42"), t("it's \"q\"\n"), t("149.90"), t("t"), t("1010"), t("ab "), t("x"), t("happy"),
           t("2025-09-09 10:20:00.12345+00"), toast()};
    old_key = {t("41"), null(), null(), null(), null(), null(), null(), null(), null(), null()};
    small_row = {t("1"), t("a")};
    full_new = {t("7"), t("q"), t("\\xdead"), t("-Infinity")};
    full_old = {t("7"), null(), t("\\x"), t("NaN")};
  }
  change make(const pg::cached_relation& r, op k, std::uint64_t at = 0x1A2B300) const {
    change c;
    c.kind = k;
    c.txn = &txn;
    c.change_lsn = lsn{at};
    c.relation = &r;
    c.types = &types;
    return c;
  }
  std::unique_ptr<output_plugin> plugin(const plugin_options& options) {
    plugin_context context;
    context.server_major = 15;
    auto made = make_output_plugin("wal2json", options, context, [this](lsn at, std::string_view b) { out.push_back({at, std::string(b)}); });
    REQUIRE_MESSAGE(made.plugin, made.error);
    return std::move(made.plugin);
  }
};

const std::string row_v1_names =
    R"j("columnnames":["id","note","amount","paid","flags","code","user","mood","at"],)j";
const std::string row_v1_types =
    R"j("columntypes":["integer","text","numeric(12,2)","boolean","bit(4)","character(3)","character varying(20)","app.mood","timestamp with time zone"],)j";
const std::string row_v1_values = R"j("columnvalues":[42,"it's \"q\"\n",149.90,true,"1010","ab ","x","happy","2025-09-09 10:20:00.12345+00"])j";
}  // namespace

TEST_CASE("wal2json format 1: one message a transaction — insert, update without and with an old key, delete — in order") {
  sample s;
  auto p = s.plugin({});
  s.txn.commit_lsn = s.info.commit_lsn;
  p->begin(s.info, lsn{0x1A2B300});
  CHECK(s.out.empty());   // (written at the commit)
  auto ins = s.make(s.rel, op::insert);
  ins.after = s.row;
  p->change(s.info, ins);
  auto upd = s.make(s.rel, op::update, 0x1A2B340);
  upd.after = s.row;
  p->change(s.info, upd);
  auto key = s.make(s.rel, op::update, 0x1A2B380);
  key.after = s.row;
  key.before_kind = 'K';
  key.before = s.old_key;
  p->change(s.info, key);
  auto del = s.make(s.rel, op::delete_, 0x1A2B3A0);
  del.before_kind = 'K';
  del.before = s.old_key;
  p->change(s.info, del);
  p->truncate(s.info, {&s.rel}, 0, lsn{0x1A2B3B0});   // (format 1 prints no truncate)
  CHECK(s.out.empty());
  p->commit(s.info);
  REQUIRE(s.out.size() == 1);
  CHECK(s.out[0].at == lsn{0x1A2B300});
  const std::string head = R"j({"kind":"insert","schema":"public","table":"Order Lines",)j";
  const std::string expected =
      R"j({"change":[)j" + head + row_v1_names + row_v1_types + row_v1_values + "}" +
      R"j(,{"kind":"update","schema":"public","table":"Order Lines",)j" + row_v1_names + row_v1_types + row_v1_values +
      R"j(,"oldkeys":{"keynames":["id"],"keytypes":["integer"],"keyvalues":[42]}})j" +
      R"j(,{"kind":"update","schema":"public","table":"Order Lines",)j" + row_v1_names + row_v1_types + row_v1_values +
      R"j(,"oldkeys":{"keynames":["id"],"keytypes":["integer"],"keyvalues":[41]}})j" +
      R"j(,{"kind":"delete","schema":"public","table":"Order Lines","oldkeys":{"keynames":["id"],"keytypes":["integer"],"keyvalues":[41]}})j" +
      "]}";
  CHECK(s.out[0].bytes == expected);
}

TEST_CASE("wal2json format 1: pretty-print's tabs and newlines, xids, LSNs and times in the header") {
  sample s;
  auto p = s.plugin({{"pretty-print", std::nullopt}, {"include-xids", "1"}, {"include-lsn", "on"}, {"include-timestamp", "yes"}});
  p->begin(s.info, lsn{0x1A2B300});
  auto ins = s.make(s.small, op::insert);
  ins.after = s.small_row;
  p->change(s.info, ins);
  p->commit(s.info);
  REQUIRE(s.out.size() == 1);
  CHECK(s.out[0].bytes ==
        "{\n\t\"xid\": 8841,\n\t\"nextlsn\": \"0/1A2B3F0\",\n\t\"timestamp\": \"2025-09-09 10:20:00.12345+00\",\n"
        "\t\"change\": [\n\t\t{\n\t\t\t\"kind\": \"insert\",\n\t\t\t\"schema\": \"public\",\n\t\t\t\"table\": \"t\",\n"
        "\t\t\t\"columnnames\": [\"id\", \"v\"],\n\t\t\t\"columntypes\": [\"integer\", \"text\"],\n"
        "\t\t\t\"columnvalues\": [1, \"a\"]\n\t\t}\n\t]\n}");
}

TEST_CASE("wal2json format 1: write-in-chunks — the header, each change and the end each a message at its own LSN") {
  sample s;
  auto p = s.plugin({{"write-in-chunks", "1"}, {"include-lsn", "1"}, {"include-typmod", "0"}, {"include-type-oids", "1"}});
  p->begin(s.info, lsn{0x1A2B300});
  auto ins = s.make(s.rel, op::insert, 0x1A2B310);
  ins.after = s.row;
  p->change(s.info, ins);
  auto del = s.make(s.small, op::delete_, 0x1A2B320);
  del.before_kind = 'K';
  del.before = s.small_row;
  p->change(s.info, del);
  p->commit(s.info);
  REQUIRE(s.out.size() == 4);
  CHECK(s.out[0].at == lsn{0x1A2B300});
  CHECK(s.out[0].bytes == R"j({"nextlsn":"0/1A2B3F0","change":[)j");
  CHECK(s.out[1].at == lsn{0x1A2B310});
  // (typmod off: pg_type.typname, unqualified; type oids as %u)
  CHECK(s.out[1].bytes ==
        R"j({"kind":"insert","schema":"public","table":"Order Lines",)j" + row_v1_names +
            R"j("columntypes":["int4","text","numeric","bool","bit","bpchar","varchar","mood","timestamptz"],)j"
            R"j("columntypeoids":[23,25,1700,16,1560,1042,1043,70001,1184],)j" +
            row_v1_values + "}");
  CHECK(s.out[2].bytes ==
        R"j(,{"kind":"delete","schema":"public","table":"t","oldkeys":{"keynames":["id"],"keytypes":["int4"],"keytypeoids":[23],"keyvalues":[1]}})j");
  CHECK(s.out[3].at == lsn{0x1A2B3F0});
  CHECK(s.out[3].bytes == "]}");
}

TEST_CASE("wal2json format 1: messages — transactional ones are changes; a non-transactional one keeps the last transaction's count (its leading comma)") {
  sample s;
  auto p = s.plugin({});
  pg::message tm{8841u, true, lsn{0x100}, "tx", protocol::as_bytes(std::string_view("in\0cut", 6))};
  pg::message nm{std::nullopt, false, lsn{0x200}, "ntx", protocol::as_bytes(std::string_view("out"))};
  change mt = s.make(s.small, op::message, 0x100);
  mt.relation = nullptr;
  mt.message = &tm;
  change mn = mt;
  mn.message = &nm;
  mn.change_lsn = lsn{0x200};
  p->message(mn);   // (before any transaction: the count is 0)
  p->begin(s.info, lsn{0x100});
  p->change(s.info, mt);
  auto ins = s.make(s.small, op::insert);
  ins.after = s.small_row;
  p->change(s.info, ins);
  p->commit(s.info);
  p->message(mn);   // (after a transaction of two changes)
  REQUIRE(s.out.size() == 3);
  CHECK(s.out[0].bytes == R"j({"change":[{"kind":"message","transactional":false,"prefix":"ntx","content":"out"}]})j");
  CHECK(s.out[0].at == lsn{0x200});
  // (content as a C string: up to its NUL)
  CHECK(s.out[1].bytes ==
        R"j({"change":[{"kind":"message","transactional":true,"prefix":"tx","content":"in"},{"kind":"insert","schema":"public","table":"t","columnnames":["id","v"],"columntypes":["integer","text"],"columnvalues":[1,"a"]}]})j");
  CHECK(s.out[2].bytes == R"j({"change":[,{"kind":"message","transactional":false,"prefix":"ntx","content":"out"}]})j");
}

TEST_CASE("wal2json format 2: B, I, U, D, T, M and C, with xids, times, LSNs and type oids; REPLICA IDENTITY FULL prints its nulls") {
  sample s;
  auto p = s.plugin({{"format-version", "2"}, {"include-xids", "1"}, {"include-timestamp", "1"}, {"include-lsn", "1"},
                     {"include-type-oids", "1"}});
  p->begin(s.info, lsn{0x1A2B300});
  auto ins = s.make(s.small, op::insert, 0x1A2B310);
  ins.after = s.small_row;
  p->change(s.info, ins);
  auto upd = s.make(s.full, op::update, 0x1A2B320);
  upd.after = s.full_new;
  upd.before_kind = 'O';
  upd.before = s.full_old;
  p->change(s.info, upd);
  auto upd_nokey = s.make(s.rel, op::update, 0x1A2B330);
  upd_nokey.after = s.row;
  p->change(s.info, upd_nokey);
  auto del = s.make(s.small, op::delete_, 0x1A2B340);
  del.before_kind = 'K';
  del.before = s.small_row;
  p->change(s.info, del);
  p->truncate(s.info, {&s.small, &s.full}, 0, lsn{0x1A2B350});
  pg::message tm{8841u, true, lsn{0x1A2B360}, "p\"x", protocol::as_bytes(std::string_view("c\x01"))};
  change mt = s.make(s.small, op::message, 0x1A2B360);
  mt.relation = nullptr;
  mt.message = &tm;
  p->change(s.info, mt);
  p->commit(s.info);
  pg::message nm{std::nullopt, false, lsn{0x1A2B400}, "n", protocol::as_bytes(std::string_view(""))};
  change mn = mt;
  mn.message = &nm;
  mn.change_lsn = lsn{0x1A2B400};
  p->message(mn);
  const std::string x = R"j("xid":8841,"timestamp":"2025-09-09 10:20:00.12345+00",)j";
  std::vector<std::pair<lsn, std::string>> expected = {
      {lsn{0x1A2B300}, R"j({"action":"B",)j" + x + R"j("lsn":"0/1A2B3C8","nextlsn":"0/1A2B3F0"})j"},
      {lsn{0x1A2B310}, R"j({"action":"I",)j" + x + R"j("lsn":"0/1A2B310","schema":"public","table":"t","columns":[{"name":"id","type":"integer","typeoid":23,"value":1},{"name":"v","type":"text","typeoid":25,"value":"a"}]})j"},
      {lsn{0x1A2B320}, R"j({"action":"U",)j" + x + R"j("lsn":"0/1A2B320","schema":"s","table":"f","columns":[{"name":"id","type":"integer","typeoid":23,"value":7},{"name":"ch","type":"char","typeoid":18,"value":"q"},{"name":"by","type":"bytea","typeoid":17,"value":"dead"},{"name":"x","type":"double precision","typeoid":701,"value":null}],"identity":[{"name":"id","type":"integer","typeoid":23,"value":7},{"name":"ch","type":"char","typeoid":18,"value":null},{"name":"by","type":"bytea","typeoid":17,"value":""},{"name":"x","type":"double precision","typeoid":701,"value":null}]})j"},
      {lsn{0x1A2B330}, R"j({"action":"U",)j" + x + R"j("lsn":"0/1A2B330","schema":"public","table":"Order Lines","columns":[{"name":"id","type":"integer","typeoid":23,"value":42},{"name":"note","type":"text","typeoid":25,"value":"it's \"q\"\n"},{"name":"amount","type":"numeric(12,2)","typeoid":1700,"value":149.90},{"name":"paid","type":"boolean","typeoid":16,"value":true},{"name":"flags","type":"bit(4)","typeoid":1560,"value":"1010"},{"name":"code","type":"character(3)","typeoid":1042,"value":"ab "},{"name":"user","type":"character varying(20)","typeoid":1043,"value":"x"},{"name":"mood","type":"app.mood","typeoid":70001,"value":"happy"},{"name":"at","type":"timestamp with time zone","typeoid":1184,"value":"2025-09-09 10:20:00.12345+00"}],"identity":[{"name":"id","type":"integer","typeoid":23,"value":42}]})j"},
      {lsn{0x1A2B340}, R"j({"action":"D",)j" + x + R"j("lsn":"0/1A2B340","schema":"public","table":"t","identity":[{"name":"id","type":"integer","typeoid":23,"value":1}]})j"},
      {lsn{0x1A2B350}, R"j({"action":"T",)j" + x + R"j("lsn":"0/1A2B350","schema":"public","table":"t"})j"},
      {lsn{0x1A2B350}, R"j({"action":"T",)j" + x + R"j("lsn":"0/1A2B350","schema":"s","table":"f"})j"},
      {lsn{0x1A2B360}, R"j({"action":"M",)j" + x + R"j("lsn":"0/1A2B360","transactional":true,"prefix":"p\"x","content":"c\u0001"})j"},
      {lsn{0x1A2B3F0}, R"j({"action":"C",)j" + x + R"j("lsn":"0/1A2B3C8","nextlsn":"0/1A2B3F0"})j"},
      {lsn{0x1A2B400}, R"j({"action":"M","xid":null,"timestamp":null,"lsn":"0/1A2B400","transactional":false,"prefix":"n","content":""})j"}};
  REQUIRE(s.out.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("message " << i);
    CHECK(s.out[i].at == expected[i].first);
    CHECK(s.out[i].bytes == expected[i].second);
  }
}

TEST_CASE("wal2json format 2: \"char\" as format_type() quotes it, left unescaped (the plugin's shortcut); its array escaped") {
  sample s;
  pg::cached_relation r;
  r.nspname = "public";
  r.relname = "c";
  r.columns = {{"a", 18, -1, false}, {"b", 1002, -1, false}, {"i", 1186, (6 << 16 | 0xFFFF) | (1 << 27), false}};
  r.columns[2].type_modifier = ((1 << 3 | 1 << 10 | 1 << 11 | 1 << 12) << 16) | 3;   // day to second(3)
  auto p = s.plugin({{"format-version", "2"}, {"include-transaction", "0"}});
  p->begin(s.info, lsn{1});
  auto ins = s.make(r, op::insert);
  std::vector<pg::tuple_column> row = {t("x"), t("{x}"), t("1 day")};
  ins.after = row;
  p->change(s.info, ins);
  p->commit(s.info);
  REQUIRE(s.out.size() == 1);
  CHECK(s.out[0].bytes ==
        R"j({"action":"I","schema":"public","table":"c","columns":[{"name":"a","type":"char","value":"x"},{"name":"b","type":"\"char\"[]","value":"{x}"},{"name":"i","type":"interval day to second(3)","value":"1 day"}]})j");
}

TEST_CASE("wal2json: table, action and message filters as the plugin applies them") {
  sample s;
  auto p = s.plugin({{"format-version", "2"}, {"include-transaction", "false"}, {"include-schemas", "0"}, {"include-types", "0"},
                     {"add-tables", R"j(public.Order\ Lines, s.*)j"}, {"filter-tables", "*.f"}, {"actions", "insert, delete"},
                     {"add-msg-prefixes", "a,b"}, {"filter-msg-prefixes", "b"}});
  p->begin(s.info, lsn{1});
  auto ins = s.make(s.rel, op::insert);
  ins.after = s.row;
  p->change(s.info, ins);   // added
  auto ins_t = s.make(s.small, op::insert);
  ins_t.after = s.small_row;
  p->change(s.info, ins_t);   // not added
  auto ins_f = s.make(s.full, op::insert);
  ins_f.after = s.full_new;
  p->change(s.info, ins_f);   // filtered
  auto upd = s.make(s.rel, op::update);
  upd.after = s.row;
  p->change(s.info, upd);   // not an action asked for
  p->truncate(s.info, {&s.rel}, 0, lsn{2});   // nor is truncate
  for (const char* prefix : {"a", "b", "c"}) {
    pg::message m{8841u, true, lsn{3}, prefix, protocol::as_bytes(std::string_view("x"))};
    change mc = s.make(s.small, op::message);
    mc.relation = nullptr;
    mc.message = &m;
    p->change(s.info, mc);
  }
  p->commit(s.info);
  REQUIRE(s.out.size() == 2);
  CHECK(s.out[0].bytes.starts_with(R"j({"action":"I","table":"Order Lines","columns":[{"name":"id","value":42},)j"));
  CHECK(s.out[1].bytes == R"j({"action":"M","transactional":true,"prefix":"a","content":"x"})j");
}

TEST_CASE("wal2json: options parsed as pg_decode_startup parses them, with its error texts; what the log cannot know refused") {
  auto ok = [](const plugin_options& o) {
    auto r = parse_wal2json_options(o);
    INFO(r.error);
    CHECK(r.error.empty());
    return r.options;
  };
  auto fails = [](const plugin_options& o, const char* sqlstate, const std::string& text) {
    auto r = parse_wal2json_options(o);
    CHECK(r.sqlstate == sqlstate);
    CHECK(r.error == text);
  };
  auto d = ok({});
  CHECK(d.format_version == 1);
  CHECK(d.include_transaction);
  CHECK_FALSE(d.include_xids);
  CHECK(d.include_typmod);
  CHECK(d.truncate);
  REQUIRE(d.add_tables.size() == 1);
  CHECK((d.add_tables[0].all_schemas && d.add_tables[0].all_tables));
  CHECK(ok({{"format-version", std::nullopt}}).format_version == 2);
  CHECK(ok({{"format-version", " 2 "}}).format_version == 2);
  CHECK(ok({{"format-version", "0x2"}}).format_version == 2);
  CHECK(ok({{"format-version", "1.4"}}).format_version == 1);
  fails({{"format-version", "3"}}, "0A000", "client sent format_version=3 but we only support format 2 or lower");
  fails({{"format-version", "0"}}, "0A000", "client sent format_version=0 but we only support format 1 or higher");
  fails({{"format-version", "two"}}, "22023", "could not parse value \"two\" for parameter \"format-version\"");
  fails({{"include-xids", "maybe"}}, "22023", "could not parse value \"maybe\" for parameter \"include-xids\"");
  fails({{"include-unchanged-toast", "1"}}, "42602", "parameter \"include-unchanged-toast\" was deprecated");
  fails({{"nope", std::nullopt}}, "22023", "option \"nope\" = \"(null)\" is unknown");
  fails({{"actions", "insert,upsert"}}, "22023", "could not parse value \"upsert\" for parameter \"actions\"");
  fails({{"actions", "insert,"}}, "42602", "could not parse value \"insert,\" for parameter \"actions\"");
  fails({{"add-tables", "nodot"}}, "42602", "could not parse value \"nodot\" for parameter \"add-tables\"");
  fails({{"filter-tables", "a.b c.d"}}, "42602", "could not parse value \"a.b c.d\" for parameter \"filter-tables\"");
  // Escapes: a '.', a ',' and a space in names; "*" alone is every table, "\*" a table named "*".
  auto t = ok({{"add-tables", R"j(my\.schema.t\,1, s.*, *.x, s.\*, a.b\ c)j"}}).add_tables;
  REQUIRE(t.size() == 5);
  CHECK(t[0].schema == "my.schema");
  CHECK(t[0].table == "t,1");
  CHECK((t[1].schema == "s" && t[1].all_tables && !t[1].all_schemas));
  CHECK((t[2].all_schemas && t[2].table == "x"));
  CHECK((t[3].table == "*" && !t[3].all_tables));
  CHECK(t[4].table == "b c");
  CHECK(ok({{"add-tables", std::nullopt}}).add_tables.empty());   // (nothing is added then)
  // Given twice: filter-tables and the prefix lists add up (the plugin appends), add-tables
  // starts again, no value empties; pretty-print once on stays on.
  CHECK(ok({{"filter-tables", "a.b"}, {"filter-tables", "c.d"}}).filter_tables.size() == 2);
  CHECK(ok({{"filter-tables", "a.b"}, {"filter-tables", std::nullopt}}).filter_tables.empty());
  CHECK(ok({{"add-tables", "a.b"}, {"add-tables", "c.d"}}).add_tables.size() == 1);
  CHECK(ok({{"add-msg-prefixes", "x"}, {"add-msg-prefixes", "y,z"}}).add_msg_prefixes.size() == 3);
  CHECK(ok({{"pretty-print", "1"}, {"pretty-print", "0"}}).pretty_whitespace);
  CHECK_FALSE(ok({{"pretty-print", "0"}}).pretty_whitespace);
  CHECK(ok({{"add-tables", "  "}}).add_tables.empty());
  // Options walgate cannot serve: refused when on, accepted off.
  for (const char* o : {"include-pk", "include-origin", "include-domain-data-type", "include-column-positions",
                        "include-default"}) {
    INFO(o);
    auto r = parse_wal2json_options({{o, "1"}});
    CHECK(r.sqlstate == "0A000");
    CHECK(r.error.find("is not served by walgate") != std::string::npos);
    CHECK(parse_wal2json_options({{o, "off"}}).error.empty());
  }
  CHECK(parse_wal2json_options({{"filter-origins", "1,2"}}).sqlstate == "0A000");
  CHECK(parse_wal2json_options({{"filter-origins", ""}}).error.empty());
  // The factory: an unknown plugin, and test_decoding's errors through it.
  auto none = make_output_plugin("decoderbufs", {}, {}, [](lsn, std::string_view) {});
  CHECK_FALSE(none.plugin);
  CHECK(none.error == "output plugin \"decoderbufs\" is not served by walgate");
  auto td = make_output_plugin("test_decoding", {{"bad", "1"}}, {}, [](lsn, std::string_view) {});
  CHECK(td.error == "option \"bad\" = \"1\" is unknown");
}

TEST_CASE("escape_json as PostgreSQL's: control characters \\u00xx in lower case, the rest as it is, a NUL ends it") {
  std::string out;
  pg_escape_json(out, std::string_view("a\"\\\b\f\n\r\t\x01\x1f\x7f\xc3\xa9 \0tail", 19));
  CHECK(out == "\"a\\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\xc3\xa9 \"");
  out.clear();
  pg_escape_json(out, "");
  CHECK(out == "\"\"");
}

TEST_CASE("type names: pg_type.typname of built-ins, format_type()'s interval typmods") {
  CHECK(builtin_typname(23) == "int4");
  CHECK(builtin_typname(1007) == "_int4");
  CHECK(builtin_typname(1042) == "bpchar");
  CHECK(builtin_typname(1184) == "timestamptz");
  CHECK(builtin_typname(18) == "char");
  CHECK(builtin_typname(3802) == "jsonb");
  CHECK(builtin_typname(1562) == "varbit");
  CHECK(builtin_typname(99999).empty());
  CHECK(builtin_type_name(1186, -1) == "interval");
  CHECK(builtin_type_name(1186, (1 << 2) << 16 | 0xFFFF) == "interval year");
  CHECK(builtin_type_name(1186, 0x7FFF << 16 | 2) == "interval(2)");
  CHECK(builtin_type_name(1186, ((1 << 1 | 1 << 2) << 16) | 0xFFFF) == "interval year to month");
  CHECK(builtin_type_name(1187, ((1 << 11 | 1 << 12) << 16) | 0) == "interval minute to second(0)[]");
}

TEST_CASE("wal2json include-not-null from the catalog: format 1's columnoptionals (empty without types, as the plugin), format 2's optional; a column the catalog lacks fails the stream") {
  sample s;
  const std::vector<published_table> catalog = {{"public", "t", {{"id", true}, {"v", false}}}};
  auto insert_into = [&](output_plugin& p) {
    p.begin(s.info, lsn{1});
    auto ins = s.make(s.small, op::insert);
    ins.after = s.small_row;
    p.change(s.info, ins);
    auto del = s.make(s.small, op::delete_);
    del.before_kind = 'K';
    del.before = s.small_row;
    p.change(s.info, del);
    p.commit(s.info);
  };
  auto v1 = s.plugin({{"include-not-null", "1"}});
  REQUIRE(v1->needs_catalog());
  v1->set_catalog(catalog);
  insert_into(*v1);
  REQUIRE(s.out.size() == 1);
  CHECK(s.out[0].bytes ==
        R"j({"change":[{"kind":"insert","schema":"public","table":"t","columnnames":["id","v"],"columntypes":["integer","text"],"columnoptionals":[false,true],"columnvalues":[1,"a"]},{"kind":"delete","schema":"public","table":"t","oldkeys":{"keynames":["id"],"keytypes":["integer"],"keyvalues":[1]}}]})j");
  s.out.clear();
  auto untyped = s.plugin({{"include-not-null", "1"}, {"include-types", "0"}});
  untyped->set_catalog(catalog);
  insert_into(*untyped);
  REQUIRE(s.out.size() == 1);
  CHECK(s.out[0].bytes.find(R"j("columnnames":["id","v"],"columnoptionals":[],"columnvalues":[1,"a"])j") != std::string::npos);
  s.out.clear();
  auto v2 = s.plugin({{"format-version", "2"}, {"include-not-null", "1"}, {"include-transaction", "0"}});
  v2->set_catalog(catalog);
  insert_into(*v2);
  REQUIRE(s.out.size() == 2);
  CHECK(s.out[0].bytes ==
        R"j({"action":"I","schema":"public","table":"t","columns":[{"name":"id","type":"integer","value":1,"optional":false},{"name":"v","type":"text","value":"a","optional":true}]})j");
  CHECK(s.out[1].bytes == R"j({"action":"D","schema":"public","table":"t","identity":[{"name":"id","type":"integer","value":1}]})j");
  // A column the catalog did not have: the stream's error, not a guess.
  s.out.clear();
  auto stale = s.plugin({{"format-version", "2"}, {"include-not-null", "1"}});
  stale->set_catalog({{"public", "t", {{"id", true}}}});
  insert_into(*stale);
  CHECK(stale->failed().find("column \"v\" of \"public\".\"t\"") != std::string::npos);
  CHECK_FALSE(s.plugin({})->needs_catalog());
  CHECK(s.plugin({{"add-tables", "public.t"}})->needs_catalog());
}
