// Per-client snapshots (snapshot=true): snapshot_job reads the rows a request may see in a
// REPEATABLE READ transaction on a pool thread, encodes them in the client's format (column and
// row grants and where= applied) and hands them over with bounded memory; snapshot_service
// admits jobs (rate limits per address and subject, a queue, --snapshot-concurrency) and, once a
// job's snapshot is taken, connects it to the log (the changes the snapshot did not see).
// No strong reason for one file of this length: the two classes share snapshot.hpp, nothing
// more (the service is the job's friend, which holds across files). Seams: snapshot_service
// (about 190 lines, from its constructor on) could be snapshot_service.cpp; snapshot_job::run()
// is about 260 lines, in steps that could be named: the transaction and its WAL bound, the
// tables, the row encoder (the encode lambda), and each table's copy with its row filter.
#include "walgate/proxy/snapshot.hpp"

#include "walgate/protocol/commands.hpp"
#include "walgate/proxy/metrics.hpp"
#include "walgate/proxy/policy.hpp"
#include "walgate/proxy/predicate.hpp"
#include "walgate/transform/pg_types.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "walgate/proxy/snapshot_sql.hpp"

#include <libpq-fe.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <thread>

namespace walgate::proxy {

namespace {
/// Addresses and subjects whose snapshot starts of the last minute are remembered, at most (the
/// map a churn of new addresses could otherwise grow without end).
constexpr std::size_t max_rate_keys = 65536;
}  // namespace

namespace asio = boost::asio;
namespace pg = protocol::pgoutput;
using namespace snapshot_sql;

snapshot_job::snapshot_job(asio::any_io_executor loop, stream_request request, transform::encoder_options enc,
                           const snapshot_options& o)
    : loop_(std::move(loop)), request_(std::move(request)), encoder_(std::move(enc)), opts_(o) {}

bool snapshot_job::take(std::vector<payload_ptr>& out, std::size_t max_items, std::size_t max_bytes) {
  std::lock_guard lock(m_);
  std::size_t bytes = 0;
  const bool had = !rows_.empty();
  while (!rows_.empty() && out.size() < max_items && bytes < max_bytes) {
    bytes += rows_.front()->size();
    bytes_ -= rows_.front()->size();
    out.push_back(std::move(rows_.front()));
    rows_.pop_front();
  }
  if (had) cv_.notify_all();
  return had;
}

snapshot_job::state snapshot_job::current() const {
  std::lock_guard lock(m_);
  return state_;
}
std::string snapshot_job::error() const {
  std::lock_guard lock(m_);
  return error_;
}
unsigned snapshot_job::http_status() const {
  std::lock_guard lock(m_);
  return status_;
}
std::uint64_t snapshot_job::rows() const {
  std::lock_guard lock(m_);
  return rows_total_;
}

void snapshot_job::cancel() {
  PGcancel* interrupt = nullptr;
  {
    std::lock_guard lock(m_);
    if (cancelled_) return;
    cancelled_ = true;
    cv_.notify_all();
    std::swap(interrupt, cancel_);
  }
  // A worker inside libpq (a COPY waiting for a lock, a slow scan) is interrupted by the
  // server: the cancel request is a connection of its own, made off the event loop.
  if (interrupt)
    std::thread([interrupt] {
      char why[256];
      PQcancel(interrupt, why, sizeof why);
      PQfreeCancel(interrupt);
    }).detach();
}

bool snapshot_job::covers(const logged_event& e) const {
  // A non-transactional message has no xid: it is before the snapshot when its WAL position is.
  if (e.xid == 0) return e.id.commit_lsn < wal_bound_;
  return snap_.sees(e.xid);
}

void snapshot_job::notify() {
  {
    std::lock_guard lock(m_);
    // (cancelled: the loop may be gone — a worker left behind at shutdown posts nothing)
    if (notify_posted_ || cancelled_) return;
    notify_posted_ = true;
  }
  asio::post(loop_, [w = weak_from_this()] {
    auto j = w.lock();
    if (!j) return;
    {
      std::lock_guard lock(j->m_);
      j->notify_posted_ = false;
    }
    if (j->wake_) j->wake_();
  });
}

bool snapshot_job::push(payload_ptr p) {
  std::unique_lock lock(m_);
  cv_.wait(lock, [&] { return cancelled_ || bytes_ < opts_.client_bytes; });
  if (cancelled_) return false;
  const bool was_empty = rows_.empty();
  bytes_ += p->size();
  rows_.push_back(std::move(p));
  ++rows_total_;
  lock.unlock();
  if (was_empty) notify();
  return true;
}

void snapshot_job::finish(state s, std::string error, unsigned status) {
  {
    std::lock_guard lock(m_);
    state_ = s;
    error_ = std::move(error);
    status_ = status;
  }
  notify();
}

void snapshot_job::run() {
  {
    std::lock_guard lock(m_);
    if (cancelled_) {
      state_ = state::failed;
      error_ = "cancelled";
      return;
    }
    state_ = state::reading;
  }
  auto fail = [&](unsigned status, std::string why) { finish(state::failed, "snapshot: " + why, status); };
  std::string error;
  conn_guard conn;
  conn.c = snapshot_sql::connect(opts_.conninfo, "walgate snapshot", static_cast<long>(opts_.statement_timeout.count()),
                                 error);
  if (!conn.c) {
    fail(503, error);
    return;
  }
  {
    std::lock_guard lock(m_);
    if (cancelled_) {
      state_ = state::failed;
      error_ = "cancelled";
      return;
    }
    cancel_ = PQgetCancel(conn.c);
  }
  struct cancel_guard {   // freed here unless cancel() took it
    snapshot_job& j;
    ~cancel_guard() {
      std::lock_guard lock(j.m_);
      if (j.cancel_) PQfreeCancel(j.cancel_);
      j.cancel_ = nullptr;
    }
  } freed{*this};
  if (!exec(conn.c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", PGRES_COMMAND_OK, error)) {
    fail(503, error);
    return;
  }
  // The first statement takes the transaction's snapshot; W is read after it, so every commit
  // the snapshot sees ends before W.
  // A standby (walgate streaming from one, 16+) is refused: its snapshots do not list the
  // transactions they see as running (pg_current_snapshot() gives xmin:xmax and no xip — they
  // are kept elsewhere in recovery), and it has no insert position; which logged transactions
  // such a snapshot saw cannot be told by xid, and a row would be lost or sent twice.
  auto head = exec(conn.c,
                   "SELECT pg_current_snapshot()::text, "
                   "CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_insert_lsn()::text END, "
                   "current_setting('wal_block_size')::int, "
                   "(extract(epoch FROM transaction_timestamp()) * 1000000)::bigint",
                   PGRES_TUPLES_OK, error);
  if (!head) {
    fail(503, error);
    return;
  }
  if (PQgetisnull((*head)->r, 0, 1)) {
    fail(501, "per-client snapshots are not taken on a standby, and walgate streams from one: a standby's "
              "snapshot does not say which transactions it sees as running, so its rows cannot be joined "
              "exactly to the stream. from=0/0:0 replays what the log holds (the initial snapshot and every "
              "change since, while the log retains its beginning); or stream from the primary");
    return;
  }
  auto snap = protocol::parse_pg_snapshot(PQgetvalue((*head)->r, 0, 0));
  auto w = protocol::lsn::parse(PQgetvalue((*head)->r, 0, 1));
  const long block = std::strtol(PQgetvalue((*head)->r, 0, 2), nullptr, 10);
  protocol::transaction_info txn;
  txn.commit_time = protocol::unix_us_to_pg(std::strtoll(PQgetvalue((*head)->r, 0, 3), nullptr, 10));
  if (!snap || !w || block <= 0) {
    fail(502, "the server's snapshot or WAL position is malformed");
    return;
  }
  // The insert position right after a page header is the end of the record before it (decoding
  // reports record ends).
  protocol::lsn bound = *w;
  if (const auto in_page = w->value % static_cast<std::uint64_t>(block); in_page <= 40) bound = protocol::lsn{w->value - in_page};

  // The published tables the request selects, and their columns.
  const stream_request& r = request_;
  auto found = snapshot_sql::published_tables(
      conn.c, opts_.publications,
      [&r](const std::string& schema, const std::string& table) {
        if (r.granted && !r.granted->allows_table(schema, table)) return false;   // (--policy)
        if (r.tables.empty()) return true;
        for (const auto& t : r.tables)
          if (t.schema == schema && (t.any || t.table == table)) return true;
        return false;
      },
      error);
  if (!found) {
    fail(503, error);
    return;
  }
  auto& tables = *found;
  for (const auto& t : r.tables)
    if (!t.any && !tables.contains({t.schema, t.table})) {
      fail(400, "table " + sql_table_name(t) + " is not in the publication" + (opts_.publications.size() > 1 ? "s" : "") +
                    " streamed");
      return;
    }
  bool cancelled = false;
  {
    std::lock_guard lock(m_);
    snap_ = *snap;
    wal_bound_ = bound;
    taken_ = true;
    cancelled = cancelled_;
  }
  // The loop connects it to the log now, while the rows are read (not once cancelled: the
  // loop may be gone).
  if (!cancelled)
    asio::post(loop_, [w = weak_from_this()] {
    if (auto j = w.lock(); j && j->on_taken_) j->on_taken_();
  });

  // The rows, table by table (in name order).
  const std::string snapshot_id = snap->to_string();
  const auto f = request_.fmt;
  std::string storage, out;
  std::vector<pg::tuple_column> values;
  std::uint64_t ordinal = 0;
  payload_ptr held;   // Debezium: the previous row, sent once the next one shows it was not the last
  const table_def* held_table = nullptr;
  std::string held_line, held_mask;
  pg::cached_relation masked_rel;
  std::vector<pg::tuple_column> masked_values;
  auto encode = [&](const table_def& t, std::string_view line, bool first_of_table, bool last,
                    const std::string& mask) -> payload_ptr {
    if (!protocol::parse_copy_text_row(line, storage, values, error)) return nullptr;
    const auto* rel = f == transform::format::pgoutput2json ? &t.primary : &t.identity;
    if (values.size() != rel->columns.size() || (!mask.empty() && mask.size() != values.size())) {
      error = "a COPY row of " + std::to_string(values.size()) + " columns for " + std::to_string(rel->columns.size());
      return nullptr;
    }
    pg::tuple_view row = values;
    if (!mask.empty()) {   // column grants: the columns shown, in every field
      masked_rel = *rel;
      masked_rel.generation = 0;
      masked_rel.columns.clear();
      masked_values.clear();
      for (std::size_t i = 0; i < mask.size(); ++i)
        if (mask[i] == '1') {
          masked_rel.columns.push_back(rel->columns[i]);
          masked_values.push_back(values[i]);
        }
      rel = &masked_rel;
      row = masked_values;
    }
    transform::change c;
    c.kind = transform::op::read;
    c.txn = &txn;
    c.relation = rel;
    c.after = row;
    c.types = &t.types;
    c.seq = ordinal;
    c.index = static_cast<std::uint32_t>(ordinal - 1);
    c.snapshot = snapshot_id;
    c.snapshot_last = last;
    auto o = encoder_;
    o.compact = request_.compact;
    o.include_schema = request_.compact && first_of_table;
    out.clear();
    transform::encode_change(out, c, f, o);
    return payload::in_memory(std::move(out));
  };
  std::vector<predicate::cell> cells;
  for (const auto& [key, t] : tables) {
    if (t.identity.columns.empty()) continue;   // nothing published of it (pgoutput sends no rows either)
    // Row grants and where=: the rows within them, as the changes are decided (table_rows). The
    // SELECT carries what of them PostgreSQL decides alike (values quoted by libpq), so that it
    // reads only those rows where it can; every row read is then checked here.
    std::vector<table_rows::column> cols;
    for (const auto& c : t.identity.columns) cols.push_back({c.name, c.type_oid, c.key});
    const auto limit = table_rows::make(request_, t.schema, t.name, cols, t.identity.replica_identity, false);
    if (!limit.failed.empty()) {
      fail(403, limit.failed);
      return;
    }
    const std::string& mask = limit.mask('c');
    std::string condition;
    if (limit.limits()) {
      bool quoting_failed = false;
      condition = limit.sql(request_.granted.get(), cols, [&](std::string_view v) {
        char* q = PQescapeLiteral(conn.c, v.data(), v.size());
        if (!q) {
          quoting_failed = true;
          return std::string("NULL");
        }
        std::string out(q);
        PQfreemem(q);
        return out;
      });
      if (quoting_failed) condition.clear();   // (the gateway's check alone)
    }
    const std::string sql = copy_sql(t, {}, condition);
    if (!exec(conn.c, sql, PGRES_COPY_OUT, error)) {
      fail(503, error);
      return;
    }
    bool first = true;
    for (;;) {
      char* buf = nullptr;
      int n = PQgetCopyData(conn.c, &buf, 0);
      if (n == -1) break;
      if (n < 0) {
        fail(503, one_line(PQerrorMessage(conn.c)));
        return;
      }
      std::string_view line(buf, static_cast<std::size_t>(n));
      if (limit.limits()) {
        if (!protocol::parse_copy_text_row(line, storage, values, error)) {
          PQfreemem(buf);
          fail(502, error);
          return;
        }
        cells.clear();
        for (const auto& v : values)
          cells.push_back(v.kind == pg::column_kind::null ? predicate::cell{}
                                                           : predicate::cell{predicate::cell::state::text, protocol::as_string_view(v.value)});
        if (!limit.within(request_.granted.get(), 'r', cells)) {
          PQfreemem(buf);
          continue;
        }
      }
      ++ordinal;
      payload_ptr p;
      if (f == transform::format::debezium) {
        // The previous row goes out now that this one shows it was not the last.
        if (held && !push(std::move(held))) {
          PQfreemem(buf);
          finish(state::failed, "cancelled");
          return;
        }
        held = encode(t, line, first, false, mask);
        held_table = &t;
        held_mask = mask;
        held_line.assign(line);
      } else {
        p = encode(t, line, first, false, mask);
      }
      PQfreemem(buf);
      if (f == transform::format::debezium ? !held : !p) {
        fail(502, error);
        return;
      }
      first = false;
      if (p && !push(std::move(p))) {
        finish(state::failed, "cancelled");
        return;
      }
    }
    result_guard end(PQgetResult(conn.c));
    if (PQresultStatus(end.r) != PGRES_COMMAND_OK) {
      fail(503, one_line(PQresultErrorMessage(end.r)));
      return;
    }
    while (PGresult* more = PQgetResult(conn.c)) PQclear(more);
  }
  if (held) {   // the last row of the snapshot: source.snapshot "last"
    auto last = encode(*held_table, held_line, false, true, held_mask);
    if (!last) {
      fail(502, error);
      return;
    }
    if (!push(std::move(last))) {
      finish(state::failed, "cancelled");
      return;
    }
  }
  exec(conn.c, "COMMIT", PGRES_COMMAND_OK, error);
  finish(state::done);
}

snapshot_service::snapshot_service(asio::any_io_executor loop, snapshot_options o, const log_reader& log,
                                   read_past_fn read_past)
    : loop_(std::move(loop)), opts_(std::move(o)), log_(log), read_past_(std::move(read_past)) {
  if (opts_.max_running == 0) opts_.max_running = 1;
  pool_ = std::make_unique<asio::thread_pool>(opts_.max_running);
}

snapshot_service::~snapshot_service() {
  *alive_ = false;
  stop();
}

void snapshot_service::stop() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& w : queue_)
    if (auto j = w.lock()) j->cancel();
  for (auto& w : running_)
    if (auto j = w.lock()) j->cancel();
  queue_.clear();
  // Not a plain join: a worker inside libpq whose backend answers nothing (stopped, or a network
  // that drops packets while keepalives and tcp_user_timeout count down) would hold the process
  // past SIGTERM. Cancelled above; given stop_wait to end; else left behind, its pool released.
  std::unique_lock lock(in_pool_->m);
  in_pool_->stopped = true;
  const bool ended = in_pool_->cv.wait_for(lock, stop_wait, [p = in_pool_.get()] { return p->n == 0; });
  lock.unlock();
  if (ended) {
    pool_->join();
  } else {
    std::fprintf(stderr, "walgate: a snapshot connection did not end within %lld s of its cancel: not waited for\n",
                 static_cast<long long>(stop_wait.count()));
    (void)pool_.release();   // (its threads go with the process)
  }
}

