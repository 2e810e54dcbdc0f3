// The read side of a log of events, as subscriptions see it: the position of an id, events
// from a position, how far is visible, and a notification when more is. event_log (the segment
// store in the data directory) is the first implementation; subscriptions, transports and
// encoders know only this interface, so that another (a JetStream stream, a test double) needs
// no change there. The log knows nothing of clients or of what they are sent: what a reader
// keeps with an event (the fan-out's encodings, fanout/encodings.hpp) is an opaque attachment
// whose memory the log counts, and what a background read makes of the events it read is a hook
// (set_prepare) whose bits the hook's owner defines. Single-threaded: called on the executor
// that appends.
//
// The attachment (logged_event::attached), as the fan-out uses it (encoded_forms,
// fanout/encodings.hpp):
//   - made by its owner on first use, never by the log: on the log's executor for the events
//     it is given (read(), in_memory(), the publish hook), and by the prepare hook on a
//     background reader's thread for events that reader has just read, before any other thread
//     can see them (they reach the executor with the read's notification, on_fetched);
//   - counted in logged_event::memory(): an event entering the memory tail counts what it has
//     then; what is attached after that is counted by its owner's account_memory() calls, so
//     that what the tail counts for an event stays its memory();
//   - freed with the event (when the last reader and the log let it go).
#pragma once

#include "walgate/protocol/lsn.hpp"
#include "walgate/proxy/history.hpp"
#include "walgate/transform/change.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace walgate::proxy {

/// What a reader keeps with an event (the fan-out's encodings, fanout/encodings.hpp), opaque to
/// the log: it only counts its memory (memory()) while the event is in the memory tail.
struct event_attachment {
  virtual ~event_attachment() = default;
  /// What it holds in memory, itself included.
  virtual std::size_t memory() const = 0;
};

struct logged_event {
  std::uint64_t seq = 0;           ///< Position in the log; Waltail's seq.
  transform::event_id id;
  std::string record;              ///< transform::write_record bytes.
  std::string schema, table;       ///< For filters ("" for messages).
  transform::op kind = transform::op::insert;
  /// The transaction's top-level xid from pgoutput's Begin (0 for a non-transactional message):
  /// what a per-client snapshot decides by whether the event is already in the rows it read.
  std::uint32_t xid = 0;
  /// Byte position just past this event's frame in the log as this process sees it (segments
  /// laid end to end from the oldest retained one): a client's lag in bytes is the log's
  /// end_offset() minus that of the last event it was given.
  std::uint64_t end_offset = 0;
  /// On the last event of a transaction: where its commit record ends (pgoutput's Commit
  /// end_lsn, which the log keeps in the transaction's end frame); invalid on the others, and
  /// when a read stopped before the end frame. The walsender's commit 'w' header and wal2json's
  /// "nextlsn" are this.
  protocol::lsn txn_end;
  /// What a reader keeps with the event (see event_attachment): made by its owner on first use
  /// (the event is const to readers, hence mutable); null until then.
  mutable std::unique_ptr<event_attachment> attached;
  mutable bool in_tail = false;   ///< held by the log's memory tail (what is attached counts there)
  mutable std::size_t accounted = 0;   ///< what the tail counts for it: memory() when last counted
  std::size_t memory() const {
    return sizeof(*this) + record.size() + schema.size() + table.size() + (attached ? attached->memory() : 0);
  }
};
using event_ptr = std::shared_ptr<const logged_event>;

/// Where a client that processed an id resumes: the seq of the first event after it. seq is
/// nullopt when id is older than what is retained, or from before this log's origin (410);
/// error is set instead when the log could not be read to find it (damage, not age).
struct resume_point {
  std::optional<std::uint64_t> seq;
  std::string error;
  /// id is past the newest event logged: the head, but events up to id may still come (the
  /// log lost what a client saw before a crash, and the server sends it again, with the same
  /// ids): a reader skips events up to id.
  bool past_head = false;
};

class log_reader {
 public:
  virtual ~log_reader() = default;

