// A WebSocket connection's stream: it collects what walgate writes — data frames, pings, pongs,
// the close frame — and sends it in one write: a batch of events for a client is one system
// call, not one per event. Internal to websocket.cpp (Beast stays out of shared headers).
//
//   cork()          writes from now on are only buffered (each completes at once)
//   async_drain()   uncork, and wait until everything buffered is sent or the write failed
//
// While uncorked (between batches), a write — a pong the reader sends, a keep-alive ping, the
// close frame — starts sending at once. One write to the next layer is in flight at a
// time; what arrives meanwhile waits in the buffer and goes with the next one. Memory: the server
// corks one bounded batch at a time and drains it before the next, so the buffer holds at most
// one batch plus control frames. A large event is not copied here: its bytes are referenced where
// they are (the shared encoding, or the one piece read from its spill file), and a very large one
// goes as a message in fragments, drained one at a time, with control frames between them.
#pragma once

#include <boost/asio/async_result.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/stream_traits.hpp>

#include "socket_sender.hpp"
#include "walgate/proxy/http_policy.hpp"

#include <sys/socket.h>

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace walgate::proxy {

/// The TCP socket under a stream: the stream itself (a bare socket), or the socket of its lowest
/// layer (Beast's tcp_stream, under TLS or not).
template <class Stream>
auto& tcp_socket_of(Stream& s) {
  auto& low = boost::beast::get_lowest_layer(s);
  if constexpr (requires { low.socket(); }) return low.socket();
  else return low;
}

template <class Next>
class corked_stream {
 public:
  using executor_type = typename Next::executor_type;
  using next_layer_type = Next;
  /// Whether there is a layer (TLS) between this and the TCP stream.
  static constexpr bool tls =
      !std::is_same_v<Next, std::remove_cvref_t<decltype(boost::beast::get_lowest_layer(std::declval<Next&>()))>>;

  template <class... Args>
  explicit corked_stream(Args&&... args)
      : next_(std::forward<Args>(args)...), drained_(next_.get_executor()) {}
  corked_stream(corked_stream&&) = delete;
  ~corked_stream() {
    *alive_ = false;
    if constexpr (!tls) {
      if (in_flight_) {   // a sender thread may be writing: the socket and the bytes go with the flight
        boost::system::error_code ec;
        flight_->owner = nullptr;
        flight_->orphan_fd = tcp_socket_of(next_).release(ec);
        if (ec) flight_->orphan_fd = -1;
        flight_->hold = std::make_shared<std::vector<part>>(std::move(sending_));   // (the parts stay where they are)
      }
    }
  }

  /// From now on its writes are made by sender's threads (socket_sender.hpp; plain TCP only:
  /// over TLS they stay the loop's, through the TLS stream).
  void send_with(std::shared_ptr<socket_sender> sender) {
    if constexpr (!tls) sender_ = std::move(sender);
  }

  /// Closes the socket — when a sender thread is writing to it, once that write is back (until
  /// then it is shut down both ways: the client sees the end, the reader its end of stream).
  void close() {
    boost::system::error_code ec;
    if constexpr (!tls) {
      if (in_flight_) {
        close_after_flight_ = true;
        tcp_socket_of(next_).shutdown(boost::asio::socket_base::shutdown_both, ec);
        return;
      }
    }
    tcp_socket_of(next_).close(ec);
  }

  executor_type get_executor() noexcept { return next_.get_executor(); }
  Next& next_layer() noexcept { return next_; }
  const Next& next_layer() const noexcept { return next_; }

  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers& b, Token&& token) {
    return next_.async_read_some(b, std::forward<Token>(token));
  }

  /// Bytes that are whole frames (or the handshake's answer), copied.
  void append_bytes(std::string_view bytes) {
    if (failed_ || shutdown_) return;
    append_owned(bytes);
    if (!corked_) start_send();
  }

  /// Once everything appended so far is sent, the socket's sending side is shut down (after a
  /// close frame: the client reads it, then the end of the stream); nothing is appended after.
  void shutdown_after_sent() {
    shutdown_ = true;
    corked_ = false;
    start_send();
    shutdown_if_sent();
  }

  void cork() { corked_ = !shutdown_; }   // (after shutdown_after_sent, what is queued goes out as it can)
  /// Writes go out as they come again (what was buffered starts sending now), without waiting.
  void uncork() {
    corked_ = false;
    start_send();
  }

  /// Appends an unmasked WebSocket text frame (FIN set) holding payload — compressed: a
  /// permessage-deflate message (RSV1), made once for every client (deflate.hpp) — made here so
  /// a batch costs no composed operation per event. Every frame is appended whole, so frames
  /// never interleave mid-frame.
  void append_text_frame(std::string_view payload, bool compressed = false) {
    if (failed_ || shutdown_) return;
    char head[10];
    std::size_t h = websocket_text_frame_header(head, payload.size(), true, true, compressed);
    append_owned({head, h});
    append_owned(payload);
    if (!corked_) start_send();
  }
  /// The same, the payload's bytes sent from where they are (kept alive by keep), not copied.
  void append_text_frame(std::shared_ptr<const void> keep, std::string_view payload, bool compressed = false) {
    append_text_fragment(std::move(keep), payload, true, true, compressed);
  }
  /// One text frame of head, body and tail (a multiplexed subscription's envelope around an
  /// event): head and tail copied, body sent from where it is when keep holds it (else copied).
  void append_text_frame(std::string_view head, std::shared_ptr<const void> keep, std::string_view body,
                         std::string_view tail, bool compressed = false) {
    if (failed_ || shutdown_) return;
    char frame_head[10];
    std::size_t h = websocket_text_frame_header(frame_head, head.size() + body.size() + tail.size(), true, true, compressed);
    append_owned({frame_head, h});
    append_owned(head);
    if (keep) append_ref(std::move(keep), body);
    else append_owned(body);
    append_owned(tail);
    if (!corked_) start_send();
  }
  /// One fragment of a text message sent in pieces (RFC 6455 5.4), its bytes sent from where
  /// they are: first opens the message, last ends it. Control frames (pings, pongs, a close)
  /// go between fragments, so a message that takes minutes to send does not starve them.
  void append_text_fragment(std::shared_ptr<const void> keep, std::string_view bytes, bool first, bool last,
                            bool compressed = false) {
    if (failed_ || shutdown_) return;
    char head[10];
    std::size_t h = websocket_text_frame_header(head, bytes.size(), first, last, compressed);
    append_owned({head, h});
    append_ref(std::move(keep), bytes);
    if (!corked_) start_send();
  }

  /// Uncorks and completes when the buffer is empty and nothing is in flight; the error of a
  /// failed write, if one failed.
  template <class Token>
  auto async_drain(Token&& token) {
    corked_ = false;
    start_send();
    return boost::asio::async_compose<Token, void(boost::system::error_code)>(
        [this](auto& self, boost::system::error_code = {}) {
          if (failed_ || (sending_.empty() && pending_.empty())) return self.complete(failed_);
          drained_.expires_at(boost::asio::steady_timer::time_point::max());
          drained_.async_wait(std::move(self));
        },
        token, drained_);
  }

  /// The spare buffer is given back, and with nothing buffered or in flight the lists' memory
  /// too (an idle connection keeps none; the next batch makes them again).
  void trim() {
    std::string().swap(spare_);   // (never part of a write in flight)
    if (!sending_.empty() || !pending_.empty()) return;
    std::vector<part>().swap(pending_);
    std::vector<part>().swap(sending_);
    std::vector<boost::asio::const_buffer>().swap(buffers_);
    flight_.reset();   // (none is out: sending_ is empty)
  }

  bool failed() const { return bool(failed_); }

  /// Writes that have completed (each takes everything pending when it starts), and whether
  /// one is out now: what was appended before is sent once writes_done() passes
  /// writes_done() + (writing() ? 2 : 1) as counted then.
  std::uint64_t writes_done() const { return writes_done_; }
  bool writing() const { return !sending_.empty(); }

  std::size_t buffered() const {
    std::size_t n = 0;
    for (const auto& p : pending_) n += p.size();
    for (const auto& p : sending_) n += p.size();
    return n;
  }

 private:
  /// Bytes to send: copied here (owned), or referenced where they are (kept alive by keep).
  void append_ref(std::shared_ptr<const void> keep, std::string_view bytes) {
    if (bytes.empty()) return;
    pending_.push_back({{}, std::move(keep), bytes});
  }

  struct part {
    std::string owned;
    std::shared_ptr<const void> keep;
    std::string_view ref;
    std::size_t size() const { return keep ? ref.size() : owned.size(); }
    boost::asio::const_buffer buffer() const { return keep ? boost::asio::buffer(ref) : boost::asio::buffer(owned); }
  };

  void append_owned(std::string_view bytes) {
    if (pending_.empty() || pending_.back().keep) {
      pending_.emplace_back();
      if (spare_.capacity() > std::string().capacity()) pending_.back().owned = std::exchange(spare_, std::string());
    }
    pending_.back().owned.append(bytes);
  }

  /// The largest owned buffer of a write that went out is kept (emptied) for the next batch: a
  /// client of a steady stream copies its frames into memory it already has, instead of growing
  /// a new buffer to the batch's size (and faulting fresh pages in) at every batch.
  void keep_spare() {
    for (auto& p : sending_)
      if (!p.keep && p.owned.capacity() > spare_.capacity() && p.owned.capacity() <= max_spare) {
        p.owned.clear();
        spare_.swap(p.owned);
      }
  }
  static constexpr std::size_t max_spare = 1u << 20;

  void start_send() {
    if (!sending_.empty() || pending_.empty() || failed_) return;
    sending_.swap(pending_);
    if constexpr (!tls) {
      if (sender_) return offload();
    }
    buffers_.clear();
    for (const auto& p : sending_) buffers_.push_back(p.buffer());
    write_buffers();
  }

  void write_buffers() {
    boost::asio::async_write(next_, buffers_, [this, alive = alive_](boost::system::error_code ec, std::size_t) {
      if (*alive) sent(ec);
    });
  }

  /// The write in flight is done (ec: how it failed).
  void sent(boost::system::error_code ec) {
    ++writes_done_;
    keep_spare();
    sending_.clear();
    if (ec) failed_ = ec;
    if (!ec && !corked_ && !pending_.empty()) start_send();
    if (failed_ || (sending_.empty() && pending_.empty())) drained_.cancel();
    shutdown_if_sent();
  }

  /// The write goes to a sender thread.
  void offload() {
    if (!flight_) {
      flight_ = std::make_shared<send_flight>();
      flight_->owner = this;
      flight_->done = [](void* owner, send_flight& f) { static_cast<corked_stream*>(owner)->offloaded(f); };
    }
    auto& f = *flight_;
    f.fd = tcp_socket_of(next_).native_handle();
    f.iov.clear();
    f.total = 0;
    for (const auto& p : sending_) {
      auto b = p.buffer();
      f.iov.push_back({const_cast<void*>(b.data()), b.size()});
      f.total += b.size();
    }
    sender_->submit(flight_);
    in_flight_ = true;   // (after: a submit that throws leaves nothing out; it is given back only on the loop)
  }

  /// Back from the sender thread: done, failed, or the rest is sent from here when the socket
  /// can take it.
  void offloaded(send_flight& f) {
    in_flight_ = false;
    if (close_after_flight_) {
      boost::system::error_code ec;
      tcp_socket_of(next_).close(ec);
      return sent(boost::asio::error::operation_aborted);
    }
    if (f.error) return sent(boost::system::error_code(f.error, boost::system::system_category()));
    if (f.written == f.total) return sent({});
    ++sender_->partial;
    buffers_.clear();
    std::size_t skip = f.written;
    for (const auto& p : sending_) {
      auto b = p.buffer();
      if (skip >= b.size()) {
        skip -= b.size();
        continue;
      }
      buffers_.push_back(b + skip);
      skip = 0;
    }
    write_buffers();
  }

  void shutdown_if_sent() {
    if (!shutdown_ || shut_ || !sending_.empty() || !pending_.empty()) return;
    shut_ = true;
    // Over TLS the end is TLS's own (close_notify, after the client's: the closing handshake's
    // last step, websocket_session.hpp); below it, the TCP stream's sending side.
    if constexpr (!tls) {
      boost::system::error_code ec;
      tcp_socket_of(next_).shutdown(boost::asio::socket_base::shutdown_send, ec);
    }
  }

  Next next_;
  boost::asio::steady_timer drained_;   // cancelled when the buffer empties (a condition)
  std::vector<part> pending_;
  std::vector<part> sending_;             // the parts of the write in flight
  std::vector<boost::asio::const_buffer> buffers_;
  std::string spare_;                     // keep_spare()
  boost::system::error_code failed_;
  bool corked_ = false;
  bool shutdown_ = false;   // shutdown_after_sent() was called
  std::uint64_t writes_done_ = 0;
  bool shut_ = false;       // and it is done
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::shared_ptr<socket_sender> sender_;   // send_with(): writes go to its threads
  std::shared_ptr<send_flight> flight_;     // the write given to it (reused; freed by trim())
  bool in_flight_ = false;                  // flight_ is with a sender thread
  bool close_after_flight_ = false;         // close() came meanwhile
};

}  // namespace walgate::proxy
