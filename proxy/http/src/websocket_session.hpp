// What the two WebSocket endpoints share (internal to websocket.cpp and websocket_mux.cpp; Beast
// stays out of shared headers): the connection (walgate's own WebSocket, RFC 6455: the
// handshake with walgate's permessage-deflate answer, the reader of the client's frames, the
// keep-alive pings and the closing handshake), one event's message put into the connection's
// corked buffer (compressed from the shared form, or sent from the shared encoding, or in
// fragments from a spill file), the write watchdog, and the closing frame.
#pragma once

#include "corked_stream.hpp"
#include "serving.hpp"

#include "walgate/protocol/websocket.hpp"
#include "walgate/proxy/deflate.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace walgate::proxy::ws {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace pws = protocol::websocket;
using asio::awaitable;

inline constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

/// How long a closing handshake may take: after walgate's close frame, the client's answer (or
/// the end of its stream) is awaited this long, then the socket is closed.
inline constexpr std::chrono::seconds close_timeout{5};
/// How long the handshake's answer may take to go out.
inline constexpr std::chrono::seconds handshake_timeout{10};
/// The reader pauses while more than this waits to be sent (its pongs among it).
inline constexpr std::size_t read_pause_bytes = 1u << 20;
/// ... and while more than this of pongs wait (a client that pings and does not read pins no
/// more than that of them).
inline constexpr std::size_t pong_pause_bytes = 16u << 10;

/// The reader's state, kept in the session: an idle connection holds this, and one pending read
/// (no coroutine of its own).
struct reader_state {
  std::array<char, 64> chunk;   // what one read takes (a message goes a piece at a time)
  std::size_t at = 0, end = 0;  // the bytes of chunk not handled yet: [at, end)
  std::string message;          // the message read so far (kept: /v1/mux)
  std::size_t size = 0;         // its bytes so far (inflated)
  bool text = false, compressed = false;
  pws::utf8_checker utf8;
  std::uint16_t failure = 0;    // the close code of the rule a message broke
};

/// What a session does with a whole client message (/v1/mux keeps them).
enum class delivered { go_on, paused, stop };

/// A WebSocket connection: the stream (walgate writes its frames through the corked layer, and
/// reads the client's with protocol::websocket::frame_reader), shared by the writer and the
/// reader coroutine so whichever ends last frees it. Nothing of it is per message: the read
/// buffer is the reader's few bytes, the inflater is made when a compressed client message
/// first arrives.
template <class Stream>
struct session {
  explicit session(Stream&& s) : out(std::move(s)) {}   // (the one move of the connection's stream)
  corked_stream<Stream> out;
  bool reading = true;      // the reader runs (and holds the session)
  bool open = true;         // no close frame sent: frames may go out
  bool closing = false;     // the connection is ending: its close frame was sent or received
  bool close_done = false;  // the client's close frame came (walgate's is sent or queued): the handshake is over
  std::string extensions;   // the Sec-WebSocket-Extensions walgate answered
  int deflate_bits = 0;     // the window walgate compresses with (0: none negotiated)
  bool client_resets = false;   // client_no_context_takeover agreed
  bool clean_end = false;       // the client's stream ended cleanly (over TLS: with its close_notify)
  std::size_t message_limit = 0;   // client messages (inflated) past this: 1009
  pws::frame_reader frames;
  reader_state rd;
  std::unique_ptr<inflater> inflate;   // made at the client's first compressed message
  std::chrono::steady_clock::time_point heard = std::chrono::steady_clock::now();   // last bytes from the client
  std::chrono::steady_clock::time_point pinged{};   // the last keep-alive ping
  std::size_t pong_bytes = 0;          // pongs queued and not yet known sent
  std::uint64_t pongs_sent_at = 0;     // out.writes_done() at which they all are

  /// A pong for a ping: queued, and counted until the write that carries it is done.
  void send_pong(std::string_view payload) {
    if (!open) return;
    if (pong_bytes && out.writes_done() >= pongs_sent_at) pong_bytes = 0;
    pong_bytes += payload.size() + 2;
    pongs_sent_at = out.writes_done() + (out.writing() ? 2 : 1);
    send_control(pws::op_pong, payload);
  }
  /// More pongs wait than pong_pause_bytes: the reader pauses (like read_pause_bytes).
  bool pongs_pile_up() {
    if (pong_bytes && out.writes_done() >= pongs_sent_at) pong_bytes = 0;
    return pong_bytes > pong_pause_bytes;
  }

  bool is_open() const { return open && !closing; }

  void close_socket() { out.close(); }

