// The loop of a single-stream transport (NDJSON and SSE: chunked_stream.hpp; WebSocket /v1/ws:
// websocket.cpp): the client's subscription read batch by batch and handed to the transport,
// live clients first, the buffers given back while idle, the events counted as delivered, and
// at the end the slow-client count and the shutdown reason. What a transport does differently —
// how it sends a batch, what it gives back while idle, its keep-alive — is the Transport's.
//
// It assumes:
//  - one client per connection, served by this loop alone for its life (a multiplexed WebSocket,
//    websocket_mux.cpp, serves many clients in one loop of its own);
//  - serve_stream is the one coroutine that lives as long as the stream: a transport's entry
//    point returns it (no frame of its own), and its begin(), send() and end() are short
//    coroutines whose frames go when they return (an idle client costs one frame, issue 33's
//    fan-out benchmark: 5,000 idle clients' RSS each);
//  - the transport's wait target is c.wake (c.wake_target is &c.wake): what wakes the client
//    (events, its hang-up, its reader's end, the server stopping) cancels it;
//  - it runs on the event loop (core.executor), and the transport and the client outlive it;
//  - the connection's setup (its response head or handshake) is the transport's begin(), and its
//    end (the last line, or the close frame) its end(failed).
//
// The Transport:
//   awaitable<bool> begin();   its head or handshake; false: the stream ends there (the loop and
//                  end() do not run, finished() is not called)
//   client& c();               its client (made by the transport, before or in begin())
//   awaitable<void> end(bool failed);   after the loop: its last line or close frame
//   void trim();   its buffers given back (the client idle for keep_buffers_for)
//   idle_step idle(time_point now, time_point idle_since, bool trimmed);
//                  idle (no batch): wait until when, or write its keep-alive now, or fail (the
//                  connection is ending; the transport closed the subscription with its reason)
//   awaitable<std::optional<std::size_t>> send(const std::vector<subscription::item>& batch);
//                  the batch sent, or its keep-alive when batch is empty (after idle() said
//                  keepalive): the bytes sent, or nullopt when it failed (the loop ends)
//   static constexpr bool says_why_after_failure;
//                  after a failure the connection may still say why it ends (a WebSocket's
//                  close frame), so the shutdown reason is set then too; false: a failure ends
//                  the stream there (chunked: no last line)
#pragma once

#include "serving.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace walgate::proxy {

/// What an idle transport does next (Transport::idle, above).
struct idle_step {
  enum kind { wait, keepalive, fail };
  kind what;
  std::chrono::steady_clock::time_point until{};   ///< wait: when to look again
};

/// Serves one stream client from its transport's start to its end, in one coroutine: the only
/// frame that lives as long as the client (an idle client holds this frame and its transport,
/// on the heap, and nothing else; what the transport starts from is its own to free once begun).
/// t->begin(): its response head or handshake (false: it ends there); the loop, until the
/// subscription ends, the server stops or the transport fails, calling t->c().finished()
/// once; then t->end(failed): its last line or close frame.
template <class Transport>
boost::asio::awaitable<void> serve_stream(server_core& core, std::unique_ptr<Transport> t) {
  if (!co_await t->begin()) co_return;
  client& c = t->c();
  auto& sub = c.sub;
  std::vector<subscription::item> batch;
  std::uint64_t seen = core.notifications;
  bool trimmed = true, idle = false;   // (no buffers yet)
  bool failed = false;
  std::chrono::steady_clock::time_point idle_since{};
  while (!core.stopping && !sub.ended()) {
    if (core.behind_live(sub, seen))
      co_await boost::asio::post(core.executor, boost::asio::use_awaitable);   // live clients first
    if (core.stopping || sub.ended()) break;
    sub.next_batch(batch);
    if (sub.ended()) break;
    if (batch.empty() && sub.pending()) {   // passed over events its filters do not take: go on after the others
      co_await boost::asio::post(core.executor, boost::asio::use_awaitable);
      continue;
    }
    if (batch.empty()) {
      // Idle: it keeps its buffers for keep_buffers_for (a client of a steady stream has a batch
      // again by then), then gives them back while it waits (the next burst makes them again,
      // once). Its keep-alive is the transport's.
      const auto now = std::chrono::steady_clock::now();
      if (!idle) idle_since = now;
      idle = true;
      if (!trimmed && now >= idle_since + keep_buffers_for) {
        std::vector<subscription::item>().swap(batch);
        t->trim();
        trimmed = true;
      }
      const idle_step next = t->idle(now, idle_since, trimmed);
      if (next.what == idle_step::fail) {
        failed = true;
        break;
      }
      if (next.what == idle_step::wait) {
        c.wake.expires_at(next.until);
        co_await c.wake.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
        continue;
      }
      idle_since = now;   // the keep-alive goes now (the empty batch's send): idle counts from it
    } else {
      idle = trimmed = false;
    }
    const std::optional<std::size_t> bytes = co_await t->send(batch);
    if (!bytes) {
      failed = true;
      break;
    }
    if (!batch.empty()) c.delivered(batch.back(), batch.size(), *bytes);   // (a keep-alive delivers nothing)
  }
  c.finished();
  if (core.stopping && (!failed || Transport::says_why_after_failure))
    sub.close(subscription::end::shutdown, "server shutting down");
  std::vector<subscription::item>().swap(batch);
  co_await t->end(failed);
}

}  // namespace walgate::proxy
