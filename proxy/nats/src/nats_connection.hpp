// One NATS connection (with its JetStream context) and the thread that uses it: what the
// JetStream publisher and mirror (jetstream.hpp) share — the connection's options and reconnect
// policy, connecting, closing (waiting for nats.c's last callback), the owner's thread, its
// pauses and stop, running work on the owner's loop, and the log lines of its state.
//
// What it assumes:
// - Three kinds of threads. The owner's loop (the event log's executor), reached only through
//   post. The connection's thread, started by start(run): run is the owner's, and it alone calls
//   connect, disconnect, nc, js, on_loop, pause, idle and state (nc, js and the last state said
//   are not guarded: no other thread touches them). nats.c's threads, which call the closed,
//   disconnected and reconnected callbacks (they touch only closed_, under m_, and link_up_), and
//   the settings' ack_handler.
// - The owner calls start once, and stop from another thread than the connection's, once its loop
//   has stopped running (below): stop waits for run to return. wake, stopped, fault and link_up
//   may be called from any thread (fault and link_up are atomics, read by /metrics on the loop);
//   post and say from any thread the functions given allow (the owners: the thread, and the loop
//   for wake).
// - Lifetime: this object outlives the thread (its owner calls stop before destroying it or what
//   run uses), and run calls disconnect before it returns, so that no nats.c callback comes after
//   it is gone (disconnect waits up to 5 s for the closed callback). Nothing here stops the thread
//   or closes the connection by itself: a destructor with the thread running ends the process
//   (std::thread's).
// - on_loop is never called on the loop (it would wait for itself until a stop). A function it
//   gave up on (stopping) may still run on the loop later, and the owners' functions refer to
//   the thread's stack: so stop is called only once the loop has stopped running (serve.cpp
//   stops both after io.run() returns), never from a handler on a loop that goes on.
// - The connection reconnects by itself, forever (nats.c's reconnect); the owner drops it
//   (disconnect) only when nats.c has closed it or when it stops, and then connects again or not.
#pragma once

#include <nats/nats.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace walgate::proxy {

class nats_connection {
 public:
  /// What differs between the publisher and the mirror.
  struct settings {
    std::vector<std::string> servers;   ///< nats://host:port
    std::string name;                   ///< the connection's name, as the servers show it
    bool watch_link = false;            ///< keep link_up() (nats.c's disconnected/reconnected callbacks)
    std::int64_t wait_ms = 5000;        ///< jsOptions.Wait: JetStream API requests
    std::int64_t max_pending = 0;       ///< jsOptions.PublishAsync.MaxPending (0: nats.c's)
    jsPubAckHandler ack_handler = nullptr;   ///< jsOptions.PublishAsync.AckHandler (on nats.c's thread)
    void* ack_closure = nullptr;             ///< its closure
    /// The state said when connecting fails, from nats_error of the failure (required).
    std::function<std::string(const std::string& error)> cannot_connect;
  };

  /// post runs a function on the owner's loop; say writes a log line.
  nats_connection(std::function<void(std::function<void()>)> post, std::function<void(const std::string&)> say, settings s);
  nats_connection(const nats_connection&) = delete;
  nats_connection& operator=(const nats_connection&) = delete;

  // --- the thread ------------------------------------------------------------------------------

  /// Starts the thread, running run.
  void start(std::function<void()> run);
  /// Stops it: stopped() turns true, pauses end, and the thread is waited for. False when it was
  /// not running (never started, or stopped already).
  bool stop();
  bool stopped();
  /// Waits d, woken early only by a stop, not by wake() (a fault is not looked at again on every
  /// commit).
  void pause(std::chrono::milliseconds d);
  /// Ends an idle() early (or the next one, if none is waiting).
  void wake();
  /// Waits for a wake() or d; false when stopping.
  bool idle(std::chrono::milliseconds d);

  // --- the owner's loop ------------------------------------------------------------------------

  void post(std::function<void()> f) const { post_(std::move(f)); }
  /// Runs f on the loop and waits for its result; nullopt when stopping first.
  template <class F>
  auto on_loop(F f) -> std::optional<decltype(f())>;

  // --- log lines -------------------------------------------------------------------------------

  void say(const std::string& line) const { say_(line); }
  /// "JetStream: " + s said once until the state changes ("": said nothing); is_fault: a state
  /// that needs an operator (fault() 1 until the next state).
  void state(const std::string& s, bool is_fault = false);
  int fault() const { return fault_.load(); }

  // --- the connection --------------------------------------------------------------------------

  /// Connects with the settings and opens a JetStream context; false (the state said) when it
  /// cannot, and then there is no connection.
  bool connect();
  /// Drops the JetStream context, closes the connection and waits (up to 5 s) for nats.c's
  /// closed callback, the last of its callbacks, then destroys it. Nothing to do when none.
  void disconnect();
  natsConnection* nc() const { return nc_; }   ///< nullptr: not connected
  jsCtx* js() const { return js_; }
  /// The connection is up (set by connect, then kept by nats.c's callbacks with watch_link).
  bool link_up() const { return link_up_.load(); }

 private:
  static void on_closed(natsConnection*, void* closure);

  std::function<void(std::function<void()>)> post_;
  std::function<void(const std::string&)> say_;
  settings settings_;

  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool woken_ = false;
  bool closed_ = true;   // no connection, or nats.c said it is closed (its callbacks are over)

  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
  std::atomic<bool> link_up_{false};
  std::atomic<int> fault_{0};   // 1: a state that needs an operator
  std::string last_state_;      // (thread only) what was last said, so a retry loop says it once
};

template <class F>
auto nats_connection::on_loop(F f) -> std::optional<decltype(f())> {
  using R = decltype(f());
  auto done = std::make_shared<std::promise<R>>();
  auto fut = done->get_future();
  post_([f = std::move(f), done]() mutable { done->set_value(f()); });
  while (fut.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready)
    if (stopped()) return std::nullopt;
  return fut.get();
}

}  // namespace walgate::proxy
