#include "walgate/protocol/pgoutput.hpp"
#include "walgate/protocol/replication.hpp"

#include "split_helpers.hpp"

#include <doctest/doctest.h>

using namespace walgate::protocol;
using namespace walgate::protocol::pgoutput;
using walgate::test::for_every_split;
using namespace std::string_literals;

namespace {
decode_context v1{1, false, false};
decode_context v4{4, false, false};
decode_context v4_stream{4, true, false};

template <class T>
const T& as(const parse_result<any_message>& r) {
  REQUIRE_MESSAGE(r.has_value(), (r.has_value() ? "" : r.error().message()));
  REQUIRE(std::holds_alternative<T>(*r));
  return std::get<T>(*r);
}
}  // namespace

TEST_CASE("Begin and Commit: exact bytes both ways") {
  std::string b = "B\x00\x00\x00\x00\x01\x51\x0a\xb8\x00\x02\xb1\x0b\x0c\x0d\x0e\x0f\x00\x00\x02\xe7"s;
  decoder d;
  auto r = d.decode(as_bytes(b), v1);
  const auto& m = as<begin>(r);
  CHECK(m.final_lsn.to_string() == "0/1510AB8");
  CHECK(m.commit_time == 0x0002b10b0c0d0e0fLL);
  CHECK(m.xid == 743);
  CHECK(encode(*r, v1) == b);

  std::string c = "C\x00\x00\x00\x00\x00\x01\x51\x0a\x80\x00\x00\x00\x00\x01\x51\x0a\xb8\x00\x02\xb1\x0b\x0c\x0d\x0e\x0f"s;
  auto rc = d.decode(as_bytes(c), v1);
  const auto& cm = as<commit>(rc);
  CHECK(cm.commit_lsn.to_string() == "0/1510A80");
  CHECK(cm.end_lsn.to_string() == "0/1510AB8");
  CHECK(encode(*rc, v1) == c);
  for (std::size_t i = 0; i < c.size(); ++i) CHECK_FALSE(d.decode(as_bytes(c.substr(0, i)), v1));
  CHECK_FALSE(d.decode(as_bytes(c + "x"), v1));
}

TEST_CASE("Relation: columns, key flags, replica identity; empty namespace means pg_catalog") {
  std::string r = "R\x00\x00\x40\x00" "public\0" "orders\0" "d\x00\x02"
                  "\x01" "id\0" "\x00\x00\x00\x14\xff\xff\xff\xff"
                  "\x00" "amount\0" "\x00\x00\x06\xa4\x00\x0c\x00\x06"s;
  decoder d;
  auto res = d.decode(as_bytes(r), v1);
  const auto& m = as<relation>(res);
  CHECK(m.oid == 16384);
  CHECK(m.nspname == "public");
  CHECK(m.relname == "orders");
  CHECK(m.replica_identity == 'd');
  REQUIRE(m.columns.size() == 2);
  CHECK(m.columns[0].key());
  CHECK(m.columns[0].name == "id");
  CHECK(m.columns[0].type_oid == 20);
  CHECK(m.columns[0].type_modifier == -1);
  CHECK_FALSE(m.columns[1].key());
  CHECK(m.columns[1].type_oid == 1700);
  CHECK(m.columns[1].type_modifier == 0x000c0006);
  CHECK(encode(*res, v1) == r);

  relation_cache cache;
  const auto& cached = cache.update(m);
  CHECK(cached.columns[1].name == "amount");
  CHECK(cache.find(16384)->relname == "orders");
  CHECK_FALSE(cache.find(1));

  std::string catalog = "R\x00\x00\x00\x01\0" "t\0" "n\x00\x00"s;
  auto cr = d.decode(as_bytes(catalog), v1);
  CHECK(cache.update(as<relation>(cr)).nspname == "pg_catalog");
  CHECK(cache.find(16384));   // the earlier entry is kept: the cache copied it

  std::string bad_identity = r;
  bad_identity[2 + 4 + 7 + 7 - 1] = 'x';
  CHECK(d.decode(as_bytes(bad_identity), v1).error().code == errc::invalid_value);
  std::string too_many = "R\x00\x00\x40\x00" "public\0" "orders\0" "d\xff\xff"s;
  CHECK(d.decode(as_bytes(too_many), v1).error().code == errc::length_out_of_range);
}