  /// A control frame, sent at once unless a batch is being collected (then with it).
  void send_control(std::uint8_t opcode, std::string_view payload) {
    if (open) out.append_bytes(pws::control_frame(opcode, payload));
  }

  /// The close frame (once), then the end of walgate's side of the stream once it is sent.
  void send_close_frame(std::uint16_t code, std::string_view reason) {
    if (!open) return;
    open = false;
    closing = true;
    out.append_bytes(code == pws::close_no_status ? pws::control_frame(pws::op_close, {}) : pws::close_frame(code, reason));
    out.shutdown_after_sent();
  }

  /// The keep-alive, looked at while the writer waits: a ping when nothing was heard from the
  /// client for keepalive; false when a ping went unanswered (nothing heard) for keepalive.
  /// check_at: when to look again.
  bool keep_alive(std::chrono::milliseconds keepalive, std::chrono::steady_clock::time_point now,
                  std::chrono::steady_clock::time_point& check_at) {
    if (pinged > heard) {
      if (now >= pinged + keepalive) return false;
      check_at = pinged + keepalive;
      return true;
    }
    if (now >= heard + keepalive && is_open()) {
      send_control(pws::op_ping, {});
      pinged = now;
      check_at = now + keepalive;
      return true;
    }
    check_at = heard + keepalive;
    return true;
  }
};

/// The handshake's answer (RFC 6455 4.2.2; the request is an upgrade, checked before): 101 with
/// walgate's permessage-deflate answer and subprotocol, or 426 for a version other than 13, or
/// 400 for a bad key; false when it failed or refused. Sets deflate_bits.
template <class Stream>
awaitable<bool> handshake(server_core& core, session<Stream>& s, const http::request<http::empty_body>& req) {
  (void)core;
  if constexpr (requires { beast::get_lowest_layer(s.out.next_layer()).expires_never(); })
    beast::get_lowest_layer(s.out.next_layer()).expires_never();   // (a TLS connection's Beast stream)
  std::string res;
  bool accepted = false;
  const std::string_view key = req[http::field::sec_websocket_key];
  if (req[http::field::sec_websocket_version] != "13") {
    res = "HTTP/1.1 426 Upgrade Required\r\nServer: walgate\r\nSec-WebSocket-Version: 13\r\n"
          "Content-Length: 0\r\nConnection: close\r\n\r\n";
  } else if (!pws::valid_key(key)) {
    const std::string_view body = "bad Sec-WebSocket-Key (RFC 6455)";
    res = "HTTP/1.1 400 Bad Request\r\nServer: walgate\r\nContent-Type: text/plain\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + std::string(body);
  } else {
    accepted = true;
    res = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
          pws::accept_key(key) + "\r\nServer: walgate\r\n";
    // A browser that sends its token as a subprotocol (bearer.<token>) offers walgate with it,
    // and walgate is the one the answer names.
    if (offers_subprotocol(std::string_view(req[http::field::sec_websocket_protocol]), "walgate"))
      res += "Sec-WebSocket-Protocol: walgate\r\n";
    std::string offers;   // every Sec-WebSocket-Extensions line, in order (RFC 7230 3.2.2)
    for (auto [it, last] = req.equal_range(http::field::sec_websocket_extensions); it != last; ++it) {
      if (!offers.empty()) offers += ", ";
      offers.append(it->value().data(), it->value().size());
    }
    if (auto pmd = negotiate_pmd(offers)) {
      res += "Sec-WebSocket-Extensions: " + pmd->answer + "\r\n";
      s.extensions = pmd->answer;
      s.deflate_bits = pmd->server_bits;
      s.client_resets = pmd->client_no_context_takeover;
      s.frames = pws::frame_reader(true);
    }
    res += "\r\n";
  }
  asio::steady_timer limit(s.out.get_executor());
  auto done = std::make_shared<bool>(false);   // (a completion already queued must not touch s)
  limit.expires_after(handshake_timeout);
  limit.async_wait([&s, done](boost::system::error_code ec) {
    if (!ec && !*done) s.close_socket();
  });
  s.out.append_bytes(res);
  auto [ec] = co_await s.out.async_drain(use_tuple);
  *done = true;
  limit.cancel();
  s.heard = std::chrono::steady_clock::now();   // (the keep-alive counts from here)
  if (!accepted && !ec) s.out.shutdown_after_sent();
  co_return accepted && !ec;
}

