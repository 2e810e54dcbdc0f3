// Multiplexed subscriptions over one WebSocket (GET /v1/mux), end to end on a real PostgreSQL:
// each subscription's events in their envelope, byte for byte the /v1/stream line inside it (also
// through permessage-deflate, where the envelope is spliced around the shared compressed form),
// unsubscribe and resume each on its own, snapshots, large events in fragments, every refusal,
// and shutdown.
#include "walgate/proxy/deflate.hpp"

#include "gateway_harness.hpp"
#include "temp_dir.hpp"
#include "test_cluster.hpp"

#include <doctest/doctest.h>

#include <map>
#include <set>

using namespace walgate;
using namespace walgate::test::harness;

namespace {

struct mux_client : ws_client {
  using ws_client::ws_client;
  void send(const std::string& text) {
    ws.text(true);
    ws.write(asio::buffer(text));
  }
  /// The next message as JSON (null after 10 s without one, or on close).
  json::value next() {
    auto m = messages(1);
    return m.empty() ? json::value() : json::parse(m[0]);
  }
  /// The next raw message text.
  std::string next_text() {
    auto m = messages(1);
    return m.empty() ? std::string() : m[0];
  }
};

std::string envelope(const std::string& sub, const std::string& id, const std::string& data) {
  return "{\"sub\":\"" + sub + "\",\"id\":" + (id.empty() ? std::string("null") : "\"" + id + "\"") + ",\"data\":" + data + "}";
}

std::uint64_t metric(std::uint16_t port, const std::string& name) {
  auto [status, body] = get_path(port, "/metrics");
  auto at = body.find("\n" + name + " ");
  REQUIRE(at != std::string::npos);
  return std::strtoull(body.c_str() + at + name.size() + 2, nullptr, 10);
}

}  // namespace

TEST_CASE("deflate stored blocks around a compressed message: inflate to head + message + tail, every window") {
  std::string event;
  for (int i = 0; i < 30; ++i) event += R"({"id":")" + std::to_string(i) + R"(","op":"insert","row":{"note":"walgate"}})";
  for (int bits = 9; bits <= 15; ++bits) {
    std::string z;
    REQUIRE(deflate_message(event, bits, z));
    for (std::string head : {std::string("{\"sub\":\"a\",\"id\":\"0/16B3748:0\",\"data\":"), std::string(300, 'h'), std::string("x")}) {
      const std::string tail = "}";
      std::string spliced = deflate_stored_head(head) + z + deflate_stored_tail(tail), out;
      REQUIRE(inflate_message(spliced, bits, 1 << 20, out));
      CHECK(out == head + event + tail);
    }
  }
  // The exact bytes: 00, LEN, NLEN, bytes; and LEN, NLEN, bytes, 00 after a sync-flushed message.
  CHECK(deflate_stored_head("ab") == std::string("\x00\x02\x00\xfd\xff" "ab", 7));
  CHECK(deflate_stored_tail("}") == std::string("\x01\x00\xfe\xff}\x00", 6));
  CHECK(deflate_stored_head("") == std::string("\x00\x00\x00\xff\xff", 5));
  // RFC 7692's "Hello" with an envelope around it.
  std::string out;
  REQUIRE(inflate_message(deflate_stored_head("[") + std::string("\xf2\x48\xcd\xc9\xc9\x07\x00", 7) + deflate_stored_tail("]"),
                          15, 100, out));
  CHECK(out == "[Hello]");
}

