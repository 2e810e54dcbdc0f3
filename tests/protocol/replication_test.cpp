#include "walgate/protocol/replication.hpp"

#include "split_helpers.hpp"

#include <doctest/doctest.h>

using namespace walgate::protocol;
using walgate::test::for_every_split;
using namespace std::string_literals;

TEST_CASE("XLogData 'w' is parsed without copying") {
  std::string payload = "w\x00\x00\x00\x00\x01\x6b\x37\x48\x00\x00\x00\x00\x01\x6b\x38\x00"
                        "\x00\x02\xb1\x0b\x0c\x0d\x0e\x0f"
                        "B\x01\x02"s;
  auto p = parse_copy_payload(as_bytes(payload));
  REQUIRE(p);
  REQUIRE(p->type == copy_payload::kind::xlog_data);
  CHECK(p->xlog.wal_start.to_string() == "0/16B3748");
  CHECK(p->xlog.wal_end.to_string() == "0/16B3800");
  CHECK(p->xlog.server_clock_us == 0x0002b10b0c0d0e0fLL);
  CHECK(as_string_view(p->xlog.data) == "B\x01\x02");
  CHECK(reinterpret_cast<const char*>(p->xlog.data.data()) == payload.data() + 25);
  CHECK(build_xlog_data(p->xlog) == payload);
  // header cut short at every length
  for (std::size_t i = 0; i < 25; ++i) CHECK_FALSE(parse_copy_payload(as_bytes(payload.substr(0, i))));
}

TEST_CASE("keepalive 'k' and its reply flag") {
  std::string k = "k\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x07\x01"s;
  auto p = parse_copy_payload(as_bytes(k));
  REQUIRE(p);
  CHECK(p->type == copy_payload::kind::keepalive);
  CHECK(p->keepalive.wal_end.value == 0x01000000ULL);
  CHECK(p->keepalive.server_clock_us == 7);
  CHECK(p->keepalive.reply_requested);
  CHECK(build_primary_keepalive(p->keepalive) == k);
  CHECK_FALSE(parse_copy_payload(as_bytes(k + "x")));                  // trailing byte
  CHECK_FALSE(parse_copy_payload(as_bytes(k.substr(0, 17))));          // no flag
  std::string bad = k;
  bad.back() = '\x02';
  CHECK(parse_copy_payload(as_bytes(bad)).error().code == errc::invalid_value);
}

TEST_CASE("unknown CopyData kinds are errors") {
  auto r = parse_copy_payload(as_bytes("x123"s));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::unknown_message);
  CHECK_FALSE(parse_copy_payload(as_bytes(""s)));
}

TEST_CASE("standby status update 'r' exact bytes") {
  standby_status_update s;
  s.written = lsn{0x16B3800};
  s.flushed = lsn{0x16B3748};
  s.applied = lsn{0x16B3748};
  s.client_clock_us = 0x0102030405060708LL;
  s.reply_requested = true;
  std::string expect = "r\x00\x00\x00\x00\x01\x6b\x38\x00\x00\x00\x00\x00\x01\x6b\x37\x48"
                       "\x00\x00\x00\x00\x01\x6b\x37\x48\x01\x02\x03\x04\x05\x06\x07\x08\x01"s;
  CHECK(build_standby_status_update(s) == expect);
  CHECK(build_standby_status_message(s) == "d\x00\x00\x00\x26"s + expect);
  auto back = parse_standby_status_update(as_bytes(expect));
  REQUIRE(back);
  CHECK(back->flushed == s.flushed);
  CHECK(back->reply_requested);
}

TEST_CASE("CopyData frames carrying w and k, split at every offset") {
  std::string w = build_xlog_data({lsn{10}, lsn{20}, 30, as_bytes("I-data"s)});
  std::string k = build_primary_keepalive({lsn{40}, 50, false});
  std::string stream = build_copy_data(w) + build_copy_data(k);
  for_every_split(stream, [&](const auto& msgs) {
    REQUIRE(msgs.size() == 2);
    CHECK(msgs[0].first == 'd');
    auto a = parse_copy_payload(as_bytes(msgs[0].second));
    REQUIRE(a);
    CHECK(a->xlog.wal_start.value == 10);
    CHECK(as_string_view(a->xlog.data) == "I-data");
    auto b = parse_copy_payload(as_bytes(msgs[1].second));
    REQUIRE(b);
    CHECK(b->keepalive.wal_end.value == 40);
    CHECK_FALSE(b->keepalive.reply_requested);
  });
}

TEST_CASE("a CopyData of XLogData appended in place: the same bytes as framing a built payload, after what out held") {
  for (std::string_view data : {std::string_view(), std::string_view("x"), std::string_view("{\"change\":[]}")}) {
    xlog_data x{lsn{0x1A2B3C4}, lsn{0x1A2B3F0}, 812345678, as_bytes(data)};
    std::string out = "before";
    append_copy_xlog_data(out, x);
    CHECK(out == "before" + build_copy_data(build_xlog_data(x)));
    CHECK(out.size() == 6 + 1 + 4 + 25 + data.size());
  }
}
