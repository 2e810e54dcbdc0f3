// The read side of a log of events, as subscriptions see it: the position of an id, events
// from a position, how far is visible, and a notification when more is. event_log (the segment
// store in the data directory) is the first implementation; subscriptions, transports and
// encoders know only this interface, so that another (a JetStream stream) needs no change there.
// Single-threaded: called on the executor that appends.
#pragma once

#include "walgate/protocol/lsn.hpp"
#include "walgate/proxy/payload.hpp"
#include "walgate/transform/change.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace walgate::proxy {

/// The encodings an event can be asked for; pgoutput2json compact without "s" is shared too, and
/// so is compact with "s" (sent to a client with the first row of a table, and after a change).
enum class encoding : std::uint8_t {
  native, debezium, pgoutput2json, waltail, wal2json, pgoutput2json_compact, pgoutput2json_schema, count_
};

/// What a read in the background makes ready for the events it reads, off the event loop: bit i
/// for encoding i (want_encoding), bit 16 + w for an encoding's permessage-deflate form with
/// window w (want_deflate, 9-15), made of each encoding asked for.
constexpr std::uint32_t want_encoding(encoding e) { return 1u << static_cast<unsigned>(e); }
constexpr std::uint32_t want_deflate(int window_bits) { return 1u << (16 + window_bits); }

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
  /// Encodings, made once on first demand and shared by every client (single-threaded).
  mutable std::array<payload_ptr, static_cast<std::size_t>(encoding::count_)> json;
  /// Encodings of the event as another op, per encoding: an update that moves a row into a
  /// client's row grant is sent to it as an insert, out of it as a delete (made on demand).
  mutable std::shared_ptr<std::array<payload_ptr, 2 * static_cast<std::size_t>(encoding::count_)>> moved;
  /// Encodings of the event with only some columns (column grants): per encoding, op and
  /// column mask (table_rows::masks), made on demand.
  struct masked_encoding {
    encoding enc;
    transform::op as;
    std::string mask;   ///< ("*" for a keyed form of every column)
    payload_ptr bytes;
    bool keyed = false;   ///< keys=true's {"key":…,"value":…} form (encoding_cache::keyed)
  };
  mutable std::shared_ptr<std::vector<masked_encoding>> masked;
  mutable bool in_tail = false;   ///< held by the log's memory tail (its encodings count there)
  mutable std::size_t accounted = 0;   ///< what the tail counts for it: memory() when last counted
  std::size_t memory() const {
    std::size_t n = sizeof(*this) + record.size() + schema.size() + table.size();
    for (const auto& j : json)
      if (j) n += j->memory();
    if (moved)
      for (const auto& j : *moved)
        if (j) n += j->memory();
    if (masked)
      for (const auto& m : *masked) n += sizeof(m) + m.mask.size() + (m.bytes ? m.bytes->memory() : 0);
    return n;
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
  /// Events from seq on, committed only: at most max_events, and no more records than about
  /// max_bytes (at least one event). Empty when seq is not retained or nothing is visible
  /// there. When the log cannot be read, the events before the fault are returned and *error
  /// says what failed. With fetching given, events not in memory may be read in the background
  /// instead (in large sequential blocks shared by every reader near them), with what `prepare`
  /// asks for (want_encoding, want_deflate) made for them there: then nothing is returned,
  /// *fetching is set, and the notification (on_fetched) comes when they are in memory.
  virtual std::vector<event_ptr> read(std::uint64_t seq, std::size_t max_events, std::size_t max_bytes,
                                      std::string* error = nullptr, bool* fetching = nullptr,
                                      std::uint32_t prepare = 0) const = 0;
  /// The visible event seq when it is in the memory tail (no allocation, no I/O); null
  /// otherwise — read() it then.
  virtual event_ptr in_memory(std::uint64_t seq) const { (void)seq; return nullptr; }
  /// What a background read runs on each event it read, with the bits asked for (see
  /// want_encoding): the encodings' maker (encoding_cache::preparer). Copied by each read, so
  /// it owns what it uses. Empty: nothing is made in the background.
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
  /// Counts an encoding just cached on e against what the log keeps in memory for it.
  virtual void account_encoding(const logged_event& e, std::size_t bytes) = 0;

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
