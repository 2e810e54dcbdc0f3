// What the two WebSocket endpoints share (internal to websocket.cpp and websocket_mux.cpp; Beast
// stays out of shared headers): the handshake with walgate's permessage-deflate answer, one
// event's message put into the connection's corked buffer (compressed from the shared form, or
// sent from the shared encoding, or in fragments from a spill file), the write watchdog, and the
// closing frame.
#pragma once

#include "corked_stream.hpp"
#include "serving.hpp"

#include "walgate/proxy/deflate.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace walgate::proxy::ws {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using asio::awaitable;

inline constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

/// A WebSocket connection: the stream (Beast reads, walgate writes its own frames through the
/// corked layer), shared by the writer and the reader coroutine so whichever ends last frees it.
template <class Stream>
struct session {
  explicit session(Stream&& s) : ws(std::move(s)) {}   // (the one move of the connection's stream)
  websocket::stream<corked_stream<Stream>> ws;
  bool reading = true;
  std::string extensions;   // the Sec-WebSocket-Extensions walgate answered
  int deflate_bits = 0;     // the window walgate compresses with (0: none negotiated)

  void close_socket() {
    boost::system::error_code ec;
    beast::get_lowest_layer(ws).socket().close(ec);
  }
};

/// The options (timeouts, pings, the client message limit, walgate's permessage-deflate answer)
/// and the handshake; false when it failed. Sets deflate_bits.
template <class Stream>
awaitable<bool> handshake(server_core& core, session<Stream>& s, const http::request<http::empty_body>& req) {
  auto& ws = s.ws;
  const auto& opts = core.opts;
  beast::get_lowest_layer(ws).expires_never();
  websocket::stream_base::timeout t{};
  t.handshake_timeout = std::chrono::seconds(10);
  t.idle_timeout = opts.keepalive * 2;   // a ping goes out at half of it; no pong: closed
  t.keep_alive_pings = true;
  ws.set_option(t);
  websocket::permessage_deflate pmd;
  // Used when the client offers it — except a server window of 8 bits, which zlib does not
  // have and an answer may not exceed (RFC 7692 7.1.2.1): declined, the messages go plain.
  auto offer = parse_pmd_answer(std::string_view(req[http::field::sec_websocket_extensions]));
  pmd.server_enable = !(offer && offer->server_max_window_bits < 9);
  pmd.server_no_context_takeover = true;   // each message on its own: one compressed form for all
  ws.set_option(pmd);
  ws.read_message_max(opts.ws_message_limit);
  // A browser that sends its token as a subprotocol (bearer.<token>) offers walgate with it, and
  // walgate is the one the answer names.
  const bool walgate_protocol =
      offers_subprotocol(std::string_view(req[http::field::sec_websocket_protocol]), "walgate");
  ws.set_option(websocket::stream_base::decorator([ext = &s.extensions, walgate_protocol](websocket::response_type& res) {
    res.set(http::field::server, "walgate");
    if (walgate_protocol) res.set(http::field::sec_websocket_protocol, "walgate");
    *ext = std::string(res[http::field::sec_websocket_extensions]);   // (Beast's answer is made by now)
  }));
  auto [aec] = co_await ws.async_accept(req, use_tuple);
  if (aec) co_return false;
  if (auto a = parse_pmd_answer(s.extensions); a && a->server_no_context_takeover) s.deflate_bits = a->server_max_window_bits;
  co_return true;
}

