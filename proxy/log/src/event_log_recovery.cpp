// Opening the event log: the layout marker, recovery of what the last run made durable (torn
// tails cut, every kept segment and the directory synced), the tail read back.
// The opening third of the event log (event_log.cpp appends, event_log_read.cpp reads). Over 500
// lines because recovery is one decision per damaged segment, made in recover() with the reasons
// written beside each test: a torn tail (cut, its bytes kept in damaged/) or damage inside
// acknowledged history (refused, nothing changed). Seams if it grows: segment_file, frame_at,
// valid_frame_after and keep_cut_bytes (about 180 lines, no event_log state) could be a file of
// their own; recover()'s damaged-segment branch (about 105 lines) could be a function that
// decides cut or refuse for one segment.
#include "event_log_file.hpp"

#include <algorithm>

#include <sys/stat.h>

namespace walgate::proxy {

namespace fs = std::filesystem;
using protocol::lsn;
using namespace log_file;

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
  // Read before recovery: what was acknowledged bounds what recovery may cut.
  log->acked_lsn_ = read_position_file(o.dir / "ACKED");
  log->origin_ = read_position_file(o.dir / "ORIGIN");
  log->cuts_ = read_history_cuts(o.dir);
  if (!log->recover(error)) return nullptr;
  // What recovery keeps may be only in the page cache (a kill -9 between a write and its
  // fdatasync): it is made durable before anything is acknowledged from it, as PostgreSQL
  // syncs its data directory after a crash.
  if (o.fsync && !log->sync_recovered(error)) return nullptr;
  log->prefill_tail();
  return log;
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

namespace {

// Recovery reads segments through this window: at most `block` bytes of the file in memory at a
// time, whatever the segment's size or its largest record (a transaction of a gigabyte, a value
// of 500 MiB). Every byte is untrusted (a bad sector, a stray write): nothing read is trusted
// before its frame's CRC checked out, and lengths are checked against the file's size before
// anything is read or allocated for them.
class segment_file {
 public:
  static constexpr std::size_t block = 1u << 20;
  explicit segment_file(const fs::path& p) : fd_(::open(p.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) {
      error_no = errno;
      return;
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0) error_no = errno;
    else size_ = static_cast<std::uint64_t>(st.st_size);
  }
  ~segment_file() {
    if (fd_ >= 0) ::close(fd_);
  }
  segment_file(const segment_file&) = delete;
  segment_file& operator=(const segment_file&) = delete;
  bool ok() const { return fd_ >= 0 && error_no == 0; }
  std::uint64_t size() const { return size_; }
  /// Bytes [at, at + n) with n <= block; empty when the file ends before (or a read failed:
  /// error_no). Valid until the next call.
  std::string_view view(std::uint64_t at, std::size_t n) {
    if (n == 0 || n > block || at > size_ || n > size_ - at) return {};
    if (at >= buf_at_ && at - buf_at_ + n <= buf_.size()) return std::string_view(buf_).substr(at - buf_at_, n);
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(block, size_ - at));
    buf_.resize(want);
    std::size_t done = 0;
    while (done < want) {
      const ssize_t r = ::pread(fd_, buf_.data() + done, want - done, static_cast<off_t>(at + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) error_no = errno;
      if (r <= 0) break;
      done += static_cast<std::size_t>(r);
    }
    buf_.resize(done);
    buf_at_ = at;
    return done < n ? std::string_view() : std::string_view(buf_).substr(0, n);
  }
  int error_no = 0;

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::string buf_;
  std::uint64_t buf_at_ = 0;
};

std::uint32_t be32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return std::uint32_t{u[0]} << 24 | std::uint32_t{u[1]} << 16 | std::uint32_t{u[2]} << 8 | u[3];
}
std::uint64_t be64(const char* p) { return std::uint64_t{be32(p)} << 32 | be32(p + 4); }

struct frame_info {
  char type = 0;
  std::uint32_t len = 0;
  std::uint64_t seq = 0;           // 'E'
  transform::event_id id;          // 'E': from the record's fixed header
  lsn commit, end;                 // 'C'
};

/// The whole, valid frame at `at` (its CRC computed as its payload streams past), or nullopt.
/// With expect_seq, an 'E' frame must carry that seq.
std::optional<frame_info> frame_at(segment_file& f, std::uint64_t at, std::optional<std::uint64_t> expect_seq) {
  auto h = f.view(at, 5);
  if (h.empty()) return std::nullopt;
  char head[5];
  std::memcpy(head, h.data(), 5);
  frame_info fi;
  fi.type = head[0];
  fi.len = be32(head + 1);
  if (fi.type != 'E' && fi.type != 'C') return std::nullopt;
  if ((fi.type == 'C' && fi.len != 16) || (fi.type == 'E' && fi.len < 8)) return std::nullopt;
  if (f.size() - at < frame_overhead || f.size() - at - frame_overhead < fi.len) return std::nullopt;   // past the end
  // The payload's first bytes: an event's seq and its record's fixed header (Byte1 version |
  // Byte1 op | Int64 commit_lsn | ... | Int32 index at 46), a commit's two positions.
  auto p = f.view(at + 5, std::min<std::size_t>(fi.len, 50));
  if (p.empty()) return std::nullopt;
  if (fi.type == 'E') {
    fi.seq = be64(p.data());
    if (expect_seq && fi.seq != *expect_seq) return std::nullopt;
    if (p.size() >= 50) fi.id = transform::event_id{lsn{be64(p.data() + 10)}, be32(p.data() + 46)};
  } else {
    fi.commit = lsn{be64(p.data())};
    fi.end = lsn{be64(p.data() + 8)};
  }
  std::uint32_t crc = protocol::crc32c(std::string_view(head, 5));
  for (std::uint64_t done = 0; done < fi.len;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(segment_file::block, fi.len - done));
    auto chunk = f.view(at + 5 + done, n);
    if (chunk.empty()) return std::nullopt;
    crc = protocol::crc32c(chunk, crc);
    done += n;
  }
  auto t = f.view(at + 5 + fi.len, 4);
  if (t.empty() || be32(t.data()) != crc) return std::nullopt;
  return fi;
}

