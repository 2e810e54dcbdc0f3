// NDJSON and SSE over chunked HTTP/1.1: the response head, then the subscription's batches as
// chunks, idle keep-alives, and a last line that says why the stream ends and where to resume
// (the loop is pump.hpp's, shared with WebSocket; writer below is this side of it). What differs
// between the two — content type, what goes around an event, the keep-alive, the end line — is
// the Framing (ndjson.cpp, sse.cpp).
#pragma once

#include "pump.hpp"
#include "serving.hpp"
#include "socket_sender.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace walgate::proxy::chunked {

namespace asio = boost::asio;
namespace beast = boost::beast;
using asio::awaitable;
inline constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

/// The socket under a stream (a bare socket for plain TCP, the Beast stream's under TLS).
template <class Stream>
asio::ip::tcp::socket& socket_of(Stream& s) {
  if constexpr (std::is_same_v<Stream, asio::ip::tcp::socket>) return s;
  else return beast::get_lowest_layer(s).socket();
}

/// A plain-TCP stream's writes made by the sender threads (--send-threads; socket_sender.hpp),
/// one at a time: write() hands the bytes to a sender thread and waits until it gives them back;
/// what the socket did not take then goes from the loop (counted in socket_sender::partial). While a write is out the socket stays
/// open (close(): shut down at once, closed when the write is back), and the bytes, which the
/// stream's frames hold, are not freed before it is back (write()'s frame, destroyed first when
/// the loop's coroutines are destroyed at shutdown, waits for the sender thread to be done).
class offloaded_writes {
 public:
  offloaded_writes(std::shared_ptr<socket_sender> sender, asio::ip::tcp::socket& sock)
      : sender_(std::move(sender)), sock_(sock), back_(sock.get_executor()) {}
  offloaded_writes(const offloaded_writes&) = delete;
  offloaded_writes& operator=(const offloaded_writes&) = delete;
  ~offloaded_writes() {
    if (flight_) flight_->owner = nullptr;   // (a write given back later finds no one)
  }

  template <class Buffers>
  awaitable<boost::system::error_code> write(const Buffers& buffers) {
    if (!flight_) {
      flight_ = std::make_shared<send_flight>();
      flight_->owner = this;
      flight_->done = [](void* owner, send_flight&) { static_cast<offloaded_writes*>(owner)->back(); };
    }
    auto& f = *flight_;
    f.fd = sock_.native_handle();
    f.iov.clear();
    f.total = 0;
    std::vector<asio::const_buffer> all;
    for (auto it = asio::buffer_sequence_begin(buffers); it != asio::buffer_sequence_end(buffers); ++it) {
      asio::const_buffer b(*it);
      if (!b.size()) continue;
      all.push_back(b);
      f.iov.push_back({const_cast<void*>(b.data()), b.size()});
      f.total += b.size();
    }
    struct wait_if_out {   // (this frame ends mid-write only when the loop's coroutines are destroyed)
      offloaded_writes& o;
      ~wait_if_out() {
        if (!o.in_flight_) return;
        o.sender_->wake();   // (queued, its wake-up perhaps posted to the loop, which no longer runs)
        while (!o.flight_->sent.load(std::memory_order_acquire)) std::this_thread::yield();
        o.flight_->owner = nullptr;
        o.in_flight_ = false;
      }
    } guard{*this};
    sender_->submit(flight_);
    in_flight_ = true;   // (after: a submit that throws leaves nothing out; it is given back only on the loop)
    while (in_flight_) {
      back_.expires_at(asio::steady_timer::time_point::max());
      co_await back_.async_wait(use_tuple);
    }
    if (close_after_) {
      boost::system::error_code ignored;
      sock_.close(ignored);
      co_return asio::error::operation_aborted;
    }
    if (f.error) co_return boost::system::error_code(f.error, boost::system::system_category());
    if (f.written == f.total) co_return boost::system::error_code{};
    ++sender_->partial;
    // The socket is full: the rest from here, when it can take it.
    std::size_t skip = f.written, first = 0;
    while (first < all.size() && skip >= all[first].size()) skip -= all[first++].size();
    std::vector<asio::const_buffer> rest(all.begin() + static_cast<std::ptrdiff_t>(first), all.end());
    if (!rest.empty()) rest.front() += skip;
    auto [ec, n] = co_await asio::async_write(sock_, rest, use_tuple);
    co_return ec;
  }

