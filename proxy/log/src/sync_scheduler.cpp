#include "walgate/proxy/sync_scheduler.hpp"

#include <boost/asio/post.hpp>

namespace walgate::proxy {

namespace asio = boost::asio;

sync_scheduler::sync_scheduler(asio::any_io_executor ex, event_log& log, std::chrono::milliseconds interval)
    : executor_(ex), log_(log), interval_(interval), timer_(ex), thread_(std::make_unique<asio::thread_pool>(1)) {}

sync_scheduler::~sync_scheduler() {
  *alive_ = false;
  thread_->join();   // a running fdatasync finishes; its completion finds the scheduler gone
}

void sync_scheduler::schedule() {
  if (scheduled_ || running_) return;   // a running sync schedules the next when it ends
  if (stopped_ && stopped_()) return;
  scheduled_ = true;
  timer_.expires_after(interval_);
  timer_.async_wait([this, alive = alive_](boost::system::error_code ec) {
    if (ec || !*alive) return;
    scheduled_ = false;
    auto job = log_.begin_sync();
    if (job.fd == -1) {
      if (failed_) failed_();
      return;
    }
    running_ = true;
    asio::post(*thread_, [this, alive, job]() mutable {
      event_log::run_sync_job(job);
      asio::post(executor_, [this, alive, job] {
        if (!*alive) return;
        running_ = false;
        if (!log_.end_sync(job) || !log_.error().empty() || (stopped_ && stopped_())) {
          if (failed_) failed_();
          return;
        }
        if (log_.dirty()) schedule();
      });
    });
  });
}

void sync_scheduler::store_ack(protocol::lsn l, std::function<void(bool, const std::string&)> done) {
  // Stored before it is acknowledged, so that after a restart a slot acknowledged further than
  // this log knows is recognised as moved on by someone else. At most one store a second: an
  // idle stream's keepalives need not be acknowledged at once.
  auto now = std::chrono::steady_clock::now();
  if (ack_storing_ || now - last_ack_store_ < std::chrono::seconds(1)) return;
  ack_storing_ = true;
  last_ack_store_ = now;
  asio::post(*thread_, [this, alive = alive_, l, dir = log_.options().dir, fsync = log_.options().fsync,
                        done = std::move(done)] {
    std::string error;
    bool ok = event_log::store_acked(dir, l, fsync, error);
    asio::post(executor_, [this, alive, ok, error, done] {
      if (!*alive) return;
      ack_storing_ = false;
      done(ok, error);
    });
  });
}

}  // namespace walgate::proxy
