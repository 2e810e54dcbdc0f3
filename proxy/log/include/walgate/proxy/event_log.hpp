// The event log: the gateway's memory. Committed transactions are appended as event records
// (transform/record.hpp) to segment files in the data directory, made durable by group commit
// (one fdatasync for everything appended since the last), and kept in a bounded in-memory tail
// for live clients. Its durable position is what the replication client acknowledges.
//
// Segment file: frames of  Byte1 type | Int32 length | payload | Int32 checksum (CRC-32C of
// type, length and payload). The data directory's FORMAT file names the layout ("walgate event
// log 2"); a directory of another layout is refused, never read as damaged. 'E' events: Int64 seq | record. 'C' transaction ends:
// Int64 commit_lsn | Int64 end_lsn. On open, a torn tail (after the first frame that is not whole
// and valid, no whole, valid frame in that segment or a later one) is cut at its last complete
// transaction and moved to damaged/: it was never acknowledged; what is kept is fsynced (segments
// and directory) before anything is acknowledged. Damage with whole frames after it is refused,
// unless the slot's confirmed position (log_options::acknowledged) and ACKED show that nothing
// from the damage on was acknowledged: then it is cut the same way (event_log_recovery.cpp).
//
// What clients see: only committed transactions. Events of a transaction still arriving are
// held (in memory, on disk when large) and become visible together at its commit frame; a
// transaction cut off by a reconnect (abort()) was never visible, so a reconnect is invisible to
// clients. visible_seq() / visible_offset() never move back.
#pragma once

#include "walgate/protocol/lsn.hpp"
#include "walgate/proxy/log_reader.hpp"
#include "walgate/proxy/memory_tail.hpp"
#include "walgate/proxy/metrics.hpp"
#include "walgate/transform/change.hpp"
#include "walgate/transform/record.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace walgate::proxy {

struct log_options {
  std::filesystem::path dir;
  std::size_t segment_bytes = 64u << 20;
  std::size_t retention_bytes = 1u << 30;   ///< Oldest segments are removed past this.
  std::size_t memory_bytes = 16u << 20;     ///< In-memory tail for live clients, with what they attach to events.
  bool fsync = true;                        ///< false only for tests and benchmarks that say so.
  /// Where the slot was acknowledged to (its confirmed_flush_lsn), when it could be read before
  /// the log was opened: recovery cuts no transaction that commits before it (nor before ACKED).
  protocol::lsn acknowledged;
};

class event_log final : public log_reader {
 public:
  /// Opens (creating) the log in dir, recovering what the last run made durable.
  static std::unique_ptr<event_log> open(const log_options& o, std::string& error);
  ~event_log();

  /// Starts a committed transaction's events. Refused (false) when its commit LSN is not past
  /// the last one logged: the server resent a transaction we already have, and its events must
  /// be dropped (add() then ignores them).
  bool begin(protocol::lsn commit_lsn);
  /// Appends one event of the open transaction and publishes it to live clients at once (its
  /// transaction has committed on the server; a crash before commit() makes the server resend
  /// it with the same ids). Large transactions go to disk as they come: memory stays bounded.
  void add(const transform::change& c);
  /// add() of a record already made (transform::record_writer, on another thread: the initial
  /// snapshot's rows), with its event's id, kind, xid and table as the record says. Nothing is
  /// published: a client's encoding is made from the record when it is asked for. Without hold,
  /// the event is not kept in the memory tail (a bulk of events no live reader waits for: the
  /// initial snapshot); readers read it from the file.
  void add_record(std::string_view record, transform::event_id id, transform::op kind, std::uint32_t xid,
                  std::string_view schema, std::string_view table, bool hold = true);
  /// Ends the transaction; it becomes durable at the next sync().
  void commit(protocol::lsn commit_lsn, protocol::lsn end_lsn);
  bool in_transaction() const { return open_; }
  /// Drops the open transaction (the connection broke before its end): its bytes are cut from
  /// the file and its seqs are reused when the server sends it again, with the same event ids.
  /// Clients never saw it (see visible_seq()).
  void abort();
  /// begin + add each + commit.
  bool append(const protocol::transaction_info& txn, const std::vector<transform::change>& changes);
  /// Writes and fdatasyncs everything appended; returns false on an I/O error (error() says).
  bool sync();
  /// The same in two halves, so the fdatasync can run on another thread while this one serves:
  /// begin_sync() writes what is pending and returns a job (a dup of the file descriptor and the
  /// end LSN it makes durable; fd -1 on a write error); whoever runs it calls run_sync_job()
  /// (fdatasync and close, on any thread), then end_sync() here.
  struct sync_job {
    int fd = -1;
    /// Also synced, then closed, before fd: segments rolled since the last job (their files,
    /// whose descriptors the log handed over) and the data directory (a new segment's entry).
    std::vector<int> before;
    protocol::lsn target;
    std::uint64_t target_seq = 0;   ///< one past the last event it makes durable
    int error = 0;   ///< errno of a failed fdatasync
  };
  sync_job begin_sync();
  static void run_sync_job(sync_job& job);
  bool end_sync(const sync_job& job);
  /// Something appended is not durable yet (pending, or its sync still running).
  bool dirty() const {
    return !pending_.empty() || pending_durable_.valid() || syncing_ > 0 || !retired_fds_.empty() || dir_dirty_;
  }
  const std::string& error() const { return error_; }

