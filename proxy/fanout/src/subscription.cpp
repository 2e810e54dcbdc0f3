// One stream client's way through the event log (subscription.hpp): its batches, read from the
// log or from the row router's queue; each event decided by the request's filters and the
// token's grants (rows and columns) and encoded in its format (shared encodings, keys=,
// Debezium's transaction block); transaction records (transactions=true, group=transaction,
// empty_transactions); and, with snapshot=true, the snapshot's rows, its window of changes and
// its end marker first. How row grants and where= decide an event (rows_verdict), what the row
// router finds a request's events by, and which transactions a client may know of are in
// subscription_rows.cpp (what both files use: subscription_internal.hpp).
// take() is one event's decision as the ordered list of its steps (the resume, a message's
// prefix, the selection, the rows, the encoding, the transaction, keys=, compression, into the
// batch), each a member below it, in that order; stop_at is their one way of ending the batch.
// Over 600 lines: the batch's reading (log and router), the transaction records, take()'s steps
// (about 200 lines) and the snapshot's phases are all members working on the same cursor and
// open transaction, and the steps write the transaction records' state: kept as one file.
#include "walgate/proxy/subscription.hpp"

#include "subscription_internal.hpp"

#include "walgate/proxy/policy.hpp"
#include "walgate/proxy/predicate.hpp"
#include "walgate/proxy/snapshot.hpp"
#include "walgate/transform/json.hpp"

#include <algorithm>

