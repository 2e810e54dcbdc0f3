// WebSocket permessage-deflate as walgate sends it (RFC 7692): what it answers to an offer, each
// event compressed once and the same compressed frame to every client of that window, small and
// large messages uncompressed (RSV1 clear), and a thousand compressing clients through a burst.
// Read with a raw socket, frame by frame, so the bits on the wire are what is checked.
#include "walgate/proxy/deflate.hpp"
#include "walgate/proxy/payload.hpp"

#include "client_deflater.hpp"
#include "gateway_harness.hpp"
#include "test_cluster.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <zlib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <future>
#include <map>
#include <random>

using namespace walgate;
using namespace walgate::test::harness;

namespace {

struct ws_frame {
  bool fin = false, rsv1 = false;
  int opcode = 0;
  std::string payload;
};

/// Takes the complete server frames (unmasked) off the front of buf, while on_frame says to go on.
template <class F>
void take_frames(std::string& buf, F&& on_frame) {
  std::size_t at = 0;
  bool more = true;
  while (more && buf.size() - at >= 2) {
    const auto b0 = static_cast<unsigned char>(buf[at]), b1 = static_cast<unsigned char>(buf[at + 1]);
    std::uint64_t len = b1 & 0x7f;
    std::size_t head = 2;
    if (len == 126) {
      if (buf.size() - at < 4) break;
      len = (static_cast<unsigned char>(buf[at + 2]) << 8) | static_cast<unsigned char>(buf[at + 3]);
      head = 4;
    } else if (len == 127) {
      if (buf.size() - at < 10) break;
      len = 0;
      for (int i = 0; i < 8; ++i) len = (len << 8) | static_cast<unsigned char>(buf[at + 2 + i]);
      head = 10;
    }
    REQUIRE((b1 & 0x80) == 0);   // a server never masks
    if (buf.size() - at - head < len) break;
    ws_frame f;
    f.fin = b0 & 0x80;
    f.rsv1 = b0 & 0x40;
    CHECK((b0 & 0x30) == 0);   // RSV2, RSV3 never
    f.opcode = b0 & 0x0f;
    f.payload = buf.substr(at + head, len);
    at += head + len;
    more = on_frame(std::move(f));
  }
  buf.erase(0, at);
}

/// A WebSocket client on a raw socket: the handshake with an extension offer, then frames.
struct raw_ws {
  int fd = -1;
  std::string buf, answer;   // answer: the Sec-WebSocket-Extensions of the 101
  unsigned status = 0;
  raw_ws(std::uint16_t port, const std::string& target, const std::string& offer, bool blocking = true) {
    fd = loopback_socket(port);
    std::string req = "GET " + target + " HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
    if (!offer.empty()) req += "Sec-WebSocket-Extensions: " + offer + "\r\n";
    req += "\r\n";
    REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (buf.find("\r\n\r\n") == std::string::npos) {
      char chunk[4096];
      ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      REQUIRE(n > 0);
      buf.append(chunk, static_cast<std::size_t>(n));
    }
    const auto end = buf.find("\r\n\r\n");
    const std::string head = buf.substr(0, end);
    buf.erase(0, end + 4);
    status = static_cast<unsigned>(std::atoi(head.c_str() + 9));
    std::string lower = head;
    for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (auto at = lower.find("\r\nsec-websocket-extensions:"); at != std::string::npos) {
      auto from = at + 27, to = head.find("\r\n", from);
      answer = head.substr(from, to - from);
      while (!answer.empty() && answer.front() == ' ') answer.erase(0, 1);
    }
    if (!blocking) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  ~raw_ws() {
    if (fd >= 0) ::close(fd);
  }
  /// The next data message: whether it came compressed, and its payload as sent (its
  /// fragments joined); nullopt after 10 s without one.
  std::optional<std::pair<bool, std::string>> message() {
    std::optional<std::pair<bool, std::string>> out, partial;
    while (!out) {
      take_frames(buf, [&](ws_frame f) {
        if (f.opcode >= 8) return true;   // (a ping: Beast's keep-alive)
        if (f.opcode == 1) partial = std::make_pair(f.rsv1, std::string());
        REQUIRE(partial);
        if (f.opcode == 0) CHECK_FALSE(f.rsv1);   // RSV1 only on a message's first frame
        partial->second += f.payload;
        if (f.fin) out = std::move(partial);
        return !out;
      });
      if (out) break;
      char chunk[65536];
      ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) return std::nullopt;
      buf.append(chunk, static_cast<std::size_t>(n));
    }
    return out;
  }
};

std::string inflated(const std::string& z, int bits = 15) {
  std::string out;
  REQUIRE(inflate_message(z, bits, 64u << 20, out));
  return out;
}

}  // namespace

