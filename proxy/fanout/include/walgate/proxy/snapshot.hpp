// Per-client snapshots (snapshot=true): the rows of the tables a client asks for, read under a
// fresh REPEATABLE READ snapshot on a connection of their own (libpq; never the replication
// stream), encoded in the client's format on a worker thread, and handed to the event loop in a
// bounded queue; then the client's subscription goes on in the log from where the snapshot
// leaves off (subscription.hpp):
//
//   worker:  BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY
//            pg_current_snapshot() (xmin:xmax:xip), pg_current_wal_insert_lsn() = W
//            the published tables the request selects, their columns as pgoutput sends them
//            COPY (SELECT cols FROM [ONLY] t [WHERE row filter]) TO STDOUT, per table
//   loop:    the log position P before the snapshot was taken, moved back to the first event
//            of any transaction logged already that the snapshot saw as running; Q = the log's
//            visible position once the stream was read past W (gateway::when_read_past).
//   client:  the rows; the logged changes in [P, Q) that the snapshot did not see (by xid);
//            the end marker, whose id resumes exactly after Q; then everything from Q on.
//
// A transaction in [P, Q) that the snapshot saw is in the rows and is skipped; every
// transaction logged after Q committed after W, so after the snapshot: none is in the rows.
#pragma once

#include "walgate/protocol/lsn.hpp"
#include "walgate/protocol/snapshot.hpp"
#include "walgate/proxy/log_reader.hpp"
#include "walgate/proxy/payload.hpp"
#include "walgate/proxy/stream_request.hpp"
#include "walgate/transform/formats.hpp"

#include <boost/asio/any_io_executor.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <string_view>
#include <unordered_map>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace boost::asio {
class thread_pool;
}
struct pg_cancel;

