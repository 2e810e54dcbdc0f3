// One client's subscription to the log, with no transport in it: its cursor, its filters, its
// encoding and pgoutput2json compact's schema-sent state, its lag and its bounded batch, and the
// reason it ends. A transport (ndjson.cpp, sse.cpp, websocket.cpp) asks it for the next batch,
// frames and sends the batch, tells it what was delivered, and waits for the log's notification
// when a batch comes back empty. Unit-tested without sockets (tests/proxy/subscription_test.cpp).
#pragma once

#include "walgate/proxy/encodings.hpp"
#include "walgate/proxy/log_reader.hpp"
#include "walgate/proxy/row_router.hpp"
#include "walgate/proxy/event_filter.hpp"

#include <chrono>
#include <deque>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace walgate::proxy {

class snapshot_job;
struct table_rows;

/// Where a client with transaction records (request.transactions) that resumes from an id
/// inside a transaction (its begin, or one of its events) starts: at the transaction's first
/// event, with seq and skip_through moved there so that the events up to the id are counted for
/// its commit record, not sent again. Left as they are otherwise (a commit's id, an id past the
/// head, a transaction no longer retained).
void resume_in_transaction(const log_reader& log, const stream_request& request, std::uint64_t& seq,
                           std::optional<transform::event_id>& skip_through);

class subscription : private row_router::target {
 public:
  struct limits {
    std::size_t batch_bytes = 256 * 1024;   ///< a batch ends once its encodings reach this
    std::size_t batch_events = 512;         ///< and at this many events
    std::size_t lag_bytes = 64u << 20;      ///< a live client further behind is closed (slow)
    std::size_t group_bytes = 16u << 20;    ///< group=transaction: a message's events past this: split
  };
  /// Why a subscription ended.
  enum class end { none, client_gone, slow, not_retained, damaged, shutdown, snapshot_failed, expired, grant };
  /// What an item is: an event of the log (its id resumes after it); a row of the client's
  /// snapshot, or a change that committed while the snapshot was taken (no id: a client cut
  /// off before the snapshot's end starts it again); the snapshot's end marker (its id resumes
  /// after the snapshot).
  enum class kind : std::uint8_t { event, snapshot_row, snapshot_change, snapshot_end };
  struct item {
    payload_ptr bytes;
    transform::event_id id;
    kind what = kind::event;
    std::string event;   ///< SSE: the event's name (message_events=true: a message's prefix); empty: none
  };

  /// Starts at seq start; with skip_through set (an id past the head), events up to it are
  /// skipped (sent again by the server after a crash lost them from the log: seen already).
  /// With a snapshot (started: snapshot_job::started()), start is its start_seq(): its rows come
  /// first, then the changes of [start, end_seq()) it did not see, then its end marker.
  /// With a router, a subscription whose rows are all found by equality (row_router.hpp) reads
  /// only the events the router finds for it, once it has caught up.
  subscription(const log_reader& log, encoding_cache& encodings, stream_request request, std::uint64_t start,
               std::optional<transform::event_id> skip_through, limits l,
               std::shared_ptr<snapshot_job> snapshot = nullptr, row_router* router = nullptr);
  ~subscription();
  subscription(const subscription&) = delete;
  subscription& operator=(const subscription&) = delete;

  /// The next batch of encoded events into out (cleared first). Empty and ended: the
  /// subscription is over (too slow, its position no longer retained, a damaged record). Empty,
  /// not ended and not pending(): caught up (or the log is reading for it in the background), wait for
  /// the log's notification. Empty and
  /// pending(): its filters passed over events without a match and the call's work ran out
  /// (at most 8 reads of the log, and at most work_budget: each event looked at costs 1 and
  /// where='s predicate::cost): call again after letting others run.
  void next_batch(std::vector<item>& out);
  /// Found by the router (its events come queued), with none queued: nothing to do when events
  /// arrive (not woken).
  bool idle_routed() const { return routed_ && queue_.empty() && !overflow_ && !ended(); }
  bool routed() const { return routed_; }
  /// Visible events are left to look at now (not while the log reads a large record for it in
  /// the background: its notification comes when that is done).
  bool pending() const;
  /// The transport sent the batch whose last item is last: it is where a resume starts (an
  /// event's id, or the snapshot's end; nothing before that).
  void delivered(const item& last) {
    if (last.what == kind::event || last.what == kind::snapshot_end) resume_id_ = last.id.to_string();
  }
  /// Waiting for the log to read its next events in the background (woken by on_fetched).
  bool waiting() const { return waiting_ && !ended(); }
  /// In its snapshot (rows, or the changes before the end marker).
  bool in_snapshot() const { return phase_ != phase::live; }