TEST_CASE("permessage-deflate offers: walgate's answer, the first acceptable offer, declined ones") {
  auto a = negotiate_pmd("permessage-deflate; client_max_window_bits");   // Chromium's and Firefox's
  REQUIRE(a);
  CHECK(a->answer == "permessage-deflate; server_no_context_takeover");
  CHECK(a->server_bits == 15);
  CHECK_FALSE(a->client_no_context_takeover);
  a = negotiate_pmd("x-webkit-deflate-frame, PerMessage-Deflate ; server_max_window_bits=\"10\"; client_no_context_takeover");
  REQUIRE(a);
  CHECK(a->answer == "permessage-deflate; server_no_context_takeover; server_max_window_bits=10; client_no_context_takeover");
  CHECK(a->server_bits == 10);
  CHECK(a->client_no_context_takeover);
  a = negotiate_pmd("permessage-deflate; server_no_context_takeover; client_max_window_bits=9; server_max_window_bits=15");
  REQUIRE(a);
  CHECK(a->answer == "permessage-deflate; server_no_context_takeover; server_max_window_bits=15");
  // Declined offers (the next one is looked at): an 8-bit server window, unknown or repeated
  // parameters, values out of range or where none belongs.
  a = negotiate_pmd("permessage-deflate; server_max_window_bits=8, permessage-deflate; server_max_window_bits=9");
  REQUIRE(a);
  CHECK(a->server_bits == 9);
  for (const char* declined : {"", "x-webkit-deflate-frame", "permessage-deflate; server_max_window_bits=8",
                               "permessage-deflate; server_max_window_bits=16", "permessage-deflate; server_max_window_bits=",
                               "permessage-deflate; server_max_window_bits", "permessage-deflate; server_max_window_bits=1x",
                               "permessage-deflate; client_max_window_bits=7", "permessage-deflate; mystery",
                               "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
                               "permessage-deflate; server_no_context_takeover=1"}) {
    INFO(declined);
    CHECK_FALSE(negotiate_pmd(declined));
  }
}

TEST_CASE("inflater: a message in pieces split anywhere, the context kept or reset, output in pieces, bad data refused") {
  std::string first(3000, 'a'), second = first + "b";
  for (int i = 0; i < 3000; ++i) first[static_cast<std::size_t>(i)] = static_cast<char>('a' + i * 7 % 26);
  std::string z;
  REQUIRE(deflate_message(first, 15, z));
  for (std::size_t cut = 0; cut <= z.size(); cut += 7) {
    inflater f;
    std::string out;
    std::size_t pieces = 0;
    auto take = [&](std::string_view b) {
      CHECK(b.size() <= 4096);
      ++pieces;
      out.append(b);
      return true;
    };
    REQUIRE(f.feed(z.substr(0, cut), false, take));
    REQUIRE(f.feed(z.substr(cut), true, take));
    CHECK(out == first);
    // After a reset (client_no_context_takeover), a message on its own again.
    f.reset();
    out.clear();
    REQUIRE(f.feed(z, true, take));
    CHECK(out == first);
  }
  // A stream that keeps its context: the second message refers back to the first.
  {
    test::client_deflater d;
    const std::string z1 = d.compress(first), z2 = d.compress(second);
    CHECK(z2.size() < 40);   // (a back-reference into the first message)
    inflater f;
    std::string out;
    auto take = [&](std::string_view b) {
      out.append(b);
      return true;
    };
    REQUIRE(f.feed(z1, true, take));
    out.clear();
    REQUIRE(f.feed(z2, true, take));
    CHECK(out == second);
  }
  inflater f;
  auto none = [](std::string_view) { return true; };
  CHECK_FALSE(f.feed("\xff\xff\xff\xff", true, none));
  inflater g;
  CHECK_FALSE(g.feed(z, true, [](std::string_view) { return false; }));   // stopped by its taker
}

