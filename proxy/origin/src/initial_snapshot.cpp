// The initial snapshot (--snapshot initial): when walgate creates the slot, the rows of every
// published table, read in the slot's exported snapshot, go into the event log as one
// transaction of read events before the first streamed one. The SNAPSHOT file says whether it
// finished; /metrics follows its progress per table.
// Over 500 lines because of run() (about 290): one coroutine whose steps run in order — the plan,
// made on a pool thread; the copies, on up to --snapshot-workers connections, each batch appended
// on the loop; the wait, reporting every 5 s; the commit and the sync — and they share its locals
// (the copy workers take append and the held last row by reference). Seams if it grows: the
// planner lambda captures nothing by reference and could be a function of its own (about 50
// lines), and so could the progress report in the wait loop.
#include "walgate/proxy/initial_snapshot.hpp"

#include "walgate/protocol/commands.hpp"
#include "walgate/protocol/crc32c.hpp"
#include "walgate/protocol/snapshot.hpp"
#include "walgate/proxy/event_log.hpp"
#include "walgate/proxy/metrics.hpp"
#include "walgate/transform/change.hpp"
#include "walgate/transform/record.hpp"

#include "walgate/proxy/snapshot_sql.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <thread>
#include <mutex>
#include <optional>

namespace walgate::proxy {

namespace asio = boost::asio;
namespace fs = std::filesystem;
namespace pg = protocol::pgoutput;
using namespace snapshot_sql;
using protocol::errc;

namespace {

void say(const std::string& line) {
  std::fprintf(stderr, "walgate: %s\n", line.c_str());
  std::fflush(stderr);
}

/// A Prometheus label value: quoted, with \\, " and newlines escaped.
std::string label(const std::string& v) {
  std::string out = "\"";
  for (char ch : v) {
    if (ch == '\\' || ch == '"') out.push_back('\\');
    if (ch == '\n') out += "\\n";
    else out.push_back(ch);
  }
  return out + "\"";
}

std::string with_commas(std::uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

}  // namespace

initial_state read_initial_state(const fs::path& dir) {
  std::ifstream in(dir / "SNAPSHOT");
  std::string word;
  if (!(in >> word)) return initial_state::none;
  return word == "done" ? initial_state::done : initial_state::pending;   // anything else: not known to be done
}

bool write_initial_state(const fs::path& dir, initial_state s, bool fsync, std::string& error) {
  const fs::path path = dir / "SNAPSHOT", tmp = dir / "SNAPSHOT.tmp";
  const std::string text = s == initial_state::done ? "done\n" : "pending\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            (!fsync || ::fsync(fd) == 0);
  int saved = errno;
  if (fd >= 0) ::close(fd);
  if (ok) {
    ok = ::rename(tmp.c_str(), path.c_str()) == 0;
    saved = errno;
  }
  if (ok && fsync) {
    int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ok = d >= 0 && ::fsync(d) == 0;
    saved = errno;
    if (d >= 0) ::close(d);
  }
  if (!ok) error = "cannot store the initial snapshot's state in " + path.string() + ": " + std::strerror(saved);
  return ok;
}

namespace {
/// A batch of records of one table's rows, made by a worker and handed to the loop; used again
/// once appended (its buffers kept: no large allocation per batch).
struct batch {
  std::size_t table = 0;
  std::string records;
  std::vector<std::uint32_t> ends;
};
}  // namespace

struct initial_snapshot::state {
  std::mutex m;
  std::condition_variable cv;
  // the plan (made on the planner thread before "planned"; read-only after)
  table_map tables;
  std::vector<const table_def*> defs;
  std::vector<std::unique_ptr<table_progress>> progress;   // per def
  struct unit {
    std::size_t table;
    std::string from, extra;
  };
  std::vector<unit> units;
  std::int64_t commit_time = 0;
  bool planned = false;
  // under m
  std::size_t next_unit = 0;
  std::size_t in_flight = 0;   // batches posted to the loop and not yet appended
  std::vector<std::shared_ptr<batch>> spare;   // appended batches, to be filled again