TEST_CASE("Insert, Update with K and O old tuples, Delete: every column kind") {
  std::string ins = "I\x00\x00\x40\x00N\x00\x04" "t\x00\x00\x00\x02" "42" "n" "u" "b\x00\x00\x00\x03\x01\x02\x03"s;
  decoder d;
  auto ri = d.decode(as_bytes(ins), v1);
  const auto& i = as<insert>(ri);
  CHECK(i.relation_oid == 16384);
  REQUIRE(i.new_tuple.size() == 4);
  CHECK(i.new_tuple[0].kind == column_kind::text);
  CHECK(as_string_view(i.new_tuple[0].value) == "42");
  CHECK(i.new_tuple[0].value.data() == as_bytes(ins).data() + 13);   // a view into the frame
  CHECK(i.new_tuple[1].kind == column_kind::null);
  CHECK(i.new_tuple[2].kind == column_kind::unchanged_toast);
  CHECK(i.new_tuple[3].kind == column_kind::binary);
  CHECK(as_string_view(i.new_tuple[3].value) == "\x01\x02\x03");
  CHECK(encode(*ri, v1) == ins);

  std::string upd_plain = "U\x00\x00\x40\x00N\x00\x01t\x00\x00\x00\x01x"s;
  auto rp = d.decode(as_bytes(upd_plain), v1);
  CHECK(as<update>(rp).old_kind == 0);
  CHECK(as<update>(rp).old_tuple.empty());
  CHECK(encode(*rp, v1) == upd_plain);

  std::string upd_key = "U\x00\x00\x40\x00K\x00\x01t\x00\x00\x00\x01" "1N\x00\x01t\x00\x00\x00\x01" "2"s;
  auto rk = d.decode(as_bytes(upd_key), v1);
  const auto& k = as<update>(rk);
  CHECK(k.old_kind == 'K');
  CHECK(as_string_view(k.old_tuple[0].value) == "1");
  CHECK(as_string_view(k.new_tuple[0].value) == "2");
  CHECK(encode(*rk, v1) == upd_key);

  std::string upd_full = "U\x00\x00\x40\x00O\x00\x02t\x00\x00\x00\x01" "1nN\x00\x02t\x00\x00\x00\x01" "1u"s;
  auto rf = d.decode(as_bytes(upd_full), v1);
  CHECK(as<update>(rf).old_kind == 'O');
  CHECK(as<update>(rf).old_tuple.size() == 2);
  CHECK(as<update>(rf).new_tuple[1].kind == column_kind::unchanged_toast);

  std::string del = "D\x00\x00\x40\x00K\x00\x01t\x00\x00\x00\x01" "7"s;
  auto rd = d.decode(as_bytes(del), v1);
  CHECK(as<delete_>(rd).old_kind == 'K');
  CHECK(encode(*rd, v1) == del);

  CHECK(d.decode(as_bytes("I\x00\x00\x40\x00X\x00\x00"s), v1).error().code == errc::invalid_value);
  CHECK(d.decode(as_bytes("D\x00\x00\x40\x00N\x00\x00"s), v1).error().code == errc::invalid_value);
  CHECK(d.decode(as_bytes("I\x00\x00\x40\x00N\x00\x01z"s), v1).error().code == errc::invalid_value);
  CHECK(d.decode(as_bytes("I\x00\x00\x40\x00N\x00\x01t\xff\xff\xff\xff"s), v1).error().code ==
        errc::length_out_of_range);
  CHECK(d.decode(as_bytes("I\x00\x00\x40\x00N\x00\x01t\x7f\xff\xff\xff"s), v1).error().code == errc::truncated);
  CHECK(d.decode(as_bytes("I\x00\x00\x40\x00N\xff\xff"s), v1).error().code == errc::length_out_of_range);
  auto named = d.decode(as_bytes("U\x00\x00\x40\x00N\x00\x01t\x00\x00"s), v1);
  CHECK(named.error().message().find("TupleData value length") != std::string::npos);
}

