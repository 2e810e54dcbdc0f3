#include "walgate/transform/formats.hpp"
#include "walgate/transform/json.hpp"

#include "split_helpers.hpp"

#include <boost/json/parse.hpp>
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
  protocol::transaction_info txn;
  std::vector<pg::tuple_column> row, old_key;
  sample() {
    rel.oid = 16384;
    rel.nspname = "public";
    rel.relname = "orders";
    rel.columns = {{"id", 23, -1, true},         {"note", 25, -1, false},   {"amount", 1700, (12 << 16 | 2) + 4, false},
                   {"paid", 16, -1, false},      {"tags", 1009, -1, false}, {"meta", 3802, -1, false},
                   {"big", 20, -1, false},       {"at", 1184, -1, false},   {"blob", 17, -1, false}};
    txn.xid = 8841;
    txn.commit_lsn = lsn{0x1A2B3C8};
    txn.end_lsn = lsn{0x1A2B3F0};
    txn.commit_time = protocol::unix_us_to_pg(1757413200123456LL);
    row = {t("42"), t("say \"hi\"\n"), t("149.99"), t("t"), t("{a,\"b c\",NULL}"), t("{\"k\": [1, 2]}"),
           t("9007199254740993"), t("2025-09-09 10:20:00.123456+00"), t("\\xdeadbeef")};
    old_key = {t("41"), null(), null(), null(), null(), null(), null(), null(), null()};
  }
  change make(op k) const {
    change c;
    c.kind = k;
    c.txn = &txn;
    c.change_lsn = lsn{0x1A2B3C4};
    c.index = 0;
    c.relation = &rel;
    if (k != op::delete_) c.after = row;
    return c;
  }
};

std::string enc(const change& c, format f, encoder_options o = {}) {
  o.processing_time_ms = 1757413200456;
  o.database = "app";
  std::string out;
  REQUIRE(encode_change(out, c, f, o));
  boost::system::error_code ec;
  boost::json::parse(out, ec);
  CHECK_MESSAGE(!ec, out);
  return out;
}
}  // namespace

TEST_CASE("event ids order by commit LSN as a number, then index") {
  auto a = event_id::parse("0/1A2B3C8:0"), b = event_id::parse("0/1A2B3C8:1"), c = event_id::parse("1/0:0"),
       d = event_id::parse("0/FFFFFFFF:7");
  REQUIRE((a && b && c && d));
  CHECK(*a < *b);
  CHECK(*d < *c);   // "0/FFFFFFFF" sorts after "1/0" as a string, but not as a number
  CHECK(a->to_string() == "0/1A2B3C8:0");
  CHECK_FALSE(event_id::parse("0/1A2B3C8"));
  CHECK_FALSE(event_id::parse("0/1:x"));
  CHECK_FALSE(event_id::parse("0/1:99999999999"));
}

TEST_CASE("idempotency keys are UUIDv5 of the event id, stable across redeliveries") {
  auto k = uuid_v5("0/1A2B3C8:0");
  CHECK(k == uuid_v5("0/1A2B3C8:0"));
  CHECK(k != uuid_v5("0/1A2B3C8:1"));
  CHECK(k.size() == 36);
  CHECK(k[14] == '5');
  // Python: uuid.uuid5(uuid.UUID('3c1f7c3e-5b0a-4f43-9b7e-2f6a1d9e8c41'), name)
  CHECK(k == "7edd4921-c69e-59af-ac52-8b753d4f2962");
  CHECK(uuid_v5(std::string(100, 'x')) == "2b9fe6b5-c0db-5c43-b165-98cb335666c1");   // a name over one SHA-1 block
}