namespace walgate::proxy {

class metrics_registry;

struct snapshot_options {
  std::string conninfo;                  ///< libpq conninfo of the database; empty: snapshot=true is refused (501)
  /// When set and not empty: the conninfo a snapshot admitted now uses instead (walgate serve:
  /// the server its stream is on, pinned_conninfo). Called on the loop.
  std::function<std::string()> pinned;
  std::vector<std::string> publications;
  std::size_t max_running = 4;           ///< snapshots reading at once (each a connection and a transaction)
  std::size_t max_queued = 64;           ///< waiting for one of those; more: 503 with Retry-After
  std::chrono::milliseconds statement_timeout{300'000};   ///< per COPY (and idle in the transaction)
  std::size_t client_bytes = 4u << 20;   ///< encoded rows held for a client; the copy waits beyond it
  std::chrono::milliseconds stream_wait{300'000};   ///< for the stream to be read past the snapshot
  /// Snapshots that may begin in a minute (each is a PostgreSQL session and a transaction:
  /// subscribe/unsubscribe churn must not turn into a session storm); more: 429 with
  /// Retry-After. Per client address (clients behind one proxy share it: generous), per token
  /// subject, and per /v1/mux connection (websocket_mux.cpp). 0: no limit.
  std::size_t per_address_minute = 300;
  std::size_t per_subject_minute = 60;
  std::size_t per_connection_minute = 10;
};

/// One client's snapshot, shared by its worker and the event loop. The loop-side members are
/// touched on the loop only; the queue and state under the mutex.
class snapshot_job : public std::enable_shared_from_this<snapshot_job> {
 public:
  enum class state { queued, reading, done, failed };
  snapshot_job(boost::asio::any_io_executor loop, stream_request request, transform::encoder_options enc,
               const snapshot_options& o);

  // --- loop side ------------------------------------------------------------------------
  /// Called on the loop when something changed (rows queued, started, done, failed, Q known).
  void set_wake(std::function<void()> f) { wake_ = std::move(f); }
  /// Moves up to max_items / max_bytes of encoded rows into out; true if any.
  bool take(std::vector<payload_ptr>& out, std::size_t max_items, std::size_t max_bytes);
  state current() const;
  /// Why it failed, and the HTTP status it means before any row went out.
  std::string error() const;
  unsigned http_status() const;
  /// The client is gone (or the server stops): the worker stops at the next row.
  void cancel();
  /// Taken (the transaction is open and the tables are known): the log position where the
  /// client's changes start.
  bool started() const { return start_seq_.has_value(); }
  std::uint64_t start_seq() const { return *start_seq_; }
  /// The log position from which every event is after the snapshot, and the id to resume after
  /// it (invalid: the log was empty); nullopt until the stream has been read that far.
  const std::optional<std::uint64_t>& end_seq() const { return end_seq_; }
  const transform::event_id& end_id() const { return end_id_; }
  /// Whether a logged event is already in the rows (its transaction committed before the snapshot).
  bool covers(const logged_event& e) const;
  std::uint64_t rows() const;
  std::chrono::steady_clock::time_point done_at() const { return done_at_; }
  const stream_request& request() const { return request_; }
  std::chrono::milliseconds stream_wait() const { return opts_.stream_wait; }

 private:
  friend class snapshot_service;
  void run();   // the worker
  bool push(payload_ptr p);   // worker: false once cancelled
  void finish(state s, std::string error = {}, unsigned status = 0);
  void notify();   // worker: wake the loop side

  boost::asio::any_io_executor loop_;
  stream_request request_;
  transform::encoder_options encoder_;
  snapshot_options opts_;
  std::function<void()> wake_;
  std::function<void()> on_taken_;   // the service's, on the loop
  std::optional<std::uint64_t> start_seq_, end_seq_;
  std::uint64_t queued_at_seq_ = 0;   // the log's visible seq when the worker was given it
  transform::event_id end_id_;
  std::chrono::steady_clock::time_point done_at_{};

  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<payload_ptr> rows_;
  std::size_t bytes_ = 0;
  std::uint64_t rows_total_ = 0;
  state state_ = state::queued;
  std::string error_;
  unsigned status_ = 0;
  bool cancelled_ = false;
  bool notify_posted_ = false;
  pg_cancel* cancel_ = nullptr;   // the worker's connection's cancel key (libpq's PGcancel)
  // set by the worker before it reports "taken", read by the loop after
  protocol::pg_snapshot snap_;
  protocol::lsn wal_bound_;   // the stream must be read to here
  bool taken_ = false;
};

/// Admits snapshot requests under the concurrency limit, runs them on worker threads, and
/// connects each to the log (P and Q above). Lives on the loop.
class snapshot_service {
 public:
  /// How a snapshot learns when the stream was read past its WAL position w: f gets the visible
  /// position then (gateway::when_read_past; owner: f is dropped once it is gone).
  using read_past_fn = std::function<void(protocol::lsn w, std::weak_ptr<const void> owner,
                                          std::function<void(std::uint64_t seq, transform::event_id last)> f)>;
  snapshot_service(boost::asio::any_io_executor loop, snapshot_options o, const log_reader& log, read_past_fn read_past);
  ~snapshot_service();
  /// A job for the request, queued; null with refusal set when it cannot be (501: not
  /// configured; 503: the queue is full; 429: the address or the subject began per_minute
  /// snapshots within the last minute).
  std::shared_ptr<snapshot_job> admit(const stream_request& r, const transform::encoder_options& enc, unsigned& status,
                                      std::string& refusal,
                                      std::string_view address = {}, std::string_view subject = {});
  /// The 429's reason when who ("address", "connection"…) began per_minute snapshots in the
  /// last minute, the oldest left before it drops out.
  static std::string rate_refusal(std::string_view who, std::size_t per_minute, std::chrono::steady_clock::duration left);
  const snapshot_options& options() const { return opts_; }
  void count_rate_limited() { ++rate_limited_; }
  /// Cancels every job and waits for the workers (the server stops).
  void stop();
  void register_metrics(metrics_registry& m);

 private:
  void dispatch();
  void on_taken(const std::shared_ptr<snapshot_job>& j);

  boost::asio::any_io_executor loop_;
  snapshot_options opts_;
  const log_reader& log_;
  read_past_fn read_past_;
  std::unique_ptr<boost::asio::thread_pool> pool_;
  /// Jobs on the pool's threads (a job's run and its hand-back): stop() waits for them to end,
  /// for at most stop_wait, then leaves their threads behind rather than hang the shutdown on a
  /// worker that libpq keeps waiting (a backend that does not answer even its cancel).
  struct in_pool {
    std::mutex m;
    std::condition_variable cv;
    std::size_t n = 0;
    bool stopped = false;   // stop() has run: no job posts back to the loop
  };
  std::shared_ptr<in_pool> in_pool_ = std::make_shared<in_pool>();
  static constexpr std::chrono::seconds stop_wait{5};
  std::deque<std::weak_ptr<snapshot_job>> queue_;
  std::vector<std::weak_ptr<snapshot_job>> running_;
  std::size_t running_count_ = 0;
  std::uint64_t started_ = 0, rejected_ = 0, failed_ = 0, rows_ = 0;
  bool stopped_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  /// Snapshot starts in the last minute, by "a:<address>" and "s:<subject>" (bounded: at most
  /// 65,536 keys; when full, keys whose starts are all older than a minute go).
  std::unordered_map<std::string, std::deque<std::chrono::steady_clock::time_point>> recent_starts_;
  std::uint64_t rate_limited_ = 0;
};

}  // namespace walgate::proxy