TEST_CASE("deflate_message: RFC 7692's bytes, every window, a fresh context each time, only when smaller") {
  // RFC 7692 7.2.3.1: "Hello" compressed, without its 00 00 ff ff.
  CHECK(inflated(std::string("\xf2\x48\xcd\xc9\xc9\x07\x00", 7)) == "Hello");
  std::string z;
  CHECK_FALSE(deflate_message("Hello", 15, z));   // 7 bytes for 5: sent as it is
  CHECK(z.empty());
  std::mt19937 rng(7);
  std::string noise(4000, '\0');
  for (auto& ch : noise) ch = static_cast<char>(rng());
  CHECK_FALSE(deflate_message(noise, 15, z));   // incompressible
  std::string event;
  for (int i = 0; i < 40; ++i) event += R"({"id":")" + std::to_string(i) + R"(","op":"insert","table":"orders","row":{"status":"paid"}})";
  for (int bits = 9; bits <= 15; ++bits) {
    std::string a, b;
    REQUIRE(deflate_message(event, bits, a));
    REQUIRE(deflate_message(event, bits, b));
    CHECK(a == b);   // no context carried from one message to the next
    CHECK(a.size() < event.size() / 4);
    CHECK(inflated(a, bits) == event);
    CHECK((a.size() < 4 || a.compare(a.size() - 4, 4, std::string("\x00\x00\xff\xff", 4)) != 0));
  }
  CHECK_FALSE(deflate_message(event, 8, z));
  CHECK_FALSE(deflate_message(event, 16, z));
  std::string out;
  CHECK_FALSE(inflate_message("\xff\xff\xff", 15, 1 << 20, out));   // not DEFLATE
  std::string big;
  REQUIRE(deflate_message(std::string(60000, 'a'), 15, big));
  CHECK_FALSE(inflate_message(big, 15, 1000, out));   // over the bound: refused, not grown
}

TEST_CASE("a payload's compressed form: made once, only between the size bounds and when smaller") {
  std::string event;
  while (event.size() < 2000) event += R"({"op":"insert","table":"orders","status":"paid"})";
  auto p = payload::in_memory(event);
  const auto before = p->memory();
  std::size_t made = 0;
  const std::string* z = p->deflated(15, &made);
  REQUIRE(z);
  CHECK(made > z->size());
  CHECK(p->memory() == before + made);
  CHECK(inflated(*z) == event);
  std::size_t again = 1;
  const auto count = deflated_total.load();
  CHECK(p->deflated(15, &again) == z);   // the same bytes for every client of that window
  CHECK(again == 0);
  CHECK(deflated_total.load() == count);   // not compressed again
  const std::string* z10 = p->deflated(10, &made);
  REQUIRE(z10);
  CHECK(made > 0);
  CHECK(p->deflated(15) == z);   // (a second window does not move the first)
  CHECK(inflated(*z10, 10) == event);
  CHECK_FALSE(payload::in_memory(std::string(deflate_min_bytes - 1, 'a'))->deflated(15));
  CHECK(payload::in_memory(std::string(deflate_min_bytes, 'a'))->deflated(15));
  CHECK_FALSE(payload::in_memory(std::string(deflate_max_bytes, 'a'))->deflated(15));
  CHECK(payload::in_memory(std::string(deflate_max_bytes - 1, 'a'))->deflated(15));
}