TEST_CASE("inside a stream block the xid comes first") {
  std::string ins = "I\x00\x00\x03\x10\x00\x00\x40\x00N\x00\x01n"s;
  decoder d;
  auto r = d.decode(as_bytes(ins), v4_stream);
  CHECK(as<insert>(r).xid == 784u);
  CHECK(as<insert>(r).relation_oid == 16384);
  CHECK(encode(*r, v4_stream) == ins);
  // The same bytes outside a stream block are read differently: never guessed.
  auto outside = d.decode(as_bytes(ins), v4);
  CHECK_FALSE(outside);
}

TEST_CASE("Truncate, Message, Origin, Type") {
  std::string t = "T\x00\x00\x00\x02\x03\x00\x00\x40\x00\x00\x00\x40\x01"s;
  decoder d;
  auto rt = d.decode(as_bytes(t), v1);
  const auto& tr = as<pgoutput::truncate>(rt);
  CHECK(tr.cascade());
  CHECK(tr.restart_identity());
  REQUIRE(tr.relation_oids.size() == 2);
  CHECK(tr.relation_oids[1] == 16385);
  CHECK(encode(*rt, v1) == t);
  CHECK(d.decode(as_bytes("T\x7f\xff\xff\xff\x00"s), v1).error().code == errc::length_out_of_range);
  CHECK(d.decode(as_bytes("T\x00\x00\x00\x00\x04"s), v1).error().code == errc::invalid_value);

  std::string m = "M\x01\x00\x00\x00\x00\x01\x51\x00\x00" "app\0" "\x00\x00\x00\x05hello"s;
  auto rm = d.decode(as_bytes(m), v1);
  CHECK(as<message>(rm).transactional);
  CHECK(as<message>(rm).prefix == "app");
  CHECK(as_string_view(as<message>(rm).content) == "hello");
  CHECK(encode(*rm, v1) == m);

  std::string o = "O\x00\x00\x00\x00\x00\x00\x00\x10" "node_a\0"s;
  auto ro = d.decode(as_bytes(o), v1);
  CHECK(as<origin>(ro).name == "node_a");
  CHECK(encode(*ro, v1) == o);

  std::string y = "Y\x00\x00\x40\x10public\0mood\0"s;
  auto ry = d.decode(as_bytes(y), v1);
  CHECK(as<pgoutput::type>(ry).name == "mood");
  type_cache types;
  CHECK(types.update(as<pgoutput::type>(ry)).nspname == "public");
  CHECK(types.find(16400)->name == "mood");
}

