// --replication-sql forward: a SQL statement a replication client sends (a subscriber's catalog
// queries, Debezium's) run on the upstream on a connection of walgate's own, in a READ ONLY
// transaction that is rolled back, its result relayed as the backend messages a server sends
// for it. On threads of their own (libpq blocks): never on the event loop.
//
// Assumptions, each broken by a test in tests/proxy/replication_server_test.cpp:
// - one statement: it runs through the extended protocol (PQexecParams), which takes one
//   statement alone — "COMMIT; INSERT …" is the server's error, not two statements;
// - no table written: the statement runs inside BEGIN READ ONLY (a write is the server's 25006
//   error) and the transaction is rolled back whatever it did;
// - "read only" does not stop functions whose effects live outside the transaction (a logical
//   message forged into every slot's stream, a backend terminated, a slot dropped or moved):
//   a statement is refused before it is sent unless it begins with SELECT, WITH, SHOW, TABLE
//   or VALUES and names none of those functions, nor SQL run from a string (query_to_xml,
//   ts_stat) nor a Unicode-escaped name (U&"…") that could hide one (forwardable()). The
//   connection's role should have no REPLICATION either (--replication-sql-pg);
// - a result is bounded: rows are read one at a time and past max_result_bytes the statement
//   is an error, not the process's memory;
// - bounded: at most max_running statements at once and max_queued waiting (more: an error
//   at once), each under a statement timeout.
#pragma once

#include "walgate/transform/output_plugin.hpp"

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace walgate::proxy {

/// Why sql is not sent upstream (its first word, a function it names), or "" when it may be.
std::string forwardable(std::string_view sql);

/// A result relayed is at most this many bytes of backend messages.
inline constexpr std::size_t max_result_bytes = 64u << 20;

/// Runs sql on conninfo as above; the backend messages to relay (RowDescription, DataRows and
/// CommandComplete; EmptyQueryResponse; or the server's ErrorResponse), without ReadyForQuery.
std::string forward_read_only(const std::string& conninfo, const std::string& sql, long statement_timeout_ms);

class sql_forwarder {
 public:
  /// post: runs a function on the event loop (where done is called).
  sql_forwarder(std::string conninfo, std::function<void(std::function<void()>)> post, std::size_t max_running = 4,
                std::size_t max_queued = 16, long statement_timeout_ms = 10'000);
  ~sql_forwarder();   ///< waits for the statements under way (at most their timeout)
  sql_forwarder(const sql_forwarder&) = delete;
  sql_forwarder& operator=(const sql_forwarder&) = delete;

  /// Queues sql; done gets the messages to relay, on the event loop.
  void run(std::string sql, std::function<void(std::string)> done);

  /// The tables the publications publish, with their columns and which are NOT NULL, looked up
  /// on a thread; done on the event loop with them, or nullopt and why.
  using table_list = std::vector<transform::published_table>;
  void published_tables(std::vector<std::string> publications,
                        std::function<void(std::optional<table_list>, std::string)> done);

 private:
  /// work runs on a thread and returns what is then posted to the loop; overflow runs at once
  /// when the queue is full.
  void submit(std::function<std::function<void()>()> work, const std::function<void()>& overflow);
  void work();
  std::string conninfo_;
  std::function<void(std::function<void()>)> post_;
  std::size_t max_running_, max_queued_;
  long timeout_ms_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<std::function<void()>()>> queue_;
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace walgate::proxy
