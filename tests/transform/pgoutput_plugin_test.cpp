// pgoutput as walgate emulates it for subscribers: the messages of a transaction, exact bytes
// (built by hand as proto.c writes them) and read back by walgate's own decoder; Relation and
// Type messages once per relation until its definition changes; origin, messages, origin
// 'none'; the options of pgoutput_startup with their texts. Against a real subscriber:
// tests/proxy/replication_server_test.cpp.
#include "walgate/protocol/cursor.hpp"
#include "walgate/protocol/pgoutput.hpp"
#include "walgate/transform/pgoutput_plugin.hpp"

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
  pg::cached_relation rel;
  pg::type_cache types;
  protocol::transaction_info txn;
  plugin_transaction info;
  std::vector<pg::tuple_column> row{t("7"), t("happy"), toast()}, key{t("6"), null(), null()};
  std::vector<written> out;
  sample() {
    rel.oid = 16400;
    rel.nspname = "public";
    rel.relname = "t";
    rel.replica_identity = 'd';
    rel.columns = {{"id", 23, -1, true}, {"m", 70001, -1, false}, {"doc", 25, -1, false}};
    types.update(pg::type{std::nullopt, 70001, "app", "mood"});
    txn.xid = 741;
    txn.commit_lsn = lsn{0x3000};
    info.xid = 741;
    info.commit_lsn = lsn{0x3000};
    info.end_lsn = lsn{0x3030};
    info.commit_time = 812345678;
  }
  change make(op k, std::uint64_t at) const {
    change c;
    c.kind = k;
    c.txn = &txn;
    c.change_lsn = lsn{at};
    c.relation = &rel;
    c.types = &types;
    return c;
  }
  std::unique_ptr<output_plugin> plugin(const plugin_options& options) {
    plugin_context context;
    context.server_major = 16;
    context.publications = {"pub"};
    auto made = make_output_plugin("pgoutput", options, context, [this](lsn at, std::string_view b) { out.push_back({at, std::string(b)}); });
    REQUIRE_MESSAGE(made.plugin, made.error);
    return std::move(made.plugin);
  }
};

std::string be32(std::uint32_t v) {
  std::string s;
  protocol::writer(s).u32(v);
  return s;
}
std::string be64(std::uint64_t v) {
  std::string s;
  protocol::writer(s).u64(v);
  return s;
}
std::string text_col(std::string_view v) { return "t" + be32(static_cast<std::uint32_t>(v.size())) + std::string(v); }
const plugin_options base = {{"proto_version", "4"}, {"publication_names", "\"pub\""}};
}  // namespace

TEST_CASE("pgoutput: B, Y and R before a relation's first change, I U D T, C — the bytes proto.c writes, read back by the decoder") {
  sample s;
  auto p = s.plugin(base);
  p->begin(s.info, lsn{0x2F00});
  auto ins = s.make(op::insert, 0x2F10);
  ins.after = s.row;
  p->change(s.info, ins);
  auto upd = s.make(op::update, 0x2F20);
  upd.after = s.row;
  upd.before_kind = 'K';
  upd.before = s.key;
  p->change(s.info, upd);
  auto del = s.make(op::delete_, 0x2F30);
  del.before_kind = 'K';
  del.before = s.key;
  p->change(s.info, del);
  p->truncate(s.info, {&s.rel}, 2, lsn{0x2F40});
  p->commit(s.info);
  const std::string tuple_new = std::string("\0\3", 2) + text_col("7") + text_col("happy") + "u";
  const std::string tuple_key = std::string("\0\3", 2) + text_col("6") + "nn";
  const std::vector<std::pair<lsn, std::string>> expected = {
      {lsn{0x2F00}, "B" + be64(0x3000) + be64(812345678) + be32(741)},
      {lsn{0x2F10}, "Y" + be32(70001) + std::string("app\0mood\0", 9)},
      {lsn{0x2F10}, "R" + be32(16400) + std::string("public\0t\0d", 10) + std::string("\0\3", 2) + std::string("\1id\0", 4) +
                        be32(23) + be32(0xffffffff) + std::string("\0m\0", 3) + be32(70001) + be32(0xffffffff) +
                        std::string("\0doc\0", 5) + be32(25) + be32(0xffffffff)},
      {lsn{0x2F10}, "I" + be32(16400) + "N" + tuple_new},
      {lsn{0x2F20}, "U" + be32(16400) + "K" + tuple_key + "N" + tuple_new},
      {lsn{0x2F30}, "D" + be32(16400) + "K" + tuple_key},
      {lsn{0x2F40}, "T" + be32(1) + std::string("\2", 1) + be32(16400)},
      {lsn{0x3030}, "C" + std::string("\0", 1) + be64(0x3000) + be64(0x3030) + be64(812345678)}};
  REQUIRE(s.out.size() == expected.size());
  pg::decoder d;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("message " << i);
    CHECK(s.out[i].at == expected[i].first);
    CHECK(s.out[i].bytes == expected[i].second);
    CHECK(d.decode(protocol::as_bytes(std::string_view(s.out[i].bytes)), {}).has_value());
  }
}

