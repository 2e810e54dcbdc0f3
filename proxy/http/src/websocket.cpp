// WebSocket (GET /v1/ws): one text message per event, the frames made here and a batch sent in
// one write (corked_stream.hpp). With permessage-deflate, walgate answers
// server_no_context_takeover and sends each event's compressed form, made once and shared by
// every client of that window (payload::deflated); small and large messages go uncompressed.
// The connection is walgate's own (websocket_session.hpp): it reads and checks the client's
// frames, answers pings, keeps an idle connection alive with its own; the end is a close frame
// whose reason says why and where to resume.
#include "pump.hpp"
#include "websocket_session.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

namespace walgate::proxy {

using namespace ws;

namespace {

/// A WebSocket client: the connection and its client, shared by the writer (serve_websocket)
/// and the reader coroutine, so whichever ends last frees them.
/// The client is registered from the accepted handshake until the writer ends (the reader may
/// outlive it by a moment, and never touches the server after).
template <class Stream>
struct ws_session : session<Stream> {
  using session<Stream>::session;
  std::optional<client> c;

  // The reader's (websocket_session.hpp): walgate expects nothing from clients, so a message is
  // read a little at a time, checked and dropped.
  static constexpr bool keeps_messages = false;
  void reader_end(const char* why) {
    if (c) {   // (the writer still runs)
      c->sub.close(subscription::end::client_gone, why);
      c->wake.cancel();
    }
  }
};

/// What a WebSocket stream starts from, freed once its handshake is answered and its client made.
struct ws_start {
  http::request<http::empty_body> req;   ///< the upgrade request the handshake answers
  stream_start start;
};

/// One /v1/ws stream, served by pump.hpp's serve_stream: begin, the handshake and the client
/// made; send, a batch's frames collected in the corked buffer and sent in one write, within
/// the write timeout; while idle, the keep-alive pings; end, the close frame.
template <class Stream>
class ws_connection {
 public:
  ws_connection(server_core& core, Stream s, std::unique_ptr<ws_start> start, connection_hold hold)
      : core_(core),
        hold_(std::move(hold)),
        session_(std::make_shared<ws_session<Stream>>(std::move(s))),
        start_(std::move(start)) {}
  ws_connection(const ws_connection&) = delete;
  ws_connection& operator=(const ws_connection&) = delete;
  /// The writer's end, however it ends: the client leaves the server (the reader may hold the
  /// session a moment longer).
  ~ws_connection() { session_->c.reset(); }

  /// A failed connection may still send its close frame (the client's close came first), with
  /// the reason.
  static constexpr bool says_why_after_failure = true;

  client& c() { return *session_->c; }

  awaitable<bool> begin() {
    auto& session = *session_;
    if (!co_await handshake(core_, session, start_->req)) co_return false;
    session.out.send_with(core_.sender);   // (its frames written by a sender thread from here; socket_sender.hpp)
    session.c.emplace(core_, transport::websocket, std::move(start_->start));
    start_.reset();   // (the request's fields are not kept for the connection's life)
    auto& c = *session.c;
    if (session.deflate_bits) c.sub.set_deflate(session.deflate_bits);
    c.force_close = [s = session_.get()] { s->close_socket(); };
    // The reader answers pings, enforces the message limit (1009) and UTF-8 (1007); walgate
    // expects nothing from clients, so a message is read a little at a time and dropped (an idle
    // connection holds no read buffer of its own, and no coroutine for its reader).
    session.message_limit = core_.opts.ws_message_limit;
    start_reading(session_);
    co_return true;
  }

  void trim() { session_->out.trim(); }

  /// A ping when the client has been quiet for --keepalive; fails (the subscription closed:
  /// client_gone) when a ping went unanswered.
  idle_step idle(std::chrono::steady_clock::time_point now, std::chrono::steady_clock::time_point idle_since,
                 bool trimmed) {
    const auto& opts = core_.opts;
    auto check_at = now + opts.keepalive;
    if (!session_->keep_alive(opts.keepalive, now, check_at)) {
      c().sub.close(subscription::end::client_gone, "no answer to a ping");
      return {idle_step::fail, {}};
    }
    return {idle_step::wait, std::min(trimmed ? now + opts.keepalive : idle_since + keep_buffers_for, check_at)};
  }

  /// The batch's messages in one write: the bytes sent, or nullopt when the connection failed.
  awaitable<std::optional<std::size_t>> send(const std::vector<subscription::item>& batch) {
    auto& out = session_->out;
    auto rearm = [this] { arm_write_timeout(); };
    rearm();
    out.cork();
    std::size_t bytes = 0;
    bool failed = false;
    for (const auto& item : batch)
      if (!co_await append_message(core_, *session_, item.bytes, {}, {}, bytes, rearm)) {
        failed = true;
        break;
      }
    auto [dec] = co_await out.async_drain(use_tuple);
    c().watchdog.cancel();
    if (failed || dec) co_return std::nullopt;
    co_return bytes;
  }

  /// Still open: say why it ends, and where to resume; then the client's answer, and the socket
  /// closed (the reader ends then, if it has not; it holds the session till then).
  /// (A message refused because the connection is closing is no failure: its close frame goes out.
  /// When the client closed, its answer, already queued, goes out before the socket closes.)
  awaitable<void> end(bool failed) {
    auto& c = this->c();
    if (!failed || session_->closing)
      co_await send_close(*session_, c.wake, c.sub.why(), c.sub.reason(), c.sub.resume_id());
    else
      c.force_close();
  }

 private:
  // The batch's frames are collected and sent in one write. A batch that takes longer than
  // write_timeout to go out: the client does not read; close it.
  void arm_write_timeout() {
    arm_watchdog(c().watchdog, core_.opts.write_timeout, session_, [](ws_session<Stream>& s) {
      if (!s.c) return;   // (the writer may have ended with the handler queued)
      s.c->sub.close(subscription::end::slow, "slow client: a write took too long");
      s.c->force_close();
    });
  }

  server_core& core_;
  connection_hold hold_;
  std::shared_ptr<ws_session<Stream>> session_;
  std::unique_ptr<ws_start> start_;
};

}  // namespace

/// The stream (ws_connection, above), served by pump.hpp's loop: the coroutine returned is the
/// stream's only one (this function has no frame of its own).
template <class Stream>
awaitable<void> serve_websocket(server_core& core, Stream s, http::request<http::empty_body> req, stream_start start,
                                connection_hold hold) {
  return serve_stream(core, std::make_unique<ws_connection<Stream>>(
                                core, std::move(s), std::make_unique<ws_start>(ws_start{std::move(req), std::move(start)}),
                                std::move(hold)));
}

template awaitable<void> serve_websocket<asio::ip::tcp::socket>(server_core&, asio::ip::tcp::socket,
                                                                http::request<http::empty_body>, stream_start,
                                                                connection_hold);
template awaitable<void> serve_websocket<beast::ssl_stream<beast::tcp_stream>>(server_core&,
                                                                               beast::ssl_stream<beast::tcp_stream>,
                                                                               http::request<http::empty_body>,
                                                                               stream_start, connection_hold);

}  // namespace walgate::proxy