TEST_CASE("one WebSocket, many subscriptions: envelopes byte-equal to /v1/stream, compressed, unsubscribe and resume each") {
  test::cluster().sql(
      "CREATE TABLE mux_a(id int PRIMARY KEY, note text); CREATE TABLE mux_b(id int PRIMARY KEY, note text); "
      "CREATE PUBLICATION mux_pub FOR TABLE mux_a, mux_b");
  running_gateway g("mux_slot", "mux_pub");
  stream_client nd_a(g.port(), "/v1/stream?format=native&tables=public.mux_a");
  stream_client nd_b(g.port(), "/v1/stream?format=debezium&tables=public.mux_b&ops=insert,delete");
  std::map<bool, std::uint64_t> made;    // compressed forms made in each round
  std::map<bool, std::int64_t> saved;    // bytes the messages hold less the bytes sent
  for (bool deflate : {false, true}) {
    CAPTURE(deflate);
    mux_client m(g.port(), "/v1/mux", deflate);
    m.send(R"({"type":"subscribe","id":"a","tables":"public.mux_a"})");
    m.send(R"({"type":"subscribe","id":"b \"two\"","format":"debezium","tables":["public.mux_b"],"ops":["insert","delete"]})");
    CHECK(m.next_text() == R"({"sub":"a","type":"subscribed"})");
    CHECK(m.next_text() == R"({"sub":"b \"two\"","type":"subscribed"})");
    const auto deflated_before = deflated_total.load();
    const auto bytes_before = metric(g.port(), "walgate_bytes_out_total");
    auto& pg = test::cluster();
    const int base = deflate ? 100 : 0;
    pg.sql("INSERT INTO mux_a SELECT " + std::to_string(base) + " + g, repeat('walgate ', 200) || g FROM generate_series(1, 3) g");
    pg.sql("INSERT INTO mux_b VALUES (" + std::to_string(base + 1) + ", 'b')");
    pg.sql("UPDATE mux_b SET note = 'c' WHERE id = " + std::to_string(base + 1));   // not an op b takes
    pg.sql("DELETE FROM mux_b WHERE id = " + std::to_string(base + 1));
    auto la = nd_a.events(3), lb = nd_b.events(2);
    REQUIRE(la.size() == 3);
    REQUIRE(lb.size() == 2);
    std::vector<std::string> got_a, got_b;
    std::size_t sent = 0;
    while (got_a.size() + got_b.size() < 5) {
      auto t = m.next_text();
      REQUIRE(!t.empty());
      sent += t.size();
      (t.rfind("{\"sub\":\"a\"", 0) == 0 ? got_a : got_b).push_back(t);
    }
    for (std::size_t i = 0; i < 3; ++i) CHECK(got_a[i] == envelope("a", id_of(la[i]), la[i]));
    // Debezium's line has no id: the envelope carries the one to resume from.
    CHECK(got_b[0].rfind(R"({"sub":"b \"two\"","id":")", 0) == 0);
    CHECK(got_b[0].substr(got_b[0].find(",\"data\":") + 8) == lb[0] + "}");
    CHECK(got_b[1].substr(got_b[1].find(",\"data\":") + 8) == lb[1] + "}");
    // Compressing, each of a's events (1.6 KB) is compressed once and sent compressed: over
    // 3,000 bytes fewer go out than the messages hold (checked after both rounds). The NDJSON
    // clients' bytes, framing included, are in the counter too: at most 16 bytes of framing an
    // event.
    std::size_t ndjson = 0;
    for (const auto& l : la) ndjson += l.size() + 16;
    for (const auto& l : lb) ndjson += l.size() + 16;
    made[deflate] = deflated_total.load() - deflated_before;
    saved[deflate] = static_cast<std::int64_t>(sent) -
                     static_cast<std::int64_t>(metric(g.port(), "walgate_bytes_out_total") - bytes_before - ndjson);
    // a ends where it was; b goes on alone.
    m.send(R"({"type":"unsubscribe","id":"a"})");
    CHECK(m.next_text() == R"({"sub":"a","type":"end","reason":"unsubscribed","resume_from":")" + id_of(la[2]) + "\"}");
    pg.sql("INSERT INTO mux_a VALUES (" + std::to_string(base + 4) + ", 'after a left')");
    pg.sql("INSERT INTO mux_b VALUES (" + std::to_string(base + 2) + ", 'b2')");
    auto la4 = nd_a.events(1);
    REQUIRE(la4.size() == 1);
    REQUIRE(nd_b.events(1).size() == 1);
    auto t = m.next_text();
    CHECK(t.rfind(R"({"sub":"b \"two\"","id":")", 0) == 0);   // (nothing of a's came before it)
    // a again, from an id it was given: exactly what follows it.
    m.send(R"({"type":"subscribe","id":"a","tables":"public.mux_a","from":")" + id_of(la[1]) + "\"}");
    CHECK(m.next_text() == R"({"sub":"a","type":"subscribed"})");
    CHECK(m.next_text() == envelope("a", id_of(la[2]), la[2]));
    CHECK(m.next_text() == envelope("a", id_of(la4[0]), la4[0]));
    // Two subscriptions of the same table in different formats on one connection.
    m.send(R"({"type":"subscribe","id":"w","format":"wal2json","transactions":false,"tables":"public.mux_a"})");
    CHECK(m.next_text() == R"({"sub":"w","type":"subscribed"})");
    pg.sql("INSERT INTO mux_a VALUES (" + std::to_string(base + 5) + ", 'both')");
    std::map<std::string, std::string> by_sub;
    for (int i = 0; i < 2; ++i) {
      auto v = m.next();
      REQUIRE(v.is_object());
      by_sub[std::string(v.at("sub").as_string())] = json::serialize(v.at("data"));
    }
    CHECK(json::parse(by_sub.at("a")).at("after").at("note") == "both");
    CHECK(json::parse(by_sub.at("w")).at("action") == "I");
    CHECK(nd_a.events(1).size() == 1);
    // A compressed form over 1 KiB (sent from the shared copy, not copied) and an event of
    // 100 KB (64 KiB and more: uncompressed, sent from the shared encoding), in their envelopes.
    pg.sql("INSERT INTO mux_a VALUES (" + std::to_string(base + 6) +
           ", (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 100) i)), (" + std::to_string(base + 7) +
           ", repeat('y', 100000))");
    auto big = nd_a.events(2);
    REQUIRE(big.size() == 2);
    std::vector<std::string> big_a;
    for (int i = 0; i < 4; ++i) {
      auto text = m.next_text();
      REQUIRE(!text.empty());
      if (text.rfind("{\"sub\":\"a\"", 0) == 0) big_a.push_back(text);
    }
    REQUIRE(big_a.size() == 2);
    CHECK(big_a[0] == envelope("a", id_of(big[0]), big[0]));
    CHECK(big_a[1] == envelope("a", id_of(big[1]), big[1]));
    std::string z;
    REQUIRE(deflate_message(big[0], 15, z));
    CHECK(z.size() >= 1024);   // (so the compressing round sent it from the shared copy)
  }
  CHECK(made[false] == 0);    // nothing compressed for a client that did not negotiate it
  CHECK(made[true] >= 3);
  CHECK(saved[false] >= 0);   // (as sent: the NDJSON bound is generous)
  CHECK(saved[true] > 3000);
}

