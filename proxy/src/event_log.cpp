#include "walgate/proxy/event_log.hpp"

#include "walgate/protocol/crc32c.hpp"
#include "walgate/protocol/cursor.hpp"
#include "walgate/transform/record.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace walgate::proxy {

namespace fs = std::filesystem;
using protocol::lsn;

namespace {

void frame(std::string& out, char type, std::string_view payload) {
  std::size_t start = out.size();
  protocol::writer w(out);
  w.u8(static_cast<std::uint8_t>(type)).u32(static_cast<std::uint32_t>(payload.size())).raw(payload);
  w.u32(protocol::crc32c(std::string_view(out).substr(start)));
}

constexpr std::size_t frame_overhead = 1 + 4 + 4;
constexpr std::string_view format_line = "walgate event log 2\n";
constexpr std::size_t index_every = 256;
constexpr std::size_t index_bytes = 64u << 10;
constexpr std::size_t large_record = 1u << 20;   // written to the file directly, never copied

std::string segment_name(std::uint64_t first_seq) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "segment-%020llu.log", static_cast<unsigned long long>(first_seq));
  return buf;
}

std::function<void(int)>& sync_observer() {
  static std::function<void(int)> f;
  return f;
}

/// fsync (or fdatasync) that tells the test hook what was made durable.
int durable_sync(int fd, bool data_only) {
  int r = data_only ? ::fdatasync(fd) : ::fsync(fd);
  if (r == 0 && sync_observer()) sync_observer()(fd);
  return r;
}

bool sync_dir(const fs::path& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  bool ok = dfd >= 0 && durable_sync(dfd, false) == 0;
  int saved = errno;
  if (dfd >= 0) ::close(dfd);
  errno = saved;
  return ok;
}

