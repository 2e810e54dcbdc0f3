// Appending to the event log (segments, rolls, retention, transactions and their abort) and
// making it durable (write, and the sync job's halves). Recovery and reading: event_log_recovery.cpp
// and event_log_read.cpp.
#include "event_log_file.hpp"

#include <algorithm>

namespace walgate::proxy {

namespace fs = std::filesystem;
using protocol::lsn;
using namespace log_file;

event_log::~event_log() {
  *alive_ = false;   // a background read that ends now finds the log gone
  if (fd_ >= 0) {
    sync();
    ::close(fd_);
  }
  for (int fd : retired_fds_) ::close(fd);
}

std::uint64_t event_log::first_seq() const {
  // Segments follow each other without a gap (an empty one starts where the next does); the
  // tail may still hold events of a segment retention dropped.
  std::uint64_t first = segments_.empty() ? visible_seq_ : std::min(segments_.front().first_seq, visible_seq_);
  if (!tail_.empty() && tail_.events().front()->seq < first) first = tail_.events().front()->seq;
  return first;
}

std::uint64_t event_log::transaction_end_offset(std::uint64_t seq) const {
  if (seq >= visible_seq_) return 0;
  auto it = std::upper_bound(recent_commits_.begin(), recent_commits_.end(), seq,
                             [](std::uint64_t s, const auto& c) { return s < c.first; });
  if (it == recent_commits_.begin()) return 0;
  return std::prev(it)->second;
}

void event_log::set_sync_observer(std::function<void(int fd)> f) { sync_observer() = std::move(f); }

void event_log::register_metrics(metrics_registry& r) const {
  r.add_value("walgate_log_disk_bytes", "gauge", "Bytes of event log on disk.", [this] { return disk_bytes(); });
  r.add_value("walgate_log_next_seq", "gauge", "Sequence number of the next event clients will see.",
              [this] { return visible_seq(); });
  r.add_value("walgate_log_background_reads_total", "counter",
              "Reads of the log file on the reader thread for clients behind the memory tail (blocks of events, or one record of 1 MiB or more).",
              [this] { return background_reads_; });
}

std::size_t event_log::disk_bytes() const {
  std::size_t n = 0;
  for (const auto& s : segments_) n += s.bytes;
  return n;
}

bool event_log::roll_segment() {
  // The full segment is written now and synced by the next sync job, on the sync thread: a roll
  // never stalls the event loop on an fdatasync.
  if (fd_ >= 0) {
    if (!write_pending()) return false;
    retired_fds_.push_back(fd_);
    fd_ = -1;
  }
  segment s;
  s.first_seq = s.end_seq = next_seq_;
  s.base = segments_.empty() ? 0 : segments_.back().base + segments_.back().bytes;
  s.path = opts_.dir / segment_name(next_seq_);
  fd_ = ::open(s.path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd_ < 0) {
    error_ = "cannot create " + s.path.string() + ": " + std::strerror(errno);
    return false;
  }
  dir_dirty_ = true;   // its directory entry is made durable with the first sync after it
  segments_.push_back(std::move(s));
  enforce_retention();
  return true;
}

std::uint64_t event_log::bytes_held_from(protocol::lsn lsn) const {
  for (const auto& s : segments_) {
    if (s.end_seq == s.first_seq || s.last_id.commit_lsn < lsn) continue;
    // From the last index entry before lsn (the first event needed is at or after it: at most
    // an index step, 256 events or 64 KiB, counted too many), or the segment's start.
    const auto at = std::partition_point(s.index.begin(), s.index.end(),
                                         [&](const index_entry& e) { return e.id.commit_lsn < lsn; });
    const std::uint64_t from = s.base + (at == s.index.begin() ? 0 : std::prev(at)->offset);
    return end_offset() > from ? end_offset() - from : 0;
  }
  return 0;
}

void event_log::enforce_retention() {
  while (segments_.size() > 1 && disk_bytes() > opts_.retention_bytes) {
    // The newest segment with events stays (its last id is where the log's head is known, after
    // a restart too), whatever the retention.
    bool later_events = false;
    for (std::size_t i = 1; i < segments_.size(); ++i) later_events = later_events || segments_[i].end_seq > segments_[i].first_seq;
    if (!later_events && segments_.front().end_seq > segments_.front().first_seq) break;
    // Held (not yet confirmed by a consumer that must have every event): kept.
    if (hold_ && segments_.front().end_seq > *hold_ && segments_.front().end_seq > segments_.front().first_seq) break;
    // Held by a downstream slot: it holds an event committed at or past the slot's position —
    // or the last event before it, when the next segment with events starts at or past it:
    // after a restart, where the slot resumes is found after that event (resume_after), and
    // a log that no longer held it could not tell the slot lost nothing.
    if (hold_lsn_ && segments_.front().end_seq > segments_.front().first_seq) {
      if (!(segments_.front().last_id.commit_lsn < *hold_lsn_)) break;
      const segment* next = nullptr;
      for (std::size_t i = 1; i < segments_.size() && !next; ++i)
        if (segments_[i].end_seq > segments_[i].first_seq) next = &segments_[i];
      if (!next || !(next->first_id.commit_lsn < *hold_lsn_)) break;
    }
    std::error_code ec;
    fs::remove(segments_.front().path, ec);
    if (segments_.front().end_seq > segments_.front().first_seq) {
      dropped_last_id_ = segments_.front().last_id;
      dropped_ = true;
    }
    segments_.erase(segments_.begin());
  }
}

bool event_log::begin(lsn commit_lsn) {
  open_ = true;
  skipping_ = last_commit_.valid() && commit_lsn <= last_commit_;
  if (skipping_) return false;
  if (segments_.back().bytes + pending_.size() >= opts_.segment_bytes && !roll_segment()) {
    skipping_ = true;
    return false;
  }
  txn_first_seq_ = next_seq_;
  txn_xid_ = 0;
  txn_file_offset_ = segments_.back().bytes + pending_.size();
  txn_seg_first_id_ = segments_.back().first_id;
  txn_seg_last_id_ = segments_.back().last_id;
  return true;
}

void event_log::abort() {
  if (!open_) return;
  open_ = false;
  unheld_ = false;
  if (skipping_) {
    skipping_ = false;
    return;
  }
  auto& seg = segments_.back();
  if (txn_file_offset_ >= seg.bytes) {
    pending_.resize(txn_file_offset_ - seg.bytes);
  } else {
    pending_.clear();
    if (::ftruncate(fd_, static_cast<off_t>(txn_file_offset_)) != 0)
      error_ = "cannot truncate the event log: " + std::string(std::strerror(errno));
    seg.bytes = txn_file_offset_;
  }
  std::erase_if(seg.index, [&](const index_entry& e) { return e.seq >= txn_first_seq_; });
  seg.first_id = txn_seg_first_id_;   // the segment's ids as they were before the transaction
  seg.last_id = txn_seg_last_id_;
  tail_.drop_from(txn_first_seq_);
  next_seq_ = txn_first_seq_;
}

void event_log::add(const transform::change& c) {
  if (!open_ || skipping_) return;
  scratch_.clear();
  // Room for the values at once: a record of a huge value is not grown by doubling (which
  // would hold it about twice for a moment).
  std::size_t values = 0;
  for (const auto& col : c.before) values += col.value.size() + 5;
  for (const auto& col : c.after) values += col.value.size() + 5;
  if (values >= large_record) scratch_.reserve(values + record_slack);
  protocol::writer(scratch_).u64(next_seq_);
  record_writer_.write(scratch_, c);
  txn_xid_ = c.txn->xid;
  const event_ptr ev = place(transform::event_id{c.txn->commit_lsn, c.index}, c.kind, c.txn->xid,
                                 c.relation ? std::string_view(c.relation->nspname) : std::string_view(),
                                 c.relation ? std::string_view(c.relation->relname) : std::string_view());
  if (publish_) publish_(*ev, c);
}

void event_log::add_record(std::string_view record, transform::event_id id, transform::op kind, std::uint32_t xid,
                           std::string_view schema, std::string_view table, bool hold) {
  if (!open_ || skipping_) return;
  if (!hold && record.size() + 8 < large_record) {
    // Framed where it goes, and not held in memory: the tail (which must reach the head) starts
    // again after it, and readers find it in the file, which has it by the commit.
    if (!tail_.empty()) {
      if (!write_pending()) return;
      tail_.clear();
    }
    auto& seg = segments_.back();
    const std::size_t start = pending_.size();
    protocol::writer w(pending_);
    w.u8('E').u32(static_cast<std::uint32_t>(record.size() + 8)).u64(next_seq_).raw(record);
    w.u32(protocol::crc32c(std::string_view(pending_).substr(start)));
    if (index_due(seg.index, next_seq_, seg.bytes + start, false)) seg.index.push_back({next_seq_, seg.bytes + start, id, false});
    if (next_seq_ == seg.first_seq) seg.first_id = id;
    seg.last_id = id;
    ++next_seq_;
    txn_xid_ = xid;
    unheld_ = true;
    if (pending_.size() > pending_write_bytes) write_pending();
    return;
  }
  scratch_.clear();
  if (record.size() + 8 >= large_record) scratch_.reserve(record.size() + 8);
  protocol::writer(scratch_).u64(next_seq_);
  scratch_.append(record);
  txn_xid_ = xid;
  place(id, kind, xid, schema, table);
}

event_ptr event_log::place(transform::event_id id, transform::op kind, std::uint32_t xid, std::string_view schema,
                           std::string_view table) {
  auto& seg = segments_.back();
  std::size_t offset = seg.bytes + pending_.size();
  const bool large = scratch_.size() >= large_record;
  auto ev = std::make_shared<logged_event>();
  ev->seq = next_seq_;
  if (!large) {
    frame(pending_, 'E', scratch_);
    ev->record.assign(scratch_, 8);
  } else {
    // A large record (a value of many megabytes) goes to the file from where it was made, and
    // becomes the event's record without a copy: it is held in memory once.
    write_frame_now('E', scratch_);
    scratch_.erase(0, 8);
    ev->record = std::move(scratch_);
    scratch_ = std::string();
  }
  ev->id = id;
  ev->kind = kind;
  ev->xid = xid;
  ev->schema = schema;
  ev->table = table;
  ev->end_offset = end_offset();
  if (index_due(seg.index, next_seq_, offset, large)) seg.index.push_back({next_seq_, offset, ev->id, large});
  if (next_seq_ == seg.first_seq) seg.first_id = ev->id;   // the segment's first event
  seg.last_id = ev->id;
  ++next_seq_;
  last_placed_ = ev;
  tail_.push(ev);
  evict();
  // A large transaction goes to the file as it comes (without fsync: it is not durable until
  // its end frame is, and recovery cuts unterminated transactions).
  if (pending_.size() > pending_write_bytes) write_pending();
  return ev;
}

void event_log::evict() {
  // Events not yet written to the file stay (until the next write or sync): a client behind the
  // tail reads the file, and must find them there.
  tail_.evict(segments_.back().base + segments_.back().bytes);
}

void event_log::account_memory(const logged_event& e, std::size_t bytes) {
  if (tail_.account(e, bytes)) evict();
}

void event_log::commit(lsn commit_lsn, lsn end_lsn) {
  if (!open_) return;
  open_ = false;
  // (before it is visible: no reader has it yet; an event framed after it unheld, read from the
  // file, gets its end from the end frame there)
  if (last_placed_ && last_placed_->seq + 1 == next_seq_ && last_placed_->id.commit_lsn == commit_lsn)
    last_placed_->txn_end = end_lsn;
  last_placed_.reset();
  if (skipping_) {
    skipping_ = false;
    return;
  }
  std::string end;
  protocol::writer(end).u64(commit_lsn.value).u64(end_lsn.value);
  frame(pending_, 'C', end);
  auto& seg = segments_.back();
  if (unheld_) {
    // Events not held in memory are read from the file: there before they are visible. A
    // write that fails leaves them invisible (error() says why; the log stops being used).
    unheld_ = false;
    if (!write_pending()) return;
  }
  seg.end_seq = next_seq_;
  last_commit_ = commit_lsn;
  pending_durable_ = end_lsn;
  pending_durable_seq_ = next_seq_;
  // Visible to clients from here on, all of it at once.
  if (next_seq_ > txn_first_seq_) {
    last_visible_id_ = seg.last_id;
    recent_commits_.emplace_back(txn_first_seq_, end_offset());
    if (recent_commits_.size() > recent_commits_kept) recent_commits_.pop_front();
    remember_xid(txn_xid_, txn_first_seq_);
  }
  visible_seq_ = next_seq_;
  visible_offset_ = end_offset();
  prune_blocks();   // (also here: with no reader left, blocks read in the background go soon)
  tail_.committed();
}

void event_log::remember_xid(std::uint32_t xid, std::uint64_t first_seq) {
  if (xid == 0) return;   // (a non-transactional message)
  recent_xids_.emplace_back(xid, first_seq);
  if (recent_xids_.size() > recent_xids_kept) recent_xids_.pop_front();
}

std::optional<std::uint64_t> event_log::first_recent_transaction(const std::function<bool(std::uint32_t)>& pred) const {
  for (const auto& [xid, seq] : recent_xids_)
    if (pred(xid)) return seq;
  return std::nullopt;
}

bool event_log::append(const protocol::transaction_info& txn, const std::vector<transform::change>& changes) {
  if (!begin(txn.commit_lsn)) {
    commit(txn.commit_lsn, txn.end_lsn);
    return false;
  }
  for (const auto& c : changes) add(c);
  commit(txn.commit_lsn, txn.end_lsn);
  return true;
}

bool event_log::write_frame_now(char type, std::string_view body) {
  if (!write_pending()) return false;
  char head[5];
  head[0] = type;
  for (int i = 0; i < 4; ++i) head[1 + i] = static_cast<char>((body.size() >> (24 - 8 * i)) & 0xff);
  std::uint32_t crc = protocol::crc32c(body, protocol::crc32c(std::string_view(head, sizeof head)));
  char tail[4];
  for (int i = 0; i < 4; ++i) tail[i] = static_cast<char>((crc >> (24 - 8 * i)) & 0xff);
  std::string_view parts[] = {{head, sizeof head}, body, {tail, sizeof tail}};
  for (auto part : parts) {
    std::size_t done = 0;
    while (done < part.size()) {
      ssize_t n = ::write(fd_, part.data() + done, part.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        error_ = "cannot write the event log: " + std::string(std::strerror(errno));
        return false;
      }
      done += static_cast<std::size_t>(n);
      segments_.back().bytes += static_cast<std::size_t>(n);
    }
  }
  return true;
}

bool event_log::write_pending() {
  struct evict_after {
    event_log& log;
    ~evict_after() { log.evict(); }   // what was held for want of the file may go now
  } after{*this};
  std::size_t done = 0;
  bool ok = true;
  while (done < pending_.size()) {
    ssize_t n = ::write(fd_, pending_.data() + done, pending_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      error_ = "cannot write the event log: " + std::string(std::strerror(errno));
      ok = false;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  segments_.back().bytes += done;
  pending_.erase(0, done);
  if (pending_.empty() && pending_.capacity() > 4 * large_record) pending_ = std::string();   // after one huge burst
  return ok;
}

bool event_log::sync() {
  auto job = begin_sync();
  run_sync_job(job);
  return end_sync(job);
}

event_log::sync_job event_log::begin_sync() {
  sync_job job;
  if (!pending_.empty() && !write_pending()) return job;
  if (!opts_.fsync) {
    for (int fd : retired_fds_) ::close(fd);
    retired_fds_.clear();
    dir_dirty_ = false;
  }
  job.fd = opts_.fsync ? ::fcntl(fd_, F_DUPFD_CLOEXEC, 0) : -2;   // -2: nothing to sync
  if (job.fd == -1) {
    error_ = "cannot fsync the event log: " + std::string(std::strerror(errno));
    return job;
  }
  if (dir_dirty_) {
    int dfd = ::open(opts_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
      error_ = "cannot sync the data directory " + opts_.dir.string() + ": " + std::strerror(errno);
      ::close(job.fd);
      job.fd = -1;
      return job;
    }
    dir_dirty_ = false;
    job.before.push_back(dfd);
  }
  job.before.insert(job.before.begin(), retired_fds_.begin(), retired_fds_.end());
  retired_fds_.clear();
  job.target = pending_durable_;
  job.target_seq = pending_durable_seq_;
  pending_durable_ = lsn{};
  ++syncing_;
  return job;
}

void event_log::run_sync_job(sync_job& job) {
  for (int fd : job.before) {
    if (!job.error && durable_sync(fd, false) != 0) job.error = errno;
    ::close(fd);
  }
  job.before.clear();
  if (job.fd < 0) return;
  if (!job.error && durable_sync(job.fd, true) != 0) job.error = errno;
  ::close(job.fd);
}

bool event_log::end_sync(const sync_job& job) {
  if (job.fd == -1) return false;   // begin_sync failed (error_ says why)
  --syncing_;
  if (job.error) {
    error_ = "cannot fsync the event log: " + std::string(std::strerror(job.error));
    return false;
  }
  const bool advanced = job.target_seq > durable_seq_ || (job.target.valid() && durable_lsn_ < job.target);
  if (job.target.valid()) durable_lsn_ = std::max(durable_lsn_, job.target);
  durable_seq_ = std::max(durable_seq_, job.target_seq);
  if (advanced) announce_durable();
  return true;
}

}  // namespace walgate::proxy