TEST_CASE("WebSocket with permessage-deflate: one compressed frame per event for every client, small and large ones plain") {
  test::cluster().sql("CREATE TABLE wsz_items(id int PRIMARY KEY, note text); CREATE PUBLICATION wsz_pub FOR TABLE wsz_items");
  running_gateway g("wsz_slot", "wsz_pub");
  stream_client ndjson(g.port(), "/v1/stream");
  raw_ws plain(g.port(), "/v1/ws", "");
  raw_ws a(g.port(), "/v1/ws", "permessage-deflate; client_max_window_bits");
  raw_ws b(g.port(), "/v1/ws", "permessage-deflate");
  raw_ws narrow(g.port(), "/v1/ws", "permessage-deflate; server_max_window_bits=10; client_max_window_bits");
  CHECK(plain.status == 101);
  CHECK(plain.answer.empty());
  REQUIRE(a.status == 101);
  CHECK(a.answer.find("permessage-deflate") == 0);
  CHECK(a.answer.find("server_no_context_takeover") != std::string::npos);
  CHECK(a.answer.find("server_max_window_bits") == std::string::npos);   // 15
  CHECK(b.answer.find("server_no_context_takeover") != std::string::npos);
  CHECK(narrow.answer.find("server_max_window_bits=10") != std::string::npos);
  raw_ws eight(g.port(), "/v1/ws", "permessage-deflate; server_max_window_bits=8");
  CHECK(eight.status == 101);
  CHECK(eight.answer.empty());   // declined: no answer may exceed 8, and zlib has no 8-bit window
  // A client's own message compressed (and masked, as clients must): inflated, read, ignored.
  {
    std::string z, msg(1000, 'q'), frame;
    REQUIRE(deflate_message(msg, 15, z));
    frame.push_back(static_cast<char>(0xC1));   // FIN | RSV1 | text
    REQUIRE(z.size() < 126);
    frame.push_back(static_cast<char>(0x80 | z.size()));   // masked, 7-bit length
    const char key[4] = {0x11, 0x22, 0x33, 0x44};
    frame.append(key, 4);
    for (std::size_t i = 0; i < z.size(); ++i) frame.push_back(static_cast<char>(z[i] ^ key[i % 4]));
    REQUIRE(::send(b.fd, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size()));
  }
  const auto deflated_before = deflated_total.load();
  // A small event, a compressible one of some kilobytes, one of 100 KB, and a compressible one
  // of exactly enough for the threshold.
  auto& pg = test::cluster();
  pg.sql("INSERT INTO wsz_items VALUES (1, 'x')");
  pg.sql("INSERT INTO wsz_items VALUES (2, repeat('walgate ', 500))");
  pg.sql("INSERT INTO wsz_items VALUES (3, repeat('0123456789', 10000))");
  pg.sql("INSERT INTO wsz_items VALUES (4, repeat('ab', 200))");
  auto lines = ndjson.events(4);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0].size() < deflate_min_bytes);
  CHECK(lines[1].size() > 4000);
  CHECK(lines[2].size() > deflate_max_bytes);
  CHECK(lines[3].size() >= deflate_min_bytes);
  std::vector<std::string> a_compressed;
  for (std::size_t i = 0; i < 4; ++i) {
    INFO("event " << i);
    auto p = plain.message();
    auto ma = a.message(), mb = b.message(), mn = narrow.message();
    REQUIRE(p);
    REQUIRE(ma);
    REQUIRE(mb);
    REQUIRE(mn);
    CHECK_FALSE(p->first);
    CHECK((p->second == lines[i]));
    const bool compressed = i == 1 || i == 3;
    CHECK(ma->first == compressed);
    CHECK(mb->first == compressed);
    CHECK(mn->first == compressed);
    CHECK(((compressed ? inflated(ma->second) : ma->second) == lines[i]));
    CHECK(((compressed ? inflated(mn->second, 10) : mn->second) == lines[i]));
    CHECK((ma->second == mb->second));   // the same bytes: compressed once
    CHECK((!compressed || ma->second.size() < lines[i].size() / 2));
    auto me = eight.message();
    REQUIRE(me);
    CHECK_FALSE(me->first);
    CHECK((me->second == lines[i]));
  }
  // Compressed once per event and window: events 2 and 4, for 15 bits (a and b) and 10 (narrow).
  CHECK(deflated_total.load() - deflated_before == 4);
  // And counted in the memory tail: each event's count is what it holds, compressed forms too.
  std::promise<std::pair<std::size_t, std::size_t>> tail;
  asio::post(g.io, [&] {
    std::size_t events = 0, counted_right = 0;
    for (const auto& e : g.log->tail()) {
      ++events;
      counted_right += e->accounted == e->memory();
    }
    tail.set_value({events, counted_right});
  });
  auto [in_tail, counted_right] = tail.get_future().get();
  CHECK(in_tail == 4);
  CHECK(counted_right == in_tail);
  // The rows of a snapshot by the same rule, then its end marker (small: plain).
  raw_ws snap(g.port(), "/v1/ws?snapshot=true&tables=public.wsz_items", "permessage-deflate");
  std::map<std::string, bool> rows;   // id -> compressed
  for (int i = 0; i < 4; ++i) {
    auto m = snap.message();
    REQUIRE(m);
    const std::string text = m->first ? inflated(m->second) : m->second;
    auto v = json::parse(text).as_object();
    CHECK(v.at("op") == "read");
    rows[json::serialize(v.at("after").as_object().at("id"))] = m->first;
  }
  CHECK(rows == std::map<std::string, bool>{{"1", false}, {"2", true}, {"3", false}, {"4", true}});
  auto marker = snap.message();
  REQUIRE(marker);
  CHECK_FALSE(marker->first);
  CHECK(marker->second.find("\"snapshot\":\"end\"") != std::string::npos);
}