  std::shared_ptr<batch> take_batch(std::size_t table) {
    std::shared_ptr<batch> b;
    {
      std::lock_guard lock(m);
      if (!spare.empty()) {
        b = std::move(spare.back());
        spare.pop_back();
      }
    }
    if (!b) b = std::make_shared<batch>();
    b->table = table;
    b->records.clear();
    b->ends.clear();
    return b;
  }
  std::size_t workers_done = 0;
  bool failed = false;
  std::string error;
  // loop only
  asio::steady_timer* wake = nullptr;
  bool plan_seen = false;   // planned, as the loop knows it (what /metrics reads)

  void fail(std::string why) {
    std::lock_guard lock(m);
    if (!failed) error = std::move(why);
    failed = true;
    cv.notify_all();
  }
  bool stopped() {
    std::lock_guard lock(m);
    return failed;
  }

  // Shutdown (stop()). Assumption: a worker may sit inside libpq for as long as its backend
  // answers nothing (a lock wait, a stopped backend, a dropped network), so neither the
  // loop nor the shutdown ever joins the pool unbounded: each live connection's cancel handle
  // is kept here, a stop cancels them all (each cancel a connection of its own, made off the
  // loop), and run() waits for the workers for stop_wait at most, then leaves them behind.
  std::map<const PGconn*, PGcancel*> cancels;   // (m) the live connections'
  bool stop_asked = false;                       // (m)
  std::size_t tasks = 0;                         // (m) posted to the pool and not yet ended

  static void send_cancel(PGcancel* k) {
    std::thread([k] {
      char why[256];
      PQcancel(k, why, sizeof why);
      PQfreeCancel(k);
    }).detach();
  }
  /// A worker's connection, cancelled by stop() until unwatch (called before PQfinish).
  void watch(const PGconn* c) {
    PGcancel* k = PQgetCancel(const_cast<PGconn*>(c));
    if (!k) return;
    {
      std::lock_guard lock(m);
      if (!stop_asked) {
        cancels[c] = k;
        return;
      }
    }
    send_cancel(k);   // (made after the stop: cancelled at once)
  }
  void unwatch(const PGconn* c) {
    PGcancel* k = nullptr;
    {
      std::lock_guard lock(m);
      if (auto it = cancels.find(c); it != cancels.end()) {
        k = it->second;
        cancels.erase(it);
      }
    }
    if (k) PQfreeCancel(k);
  }
  void stop() {
    std::map<const PGconn*, PGcancel*> all;
    {
      std::lock_guard lock(m);
      if (stop_asked) return;
      stop_asked = true;
      if (!failed) error = "stopped: walgate is shutting down (the next start takes the snapshot again)";
      failed = true;
      cv.notify_all();
      all.swap(cancels);
    }
    for (auto& [c, k] : all) send_cancel(k);
  }