TEST_CASE("multiplexed subscriptions: every refusal is a message naming the subscription; the connection goes on") {
  test::cluster().sql("CREATE TABLE muxe_a(id int PRIMARY KEY); CREATE PUBLICATION muxe_pub FOR TABLE muxe_a");
  server_options so;
  so.ws_max_subscriptions = 2;
  so.max_clients = 5;   // the two connections and three subscriptions
  running_gateway g("muxe_slot", "muxe_pub", so);
  // The endpoint itself.
  CHECK(get_path(g.port(), "/v1/mux").first == 426);
  auto [st, body] = get_path(g.port(), "/v1/mux?format=native");
  CHECK(st == 400);
  CHECK(body.find("subscribe messages") != std::string::npos);
  mux_client m(g.port(), "/v1/mux");
  auto error_of = [&](const std::string& msg) {
    m.send(msg);
    auto v = m.next();
    REQUIRE(v.is_object());
    CHECK(v.at("type") == "error");
    return v.as_object();
  };
  auto e = error_of("not json");
  CHECK(e.at("sub").is_null());
  CHECK(e.at("status") == 400);
  e = error_of(R"({"type":"watch","id":"x"})");
  CHECK(e.at("parameter") == "type");
  e = error_of(R"({"type":"subscribe"})");
  CHECK(e.at("parameter") == "id");
  e = error_of(R"({"type":"subscribe","id":")" + std::string(129, 'x') + "\"}");
  CHECK(e.at("parameter") == "id");
  e = error_of(R"({"type":"subscribe","id":"t","tables":"public"})");
  CHECK(e.at("sub") == "t");
  CHECK(e.at("status") == 400);
  CHECK(e.at("parameter") == "tables");
  e = error_of(R"({"type":"subscribe","id":"t","format":"avro"})");
  CHECK(e.at("parameter") == "format");
  e = error_of(R"({"type":"subscribe","id":"t","snapshot":1})");
  CHECK(e.at("parameter") == "snapshot");
  e = error_of(R"({"type":"subscribe","id":"t","tables":[1]})");
  CHECK(e.at("parameter") == "tables");
  e = error_of(R"({"type":"subscribe","id":"t","colour":"red"})");
  CHECK(e.at("parameter") == "colour");
  e = error_of(R"({"type":"subscribe","id":"t","from":"0/1:0"})");   // before the log began
  CHECK(e.at("status") == 410);
  CHECK(e.at("parameter") == "from");
  e = error_of(R"({"type":"unsubscribe","id":"nobody"})");
  CHECK(e.at("status") == 404);
  m.send(R"({"type":"subscribe","id":"one"})");
  CHECK(m.next_text() == R"({"sub":"one","type":"subscribed"})");
  e = error_of(R"({"type":"subscribe","id":"one"})");
  CHECK(e.at("status") == 409);
  m.send(R"({"type":"subscribe","id":"two"})");
  CHECK(m.next_text() == R"({"sub":"two","type":"subscribed"})");
  e = error_of(R"({"type":"subscribe","id":"three"})");
  CHECK(e.at("status") == 429);   // --ws-max-subscriptions 2
  // The connection and each subscription count against --max-clients (5): a second connection
  // gets one subscription, then 503; a third connection gets 503 for its upgrade.
  mux_client other(g.port(), "/v1/mux");
  other.send(R"({"type":"subscribe","id":"x"})");
  CHECK(other.next_text() == R"({"sub":"x","type":"subscribed"})");
  // In /metrics each subscription is a WebSocket client (the connections themselves are not).
  CHECK(get_path(g.port(), "/metrics").second.find("walgate_clients{transport=\"websocket\"} 3\n") != std::string::npos);
  other.send(R"({"type":"subscribe","id":"y"})");
  auto full = other.next();
  REQUIRE(full.is_object());
  CHECK(full.at("status") == 503);
  CHECK(metric(g.port(), "walgate_clients_rejected_total") == 1);
  auto [third, third_body] = get(g.port(), "GET /v1/mux HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
  CHECK(third == 503);
  CHECK(metric(g.port(), "walgate_clients_rejected_total") == 2);
  // A binary message is refused the same way.
  other.ws.binary(true);
  other.ws.write(asio::buffer(std::string("{}")));
  auto bin = other.next();
  REQUIRE(bin.is_object());
  CHECK(bin.at("error") == "messages are JSON text");
  // Still served: the subscriptions that were accepted get their events.
  test::cluster().sql("INSERT INTO muxe_a VALUES (1)");
  std::set<std::string> subs;
  for (int i = 0; i < 2; ++i) {
    auto v = m.next();
    REQUIRE(v.is_object());
    subs.insert(std::string(v.at("sub").as_string()));
  }
  CHECK(subs == std::set<std::string>{"one", "two"});
  auto x = other.next();
  REQUIRE(x.is_object());
  CHECK(x.at("sub") == "x");
}

