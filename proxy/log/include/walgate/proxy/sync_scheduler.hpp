// Group commit for the event log, in one piece: everything committed within the interval shares
// one fdatasync, which runs on a thread of its own (the event loop serves meanwhile; what commits
// meanwhile goes with the next), and idle keepalive positions are stored in the ACKED file on the
// same thread. The event log does the I/O in halves (begin_sync / run_sync_job / end_sync); this
// decides when, and reports when a position became durable or the log failed.
#pragma once

#include "walgate/proxy/event_log.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include <chrono>
#include <functional>
#include <memory>

namespace walgate::proxy {

class sync_scheduler {
 public:
  sync_scheduler(boost::asio::any_io_executor ex, event_log& log, std::chrono::milliseconds interval);
  ~sync_scheduler();   // a running fdatasync finishes first
  sync_scheduler(const sync_scheduler&) = delete;
  sync_scheduler& operator=(const sync_scheduler&) = delete;

  /// Something was committed: a sync within the interval (or after the running one).
  void schedule();
  /// Stores l as the acknowledged keepalive position (at most once a second); done(true) once
  /// stored, done(false) with log error set when it could not be — on the executor.
  void store_ack(protocol::lsn l, std::function<void(bool ok, const std::string& error)> done);
  /// Called (on the executor) when a sync failed: event_log::error() says why. No sync is
  /// scheduled again once stopped() says so (the log, or the ACKED store, failed).
  void on_failure(std::function<void()> f, std::function<bool()> stopped) {
    failed_ = std::move(f);
    stopped_ = std::move(stopped);
  }
  bool storing_ack() const { return ack_storing_; }

 private:
  boost::asio::any_io_executor executor_;
  event_log& log_;
  std::chrono::milliseconds interval_;
  boost::asio::steady_timer timer_;
  std::unique_ptr<boost::asio::thread_pool> thread_;
  bool scheduled_ = false, running_ = false;
  bool ack_storing_ = false;
  std::chrono::steady_clock::time_point last_ack_store_{};
  std::function<void()> failed_;
  std::function<bool()> stopped_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace walgate::proxy