/// The offset of the first whole, valid frame at or after `from` (any seq), or nullopt. Used
/// after damage: a torn tail (the last write cut short by a crash) has none after it, damage in
/// the middle of acknowledged history does. Linear in the bytes scanned: a candidate needs a
/// frame type, a length that fits, and (an event) a plausible seq or (a commit) the exact
/// length before its CRC is computed.
std::optional<std::uint64_t> valid_frame_after(segment_file& f, std::uint64_t from, std::uint64_t seq_floor) {
  const std::uint64_t size = f.size();
  for (std::uint64_t at = from; at + frame_overhead <= size; ++at) {
    auto b = f.view(at, 1);
    if (b.empty()) return std::nullopt;
    if (b[0] != 'E' && b[0] != 'C') continue;
    auto h = f.view(at, std::min<std::uint64_t>(13, size - at));
    if (h.size() < 5) continue;
    const std::uint32_t len = be32(h.data() + 1);
    if (b[0] == 'C' ? len != 16 : len < 8) continue;
    if (size - at - frame_overhead < len) continue;
    if (b[0] == 'E') {
      if (h.size() < 13) continue;
      // Each event takes at least frame_overhead + 8 bytes: its seq cannot be further from
      // where the scan stopped than the bytes left allow.
      const std::uint64_t seq = be64(h.data() + 5);
      if (seq < seq_floor || seq - seq_floor > size / (frame_overhead + 8) + 1) continue;
    }
    if (frame_at(f, at, std::nullopt)) return at;
  }
  return std::nullopt;
}

/// Copies [from, size) of path into <dir>/damaged/<name>.<from>.cut (synced) before it is cut:
/// what recovery cuts is moved aside, never deleted.
bool keep_cut_bytes(const fs::path& dir, const fs::path& path, std::uint64_t from, std::uint64_t size, bool fsync,
                    std::string& error) {
  const fs::path aside_dir = dir / "damaged";
  std::error_code ec;
  fs::create_directories(aside_dir, ec);
  if (ec) {
    error = "cannot create " + aside_dir.string() + ": " + ec.message();
    return false;
  }
  // A name of its own (O_EXCL): a segment torn at the same place twice keeps both copies.
  fs::path aside = aside_dir / (path.filename().string() + "." + std::to_string(from) + ".cut");
  int out = ::open(aside.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
  for (int n = 2; out < 0 && errno == EEXIST && n < 1000; ++n) {
    aside = aside_dir / (path.filename().string() + "." + std::to_string(from) + ".cut." + std::to_string(n));
    out = ::open(aside.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
  }
  const int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  bool ok = in >= 0 && out >= 0;
  std::string buf(segment_file::block, '\0');
  for (std::uint64_t at = from; ok && at < size;) {
    const ssize_t r = ::pread(in, buf.data(), static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), size - at)),
                              static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ok = false;
      break;
    }
    for (std::size_t done = 0; ok && done < static_cast<std::size_t>(r);) {
      const ssize_t w = ::write(out, buf.data() + done, static_cast<std::size_t>(r) - done);
      if (w < 0 && errno == EINTR) continue;
      ok = w > 0;
      if (ok) done += static_cast<std::size_t>(w);
    }
    at += static_cast<std::uint64_t>(r);
  }
  if (ok && fsync) ok = durable_sync(out, false) == 0 && sync_dir(aside_dir) && sync_dir(dir);
  const int saved = errno;
  if (in >= 0) ::close(in);
  if (out >= 0) ::close(out);
  if (!ok) error = "cannot move the damaged bytes of " + path.string() + " aside to " + aside.string() + ": " + std::strerror(saved);
  return ok;
}

}  // namespace