TEST_CASE("a thousand compressing WebSocket clients through a burst of 2,000 events: every one gets every event") {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  REQUIRE_MESSAGE(rl.rlim_cur >= 2200, "the test needs 2,200 file descriptors (client and server ends), has " << rl.rlim_cur);
  test::cluster().sql("CREATE TABLE wsk_items(id int PRIMARY KEY, note text); CREATE PUBLICATION wsk_pub FOR TABLE wsk_items");
  running_gateway g("wsk_slot", "wsk_pub");
  constexpr std::size_t clients = 1000, events = 2000;
  std::vector<std::unique_ptr<raw_ws>> ws;
  for (std::size_t i = 0; i < clients; ++i) {
    ws.push_back(std::make_unique<raw_ws>(g.port(), "/v1/ws", "permessage-deflate; client_max_window_bits", false));
    REQUIRE(ws.back()->status == 101);
  }
  auto bytes_out = [&] {
    auto [status, body] = get_path(g.port(), "/metrics");
    auto at = body.find("\nwalgate_bytes_out_total ");
    REQUIRE(at != std::string::npos);
    return std::strtoull(body.c_str() + at + 25, nullptr, 10);
  };
  const auto bytes_before = bytes_out();
  std::size_t received = 0;
  // One transaction of 2,000 one-row inserts, each event some 300 bytes of JSON.
  test::cluster().sql("INSERT INTO wsk_items SELECT g, 'note ' || repeat(md5(g::text), 4) FROM generate_series(1, 2000) g");
  std::vector<std::size_t> got(clients), compressed(clients);
  std::vector<bool> closed(clients);
  std::vector<pollfd> fds(clients);
  for (std::size_t i = 0; i < clients; ++i) fds[i] = {ws[i]->fd, POLLIN, 0};
  std::size_t done = 0;
  std::string sample;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (done < clients && std::chrono::steady_clock::now() < deadline) {
    if (::poll(fds.data(), fds.size(), 1000) <= 0) continue;
    for (std::size_t i = 0; i < clients; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char chunk[65536];
      ssize_t n;
      while ((n = ::recv(fds[i].fd, chunk, sizeof chunk, 0)) > 0) ws[i]->buf.append(chunk, static_cast<std::size_t>(n));
      if (n == 0) closed[i] = true, fds[i].fd = -1;
      take_frames(ws[i]->buf, [&](ws_frame f) {
        if (f.opcode != 1) return true;
        ++got[i];
        received += f.payload.size();
        if (f.rsv1) ++compressed[i];
        if (i == clients - 1 && got[i] == events) sample = f.rsv1 ? inflated(f.payload) : f.payload;
        return true;
      });
      if (got[i] == events) {
        ++done;
        fds[i].fd = -1;
      }
    }
  }
  std::size_t all = 0, short_of = 0, any_closed = 0, all_compressed = 0;
  for (std::size_t i = 0; i < clients; ++i) {
    all += got[i];
    short_of += got[i] != events;
    any_closed += closed[i];
    all_compressed += compressed[i];
  }
  MESSAGE("deliveries " << all << ", compressed " << all_compressed);
  CHECK(short_of == 0);
  CHECK(any_closed == 0);
  CHECK(all == clients * events);
  CHECK(all_compressed == all);   // (every event is over the threshold and shrinks)
  CHECK(sample.find("\"id\":2000") != std::string::npos);
  CHECK(bytes_out() - bytes_before == received);   // walgate_bytes_out_total: the bytes as sent
}