TEST_CASE("native: walcast's ChangeEvent field for field") {
  sample s;
  CHECK(enc(s.make(op::insert), format::native) ==
        R"j({"id":"0/1A2B3C8:0","lsn":"0/1A2B3C4","commit_lsn":"0/1A2B3C8","commit_time":"2025-09-09T10:20:00.123456Z",)j"
        R"j("schema":"public","table":"orders","op":"insert","before":null,"after":{"id":42,"note":"say \"hi\"\n",)j"
        R"j("amount":"149.99","paid":true,"tags":"{a,\"b c\",NULL}","meta":{"k": [1, 2]},"big":"9007199254740993",)j"
        R"j("at":"2025-09-09 10:20:00.123456+00","blob":"\\xdeadbeef"}})j");
  auto del = s.make(op::delete_);
  del.before_kind = 'K';
  del.before = s.old_key;
  CHECK(enc(del, format::native).find(R"j("op":"delete","before":{"id":41},"after":null})j") != std::string::npos);
  auto upd = s.make(op::update);
  std::vector<pg::tuple_column> toasted{t("42"), toast()};
  upd.after = toasted;
  auto u = enc(upd, format::native);
  CHECK(u.find(R"j("before":null,"after":{"id":42,"note":"__unchanged_toast__"})j") != std::string::npos);
}

TEST_CASE("debezium: envelope, source block, types, key") {
  sample s;
  auto c = s.make(op::insert);
  CHECK(enc(c, format::debezium) ==
        R"j({"before":null,"after":{"id":42,"note":"say \"hi\"\n","amount":"149.99","paid":true,"tags":["a","b c",null],)j"
        R"j("meta":"{\"k\": [1, 2]}","big":9007199254740993,"at":"2025-09-09T10:20:00.123456Z","blob":"3q2+7w=="},)j"
        R"j("source":{"version":"walgate-0.1.0","connector":"postgresql","name":"walgate","ts_ms":1757413200123,)j"
        R"j("ts_us":1757413200123456,"snapshot":"false","db":"app","schema":"public","table":"orders","txId":8841,)j"
        R"j("lsn":27440068,"sequence":"[\"27440072\",\"27440068\"]"},"op":"c","ts_ms":1757413200456,"transaction":null})j");
  encoder_options o;
  o.decimal = encoder_options::decimal_mode::precise;
  o.transaction_metadata = true;
  auto p = enc(c, format::debezium, o);
  CHECK(p.find(R"j("amount":"Opc=")j") != std::string::npos);   // 14999 = 0x3A97
  CHECK(p.find(R"j("transaction":{"id":"8841:27440072","total_order":1,"data_collection_order":1})j") != std::string::npos);
  {
    // An unconstrained numeric carries its scale with the value (Debezium's VariableScaleDecimal).
    pg::cached_relation r;
    r.nspname = "public";
    r.relname = "n";
    r.columns = {{"v", 1700, -1, false}};
    std::vector<pg::tuple_column> row{t("-1.5")};
    change n = s.make(op::insert);
    n.relation = &r;
    n.after = row;
    CHECK(enc(n, format::debezium, o).find(R"j("after":{"v":{"scale":1,"value":"8Q=="}})j") != std::string::npos);
  }
  o.decimal = encoder_options::decimal_mode::double_;
  CHECK(enc(c, format::debezium, o).find(R"j("amount":149.99)j") != std::string::npos);
  CHECK(debezium_key(c) == R"j({"id":42})j");
  auto del = s.make(op::delete_);
  del.before_kind = 'K';
  del.before = s.old_key;
  CHECK(debezium_key(del) == R"j({"id":41})j");
}

