// WebSocket (GET /v1/ws): one text message per event, the frames made here and a batch sent in
// one write (corked_stream.hpp). With permessage-deflate, walgate answers
// server_no_context_takeover and sends each event's compressed form, made once and shared by
// every client of that window (payload::deflated); small and large messages go uncompressed.
// The connection is walgate's own (websocket_session.hpp): it reads and checks the client's
// frames, answers pings, keeps an idle connection alive with its own; the end is a close frame
// whose reason says why and where to resume.
#include "websocket_session.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

#include <array>
#include <optional>

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

}  // namespace

template <class Stream>
awaitable<void> serve_websocket(server_core& core, Stream s, http::request<http::empty_body> req, stream_start start,
                                connection_hold hold) {
  auto session = std::make_shared<ws_session<Stream>>(std::move(s));
  auto& out = session->out;
  const auto& opts = core.opts;
  if (!co_await handshake(core, *session, req)) co_return;
  req = http::request<http::empty_body>{};   // (its fields are not kept for the connection's life)
  out.send_with(core.sender);   // (its frames written by a sender thread from here; socket_sender.hpp)

  session->c.emplace(core, transport::websocket, std::move(start));
  struct release {   // the writer's end, however it ends: the client leaves the server
    ws_session<Stream>& s;
    ~release() { s.c.reset(); }
  } released{*session};
  auto& c = *session->c;
  auto& sub = c.sub;
  if (session->deflate_bits) sub.set_deflate(session->deflate_bits);
  c.force_close = [s = session.get()] { s->close_socket(); };

  // The reader answers pings, enforces the message limit (1009) and UTF-8 (1007); walgate
  // expects nothing from clients, so a message is read a little at a time and dropped (an idle
  // connection holds no read buffer of its own, and no coroutine for its reader).
  session->message_limit = opts.ws_message_limit;
  start_reading(session);

  std::vector<subscription::item> batch;
  bool failed = false;
  // The batch's frames are collected and sent in one write. A batch that takes longer than
  // write_timeout to go out: the client does not read; close it.
  auto rearm = [&c, &opts, &session] {
    arm_watchdog(c.watchdog, opts.write_timeout, session, [](ws_session<Stream>& s) {
      if (!s.c) return;   // (the writer may have ended with the handler queued)
      s.c->sub.close(subscription::end::slow, "slow client: a write took too long");
      s.c->force_close();
    });
  };
  std::uint64_t seen = core.notifications;
  bool trimmed = true, idle = false;   // (no buffers yet)
  std::chrono::steady_clock::time_point idle_since{};
  while (!core.stopping && !sub.ended()) {
    if (core.behind_live(sub, seen)) co_await asio::post(core.executor, asio::use_awaitable);   // live clients first
    if (core.stopping || sub.ended()) break;
    sub.next_batch(batch);
    if (sub.ended()) break;
    if (batch.empty() && sub.pending()) {   // passed over events its filters do not take: go on after the others
      co_await asio::post(core.executor, asio::use_awaitable);
      continue;
    }
    if (batch.empty()) {
      // Idle: it keeps its buffers for keep_buffers_for (a client of a steady stream has a batch
      // again by then), then gives them back while it waits (the next burst makes them again, once).
      const auto now = std::chrono::steady_clock::now();
      if (!idle) idle_since = now;
      idle = true;
      if (!trimmed && now >= idle_since + keep_buffers_for) {
        std::vector<subscription::item>().swap(batch);
        out.trim();
        trimmed = true;
      }
      auto check_at = now + opts.keepalive;
      if (!session->keep_alive(opts.keepalive, now, check_at)) {
        sub.close(subscription::end::client_gone, "no answer to a ping");
        failed = true;
        break;
      }
      c.wake.expires_at(std::min(trimmed ? now + opts.keepalive : idle_since + keep_buffers_for, check_at));
      co_await c.wake.async_wait(use_tuple);
      continue;
    }
    idle = trimmed = false;
    rearm();
    out.cork();
    std::size_t bytes = 0;
    for (const auto& item : batch)
      if (!co_await append_message(core, *session, item.bytes, {}, {}, bytes, rearm)) {
        failed = true;
        break;
      }
    auto [dec] = co_await out.async_drain(use_tuple);
    c.watchdog.cancel();
    if (failed || dec) {
      failed = true;
      break;
    }
    c.delivered(batch.back(), batch.size(), bytes);
  }
  c.finished();
  if (core.stopping) sub.close(subscription::end::shutdown, "server shutting down");
  // Still open: say why it ends, and where to resume; then the client's answer, and the socket
  // closed (the reader ends then, if it has not; it holds the session till then).
  // (A message refused because the connection is closing is no failure: its close frame goes out.
  // When the client closed, its answer, already queued, goes out before the socket closes.)
  if (!failed || session->closing)
    co_await send_close(*session, c.wake, sub.why(), sub.reason(), sub.resume_id());
  else
    c.force_close();
}

template awaitable<void> serve_websocket<asio::ip::tcp::socket>(server_core&, asio::ip::tcp::socket,
                                                                http::request<http::empty_body>, stream_start,
                                                                connection_hold);
template awaitable<void> serve_websocket<beast::ssl_stream<beast::tcp_stream>>(server_core&,
                                                                               beast::ssl_stream<beast::tcp_stream>,
                                                                               http::request<http::empty_body>,
                                                                               stream_start, connection_hold);

}  // namespace walgate::proxy