TEST_CASE("multiplexed subscriptions: a snapshot beside a live one, a large event in fragments, shutdown with resume ids") {
  test::cluster().sql(
      "CREATE TABLE muxs_a(id int PRIMARY KEY, v text); CREATE TABLE muxs_b(id int PRIMARY KEY, v text); "
      "INSERT INTO muxs_a SELECT g, 'row ' || g FROM generate_series(1, 50) g; "
      "CREATE PUBLICATION muxs_pub FOR TABLE muxs_a, muxs_b");
  test::temp_dir spill;
  server_options so;
  so.spill_dir = spill.path;
  so.spill_bytes = 1u << 20;
  running_gateway g("muxs_slot", "muxs_pub", so);
  mux_client m(g.port(), "/v1/mux", true);
  m.ws.read_message_max(0);
  m.send(R"({"type":"subscribe","id":"live","tables":"public.muxs_b"})");
  CHECK(m.next_text() == R"({"sub":"live","type":"subscribed"})");
  m.send(R"({"type":"subscribe","id":"snap","tables":"public.muxs_a","snapshot":true})");
  CHECK(m.next_text() == R"({"sub":"snap","type":"subscribed"})");
  std::set<std::int64_t> rows;
  json::value marker;
  while (true) {
    auto v = m.next();
    REQUIRE(v.is_object());
    REQUIRE(v.at("sub") == "snap");
    const auto& data = v.at("data");
    if (data.as_object().contains("snapshot")) {
      marker = v;
      break;
    }
    CHECK(v.at("id").is_null());   // a row: nowhere to resume from
    CHECK(data.at("op") == "read");
    rows.insert(data.at("after").at("id").as_int64());
  }
  CHECK(rows.size() == 50);
  CHECK(marker.at("data").at("rows") == 50);
  CHECK(marker.at("id") == marker.at("data").at("resume_from"));
  // A change to each, and a large one (3 MiB: from its spill file, in fragments) on the live one.
  stream_client nd(g.port(), "/v1/stream?tables=public.muxs_b");
  test::cluster().sql("UPDATE muxs_a SET v = 'changed' WHERE id = 7");
  test::cluster().sql("INSERT INTO muxs_b VALUES (1, repeat('z', 3000000))");
  auto big = nd.events(1);
  REQUIRE(big.size() == 1);
  std::map<std::string, std::string> got;
  for (int i = 0; i < 2; ++i) {
    auto t = m.next_text();
    REQUIRE(!t.empty());
    got[t.substr(8, 4)] = t;
  }
  CHECK(json::parse(got.at("snap")).at("data").at("after").at("v") == "changed");
  CHECK(got.at("live") == envelope("live", id_of(big[0]), big[0]));
  CHECK(metric(g.port(), "walgate_payloads_spilled_total") >= 1);
  // Shutdown: each subscription told where to resume, then 1001.
  g.stop_server();
  std::map<std::string, std::string> ends;
  for (int i = 0; i < 2; ++i) {
    auto v = m.next();
    REQUIRE(v.is_object());
    CHECK(v.at("type") == "end");
    CHECK(v.at("reason") == "server shutting down");
    ends[std::string(v.at("sub").as_string())] = std::string(v.at("resume_from").as_string());
  }
  CHECK(ends.at("live") == id_of(big[0]));
  CHECK(ends.at("snap") == std::string(json::parse(got.at("snap")).at("id").as_string()));
  CHECK(m.wait_close().code == websocket::close_code::going_away);
}