TEST_CASE("pgoutput2json: c w n t k r, numbers with every digit, bytea as hex, compact mode") {
  sample s;
  auto c = s.make(op::insert);
  CHECK(enc(c, format::pgoutput2json) ==
        R"j({"c":"I","w":27440072,"n":1,"t":"public.orders","r":{"id":42,"note":"say \"hi\"\n","amount":149.99,)j"
        R"j("paid":true,"tags":["a","b c",null],"meta":"{\"k\": [1, 2]}","big":9007199254740993,)j"
        R"j("at":"2025-09-09 10:20:00.123456+00","blob":"deadbeef"}})j");
  auto del = s.make(op::delete_);
  del.before_kind = 'K';
  del.before = s.old_key;
  CHECK(enc(del, format::pgoutput2json) == R"j({"c":"D","w":27440072,"n":1,"t":"public.orders","k":{"id":41}})j");
  encoder_options o;
  o.compact = true;
  o.include_schema = true;
  auto compact = enc(del, format::pgoutput2json, o);
  CHECK(compact.find(R"j("s":["public.orders",["id",1,23],["note",0,25],["amount",0,1700,786438])j") != std::string::npos);
  CHECK(compact.find(R"j("k":[41]})j") != std::string::npos);
  CHECK(pgoutput2json_key(c) == "[42]");
}

TEST_CASE("waltail: op table data old seq idempotency_key commit_lsn, and the ordering key") {
  sample s;
  auto u = s.make(op::update);
  u.seq = 137;
  auto out = enc(u, format::waltail);
  CHECK(out.rfind(R"j({"op":"update","table":"public.orders","data":{"id":42,)j", 0) == 0);
  CHECK(out.find(R"j("old":{"id":42},"seq":137,"idempotency_key":")j" + uuid_v5("0/1A2B3C8:0") +
                 R"j(","commit_lsn":"0/1A2B3C8"})j") != std::string::npos);
  CHECK(out.find(R"j("amount":149.99)j") != std::string::npos);
  CHECK(out.find(R"j("meta":{"k": [1, 2]})j") != std::string::npos);
  CHECK(waltail_ordering_key(u) == "public.orders:42");
  std::string dummy;
  CHECK_FALSE(encode_change(dummy, s.make(op::truncate), format::waltail));
  CHECK(dummy.empty());
}

