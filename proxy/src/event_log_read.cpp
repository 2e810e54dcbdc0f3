// Reading the event log: events from a position (memory first, then the file, a bounded amount
// at a time) and the position after an id (through the sparse index).
#include "event_log_file.hpp"

#include <algorithm>

namespace walgate::proxy {

namespace fs = std::filesystem;
using protocol::lsn;
using namespace log_file;

bool event_log::index_due(const std::vector<index_entry>& index, std::uint64_t seq, std::size_t offset, bool large) {
  return index.empty() || large || index.back().large || seq - index.back().seq >= index_every ||
         offset - index.back().offset >= index_bytes;
}

namespace {

/// Closed when the last holder lets go (the background job, or its closure never run).
struct file_descriptor {
  int fd;
  explicit file_descriptor(int f) : fd(f) {}
  ~file_descriptor() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

/// Reads and checks the large 'E' frame of len bytes at offset of fd (on any thread).
std::shared_ptr<logged_event> read_large_frame(int fd, std::size_t offset, std::uint32_t len, std::uint64_t base,
                                               const std::string& name, std::uint64_t expect_seq, std::string& error) {
  std::string bytes(5 + std::size_t{len} + 4, '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = "event log " + name + " ends inside the frame at offset " + std::to_string(offset) +
              (n < 0 ? std::string(": ") + std::strerror(errno) : std::string());
      return nullptr;
    }
    done += static_cast<std::size_t>(n);
  }
  protocol::cursor sum_at(std::string_view(bytes).substr(5 + len));
  if (sum_at.u32() != protocol::crc32c(std::string_view(bytes).substr(0, 5 + len))) {
    error = "event log " + name + " damaged at offset " + std::to_string(offset) + " (checksum)";
    return nullptr;
  }
  protocol::cursor p(std::string_view(bytes).substr(5, 8));
  if (p.u64() != expect_seq) {
    error = "event log " + name + " damaged at offset " + std::to_string(offset) + " (sequence)";
    return nullptr;
  }
  bytes.resize(5 + std::size_t{len});
  bytes.erase(0, 5 + 8);   // the frame's buffer becomes the record: no second copy
  auto ev = make_event(expect_seq, std::move(bytes));
  ev->end_offset = base + offset + frame_overhead + len;
  return ev;
}

}  // namespace

void event_log::prune_fetches() const {
  if (fetches_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(fetches_, [&](const auto& f) { return f.second->done && now - f.second->done_at > std::chrono::seconds(2); });
}

std::vector<event_ptr> event_log::read(std::uint64_t seq, std::size_t max, std::size_t max_bytes, std::string* error,
                                       bool* fetching) const {
  std::vector<event_ptr> out;
  // Only committed transactions are read: a transaction still arriving is not visible.
  if (seq >= visible_seq_) return out;
  max = static_cast<std::size_t>(std::min<std::uint64_t>(max, visible_seq_ - seq));
  out = tail_.read(seq, max);
  if (!out.empty()) return out;
  prune_fetches();
  if (auto it = fetches_.find(seq); it != fetches_.end()) {
    // A large record read in the background: every reader at it takes it from here (kept for a
    // moment after it is done: the readers it woke come one after another), then shares it
    // while held.
    auto f = it->second;
    if (!f->done) {
      if (fetching) *fetching = true;
      return out;
    }
    if (!f->event) {
      if (error) *error = f->error;
      return out;
    }
    tail_.share(f->event);
    out.push_back(f->event);
    return out;
  }
  out = read_disk(seq, max, max_bytes, error, background_ ? fetching : nullptr);
  for (const auto& e : out) tail_.share(e);
  return out;
}

std::vector<event_ptr> event_log::read_disk(std::uint64_t seq, std::size_t max, std::size_t max_bytes,
                                            std::string* error, bool* fetching) const {
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
      // A large record only as the first of a read: a batch of small ones does not load it too.
      if (type == 'E' && len >= large_record && !out.empty()) break;
      if (len > s.bytes - offset) {
        fail("event log " + name + " damaged at offset " + std::to_string(offset) + " (frame length)");
        break;
      }
      if (type == 'E' && len >= large_record && fetching) {
        // A record of megabytes goes to the background thread: its sequence number first.
        char seq_bytes[8];
        if (len < 8 || !in.read(seq_bytes, 8)) {
          fail("event log " + name + " ends inside the frame at offset " + std::to_string(offset));
          break;
        }
        // The index puts an entry at every large frame and the one after it, so the first
        // frame read at or after seq's entry is seq's: anything else is damage (its checksum is
        // checked on the background thread; this number is not checked yet).
        protocol::cursor q(std::string_view(seq_bytes, 8));
        const std::uint64_t s_seq = q.u64();
        if (s_seq != seq) {
          fail("event log " + name + " damaged at offset " + std::to_string(offset) + " (sequence)");
          break;
        }
        // The file stays readable while its descriptor is open, whatever retention does.
        auto fd = std::make_shared<file_descriptor>(::open(s.path.c_str(), O_RDONLY | O_CLOEXEC));
        if (fd->fd < 0) {
          fail("event log " + name + " unreadable: " + std::strerror(errno));
          return out;
        }
        auto f = std::make_shared<fetch>();
        try {
          background_(
              [f, fd, offset, len, base = s.base, name, s_seq] {
                try {
                  f->event = read_large_frame(fd->fd, offset, len, base, name, s_seq, f->error);
                } catch (const std::exception& e) {   // (a record of up to 1 GB: memory may run out)
                  f->event = nullptr;
                  f->error = "event log " + name + ": cannot read the record at offset " + std::to_string(offset) +
                             ": " + e.what();
                }
                fd->close();
              },
              [this, f, alive = alive_] {
                if (!*alive) return;
                f->done = true;
                f->done_at = std::chrono::steady_clock::now();
                announce();
              });
        } catch (const std::exception& e) {
          fail("event log " + name + ": cannot start reading the record at offset " + std::to_string(offset) + ": " +
               e.what());
          return out;
        }
        fetches_[s_seq] = f;
        ++background_reads_;
        *fetching = true;
        return out;
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
    // The entry after it names an event past id: the answer is at most that one, and when it
    // directly follows (as after a large frame), it is that one, with nothing read.
    const std::uint64_t stop = at == s.index.end() ? s.end_seq : at->seq;
    if (at != s.index.end() && at != s.index.begin() && at->seq == seq + 1) {
      r.seq = at->seq;
      return r;
    }
    while (seq < stop) {
      auto batch = read_disk(seq, static_cast<std::size_t>(std::min<std::uint64_t>(stop - seq, index_every + 1)),
                             index_bytes, &r.error);
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
    if (at != s.index.end()) {   // every event before the next entry is at or before id
      r.seq = at->seq;
      return r;
    }
  }
  return r;
}

}  // namespace walgate::proxy