TEST_CASE("streaming and two-phase messages exist only from their protocol versions") {
  decoder d;
  std::string ss = "S\x00\x00\x03\x10\x01"s;
  CHECK(as<stream_start>(d.decode(as_bytes(ss), v4)).first_segment);
  CHECK(d.decode(as_bytes(ss), v1).error().code == errc::unknown_message);
  CHECK(std::holds_alternative<stream_stop>(*d.decode(as_bytes("E"s), v4)));

  std::string sc = "c\x00\x00\x03\x10\x00\x00\x00\x00\x00\x00\x00\x00\x20\x00\x00\x00\x00\x00\x00\x00\x30"
                   "\x00\x00\x00\x00\x00\x00\x00\x40"s;
  auto rsc = d.decode(as_bytes(sc), v4);
  CHECK(as<stream_commit>(rsc).end_lsn.value == 0x30);
  CHECK(encode(*rsc, v4) == sc);

  std::string sa = "A\x00\x00\x03\x10\x00\x00\x03\x11"s;
  auto rsa = d.decode(as_bytes(sa), v4);
  CHECK(as<stream_abort>(rsa).subxid == 785u);
  CHECK_FALSE(as<stream_abort>(rsa).abort_lsn);
  decode_context parallel{4, false, true};
  std::string sa4 = sa + "\x00\x00\x00\x00\x00\x00\x00\x50\x00\x00\x00\x00\x00\x00\x00\x60"s;
  auto rsa4 = d.decode(as_bytes(sa4), parallel);
  CHECK(as<stream_abort>(rsa4).abort_lsn->value == 0x50);
  CHECK(*as<stream_abort>(rsa4).abort_time == 0x60);
  CHECK(encode(*rsa4, parallel) == sa4);
  CHECK_FALSE(d.decode(as_bytes(sa4), v4));   // without the context the extra bytes are trailing

  std::string bp = "b\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x20\x00\x00\x00\x00\x00\x00\x00\x30"
                   "\x00\x00\x03\x10gid-1\0"s;
  auto rbp = d.decode(as_bytes(bp), v4);
  CHECK(as<begin_prepare>(rbp).gid == "gid-1");
  CHECK(encode(*rbp, v4) == bp);
  CHECK(d.decode(as_bytes(bp), decode_context{2, false, false}).error().code == errc::unknown_message);

  std::string p = "P\x00"s + bp.substr(1);
  auto rp = d.decode(as_bytes(p), v4);
  CHECK(as<prepare>(rp).xid == 784u);
  CHECK(encode(*rp, v4) == p);
  std::string sp = "p\x00"s + bp.substr(1);
  auto rsp = d.decode(as_bytes(sp), v4);
  CHECK(as<stream_prepare>(rsp).gid == "gid-1");
  CHECK(encode(*rsp, v4) == sp);
  std::string k = "K\x00"s + bp.substr(1);
  auto rk = d.decode(as_bytes(k), v4);
  CHECK(as<commit_prepared>(rk).commit_lsn.value == 0x10);
  CHECK(encode(*rk, v4) == k);
  std::string rb = "r\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x20"
                   "\x00\x00\x00\x00\x00\x00\x00\x30\x00\x00\x00\x00\x00\x00\x00\x40\x00\x00\x03\x10g\0"s;
  auto rrb = d.decode(as_bytes(rb), v4);
  CHECK(as<rollback_prepared>(rrb).rollback_time == 0x40);
  CHECK(encode(*rrb, v4) == rb);
}

TEST_CASE("unknown tags and empty input are errors, not guesses") {
  decoder d;
  CHECK(d.decode(as_bytes("Z"s), v4).error().code == errc::unknown_message);
  CHECK(d.decode(as_bytes(""s), v4).error().code == errc::truncated);
}

TEST_CASE("pgoutput messages inside CopyData frames, split at every offset") {
  std::string ins = "I\x00\x00\x40\x00N\x00\x02t\x00\x00\x00\x02" "42" "n"s;
  std::string com = "C\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x20\x00\x00\x00\x00\x00\x00\x00\x30"s;
  std::string stream = build_copy_data(build_xlog_data({lsn{1}, lsn{2}, 3, as_bytes(ins)})) +
                       build_copy_data(build_xlog_data({lsn{4}, lsn{5}, 6, as_bytes(com)}));
  for_every_split(stream, [&](const auto& msgs) {
    REQUIRE(msgs.size() == 2);
    decoder d;
    auto a = parse_copy_payload(as_bytes(msgs[0].second));
    REQUIRE(a);
    auto i = d.decode(a->xlog.data, v1);
    CHECK(as_string_view(as<insert>(i).new_tuple[0].value) == "42");
    auto b = parse_copy_payload(as_bytes(msgs[1].second));
    REQUIRE(b);
    CHECK(as<commit>(d.decode(b->xlog.data, v1)).end_lsn.value == 0x20);
  });
}