TEST_CASE("pgoutput: a relation described once per connection, again when its definition changes; origin; messages; origin 'none'") {
  sample s;
  auto p = s.plugin({{"proto_version", "2"}, {"publication_names", "pub"}, {"messages", "on"}, {"streaming", "true"}});
  auto ins = s.make(op::insert, 0x10);
  ins.after = s.row;
  s.info.has_origin = true;
  s.info.origin = "node_a";
  s.info.origin_lsn = lsn{0x99};
  p->begin(s.info, lsn{0x10});
  p->change(s.info, ins);
  p->change(s.info, ins);
  p->commit(s.info);
  CHECK(s.out.size() == 7);   // B, O, Y, R, I, I, C
  CHECK(s.out[1].bytes == "O" + be64(0x99) + std::string("node_a\0", 7));
  s.out.clear();
  s.info.has_origin = false;
  p->begin(s.info, lsn{0x20});
  p->change(s.info, ins);   // (described already)
  s.rel.columns.push_back({"added", 20, -1, false});   // an ALTER TABLE: described again
  std::vector<pg::tuple_column> wider{t("8"), t("sad"), null(), t("1")};
  ins.after = wider;
  p->change(s.info, ins);
  pg::message m{741u, true, lsn{0x30}, "pfx", protocol::as_bytes(std::string_view("c"))};
  change mc = s.make(op::message, 0x30);
  mc.relation = nullptr;
  mc.message = &m;
  p->change(s.info, mc);
  p->commit(s.info);
  REQUIRE(s.out.size() == 7);   // B, I, Y, R, I, M, C
  CHECK(s.out[1].bytes[0] == 'I');
  CHECK(s.out[2].bytes[0] == 'Y');
  CHECK(s.out[3].bytes[0] == 'R');
  CHECK(s.out[5].bytes == "M" + std::string("\1", 1) + be64(0x30) + std::string("pfx\0", 4) + be32(1) + "c");
  // origin 'none': a transaction with an origin, and a non-transactional message of one, left out.
  sample n;
  auto q = n.plugin({{"proto_version", "4"}, {"publication_names", "pub"}, {"origin", "none"}, {"messages", "1"}});
  n.info.has_origin = true;
  q->begin(n.info, lsn{1});
  auto ins2 = n.make(op::insert, 2);
  ins2.after = n.row;
  q->change(n.info, ins2);
  q->commit(n.info);
  CHECK(n.out.empty());
  // (messages off: none sent — and a transaction of a message alone sends nothing at all, no
  // BEGIN or COMMIT, as pgoutput from 15 skips an empty transaction)
  sample off;
  auto r = off.plugin(base);
  pg::message nm{std::nullopt, false, lsn{5}, "x", {}};
  change nc = off.make(op::message, 5);
  nc.relation = nullptr;
  nc.message = &nm;
  r->message(nc);
  pg::message tm2{741u, true, lsn{6}, "x", {}};
  change tc = nc;
  tc.message = &tm2;
  r->begin(off.info, lsn{6});
  r->change(off.info, tc);
  r->commit(off.info);
  CHECK(off.out.empty());
}

