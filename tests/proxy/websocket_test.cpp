// walgate's own WebSocket (RFC 6455) on the wire, from a raw socket: the handshake's answer and
// refusals, pings answered, fragments with control frames between them, the closing handshake
// both ways, protocol errors closed with their code, the keep-alive ping and a client that never
// answers it, and permessage-deflate client messages inflated on /v1/mux.
#include "walgate/protocol/websocket.hpp"
#include "walgate/proxy/deflate.hpp"

#include "client_deflater.hpp"
#include "gateway_harness.hpp"
#include "test_cluster.hpp"

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <zlib.h>
#include <unistd.h>

#include <malloc.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace walgate;
using namespace walgate::test::harness;
namespace pws = walgate::protocol::websocket;
using namespace std::string_literals;

namespace {

/// A client's frame, masked.
std::string masked(std::uint8_t op, std::string_view payload, bool fin = true, bool rsv1 = false, bool mask = true) {
  char head[10];
  std::string f(head, pws::frame_header(head, op, payload.size(), fin, rsv1));
  if (!mask) return f + std::string(payload);
  f[1] = static_cast<char>(f[1] | 0x80);
  const char key[4] = {0x5a, 0x13, 0x7f, 0x01};
  f.append(key, 4);
  for (std::size_t i = 0; i < payload.size(); ++i) f.push_back(static_cast<char>(payload[i] ^ key[i % 4]));
  return f;
}

using test::compressed_alone;

struct frame {
  std::uint8_t op = 0;
  bool fin = false, rsv1 = false;
  std::string payload;
};

/// A raw WebSocket client: the request as given, then frames.
struct wire {
  int fd = -1;
  std::string buf, head;
  unsigned status = 0;
  wire(std::uint16_t port, const std::string& target, const std::string& extra_headers = "",
       const std::string& version = "13", const std::string& key = "dGhlIHNhbXBsZSBub25jZQ==", int rcvbuf = 0) {
    fd = loopback_socket(port, rcvbuf);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    send("GET " + target + " HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
         "Sec-WebSocket-Key: " + key + "\r\nSec-WebSocket-Version: " + version + "\r\n" + extra_headers + "\r\n");
    while (buf.find("\r\n\r\n") == std::string::npos) REQUIRE(fill());
    const auto end = buf.find("\r\n\r\n");
    head = buf.substr(0, end + 2);
    buf.erase(0, end + 4);
    status = static_cast<unsigned>(std::atoi(head.c_str() + 9));
  }
  ~wire() {
    if (fd >= 0) ::close(fd);
  }
  void send(const std::string& bytes) {
    REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  }
  bool fill() { return fill_n() > 0; }
  /// recv's answer: bytes read (added to buf), 0 at the end of the stream, -1 on a timeout or error.
  ssize_t fill_n() {
    char chunk[16384];
    ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n > 0) buf.append(chunk, static_cast<std::size_t>(n));
    return n;
  }
  /// The next server frame; nullopt at the end of the stream (or 10 s without one).
  std::optional<frame> next() {
    for (;;) {
      if (buf.size() >= 2) {
        const auto b0 = static_cast<unsigned char>(buf[0]), b1 = static_cast<unsigned char>(buf[1]);
        REQUIRE((b1 & 0x80) == 0);   // a server never masks
        std::uint64_t len = b1 & 0x7f;
        std::size_t h = 2;
        if (len == 126 && buf.size() >= 4) {
          len = (static_cast<unsigned char>(buf[2]) << 8) | static_cast<unsigned char>(buf[3]);
          h = 4;
        } else if (len == 127 && buf.size() >= 10) {
          len = 0;
          for (int i = 0; i < 8; ++i) len = (len << 8) | static_cast<unsigned char>(buf[2 + i]);
          h = 10;
        }
        if ((b1 & 0x7f) < 126 || h > 2) {
          if (buf.size() >= h + len) {
            frame f{static_cast<std::uint8_t>(b0 & 0x0f), bool(b0 & 0x80), bool(b0 & 0x40), buf.substr(h, len)};
            buf.erase(0, h + len);
            return f;
          }
        }
      }
      if (!fill()) return std::nullopt;
    }
  }
  /// The next frame that is not a ping.
  std::optional<frame> next_not_ping() {
    for (;;) {
      auto f = next();
      if (!f || f->op != pws::op_ping) return f;
    }
  }
  /// The close frame's code and reason, and then the end of the stream (walgate's side shut
  /// down once the close frame is out).
  std::pair<std::uint16_t, std::string> closed() {
    auto f = next_not_ping();
    REQUIRE(f);
    while (f->op != pws::op_close) {
      f = next_not_ping();
      REQUIRE(f);
    }
    REQUIRE(f->payload.size() >= 2);
    const std::uint16_t code = static_cast<std::uint16_t>((static_cast<unsigned char>(f->payload[0]) << 8) |
                                                          static_cast<unsigned char>(f->payload[1]));
    // Then nothing: the end of the stream, at once (not walgate's 5 s wait, nor this socket's 10 s timeout).
    CHECK(buf.empty());
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(fill_n() == 0);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    return {code, f->payload.substr(2)};
  }
};

