// A stream layer under Beast's WebSocket stream that collects what Beast writes — data frames,
// pings, pongs, the close frame — and sends it in one write: a batch of events for a client is
// one system call, not one per event. Internal to server.cpp (Beast stays out of shared headers).
//
//   cork()          writes from now on are only buffered (each completes at once)
//   async_drain()   uncork, and wait until everything buffered is sent or the write failed
//
// While uncorked (between batches), a write — a pong Beast sends from its read, a keep-alive
// ping, the close frame — starts sending at once. One write to the next layer is in flight at a
// time; what arrives meanwhile waits in the buffer and goes with the next one. Memory: the server
// corks one bounded batch at a time and drains it before the next, so the buffer holds at most
// one batch plus control frames.
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
              pending_.append(static_cast<const char*>(b.data()), b.size());
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

  /// Appends an unmasked, uncompressed WebSocket text frame (FIN set) holding payload: a
  /// server's data frame exactly as Beast would write it without permessage-deflate, made here
  /// so a batch costs no composed operation per event. Only between Beast's own frames: Beast
  /// writes each control frame whole, so frames never interleave mid-frame.
  void append_text_frame(std::string_view payload) {
    if (failed_) return;
    char head[10];
    std::size_t h = websocket_text_frame_header(head, payload.size());
    pending_.append(head, h).append(payload);
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
          if (failed_ || (!sending_ && pending_.empty())) return self.complete(failed_);
          drained_.expires_at(boost::asio::steady_timer::time_point::max());
          drained_.async_wait(std::move(self));
        },
        token, drained_);
  }

  std::size_t buffered() const { return pending_.size() + (sending_ ? sending_->size() : 0); }

 private:
  void start_send() {
    if (sending_ || pending_.empty() || failed_) return;
    sending_ = std::make_shared<std::string>();
    sending_->swap(pending_);
    auto buf = sending_;
    boost::asio::async_write(next_, boost::asio::buffer(*buf),
                             [this, alive = alive_, buf](boost::system::error_code ec, std::size_t) {
                               if (!*alive) return;
                               sending_.reset();
                               if (ec) failed_ = ec;
                               if (!ec && !corked_ && !pending_.empty()) start_send();
                               if (failed_ || (!sending_ && pending_.empty())) drained_.cancel();
                             });
  }

  Next next_;
  boost::asio::steady_timer drained_;   // cancelled when the buffer empties (a condition)
  std::string pending_;
  std::shared_ptr<std::string> sending_;   // the bytes of the write in flight
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