std::string snapshot_service::rate_refusal(std::string_view who, std::size_t per_minute,
                                           std::chrono::steady_clock::duration left) {
  const char* flag = who == "address" ? "--snapshots-per-minute-per-address"
                     : who == "connection" ? "--snapshots-per-minute-per-mux"
                                           : "--snapshots-per-minute-per-subject";
  return "too many snapshots begun by this " + std::string(who) + " (limit " + std::to_string(per_minute) +
         " a minute, " + flag + "); try again in " + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(left).count() + 1) +
         " s";
}

std::shared_ptr<snapshot_job> snapshot_service::admit(const stream_request& r, const transform::encoder_options& enc,
                                                      unsigned& status, std::string& refusal, std::string_view address,
                                                      std::string_view subject) {
  if (opts_.conninfo.empty()) {
    status = 501;
    refusal = "snapshots are not configured on this gateway";
    return nullptr;
  }
  // Each snapshot is a PostgreSQL session: begun at most so many times a minute by one address
  // and by one subject, whatever the connections and subscriptions they come through (counted
  // once admitted: a 503 uses none of it).
  std::vector<std::deque<std::chrono::steady_clock::time_point>*> rate_keys;
  std::chrono::steady_clock::time_point rate_now;
  {
    const auto now = std::chrono::steady_clock::now();
    const auto minute_ago = now - std::chrono::minutes(1);
    if (recent_starts_.size() >= max_rate_keys)
      std::erase_if(recent_starts_, [&](const auto& kv) { return kv.second.empty() || kv.second.back() <= minute_ago; });
    std::vector<std::deque<std::chrono::steady_clock::time_point>*> keys;
    struct limit {
      const char* prefix;
      std::string_view key;
      std::size_t per_minute;
      const char* who;
    };
    for (const auto& l : {limit{"a:", address, opts_.per_address_minute, "address"},
                          limit{"s:", subject, opts_.per_subject_minute, "token's subject"}}) {
      if (l.key.empty() || !l.per_minute) continue;
      const std::string key = std::string(l.prefix) + std::string(l.key);
      // (full of keys all begun within the minute: a new key is not counted until some go)
      if (recent_starts_.size() >= max_rate_keys && !recent_starts_.count(key)) continue;
      auto& q = recent_starts_[key];
      while (!q.empty() && q.front() <= minute_ago) q.pop_front();
      if (q.size() >= l.per_minute) {
        ++rate_limited_;
        status = 429;
        refusal = rate_refusal(l.who, l.per_minute, q.front() - minute_ago);
        return nullptr;
      }
      keys.push_back(&q);
    }
    rate_keys = std::move(keys);
    rate_now = now;
  }
  std::erase_if(queue_, [](const auto& w) { return w.expired(); });
  if (stopped_ || (running_count_ >= opts_.max_running && queue_.size() >= opts_.max_queued)) {
    ++rejected_;
    status = 503;
    refusal = "too many snapshots at once (" + std::to_string(opts_.max_running) + " running, " +
              std::to_string(queue_.size()) + " waiting); try again later";
    return nullptr;
  }
  for (auto* q : rate_keys) q->push_back(rate_now);
  auto o = opts_;
  if (opts_.pinned)
    if (auto pinned = opts_.pinned(); !pinned.empty()) o.conninfo = std::move(pinned);
  auto j = std::make_shared<snapshot_job>(loop_, r, enc, o);
  queue_.push_back(j);
  dispatch();
  // What the request holds: when its last copy goes (the client gone, or never made: a failed
  // handshake), the job is cancelled — the worker keeps only the job itself.
  return std::shared_ptr<snapshot_job>(j.get(), [j](snapshot_job*) mutable {
    j->cancel();
    j.reset();
  });
}