  /// One past the last event of the last committed transaction: what readers may read up to.
  virtual std::uint64_t visible_seq() const = 0;
  /// Byte position of the log's end as of the last commit (see logged_event::end_offset): a
  /// reader's lag is measured against it. Never moves back.
  virtual std::uint64_t visible_offset() const = 0;
  /// The oldest retained event's seq (visible_seq() when empty).
  virtual std::uint64_t first_seq() const = 0;
  /// Where the committed transaction holding event seq ends (its end offset); 0 when unknown.
  virtual std::uint64_t transaction_end_offset(std::uint64_t seq) const = 0;
  /// Where this log began (an id from before it belongs to another log); invalid: unknown.
  virtual protocol::lsn origin() const = 0;
  /// The bytes of the log from the first retained event whose commit LSN is at or past lsn to
  /// its end (found through the sparse index: up to one index step, 64 KiB, more), what keeping
  /// everything from lsn on costs on disk; 0 when no retained event is at or past lsn.
  virtual std::uint64_t bytes_held_from(protocol::lsn) const { return 0; }
  /// The id of the newest event retention let go in this process (nullopt: none, or not known:
  /// dropped before this process started). What lies before it is gone.
  virtual std::optional<transform::event_id> last_dropped_id() const { return std::nullopt; }
  /// The history cut from this log (history.hpp): ids a cut covers name no change of the
  /// server's history (410 to a resume). Empty by default.
  virtual const std::vector<history_cut>& history_cuts() const {
    static const std::vector<history_cut> none;
    return none;
  }
  /// Events from seq on, committed only: at most max_events, and no more records than about
  /// max_bytes (at least one event). Empty when seq is not retained or nothing is visible
  /// there. When the log cannot be read, the events before the fault are returned and *error
  /// says what failed. With fetching given, events not in memory may be read in the background
  /// instead (in large sequential blocks shared by every reader near them), with what `prepare`
  /// asks for made for them there (bits of the prepare hook, set_prepare; the log ORs those of
  /// the readers of a block and passes them on): then nothing is returned, *fetching is set,
  /// and the notification (on_fetched) comes when they are in memory.
  virtual std::vector<event_ptr> read(std::uint64_t seq, std::size_t max_events, std::size_t max_bytes,
                                      std::string* error = nullptr, bool* fetching = nullptr,
                                      std::uint32_t prepare = 0) const = 0;
  /// The visible event seq when it is in the memory tail (no allocation, no I/O); null
  /// otherwise — read() it then.
  virtual event_ptr in_memory(std::uint64_t seq) const { (void)seq; return nullptr; }
  /// What a background read runs on each event it read (on the reader's thread, before the
  /// event is handed to anyone), with the bits its readers asked for (read()'s prepare): bits
  /// the hook's owner defines; the log only ORs what readers ask for and passes them on. In the
  /// server, the fan-out's encodings' maker (encoding_cache::preparer, want_encoding and
  /// want_deflate in fanout/encodings.hpp), which attaches what it made (logged_event::attached).
  /// Copied by each read, so it owns what it uses. Empty: nothing is made in the background.
  using prepare_fn = std::function<void(logged_event&, std::uint32_t)>;
  virtual void set_prepare(prepare_fn f) { (void)f; }
  /// Where a reader that processed id resumes.
  virtual resume_point resume_after(const transform::event_id& id) const = 0;
  /// The id of the last event of the last committed transaction (invalid commit LSN: none).
  virtual transform::event_id last_visible_id() const = 0;
  /// The seq of the first event of the oldest recently committed transaction whose xid
  /// satisfies pred (among the last 65,536 transactions in the log: those this process logged,
  /// and after a restart those it read back into memory); nullopt if none. A snapshot finds
  /// here the transactions that were logged before it was taken but that it did not see as
  /// committed (their commit was decoded before the server stopped listing them as running).
  virtual std::optional<std::uint64_t> first_recent_transaction(const std::function<bool(std::uint32_t)>& pred) const = 0;
  /// Counts bytes just attached to e (logged_event::attached) against what the log keeps in
  /// memory for it: nothing when the log does not keep e (not in its memory tail).
  virtual void account_memory(const logged_event& e, std::size_t bytes) = 0;

  /// Tail notifications: f is called (on the log's executor) each time events became visible
  /// (once for a burst of transactions, not once per event). The returned handle removes it.
  std::size_t on_visible(std::function<void()> f) {
    listeners_.push_back({++last_listener_, listen::visible, std::move(f)});
    return last_listener_;
  }
  /// Background-read notifications: f is called (on the log's executor) each time a read in
  /// the background is done — the readers that waited for it (read() set *fetching) go on. No
  /// event became visible: the clients waiting for new events need not wake.
  std::size_t on_fetched(std::function<void()> f) {
    listeners_.push_back({++last_listener_, listen::fetched, std::move(f)});
    return last_listener_;
  }
  /// Durability notifications: f is called (on the log's executor) each time the durable
  /// position (durable_seq(), durable_lsn()) advanced — an fsync done: what takes only durable
  /// events (the JetStream publisher) waits for it.
  std::size_t on_durable(std::function<void()> f) {
    listeners_.push_back({++last_listener_, listen::durable, std::move(f)});
    return last_listener_;
  }
  void remove_listener(std::size_t handle) {
    std::erase_if(listeners_, [&](const auto& l) { return l.handle == handle; });
  }
  /// Calls the on_visible listeners (the appending side, after events became visible).
  void announce() const { call(listen::visible); }
  /// Calls the on_fetched listeners (a background read is done).
  void announce_fetched() const { call(listen::fetched); }
  /// Calls the on_durable listeners (the syncing side, after durable_seq() advanced).
  void announce_durable() const { call(listen::durable); }

 private:
  enum class listen { visible, fetched, durable };
  struct listener {
    std::size_t handle;
    listen kind;
    std::function<void()> f;
  };
  void call(listen kind) const {
    for (const auto& l : listeners_)
      if (l.kind == kind) l.f();
  }
  std::vector<listener> listeners_;
  std::size_t last_listener_ = 0;
};

}  // namespace walgate::proxy