namespace walgate::proxy {

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
  if (router_ && !request_.empty_transactions) interests_ = subscription_rows::interests_of(request_);
  if (request_.where) event_cost_ = 1 + predicate::cost(*request_.where);
  if (request_.tables.size() > 4) tables_index_.emplace(request_.tables);   // (a few: compared in turn)
  exact_ = interests_ && subscription_rows::router_decides(request_, *interests_);
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
  if (!c || !c->txn)
    return stop_at(e, out, end::damaged, error.empty() ? "event #" + std::to_string(e->seq) + " has no transaction" : error);
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

bool subscription::stop_at(const event_ptr& e, const std::vector<item>& out, end why, std::string message) {
  cursor_ = e->seq;
  if (out.empty()) close(why, std::move(message));
  return false;
}

bool subscription::take(const event_ptr& e, std::vector<item>& out, std::size_t& bytes, bool window) {
  take_state st;
  st.in_txn = in_transaction(*e);
  st.what = window ? kind::snapshot_change : kind::event;
  // An event of another transaction (or of none): the open one is over.
  if (txn_ && (!st.in_txn || txn_->info.commit_lsn != e->id.commit_lsn)) end_transaction(out, bytes);
  // Up to skip_through: seen already (with transaction records, still counted for the commit).
  const seen before = seen_already(*e, st.in_txn);
  if (before == seen::whole) return true;
  st.silent = before == seen::in_part;
  // empty_transactions=true: every transaction is followed, whatever this client is sent of it
  // (one the snapshot saw is not: its rows are); it has records of its own only if it is one
  // this client may know of (fresh: below, once a message's prefix is known).
  const bool follows = st.in_txn && request_.empty_transactions && !(window && snapshot_->covers(*e));
  if (follows && !txn_ && !open_txn(e, st.what, out)) return false;
  if (!message_prefix(e, out, st)) return false;
  if (follows && !st.silent && subscription_rows::known_to(request_, *e, st.prefix)) txn_->fresh = true;
  if (!selected(*e, st.prefix)) return true;
  if (window && snapshot_->covers(*e)) return true;
  if (!decide_rows(e, out, st)) return false;
  if (st.verdict == row_verdict::skip) return true;
  if (!encode(e, out, st)) return false;
  if (st.p->empty()) return true;   // the format has no such event
  if (st.in_txn && !count_in_transaction(e, out, bytes, st)) return false;
  if (st.silent) return true;   // seen before the resume: counted in its transaction, not sent
  if (st.in_txn && !add_transaction_block(e, out, st)) return false;
  if (!add_key(e, out, st)) return false;
  count_deflated(*e, st);
  if (st.want == encoding::pgoutput2json_schema) *st.sent = std::move(st.signature);
  deliver(e, out, bytes, st);
  return true;
}

subscription::seen subscription::seen_already(const logged_event& e, bool in_txn) {
  if (!skip_through_) return seen::not_yet;
  if (*skip_through_ < e.id) {
    skip_through_.reset();
    return seen::not_yet;
  }
  // A transaction seen to its end (the id is its commit's, or a later transaction's): no
  // records again; one seen in part (the id is its begin's or an event's): counted, not sent.
  if (!in_txn || skip_through_->commit_lsn > e.id.commit_lsn || skip_through_->at == transform::event_id::mark::commit)
    return seen::whole;
  return seen::in_part;
}

bool subscription::message_prefix(const event_ptr& e, const std::vector<item>& out, take_state& st) {
  // prefixes=: a logical message by its prefix, whatever tables= says (the record is read for it).
  if (e->kind != transform::op::message || (request_.prefixes.empty() && !request_.message_events)) return true;
  const transform::change* c = encodings_.decode(*e, st.error);
  if (!c || !c->message)
    return stop_at(e, out, end::damaged, st.error.empty() ? "event #" + std::to_string(e->seq) + " is not a message" : st.error);
  st.prefix = std::string(c->message->prefix);   // (a view into the decoded record: copied before the next decode)
  return true;
}

bool subscription::selected(const logged_event& e, const std::string& prefix) const {
  if (e.kind == transform::op::message && !request_.prefixes.empty()) {
    if (request_.ops && !(request_.ops & (1u << ('m' - 'a')))) return false;
    if (request_.granted && !request_.granted->allows(e.schema, e.table, 'm')) return false;
    return std::any_of(request_.prefixes.begin(), request_.prefixes.end(),
                       [&](const std::string& g) { return glob_match(g, prefix); });
  }
  return matches(request_, e, tables_index_ ? &*tables_index_ : nullptr);
}

bool subscription::decide_rows(const event_ptr& e, const std::vector<item>& out, take_state& st) {
  // Row grants: the event's values decide; an update that moves a row in or out of them is
  // sent as an insert or a delete, so that the client's rows stay exactly what it may see.
  st.verdict = row_verdict::pass;
  if (found_ != row_router::found::unknown) {
    st.verdict = found_ == row_router::found::moved_in    ? row_verdict::as_insert
                 : found_ == row_router::found::moved_out ? row_verdict::as_delete
                                                          : row_verdict::pass;
    mask_ = nullptr;   // (exact_: no column lists)
    found_ = row_router::found::unknown;   // (used: read_routed counts it once the event is taken)
  } else if (request_.granted || request_.where) {
    std::string why;
    st.verdict = rows_verdict(*e, why);
    if (st.verdict == row_verdict::failed || st.verdict == row_verdict::damaged)
      return stop_at(e, out, st.verdict == row_verdict::damaged ? end::damaged : end::grant, why);
  }
  st.moved = st.verdict == row_verdict::as_insert || st.verdict == row_verdict::as_delete;
  st.as = st.verdict == row_verdict::as_insert ? transform::op::insert : transform::op::delete_;
  return true;
}

bool subscription::encode(const event_ptr& e, const std::vector<item>& out, take_state& st) {
  // pgoutput2json compact: the schema goes with the first row of a table for this client,
  // and again when the table's definition is not the one last sent — as the encoding of e's
  // row with its schema, made once and shared like the others.
  // Column grants: the columns this event shows to this client (null: every one).
  st.mask = (request_.granted || request_.where) ? mask_ : nullptr;
  st.want = enc_;
  if (enc_ == encoding::pgoutput2json_compact) {
    st.sent = &schemas_sent_[e->schema + "." + e->table];
    // The signature of what its "s" shows: the columns of the mask alone (a hidden column's
    // change sends no new "s"; other columns shown, another). Never empty, the mark of none sent
    // (not even when every column is hidden).
    st.signature = '\x1d' + encodings_.schema_signature(*e, st.mask);
    if (*st.sent != st.signature) st.want = encoding::pgoutput2json_schema;
  }
  st.p = st.mask ? encodings_.get_masked(*e, st.want, st.moved ? st.as : e->kind, *st.mask, st.error)
         : st.moved ? encodings_.get_as(*e, st.want, st.as, st.error)
                    : encodings_.get(*e, st.want, st.error);
  // A damaged record: the batch ends before it; with nothing before it, the client is
  // closed with the reason and the id to resume from.
  if (!st.p) return stop_at(e, out, end::damaged, st.error);
  return true;
}

bool subscription::count_in_transaction(const event_ptr& e, std::vector<item>& out, std::size_t& bytes, take_state& st) {
  // The transaction's begin before its first event for this client; its counts.
  if (!txn_ && !open_txn(e, st.what, out)) return false;
  auto& t = *txn_;
  if (!t.begun) {
    t.begun = true;
    if (!st.silent && !group_) {
      std::string begin;
      transform::encode_begin(begin, request_.fmt, t.info);
      begin = keyed_record(std::move(begin), t.info);
      bytes += begin.size();
      out.push_back({payload::for_one(std::move(begin)), {t.info.commit_lsn, 0, transform::event_id::mark::begin}, st.what});
    }
  }
  ++t.events;
  st.table_order = 0;
  if (!e->table.empty()) {
    auto it = std::find_if(t.tables.begin(), t.tables.end(),
                           [&](const transform::table_count& x) { return x.table == e->table && x.schema == e->schema; });
    if (it == t.tables.end()) it = t.tables.insert(t.tables.end(), {e->schema, e->table, 0});
    st.table_order = ++it->events;
  }
  if (group_) {
    // The part so far is sent first when this event would take it past the limit.
    if (t.part_bytes && t.part_bytes + st.p->size() > limits_.group_bytes) flush_part(out, bytes, false);
    t.part_bytes += st.p->size() + 1;
    t.last_id = e->id;
  }
  return true;
}

bool subscription::add_transaction_block(const event_ptr& e, const std::vector<item>& out, take_state& st) {
  // Debezium: the change's transaction block, with its order among what this client is sent.
  if (request_.fmt != transform::format::debezium || group_) return true;
  std::string block;
  transform::append_debezium_transaction(block, txn_->info, txn_->events, st.table_order ? st.table_order : 1);
  st.p = with_transaction_block(st.p, block);
  if (!st.p) return stop_at(e, out, end::damaged, "event #" + std::to_string(e->seq) + ": its Debezium encoding has no transaction field");
  return true;
}

bool subscription::add_key(const event_ptr& e, const std::vector<item>& out, take_state& st) {
  // keys=true: {"key":…,"value":…}, shared like the encoding (a client's own form: its own).
  if (!request_.keys) return true;
  const auto op_as = st.moved ? st.as : e->kind;
  if (st.in_txn && request_.fmt == transform::format::debezium && !group_) {
    std::string key = encodings_.key_of(*e, st.want, op_as, st.mask, st.error);
    if (!key.empty()) st.p = payload::framed("{\"key\":" + key + ",\"value\":", st.p, "}", true);
    else st.p = nullptr;
  } else {
    st.p = encodings_.keyed(*e, st.want, op_as, st.mask, st.p, st.error);
  }
  if (!st.p) return stop_at(e, out, end::damaged, st.error);
  return true;
}

void subscription::count_deflated(const logged_event& e, const take_state& st) {
  const bool own = st.in_txn && (group_ || request_.fmt == transform::format::debezium);   // (a client's own form: never compressed)
  if (deflate_bits_ && !own) {
    std::size_t made = 0;
    st.p->deflated(deflate_bits_, &made);
    if (made) encodings_.account(e, made);
  }
}

void subscription::deliver(const event_ptr& e, std::vector<item>& out, std::size_t& bytes, take_state& st) {
  if (group_ && st.in_txn) {   // into the transaction's message (tombstones too), not sent on its own
    auto& t = *txn_;
    t.part.push_back(std::move(st.p));
    if (request_.tombstones && (st.moved ? st.as == transform::op::delete_ : e->kind == transform::op::delete_))
      if (auto ts = encodings_.tombstone(*e, st.mask)) t.part.push_back(std::move(ts));   // (not counted in the limit)
    return;
  }
  bytes += st.p->size();
  out.push_back({std::move(st.p), e->id, st.what});
  // message_events=true: named by its prefix over SSE (one that cannot be an SSE event name —
  // empty, a line break, not UTF-8 — goes as an unnamed event, as without).
  if (request_.message_events && e->kind == transform::op::message && !st.prefix.empty() &&
      st.prefix.find_first_of("\r\n") == std::string::npos && transform::is_utf8(st.prefix) &&
      st.prefix != "error" && st.prefix != "snapshot-end" && st.prefix != "message")   // (walgate's own names)
    out.back().event = std::move(st.prefix);
  if (request_.tombstones && (st.moved ? st.as == transform::op::delete_ : e->kind == transform::op::delete_))
    if (auto t = encodings_.tombstone(*e, st.mask)) out.push_back({std::move(t), e->id, st.what});
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