std::string header_value(const std::string& head, const std::string& name) {
  std::string lower = head;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  auto at = lower.find("\r\n" + name + ":");
  if (at == std::string::npos) return {};
  auto from = at + name.size() + 3, to = head.find("\r\n", from);
  std::string v = head.substr(from, to - from);
  while (!v.empty() && v.front() == ' ') v.erase(0, 1);
  return v;
}

/// Sends batch again and again (up to 256 MiB) until a send takes more than 3 s: how much went
/// through, and whether the sends stalled.
std::pair<std::size_t, bool> send_until_stalled(int fd, const std::string& batch) {
  timeval tv{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::size_t sent = 0;
  while (sent < (256u << 20)) {
    ssize_t n = ::send(fd, batch.data(), batch.size(), MSG_NOSIGNAL);
    if (n < static_cast<ssize_t>(batch.size())) return {sent, true};   // (a timeout: nothing or part of it went)
    sent += static_cast<std::size_t>(n);
  }
  return {sent, false};
}

}  // namespace

TEST_CASE("walgate's WebSocket: the handshake's answer, and a version or key it refuses") {
  test::cluster().sql("CREATE TABLE wsw_h(id int PRIMARY KEY); CREATE PUBLICATION wsw_h_pub FOR TABLE wsw_h");
  running_gateway g("wsw_h_slot", "wsw_h_pub");
  wire ok(g.port(), "/v1/ws", "Sec-WebSocket-Protocol: walgate\r\n");
  CHECK(ok.status == 101);
  CHECK(header_value(ok.head, "sec-websocket-accept") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");   // RFC 6455's example
  CHECK(header_value(ok.head, "upgrade") == "websocket");
  CHECK(header_value(ok.head, "server") == "walgate");
  CHECK(header_value(ok.head, "sec-websocket-protocol") == "walgate");
  CHECK(header_value(ok.head, "sec-websocket-extensions").empty());
  wire old(g.port(), "/v1/ws", "", "8");
  CHECK(old.status == 426);
  CHECK(header_value(old.head, "sec-websocket-version") == "13");
  wire bad(g.port(), "/v1/ws", "", "13", "c2hvcnQ=");
  CHECK(bad.status == 400);
  CHECK(bad.buf.find("Sec-WebSocket-Key") != std::string::npos);
  wire mux(g.port(), "/v1/mux", "", "13", "not base64!");
  CHECK(mux.status == 400);
}

TEST_CASE("walgate's WebSocket: pings answered, fragments with control frames between them, the client's close echoed") {
  test::cluster().sql("CREATE TABLE wsw_p(id int PRIMARY KEY); CREATE PUBLICATION wsw_p_pub FOR TABLE wsw_p");
  running_gateway g("wsw_p_slot", "wsw_p_pub");
  wire w(g.port(), "/v1/ws");
  REQUIRE(w.status == 101);
  w.send(masked(pws::op_ping, "are you there"));
  auto pong = w.next_not_ping();
  REQUIRE(pong);
  CHECK(pong->op == pws::op_pong);
  CHECK(pong->payload == "are you there");
  // A fragmented message (dropped: /v1/ws expects nothing), a ping between its fragments, sent a
  // byte at a time.
  const std::string pieces = masked(pws::op_text, "hel", false) + masked(pws::op_ping, "mid") +
                             masked(pws::op_continuation, "", false) + masked(pws::op_continuation, "lo", true);
  for (char c : pieces) w.send(std::string(1, c));
  pong = w.next_not_ping();
  REQUIRE(pong);
  CHECK(pong->op == pws::op_pong);
  CHECK(pong->payload == "mid");
  // Still served.
  test::cluster().sql("INSERT INTO wsw_p VALUES (7)");
  auto event = w.next_not_ping();
  REQUIRE(event);
  CHECK(event->op == pws::op_text);
  CHECK(event->payload.find("\"id\":7") != std::string::npos);
  // The client closes: its code echoed, then walgate's side ends; the client leaves the server.
  w.send(masked(pws::op_close, "\x0f\xa0" "done"s));   // 4000
  auto [code, reason] = w.closed();
  CHECK(code == 4000);
  CHECK(reason.empty());
  CHECK(test::wait_until([&] { return g.srv->clients() == 0; }));
}

TEST_CASE("walgate's WebSocket: protocol errors close with 1002 and the reason (a malformed close frame too)") {
  test::cluster().sql("CREATE TABLE wsw_e(id int PRIMARY KEY); CREATE PUBLICATION wsw_e_pub FOR TABLE wsw_e");
  running_gateway g("wsw_e_slot", "wsw_e_pub");
  struct {
    std::string bytes;
    std::uint16_t code;
    const char* reason;
  } cases[] = {
      {masked(pws::op_text, "x", true, false, false), 1002, "an unmasked frame (a client must mask its frames)"},
      {masked(pws::op_text, "x", true, true), 1002, "RSV1 without permessage-deflate"},
      {masked(pws::op_continuation, "x"), 1002, "a continuation frame outside a message"},
      {masked(pws::op_ping, std::string(126, 'p')), 1002, "a control frame over 125 bytes"},
      {masked(3, "x"), 1002, "an unknown opcode"},
      {masked(pws::op_close, "\x03\xed"s), 1002, "a malformed close frame"},   // 1005 may not be sent
      {masked(pws::op_close, "\x03\xe8\xff"s), 1002, "a malformed close frame"},
  };
  for (const char* target : {"/v1/ws", "/v1/mux"})
    for (const auto& c : cases) {
      INFO(target << ": " << c.reason);
      wire w(g.port(), target);
      REQUIRE(w.status == 101);
      w.send(c.bytes);
      auto [code, reason] = w.closed();
      CHECK(code == c.code);
      CHECK(reason == c.reason);
    }
  CHECK(test::wait_until([&] { return g.srv->clients() == 0; }));
}

TEST_CASE("walgate's WebSocket: an idle client is pinged; one that never answers is closed, one that does stays") {
  test::cluster().sql("CREATE TABLE wsw_k(id int PRIMARY KEY); CREATE PUBLICATION wsw_k_pub FOR TABLE wsw_k");
  server_options so;
  so.keepalive = std::chrono::milliseconds(300);
  running_gateway g("wsw_k_slot", "wsw_k_pub", so);
  {
    // Answering every ping: open after 2 s (over six keep-alives), and still served.
    wire w(g.port(), "/v1/ws");
    REQUIRE(w.status == 101);
    std::size_t pings = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    timeval tv{0, 100'000};
    ::setsockopt(w.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (std::chrono::steady_clock::now() < until) {
      REQUIRE(w.fill_n() != 0);   // (never the end of the stream)
      while (w.buf.size() >= 2 && static_cast<std::size_t>(static_cast<unsigned char>(w.buf[1])) + 2 <= w.buf.size()) {
        auto f = w.next();
        REQUIRE(f);
        REQUIRE(f->op == pws::op_ping);
        ++pings;
        w.send(masked(pws::op_pong, f->payload));
      }
    }
    CHECK(pings >= 3);
    timeval back{10, 0};
    ::setsockopt(w.fd, SOL_SOCKET, SO_RCVTIMEO, &back, sizeof back);
    test::cluster().sql("INSERT INTO wsw_k VALUES (1)");
    auto event = w.next_not_ping();
    REQUIRE(event);
    CHECK(event->op == pws::op_text);
  }
  for (const char* target : {"/v1/ws", "/v1/mux"}) {
    INFO(target);
    wire w(g.port(), target);
    REQUIRE(w.status == 101);
    const auto start = std::chrono::steady_clock::now();
    auto ping = w.next();
    REQUIRE(ping);
    CHECK(ping->op == pws::op_ping);
    // Never answered: after a keep-alive more, the socket is closed (no close frame: the client
    // is taken for gone).
    while (auto f = w.next()) CHECK(f->op == pws::op_ping);
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= std::chrono::milliseconds(500));   // (a ping at 300 ms, unanswered 300 ms more)
    CHECK(took < std::chrono::seconds(5));
  }
  CHECK(test::wait_until([&] { return g.srv->clients() == 0; }));
}

TEST_CASE("walgate's WebSocket: /v1/mux inflates a client's compressed messages, fragmented, with and without context takeover") {
  test::cluster().sql("CREATE TABLE wsw_z(id int PRIMARY KEY); CREATE PUBLICATION wsw_z_pub FOR TABLE wsw_z");
  running_gateway g("wsw_z_slot", "wsw_z_pub");
  for (const char* offer : {"permessage-deflate; client_max_window_bits", "permessage-deflate; client_no_context_takeover"}) {
    INFO(offer);
    wire w(g.port(), "/v1/mux", "Sec-WebSocket-Extensions: "s + offer + "\r\n");
    REQUIRE(w.status == 101);
    const std::string answer = header_value(w.head, "sec-websocket-extensions");
    CHECK(answer.find("server_no_context_takeover") != std::string::npos);
    CHECK((answer.find("client_no_context_takeover") != std::string::npos) == (std::string(offer).find("client_no") != std::string::npos));
    // Two messages, the first in three fragments; without client_no_context_takeover, from one
    // compressor that keeps its context (the second refers back into the first), with it each
    // on its own.
    const bool takeover = std::string(offer).find("client_no") == std::string::npos;
    test::client_deflater d;
    auto compress = [&](const std::string& m) { return takeover ? d.compress(m) : compressed_alone(m); };
    std::string z = compress(R"({"type":"subscribe","id":"a","tables":"public.wsw_z"})");
    w.send(masked(pws::op_text, z.substr(0, 5), false, true) + masked(pws::op_continuation, z.substr(5, 7), false) +
           masked(pws::op_continuation, z.substr(12), true));
    auto f = w.next_not_ping();
    REQUIRE(f);
    CHECK(f->payload == R"({"sub":"a","type":"subscribed"})");
    z = compress(R"({"type":"unsubscribe","id":"a"})");
    if (takeover) CHECK(z.size() < compressed_alone(R"({"type":"unsubscribe","id":"a"})").size());   // (it refers back)
    w.send(masked(pws::op_text, z, true, true));
    f = w.next_not_ping();
    REQUIRE(f);
    CHECK(f->payload.find(R"("type":"end","reason":"unsubscribed")") != std::string::npos);
    // Compressed bytes that do not inflate: 1007.
    w.send(masked(pws::op_text, "\xff\xff\xff\xff"s, true, true));
    auto [code, reason] = w.closed();
    CHECK(code == 1007);
  }
}

TEST_CASE("walgate's WebSocket: /v1/mux reads ahead at most 16 messages, then pauses; every message answered in order") {
  test::cluster().sql("CREATE TABLE wsw_i(id int PRIMARY KEY); CREATE PUBLICATION wsw_i_pub FOR TABLE wsw_i");
  running_gateway g("wsw_i_slot", "wsw_i_pub");
  wire w(g.port(), "/v1/mux");
  REQUIRE(w.status == 101);
  // 300 messages at once, some split across reads (and pauses): each gets its answer, in order.
  std::string all;
  for (int i = 0; i < 300; ++i)
    all += masked(pws::op_text, R"({"type":"unsubscribe","id":"u)" + std::to_string(i) + "\"}");
  w.send(all);
  for (int i = 0; i < 300; ++i) {
    auto f = w.next_not_ping();
    REQUIRE(f);
    INFO(f->payload);
    CHECK(f->payload.find("{\"sub\":\"u" + std::to_string(i) + "\",\"type\":\"error\",\"status\":404") == 0);
  }
  // Still open and served.
  w.send(masked(pws::op_text, R"({"type":"subscribe","id":"a","tables":"public.wsw_i"})"));
  auto f = w.next_not_ping();
  REQUIRE(f);
  CHECK(f->payload == R"({"sub":"a","type":"subscribed"})");
}

TEST_CASE("walgate's WebSocket: after a 1009 or 1007 the client's close answer ends the connection at once") {
  test::cluster().sql("CREATE TABLE wsw_c(id int PRIMARY KEY); CREATE PUBLICATION wsw_c_pub FOR TABLE wsw_c");
  server_options so;
  so.ws_message_limit = 1024;
  running_gateway g("wsw_c_slot", "wsw_c_pub", so);
  struct {
    std::string message;
    std::uint16_t code;
  } cases[] = {{masked(pws::op_text, std::string(3000, 'x')), 1009}, {masked(pws::op_text, "ok\xff"s), 1007}};
  for (const char* target : {"/v1/ws", "/v1/mux"})
    for (const auto& c : cases) {
      INFO(target << " " << c.code);
      wire w(g.port(), target);
      REQUIRE(w.status == 101);
      REQUIRE(test::wait_until([&] { return g.srv->clients() == (std::string(target) == "/v1/ws" ? 1u : 0u); }));
      // The offending message and, in the same write, the client's close (its answer, sent
      // ahead): read past the message's skipped bytes, it ends the connection without walgate's
      // 5 s wait.
      const auto t0 = std::chrono::steady_clock::now();
      w.send(c.message + masked(pws::op_close, "\x03\xe8"s));
      auto [code, reason] = w.closed();
      CHECK(code == c.code);
      // (the connection reading /metrics is the one left)
      CHECK(test::wait_until([&] { return metric_of(g.port(), "walgate_connections") == 1; }, std::chrono::seconds(10)));
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
    }
}

TEST_CASE("walgate's WebSocket: a client that sends pings and reads nothing is no longer read once pongs wait") {
  test::cluster().sql("CREATE TABLE wsw_f(id int PRIMARY KEY); CREATE PUBLICATION wsw_f_pub FOR TABLE wsw_f");
  running_gateway g("wsw_f_slot", "wsw_f_pub");
  wire w(g.port(), "/v1/ws");
  REQUIRE(w.status == 101);
  // Pings of 125 bytes, never reading the pongs. walgate keeps reading only while less than
  // 1 MiB waits to be sent; then the kernel's buffers fill and this client's sends stall. Were
  // pongs queued without bound, all 256 MiB would go through.
  std::string batch;
  for (int i = 0; i < 1000; ++i) batch += masked(pws::op_ping, std::string(125, 'p'));
  auto [sent, stalled] = send_until_stalled(w.fd, batch);
  MESSAGE("ping bytes sent before walgate stopped reading: " << sent);
  CHECK(stalled);
  CHECK(sent < (64u << 20));
}

namespace {
/// The heap in use (malloc'd and not freed, mmap'd chunks included), in KiB: what walgate's
/// queues hold, whatever the process's resident pages (freed heap reused by them would hide
/// growth from RSS).
std::size_t heap_kib() {
  const struct mallinfo2 m = mallinfo2();
  return (m.uordblks + m.hblkhd) >> 10;
}
}  // namespace

// Assumption: what a client's pings pin is walgate's own memory (16 KiB of pongs a connection),
// not the kernel's socket buffers. The kernel's buffers hide it from a client's view (the sends
// stall either way), so this measures the process's heap (the gateway runs in it) while 32
// connections that ping and never read are stalled. With pongs held up to the 1 MiB that other
// writes may wait, they pinned 32 MiB or more.
TEST_CASE("walgate's WebSocket: 32 clients that ping and never read pin at most 16 KiB of pongs each in walgate") {
  test::cluster().sql("CREATE TABLE wsw_q(id int PRIMARY KEY); CREATE PUBLICATION wsw_q_pub FOR TABLE wsw_q");
  running_gateway g("wsw_q_slot", "wsw_q_pub");
  std::vector<std::unique_ptr<wire>> clients;
  for (int i = 0; i < 32; ++i) {
    clients.push_back(std::make_unique<wire>(g.port(), "/v1/ws", "", "13", "dGhlIHNhbXBsZSBub25jZQ==", 4096));
    REQUIRE(clients.back()->status == 101);
  }
  std::string batch;
  for (int i = 0; i < 1000; ++i) batch += masked(pws::op_ping, std::string(125, 'p'));
  const std::size_t before = heap_kib();
  std::vector<std::thread> senders;
  std::vector<std::size_t> sent(clients.size());
  std::vector<char> stalled(clients.size());
  for (std::size_t i = 0; i < clients.size(); ++i)
    senders.emplace_back([&, i] {
      auto [n, st] = send_until_stalled(clients[i]->fd, batch);
      sent[i] = n;
      stalled[i] = st;
    });
  for (auto& t : senders) t.join();
  const std::size_t after = heap_kib();
  std::size_t total = 0;
  for (std::size_t i = 0; i < clients.size(); ++i) {
    CHECK(stalled[i]);
    total += sent[i];
  }
  MESSAGE("32 clients sent " << (total >> 20) << " MiB of pings; the heap in use grew by "
                               << (after - std::min(after, before)) << " KiB");
  CHECK(before > 0);
  CHECK(after - std::min(after, before) < 12 * 1024);
  CHECK(get_path(g.port(), "/healthz").first == 200);
}

TEST_CASE("walgate's WebSocket: a /v1/mux client that sends messages and reads no answer is no longer read once 1 MiB waits") {
  test::cluster().sql("CREATE TABLE wsw_g(id int PRIMARY KEY); CREATE PUBLICATION wsw_g_pub FOR TABLE wsw_g");
  running_gateway g("wsw_g_slot", "wsw_g_pub");
  wire w(g.port(), "/v1/mux");
  REQUIRE(w.status == 101);
  // Unsubscribes of unknown ids, each answered with a 404 message, never reading the answers.
  // The inbox holds at most 16 messages; the writer answers them while less than 1 MiB waits
  // to be sent, then the reader waits for room, the kernel's buffers fill, and these sends stall.
  // Were messages taken or answers queued without bound, all 256 MiB would go through.
  std::string batch;
  for (int i = 0; i < 1000; ++i)
    batch += masked(pws::op_text, R"({"type":"unsubscribe","id":"flood-)" + std::to_string(i) + "\"}");
  auto [sent, stalled] = send_until_stalled(w.fd, batch);
  MESSAGE("message bytes sent before walgate stopped reading: " << sent);
  CHECK(stalled);
  CHECK(sent < (64u << 20));
  // The server itself goes on.
  CHECK(get_path(g.port(), "/healthz").first == 200);
}

