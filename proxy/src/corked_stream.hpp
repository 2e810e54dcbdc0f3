// A stream layer under Beast's WebSocket stream that collects what Beast writes — data frames,
// pings, pongs, the close frame — and sends it in one write: a batch of events for a client is
// one system call, not one per event. Internal to websocket.cpp (Beast stays out of shared headers).
//
//   cork()          writes from now on are only buffered (each completes at once)
//   async_drain()   uncork, and wait until everything buffered is sent or the write failed
//
// While uncorked (between batches), a write — a pong Beast sends from its read, a keep-alive
// ping, the close frame — starts sending at once. One write to the next layer is in flight at a
// time; what arrives meanwhile waits in the buffer and goes with the next one. Memory: the server
// corks one bounded batch at a time and drains it before the next, so the buffer holds at most
// one batch plus control frames. A large event is not copied here: its bytes are referenced where
// they are (the shared encoding, or the one piece read from its spill file), and a very large one
// goes as a message in fragments, drained one at a time, with Beast's pings between them.
#pragma once

#include <boost/asio/append.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/websocket/teardown.hpp>

#include "walgate/proxy/server.hpp"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::proxy {

template <class Next>
class corked_stream {
 public:
  using executor_type = typename Next::executor_type;
  using next_layer_type = Next;

  template <class... Args>
  explicit corked_stream(Args&&... args)
      : next_(std::forward<Args>(args)...), drained_(next_.get_executor()) {}
  corked_stream(corked_stream&&) = delete;
  ~corked_stream() { *alive_ = false; }

  executor_type get_executor() noexcept { return next_.get_executor(); }
  Next& next_layer() noexcept { return next_; }
  const Next& next_layer() const noexcept { return next_; }

  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers& b, Token&& token) {
    return next_.async_read_some(b, std::forward<Token>(token));
  }

  template <class ConstBuffers, class Token>
  auto async_write_some(const ConstBuffers& b, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this](auto handler, const ConstBuffers& buffers) {
          boost::system::error_code ec = failed_;
          std::size_t n = 0;
          if (!ec) {
            for (auto it = boost::asio::buffer_sequence_begin(buffers); it != boost::asio::buffer_sequence_end(buffers); ++it) {
              boost::asio::const_buffer b = *it;
              append_owned({static_cast<const char*>(b.data()), b.size()});
              n += b.size();
            }
            if (!corked_) start_send();
          }
          auto ex = boost::asio::get_associated_executor(handler, next_.get_executor());
          boost::asio::post(ex, boost::asio::append(std::move(handler), ec, n));
        },
        token, b);
  }

  void cork() { corked_ = true; }
  /// Writes go out as they come again (what was buffered starts sending now), without waiting.
  void uncork() {
    corked_ = false;
    start_send();
  }

  /// Appends an unmasked WebSocket text frame (FIN set) holding payload — compressed: a
  /// permessage-deflate message (RSV1), made once for every client (deflate.hpp) — made here so
  /// a batch costs no composed operation per event. Only between Beast's own frames: Beast
  /// writes each control frame whole, so frames never interleave mid-frame.
  void append_text_frame(std::string_view payload, bool compressed = false) {
    if (failed_) return;
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
    if (failed_) return;
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
  /// they are: first opens the message, last ends it. Beast's frames (pings, pongs, a close)
  /// go between fragments, so a message that takes minutes to send does not starve them.
  void append_text_fragment(std::shared_ptr<const void> keep, std::string_view bytes, bool first, bool last,
                            bool compressed = false) {
    if (failed_) return;
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

  /// Nothing buffered or in flight: its lists' memory is given back (an idle connection keeps
  /// none; the next batch makes them again).
  void trim() {
    if (!sending_.empty() || !pending_.empty()) return;
    std::vector<part>().swap(pending_);
    std::vector<part>().swap(sending_);
    std::vector<boost::asio::const_buffer>().swap(buffers_);
  }

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
    if (pending_.empty() || pending_.back().keep) pending_.emplace_back();
    pending_.back().owned.append(bytes);
  }

  void start_send() {
    if (!sending_.empty() || pending_.empty() || failed_) return;
    sending_.swap(pending_);
    buffers_.clear();
    for (const auto& p : sending_) buffers_.push_back(p.buffer());
    boost::asio::async_write(next_, buffers_, [this, alive = alive_](boost::system::error_code ec, std::size_t) {
      if (!*alive) return;
      sending_.clear();
      if (ec) failed_ = ec;
      if (!ec && !corked_ && !pending_.empty()) start_send();
      if (failed_ || (sending_.empty() && pending_.empty())) drained_.cancel();
    });
  }

  Next next_;
  boost::asio::steady_timer drained_;   // cancelled when the buffer empties (a condition)
  std::vector<part> pending_;
  std::vector<part> sending_;             // the parts of the write in flight
  std::vector<boost::asio::const_buffer> buffers_;
  boost::system::error_code failed_;
  bool corked_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// Closing the WebSocket tears down the layer below.
template <class Next>
void teardown(boost::beast::role_type role, corked_stream<Next>& s, boost::system::error_code& ec) {
  using boost::beast::websocket::teardown;
  teardown(role, s.next_layer(), ec);
}

template <class Next, class Handler>
void async_teardown(boost::beast::role_type role, corked_stream<Next>& s, Handler&& handler) {
  using boost::beast::websocket::async_teardown;
  async_teardown(role, s.next_layer(), std::forward<Handler>(handler));
}

}  // namespace walgate::proxy