  /// Closes the socket: when a sender thread is writing to it, once that write is back (until
  /// then it is shut down both ways).
  void close() {
    boost::system::error_code ignored;
    if (in_flight_) {
      close_after_ = true;
      sock_.shutdown(asio::socket_base::shutdown_both, ignored);
      return;
    }
    sock_.close(ignored);
  }

  /// An idle stream keeps no flight.
  void trim() {
    if (!in_flight_ && flight_) {
      flight_->owner = nullptr;
      flight_.reset();
    }
  }

 private:
  void back() {
    in_flight_ = false;
    back_.cancel();
  }

  std::shared_ptr<socket_sender> sender_;
  asio::ip::tcp::socket& sock_;
  asio::steady_timer back_;   // cancelled when the write is back (a condition)
  std::shared_ptr<send_flight> flight_;
  bool in_flight_ = false;
  bool close_after_ = false;
};

/// Shared by the stream's loop and the handlers that outlive a moment of it (the hang-up
/// watch, the write timeout): whether the loop still runs, and whether a write timed out.
struct watch_state {
  bool alive = true;
  bool timed_out = false;
  std::uint64_t writes = 0;    // writes begun
  std::uint64_t writing = 0;   // the one in flight (0: none)
  offloaded_writes* offload = nullptr;   // its writes go to the sender threads (valid while alive)
};

/// Closes the stream's socket (through its sender threads' writes when it has them).
inline void close_socket(watch_state& w, asio::ip::tcp::socket& sock) {
  if (w.offload) return w.offload->close();
  boost::system::error_code ignored;
  sock.close(ignored);
}

/// One write within a timeout: the client's watchdog is armed for it, and when it ends first
/// the socket is closed (the write fails; beast::error::timeout is returned).
template <class Stream, class Buffers>
awaitable<boost::system::error_code> timed_write(client& c, Stream& s, const std::shared_ptr<watch_state>& w,
                                                 const Buffers& buffers, std::chrono::milliseconds timeout) {
  // (A handler already queued when its write ended is not withdrawn by cancel(): it acts only
  // while its own write is still in flight.)
  const std::uint64_t write = ++w->writes;
  w->writing = write;
  c.watchdog.expires_after(timeout);
  c.watchdog.async_wait([w, write, &sock = socket_of(s)](boost::system::error_code ec) {
    if (ec || !w->alive || w->writing != write) return;   // (cancelled, the write ended, or the loop: the socket is gone)
    w->timed_out = true;
    close_socket(*w, sock);
  });
  boost::system::error_code ec;
  if (w->offload) ec = co_await w->offload->write(buffers);
  else std::tie(ec, std::ignore) = co_await asio::async_write(s, buffers, use_tuple);
  w->writing = 0;
  c.watchdog.cancel();
  if (ec && w->timed_out) ec = beast::error::timeout;
  co_return ec;
}

/// One HTTP chunk (nothing for no bytes), within the write timeout.
template <class Stream>
awaitable<boost::system::error_code> write_chunk(client& c, Stream& s, const std::shared_ptr<watch_state>& w,
                                                 std::string_view bytes) {
  if (bytes.empty()) co_return boost::system::error_code{};
  co_return co_await timed_write(c, s, w, http::make_chunk(asio::buffer(bytes.data(), bytes.size())),
                                 c.core.opts.write_timeout);
}

/// A large encoding as chunks: from memory at once, from a spill file a piece at a time (each
/// piece within the write timeout; memory for this client: one piece).
template <class Stream>
awaitable<boost::system::error_code> write_payload_chunks(client& c, Stream& s, const std::shared_ptr<watch_state>& w,
                                                          const payload& p) {
  std::string piece;
  for (std::size_t off = 0; off < p.size(); off += piece_bytes) {
    std::size_t n = std::min(piece_bytes, p.size() - off);
    std::string_view view;
    if (p.spilled()) {
      piece.resize(n);
      std::string error;
      if (!p.read(off, piece, error)) {
        c.core.spill_read_failed(error);
        co_return make_error_code(boost::system::errc::io_error);
      }
      view = piece;
    } else {
      view = p.bytes().substr(off, n);   // (in memory: from the shared bytes, no copy)
    }
    auto ec = co_await write_chunk(c, s, w, view);
    if (ec) co_return ec;
  }
  co_return boost::system::error_code{};
}