/// Puts one event's message into the corked buffer — head and tail around its bytes when given
/// (a multiplexed subscription's envelope; in stored blocks around the shared compressed form,
/// deflate.hpp) — and adds the bytes it sends to bytes. A message sent from a spill file goes in
/// fragments, each drained before the next is read, rearm() called after each (the write
/// timeout is per piece). False when the connection failed (or Beast began closing it).
template <class Stream, class Rearm>
awaitable<bool> append_message(server_core& core, session<Stream>& s, const payload_ptr& p, std::string_view head,
                               std::string_view tail, std::size_t& bytes, Rearm&& rearm) {
  auto& out = s.ws.next_layer();
  if (!s.ws.is_open()) co_return false;   // Beast has begun closing (a protocol error from the client)
  const bool wrapped = !head.empty() || !tail.empty();
  const std::string* z = s.deflate_bits ? p->deflated(s.deflate_bits) : nullptr;
  if (z) {
    std::shared_ptr<const void> keep;
    if (z->size() >= 1024) keep = p;   // sent from the shared compressed form
    if (!wrapped) {
      if (keep) out.append_text_frame(std::move(keep), *z, true);
      else out.append_text_frame(*z, true);
      bytes += z->size();
    } else {
      const std::string h = deflate_stored_head(head), t = deflate_stored_tail(tail);
      out.append_text_frame(h, std::move(keep), *z, t, true);
      bytes += h.size() + z->size() + t.size();
    }
    co_return true;
  }
  if (!p->spilled() && p->size() < core.opts.spill_bytes) {
    std::shared_ptr<const void> keep;
    if (p->size() >= large_payload) keep = p;   // sent from the shared encoding
    if (!wrapped) {
      if (keep) out.append_text_frame(std::move(keep), p->bytes());
      else out.append_text_frame(p->bytes());
    } else {
      out.append_text_frame(head, std::move(keep), p->bytes(), tail);
    }
    bytes += head.size() + p->size() + tail.size();
    co_return true;
  }
  // In pieces, each sent before the next is read from the spill file: a message in fragments,
  // pings and pongs between them. The envelope's head and tail are fragments of their own.
  auto drain = [&]() -> awaitable<bool> {
    auto [ec] = co_await out.async_drain(use_tuple);
    out.cork();
    rearm();   // each piece within the write timeout
    co_return !ec;
  };
  if (!head.empty()) {
    auto copy = std::make_shared<std::string>(head);
    out.append_text_fragment(copy, *copy, true, false);
  }
  auto piece = std::make_shared<std::string>();
  for (std::size_t off = 0; off < p->size(); off += piece_bytes) {
    if (!s.ws.is_open()) co_return false;   // Beast closed meanwhile: no data frame after its close
    std::size_t n = std::min(piece_bytes, p->size() - off);
    std::string_view view;
    if (p->spilled()) {
      piece->resize(n);
      std::string error;
      if (!p->read(off, *piece, error)) {
        core.spill_read_failed(error);
        co_return false;
      }
      view = *piece;
    } else {
      view = p->bytes().substr(off, n);
    }
    std::shared_ptr<const void> keep = p;
    if (p->spilled()) keep = piece;
    out.append_text_fragment(std::move(keep), view, off == 0 && head.empty(), off + n == p->size() && tail.empty());
    if (!co_await drain()) co_return false;
  }
  if (!tail.empty()) {
    auto copy = std::make_shared<std::string>(tail);
    out.append_text_fragment(copy, *copy, false, true);
  }
  bytes += head.size() + p->size() + tail.size();
  co_return true;
}

/// Arms a write watchdog on timer: when a batch takes longer than write_timeout to go out, the
/// client does not read; on_timeout (given the still-living session) closes it.
template <class Session, class OnTimeout>
void arm_watchdog(asio::steady_timer& timer, std::chrono::milliseconds timeout, const std::shared_ptr<Session>& s,
                  OnTimeout on_timeout) {
  timer.expires_after(timeout);
  timer.async_wait([w = std::weak_ptr<Session>(s), on_timeout](boost::system::error_code ec) {
    auto live = w.lock();
    if (ec || !live) return;
    on_timeout(*live);
  });
}

/// WebSocket close codes of walgate's own (RFC 6455 7.4.2: 4000-4999 are the application's).
inline constexpr std::uint16_t close_token_expired = 4001;

/// The closing frame: 1001 for a shutdown, 4001 when the client's token expired, 1008 when its
/// grants cannot be applied to a table (--policy rows), else 1013;
/// with the reason (cut to fit) and where to resume when there is a position.
template <class Stream>
awaitable<void> send_close(session<Stream>& s, subscription::end why_end, std::string_view reason, std::string_view resume_id) {
  websocket::close_reason why;
  if (why_end == subscription::end::shutdown) {
    why.code = websocket::close_code::going_away;
    why.reason = "server shutting down";
  } else {
    why.code = why_end == subscription::end::expired ? close_token_expired
               : why_end == subscription::end::grant  ? std::uint16_t(websocket::close_code::policy_error)
                                                      : std::uint16_t(websocket::close_code::try_again_later);
    why.reason = std::string(reason.substr(0, 85));   // ASCII: cut anywhere
  }
  if (!resume_id.empty()) why.reason += "; resume from " + std::string(resume_id);
  if (why.reason.size() > 123) why.reason.resize(123);
  co_await s.ws.async_close(why, use_tuple);
}

}  // namespace walgate::proxy::ws