TEST_CASE("multiplexed subscriptions: idle past the keep-alive, pinged and answered; resume_from is the from it started after") {
  test::cluster().sql("CREATE TABLE muxi_a(id int PRIMARY KEY); CREATE PUBLICATION muxi_pub FOR TABLE muxi_a");
  server_options so;
  so.keepalive = std::chrono::milliseconds(300);   // a ping at 300 ms; closed after 600 without a pong
  running_gateway g("muxi_slot", "muxi_pub", so);
  mux_client m(g.port(), "/v1/mux", true);
  std::size_t pings = 0;
  m.ws.control_callback([&](websocket::frame_type kind, beast::string_view) { pings += kind == websocket::frame_type::ping; });
  m.send(R"({"type":"subscribe","id":"a","tables":"public.muxi_a"})");
  CHECK(m.next_text() == R"({"sub":"a","type":"subscribed"})");
  // Idle for 2 s, reading (so that pings are answered): still open.
  std::thread later([] {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    test::cluster().sql("INSERT INTO muxi_a VALUES (1)");
  });
  auto first = m.next();
  later.join();
  REQUIRE(first.is_object());
  CHECK(first.at("data").at("after").at("id") == 1);
  CHECK(pings >= 2);
  const std::string id1(first.at("id").as_string());
  // A subscription that resumes and ends before any event: resume_from is where it started.
  m.send(R"({"type":"subscribe","id":"b","tables":"public.muxi_a","from":")" + id1 + "\"}");
  m.send(R"({"type":"unsubscribe","id":"b"})");
  CHECK(m.next_text() == R"({"sub":"b","type":"subscribed"})");
  CHECK(m.next_text() == R"({"sub":"b","type":"end","reason":"unsubscribed","resume_from":")" + id1 + "\"}");
  // A client ping is answered while the connection waits for events.
  m.ws.ping({});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  test::cluster().sql("INSERT INTO muxi_a VALUES (2)");
  auto second = m.next();
  REQUIRE(second.is_object());
  CHECK(second.at("data").at("after").at("id") == 2);
  // The client closes: answered with a close frame (a clean close), and the subscription leaves.
  boost::system::error_code ec;
  m.ws.close(websocket::close_code::normal, ec);
  CHECK_FALSE(ec);
  CHECK(test::wait_until([&] { return g.srv->clients() == 0; }));
}