/// The response head (chunked) and the framing's preamble, within the write timeout: a
/// coroutine of its own, so that the response and its serializer are not kept in the frame of
/// the stream's loop for its life.
template <class Stream>
awaitable<boost::system::error_code> write_head(client& c, Stream& s, const std::shared_ptr<watch_state>& w,
                                                unsigned version, const char* content_type, std::string_view cors,
                                                std::string preamble) {
  http::response<http::empty_body> res{http::status::ok, version};
  res.set(http::field::server, "walgate");
  res.set(http::field::content_type, content_type);
  res.set(http::field::cache_control, "no-cache");
  res.set("X-Accel-Buffering", "no");
  set_cors(res, cors);
  res.chunked(true);
  http::response_serializer<http::empty_body> sr{res};
  std::string head;
  {
    // The head is made here (the serializer's buffers copied out), and sent with the
    // preamble's chunk in one write.
    boost::system::error_code ec;
    sr.split(true);
    std::size_t n = 0;
    sr.next(ec, [&](boost::system::error_code&, const auto& buffers) {
      for (auto b : beast::buffers_range_ref(buffers)) head.append(static_cast<const char*>(b.data()), b.size());
      n = beast::buffer_bytes(buffers);
    });
    if (ec) co_return ec;
    sr.consume(n);
  }
  if (!preamble.empty()) {
    char size[20];
    head.append(size, static_cast<std::size_t>(std::snprintf(size, sizeof size, "%zx\r\n", preamble.size())));
    head += preamble;
    head += "\r\n";
  }
  co_return co_await timed_write(c, s, w, asio::buffer(head), c.core.opts.write_timeout);
}

/// The stream's last line (why it ends, where to resume) and the chunked body's end, both
/// within 5 s.
template <class Stream>
awaitable<void> write_end(client& c, Stream& s, const std::shared_ptr<watch_state>& w, std::string tail) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  if (co_await timed_write(c, s, w, http::make_chunk(asio::buffer(tail)), left())) co_return;
  co_await timed_write(c, s, w, http::make_chunk_last(), left());
}

/// One NDJSON or SSE stream, owning its connection — s (a bare socket, or a TLS stream) and hold
/// (what the connection holds while it lives) — and its client: pump.hpp's serve_stream runs
/// it (begin: the response head; send: its batches as chunks, its keep-alive line; end: the last
/// line). What it starts from is freed once the head is written (not kept for the stream's life).
template <class Framing, class Stream>
class connection {
 public:
  connection(server_core& core, Stream s, std::unique_ptr<chunked_start> start, connection_hold hold, Framing framing)
      : core_(core),
        s_(std::move(s)),
        hold_(std::move(hold)),
        framing_(std::move(framing)),
        start_(std::move(start)),
        c_(core, Framing::kind, std::move(start_->start)),
        w_(std::make_shared<watch_state>()) {
    if constexpr (!std::is_same_v<Stream, asio::ip::tcp::socket>)
      beast::get_lowest_layer(s_).expires_never();   // (the write timeout is the client's watchdog)
    // Over plain TCP, with sender threads, they write (docs/architecture.md, Threads).
    if constexpr (std::is_same_v<Stream, asio::ip::tcp::socket>) {
      if (core.sender) {
        offload_.emplace(core.sender, socket_of(s_));
        w_->offload = &*offload_;
      }
    }
  }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  /// The watch's state: the stream runs (alive) — handlers that run after it ended touch nothing.
  ~connection() { w_->alive = false; }

  /// A failed write ends the stream there: no last line.
  static constexpr bool says_why_after_failure = false;

  client& c() { return c_; }

  awaitable<bool> begin() {
    auto ec = co_await write_head(c_, s_, w_, start_->version, Framing::content_type, start_->cors, framing_.preamble());
    start_.reset();
    if (ec) co_return false;
    // A client that hangs up while idle is noticed at once (not at the next keep-alive write),
    // so its slot is free for the next one. The client sends nothing after its request: the
    // socket turning readable with nothing to read is its end; bytes to read (a pipelined
    // request, a TLS alert) end the watch, and the next write finds out.
    auto& sock = socket_of(s_);
    sock.async_wait(asio::ip::tcp::socket::wait_read, [w = w_, &c = c_, &sock](boost::system::error_code ec) {
      if (!w->alive || ec || w->timed_out) return;   // (timed out: the socket shut down by walgate, not the client)
      if (peer_closed(sock.native_handle())) {
        c.sub.close(subscription::end::client_gone, "the client closed the connection");
        c.wake.cancel();
      }
    });
    co_return true;
  }