  /// End LSN of the last transaction made durable (what may be acknowledged).
  protocol::lsn durable_lsn() const { return durable_lsn_; }
  /// One past the last event made durable (of a committed transaction): what may leave this
  /// process for another store (the JetStream publisher) without a crash taking it back.
  std::uint64_t durable_seq() const { return durable_seq_; }
  /// A position acknowledged past the last logged transaction (an idle stream's keepalives),
  /// as last stored in the ACKED file: with durable_lsn(), how far the slot may have been
  /// acknowledged — so that a restart can tell a slot moved on by someone else.
  protocol::lsn acked_lsn() const { return acked_lsn_; }
  /// Stores l in dir's ACKED file (synced unless fsync is off). Any thread; false with why.
  /// The cut a CUT file in dir asks for (history.hpp), made before the log is opened: every
  /// transaction committed at or after its switch point moved aside (damaged/ in dir, never
  /// deleted), the line appended to CUTS, ACKED lowered to the switch point, CUT removed. True
  /// when there was nothing to do or it was done (said: what was cut, for the log); false with
  /// error when it cannot be made — also when the log began past the switch point (everything in
  /// it, its initial snapshot too, is of the timeline the server left).
  static bool cut_history(const std::filesystem::path& dir, bool fsync, std::string& said, std::string& error);
  /// Adds a cut made of nothing the log holds (ids the log never kept but a client may have
  /// seen: written before a crash took them, on a timeline the server has left): appended to
  /// CUTS, synced, and covered from now on. False with error() when it cannot be stored.
  bool record_history_cut(const history_cut& c);
  /// CUTS as read at open(), and those recorded since.
  const std::vector<history_cut>& history_cuts() const override { return cuts_; }
  std::optional<transform::event_id> last_dropped_id() const override {
    return dropped_ ? std::optional<transform::event_id>(dropped_last_id_) : std::nullopt;
  }
  static bool store_acked(const std::filesystem::path& dir, protocol::lsn l, bool fsync, std::string& error);
  const log_options& options() const { return opts_; }
  /// Commit LSN of the last transaction appended (durable or not).
  protocol::lsn last_commit_lsn() const { return last_commit_; }
  /// Seq of the next event appended (those of an open transaction included).
  std::uint64_t next_seq() const { return next_seq_; }
  /// One past the last event of the last committed transaction: what clients may read up to.
  std::uint64_t visible_seq() const override { return visible_seq_; }
  /// end_offset() as of the last commit: a client's lag is measured against it. Never moves back.
  std::uint64_t visible_offset() const override { return visible_offset_; }
  /// The oldest retained event's seq (visible_seq() when empty).
  std::uint64_t first_seq() const override;
  /// Where the committed transaction holding event seq ends (its commit frame's end offset),
  /// for the last 4,096 transactions; 0 when unknown.
  std::uint64_t transaction_end_offset(std::uint64_t seq) const override;

  /// Where this log began: the slot's consistent point (or the position the server resumed an
  /// existing slot at) when the log was empty. An event id from before it belongs to another
  /// log (a lost data directory, a new slot) and is not resumable here. Invalid: unknown (a log
  /// made before walgate stored it), then no bound.
  protocol::lsn origin() const override { return origin_; }
  /// Stores the origin (ORIGIN file, synced) while the log holds no event: set, or moved up
  /// (never down); false with error() set when it cannot be stored.
  bool set_origin(protocol::lsn l);