/// The first seq a segment file's name gives, or nullopt when the name is not exactly one this
/// log writes (segment-<20 digits>.log): a stray file is left alone, never parsed.
std::optional<std::uint64_t> segment_first_seq(const std::string& name) {
  if (name.size() != 8 + 20 + 4 || name.compare(0, 8, "segment-") != 0 || name.compare(28, 4, ".log") != 0)
    return std::nullopt;
  std::uint64_t v = 0;
  for (std::size_t i = 8; i < 28; ++i) {
    char c = name[i];
    if (c < '0' || c > '9') return std::nullopt;
    std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

/// A 12-byte position file (ACKED, ORIGIN): Int64 LSN | Int32 CRC-32C of it. A file that does
/// not check out is no position.
lsn read_position_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string a((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  protocol::cursor c(a);
  std::uint64_t v = c.u64();
  std::uint32_t sum = c.u32();
  if (c.ok() && c.empty() && sum == protocol::crc32c(std::string_view(a).substr(0, 8))) return lsn{v};
  return lsn{};
}

bool write_position_file(const fs::path& dir, const char* name, lsn l, bool fsync, std::string& error) {
  std::string data;
  protocol::writer(data).u64(l.value);
  protocol::writer(data).u32(protocol::crc32c(data));
  const auto path = dir / name;
  std::error_code ec;
  const bool existed = fs::exists(path, ec);
  // 12 bytes rewritten in place: within one sector, so a crash leaves the old or the new value.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0640);
  bool ok = fd >= 0 && ::pwrite(fd, data.data(), data.size(), 0) == static_cast<ssize_t>(data.size()) &&
            (!fsync || durable_sync(fd, true) == 0);
  int saved = errno;
  if (fd >= 0) ::close(fd);
  if (ok && fsync && !existed) {
    ok = sync_dir(dir);
    saved = errno;
  }
  if (!ok) error = "cannot store the position in " + path.string() + ": " + std::strerror(saved);
  return ok;
}

std::shared_ptr<logged_event> make_event(std::uint64_t seq, std::string record) {
  auto e = std::make_shared<logged_event>();
  e->seq = seq;
  e->record = std::move(record);
  if (auto v = transform::read_record(protocol::as_bytes(e->record))) {
    const auto& c = (*v)->get();
    e->id = transform::event_id{c.txn->commit_lsn, c.index};
    e->kind = c.kind;
    if (c.relation) {
      e->schema = c.relation->nspname;
      e->table = c.relation->relname;
    }
  }
  return e;
}

}  // namespace

std::unique_ptr<event_log> event_log::open(const log_options& o, std::string& error) {
  std::unique_ptr<event_log> log(new event_log());
  log->opts_ = o;
  log->tail_ = memory_tail(o.memory_bytes);
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  if (ec) {
    error = "cannot create data directory " + o.dir.string() + ": " + ec.message();
    return nullptr;
  }
  // The layout marker: a log written in another layout is refused, not cut off as damaged.
  auto format_path = o.dir / "FORMAT";
  bool has_segments = false;
  for (const auto& e : fs::directory_iterator(o.dir, ec))
    if (segment_first_seq(e.path().filename().string())) has_segments = true;
  std::ifstream fin(format_path, std::ios::binary);
  std::string found((std::istreambuf_iterator<char>(fin)), std::istreambuf_iterator<char>());
  if (found != format_line && (has_segments || !found.empty())) {
    error = "data directory " + o.dir.string() + " holds an event log of another layout (" +
            (found.empty() ? std::string("no FORMAT file") : "FORMAT: " + found.substr(0, found.find('\n'))) +
            ") than this walgate writes (" + std::string(format_line.substr(0, format_line.size() - 1)) +
            "); move it away or remove it";
    return nullptr;
  }
  if (found.empty()) {
    // Written and synced with its directory entry before any segment: a crash never leaves
    // segments without the marker that says how to read them.
    int fd = ::open(format_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    bool ok = fd >= 0 && ::write(fd, format_line.data(), format_line.size()) == static_cast<ssize_t>(format_line.size()) &&
              (!o.fsync || durable_sync(fd, false) == 0);
    int saved = errno;
    if (fd >= 0) ::close(fd);
    if (ok && o.fsync) {
      ok = sync_dir(o.dir);
      saved = errno;
    }
    if (!ok) {
      error = "cannot write " + format_path.string() + ": " + std::strerror(saved);
      return nullptr;
    }
  }
  if (!log->recover(error)) return nullptr;
  // What recovery keeps may be only in the page cache (a kill -9 between a write and its
  // fdatasync): it is made durable before anything is acknowledged from it, as PostgreSQL
  // syncs its data directory after a crash.
  if (o.fsync && !log->sync_recovered(error)) return nullptr;
  log->acked_lsn_ = read_position_file(o.dir / "ACKED");
  log->origin_ = read_position_file(o.dir / "ORIGIN");
  log->prefill_tail();
  return log;
}

event_log::~event_log() {
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

bool event_log::set_origin(lsn l) {
  if (origin_.valid() || next_seq_ != 0 || !l.valid()) return true;
  std::string error;
  if (!write_position_file(opts_.dir, "ORIGIN", l, opts_.fsync, error)) {
    error_ = error;
    return false;
  }
  origin_ = l;
  return true;
}

bool event_log::sync_recovered(std::string& error) {
  for (const auto& s : segments_) {
    int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || durable_sync(fd, false) != 0) {
      error = "cannot sync " + s.path.string() + " after recovery: " + std::strerror(errno);
      if (fd >= 0) ::close(fd);
      return false;
    }
    ::close(fd);
  }
  for (const char* name : {"ACKED", "ORIGIN"}) {
    int fd = ::open((opts_.dir / name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;   // not written yet
    bool ok = durable_sync(fd, false) == 0;
    int saved = errno;
    ::close(fd);
    if (!ok) {
      error = "cannot sync " + (opts_.dir / name).string() + " after recovery: " + std::strerror(saved);
      return false;
    }
  }
  if (!sync_dir(opts_.dir)) {
    error = "cannot sync the data directory " + opts_.dir.string() + " after recovery: " + std::strerror(errno);
    return false;
  }
  return true;
}

void event_log::register_metrics(metrics_registry& r) const {
  r.add_value("walgate_log_disk_bytes", "gauge", "Bytes of event log on disk.", [this] { return disk_bytes(); });
  r.add_value("walgate_log_next_seq", "gauge", "Sequence number of the next event clients will see.",
              [this] { return visible_seq(); });
}

std::size_t event_log::disk_bytes() const {
  std::size_t n = 0;
  for (const auto& s : segments_) n += s.bytes;
  return n;
}

bool event_log::scan_segment(segment& s, std::string& error, std::size_t& good_end, std::size_t& total) {
  std::ifstream in(s.path, std::ios::binary);
  if (!in) {
    error = "cannot read " + s.path.string() + ": " + std::strerror(errno);
    return false;
  }
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  protocol::cursor c(data);
  good_end = 0;   // offset after the last complete transaction
  total = data.size();
  std::uint64_t seq_at_good = s.first_seq;
  std::uint64_t seq = s.first_seq;
  std::vector<index_entry> index;
  transform::event_id first, last, last_good;
  bool have_first = false;
  lsn commit_at_good = last_commit_, durable_at_good = durable_lsn_;
  while (!c.empty()) {
    std::size_t offset = c.offset();
    char type = static_cast<char>(c.u8());
    std::uint32_t len = c.u32();
    auto payload = c.bytes(len);
    std::uint32_t sum = c.u32();
    if (!c.ok() || sum != protocol::crc32c(std::string_view(data).substr(offset, frame_overhead - 4 + len))) break;
    protocol::cursor p(payload);
    if (type == 'E') {
      std::uint64_t s_seq = p.u64();
      if (!p.ok() || s_seq != seq) break;
      auto ev = make_event(seq, std::string(protocol::as_string_view(p.rest())));   // (ids of the first and last)
      if (index_due(index, seq, offset)) index.push_back({seq, offset, ev->id});
      if (!have_first) {
        first = ev->id;
        have_first = true;
      }
      last = ev->id;
      ++seq;
    } else if (type == 'C') {
      std::uint64_t commit = p.u64(), end = p.u64();
      if (!p.ok()) break;
      commit_at_good = lsn{commit};
      durable_at_good = lsn{end};
      good_end = c.offset();
      seq_at_good = seq;
      last_good = last;
    } else {
      break;
    }
  }
  last_commit_ = commit_at_good;
  durable_lsn_ = durable_at_good;
  s.end_seq = seq_at_good;
  s.bytes = good_end;
  s.first_id = seq_at_good > s.first_seq ? first : transform::event_id{};
  s.last_id = last_good;
  std::erase_if(index, [&](const index_entry& e) { return e.seq >= seq_at_good; });
  s.index = std::move(index);
  return true;
}

bool event_log::store_acked(const std::filesystem::path& dir, lsn l, bool fsync, std::string& error) {
  return write_position_file(dir, "ACKED", l, fsync, error);
}

void event_log::prefill_tail() {
  // After a restart, clients resume near the head (a browser's EventSource sends its last id):
  // with the newest events in memory again, they share those events and their encodings
  // instead of each reading and encoding them from the file. Half the tail's budget: the other
  // half is for the encodings and what comes next.
  const std::size_t budget = opts_.memory_bytes / 2;
  std::uint64_t start = next_seq_;
  std::size_t covered = 0;
  for (auto it = segments_.rbegin(); it != segments_.rend(); ++it) {
    if (it->end_seq == it->first_seq) continue;
    if (covered + it->bytes <= budget) {
      start = it->first_seq;
      covered += it->bytes;
      continue;
    }
    const std::size_t from = it->bytes - (budget - covered);   // the newest part that fits
    for (const auto& entry : it->index)
      if (entry.offset >= from) {
        start = entry.seq;
        break;
      }
    break;
  }
  std::uint64_t seq = start;
  while (seq < next_seq_) {
    auto batch = read_disk(seq, 512, 1u << 20, nullptr);
    if (batch.empty()) break;
    for (auto& ev : batch) tail_.push(ev, false);
    seq = tail_.events().back()->seq + 1;
  }
  if (seq != next_seq_) tail_.clear();   // the tail must reach the head; a fault here shows on reading
  evict();
}

bool event_log::recover(std::string& error) {
  std::vector<std::pair<std::uint64_t, fs::path>> files;
  for (const auto& e : fs::directory_iterator(opts_.dir))
    if (auto first = segment_first_seq(e.path().filename().string())) files.emplace_back(*first, e.path());
  std::sort(files.begin(), files.end());
  for (std::size_t i = 0; i < files.size(); ++i) {
    segment s;
    s.path = files[i].second;
    s.first_seq = files[i].first;
    if (!segments_.empty() && s.first_seq != segments_.back().end_seq) {
      error = "event log segments do not follow each other at " + files[i].second.string();
      return false;
    }
    std::size_t good_end = 0, total = 0;
    if (!scan_segment(s, error, good_end, total)) return false;
    if (good_end != total) {
      // A torn or short segment (a crash while writing it): what follows its last complete
      // transaction was never acknowledged. Cut there, unless a later segment holds complete
      // transactions — then the damage is inside acknowledged data, and cutting would lose them.
      std::size_t later_transactions = 0;
      std::vector<fs::path> later;
      for (std::size_t j = i + 1; j < files.size(); ++j) {
        segment t;
        t.path = files[j].second;
        t.first_seq = files[j].first;
        std::size_t g = 0, n = 0;
        lsn keep_commit = last_commit_, keep_durable = durable_lsn_;
        if (!scan_segment(t, error, g, n)) return false;
        last_commit_ = keep_commit;
        durable_lsn_ = keep_durable;
        if (g > 0) ++later_transactions;
        later.push_back(t.path);
      }
      if (later_transactions > 0) {
        error = "event log segment " + s.path.string() + " is damaged at offset " + std::to_string(good_end) + " of " +
                std::to_string(total) + " bytes, and " + std::to_string(later_transactions) +
                " later segment(s) hold complete transactions: cutting it would lose them. Restore the data "
                "directory from a copy, or move it away and start over with an empty one (clients then need a new "
                "snapshot)";
        return false;
      }
      if (::truncate(s.path.c_str(), static_cast<off_t>(good_end)) != 0) {
        error = "cannot truncate " + s.path.string() + ": " + std::strerror(errno);
        return false;
      }
      for (const auto& p : later) {
        std::error_code ec;
        fs::remove(p, ec);
        if (ec) {
          error = "cannot remove " + p.string() + ": " + ec.message();
          return false;
        }
      }
      s.base = segments_.empty() ? 0 : segments_.back().base + segments_.back().bytes;
      segments_.push_back(std::move(s));
      break;
    }
    s.base = segments_.empty() ? 0 : segments_.back().base + segments_.back().bytes;
    segments_.push_back(std::move(s));
  }
  next_seq_ = segments_.empty() ? 0 : segments_.back().end_seq;
  if (segments_.empty() && !roll_segment()) {
    error = error_;
    return false;
  }
  if (fd_ < 0) {
    fd_ = ::open(segments_.back().path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd_ < 0) {
      error = "cannot open " + segments_.back().path.string() + ": " + std::strerror(errno);
      return false;
    }
  }
  visible_seq_ = next_seq_;
  visible_offset_ = end_offset();
  for (auto it = segments_.rbegin(); it != segments_.rend(); ++it)
    if (it->end_seq > it->first_seq) {
      last_visible_id_ = it->last_id;
      break;
    }
  return true;
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

void event_log::enforce_retention() {
  while (segments_.size() > 1 && disk_bytes() > opts_.retention_bytes) {
    // The newest segment with events stays (its last id is where the log's head is known, after
    // a restart too), whatever the retention.
    bool later_events = false;
    for (std::size_t i = 1; i < segments_.size(); ++i) later_events = later_events || segments_[i].end_seq > segments_[i].first_seq;
    if (!later_events && segments_.front().end_seq > segments_.front().first_seq) break;
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
  txn_file_offset_ = segments_.back().bytes + pending_.size();
  txn_seg_first_id_ = segments_.back().first_id;
  txn_seg_last_id_ = segments_.back().last_id;
  return true;
}

void event_log::abort() {
  if (!open_) return;
  open_ = false;
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
  auto& seg = segments_.back();
  scratch_.clear();
  // Room for the values at once: a record of a huge value is not grown by doubling (which
  // would hold it about twice for a moment).
  std::size_t values = 0;
  for (const auto& col : c.before) values += col.value.size() + 5;
  for (const auto& col : c.after) values += col.value.size() + 5;
  if (values >= large_record) scratch_.reserve(values + 4096);
  protocol::writer(scratch_).u64(next_seq_);
  record_writer_.write(scratch_, c);
  std::size_t offset = seg.bytes + pending_.size();
  auto ev = std::make_shared<logged_event>();
  ev->seq = next_seq_;
  if (scratch_.size() < large_record) {
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
  ev->id = transform::event_id{c.txn->commit_lsn, c.index};
  ev->kind = c.kind;
  if (c.relation) {
    ev->schema = c.relation->nspname;
    ev->table = c.relation->relname;
  }
  ev->end_offset = end_offset();
  if (index_due(seg.index, next_seq_, offset)) seg.index.push_back({next_seq_, offset, ev->id});
  if (next_seq_ == seg.first_seq) seg.first_id = ev->id;   // the segment's first event
  seg.last_id = ev->id;
  ++next_seq_;
  tail_.push(ev);
  evict();
  // A large transaction goes to the file as it comes (without fsync: it is not durable until
  // its end frame is, and recovery cuts unterminated transactions).
  if (pending_.size() > (1u << 20)) write_pending();
  if (publish_) publish_(*ev, c);
}

void event_log::evict() {
  // Events not yet written to the file stay (until the next write or sync): a client behind the
  // tail reads the file, and must find them there.
  tail_.evict(segments_.back().base + segments_.back().bytes);
}

void event_log::account_encoding(const logged_event& e, std::size_t bytes) {
  if (tail_.account(e, bytes)) evict();
}

void event_log::commit(lsn commit_lsn, lsn end_lsn) {
  if (!open_) return;
  open_ = false;
  if (skipping_) {
    skipping_ = false;
    return;
  }
  std::string end;
  protocol::writer(end).u64(commit_lsn.value).u64(end_lsn.value);
  frame(pending_, 'C', end);
  auto& seg = segments_.back();
  seg.end_seq = next_seq_;
  last_commit_ = commit_lsn;
  pending_durable_ = end_lsn;
  // Visible to clients from here on, all of it at once.
  if (next_seq_ > txn_first_seq_) {
    last_visible_id_ = seg.last_id;
    recent_commits_.emplace_back(txn_first_seq_, end_offset());
    if (recent_commits_.size() > 4096) recent_commits_.pop_front();
  }
  visible_seq_ = next_seq_;
  visible_offset_ = end_offset();
  tail_.committed();
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
  if (job.target.valid()) durable_lsn_ = std::max(durable_lsn_, job.target);
  return true;
}

bool event_log::index_due(const std::vector<index_entry>& index, std::uint64_t seq, std::size_t offset) {
  return index.empty() || seq - index.back().seq >= index_every || offset - index.back().offset >= index_bytes;
}

std::vector<event_ptr> event_log::read(std::uint64_t seq, std::size_t max, std::size_t max_bytes,
                                       std::string* error) const {
  std::vector<event_ptr> out;
  // Only committed transactions are read: a transaction still arriving is not visible.
  if (seq >= visible_seq_) return out;
  max = static_cast<std::size_t>(std::min<std::uint64_t>(max, visible_seq_ - seq));
  out = tail_.read(seq, max);
  if (!out.empty()) return out;
  out = read_disk(seq, max, max_bytes, error);
  for (const auto& e : out) tail_.share(e);
  return out;
}

std::vector<event_ptr> event_log::read_disk(std::uint64_t seq, std::size_t max, std::size_t max_bytes,
                                            std::string* error) const {
  std::vector<event_ptr> out;
  auto fail = [&](const std::string& why) {
    if (error) *error = why;
  };
  for (const auto& s : segments_) {
    // Up to the last committed transaction (a transaction still arriving may be in the file
    // when it is large: not visible yet).
    std::uint64_t end = s.end_seq;
    if (seq < s.first_seq || seq >= end) continue;
    std::size_t offset = 0;
    auto at = std::upper_bound(s.index.begin(), s.index.end(), seq,
                               [](std::uint64_t v, const index_entry& e) { return v < e.seq; });
    if (at != s.index.begin()) offset = std::prev(at)->offset;
    const std::string name = s.path.filename().string();
    std::ifstream in(s.path, std::ios::binary);
    if (!in) {
      fail("event log " + name + " unreadable: " + std::strerror(errno));
      return out;
    }
    in.seekg(static_cast<std::streamoff>(offset));
    std::string frame_bytes;
    std::size_t read_bytes = 0;
    // Bounded in bytes too (at least one event): a reader far behind over huge rows does not
    // load hundreds of them at once.
    while (out.size() < max && (out.empty() || read_bytes < max_bytes)) {
      // What this process wrote ends at s.bytes (the rest of the open segment is still in
      // memory, in the tail): reading stops there, and stopping before it is a fault.
      if (offset >= s.bytes) break;
      frame_bytes.resize(5);
      if (!in.read(frame_bytes.data(), 5)) {
        fail("event log " + name + " ends at offset " + std::to_string(offset) + ", before its " + std::to_string(s.bytes) +
             " written bytes");
        break;
      }
      protocol::cursor h(frame_bytes);
      char type = static_cast<char>(h.u8());
      std::uint32_t len = h.u32();
      if (len > s.bytes - offset) {
        fail("event log " + name + " damaged at offset " + std::to_string(offset) + " (frame length)");
        break;
      }
      frame_bytes.resize(5 + std::size_t{len} + 4);
      if (!in.read(frame_bytes.data() + 5, static_cast<std::streamsize>(len) + 4)) {
        fail("event log " + name + " ends inside the frame at offset " + std::to_string(offset));
        break;
      }
      protocol::cursor sum_at(std::string_view(frame_bytes).substr(5 + len));
      if (sum_at.u32() != protocol::crc32c(std::string_view(frame_bytes).substr(0, 5 + len))) {
        fail("event log " + name + " damaged at offset " + std::to_string(offset) + " (checksum)");
        break;
      }
      offset += frame_overhead + len;
      if (type != 'E') continue;
      protocol::cursor p(std::string_view(frame_bytes).substr(5, len));
      std::uint64_t s_seq = p.u64();
      if (s_seq >= end) break;
      if (s_seq < seq) continue;
      std::shared_ptr<logged_event> ev;
      if (len >= large_record) {   // the frame's buffer becomes the record: no second copy
        frame_bytes.resize(5 + std::size_t{len});
        frame_bytes.erase(0, 5 + 8);
        ev = make_event(s_seq, std::move(frame_bytes));
        frame_bytes = std::string();
      } else {
        ev = make_event(s_seq, std::string(protocol::as_string_view(p.rest())));
      }
      read_bytes += len;
      ev->end_offset = s.base + offset;
      out.push_back(std::move(ev));
    }
    return out;
  }
  return out;
}

resume_point event_log::resume_after(const transform::event_id& id) const {
  resume_point r;
  const bool from_start = id == transform::event_id{};   // 0/0:0: the log's start
  // An id from before where this log began belongs to another log (a lost data directory, a
  // new slot): the changes between are not here. A log that holds nothing and knows no origin
  // has no event an id could name.
  if (!from_start && origin_.valid() && id.commit_lsn < origin_) return r;
  if (visible_seq_ == 0) {
    if (from_start || origin_.valid()) r.seq = 0;
    r.past_head = !from_start;
    return r;
  }
  if (!(id < last_visible_id_)) {   // at or past the newest event: resume at the head
    r.seq = visible_seq_;
    r.past_head = last_visible_id_ < id;
    return r;
  }
  // The memory tail (its committed part).
  const auto& tail = tail_.events();
  if (!tail.empty() && tail.front()->seq < visible_seq_ && !(id < tail.front()->id)) {
    auto end = tail.begin() + static_cast<std::ptrdiff_t>(std::min<std::uint64_t>(visible_seq_ - tail.front()->seq, tail.size()));
    auto it = std::upper_bound(tail.begin(), end, id, [](const transform::event_id& v, const event_ptr& e) { return v < e->id; });
    r.seq = it == end ? visible_seq_ : (*it)->seq;
    return r;
  }
  bool first_with_events = true;
  for (const auto& s : segments_) {
    if (s.end_seq == s.first_seq) continue;
    const bool first = first_with_events;
    first_with_events = false;
    if (!(id < s.last_id)) continue;   // in a later segment
    if (id < s.first_id) {
      if (!first) {   // between the previous segment's last event and this one's first
        r.seq = s.first_seq;
        return r;
      }
      // Before the oldest retained event: gone, unless nothing was ever dropped (the log still
      // starts at its first event), or id is the last event retention dropped.
      if (s.first_seq == 0 || (dropped_ && id == dropped_last_id_)) r.seq = s.first_seq;
      return r;
    }
    // The index entry at or before id: the event after it is within the next entry (at most
    // 256 events, 64 KiB of frames and the one frame across it): bounded work, whatever the
    // segment's size.
    std::uint64_t seq = s.first_seq;
    auto at = std::upper_bound(s.index.begin(), s.index.end(), id,
                               [](const transform::event_id& v, const index_entry& e) { return v < e.id; });
    if (at != s.index.begin()) seq = std::prev(at)->seq;
    while (seq < s.end_seq) {
      auto batch = read_disk(seq, index_every + 1, index_bytes, &r.error);
      for (const auto& e : batch)
        if (id < e->id) {
          r.seq = e->seq;
          r.error.clear();
          return r;
        }
      if (!r.error.empty()) return r;
      if (batch.empty()) {
        // Not in the file yet: the events from here on are in the memory tail.
        if (!tail.empty() && seq >= tail.front()->seq && seq < visible_seq_) {
          r.seq = seq;
          return r;
        }
        r.error = "event log " + s.path.filename().string() + " ends before its events";
        return r;
      }
      seq = batch.back()->seq + 1;
    }
  }
  return r;
}

}  // namespace walgate::proxy
