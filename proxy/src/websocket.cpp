// WebSocket (GET /v1/ws): one text message per event, the frames made here and a batch sent in
// one write (corked_stream.hpp). With permessage-deflate, walgate answers
// server_no_context_takeover and sends each event's compressed form, made once and shared by
// every client of that window (payload::deflated); small and large messages go uncompressed.
// Beast negotiates, reads (and inflates) the client's messages, and keeps an idle connection
// alive with its pings; the end is a close frame whose reason says why and where to resume.
#include "corked_stream.hpp"
#include "serving.hpp"

#include "walgate/proxy/deflate.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>

#include <optional>

namespace walgate::proxy {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using asio::awaitable;

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

/// A WebSocket client: the stream and its client, shared by the writer (serve_websocket) and
/// the reader coroutine, so whichever ends last frees them.
/// The client is registered from the accepted handshake until the writer ends (the reader may
/// outlive it by a moment, and never touches the server after).
template <class Stream>
struct ws_session {
  explicit ws_session(Stream&& s) : ws(std::move(s)) {}
  websocket::stream<corked_stream<Stream>> ws;
  std::optional<client> c;
  bool reading = true;
  std::string extensions;   // the Sec-WebSocket-Extensions walgate answered
};

}  // namespace

template <class Stream>
awaitable<void> serve_websocket(server_core& core, Stream s, http::request<http::empty_body> req, stream_start start) {
  auto session = std::make_shared<ws_session<Stream>>(std::move(s));
  auto& ws = session->ws;
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
  ws.set_option(websocket::stream_base::decorator([ext = &session->extensions](websocket::response_type& res) {
    res.set(http::field::server, "walgate");
    *ext = std::string(res[http::field::sec_websocket_extensions]);   // (Beast's answer is made by now)
  }));
  auto [aec] = co_await ws.async_accept(req, use_tuple);
  if (aec) co_return;
  // The window walgate compresses with: the one it answered (0: none negotiated).
  int deflate_bits = 0;
  if (auto a = parse_pmd_answer(session->extensions); a && a->server_no_context_takeover) deflate_bits = a->server_max_window_bits;

  session->c.emplace(core, transport::websocket, std::move(start));
  struct release {   // the writer's end, however it ends: the client leaves the server
    ws_session<Stream>& s;
    ~release() { s.c.reset(); }
  } released{*session};
  auto& c = *session->c;
  auto& sub = c.sub;
  if (deflate_bits) sub.set_deflate(deflate_bits);
  c.force_close = [&ws] {
    boost::system::error_code ec;
    beast::get_lowest_layer(ws).socket().close(ec);
  };

  // The reader answers pings, enforces the message limit (1009) and UTF-8 (1007); walgate
  // expects nothing from clients, so a message is read and dropped.
  asio::co_spawn(
      core.executor,
      [session]() -> awaitable<void> {
        beast::flat_buffer b;
        while (true) {
          auto [ec, n] = co_await session->ws.async_read(b, use_tuple);
          if (ec) break;
          b.consume(b.size());
        }
        session->reading = false;
        if (session->c) {   // (the writer still runs)
          session->c->sub.close(subscription::end::client_gone, "the client closed the connection");
          session->c->wake.cancel();
        }
      },
      asio::detached);

  std::vector<subscription::item> batch;
  ws.text(true);
  bool failed = false;
  // The batch's frames are collected and sent in one write. A batch that takes longer than
  // write_timeout to go out: the client does not read; close it.
  auto arm_watchdog = [&c, &opts, w = std::weak_ptr<ws_session<Stream>>(session)] {
    c.watchdog.expires_after(opts.write_timeout);
    c.watchdog.async_wait([w](boost::system::error_code ec) {
      auto s = w.lock();
      if (ec || !s || !s->c) return;   // (the writer may have ended with the handler queued)
      s->c->sub.close(subscription::end::slow, "slow client: a write took too long");
      s->c->force_close();
    });
  };
  while (!core.stopping && !sub.ended()) {
    sub.next_batch(batch);
    if (sub.ended()) break;
    if (batch.empty() && sub.pending()) {   // passed over events its filters do not take: go on after the others
      co_await asio::post(core.executor, asio::use_awaitable);
      continue;
    }
    if (batch.empty()) {
      c.wake.expires_after(opts.keepalive);
      co_await c.wake.async_wait(use_tuple);
      continue;
    }
    arm_watchdog();
    ws.next_layer().cork();
    std::size_t bytes = 0;
    for (const auto& item : batch) {
      const auto& p = item.bytes;
      if (!ws.is_open()) {   // Beast has begun closing (a protocol error from the client)
        failed = true;
        break;
      }
      const std::string* z = deflate_bits ? p->deflated(deflate_bits) : nullptr;
      if (z && z->size() < 1024) {
        ws.next_layer().append_text_frame(*z, true);
      } else if (z) {
        ws.next_layer().append_text_frame(p, *z, true);   // sent from the shared compressed form
      } else if (!p->spilled() && p->size() < large_payload) {
        ws.next_layer().append_text_frame(p->bytes());
      } else if (!p->spilled() && p->size() < opts.spill_bytes) {
        ws.next_layer().append_text_frame(p, p->bytes());   // sent from the shared encoding
      } else {
        // In pieces, each sent before the next is read from the spill file: a message in
        // fragments, pings and pongs between them.
        auto piece = std::make_shared<std::string>();
        for (std::size_t off = 0; off < p->size() && !failed; off += piece_bytes) {
          if (!ws.is_open()) {   // Beast closed meanwhile: no data frame after its close
            failed = true;
            break;
          }
          std::size_t n = std::min(piece_bytes, p->size() - off);
          std::string_view view;
          if (p->spilled()) {
            piece->resize(n);
            std::string error;
            if (!p->read(off, *piece, error)) {
              core.spill_read_failed(error);
              failed = true;
              break;
            }
            view = *piece;
          } else {
            view = p->bytes().substr(off, n);
          }
          std::shared_ptr<const void> keep = p;
          if (p->spilled()) keep = piece;
          ws.next_layer().append_text_fragment(std::move(keep), view, off == 0, off + n == p->size());
          auto [pec] = co_await ws.next_layer().async_drain(use_tuple);
          if (pec) failed = true;
          ws.next_layer().cork();
          arm_watchdog();   // each piece within the write timeout
        }
      }
      if (failed) break;
      bytes += z ? z->size() : p->size();
    }
    auto [dec] = co_await ws.next_layer().async_drain(use_tuple);
    c.watchdog.cancel();
    if (failed || dec) {
      failed = true;
      break;
    }
    c.delivered(batch.back(), batch.size(), bytes);
  }
  c.finished();
  if (core.stopping) sub.close(subscription::end::shutdown, "server shutting down");
  if (!failed && session->reading) {
    // Still open: say why it ends, and where to resume.
    websocket::close_reason why;
    if (sub.why() == subscription::end::shutdown) {
      why.code = websocket::close_code::going_away;
      why.reason = "server shutting down";
    } else {
      why.code = websocket::close_code::try_again_later;
      why.reason = sub.reason().substr(0, 85);   // ASCII: cut anywhere
    }
    if (!sub.resume_id().empty()) why.reason += "; resume from " + sub.resume_id();
    if (why.reason.size() > 123) why.reason.resize(123);
    co_await ws.async_close(why, use_tuple);
  }
  // The reader ends (if it has not) when the socket closes; it holds the session till then.
  if (session->reading) c.force_close();
}

template awaitable<void> serve_websocket<beast::tcp_stream>(server_core&, beast::tcp_stream,
                                                            http::request<http::empty_body>, stream_start);
template awaitable<void> serve_websocket<beast::ssl_stream<beast::tcp_stream>>(server_core&,
                                                                               beast::ssl_stream<beast::tcp_stream>,
                                                                               http::request<http::empty_body>,
                                                                               stream_start);

}  // namespace walgate::proxy