  /// Events published to live clients: the in-memory tail, seq order.
  const std::deque<event_ptr>& tail() const { return tail_.events(); }
  /// Up to max events from seq on, from memory or disk. Empty when seq is not retained. When
  /// the file cannot be read (an I/O error, a segment shorter than written, a frame whose
  /// checksum fails), the events before the fault are returned and *error says what failed.
  /// With a background runner and fetching given, what is not in memory is read on the runner's
  /// thread in blocks of up to 512 KiB of records (or one large record), which every reader
  /// near them shares while the blocks are kept (until read from, at most 5 s; then 0.5 s after
  /// their last use, at most 16 MiB of those read from), with what `prepare` asks for made there
  /// (by the prepare hook, set_prepare); a reader in the second half of a block starts the next
  /// one, so that a reader going through the file rarely waits.
  std::vector<event_ptr> read(std::uint64_t seq, std::size_t max_events, std::size_t max_bytes,
                              std::string* error = nullptr, bool* fetching = nullptr,
                              std::uint32_t prepare = 0) const override;
  void set_prepare(prepare_fn f) override { prepare_ = std::move(f); }
  event_ptr in_memory(std::uint64_t seq) const override { return seq < visible_seq_ ? tail_.at(seq) : nullptr; }
  /// Runs work on a thread of its own, then done on the log's executor. Set: a reader that can
  /// wait (read() with fetching) reads the file in the background (above), so the event loop
  /// never does. Unset (tests, tools): read() reads the file at once.
  using background_runner = std::function<void(std::function<void()> work, std::function<void()> done)>;
  void set_background(background_runner r) { background_ = std::move(r); }
  /// read() with at most 1 MiB of records from disk.
  std::vector<event_ptr> read(std::uint64_t seq, std::size_t max, std::string* error = nullptr) const {
    return read(seq, max, 1u << 20, error);
  }
  resume_point resume_after(const transform::event_id& id) const override;
  transform::event_id last_visible_id() const override { return last_visible_id_; }
  std::optional<std::uint64_t> first_recent_transaction(const std::function<bool(std::uint32_t)>& pred) const override;
  /// resume_after(id).seq.
  std::optional<std::uint64_t> seq_after(const transform::event_id& id) const { return resume_after(id).seq; }

  /// (Internal.) A block of events read in the background, shared by the readers near it.
  struct block {
    std::uint64_t first = 0;                  // the seq it was asked for
    std::atomic<std::uint32_t> want{0};       // what to prepare (readers waiting add theirs)
    bool done = false;                        // (the log's executor) events and error are set
    std::vector<event_ptr> events;            // consecutive seqs from first
    std::string error;                        // a fault after them
    bool taken = false;                       // a reader has read from it
    std::size_t memory = 0;
    std::chrono::steady_clock::time_point used;   // done, or last read from
    std::uint64_t end() const { return events.empty() ? first : events.back()->seq + 1; }
  };

  /// Test hook: called after every successful fsync/fdatasync the log makes (segment files,
  /// the directory, ACKED, ORIGIN), with the descriptor synced, on the thread that synced it.
  static void set_sync_observer(std::function<void(int fd)> f);

  /// Called with each event as it is appended (before it is durable), with the change it was
  /// made from (valid during the call only).
  void set_publish(std::function<void(const logged_event&, const transform::change&)> f) { publish_ = std::move(f); }

  std::size_t disk_bytes() const;
  /// Retention keeps every segment holding an event at seq or after, whatever --retention-mb
  /// says (events another consumer has not confirmed: the JetStream publisher); nullopt: no
  /// hold. Moving it forward lets retention drop what it held at once.
  void hold_from(std::optional<std::uint64_t> seq) {
    hold_ = seq;
    enforce_retention();
  }
  /// Retention also keeps every segment holding an event whose commit LSN is at or past lsn
  /// (what walgate's downstream slots have not confirmed: the walsender's hold); nullopt: no
  /// such hold. Moving it forward lets retention drop what it held at once.
  void hold_from_lsn(std::optional<protocol::lsn> lsn) {
    hold_lsn_ = lsn;
    enforce_retention();
  }
  std::uint64_t bytes_held_from(protocol::lsn lsn) const override;
  /// Registers the log's size and head for /metrics.
  void register_metrics(metrics_registry& r) const;
  /// Byte position of the end of the log (see logged_event::end_offset).
  std::uint64_t end_offset() const { return segments_.back().base + segments_.back().bytes + pending_.size(); }
  /// Counts bytes just attached to e (logged_event::attached) against the memory tail (if e is
  /// in it), evicting the oldest events past the bound.
  void account_memory(const logged_event& e, std::size_t bytes) override;

