// The streaming loop of NDJSON and SSE over chunked HTTP/1.1: the response head, then the
// subscription's batches as chunks, idle keep-alives, and a last line that says why the stream
// ends and where to resume. What differs between the two — content type, what goes around an
// event, the keep-alive, the end line — is the Framing (ndjson.cpp, sse.cpp).
#pragma once

#include "serving.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/socket.h>

#include <cerrno>

namespace walgate::proxy::chunked {

namespace asio = boost::asio;
namespace beast = boost::beast;
using asio::awaitable;
inline constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

/// One HTTP chunk (nothing for no bytes), within the write timeout.
template <class Stream>
awaitable<boost::system::error_code> write_chunk(server_core& core, Stream& s, std::string_view bytes) {
  if (bytes.empty()) co_return boost::system::error_code{};
  beast::get_lowest_layer(s).expires_after(core.opts.write_timeout);
  auto [ec, n] = co_await asio::async_write(s, http::make_chunk(asio::buffer(bytes.data(), bytes.size())), use_tuple);
  co_return ec;
}

/// A large encoding as chunks: from memory at once, from a spill file a piece at a time (each
/// piece within the write timeout; memory for this client: one piece).
template <class Stream>
awaitable<boost::system::error_code> write_payload_chunks(server_core& core, Stream& s, const payload& p) {
  std::string piece;
  for (std::size_t off = 0; off < p.size(); off += piece_bytes) {
    std::size_t n = std::min(piece_bytes, p.size() - off);
    std::string_view view;
    if (p.spilled()) {
      piece.resize(n);
      std::string error;
      if (!p.read(off, piece, error)) {
        core.spill_read_failed(error);
        co_return make_error_code(boost::system::errc::io_error);
      }
      view = piece;
    } else {
      view = p.bytes().substr(off, n);   // (in memory: from the shared bytes, no copy)
    }
    auto ec = co_await write_chunk(core, s, view);
    if (ec) co_return ec;
  }
  co_return boost::system::error_code{};
}

/// The response head (chunked), within the write timeout: a coroutine of its own, so that the
/// response and its serializer are not kept in the frame of the stream's loop for its life.
template <class Stream>
awaitable<boost::system::error_code> write_head(server_core& core, Stream& s, unsigned version, const char* content_type,
                                                std::string_view cors) {
  http::response<http::empty_body> res{http::status::ok, version};
  res.set(http::field::server, "walgate");
  res.set(http::field::content_type, content_type);
  res.set(http::field::cache_control, "no-cache");
  res.set("X-Accel-Buffering", "no");
  set_cors(res, cors);
  res.chunked(true);
  http::response_serializer<http::empty_body> sr{res};
  beast::get_lowest_layer(s).expires_after(core.opts.write_timeout);
  auto [ec, n] = co_await http::async_write_header(s, sr, use_tuple);
  co_return ec;
}

template <class Framing, class Stream>
awaitable<void> serve(server_core& core, Stream& s, unsigned version, stream_start start, std::string_view cors,
                      Framing framing) {   // (by value: the entry points return this coroutine itself)
  client c(core, Framing::kind, std::move(start));
  c.force_close = [&s] { beast::get_lowest_layer(s).close(); };
  auto& sub = c.sub;

  if (co_await write_head(core, s, version, Framing::content_type, cors)) co_return;
  if (auto pre = framing.preamble(); !pre.empty()) {
    auto ec = co_await write_chunk(core, s, pre);
    if (ec) co_return;
  }
  // A client that hangs up while idle is noticed at once (not at the next keep-alive write),
  // so its slot is free for the next one. The client sends nothing after its request: the
  // socket turning readable with nothing to read is its end; bytes to read (a pipelined
  // request, a TLS alert) end the watch, and the next write finds out.
  auto alive = std::make_shared<bool>(true);
  struct watch_guard {
    std::shared_ptr<bool> alive;
    ~watch_guard() { *alive = false; }
  } watching{alive};
  auto& sock = beast::get_lowest_layer(s).socket();
  sock.async_wait(asio::ip::tcp::socket::wait_read, [alive, &c, &sock](boost::system::error_code ec) {
    if (!*alive || ec) return;
    if (peer_closed(sock.native_handle())) {
      c.sub.close(subscription::end::client_gone, "the client closed the connection");
      c.wake.cancel();
    }
  });
  std::vector<subscription::item> batch;
  std::string out;
  std::uint64_t seen = core.notifications;
  bool trimmed = true, idle = false;   // (no buffers yet)
  std::chrono::steady_clock::time_point idle_since{};
  while (!core.stopping && !sub.ended()) {
    if (core.behind_live(sub, seen)) co_await asio::post(core.executor, asio::use_awaitable);   // live clients first
    if (core.stopping || sub.ended()) break;
    sub.next_batch(batch);
    if (sub.ended()) break;
    out.clear();
    if (batch.empty() && sub.pending()) {   // passed over events its filters do not take: go on after the others
      co_await asio::post(core.executor, asio::use_awaitable);
      continue;
    }
    if (batch.empty()) {
      // Idle: it keeps its buffers for keep_buffers_for (a client of a steady stream has a batch
      // again by then), then gives them back while it waits (the next burst makes them again,
      // once). After --keepalive idle (or since the last keep-alive), a keep-alive line.
      const auto now = std::chrono::steady_clock::now();
      if (!idle) idle_since = now;
      idle = true;
      if (!trimmed && now >= idle_since + keep_buffers_for) {
        std::vector<subscription::item>().swap(batch);
        std::string().swap(out);
        trimmed = true;
      }
      if (now < idle_since + core.opts.keepalive) {
        c.wake.expires_at(trimmed ? idle_since + core.opts.keepalive
                                  : std::min(idle_since + keep_buffers_for, idle_since + core.opts.keepalive));
        co_await c.wake.async_wait(use_tuple);
        continue;
      }
      out = Framing::keepalive;   // idle keep-alive (its few bytes kept: it stays idle)
      idle_since = now;
    } else {
      idle = trimmed = false;
    }
    // Small events are copied into one chunk; a large one goes from where it is: from memory
    // as a chunk of its own, from its spill file in pieces.
    std::size_t sent = 0;
    boost::system::error_code ec;
    for (const auto& item : batch) {
      const auto& p = item.bytes;
      framing.before(out, item);
      if (p->spilled() || p->size() >= large_payload) {
        sent += out.size() + p->size();
        ec = co_await write_chunk(core, s, out);
        if (ec) break;
        out.clear();
        ec = co_await write_payload_chunks(core, s, *p);
        if (ec) break;
      } else {
        out += p->bytes();
      }
      out += Framing::after;
    }
    if (!ec) {
      sent += out.size();
      ec = co_await write_chunk(core, s, out);
    }
    if (ec) {
      if (ec == beast::error::timeout) {
        sub.close(subscription::end::slow, "slow client: a write took too long");
        if (sub.why() != subscription::end::slow) ++core.disconnected_slow;   // (it had hung up meanwhile)
      }
      c.finished();
      co_return;
    }
    if (!batch.empty()) c.delivered(batch.back(), batch.size(), sent);
    // The buffer is kept while batches follow one another (a client catching up reuses it:
    // no allocation of a batch's size per batch); it is given back when the client is idle
    // (above), and one grown past that (it never should: larger events go from where they are).
    if (out.capacity() > 2 * core.opts.batch_bytes + (1u << 20)) out = std::string();
  }
  c.finished();
  if (core.stopping) sub.close(subscription::end::shutdown, "server shutting down");
  // A last line that says why, and where to resume.
  std::string tail = framing.end(end_line(sub.reason(), sub.resume_id()));
  beast::get_lowest_layer(s).expires_after(std::chrono::seconds(5));
  co_await asio::async_write(s, http::make_chunk(asio::buffer(tail)), use_tuple);
  co_await asio::async_write(s, http::make_chunk_last(), use_tuple);
}

}  // namespace walgate::proxy::chunked

/// Instantiates a transport's entry point for plain and TLS connections.
#define WALGATE_INSTANTIATE_HTTP_TRANSPORT(fn)                                                                  \
  template boost::asio::awaitable<void> fn<boost::beast::tcp_stream>(                                           \
      server_core&, boost::beast::tcp_stream&, unsigned, stream_start, std::string_view);                      \
  template boost::asio::awaitable<void> fn<boost::beast::ssl_stream<boost::beast::tcp_stream>>(                \
      server_core&, boost::beast::ssl_stream<boost::beast::tcp_stream>&, unsigned, stream_start, std::string_view);