TEST_CASE("wal2json: format-version 2 records") {
  sample s;
  auto c = s.make(op::insert);
  auto out = enc(c, format::wal2json);
  CHECK(out.rfind(R"j({"action":"I","schema":"public","table":"orders","columns":[{"name":"id","type":"integer","value":42},)j", 0) == 0);
  CHECK(out.find(R"j({"name":"amount","type":"numeric(12,2)","value":149.99})j") != std::string::npos);
  CHECK(out.find(R"j({"name":"tags","type":"text[]","value":"{a,\"b c\",NULL}"})j") != std::string::npos);
  auto del = s.make(op::delete_);
  del.before_kind = 'K';
  del.before = s.old_key;
  CHECK(enc(del, format::wal2json) ==
        R"j({"action":"D","schema":"public","table":"orders","identity":[{"name":"id","type":"integer","value":41}]})j");
  CHECK(enc(s.make(op::truncate), format::wal2json) == R"j({"action":"T","schema":"public","table":"orders"})j");
}

TEST_CASE("float specials and numeric NaN in every format") {
  pg::cached_relation rel;
  rel.nspname = "public";
  rel.relname = "f";
  rel.columns = {{"f", 701, -1, false}, {"n", 1700, -1, false}};
  protocol::transaction_info txn;
  std::vector<pg::tuple_column> row = {t("NaN"), t("-Infinity")};
  change c;
  c.kind = op::insert;
  c.txn = &txn;
  c.relation = &rel;
  c.after = row;
  CHECK(enc(c, format::native).find(R"j("after":{"f":"NaN","n":"-Infinity"})j") != std::string::npos);
  CHECK(enc(c, format::pgoutput2json).find(R"j("r":{"f":null,"n":null})j") != std::string::npos);
  CHECK(enc(c, format::waltail).find(R"j("data":{"f":"NaN","n":"-Infinity"})j") != std::string::npos);
  CHECK(enc(c, format::wal2json).find(R"j("value":null)j") != std::string::npos);
  CHECK(enc(c, format::debezium).find(R"j("after":{"f":"NaN","n":"-Infinity"})j") != std::string::npos);
}

#include "walgate/transform/record.hpp"

TEST_CASE("event records round-trip: every format encodes the same from the record") {
  sample s;
  std::vector<change> changes;
  changes.push_back(s.make(op::insert));
  auto del = s.make(op::delete_);
  del.before_kind = 'K';
  del.before = s.old_key;
  changes.push_back(del);
  auto upd = s.make(op::update);
  upd.before_kind = 'O';
  upd.before = s.row;
  changes.push_back(upd);
  changes.push_back(s.make(op::truncate));
  pg::message m;
  m.transactional = true;
  m.prefix = "app";
  std::string content = "payload \x01";
  m.content = protocol::as_bytes(content);
  change msg;
  msg.kind = op::message;
  msg.txn = &s.txn;
  msg.message = &m;
  changes.push_back(msg);
  s.txn.origin = "node_a";
  {
    std::string native, w2j;
    encode_change(native, msg, format::native);
    encode_change(w2j, msg, format::wal2json);
    CHECK(native.find(R"j("op":"message","transactional":true,"prefix":"app","content":"payload \u0001","content_encoding":"text"})j") != std::string::npos);
    CHECK(w2j == R"j({"action":"M","transactional":true,"prefix":"app","content":"payload \u0001"})j");
  }
  {
    // Content that is not UTF-8: native's in base64, saying so; wal2json's as any string.
    pg::message bin = m;
    static const std::string bytes("\xff\x00\x01z", 4);
    bin.content = protocol::as_bytes(bytes);
    change c = msg;
    c.message = &bin;
    std::string native, w2j;
    encode_change(native, c, format::native);
    encode_change(w2j, c, format::wal2json);
    CHECK(native.find(R"j("content":"/wABeg==","content_encoding":"base64"})j") != std::string::npos);
    CHECK(w2j == R"j({"action":"M","transactional":true,"prefix":"app","content":"\ufffd\u0000\u0001z"})j");
  }
  CHECK(is_utf8("caf\xc3\xa9"));
  CHECK_FALSE(is_utf8("caf\xc3"));
  CHECK_FALSE(is_utf8("\xed\xa0\x80"));   // a surrogate
  record_view reused;   // one view for every record, in turn, as the server reads them
  record_writer writer;   // writes the same bytes, copying a relation's part once made
  s.rel.generation = protocol::pgoutput::next_generation();
  for (int pass = 0; pass < 2; ++pass)
  for (const auto& c : changes) {
    std::string rec;
    write_record(rec, c);
    auto back = read_record(protocol::as_bytes(rec));
    REQUIRE(back.has_value());
    REQUIRE(read_record(protocol::as_bytes(rec), reused).has_value());
    std::string rec2;
    writer.write(rec2, c);
    CHECK(rec2 == rec);
    for (auto f : all_formats) {
      std::string a, b, r;
      encoder_options o;
      o.processing_time_ms = 5;
      bool ea = encode_change(a, c, f, o), eb = encode_change(b, (*back)->get(), f, o);
      bool er = encode_change(r, reused.get(), f, o);
      CHECK(ea == eb);
      CHECK(a == b);
      CHECK(er == ea);
      CHECK(r == a);
    }
    if (pass == 1) continue;
    // Every truncation of a record is an error, never a crash.
    for (std::size_t i = 0; i < rec.size(); ++i) CHECK_FALSE(read_record(protocol::as_bytes(std::string_view(rec).substr(0, i))).has_value());
  }
}

TEST_CASE("record_writer: a relation's new definition (a new generation) is written anew") {
  sample s;
  s.rel.generation = protocol::pgoutput::next_generation();
  record_writer writer;
  auto c = s.make(op::insert);
  std::string a, b;
  writer.write(a, c);
  write_record(b, c);
  CHECK(a == b);
  s.rel.columns[1].name = "remark";   // ALTER TABLE ... RENAME: the decoder stores a new generation
  s.rel.generation = protocol::pgoutput::next_generation();
  a.clear();
  b.clear();
  writer.write(a, c);
  write_record(b, c);
  CHECK(a == b);
  CHECK(a.find("remark") != std::string::npos);
  // No generation (a relation not from a relation_cache): never cached.
  s.rel.generation = 0;
  s.rel.columns[1].name = "note2";
  a.clear();
  writer.write(a, c);
  CHECK(a.find("note2") != std::string::npos);
}

TEST_CASE("place_record: a record made ahead gets its index and snapshot_last, byte for byte as if made with them") {
  sample s;
  for (bool with_origin : {false, true}) {
    s.txn.origin = with_origin ? std::optional<std::string>("node_a") : std::nullopt;
    s.txn.gid = with_origin ? "gid-1" : "";
    for (bool last : {false, true}) {
      auto c = s.make(op::read);
      std::string ahead;
      write_record(ahead, c);
      c.index = 0x01020304;
      c.snapshot_last = last;
      std::string direct;
      write_record(direct, c);
      REQUIRE(place_record(ahead, 0x01020304, last));
      CHECK(ahead == direct);
      auto back = read_record(protocol::as_bytes(ahead));
      REQUIRE(back.has_value());
      CHECK((*back)->get().index == 0x01020304);
      CHECK((*back)->get().snapshot_last == last);
      // And back: the flag cleared again.
      REQUIRE(place_record(ahead, 7, false));
      CHECK_FALSE((*read_record(protocol::as_bytes(ahead)))->get().snapshot_last);
    }
  }
  // Not a record: refused at every length of a header cut short, and nothing is touched.
  s.txn.origin = std::nullopt;
  s.txn.gid.clear();
  auto c = s.make(op::read);
  std::string rec;
  write_record(rec, c);
  for (std::size_t n = 0; n < 60 && n < rec.size(); ++n) {
    std::string cut = rec.substr(0, n), before = cut;
    const bool placed = place_record(cut, 9, true);
    // (the header: version, op, 3 LSNs, time, xid, index, Str16, LSN, Str16, flags: 55 bytes)
    CHECK(placed == (n >= 55));
    CHECK((placed || cut == before));
  }
  std::string other = rec;
  other[0] = 99;   // an unknown version
  CHECK_FALSE(place_record(other, 9, true));
}

TEST_CASE("record: a message prefix longer than 64 KiB is kept whole; version 1 records still read") {
  sample s;
  pg::message m;
  m.transactional = false;
  std::string prefix(70'000, 'p');
  prefix.back() = 'q';
  m.prefix = prefix;
  std::string content = "c";
  m.content = protocol::as_bytes(content);
  change msg;
  msg.kind = op::message;
  msg.txn = &s.txn;
  msg.message = &m;
  std::string rec;
  write_record(rec, msg);
  auto back = read_record(protocol::as_bytes(rec));
  REQUIRE(back.has_value());
  CHECK((*back)->get().message->prefix == prefix);
  // The layout of version 1 (a Str16 prefix), as logs written before it hold.
  m.prefix = "app";
  std::string v2;
  write_record(v2, msg);
  const std::size_t at = v2.size() - (4 + 3) - (4 + 1);   // Str32 prefix | Int32 len | content
  std::string v1 = v2.substr(0, at);
  v1[0] = 1;
  v1 += std::string("\x00\x03", 2) + "app" + v2.substr(at + 4 + 3);
  auto old = read_record(protocol::as_bytes(v1));
  REQUIRE_MESSAGE(old.has_value(), old.error().message());
  CHECK((*old)->get().message->prefix == "app");
  CHECK(protocol::as_string_view((*old)->get().message->content) == "c");
}

TEST_CASE("event ids of transaction records: <commit_lsn>:B before the transaction's events, :C after them") {
  auto b = event_id::parse("0/1A2B3C8:B"), c = event_id::parse("0/1A2B3C8:C"), first = event_id::parse("0/1A2B3C8:0"),
       last = event_id::parse("0/1A2B3C8:4294967295"), before = event_id::parse("0/1A2B3C7:C"), after = event_id::parse("0/1A2B3C9:B");
  REQUIRE((b && c && first && last && before && after));
  CHECK(b->at == event_id::mark::begin);
  CHECK(c->at == event_id::mark::commit);
  CHECK(b->to_string() == "0/1A2B3C8:B");
  CHECK(c->to_string() == "0/1A2B3C8:C");
  CHECK(*before < *b);
  CHECK(*b < *first);
  CHECK(*first < *last);
  CHECK(*last < *c);
  CHECK(*c < *after);
  CHECK(*b != *first);
  CHECK_FALSE(event_id::parse("0/1:b"));
  CHECK_FALSE(event_id::parse("0/1:BC"));
  CHECK_FALSE(event_id::parse("x:B"));
}

TEST_CASE("transaction records: begin and commit in each format that has them, exact bytes") {
  protocol::transaction_info t;
  t.xid = 771;
  t.commit_lsn = lsn{0x16B3748};
  t.commit_time = 817'303'272'123'450;   // 2025-11-24 12:41:12.12345 UTC
  std::vector<table_count> tables{{"public", "orders", 1}, {"my \"s\"", "lines", 2}};
  std::string out;
  CHECK(encode_begin(out, format::native, t));
  CHECK(out == R"({"id":"0/16B3748:B","op":"begin","xid":771,"commit_lsn":"0/16B3748","commit_time":"2025-11-24T12:41:12.123450Z"})");
  out.clear();
  CHECK(encode_commit(out, format::native, t, 3, tables));
  CHECK(out == R"({"id":"0/16B3748:C","op":"commit","xid":771,"commit_lsn":"0/16B3748","commit_time":"2025-11-24T12:41:12.123450Z",)"
               R"("events":3,"tables":[{"schema":"public","table":"orders","events":1},{"schema":"my \"s\"","table":"lines","events":2}]})");
  t.origin = "node_b";
  out.clear();
  CHECK(encode_begin(out, format::native, t));
  CHECK(out.ends_with(R"("commit_time":"2025-11-24T12:41:12.123450Z","origin":"node_b"})"));
  out.clear();
  CHECK(encode_begin(out, format::wal2json, t));
  CHECK(out == R"({"action":"B","xid":771,"timestamp":"2025-11-24 12:41:12.12345+00"})");
  out.clear();
  CHECK(encode_commit(out, format::wal2json, t, 3, tables));
  CHECK(out == R"({"action":"C","xid":771,"timestamp":"2025-11-24 12:41:12.12345+00"})");
  out.clear();
  CHECK(encode_begin(out, format::debezium, t));
  CHECK(out == R"({"status":"BEGIN","id":"771:23803720","ts_ms":1763988072123,"event_count":null,"data_collections":null})");
  out.clear();
  CHECK(encode_commit(out, format::debezium, t, 3, tables));
  CHECK(out == R"({"status":"END","id":"771:23803720","ts_ms":1763988072123,"event_count":3,"data_collections":[)"
               R"({"data_collection":"public.orders","event_count":1},{"data_collection":"my \"s\".lines","event_count":2}]})");
  out.clear();
  append_debezium_transaction(out, t, 2, 1);
  CHECK(out == R"({"id":"771:23803720","total_order":2,"data_collection_order":1})");
  out.clear();
  CHECK_FALSE(encode_begin(out, format::waltail, t));
  CHECK_FALSE(encode_commit(out, format::pgoutput2json, t, 1, tables));
  CHECK(out.empty());
  CHECK(pg_timestamptz_utc(0) == "2000-01-01 00:00:00+00");
  CHECK(pg_timestamptz_utc(1) == "2000-01-01 00:00:00.000001+00");
  CHECK(pg_timestamptz_utc(500'000) == "2000-01-01 00:00:00.5+00");
}