 private:
  struct index_entry {
    std::uint64_t seq = 0;
    std::size_t offset = 0;   // of its frame
    transform::event_id id;
    bool large = false;       // a frame of 1 MiB or more
  };
  /// Whether the frame of seq at offset gets an entry: every 256 events or 64 KiB, every large
  /// frame and the one after it — so that finding an id never reads a large frame, and a scan
  /// from an entry meets one only as its first frame.
  static bool index_due(const std::vector<index_entry>& index, std::uint64_t seq, std::size_t offset, bool large);
  struct segment {
    std::filesystem::path path;
    std::uint64_t first_seq = 0, end_seq = 0;   // [first, end)
    std::uint64_t base = 0;                      // end_offset of the previous segment
    transform::event_id first_id, last_id;
    std::size_t bytes = 0;
    /// Sparse: an entry at least every 256 events and every 64 KiB of frames, so that finding
    /// an event (by seq or by id) reads at most that much of the file before it (see index_due).
    std::vector<index_entry> index;
  };
  event_log() = default;
  bool recover(std::string& error);
  /// fsyncs every kept segment and the directory (recovery keeps only what is on stable storage).
  bool sync_recovered(std::string& error);
  /// After recovery: the newest events (up to half the memory tail) back in memory.
  void prefill_tail();
  /// What scanning a segment found: good_end is the offset after its last complete transaction,
  /// stop where the scan stopped (the first frame that is not whole and valid, or total), total
  /// the file's size.
  struct scan_result {
    std::size_t good_end = 0, stop = 0, total = 0;
  };
  /// Reads s in bounded blocks (memory does not grow with the segment or its records).
  bool scan_segment(segment& s, std::string& error, scan_result& r);
  bool roll_segment();
  bool write_pending();   // write() what is pending (no fsync)
  bool write_frame_now(char type, std::string_view body);   // what is pending, then this frame
  void enforce_retention();
  void evict();
  /// Frames scratch_ (seq and record) and makes it the next event.
  event_ptr place(transform::event_id id, transform::op kind, std::uint32_t xid, std::string_view schema,
                  std::string_view table);
  std::vector<event_ptr> read_disk(std::uint64_t seq, std::size_t max, std::size_t max_bytes, std::string* error) const;
  background_runner background_;
  mutable std::uint64_t background_reads_ = 0;
  mutable std::deque<std::shared_ptr<block>> blocks_;
  mutable std::size_t blocks_memory_ = 0;
  prepare_fn prepare_;
  std::vector<event_ptr> read_blocks(std::uint64_t seq, std::size_t max, std::size_t max_bytes, std::string* error,
                                     bool* fetching, std::uint32_t want) const;
  /// Starts reading a block at seq; false when there is nothing in the file there (error set
  /// when that is a fault).
  bool start_block(std::uint64_t seq, std::uint32_t want, std::string* error) const;
  /// Drops blocks read from and unused for 0.5 s, and the least recently used of them past the
  /// budget; a block not read from yet stays until it is (or for 5 s: its readers went away).
  void prune_blocks() const;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);

  log_options opts_;
  std::vector<segment> segments_;
  int fd_ = -1;
  std::string pending_;                 // frames not yet written
  std::string scratch_;                 // add(): the event's payload
  transform::record_writer record_writer_;
  protocol::lsn pending_durable_;       // end LSN that becomes durable at the next sync
  protocol::lsn durable_lsn_, last_commit_, acked_lsn_, origin_;
  std::vector<history_cut> cuts_;
  std::uint64_t next_seq_ = 0;
  std::uint64_t visible_seq_ = 0, visible_offset_ = 0;
  std::uint64_t pending_durable_seq_ = 0, durable_seq_ = 0;
  transform::event_id last_visible_id_;   // id of the last committed event
  transform::event_id dropped_last_id_;   // last id of the newest segment retention dropped
  bool dropped_ = false;                   // retention dropped something in this process
  std::optional<std::uint64_t> hold_;      // hold_from()
  std::optional<protocol::lsn> hold_lsn_;  // hold_from_lsn()
  std::deque<std::pair<std::uint64_t, std::uint64_t>> recent_commits_;   // (first seq, end offset), seq order
  std::deque<std::pair<std::uint32_t, std::uint64_t>> recent_xids_;      // (xid, first seq), seq order
  std::uint32_t txn_xid_ = 0;                                            // of the open transaction
  std::shared_ptr<logged_event> last_placed_;   // the open transaction's last event held in memory (its txn_end is set at the commit)
  void remember_xid(std::uint32_t xid, std::uint64_t first_seq);
  transform::event_id txn_seg_first_id_, txn_seg_last_id_;   // the last segment's ids at begin()
  memory_tail tail_{0};   // the newest events in memory, and those out of it a reader holds
  std::function<void(const logged_event&, const transform::change&)> publish_;
  bool unheld_ = false;   // the open transaction has events not in the memory tail
  std::string error_;
  bool open_ = false, skipping_ = false;
  int syncing_ = 0;   // sync jobs begun and not ended
  std::vector<int> retired_fds_;   // rolled segments, written, to be synced by the next job
  bool dir_dirty_ = false;         // a segment was created: the directory is synced by the next job
  std::uint64_t txn_first_seq_ = 0;
  std::size_t txn_file_offset_ = 0;   // segment bytes + pending at begin()
};

}  // namespace walgate::proxy
