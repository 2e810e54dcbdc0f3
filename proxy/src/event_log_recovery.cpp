// Opening the event log: the layout marker, recovery of what the last run made durable (torn
// tails cut, every kept segment and the directory synced), the tail read back.
#include "event_log_file.hpp"

#include <algorithm>

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
      const bool large = len >= large_record;
      if (index_due(index, seq, offset, large)) index.push_back({seq, offset, ev->id, large});
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
  durable_seq_ = pending_durable_seq_ = next_seq_;   // (what was recovered is durable)
  visible_offset_ = end_offset();
  for (auto it = segments_.rbegin(); it != segments_.rend(); ++it)
    if (it->end_seq > it->first_seq) {
      last_visible_id_ = it->last_id;
      break;
    }
  return true;
}

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

bool event_log::store_acked(const std::filesystem::path& dir, lsn l, bool fsync, std::string& error) {
  return write_position_file(dir, "ACKED", l, fsync, error);
}

}  // namespace walgate::proxy