TEST_CASE("multiplexed subscriptions: one catching up from far behind does not hold back another; a client that stops "
          "reading is closed after the write timeout") {
  test::cluster().sql(
      "CREATE TABLE muxf_a(id int PRIMARY KEY, pad text); CREATE TABLE muxf_b(id int PRIMARY KEY); "
      "CREATE TABLE muxf_c(id int PRIMARY KEY); CREATE PUBLICATION muxf_pub FOR TABLE muxf_a, muxf_b, muxf_c");
  server_options so;
  so.write_timeout = std::chrono::milliseconds(3000);
  running_gateway g("muxf_slot", "muxf_pub", so);
  // 40,000 events of muxf_a, then 3 of muxf_b: at the end of the log.
  test::cluster().sql("INSERT INTO muxf_a SELECT g, repeat('x', 100) FROM generate_series(1, 40000) g");
  test::cluster().sql("INSERT INTO muxf_b VALUES (1), (2), (3)");
  REQUIRE(test::wait_until([&] { return metric(g.port(), "walgate_log_next_seq") >= 40003; }));
  {
    mux_client m(g.port(), "/v1/mux");
    // Both from the start: a's batches end at 512 events or 256 KiB; b's filter passes over a's
    // events a bounded amount per round. Were a served until it caught up, b's events would
    // come after all of a's. Commits go on meanwhile (so the connection, catching up, also
    // lets the clients they wake go first).
    m.send(R"({"type":"subscribe","id":"a","tables":"public.muxf_a","from":"0/0:0"})");
    m.send(R"({"type":"subscribe","id":"b","tables":"public.muxf_b","from":"0/0:0"})");
    CHECK(m.next_text() == R"({"sub":"a","type":"subscribed"})");
    std::atomic<bool> done{false};
    std::thread commits([&] {
      for (int i = 1; i <= 200 && !done; ++i) {
        test::cluster().sql("INSERT INTO muxf_c VALUES (" + std::to_string(i) + ")");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
    std::size_t a = 0, a_before_b = 0, b = 0;
    std::int64_t last_a = 0;
    bool in_order = true, subscribed_b = false;
    while (a < 40000 || b < 3) {
      auto v = m.next();
      REQUIRE(v.is_object());
      if (v.as_object().contains("type")) {
        subscribed_b = subscribed_b || (v.at("sub") == "b" && v.at("type") == "subscribed");
        continue;
      }
      if (v.at("sub") == "a") {
        const auto id = v.at("data").at("after").at("id").as_int64();
        in_order = in_order && id == last_a + 1;
        last_a = id;
        ++a;
      } else {
        if (b == 0) a_before_b = a;
        ++b;
      }
    }
    done = true;
    commits.join();
    CHECK(subscribed_b);
    CHECK(in_order);
    CHECK(a == 40000);
    CHECK(b == 3);
    CHECK(a_before_b < 30000);
    MESSAGE("events of the subscription catching up before the other's first: " << a_before_b);
    boost::system::error_code ec;
    m.ws.close(websocket::close_code::normal, ec);
  }
  REQUIRE(test::wait_until([&] { return g.srv->clients() == 0; }));
  // A client that subscribes (live: all four taken before anything fills its socket) to more
  // than the sockets' buffers hold and stops reading: the write that cannot finish within the
  // write timeout closes the connection, and its subscriptions go.
  mux_client stuck(g.port(), "/v1/mux");
  for (const char* f : {"native", "debezium", "wal2json", "waltail"})
    stuck.send(std::string(R"({"type":"subscribe","id":")") + f + R"(","format":")" + f +
               R"(","tables":"public.muxf_a"})");
  CHECK(test::wait_until([&] { return g.srv->clients() == 4; }, std::chrono::seconds(5)));
  test::cluster().sql("INSERT INTO muxf_a SELECT g, repeat('x', 100) FROM generate_series(40001, 80000) g");
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(test::wait_until([&] { return g.srv->clients() == 0; }, std::chrono::seconds(20)));
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(1000));   // (after a write waited 3 s)
  // What the sockets held arrives, then the connection ends.
  set_timeout(stuck.ws.next_layer(), 30000);
  stuck.wait_close();
  CHECK(g.srv->clients() == 0);
  // The same for a client catching up (one subscription from the start of the log, 80,000
  // events): closed after a write waited for the write timeout.
  mux_client behind(g.port(), "/v1/mux");
  behind.send(R"({"type":"subscribe","id":"all","tables":"public.muxf_a","from":"0/0:0"})");
  CHECK(test::wait_until([&] { return g.srv->clients() == 1; }, std::chrono::seconds(5)));
  const auto t1 = std::chrono::steady_clock::now();
  CHECK(test::wait_until([&] { return g.srv->clients() == 0; }, std::chrono::seconds(20)));
  CHECK(std::chrono::steady_clock::now() - t1 >= std::chrono::milliseconds(1000));
  set_timeout(behind.ws.next_layer(), 30000);
  behind.wait_close();
}