  /// A pool task's connection, watched for stop() while it lives (declared after the
  /// conn_guard: unwatched before PQfinish), and the task counted until it ends.
  struct task_guard {
    std::shared_ptr<state> st;
    const PGconn* c = nullptr;
    void watch(const PGconn* conn) {
      c = conn;
      if (c) st->watch(c);
    }
    ~task_guard() {
      if (c) st->unwatch(c);
      std::lock_guard lock(st->m);
      --st->tasks;
    }
  };
  /// A task counted before it is posted (the loop's count never misses one not begun yet);
  /// its task_guard ends it.
  void posting() {
    std::lock_guard lock(m);
    ++tasks;
  }
};


initial_snapshot::initial_snapshot(asio::any_io_executor loop, event_log& log, initial_snapshot_options o)
    : loop_(std::move(loop)), log_(log), opts_(std::move(o)), st_(std::make_shared<state>()) {
  if (opts_.workers == 0) opts_.workers = 1;
}

initial_snapshot::~initial_snapshot() = default;

void initial_snapshot::stop() {
  stop_asked_ = true;
  st_->stop();
  asio::post(loop_, [st = st_] {
    if (st->wake) st->wake->cancel();
  });
}

namespace {

constexpr std::size_t batch_bytes = 256u << 10;
constexpr std::size_t max_in_flight = 16;
constexpr std::chrono::seconds stop_wait{5};   // for a cancelled connection to end at shutdown

/// Opens a connection in the exported snapshot.
PGconn* in_snapshot(const initial_snapshot_options& o, const std::string& exported, const char* name, std::string& error,
                    const std::function<void(const PGconn*)>& connected) {
  PGconn* c = snapshot_sql::connect(o.conninfo, name, 0, error);
  if (!c) return nullptr;
  connected(c);   // (cancellable from here on)
  if (!exec(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", PGRES_COMMAND_OK, error) ||
      !exec(c, "SET TRANSACTION SNAPSHOT " + protocol::quote_literal(exported), PGRES_COMMAND_OK, error)) {
    PQfinish(c);
    return nullptr;
  }
  return c;
}

}  // namespace

asio::awaitable<outcome<void>> initial_snapshot::run(std::string exported, protocol::lsn consistent_point) {
  auto fail = [](std::string why) { return failure{make_error_code(errc::server_error), "initial snapshot: " + why, {}, true}; };
  if (log_.next_seq() != 0) co_return failure{{}, "initial snapshot: the event log is not empty", {}, false};
  // The snapshot is logged one byte before the consistent point (at_): a transaction whose commit
  // record starts exactly at the consistent point is not in the exported snapshot and is
  // streamed with that commit LSN, so the snapshot must neither share its ids nor make it look
  // like a redelivery (the same rule as a non-transactional message's, gateway::on_message).
  const protocol::lsn at{consistent_point.value - 1};
  if (stop_asked_) co_return failure{{}, "initial snapshot: stopped: walgate is shutting down", {}, false};
  // (moved up, never down: a snapshot taken again after one was cut off begins later)
  if (!log_.set_origin(at)) co_return failure{{}, log_.error(), {}, false};
  st_ = std::make_shared<state>();
  auto st = st_;
  running_ = true;
  struct running_guard {
    bool& r;
    ~running_guard() { r = false; }
  } guard{running_};
  asio::steady_timer wake(loop_);
  st->wake = &wake;
  // (st->wake is this frame's timer: cleared on every way out; a worker left behind after a
  // stop posts nothing — the loop may be gone)
  struct wake_guard {
    std::shared_ptr<state> st;
    ~wake_guard() { st->wake = nullptr; }
  } clear_wake{st};
  auto poke = [st, loop = loop_] {
    {
      std::lock_guard lock(st->m);
      if (st->stop_asked) return;
    }
    asio::post(loop, [st] {
      if (st->wake) st->wake->cancel();
    });
  };
  auto pool = std::make_unique<asio::thread_pool>(opts_.workers);
  // The pool's tasks ended (and the rows they posted appended): joined. After stop(), for
  // stop_wait at most: a task inside libpq whose backend answers nothing is left behind with
  // its pool (it posts nothing more: stopped).
  auto settle = [&]() -> asio::awaitable<void> {
    std::optional<std::chrono::steady_clock::time_point> deadline;
    for (;;) {
      {
        std::lock_guard lock(st->m);
        if (st->tasks == 0 && st->in_flight == 0) break;
        if (st->stop_asked && !deadline) deadline = std::chrono::steady_clock::now() + stop_wait;
      }
      if (deadline && std::chrono::steady_clock::now() >= *deadline) {
        say("initial snapshot: a connection did not end within " + std::to_string(stop_wait.count()) +
            " s of its cancel: not waited for");
        (void)pool.release();   // (its threads go with the process)
        st->wake = nullptr;
        co_return;
      }
      wake.expires_after(std::chrono::milliseconds(100));
      co_await wake.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    pool->join();
    st->wake = nullptr;
  };
  const auto started = std::chrono::steady_clock::now();

  // The plan: the tables, their columns, and the pieces to copy, read in the snapshot.
  st->posting();
  asio::post(*pool, [st, o = opts_, exported, poke] {
    std::string error;
    conn_guard conn;
    state::task_guard task{st};
    conn.c = in_snapshot(o, exported, "walgate initial snapshot", error, [&](const PGconn* c) { task.watch(c); });
    if (!conn.c) return st->fail(error), poke();
    auto tables = published_tables(conn.c, o.publications, {}, error);
    if (!tables) return st->fail(error), poke();
    auto now = exec(conn.c, "SELECT (extract(epoch FROM now()) * 1000000)::bigint", PGRES_TUPLES_OK, error);
    if (!now) return st->fail(error), poke();
    st->commit_time = protocol::unix_us_to_pg(std::strtoll(PQgetvalue((*now)->r, 0, 0), nullptr, 10));
    st->tables = std::move(*tables);
    const bool ranges = PQserverVersion(conn.c) >= 140000;   // a ctid range is a TID range scan
    for (auto& [key, t] : st->tables) {
      if (t.identity.columns.empty()) continue;
      t.identity.generation = pg::next_generation();
      const std::size_t index = st->defs.size();
      st->defs.push_back(&t);
      auto p = std::make_unique<table_progress>();
      p->name = t.schema + "." + t.name;
      // Its heap: the table itself, or the leaves of a partitioned one.
      auto leaves = exec(conn.c,
                         "SELECT format('%I.%I', n.nspname, c.relname), "
                         "pg_relation_size(c.oid) / current_setting('block_size')::bigint, greatest(c.reltuples, 0)::bigint "
                         "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                         "WHERE c.relkind IN ('r', 'm') AND c.oid IN ("
                         "  SELECT format('%I.%I', $1::text, $2::text)::regclass::oid UNION "
                         "  SELECT relid FROM pg_catalog.pg_partition_tree(format('%I.%I', $1::text, $2::text)::regclass) "
                         "  WHERE isleaf) ORDER BY 1",
                         PGRES_TUPLES_OK, error, {t.schema, t.name});
      if (!leaves) return st->fail(error), poke();
      for (int i = 0; i < PQntuples((*leaves)->r); ++i) {
        std::string leaf = t.relkind == 'p' ? PQgetvalue((*leaves)->r, i, 0) : std::string();
        const std::uint64_t pages = std::strtoull(PQgetvalue((*leaves)->r, i, 1), nullptr, 10);
        p->estimate += std::strtoull(PQgetvalue((*leaves)->r, i, 2), nullptr, 10);
        if (!ranges || pages <= o.range_pages) {
          st->units.push_back({index, leaf, {}});
          continue;
        }
        for (std::uint64_t from = 0; from < pages; from += o.range_pages) {
          std::string extra = "ctid >= '(" + std::to_string(from) + ",0)'::tid";
          if (from + o.range_pages < pages) extra += " AND ctid < '(" + std::to_string(from + o.range_pages) + ",0)'::tid";
          st->units.push_back({index, leaf, extra});
        }
      }
      st->progress.push_back(std::move(p));
    }
    {
      std::lock_guard lock(st->m);
      st->planned = true;
    }
    poke();
  });
  while (true) {
    {
      std::lock_guard lock(st->m);
      if (st->planned || st->failed) break;
    }
    wake.expires_after(std::chrono::seconds(1));
    co_await wake.async_wait(asio::as_tuple(asio::use_awaitable));
  }
  if (st->stopped()) {
    co_await settle();
    co_return fail(st->error);
  }
  st->plan_seen = true;
  std::uint64_t estimate = 0;
  for (const auto& p : st->progress) estimate += p->estimate;
  say("initial snapshot: " + std::to_string(st->defs.size()) + " tables (about " + with_commas(estimate) + " rows) in " +
      std::to_string(st->units.size()) + " pieces on " + std::to_string(opts_.workers) + " connections, at " +
      consistent_point.to_string());

  // Each row a read event of the one transaction: its record made on the copying thread (with
  // index 0), its index and Debezium's "last" set on the loop, which appends them in the order
  // handed over (the loop is the only writer).
  protocol::transaction_info txn;
  txn.commit_lsn = at;
  txn.end_lsn = consistent_point;
  txn.commit_time = st->commit_time;
  std::uint32_t index = 0;
  std::string append_error, held;
  std::size_t held_table = SIZE_MAX;
  auto append = [&](std::size_t table, std::span<char> record, bool last) {
    if (!transform::place_record(record, index, last)) {
      append_error = "a row's record is malformed";
      return false;
    }
    const auto& id = st->defs[table]->identity;
    log_.add_record(std::string_view(record.data(), record.size()), transform::event_id{at, index},
                    transform::op::read, 0, id.nspname, id.relname, false);
    ++index;
    return log_.error().empty();
  };
  if (!log_.begin(at)) co_return failure{{}, "initial snapshot: the event log refused it", {}, false};

  // The copies.
  const std::size_t workers = std::min(opts_.workers, std::max<std::size_t>(1, st->units.size()));
  for (std::size_t w = 0; w < workers; ++w) {
    st->posting();
    asio::post(*pool, [st, o = opts_, exported, poke, loop = loop_, txn, &append, &held_table, &held] {
      std::string error;
      conn_guard conn;
      state::task_guard task{st};
      conn.c = in_snapshot(o, exported, "walgate initial snapshot", error, [&](const PGconn* c) { task.watch(c); });
      auto done = [&] {
        std::lock_guard lock(st->m);
        ++st->workers_done;
      };
      if (!conn.c) {
        st->fail(error);
        done();
        return poke();
      }
      transform::record_writer records;
      std::string storage;
      std::vector<pg::tuple_column> values;
      while (!st->stopped()) {
        state::unit u;
        {
          std::lock_guard lock(st->m);
          if (st->next_unit == st->units.size()) break;
          u = st->units[st->next_unit++];
        }
        const table_def& t = *st->defs[u.table];
        if (!exec(conn.c, copy_sql(t, u.from, u.extra), PGRES_COPY_OUT, error)) {
          st->fail(error);
          break;
        }
        auto b = st->take_batch(u.table);
        auto hand_over = [&] {
          if (b->ends.empty()) return true;
          {
            std::unique_lock lock(st->m);
            st->cv.wait(lock, [&] { return st->failed || st->in_flight < max_in_flight; });
            if (st->failed) return false;
            ++st->in_flight;
          }
          asio::post(loop, [st, b, &append, &held_table, &held] {
            bool ok = !st->stopped();
            // Debezium's "last": a row goes in once the next one shows it was not the last.
            if (ok && held_table != SIZE_MAX) ok = append(held_table, held, false);
            const std::size_t n = b->ends.size();
            for (std::size_t i = 0, from = 0; ok && i + 1 < n; from = b->ends[i++])
              ok = append(b->table, std::span<char>(b->records.data() + from, b->ends[i] - from), false);
            if (ok) {
              const std::size_t from = n > 1 ? b->ends[n - 2] : 0;
              held.assign(b->records, from, b->ends[n - 1] - from);
              held_table = b->table;
            }
            st->progress[b->table]->rows += n;
            if (!ok) st->fail("cannot log a row");
            std::lock_guard lock(st->m);
            if (b->records.capacity() <= 2 * batch_bytes) st->spare.push_back(b);   // (not one grown by a huge row)
            --st->in_flight;
            st->cv.notify_all();
            if (st->wake) st->wake->cancel();
          });
          b = st->take_batch(u.table);
          return true;
        };
        bool ok = true;
        for (;;) {
          char* buf = nullptr;
          int n = PQgetCopyData(conn.c, &buf, 0);
          if (n == -1) break;
          if (n < 0) {
            st->fail(one_line(PQerrorMessage(conn.c)));
            ok = false;
            break;
          }
          // (values are views into buf, or into storage: buf is freed once the record is made)
          ok = protocol::parse_copy_text_row(std::string_view(buf, static_cast<std::size_t>(n)), storage, values, error);
          if (ok && values.size() != t.identity.columns.size()) {
            error = "a COPY row of " + std::to_string(values.size()) + " columns for " +
                    std::to_string(t.identity.columns.size()) + " in " + t.schema + "." + t.name;
            ok = false;
          }
          if (!ok) {
            PQfreemem(buf);
            st->fail(error);
            break;
          }
          transform::change c;
          c.kind = transform::op::read;
          c.txn = &txn;
          c.change_lsn = txn.commit_lsn;
          c.relation = &t.identity;
          c.after = values;
          c.types = &t.types;
          records.write(b->records, c);
          PQfreemem(buf);
          b->ends.push_back(static_cast<std::uint32_t>(b->records.size()));
          if (b->records.size() >= batch_bytes && !(ok = hand_over())) break;
        }
        if (ok) ok = hand_over();
        if (!ok) break;
        result_guard end(PQgetResult(conn.c));
        if (PQresultStatus(end.r) != PGRES_COMMAND_OK) {
          st->fail(one_line(PQresultErrorMessage(end.r)));
          break;
        }
        while (PGresult* more = PQgetResult(conn.c)) PQclear(more);
      }
      done();
      poke();
    });
  }

  // Wait for the copies, saying how far they are every 5 s.
  auto last_report = std::chrono::steady_clock::now();
  std::uint64_t last_rows = 0;
  while (true) {
    {
      std::lock_guard lock(st->m);
      if ((st->workers_done == workers && st->in_flight == 0) || st->stop_asked) break;
    }
    wake.expires_after(std::chrono::seconds(1));
    co_await wake.async_wait(asio::as_tuple(asio::use_awaitable));
    const auto now = std::chrono::steady_clock::now();
    if (now - last_report >= std::chrono::seconds(5) && !st->stopped()) {
      const double secs = std::chrono::duration<double>(now - last_report).count();
      std::uint64_t rows = 0;
      for (const auto& p : st->progress) rows += p->rows;
      const double rate = static_cast<double>(rows - last_rows) / secs;
      for (const auto& p : st->progress) {
        const std::uint64_t r = p->rows;
        if (r == 0 || (p->estimate && r >= p->estimate)) continue;
        std::string line = "initial snapshot: " + p->name + " " + with_commas(r) + " rows";
        if (p->estimate) line += " of about " + with_commas(p->estimate);
        line += " (" + with_commas(static_cast<std::uint64_t>(rate)) + " rows/s in all";
        if (p->estimate && rate > 0)
          line += ", about " + std::to_string(static_cast<long>((p->estimate - r) / rate) + 1) + " s to go";
        say(line + ")");
      }
      last_report = now;
      last_rows = rows;
    }
  }
  co_await settle();
  st->spare.clear();   // (the state outlives the copy: /metrics reads its progress)
  if (!append_error.empty()) st->fail(append_error);
  if (st->stopped()) {
    log_.abort();
    co_return fail(st->error);
  }
  if (held_table != SIZE_MAX && !append(held_table, held, true)) {
    log_.abort();
    co_return fail(append_error.empty() ? log_.error() : append_error);
  }
  log_.commit(at, consistent_point);
  if (!log_.error().empty()) co_return failure{{}, log_.error(), {}, false};
  // Durable before the stream starts (and before the SNAPSHOT file says so): the first
  // acknowledgement PostgreSQL gets is past it.
  if (!log_.sync()) co_return failure{{}, log_.error(), {}, false};
  std::string error;
  if (!write_initial_state(log_.options().dir, initial_state::done, opts_.fsync, error))
    co_return failure{{}, error, {}, false};
  std::uint64_t rows = 0;
  for (const auto& p : st->progress) rows += p->rows;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  char took[32];
  std::snprintf(took, sizeof took, "%.2f", secs);
  say("initial snapshot: " + with_commas(rows) + " rows of " + std::to_string(st->defs.size()) + " tables in " + took +
      " s (" +
      with_commas(static_cast<std::uint64_t>(static_cast<double>(rows) / std::max(secs, 1e-3))) +
      " rows/s)" + (rows ? ", logged as " + at.to_string() + ":0 to :" + std::to_string(rows - 1) : std::string()));
  co_return outcome<void>{};
}

void initial_snapshot::register_metrics(metrics_registry& r) {
  r.add_value("walgate_initial_snapshot_running", "gauge", "1 while the initial snapshot is being copied into the log.",
              [this] { return running_ ? 1 : 0; });
  // Per table while the copy runs (what its progress is followed by); then only the totals, with
  // no table label: /metrics does not name the published tables for the life of the process.
  auto per_table = [this](std::vector<metrics_registry::sample>& out, auto figure) {
    if (!st_->plan_seen) return;
    if (running_) {
      for (const auto& p : st_->progress) out.push_back({"{table=" + label(p->name) + "}", std::to_string(figure(*p))});
      return;
    }
    std::uint64_t total = 0;
    for (const auto& p : st_->progress) total += figure(*p);
    out.push_back({"", std::to_string(total)});
  };
  r.add("walgate_initial_snapshot_rows", "gauge",
        "Rows copied by the initial snapshot: per table while it runs, then in all (no table label).",
        [per_table](auto& out) { per_table(out, [](const table_progress& p) { return p.rows.load(); }); });
  r.add("walgate_initial_snapshot_rows_estimated", "gauge",
        "Rows the initial snapshot expects (the catalog's statistics; 0: unknown): per table while it runs, then in all.",
        [per_table](auto& out) { per_table(out, [](const table_progress& p) { return p.estimate; }); });
}

}  // namespace walgate::proxy