/// The reader: the client's frames until the connection ends, as a chain of completion
/// handlers (start_reading). It answers pings, a close (then ends walgate's side), fails the
/// connection with 1002 (the protocol), 1007 (a text message that is not UTF-8, or a compressed
/// one that does not inflate) or 1009 (a message over limit bytes, inflated) — and hands each
/// whole message to the session when it keeps them (S::keeps_messages: s.deliver(sp, text,
/// message), which may pause the reader until it calls take_pieces(sp) again, or stop it), else
/// checks it and drops it, a piece at a time. Reading goes on after walgate's close frame until
/// the client's close frame (then the writer ends the connection: finish_close), the end of its
/// stream, or the socket closed; while more than read_pause_bytes wait to be sent (a client that
/// sends pings and reads nothing), it pauses. s.reader_end(why) is called when the connection
/// begins to close from the client's side (its close frame, a protocol failure) and again when
/// the reader ends (the first reason is the one that counts).
template <class S>
void start_reading(const std::shared_ptr<S>& sp);

template <class S>
void reader_done(const std::shared_ptr<S>& sp) {
  sp->reading = false;
  sp->reader_end("the client closed the connection");   // (the writer closes the socket)
}

/// The pieces of what was read, in order; then the next read (unless paused or done).
template <class S>
void take_pieces(const std::shared_ptr<S>& sp) {
  auto& s = *sp;
  auto& r = s.rd;
  // Bytes of the message (inflated): counted, checked, kept when it keeps them; false and the
  // close code when they break a rule.
  auto take = [&s, &r](std::string_view bytes) {
    r.size += bytes.size();
    if (r.size > s.message_limit) {
      r.failure = pws::close_too_big;
      return false;
    }
    if (r.text && !r.utf8.feed(bytes)) {
      r.failure = pws::close_bad_payload;
      return false;
    }
    if constexpr (S::keeps_messages) r.message.append(bytes);
    return true;
  };
  bool stop = false;
  while (!stop) {
    std::span<char> in(r.chunk.data() + r.at, r.end - r.at);
    pws::piece p = s.frames.next(in);
    r.at = r.end - in.size();
    if (p.what == pws::piece::kind::more) break;
    if (s.closing && p.what != pws::piece::kind::control) {   // after a close: the client's answer is awaited
      if (p.what == pws::piece::kind::failed) {   // (nothing more can be read: done)
        s.close_done = true;
        stop = true;
      }
      continue;
    }
    if (p.what == pws::piece::kind::failed) {
      // Nothing after a broken frame can be read: the reader ends here, without the client's
      // answer (RFC 6455 7.1.7), and the writer sends the close frame and closes.
      s.send_close_frame(p.code, p.reason);
      s.close_done = true;
      s.reader_end(p.reason);
      stop = true;
    } else if (p.what == pws::piece::kind::control) {
      if (p.opcode == pws::op_ping) {
        s.send_pong(p.bytes);
      } else if (p.opcode == pws::op_close) {
        auto c = pws::parse_close(p.bytes);
        if (!c) s.send_close_frame(pws::close_protocol_error, "a malformed close frame");
        else s.send_close_frame(c->code, {});   // the answer: its code echoed
        s.closing = true;
        s.close_done = true;   // both close frames: nothing more to read (the writer ends the connection)
        s.reader_end("the client closed the connection");
        stop = true;
      }
    } else {   // data
      if (p.begins) {
        r.text = p.opcode == pws::op_text;
        r.compressed = p.compressed;
        r.size = 0;
        r.utf8.reset();
        r.message.clear();
      }
      bool ok;
      if (r.compressed) {
        if (!s.inflate) s.inflate = std::make_unique<inflater>();
        ok = s.inflate->feed(p.bytes, p.ends, take);
        if (!ok && !r.failure) r.failure = pws::close_bad_payload;
        if (p.ends && s.client_resets) s.inflate.reset();   // nothing kept between its messages
      } else {
        ok = take(p.bytes);
      }
      if (ok && p.ends && r.text && !r.utf8.complete()) {
        ok = false;
        r.failure = pws::close_bad_payload;
      }
      if (!ok) {
        const char* why = r.failure == pws::close_too_big ? "a message over the limit"
                          : r.compressed                  ? "a message that does not inflate to UTF-8"
                                                          : "a text message that is not UTF-8";
        s.send_close_frame(r.failure, why);   // (closing: the frames that follow are read, their data skipped)
        s.reader_end(why);
      } else if (p.ends) {
        if constexpr (S::keeps_messages) {
          const auto d = s.deliver(sp, r.text, std::exchange(r.message, std::string()));
          if (d == delivered::paused) return;   // (the session calls take_pieces again)
          if (d == delivered::stop) {   // (closing: the frames that follow are read, their data skipped)
            s.closing = true;
            s.reader_end("");
          }
        }
      }
    }
  }
  start_reading(sp);
}