  void trim() {
    std::string().swap(out_);
    if (offload_) offload_->trim();
  }

  /// After --keepalive idle (or since the last keep-alive), a keep-alive line.
  idle_step idle(std::chrono::steady_clock::time_point now, std::chrono::steady_clock::time_point idle_since,
                 bool trimmed) const {
    if (now < idle_since + core_.opts.keepalive)
      return {idle_step::wait, trimmed ? idle_since + core_.opts.keepalive
                                       : std::min(idle_since + keep_buffers_for, idle_since + core_.opts.keepalive)};
    return {idle_step::keepalive, {}};
  }

  /// The batch's events (an empty batch: the keep-alive line) in chunks: the bytes sent, or
  /// nullopt when a write failed (a write that timed out closes the subscription: slow).
  awaitable<std::optional<std::size_t>> send(const std::vector<subscription::item>& batch) {
    if (batch.empty()) out_ = Framing::keepalive;   // idle keep-alive (its few bytes kept: it stays idle)
    else out_.clear();
    // Small events are copied into one chunk; a large one goes from where it is: from memory
    // as a chunk of its own, from its spill file in pieces.
    std::size_t sent = 0;
    boost::system::error_code ec;
    for (const auto& item : batch) {
      const auto& p = item.bytes;
      framing_.before(out_, item);
      if (p->spilled() || p->size() >= large_payload) {
        sent += out_.size() + p->size();
        ec = co_await write_chunk(c_, s_, w_, out_);
        if (ec) break;
        out_.clear();
        ec = co_await write_payload_chunks(c_, s_, w_, *p);
        if (ec) break;
      } else {
        out_ += p->bytes();
      }
      out_ += Framing::after;
    }
    if (!ec) {
      sent += out_.size();
      ec = co_await write_chunk(c_, s_, w_, out_);
    }
    if (ec) {
      if (ec == beast::error::timeout) {
        c_.sub.close(subscription::end::slow, "slow client: a write took too long");
        if (c_.sub.why() != subscription::end::slow) ++core_.disconnected_slow;   // (it had hung up meanwhile)
      }
      co_return std::nullopt;
    }
    // The buffer is kept while batches follow one another (a client catching up reuses it:
    // no allocation of a batch's size per batch); it is given back when the client is idle
    // (trim), and one grown past that (it never should: larger events go from where they are).
    if (out_.capacity() > 2 * core_.opts.batch_bytes + (1u << 20)) out_ = std::string();
    co_return sent;
  }

  /// A last line that says why, and where to resume (none after a failed write).
  awaitable<void> end(bool failed) {
    std::string().swap(out_);
    if (failed) co_return;
    co_await write_end(c_, s_, w_, framing_.end(end_line(c_.sub.reason(), c_.sub.resume_id())));
  }

 private:
  server_core& core_;
  Stream s_;
  connection_hold hold_;   // (held to the end; destroyed before the socket)
  Framing framing_;
  std::unique_ptr<chunked_start> start_;
  client c_;
  std::shared_ptr<watch_state> w_;
  std::optional<offloaded_writes> offload_;
  std::string out_;
};

/// The stream (connection, above), served by pump.hpp's loop: the coroutine returned is the
/// stream's only one (this function has no frame of its own).
template <class Framing, class Stream>
awaitable<void> serve(server_core& core, Stream s, std::unique_ptr<chunked_start> start, connection_hold hold,
                      Framing framing) {
  return serve_stream(core, std::make_unique<connection<Framing, Stream>>(core, std::move(s), std::move(start),
                                                                           std::move(hold), std::move(framing)));
}

}  // namespace walgate::proxy::chunked

/// Instantiates a transport's entry point for plain and TLS connections.
#define WALGATE_INSTANTIATE_HTTP_TRANSPORT(fn)                                                                  \
  template boost::asio::awaitable<void> fn<boost::asio::ip::tcp::socket>(                                       \
      server_core&, boost::asio::ip::tcp::socket, std::unique_ptr<chunked_start>, connection_hold);             \
  template boost::asio::awaitable<void> fn<boost::beast::ssl_stream<boost::beast::tcp_stream>>(                \
      server_core&, boost::beast::ssl_stream<boost::beast::tcp_stream>, std::unique_ptr<chunked_start>,         \
      connection_hold);