void snapshot_service::dispatch() {
  while (!stopped_ && running_count_ < opts_.max_running && !queue_.empty()) {
    auto j = queue_.front().lock();
    queue_.pop_front();
    if (!j) continue;   // the client left while it waited
    ++running_count_;
    ++started_;
    std::erase_if(running_, [](const auto& w) { return w.expired(); });
    running_.push_back(j);
    // Before the snapshot is taken: every transaction logged from here on is looked at.
    j->queued_at_seq_ = log_.visible_seq();
    j->on_taken_ = [this, w = std::weak_ptr<snapshot_job>(j), alive = alive_] {
      if (auto j = w.lock(); j && *alive) on_taken(j);
    };
    {
      std::lock_guard lock(in_pool_->m);
      ++in_pool_->n;
    }
    asio::post(*pool_, [this, j, alive = alive_, in = in_pool_] {
      j->run();
      std::unique_lock lock(in->m);
      struct done {
        std::unique_lock<std::mutex>& lock;
        in_pool& in;
        ~done() {
          --in.n;
          lock.unlock();
          in.cv.notify_all();
        }
      } end{lock, *in};
      if (in->stopped) return;   // (the loop may be gone: nothing posted to it)
      asio::post(loop_, [this, j, alive] {
        if (!*alive) return;
        --running_count_;
        if (j->current() == snapshot_job::state::failed) ++failed_;
        else rows_ += j->rows();
        dispatch();
      });
    });
  }
}