TEST_CASE("pgoutput: options as pgoutput_startup takes them, its error texts; walgate's own publications alone; binary refused") {
  plugin_context c15;
  c15.server_major = 15;
  c15.publications = {"pub", "Other Pub"};
  auto err = [&](const plugin_options& o, const plugin_context& c = {}) {
    plugin_context ctx = c;
    if (ctx.publications.empty()) ctx.publications = {"pub"};
    return parse_pgoutput_options(o, ctx);
  };
  CHECK(err({{"publication_names", "pub"}}).error == "option \"proto_version\" missing");
  CHECK(err({{"proto_version", "1"}}).error == "option \"publication_names\" missing");
  CHECK(err({{"proto_version", "x"}, {"publication_names", "pub"}}).error == "invalid proto_version");
  CHECK(err({{"proto_version", "99999999999"}, {"publication_names", "pub"}}).error == "proto_version \"99999999999\" out of range");
  CHECK(err({{"proto_version", "4"}, {"publication_names", "pub"}}, c15).error ==
        "client sent proto_version=4 but server only supports protocol 3 or lower");
  CHECK(err({{"proto_version", "0"}, {"publication_names", "pub"}}).error ==
        "client sent proto_version=0 but server only supports protocol 1 or higher");
  CHECK(err({{"proto_version", "1"}, {"publication_names", "pub"}, {"streaming", "on"}}).error ==
        "requested proto_version=1 does not support streaming, need 2 or higher");
  CHECK(err({{"proto_version", "3"}, {"publication_names", "pub"}, {"streaming", "parallel"}}).error ==
        "requested proto_version=3 does not support parallel streaming, need 4 or higher");
  CHECK(err({{"proto_version", "2"}, {"publication_names", "pub"}, {"two_phase", "on"}}).error ==
        "requested proto_version=2 does not support two-phase commit, need 3 or higher");
  CHECK(err({{"proto_version", "1"}, {"proto_version", "1"}, {"publication_names", "pub"}}).error == "conflicting or redundant options");
  CHECK(err({{"proto_version", "1"}, {"publication_names", "pub"}, {"nope", "1"}}).error == "unrecognized pgoutput option: nope");
  CHECK(err({{"proto_version", "4"}, {"publication_names", "pub"}, {"origin", "some"}}).error == "unrecognized origin value: \"some\"");
  // (options each version's pgoutput does not know yet)
  CHECK(err({{"proto_version", "3"}, {"publication_names", "pub"}, {"origin", "any"}}, c15).error == "unrecognized pgoutput option: origin");
  plugin_context c13;
  c13.server_major = 13;
  c13.publications = {"pub"};
  CHECK(err({{"proto_version", "1"}, {"publication_names", "pub"}, {"messages", "on"}}, c13).error == "unrecognized pgoutput option: messages");
  plugin_context c14 = c13;
  c14.server_major = 14;
  CHECK(err({{"proto_version", "2"}, {"publication_names", "pub"}, {"two_phase", "on"}}, c14).error == "unrecognized pgoutput option: two_phase");
  CHECK(err({{"proto_version", "1"}, {"publication_names", "pub,"}}).error == "invalid publication_names syntax");
  auto binary = err({{"proto_version", "1"}, {"publication_names", "pub"}, {"binary", "true"}});
  CHECK(binary.sqlstate == "0A000");
  CHECK(binary.error.find("binary") != std::string::npos);
  CHECK(err({{"proto_version", "1"}, {"publication_names", "pub"}, {"binary", "off"}}).error.empty());
  auto other = err({{"proto_version", "1"}, {"publication_names", "pub, elsewhere"}});
  CHECK(other.sqlstate == "0A000");
  CHECK(other.error == "publication \"elsewhere\" is not served by walgate: its log holds publication \"pub\" alone");
  // Every one of walgate's publications (the log does not say which a change came through).
  auto part = parse_pgoutput_options({{"proto_version", "3"}, {"publication_names", "pub"}}, c15);
  CHECK(part.error == "walgate serves its publications \"pub\", \"Other Pub\" together: publication_names must name every one "
                      "of them (\"Other Pub\" is missing)");
  CHECK(parse_pgoutput_options({{"proto_version", "3"}, {"publication_names", ""}}, c15).sqlstate == "0A000");
  auto ok = parse_pgoutput_options({{"proto_version", "3"}, {"publication_names", R"("Other Pub", PUB)"}, {"two_phase", "on"}}, c15);
  CHECK(ok.error.empty());
  CHECK(ok.options.publication_names == std::vector<std::string>{"Other Pub", "pub"});
  CHECK(ok.options.two_phase);
  // SplitIdentifierString: quotes, "" inside them, lower-casing, whitespace, the errors.
  std::vector<std::string> names;
  CHECK(split_identifier_list(R"( a , "B ""c""",D)", names));
  CHECK(names == std::vector<std::string>{"a", "B \"c\"", "d"});
  names.clear();
  CHECK(split_identifier_list("  ", names));
  CHECK(names.empty());
  for (const char* bad : {"a,", ",a", "\"open", "a b", "a,,b"}) {
    INFO(bad);
    names.clear();
    CHECK_FALSE(split_identifier_list(bad, names));
  }
}