bool event_log::scan_segment(segment& s, std::string& error, scan_result& r) {
  segment_file f(s.path);
  if (!f.ok()) {
    error = "cannot read " + s.path.string() + ": " + std::strerror(f.error_no);
    return false;
  }
  r = scan_result{};
  r.total = static_cast<std::size_t>(f.size());
  std::uint64_t seq_at_good = s.first_seq;
  std::uint64_t seq = s.first_seq;
  std::vector<index_entry> index;
  transform::event_id first, last, last_good;
  bool have_first = false;
  lsn commit_at_good = last_commit_, durable_at_good = durable_lsn_;
  std::uint64_t at = 0;
  while (at < f.size()) {
    auto fi = frame_at(f, at, seq);
    if (!fi) break;
    const std::uint64_t next = at + frame_overhead + fi->len;
    if (fi->type == 'E') {
      const bool large = fi->len >= large_record;
      if (index_due(index, seq, at, large)) index.push_back({seq, at, fi->id, large});
      if (!have_first) {
        first = fi->id;
        have_first = true;
      }
      last = fi->id;
      ++seq;
    } else {
      commit_at_good = fi->commit;
      durable_at_good = fi->end;
      r.good_end = next;
      seq_at_good = seq;
      last_good = last;
    }
    at = next;
  }
  if (f.error_no) {
    error = "cannot read " + s.path.string() + ": " + std::strerror(f.error_no);
    return false;
  }
  r.stop = at;
  last_commit_ = commit_at_good;
  durable_lsn_ = durable_at_good;
  s.end_seq = seq_at_good;
  s.bytes = r.good_end;
  s.first_id = seq_at_good > s.first_seq ? first : transform::event_id{};
  s.last_id = last_good;
  std::erase_if(index, [&](const index_entry& e) { return e.seq >= seq_at_good; });
  s.index = std::move(index);
  return true;
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
    for (auto& ev : batch) {
      // (the transactions read back, for snapshots: first_recent_transaction)
      if (tail_.events().empty() || tail_.events().back()->id.commit_lsn != ev->id.commit_lsn) remember_xid(ev->xid, ev->seq);
      tail_.push(ev, false);
    }
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
    scan_result r;
    if (!scan_segment(s, error, r)) return false;
    if (r.good_end != r.total) {
      // Assumption written down (it once cut 300,005 acknowledged events): only a torn tail — the
      // last write cut short by a crash, nothing whole and valid after it — may be cut. Its bytes
      // hold no commit (every commit before the damage is kept), so nothing cut was ever
      // acknowledged. Damage followed by a valid frame, here or in a later segment, is damage
      // inside history (a bad sector, a stray write): refused, with nothing changed — unless the
      // slot's position shows none of it was acknowledged (below).
      std::optional<std::uint64_t> valid_after;
      lsn cut_commit;   // the commit LSN of the transaction cut off, from its whole events
      {
        segment_file f(s.path);
        if (!f.ok()) {
          error = "cannot read " + s.path.string() + ": " + std::strerror(f.error_no);
          return false;
        }
        valid_after = valid_frame_after(f, r.stop + 1, s.end_seq);
        if (r.stop > r.good_end)
          if (auto fi = frame_at(f, r.good_end, s.end_seq); fi && fi->type == 'E') cut_commit = fi->id.commit_lsn;
      }
      // ACKED is stored only while everything logged is synced: a transaction that commits
      // before it was on disk whole then, and is no torn write.
      // And the slot's confirmed position, read before the log was opened (serve): a transaction
      // committed before it was acknowledged, so it was synced whole.
      // (Not while the initial snapshot is pending: the slot then is where it was made, its
      // consistent point, one byte past the snapshot's commit — acknowledged nothing; a cut-off
      // snapshot is taken again.)
      bool snapshot_pending = false;
      {
        std::ifstream in(opts_.dir / "SNAPSHOT");
        std::string word;
        snapshot_pending = (in >> word) && word != "done";
      }
      const lsn slot = snapshot_pending ? lsn{} : opts_.acknowledged;
      const bool by_slot = slot > acked_lsn_;
      const lsn acked = by_slot ? slot : acked_lsn_;
      if (cut_commit.valid() && acked.valid() && cut_commit < acked) {
        error = "event log segment " + s.path.string() + " is damaged at offset " + std::to_string(r.stop) +
                ", inside a transaction committed at " + cut_commit.to_string() + ", before the position walgate "
                "acknowledged (" + acked.to_string() + (by_slot ? ", the slot's confirmed_flush_lsn" : ", ACKED") +
                "): it was on disk whole, so this is damage, not a torn write. Nothing was changed. Restore the data "
                "directory from a copy, or move it away and start over with an empty one (clients then need a new "
                "snapshot)";
        return false;
      }
      std::vector<fs::path> later;
      std::string later_valid;
      for (std::size_t j = i + 1; j < files.size(); ++j) {
        segment_file f(files[j].second);
        if (!f.ok()) {
          error = "cannot read " + files[j].second.string() + ": " + std::strerror(f.error_no);
          return false;
        }
        if (later_valid.empty())
          if (auto v = valid_frame_after(f, 0, files[j].first))   // (its events' seqs start at its name's)
            later_valid = files[j].second.filename().string() + " at offset " + std::to_string(*v);
        later.push_back(files[j].second);
      }
      // Damage with whole frames after it, but all of it past what was acknowledged: the writes
      // of a power cut that reached the disk out of order (a page of the last, unsynced writes
      // missing, later ones there). Nothing from the damage on was acknowledged — the last whole
      // transaction before it ends at or past the slot's confirmed position (and ACKED), and
      // every later one commits after it — so the server sends all of it again: cut, like a
      // torn tail. Only with the slot's position known (ACKED alone may be behind it).
      const bool unacknowledged_after = slot.valid() && durable_lsn_.valid() && durable_lsn_ >= acked;
      if ((valid_after || !later_valid.empty()) && !unacknowledged_after) {
        error = "event log segment " + s.path.string() + " is damaged at offset " + std::to_string(r.stop) + " of " +
                std::to_string(r.total) + " bytes, and whole, valid frames follow (" +
                (valid_after ? "in it at offset " + std::to_string(*valid_after) : "in " + later_valid) +
                "): this is damage inside the history walgate acknowledged, not a torn last write, and cutting it "
                "would lose what follows. Nothing was changed. " +
                (slot.valid() ? std::string()
                              : "The slot's confirmed position could not be read now (PostgreSQL not answering, or "
                                "the initial snapshot pending): when it shows nothing from the damage on was "
                                "acknowledged, a start then cuts it. ") +
                "Restore the data directory from a copy, or move it away and start over with an empty one "
                "(clients then need a new snapshot)";
        return false;
      }
      // A torn tail: moved aside (damaged/ in the data directory), then cut; segments after it
      // (made but holding no whole frame) moved aside whole.
      if (!keep_cut_bytes(opts_.dir, s.path, r.good_end, r.total, opts_.fsync, error)) return false;
      if (::truncate(s.path.c_str(), static_cast<off_t>(r.good_end)) != 0) {
        error = "cannot truncate " + s.path.string() + ": " + std::strerror(errno);
        return false;
      }
      for (const auto& p : later) {
        std::error_code ec;
        fs::path to = opts_.dir / "damaged" / (p.filename().string() + ".cut");
        for (int n = 2; fs::exists(to) && n < 1000; ++n)   // (never over an earlier one)
          to = opts_.dir / "damaged" / (p.filename().string() + ".cut." + std::to_string(n));
        fs::rename(p, to, ec);
        if (ec) {
          error = "cannot move " + p.string() + " aside: " + ec.message();
          return false;
        }
      }
      if (valid_after || !later_valid.empty())
        std::fprintf(stderr, "walgate: recovery: %s is damaged at offset %zu and whole frames follow, but none of it "
                             "was acknowledged (the last whole transaction before it ends at %s, the slot's "
                             "confirmed_flush_lsn is %s: unsynced writes lost in a power cut): cut at offset %zu, %zu "
                             "bytes and %zu later segment(s) kept in %s; the server sends it all again\n",
                     s.path.string().c_str(), r.stop, durable_lsn_.to_string().c_str(), slot.to_string().c_str(),
                     r.good_end, r.total - r.good_end, later.size(), (opts_.dir / "damaged").string().c_str());
      else
        std::fprintf(stderr, "walgate: recovery: %s ended in a torn write (%zu bytes after its last whole transaction, "
                             "no whole frame after them): cut at offset %zu, the bytes kept in %s\n",
                     s.path.string().c_str(), r.total - r.good_end, r.good_end, (opts_.dir / "damaged").string().c_str());
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
  durable_seq_ = pending_durable_seq_ = next_seq_;   // (what was recovered is durable)
  visible_offset_ = end_offset();
  for (auto it = segments_.rbegin(); it != segments_.rend(); ++it)
    if (it->end_seq > it->first_seq) {
      last_visible_id_ = it->last_id;
      break;
    }
  return true;
}

namespace log_file {
bool append_cut(const fs::path& dir, const history_cut& c, bool fsync, std::string& error);   // (history.cpp)
}

bool event_log::cut_history(const fs::path& dir, bool fsync, std::string& said, std::string& error) {
  // Assumptions (history.hpp): commits are logged in LSN order, so everything from the first
  // commit frame at or past the switch point on is of the timeline the server left, and
  // everything before it is shared with the new one. A frame that does not check out ends a
  // segment's scan (recovery, which runs next, decides what damage is).
  auto request = read_cut_request(dir);
  if (!request) return true;
  history_cut cut = *request;
  const lsn origin = read_position_file(dir / "ORIGIN");
  if (origin.valid() && origin >= cut.at) {
    error = "the event log began at " + origin.to_string() + ", past " + cut.at.to_string() +
            " where PostgreSQL left timeline " + std::to_string(cut.from_timeline) + " for timeline " +
            std::to_string(cut.to_timeline) + ": everything in it, its initial snapshot too, is of the timeline "
            "the server left. Move the data directory away, drop the slot on the new primary, and start over "
            "(clients then need a new snapshot)";
    return false;
  }
  std::vector<std::pair<std::uint64_t, fs::path>> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (auto first = segment_first_seq(e.path().filename().string())) files.emplace_back(*first, e.path());
  std::sort(files.begin(), files.end());
  std::optional<std::size_t> cut_file;   // the segment the cut begins in, and where
  std::optional<std::uint64_t> first_file_seq;
  lsn first_commit;   // the log's first transaction (the initial snapshot, when one was taken)
  std::uint64_t cut_offset = 0, cut_size = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    segment_file f(files[i].second);
    if (!f.ok()) {
      error = "cannot read " + files[i].second.string() + ": " + std::strerror(f.error_no);
      return false;
    }
    std::uint64_t seq = files[i].first, at = 0, kept_end = 0;
    if (i == 0) first_file_seq = files[i].first;
    while (at < f.size()) {
      auto fi = frame_at(f, at, seq);
      if (!fi) break;
      lsn commit = fi->type == 'E' ? fi->id.commit_lsn : fi->commit;
      if (fi->type == 'E') ++seq;
      if (fi->type == 'C' && !first_commit.valid()) first_commit = commit;
      if (commit >= cut.at) {
        if (!cut_file) {
          cut_file = i;
          cut_offset = kept_end;
          cut_size = f.size();
        }
        if (!cut.last.valid() || commit > cut.last) cut.last = commit;
      } else if (fi->type == 'C') {
        kept_end = at + frame_overhead + fi->len;
      }
      at += frame_overhead + fi->len;
    }
    if (f.error_no) {
      error = "cannot read " + files[i].second.string() + ": " + std::strerror(f.error_no);
      return false;
    }
  }
  bool snapshot_done = false;
  {
    std::ifstream in(dir / "SNAPSHOT");
    std::string word;
    snapshot_done = (in >> word) && word == "done";
  }
  if (cut_file && snapshot_done && first_file_seq == 0 && first_commit.valid() && first_commit >= cut.at) {
    error = "the event log's first transaction (its initial snapshot, at " + first_commit.to_string() + ") is past " +
            cut.at.to_string() + " where PostgreSQL left timeline " + std::to_string(cut.from_timeline) +
            " for timeline " + std::to_string(cut.to_timeline) + ": the snapshot is of the timeline the server "
            "left. Move the data directory away, drop the slot on the new primary, and start over (clients then "
            "need a new snapshot)";
    return false;
  }
  if (cut_file) {
    // The order makes a crash anywhere in between leave a state the same cut finishes: CUTS
    // first (it may say the cut twice: read once); the later segments moved aside last one
    // first (a rescan finds the segments left still following each other), the directories
    // synced; then the segment the cut begins in copied aside and truncated.
    if (!append_cut(dir, cut, fsync, error)) return false;
    fs::create_directories(dir / "damaged", ec);
    if (ec) {
      error = "cannot create " + (dir / "damaged").string() + ": " + ec.message();
      return false;
    }
    for (std::size_t j = files.size(); j-- > *cut_file + 1;) {
      fs::path to = dir / "damaged" / (files[j].second.filename().string() + ".cut");
      for (int n = 2; fs::exists(to) && n < 1000; ++n) to = dir / "damaged" / (files[j].second.filename().string() + ".cut." + std::to_string(n));
      fs::rename(files[j].second, to, ec);
      if (ec) {
        error = "cannot move " + files[j].second.string() + " aside: " + ec.message();
        return false;
      }
    }
    if (fsync && (!sync_dir(dir / "damaged") || !sync_dir(dir))) {
      error = "cannot sync " + dir.string() + ": " + std::strerror(errno);
      return false;
    }
    const fs::path& path = files[*cut_file].second;
    if (!keep_cut_bytes(dir, path, cut_offset, cut_size, fsync, error)) return false;
    if (::truncate(path.c_str(), static_cast<off_t>(cut_offset)) != 0) {
      error = "cannot truncate " + path.string() + ": " + std::strerror(errno);
      return false;
    }
    if (fsync) {
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      const bool ok = fd >= 0 && durable_sync(fd, false) == 0;
      if (fd >= 0) ::close(fd);
      if (!ok) {
        error = "cannot sync " + path.string() + ": " + std::strerror(errno);
        return false;
      }
    }
  }
  // What was acknowledged past the switch point was acknowledged of the timeline the server
  // left: the stream goes on from the switch point (the new timeline's WAL begins there).
  if (const lsn acked = read_position_file(dir / "ACKED"); acked.valid() && acked > cut.at)
    if (!write_position_file(dir, "ACKED", cut.at, fsync, error)) return false;
  if (::unlink((dir / "CUT").c_str()) != 0 || (fsync && !sync_dir(dir))) {
    error = "cannot remove " + (dir / "CUT").string() + ": " + std::strerror(errno);
    return false;
  }
  said = cut_file ? "history cut at " + cut.at.to_string() + ": the transactions committed from there to " +
                        cut.last.to_string() + " were logged from timeline " + std::to_string(cut.from_timeline) +
                        ", which PostgreSQL left at " + cut.at.to_string() + " for timeline " +
                        std::to_string(cut.to_timeline) + " (a failover to a server that never had them); their bytes "
                        "are kept in " + (dir / "damaged").string() + ", and a resume from one of their ids is answered 410"
                  : "history cut at " + cut.at.to_string() + ": nothing was logged past it (timeline " +
                        std::to_string(cut.from_timeline) + " → " + std::to_string(cut.to_timeline) +
                        "); the stream goes on from there";
  return true;
}

bool event_log::record_history_cut(const history_cut& c) {
  for (const auto& o : cuts_)
    if (o.at == c.at && o.last == c.last) return true;
  std::string error;
  if (!append_cut(opts_.dir, c, opts_.fsync, error)) {
    error_ = error;
    return false;
  }
  cuts_.push_back(c);
  return true;
}

bool event_log::set_origin(lsn l) {
  // An empty log begins where its stream does, also after it had events (they were lost, or the
  // segments removed by hand: sequence numbers restart at 0, and an id from before must not pass
  // for one of this log's first events): moved up, never down.
  if (next_seq_ != 0 || !l.valid() || (origin_.valid() && l <= origin_)) return true;
  std::string error;
  if (!write_position_file(opts_.dir, "ORIGIN", l, opts_.fsync, error)) {
    error_ = error;
    return false;
  }
  origin_ = l;
  return true;
}

bool event_log::store_acked(const std::filesystem::path& dir, lsn l, bool fsync, std::string& error) {
  return write_position_file(dir, "ACKED", l, fsync, error);
}

}  // namespace walgate::proxy