  /// Ends it (the transport: the client went away, a write timed out, the server stops). The
  /// first reason stands, except that the server's shutdown replaces it (the client is told
  /// that, and to come back).
  void close(end why, std::string reason);
  bool ended() const { return end_ != end::none; }
  end why() const { return end_; }
  const std::string& reason() const { return reason_; }
  /// The id of the last event delivered (or the id it resumed from); empty when none: where
  /// the client resumes.
  const std::string& resume_id() const { return resume_id_; }

  const stream_request& request() const { return request_; }
  encoding wanted() const { return enc_; }
  /// A WebSocket client with permessage-deflate (that window): each event's compressed form is
  /// made as it is read (once per event, shared: payload::deflated) and counted in the tail.
  void set_deflate(int window_bits) { deflate_bits_ = window_bits; }
  /// No table or op filter: it takes every event in its encoding.
  bool unfiltered() const { return unfiltered_; }
  /// Caught up with what was visible at least once (lag counts from then on).
  bool live() const { return live_; }
  std::uint64_t cursor() const { return cursor_; }
  std::uint64_t lag_events() const;
  std::uint64_t lag_bytes() const;

 private:
  void read_some(std::vector<item>& out);
  void read_routed(std::vector<item>& out);
  /// One event for the batch: false when the batch ends before it (it is not consumed).
  bool take(const event_ptr& e, std::vector<item>& out, std::size_t& bytes, bool window);
  void snapshot_batch(std::vector<item>& out);
  void routed(std::uint64_t seq, row_router::found how) override;
  void unroutable(std::uint64_t from_seq, bool for_good) override;
  bool check(const logged_event& e, const protocol::pgoutput::cached_relation& r) override;
  enum class phase { rows, changes, live };

  const log_reader& log_;
  encoding_cache& encodings_;
  stream_request request_;
  limits limits_;
  encoding enc_;
  int deflate_bits_ = 0;
  bool unfiltered_;
  std::uint64_t cursor_;         // seq of the next event to look at
  std::uint64_t offset_ = 0;     // the log's end offset at the cursor (while live): lag in bytes
  std::optional<transform::event_id> skip_through_;
  bool live_ = false;
  bool waiting_ = false;   // for a background read of the log
  end end_ = end::none;
  std::string reason_;
  std::string resume_id_;
  std::map<std::string, std::string> schemas_sent_;   // pgoutput2json compact: table -> signature sent
  std::shared_ptr<snapshot_job> snapshot_;
  phase phase_ = phase::live;
  std::vector<payload_ptr> rows_scratch_;
  std::chrono::steady_clock::time_point rows_done_{};
  /// The row router (null: none), and what this subscription is found by there (nullopt: not
  /// by equality); routed_ while registered, with the seqs it was given not yet read.
  row_router* router_ = nullptr;
  std::optional<std::vector<row_router::interest>> interests_;
  bool routed_ = false;
  bool overflow_ = false;   // more queued than it reads: it reads every event again
  std::deque<std::uint64_t> queue_;   // seq << 2 | row_router::found
  /// Seqs the router may queue for it before it stops queuing (overflow_): a subscription that
  /// far behind reads the log instead (512 KiB of queue at most).
  static constexpr std::size_t max_routed_queue = 65536;
  /// The router's finding decides its rows (router_decides): queued events are not decided again.
  bool exact_ = false;
  row_router::found found_ = row_router::found::unknown;   // the event take() is given: how found
  /// One next_batch call's work: events looked at, each costing event_cost_ (1, plus where='s
  /// predicate::cost); at work_budget the call returns (pending() then).
  static constexpr std::size_t work_budget = 32768;
  std::size_t work_ = 0, event_cost_ = 1;
  std::optional<table_index> tables_index_;   ///< tables= by hash, when it names more than a few
  /// Row grants (--policy rows): each granted table's predicates bound to its definition.
  struct row_state;
  std::unique_ptr<row_state> row_state_;
  enum class row_verdict { pass, skip, as_insert, as_delete, failed, damaged };
  /// Set by rows_verdict: the columns its event shows (table_rows::masks), null: every one.
  const std::string* mask_ = nullptr;
  row_verdict rows_verdict(const logged_event& e, std::string& error);
  /// What the request's grants make of e's table as r defines it (made at the first look).
  const table_rows& rows_of(const logged_event& e, const protocol::pgoutput::cached_relation& r);

