// The initial snapshot of the event log (--snapshot initial): when walgate creates its slot, the
// slot's exported snapshot is copied into the log before the first streamed transaction, so
// that from=0/0:0 replays everything — the rows that existed, then every change.
//
//   replication connection: CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT, then idle (the
//                           snapshot lives while it runs nothing else), then START_REPLICATION
//                           from the slot's consistent point
//   worker connections:     BEGIN REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '<it>';
//                           COPY of each published table — tables in parallel, large ones in
//                           ctid ranges (PostgreSQL 14+, where a ctid range is a scan of its own)
//   the event loop:         the rows, as `read` events of one log transaction whose commit LSN
//                           is the consistent point (ids <consistent point>:<n>), committed and
//                           synced before streaming starts
//
// The slot's consistent point is exactly where the exported snapshot ends: no gap, no overlap.
// One log transaction: clients see the snapshot whole or not at all. The data directory's
// SNAPSHOT file says "pending" from before the slot is created until the snapshot is durable;
// a start that finds it pending with an empty log (a crash during the copy) drops the slot and
// takes the snapshot again.
#pragma once

#include "walgate/protocol/lsn.hpp"
#include "walgate/proxy/failure.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace walgate::proxy {

class event_log;
class metrics_registry;

struct initial_snapshot_options {
  std::string conninfo;                 ///< libpq conninfo of the database
  std::vector<std::string> publications;
  std::size_t workers = 4;              ///< connections copying at once
  std::uint64_t range_pages = 4096;     ///< a table larger than this (32 MiB of 8 KiB pages) is copied in ranges of it
  bool fsync = true;                    ///< the SNAPSHOT file (the log syncs itself)
};

/// The data directory's SNAPSHOT file.
enum class initial_state { none, pending, done };
initial_state read_initial_state(const std::filesystem::path& dir);
bool write_initial_state(const std::filesystem::path& dir, initial_state s, bool fsync, std::string& error);

class initial_snapshot {
 public:
  initial_snapshot(boost::asio::any_io_executor loop, event_log& log, initial_snapshot_options o);
  ~initial_snapshot();
  initial_snapshot(const initial_snapshot&) = delete;
  initial_snapshot& operator=(const initial_snapshot&) = delete;

  /// Copies the exported snapshot into the log (empty: nothing else may be in it) as one
  /// transaction at consistent_point, syncs it and marks the data directory's SNAPSHOT done. On
  /// failure the log's transaction is dropped (the caller drops the slot and tries again).
  boost::asio::awaitable<outcome<void>> run(std::string exported, protocol::lsn consistent_point);
  /// Shutdown: a running copy is cancelled (each connection's query, off the loop) and run()
  /// ends within seconds with a failure, its transaction dropped (the slot's next start takes
  /// the snapshot again); a later run() fails at once. Never blocks.
  void stop();
  /// The conninfo the copy's connections use from the next run() on (the exported snapshot's
  /// server: walgate serve pins it to the stream's).
  void set_conninfo(std::string conninfo) { opts_.conninfo = std::move(conninfo); }
  /// Rows copied and estimated per table, and whether a copy runs, for /metrics.
  void register_metrics(metrics_registry& r);

  struct table_progress {
    std::string name;               ///< schema.table as stored
    std::uint64_t estimate = 0;     ///< rows, from the catalog's statistics (0: unknown)
    std::atomic<std::uint64_t> rows{0};
  };

 private:
  struct state;
  boost::asio::any_io_executor loop_;
  event_log& log_;
  initial_snapshot_options opts_;
  std::shared_ptr<state> st_;
  bool running_ = false;
  bool stop_asked_ = false;
};

}  // namespace walgate::proxy