TEST_CASE("walgate's WebSocket: written by the event loop or by sender threads, the same frames (and NDJSON and SSE "
          "lines); a client that stops reading is closed at the write timeout either way") {
  for (unsigned threads : {0u, 1u, 2u}) {
    CAPTURE(threads);
    const std::string t = "wst_" + std::to_string(threads);
    test::cluster().sql("CREATE TABLE " + t + "(id int PRIMARY KEY, v text); CREATE PUBLICATION " + t + "_pub FOR TABLE " + t);
    server_options so;
    so.send_threads = threads;
    so.write_timeout = std::chrono::milliseconds(3000);
    running_gateway g(t + "_slot", t + "_pub", so);
    wire fast(g.port(), "/v1/ws?format=native&transactions=false");
    // Reads nothing until the end, with a 64 KiB receive buffer.
    wire slow(g.port(), "/v1/ws?format=native&transactions=false", "", "13", "dGhlIHNhbXBsZSBub25jZQ==", 64 << 10);
    REQUIRE(fast.status == 101);
    REQUIRE(slow.status == 101);
    // NDJSON and SSE readers beside them (written the same way: by the loop, or the sender threads).
    stream_client nd(g.port(), "/v1/stream?format=native&transactions=false");
    stream_client es(g.port(), "/v1/stream?format=native&transactions=false", {{"Accept", "text/event-stream"}});
    REQUIRE(nd.status() == 200);
    REQUIRE(es.status() == 200);
    std::vector<std::string> nd_events;
    std::vector<std::pair<std::string, std::string>> es_events;
    std::thread nd_reader([&] { nd_events = nd.events(10000); });
    std::thread es_reader([&] { es_events = es.sse(10000); });
    // 10,000 rows of 2,000 bytes in 10 transactions: 20 MB, far more than the slow client's
    // socket buffers hold.
    std::thread load([&t] {
      for (int k = 0; k < 10; ++k)
        test::cluster().sql("INSERT INTO " + t + " SELECT g, repeat(chr(97 + g % 26), 2000) FROM generate_series(" +
                            std::to_string(k * 1000 + 1) + ", " + std::to_string(k * 1000 + 1000) + ") g");
    });
    int received = 0, in_order = 0;
    for (int want = 1; want <= 10000; ++want) {
      auto f = fast.next_not_ping();
      if (!f) break;
      ++received;
      auto e = json::parse(f->payload);
      const auto id = e.at("after").at("id").to_number<int>();
      if (f->op == pws::op_text && f->fin && !f->rsv1 && id == want &&
          e.at("after").at("v").as_string() == std::string(2000, static_cast<char>('a' + want % 26)))
        ++in_order;
    }
    load.join();
    nd_reader.join();
    es_reader.join();
    CHECK(received == 10000);
    CHECK(in_order == 10000);
    REQUIRE(nd_events.size() == 10000);
    REQUIRE(es_events.size() == 10000);
    int nd_in_order = 0, es_in_order = 0;
    for (int i = 0; i < 10000; ++i) {
      const auto a = json::parse(nd_events[static_cast<std::size_t>(i)]), b = json::parse(es_events[static_cast<std::size_t>(i)].second);
      const std::string v(2000, static_cast<char>('a' + (i + 1) % 26));
      nd_in_order += a.at("after").at("id").to_number<int>() == i + 1 && a.at("after").at("v").as_string() == v;
      es_in_order += b.at("after").at("id").to_number<int>() == i + 1 && b.at("after").at("v").as_string() == v;
    }
    CHECK(nd_in_order == 10000);
    CHECK(es_in_order == 10000);
    // The slow client: its writes stall past the write timeout, and it is closed (what it was
    // sent is whole frames of the same events, then the end, with or without a close frame).
    CHECK(test::wait_until([&] { return metric_of(g.port(), "walgate_clients_disconnected_slow_total") == 1; },
                           std::chrono::seconds(10)));
    for (;;) {
      const auto n = slow.fill_n();
      if (n <= 0) {
        CHECK(n == 0);   // the end of the stream, not this socket's 10 s timeout
        break;
      }
    }
    int frames = 0;
    while (auto f = slow.next()) {
      if (f->op == pws::op_close) break;
      if (f->op != pws::op_text) continue;
      ++frames;
      CHECK(json::parse(f->payload).at("after").at("id").to_number<int>() == frames);
    }
    CHECK(frames < 10000);
    if (threads == 0) {
      CHECK(get_path(g.port(), "/metrics").second.find("walgate_send_thread_writes_total") == std::string::npos);
    } else {
      CHECK(metric_of(g.port(), "walgate_send_thread_writes_total") > 10);
      CHECK(metric_of(g.port(), "walgate_send_thread_partial_total") >= 1);   // the slow client's socket filled
    }
  }
}