template <class S>
void start_reading(const std::shared_ptr<S>& sp) {
  auto& s = *sp;
  if (s.close_done) return reader_done(sp);
  if (s.rd.at < s.rd.end) return take_pieces(sp);
  // A client that sends (pings) and does not read: its pongs wait with everything else unsent;
  // past read_pause_bytes the reader stops reading until they have gone out.
  if ((s.out.buffered() > read_pause_bytes || s.pongs_pile_up()) && !s.out.failed() &&
      tcp_socket_of(s.out.next_layer()).is_open()) {
    auto pause = std::make_shared<asio::steady_timer>(s.out.get_executor(), std::chrono::milliseconds(20));
    pause->async_wait([sp, pause](boost::system::error_code) { start_reading(sp); });
    return;
  }
  s.out.async_read_some(asio::buffer(s.rd.chunk), [sp](boost::system::error_code ec, std::size_t n) {
    auto& s = *sp;
    if (ec) {
      s.clean_end = ec == asio::error::eof;
      return reader_done(sp);
    }
    s.heard = std::chrono::steady_clock::now();
    s.rd.at = 0;
    s.rd.end = n;
    take_pieces(sp);
  });
}

/// Walgate's end of a connection: the close frame (when none was sent), then the client's answer
/// (its close frame, or the end of its stream), awaited on timer (which the reader's end
/// cancels) at most close_timeout; then what is still queued goes out, over TLS walgate's
/// close_notify after it (each within close_timeout), and the socket is closed.
template <class Session>
awaitable<void> finish_close(Session& s, asio::steady_timer& timer, std::uint16_t code, std::string_view reason) {
  s.send_close_frame(code, reason);
  s.out.uncork();   // (a close frame the reader queued while a batch was being collected goes out now)
  const auto until = std::chrono::steady_clock::now() + close_timeout;
  while (s.reading && std::chrono::steady_clock::now() < until) {
    timer.expires_at(until);
    co_await timer.async_wait(use_tuple);
  }
  if (!s.reading && (s.close_done || s.clean_end)) {   // (the reader is done: the stream is the writer's alone)
    asio::steady_timer limit(s.out.get_executor());
    auto done = std::make_shared<bool>(false);
    limit.expires_after(close_timeout);
    limit.async_wait([&s, done](boost::system::error_code ec) {
      if (!ec && !*done) s.close_socket();   // (a completion already queued must not touch s)
    });
    auto [dec] = co_await s.out.async_drain(use_tuple);
    if constexpr (std::remove_reference_t<decltype(s.out)>::tls) {
      if (!dec) co_await s.out.next_layer().async_shutdown(use_tuple);
    }
    *done = true;
    limit.cancel();
  }
  s.close_socket();
}

/// Puts one event's message into the corked buffer — head and tail around its bytes when given
/// (a multiplexed subscription's envelope; in stored blocks around the shared compressed form,
/// deflate.hpp) — and adds the bytes it sends to bytes. A message sent from a spill file goes in
/// fragments, each drained before the next is read, rearm() called after each (the write
/// timeout is per piece). False when the connection failed (or Beast began closing it).
template <class Stream, class Rearm>
awaitable<bool> append_message(server_core& core, session<Stream>& s, const payload_ptr& p, std::string_view head,
                               std::string_view tail, std::size_t& bytes, Rearm&& rearm) {
  auto& out = s.out;
  if (!s.is_open()) co_return false;   // the connection is closing (a close frame sent or received)
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
    if (!s.is_open()) co_return false;   // closing meanwhile: no data frame after a close
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

/// The closing handshake: 1001 for a shutdown, 4001 when the client's token expired, 1008 when
/// its grants cannot be applied to a table (--policy rows), else 1013; with the reason (cut to
/// fit) and where to resume when there is a position. timer: as finish_close.
template <class Session>
awaitable<void> send_close(Session& s, asio::steady_timer& timer, subscription::end why_end, std::string_view reason,
                           std::string_view resume_id) {
  std::uint16_t code;
  std::string why;
  if (why_end == subscription::end::shutdown) {
    code = pws::close_going_away;
    why = "server shutting down";
  } else {
    code = why_end == subscription::end::expired ? close_token_expired
           : why_end == subscription::end::grant ? pws::close_policy
                                                 : pws::close_try_again_later;
    std::size_t n = std::min<std::size_t>(reason.size(), 85);
    while (n < reason.size() && n > 0 && (static_cast<unsigned char>(reason[n]) & 0xC0) == 0x80) --n;   // at a character
    why = std::string(reason.substr(0, n));
  }
  if (!resume_id.empty()) why += "; resume from " + std::string(resume_id);   // (close_frame cuts at 123 bytes, at a character)
  co_await finish_close(s, timer, code, why);
}

}  // namespace walgate::proxy::ws