  /// Transaction records (transactions=true): the transaction whose events this client is
  /// being given, what it was sent of it, and its begin and commit records.
  struct open_transaction {
    protocol::transaction_info info;
    bool begun = false;   // its begin was sent (or was before a resume)
    bool fresh = false;   // an event of it after the resume point that the client may know of was looked at
                          // (empty_transactions: of a table its token may see and it asked for, or such a message)
    kind what = kind::event;
    std::uint64_t events = 0;
    std::vector<transform::table_count> tables;
    // group=transaction: the part being made (its events not yet sent; silent ones, seen
    // before a resume, counted in its size only), its number, its last event's id.
    std::vector<payload_ptr> part;
    std::size_t part_bytes = 0;
    std::uint32_t part_no = 0;
    transform::event_id last_id;
  };
  bool group_ = false;
  /// group=transaction: the part made so far as one message (last: the transaction's end).
  void flush_part(std::vector<item>& out, std::size_t& bytes, bool last);
  /// The transaction of e opened (its begin not sent); false: e's record is damaged (closed).
  bool open_txn(const event_ptr& e, kind what, const std::vector<item>& out);
  bool transactions_ = false;
  std::optional<open_transaction> txn_;
  /// The id a transactions client resumed from inside a transaction (its begin or an event):
  /// that transaction's begin was sent already.
  std::optional<transform::event_id> resumed_in_;
  /// A transaction record as sent: with keys=true (Debezium), {"key":{"id":…},"value":record}.
  std::string keyed_record(std::string record, const protocol::transaction_info& t) const;
  /// The commit record of the open transaction, if its begin went; closes it.
  void end_transaction(std::vector<item>& out, std::size_t& bytes);
  /// Whether e belongs to a transaction that has records (not a non-transactional message, not
  /// a snapshot row).
  bool in_transaction(const logged_event& e) const {
    return transactions_ && e.xid != 0 && e.kind != transform::op::read;
  }

  /// take()'s steps, in its order (subscription.cpp). Those returning bool, but selected: false
  /// when the batch ends before the event (stop_at), true to go on. What one step leaves for the
  /// next: take_state, one per event.
  struct take_state {
    bool in_txn = false;   // in_transaction
    bool silent = false;   // seen before a resume, inside its transaction: counted in it, not sent
    kind what = kind::event;
    std::string error;
    std::string prefix;    // a message's prefix (prefixes=, message_events=true), copied from its record
    row_verdict verdict = row_verdict::pass;
    bool moved = false;    // an update moved in or out of the row grants: sent as `as`
    transform::op as = transform::op::delete_;
    const std::string* mask = nullptr;   // the columns shown (null: every one)
    encoding want = encoding::native;
    std::string* sent = nullptr;   // pgoutput2json compact: the signature of the schema sent for its table
    std::string signature;         // (and of the one e shows)
    payload_ptr p;                 // e as sent
    std::uint64_t table_order = 0;   // its order among its table's events in the transaction
  };
  /// The batch ends before e: the cursor stays at it; with nothing before it, the client is
  /// closed (why, message). Always false.
  bool stop_at(const event_ptr& e, const std::vector<item>& out, end why, std::string message);
  /// Up to skip_through_ (a resume): not_yet (then cleared), whole (seen to the transaction's
  /// end: nothing of it again), in_part (seen, its transaction not: counted, not sent).
  enum class seen { not_yet, in_part, whole };
  seen seen_already(const logged_event& e, bool in_txn);
  /// prefixes=, message_events=true: a message's prefix, read from its record.
  bool message_prefix(const event_ptr& e, const std::vector<item>& out, take_state& st);
  /// The request's tables=, ops=, prefixes= and the token's grants select e.
  bool selected(const logged_event& e, const std::string& prefix) const;
  /// The row decision (the router's finding, or rows_verdict): verdict, moved, as.
  bool decide_rows(const event_ptr& e, const std::vector<item>& out, take_state& st);
  /// e in the client's encoding (mask, want, pgoutput2json compact's schema signature): p.
  bool encode(const event_ptr& e, const std::vector<item>& out, take_state& st);
  /// In its transaction: the begin record before its first event, its counts, group's part.
  bool count_in_transaction(const event_ptr& e, std::vector<item>& out, std::size_t& bytes, take_state& st);
  /// Debezium (not group=transaction): the change's transaction block.
  bool add_transaction_block(const event_ptr& e, const std::vector<item>& out, take_state& st);
  /// keys=true: {"key":…,"value":…}.
  bool add_key(const event_ptr& e, const std::vector<item>& out, take_state& st);
  /// permessage-deflate: its compressed form made and counted (not a client's own form).
  void count_deflated(const logged_event& e, const take_state& st);
  /// Into the batch (or group=transaction's part), with its SSE name and tombstone.
  void deliver(const event_ptr& e, std::vector<item>& out, std::size_t& bytes, take_state& st);
};

}  // namespace walgate::proxy
