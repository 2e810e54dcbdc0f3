// One stream client's way through the event log (subscription.hpp): its batches, read from the
// log or from the row router's queue; each event decided by the request's filters and the
// token's grants (rows and columns) and encoded in its format (shared encodings, keys=,
// Debezium's transaction block); transaction records (transactions=true, group=transaction,
// empty_transactions); and, with snapshot=true, the snapshot's rows, its window of changes and
// its end marker first.
// Over 700 lines. Every part is a member working on the same cursor and open transaction, which
// is why it is one file, but not why it is this long. take() is about 180 lines: one event's
// whole decision in order (resume skip, message prefix, filters, row verdict, encoding, the
// transaction's begin and counts, keys=, compression, into the batch), with the same "stop
// here, closed if the batch is empty" exit written five times; it should be split into named
// steps. rows_verdict and the free functions before the constructor (the router's interests,
// known_to) could be a file of their own (about 175 lines).
#include "walgate/proxy/subscription.hpp"

#include "walgate/proxy/policy.hpp"
#include "walgate/proxy/predicate.hpp"
#include "walgate/proxy/snapshot.hpp"
#include "walgate/transform/json.hpp"

#include <algorithm>

namespace walgate::proxy {

/// A granted table's row conditions, per definition of it (table_rows, policy.hpp).
struct subscription::row_state {
  std::map<std::string, table_rows> tables;   // schema.table + definition signature
  std::vector<predicate::cell> cells;
  std::vector<std::uint64_t> checked;         // row_router::definition_of of each of tables' keys
};

bool subscription::checked(std::uint64_t definition) const {
  return row_state_ && std::find(row_state_->checked.begin(), row_state_->checked.end(), definition) !=
                           row_state_->checked.end();
}

subscription::row_verdict subscription::rows_verdict(const logged_event& e, std::string& error) {
  mask_ = nullptr;
  const grants* g = request_.granted.get();
  const char op = static_cast<char>(e.kind);
  if (e.table.empty() || e.kind == transform::op::truncate) return row_verdict::pass;
  const bool by_grant = g && g->row_filtered(e.schema, e.table, op);
  const bool by_where = request_.where != nullptr;
  const bool by_columns = g && g->column_limited(e.schema, e.table);
  if (!by_grant && !by_where && !by_columns) return row_verdict::pass;
  const transform::change* c = encodings_.decode(e, error);
  if (!c || !c->relation) {
    if (error.empty()) error = "event #" + std::to_string(e.seq) + " in the event log has no table definition";
    return row_verdict::damaged;
  }
  if (!row_state_) row_state_ = std::make_unique<row_state>();
  const auto& rel = *c->relation;
  std::string key = e.schema + '\0' + e.table + '\0';   // (no name holds a NUL)
  for (const auto& col : rel.columns) key += col.name + '\x1f' + std::to_string(col.type_oid) + (col.key ? "k" : "") + '\x1e';
  key += rel.replica_identity;
  auto it = row_state_->tables.find(key);
  if (it == row_state_->tables.end()) {
    std::vector<table_rows::column> cols;
    for (const auto& col : rel.columns) cols.push_back({col.name, col.type_oid, col.key});
    it = row_state_->tables.emplace(key, table_rows::make(request_, e.schema, e.table, cols, rel.replica_identity, true)).first;
    row_state_->checked.push_back(row_router::definition_of(rel));   // (the router stops giving it every event)
  }
  const auto& t = it->second;
  if (!t.failed.empty()) {
    error = t.failed;
    return row_verdict::failed;
  }
  // The columns shown: those of the op's grants (an update moved in or out: the update's).
  if (const auto& m = t.mask(op == 'r' ? 'c' : op); !m.empty()) mask_ = &m;
  if (!by_grant && !by_where) return row_verdict::pass;
  // Whether a row's values are within the grants of this op and the request's where=.
  // (A TOASTed value an update did not change is not in the new row: the old row's is the same.)
  auto within = [&](protocol::pgoutput::tuple_view row, protocol::pgoutput::tuple_view old = {}) {
    auto& cells = row_state_->cells;
    cells.clear();
    for (std::size_t k = 0; k < row.size(); ++k) {
      const auto* col = &row[k];
      if (col->kind == protocol::pgoutput::column_kind::unchanged_toast && k < old.size() &&
          old[k].kind != protocol::pgoutput::column_kind::unchanged_toast && old[k].kind != protocol::pgoutput::column_kind::null)
        col = &old[k];
      predicate::cell x;
      if (col->kind == protocol::pgoutput::column_kind::null) x.s = predicate::cell::state::null;
      else if (col->kind == protocol::pgoutput::column_kind::unchanged_toast) x.s = predicate::cell::state::unchanged;
      else x = {predicate::cell::state::text, protocol::as_string_view(col->value)};
      cells.push_back(x);
    }
    return t.within(g, op, cells);
  };
  switch (c->kind) {
    case transform::op::insert:
    case transform::op::read: return within(c->after) ? row_verdict::pass : row_verdict::skip;
    case transform::op::delete_: return within(c->before) ? row_verdict::pass : row_verdict::skip;
    case transform::op::update: {
      const bool now = within(c->after, c->before);
      // No old row sent: the key did not change, and the predicate's columns are key columns.
      const bool before = c->before.empty() ? now : within(c->before);
      if (before && now) return row_verdict::pass;
      if (now) return row_verdict::as_insert;
      if (before) return row_verdict::as_delete;
      return row_verdict::skip;
    }
    default: return row_verdict::pass;
  }
}

namespace {

/// A Debezium change event with its transaction block: the shared encoding ends with
/// "transaction":null} (encoded without transaction metadata); null if it does not.
payload_ptr with_transaction_block(const payload_ptr& p, const std::string& block) {
  static constexpr std::string_view none = "\"transaction\":null}";
  std::string end(none.size(), '\0');
  if (p->size() < none.size()) return nullptr;
  if (!p->spilled()) {
    end = std::string(p->bytes().substr(p->size() - none.size()));
  } else {
    std::string error;
    if (!p->read(p->size() - none.size(), end, error)) return nullptr;
  }
  if (end != none) return nullptr;
  return payload::with_tail(p, p->size() - 5, block + "}");   // (5: null})
}

/// What a request's events can be found by in the row router: for each table it may see, the
/// column and values every grant of it limits rows to by equality; nullopt when some table's
/// rows are not all so limited (a grant of every row, or of schema.*, an `or`, where=,
/// messages).
std::optional<std::vector<row_router::interest>> interests_of(const stream_request& r) {
  const grants* g = r.granted.get();
  if (!g || r.where) return std::nullopt;
  if (g->messages && (r.ops == 0 || (r.ops & op_bit_of('m')))) return std::nullopt;
  std::vector<row_router::interest> out;
  for (std::size_t i = 0; i < g->tables.size(); ++i) {
    const auto& pattern = g->tables[i].first;
    if (pattern.any) return std::nullopt;
    if (!r.tables.empty() && std::none_of(r.tables.begin(), r.tables.end(), [&](const table_pattern& t) {
          return t.schema == pattern.schema && (t.any || t.table == pattern.table);
        }))
      continue;   // (not asked for: none of its events)
    if (!g->rows[i]) return std::nullopt;
    auto eq = predicate::equality_of(*g->rows[i]);
    if (!eq) return std::nullopt;
    auto same = std::find_if(out.begin(), out.end(), [&](const row_router::interest& x) {
      return x.schema == pattern.schema && x.table == pattern.table;
    });
    if (same == out.end()) {
      out.push_back({pattern.schema, pattern.table, eq->column, eq->values});
    } else {
      if (same->column != eq->column) return std::nullopt;
      same->values.insert(same->values.end(), eq->values.begin(), eq->values.end());
    }
  }
  if (out.empty()) return std::nullopt;
  return out;
}

/// The router's finding is the whole decision for r (row_router::found): each table it routes
/// is granted by exactly one entry, whose rows are `column = value` or `column in (…)` alone
/// (no `and`), with every column shown, and r adds no where=. (Otherwise the grant decides each
/// event the router finds, as ever.)
bool router_decides(const stream_request& r, const std::vector<row_router::interest>& interests) {
  const grants* g = r.granted.get();
  if (!g || r.where) return false;
  for (const auto& in : interests) {
    int entries = 0;
    for (std::size_t i = 0; i < g->tables.size(); ++i) {
      const auto& pattern = g->tables[i].first;
      if (pattern.schema != in.schema || !(pattern.any || pattern.table == in.table)) continue;
      if (++entries > 1 || pattern.any || !g->rows[i] || g->columns[i]) return false;
      const auto& n = *g->rows[i];
      if (n.k != predicate::node::kind::compare) return false;
      auto eq = predicate::equality_of(n);
      if (!eq || eq->column != in.column) return false;
    }
    if (entries != 1) return false;
  }
  return true;
}

/// empty_transactions=true: whether e makes its transaction one the client of r may know of
/// (its empty records, when it is sent none of it): e is of a table its token may see — the
/// table and e's op granted (--policy), whatever rows its grants hold — that it asked for
/// (tables=), or a logical message it may receive (granted; by prefixes=, or with no tables=),
/// whatever its ops=, where= and row grants then leave of it. A transaction of tables (or
/// messages) outside its grants or tables= alone is another's: its xid, commit LSN, time and
/// origin are not sent. (Assumption: a grant of the table for other ops than e's does not make
/// e's transaction known — the token may not see that op of it.)
bool known_to(const stream_request& r, const logged_event& e, std::string_view prefix) {
  if (r.granted && !r.granted->allows(e.schema, e.table, static_cast<char>(e.kind))) return false;
  if (e.kind == transform::op::message && !r.prefixes.empty())
    return std::any_of(r.prefixes.begin(), r.prefixes.end(), [&](const std::string& g) { return glob_match(g, prefix); });
  if (r.tables.empty()) return true;
  if (e.table.empty()) return false;   // (a message, with tables= and no prefixes=: not asked for)
  return std::any_of(r.tables.begin(), r.tables.end(),
                     [&](const table_pattern& t) { return t.schema == e.schema && (t.any || t.table == e.table); });
}

}  // namespace

void resume_in_transaction(const log_reader& log, const stream_request& r, std::uint64_t& seq,
                           std::optional<transform::event_id>& skip_through) {
  if ((!r.transactions.value_or(false) && !r.group) || !r.from || r.from->at == transform::event_id::mark::commit || skip_through) return;
  auto first = log.resume_after({r.from->commit_lsn, 0, transform::event_id::mark::begin});
  if (first.error.empty() && first.seq && *first.seq < seq) {
    seq = *first.seq;
    skip_through = r.from;
  }
}

subscription::subscription(const log_reader& log, encoding_cache& encodings, stream_request request,
                           std::uint64_t start, std::optional<transform::event_id> skip_through, limits l,
                           std::shared_ptr<snapshot_job> snapshot, row_router* router)
    : log_(log),
      encodings_(encodings),
      request_(std::move(request)),
      limits_(l),
      enc_(encoding_for(request_)),
      unfiltered_(request_.tables.empty() && request_.ops == 0 && !request_.granted && !request_.where &&
                  request_.prefixes.empty()),
      cursor_(start),
      skip_through_(skip_through),
      snapshot_(std::move(snapshot)),
      router_(router) {
  // (empty_transactions=true follows every transaction: it reads every event, never routed)
  if (router_ && !request_.empty_transactions) interests_ = interests_of(request_);
  if (request_.where) event_cost_ = 1 + predicate::cost(*request_.where);
  if (request_.tables.size() > 4) tables_index_.emplace(request_.tables);   // (a few: compared in turn)
  exact_ = interests_ && router_decides(request_, *interests_);
  if (snapshot_) phase_ = phase::rows;
  // Where it resumes, should it end before an event: the id it started after.
  if (request_.from) resume_id_ = request_.from->to_string();
  if (skip_through_) resume_id_ = skip_through_->to_string();
  group_ = request_.group;
  transactions_ = group_ || (request_.transactions.value_or(false) &&
                             (request_.fmt == transform::format::native || request_.fmt == transform::format::wal2json ||
                              request_.fmt == transform::format::debezium));
  if (transactions_ && request_.from && request_.from->at != transform::event_id::mark::commit) resumed_in_ = request_.from;
  if (unfiltered_) encodings_.want_all(enc_, +1);
}

subscription::~subscription() {
  if (routed_) router_->remove(this);
  if (unfiltered_) encodings_.want_all(enc_, -1);
  if (snapshot_) snapshot_->cancel();
}

bool subscription::pending() const {
  if (ended() || waiting_) return false;
  if (routed_) return !queue_.empty() || overflow_;
  if (phase_ == phase::rows) return false;   // its worker wakes it
  if (phase_ == phase::changes) return snapshot_->end_seq() && cursor_ < std::min(*snapshot_->end_seq(), log_.visible_seq());
  return cursor_ < log_.visible_seq();
}

void subscription::close(end why, std::string reason) {
  if (end_ != end::none && why != end::shutdown) return;   // the first reason stands, but a shutdown says so
  end_ = why;
  reason_ = std::move(reason);
}

std::uint64_t subscription::lag_events() const {
  if (idle_routed()) return 0;   // (nothing of what committed since is for it)
  return log_.visible_seq() > cursor_ ? log_.visible_seq() - cursor_ : 0;
}

std::uint64_t subscription::lag_bytes() const {
  if (idle_routed()) return 0;
  return offset_ && log_.visible_offset() > offset_ ? log_.visible_offset() - offset_ : 0;
}

void subscription::next_batch(std::vector<item>& out) {
  out.clear();
  // A filter may pass over many events without a match: more reads, up to a bound on the work
  // one call does (the event loop serves everyone).
  if (ended()) return;
  if (phase_ != phase::live) {
    snapshot_batch(out);
    return;
  }
  waiting_ = false;
  int reads = 0;
  work_ = 0;
  do read_some(out);
  while (out.empty() && !ended() && !waiting_ && cursor_ < log_.visible_seq() && ++reads < 8 && work_ < work_budget);
}

void subscription::read_some(std::vector<item>& out) {
  if (routed_) {
    read_routed(out);
    return;
  }
  if (cursor_ < log_.first_seq()) {
    close(end::not_retained, "the resume position is no longer retained; take a new snapshot");
    return;
  }
  std::size_t bytes = 0;
  std::string read_error;
  // Records read are bounded like the batch (their encodings are about their size): what a
  // batch reads from disk is about what it sends.
  bool fetching = false;
  // Read in the background, the events come with this client's encoding (and its compressed
  // form) made there. (pgoutput2json compact's form with "s" is made here, when needed.)
  std::uint32_t prepare = want_encoding(enc_) | (deflate_bits_ ? want_deflate(deflate_bits_) : 0);
  auto batch = log_.read(cursor_, limits_.batch_events, limits_.batch_bytes, &read_error, &fetching, prepare);
  if (batch.empty() && fetching) {   // being read in the background: notified when in memory
    waiting_ = true;
    return;
  }
  if (batch.empty() && !read_error.empty()) {
    // Never a silent wait: the client is closed with the reason and where to resume.
    close(end::damaged, read_error);
    return;
  }
  // Lag is measured against what clients can see (the last commit: it never moves back, not
  // even when a reconnect drops a transaction half received), from the end of the next event
  // this client is to get: one large event is not lag, a client reading it at full speed is
  // not slow. Nor is one large transaction: what counts is committed after the one the client
  // is in.
  const std::uint64_t reading_to =
      batch.empty() ? 0 : std::max(batch.front()->end_offset, log_.transaction_end_offset(batch.front()->seq));
  if (live_ && !batch.empty() && log_.visible_offset() > reading_to &&
      log_.visible_offset() - reading_to > limits_.lag_bytes) {
    close(end::slow, "slow client: more than " + std::to_string(limits_.lag_bytes) + " bytes behind the stream");
    return;
  }
  // In a snapshot's changes: only up to its end, and only what it did not see.
  const bool window = phase_ == phase::changes;
  const std::uint64_t limit = window ? *snapshot_->end_seq() : UINT64_MAX;
  out.reserve(out.size() + batch.size());   // (one allocation for the batch, not one per doubling)
  for (const auto& e : batch) {
    if (e->seq >= limit) break;
    // The call's work is bounded by what its filters cost, not only by what it sends: a where=
    // that matches nothing must not hold the event loop for a whole read of events.
    if (work_ >= work_budget) break;
    work_ += event_cost_;
    cursor_ = e->seq + 1;
    offset_ = e->end_offset;
    if (!take(e, out, bytes, window)) break;
    if (bytes >= limits_.batch_bytes) break;
  }
  // Every visible transaction is whole: one that reached what is visible (or the snapshot
  // window's end, a transaction boundary) is over.
  if (txn_ && !ended() && (cursor_ >= log_.visible_seq() || (window && cursor_ >= limit))) end_transaction(out, bytes);
  if (!window && cursor_ >= log_.visible_seq()) {
    live_ = true;
    offset_ = log_.visible_offset();
    // Caught up: from here on the router finds its events, when its rows are found by equality.
    if (interests_ && !routed_ && phase_ == phase::live && !skip_through_ && !ended() && router_->routed() == cursor_) {
      router_->add(this, *interests_);
      routed_ = true;
    }
  }
}

void subscription::routed(std::uint64_t seq, row_router::found how) {
  if (overflow_) return;
  queue_.push_back(seq << 2 | static_cast<std::uint64_t>(how));
  if (queue_.size() > max_routed_queue) overflow_ = true;   // (it reads every event from its first queued on)
}

void subscription::unroutable(std::uint64_t from_seq, bool for_good) {
  routed_ = false;
  if (for_good) interests_.reset();   // (its column cannot be indexed: it stays reading every event)
  overflow_ = false;
  cursor_ = queue_.empty() ? from_seq : std::min(queue_.front() >> 2, from_seq);
  queue_.clear();
}

void subscription::read_routed(std::vector<item>& out) {
  if (overflow_) {   // too far behind for a queue: it reads every event, from its first queued one
    router_->remove(this);
    routed_ = false;
    overflow_ = false;
    cursor_ = queue_.front() >> 2;
    queue_.clear();
    read_some(out);
    return;
  }
  std::size_t bytes = 0;
  std::string read_error;
  const std::uint32_t prepare = want_encoding(enc_) | (deflate_bits_ ? want_deflate(deflate_bits_) : 0);
  // Bounded like read_some's work: events looked at (those its filters pass over count too).
  std::size_t looked = 0;
  while (!queue_.empty() && !ended() && out.size() < limits_.batch_events && bytes < limits_.batch_bytes &&
         looked++ < 8 * limits_.batch_events) {
    const std::uint64_t entry = queue_.front(), seq = entry >> 2;
    if (seq < log_.first_seq()) {
      close(end::not_retained, "the resume position is no longer retained; take a new snapshot");
      return;
    }
    event_ptr e = log_.in_memory(seq);   // (the router queued it from memory: mostly there still)
    if (!e) {
      bool fetching = false;
      auto one = log_.read(seq, 1, limits_.batch_bytes, &read_error, &fetching, prepare);
      if (one.empty() && fetching) {   // read in the background: notified when in memory
        waiting_ = true;
        break;
      }
      if (one.empty()) {
        if (out.empty()) close(end::damaged, read_error.empty() ? "event #" + std::to_string(seq) + " cannot be read" : read_error);
        break;
      }
      e = std::move(one.front());
    }
    if (e->seq != seq) {   // (visible seqs have no gaps: never)
      if (out.empty()) close(end::damaged, "event #" + std::to_string(seq) + " is not in the event log");
      break;
    }
    // Slow: its next event is further behind the stream than the lag allowed (as read_some).
    const std::uint64_t reading_to = std::max(e->end_offset, log_.transaction_end_offset(e->seq));
    if (log_.visible_offset() > reading_to && log_.visible_offset() - reading_to > limits_.lag_bytes) {
      close(end::slow, "slow client: more than " + std::to_string(limits_.lag_bytes) + " bytes behind the stream");
      return;
    }
    queue_.pop_front();
    cursor_ = seq + 1;
    offset_ = e->end_offset;
    // Where the router's finding is the whole decision (exact_), the event is not decided again.
    found_ = exact_ ? static_cast<row_router::found>(entry & 3) : row_router::found::unknown;
    const bool routed = found_ != row_router::found::unknown;
    const bool taken = take(e, out, bytes, false);
    // Counted once the event is taken (take used the finding: it cleared it), not when a batch
    // ended before it (it is taken again in the next).
    if (taken && routed && found_ == row_router::found::unknown) router_->count_decided();
    found_ = row_router::found::unknown;
    if (!taken) {
      queue_.push_front(entry);
      break;
    }
  }
  if (queue_.empty()) {
    cursor_ = std::max(cursor_, router_->routed());
    offset_ = log_.visible_offset();
    // (the router looks at whole transactions: nothing more of this one is for it)
    if (txn_ && !ended()) end_transaction(out, bytes);
  } else {
    cursor_ = queue_.front() >> 2;
  }
}

std::string subscription::keyed_record(std::string record, const protocol::transaction_info& t) const {
  if (!request_.keys) return record;
  return "{\"key\":{\"id\":\"" + std::to_string(t.xid) + ":" + std::to_string(t.commit_lsn.value) + "\"},\"value\":" + record + "}";
}

void subscription::flush_part(std::vector<item>& out, std::size_t& bytes, bool last) {
  auto& t = *txn_;
  if (!last && t.part.empty()) {   // a part all seen before a resume: numbered, not sent again
    if (t.part_bytes) ++t.part_no;
    t.part_bytes = 0;
    return;
  }
  ++t.part_no;
  std::string head = "{\"xid\":" + std::to_string(t.info.xid) + ",\"commit_lsn\":\"" + t.info.commit_lsn.to_string() +
                     "\",\"commit_time\":\"" + transform::iso8601_utc(t.info.commit_time) + "\"";
  if (t.info.origin) {
    head += ",\"origin\":";
    transform::append_json_string(head, *t.info.origin);
  }
  head += ",\"part\":" + std::to_string(t.part_no) + ",\"last\":" + (last ? "true" : "false") + ",\"events\":[";
  auto p = payload::joined(std::move(head), std::move(t.part), ",", "]}");
  t.part.clear();
  t.part_bytes = 0;
  bytes += p->size();
  // Its id: the commit's for the last part (resumes after the transaction), else its last
  // event's (resumes with the next part).
  out.push_back({std::move(p), last ? transform::event_id{t.info.commit_lsn, 0, transform::event_id::mark::commit} : t.last_id, t.what});
}

bool subscription::open_txn(const event_ptr& e, kind what, const std::vector<item>& out) {
  std::string error;
  const transform::change* c = encodings_.decode(*e, error);
  if (!c || !c->txn) {
    cursor_ = e->seq;
    if (out.empty()) close(end::damaged, error.empty() ? "event #" + std::to_string(e->seq) + " has no transaction" : error);
    return false;
  }
  txn_.emplace();
  txn_->info = *c->txn;
  txn_->what = what;
  if (resumed_in_ && resumed_in_->commit_lsn == e->id.commit_lsn) txn_->begun = true;   // (sent before the resume)
  resumed_in_.reset();
  return true;
}

void subscription::end_transaction(std::vector<item>& out, std::size_t& bytes) {
  // empty_transactions=true: one with nothing for this client (and not all seen before a
  // resume) still has its records: begun here, ended below with no events.
  const bool empty = request_.empty_transactions && !txn_->begun && txn_->fresh;
  if (group_) {
    if (txn_->begun || empty) flush_part(out, bytes, true);
    txn_.reset();
    return;
  }
  if (empty) {
    std::string begin;
    transform::encode_begin(begin, request_.fmt, txn_->info);
    begin = keyed_record(std::move(begin), txn_->info);
    bytes += begin.size();
    out.push_back({payload::for_one(std::move(begin)), {txn_->info.commit_lsn, 0, transform::event_id::mark::begin}, txn_->what});
    txn_->begun = true;
  }
  auto t = std::move(*txn_);
  txn_.reset();
  if (!t.begun) return;
  std::string commit;
  if (!transform::encode_commit(commit, request_.fmt, t.info, t.events, t.tables)) return;
  commit = keyed_record(std::move(commit), t.info);
  bytes += commit.size();
  out.push_back({payload::for_one(std::move(commit)), {t.info.commit_lsn, 0, transform::event_id::mark::commit}, t.what});
}

bool subscription::take(const event_ptr& e, std::vector<item>& out, std::size_t& bytes, bool window) {
  // An event of another transaction (or of none): the open one is over.
  const bool in_txn = in_transaction(*e);
  if (txn_ && (!in_txn || txn_->info.commit_lsn != e->id.commit_lsn)) end_transaction(out, bytes);
  // Up to skip_through: seen already (with transaction records, still counted for the commit).
  bool silent = false;
  if (skip_through_) {
    if (!(*skip_through_ < e->id)) {
      // A transaction seen to its end (the id is its commit's, or a later transaction's): no
      // records again; one seen in part (the id is its begin's or an event's): counted, not sent.
      if (!in_txn || skip_through_->commit_lsn > e->id.commit_lsn || skip_through_->at == transform::event_id::mark::commit)
        return true;
      silent = true;
    } else {
      skip_through_.reset();
    }
  }
  // empty_transactions=true: every transaction is followed, whatever this client is sent of it
  // (one the snapshot saw is not: its rows are); it has records of its own only if it is one
  // this client may know of (fresh: below, once a message's prefix is known).
  const bool follows = in_txn && request_.empty_transactions && !(window && snapshot_->covers(*e));
  if (follows && !txn_ && !open_txn(e, window ? kind::snapshot_change : kind::event, out)) return false;
  // prefixes=: a logical message by its prefix, whatever tables= says (the record is read for it).
  std::string error;
  std::string_view prefix;
  if (e->kind == transform::op::message && (!request_.prefixes.empty() || request_.message_events)) {
    const transform::change* c = encodings_.decode(*e, error);
    if (!c || !c->message) {
      cursor_ = e->seq;
      if (out.empty()) close(end::damaged, error.empty() ? "event #" + std::to_string(e->seq) + " is not a message" : error);
      return false;
    }
    prefix = c->message->prefix;   // (a view into the decoded record: copied below before the next decode)
  }
  std::string prefix_copy(prefix);
  if (follows && !silent && known_to(request_, *e, prefix_copy)) txn_->fresh = true;
  if (e->kind == transform::op::message && !request_.prefixes.empty()) {
    if (request_.ops && !(request_.ops & (1u << ('m' - 'a')))) return true;
    if (request_.granted && !request_.granted->allows(e->schema, e->table, 'm')) return true;
    if (std::none_of(request_.prefixes.begin(), request_.prefixes.end(),
                     [&](const std::string& g) { return glob_match(g, prefix_copy); }))
      return true;
  } else if (!matches(request_, *e, tables_index_ ? &*tables_index_ : nullptr)) {
    return true;
  }
  if (window && snapshot_->covers(*e)) return true;
  // Row grants: the event's values decide; an update that moves a row in or out of them is
  // sent as an insert or a delete, so that the client's rows stay exactly what it may see.
  auto verdict = row_verdict::pass;
  if (found_ != row_router::found::unknown) {
    verdict = found_ == row_router::found::moved_in    ? row_verdict::as_insert
              : found_ == row_router::found::moved_out ? row_verdict::as_delete
                                                       : row_verdict::pass;
    mask_ = nullptr;   // (exact_: no column lists)
    found_ = row_router::found::unknown;   // (used: read_routed counts it once the event is taken)
  } else if (request_.granted || request_.where) {
    std::string why;
    verdict = rows_verdict(*e, why);
    if (verdict == row_verdict::failed || verdict == row_verdict::damaged) {
      cursor_ = e->seq;
      if (out.empty()) close(verdict == row_verdict::damaged ? end::damaged : end::grant, why);
      return false;
    }
    if (verdict == row_verdict::skip) return true;
  }
  const bool moved = verdict == row_verdict::as_insert || verdict == row_verdict::as_delete;
  const auto as = verdict == row_verdict::as_insert ? transform::op::insert : transform::op::delete_;
  // pgoutput2json compact: the schema goes with the first row of a table for this client,
  // and again when the table's definition is not the one last sent — as the encoding of e's
  // row with its schema, made once and shared like the others.
  // Column grants: the columns this event shows to this client (null: every one).
  const std::string* mask = (request_.granted || request_.where) ? mask_ : nullptr;
  encoding want = enc_;
  std::string* sent = nullptr;
  std::string signature;
  if (enc_ == encoding::pgoutput2json_compact) {
    sent = &schemas_sent_[e->schema + "." + e->table];
    // The signature of what its "s" shows: the columns of the mask alone (a hidden column's
    // change sends no new "s"; other columns shown, another). Never empty, the mark of none sent
    // (not even when every column is hidden).
    signature = '\x1d' + encodings_.schema_signature(*e, mask);
    if (*sent != signature) want = encoding::pgoutput2json_schema;
  }
  auto p = mask ? encodings_.get_masked(*e, want, moved ? as : e->kind, *mask, error)
           : moved ? encodings_.get_as(*e, want, as, error)
                   : encodings_.get(*e, want, error);
  if (!p) {
    // A damaged record: the batch ends before it; with nothing before it, the client is
    // closed with the reason and the id to resume from.
    cursor_ = e->seq;
    if (out.empty()) close(end::damaged, error);
    return false;
  }
  if (p->empty()) return true;   // the format has no such event
  const auto what = window ? kind::snapshot_change : kind::event;
  if (in_txn) {
    // The transaction's begin before its first event for this client; its counts.
    if (!txn_ && !open_txn(e, what, out)) return false;
    auto& t = *txn_;
    if (!t.begun) {
      t.begun = true;
      if (!silent && !group_) {
        std::string begin;
        transform::encode_begin(begin, request_.fmt, t.info);
        begin = keyed_record(std::move(begin), t.info);
        bytes += begin.size();
        out.push_back({payload::for_one(std::move(begin)), {t.info.commit_lsn, 0, transform::event_id::mark::begin}, what});
      }
    }
    ++t.events;
    std::uint64_t table_order = 0;
    if (!e->table.empty()) {
      auto it = std::find_if(t.tables.begin(), t.tables.end(),
                             [&](const transform::table_count& x) { return x.table == e->table && x.schema == e->schema; });
      if (it == t.tables.end()) it = t.tables.insert(t.tables.end(), {e->schema, e->table, 0});
      table_order = ++it->events;
    }
    if (group_) {
      // The part so far is sent first when this event would take it past the limit.
      if (t.part_bytes && t.part_bytes + p->size() > limits_.group_bytes) flush_part(out, bytes, false);
      t.part_bytes += p->size() + 1;
      t.last_id = e->id;
      if (silent) return true;
    } else if (silent) {
      return true;
    }
    // Debezium: the change's transaction block, with its order among what this client is sent.
    if (request_.fmt == transform::format::debezium && !group_) {
      std::string block;
      transform::append_debezium_transaction(block, t.info, t.events, table_order ? table_order : 1);
      p = with_transaction_block(p, block);
      if (!p) {
        cursor_ = e->seq;
        if (out.empty()) close(end::damaged, "event #" + std::to_string(e->seq) + ": its Debezium encoding has no transaction field");
        return false;
      }
    }
  } else if (silent) {
    return true;
  }
  // keys=true: {"key":…,"value":…}, shared like the encoding (a client's own form: its own).
  if (request_.keys) {
    const auto op_as = moved ? as : e->kind;
    if (in_txn && request_.fmt == transform::format::debezium && !group_) {
      std::string key = encodings_.key_of(*e, want, op_as, mask, error);
      if (!key.empty()) p = payload::framed("{\"key\":" + key + ",\"value\":", p, "}", true);
      else p = nullptr;
    } else {
      p = encodings_.keyed(*e, want, op_as, mask, p, error);
    }
    if (!p) {
      cursor_ = e->seq;
      if (out.empty()) close(end::damaged, error);
      return false;
    }
  }
  const bool own = in_txn && (group_ || request_.fmt == transform::format::debezium);   // (a client's own form: never compressed)
  if (deflate_bits_ && !own) {
    std::size_t made = 0;
    p->deflated(deflate_bits_, &made);
    if (made) encodings_.account(*e, made);
  }
  if (want == encoding::pgoutput2json_schema) *sent = std::move(signature);
  if (group_ && in_txn) {   // into the transaction's message (tombstones too), not sent on its own
    auto& t = *txn_;
    t.part.push_back(std::move(p));
    if (request_.tombstones && (moved ? as == transform::op::delete_ : e->kind == transform::op::delete_))
      if (auto ts = encodings_.tombstone(*e, mask)) t.part.push_back(std::move(ts));   // (not counted in the limit)
    return true;
  }
  bytes += p->size();
  out.push_back({std::move(p), e->id, what});
  // message_events=true: named by its prefix over SSE (one that cannot be an SSE event name —
  // empty, a line break, not UTF-8 — goes as an unnamed event, as without).
  if (request_.message_events && e->kind == transform::op::message && !prefix_copy.empty() &&
      prefix_copy.find_first_of("\r\n") == std::string::npos && transform::is_utf8(prefix_copy) &&
      prefix_copy != "error" && prefix_copy != "snapshot-end" && prefix_copy != "message")   // (walgate's own names)
    out.back().event = std::move(prefix_copy);
  if (request_.tombstones && (moved ? as == transform::op::delete_ : e->kind == transform::op::delete_))
    if (auto t = encodings_.tombstone(*e, mask)) out.push_back({std::move(t), e->id, what});
  return true;
}

void subscription::snapshot_batch(std::vector<item>& out) {
  auto& job = *snapshot_;
  if (phase_ == phase::rows) {
    rows_scratch_.clear();
    if (job.take(rows_scratch_, limits_.batch_events, limits_.batch_bytes)) {
      for (auto& p : rows_scratch_) out.push_back({std::move(p), {}, kind::snapshot_row});
      return;
    }
    auto st = job.current();
    if (st == snapshot_job::state::failed) {
      close(end::snapshot_failed, job.error() + "; ask for a new snapshot");
      return;
    }
    if (st != snapshot_job::state::done) return;   // its worker wakes the client
    if (job.take(rows_scratch_, limits_.batch_events, limits_.batch_bytes)) {   // (pushed just before done)
      for (auto& p : rows_scratch_) out.push_back({std::move(p), {}, kind::snapshot_row});
      return;
    }
    phase_ = phase::changes;
    rows_done_ = std::chrono::steady_clock::now();
  }
  // The changes the snapshot did not see, up to the position after which it saw none.
  if (!job.end_seq()) {
    if (std::chrono::steady_clock::now() - rows_done_ > job.stream_wait())
      close(end::snapshot_failed,
            "snapshot: the replication stream did not reach the snapshot's position in time; ask for a new snapshot");
    return;   // woken when it has
  }
  waiting_ = false;
  int reads = 0;
  while (out.empty() && !ended() && !waiting_ && cursor_ < *job.end_seq() && cursor_ < log_.visible_seq() && reads++ < 8)
    read_some(out);
  if (ended() || waiting_ || !out.empty() || cursor_ < *job.end_seq()) return;
  // The end marker: the id after which everything is after the snapshot.
  transform::event_id resume = job.end_id();
  if (!resume.commit_lsn.valid()) resume = {};   // the log was empty: from its start, 0/0:0
  std::string marker = "{\"snapshot\":\"end\",\"rows\":" + std::to_string(job.rows()) + ",\"resume_from\":";
  transform::append_json_string(marker, resume.to_string());
  marker += "}";
  out.push_back({payload::in_memory(std::move(marker)), resume, kind::snapshot_end});
  phase_ = phase::live;
  snapshot_.reset();
  if (cursor_ >= log_.visible_seq()) {
    live_ = true;
    offset_ = log_.visible_offset();
  }
}

}  // namespace walgate::proxy