void snapshot_service::on_taken(const std::shared_ptr<snapshot_job>& j) {
  // Transactions the snapshot did not see may have been logged already: their commit is in the
  // WAL, decoded and sent, before the server stops listing them as running (listed in xip, or
  // at or past xmax when they are the newest). The client's changes start at the first of them.
  // (Behind the oldest retained event, the subscription says so: not retained.)
  std::uint64_t start = j->queued_at_seq_;
  const auto& snap = j->snap_;
  if (auto seq = log_.first_recent_transaction([&snap](std::uint32_t xid) { return !snap.sees(xid); }); seq && *seq < start)
    start = *seq;
  j->start_seq_ = start;
  if (j->wake_) j->wake_();
  std::weak_ptr<snapshot_job> w = j;
  read_past_(j->wal_bound_, std::weak_ptr<const void>(j), [w](std::uint64_t seq, transform::event_id last) {
    auto j = w.lock();
    if (!j) return;
    j->end_seq_ = seq;
    j->end_id_ = last;
    if (j->wake_) j->wake_();
  });
}

void snapshot_service::register_metrics(metrics_registry& m) {
  m.add_value("walgate_snapshots_running", "gauge", "Per-client snapshots reading now.",
              [this] { return static_cast<std::uint64_t>(running_count_); });
  m.add_value("walgate_snapshots_queued", "gauge", "Per-client snapshots waiting for a free slot.", [this] {
    std::erase_if(queue_, [](const auto& w) { return w.expired(); });
    return static_cast<std::uint64_t>(queue_.size());
  });
  m.add_value("walgate_snapshots_total", "counter", "Per-client snapshots begun.", [this] { return started_; });
  m.add_value("walgate_snapshots_rejected_total", "counter", "Per-client snapshots refused (503: the queue was full).",
              [this] { return rejected_; });
  m.add_value("walgate_snapshots_failed_total", "counter", "Per-client snapshots that failed or were cancelled.",
              [this] { return failed_; });
  m.add_value("walgate_snapshot_rows_total", "counter", "Rows sent by finished per-client snapshots.",
              [this] { return rows_; });
  m.add_value("walgate_snapshots_rate_limited_total", "counter",
              "Per-client snapshots refused (429): their address, their token's subject or their /v1/mux connection began too many in the last minute.",
              [this] { return rate_limited_; });
}

}  // namespace walgate::proxy
