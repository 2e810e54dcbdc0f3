// Reading the event log: events from a position (memory first, then the file, a bounded amount
// at a time) and the position after an id (through the sparse index).
// The reading third of the event log (event_log.cpp appends, event_log_recovery.cpp opens), just
// over 500 lines. Two parts could stand apart: the background reader (block_args, read_block,
// read_blocks, start_block, prune_blocks: about 290 lines; blocks read off the loop and kept a
// while for the readers that follow) could be a file of its own; read_disk and resume_after, the
// synchronous path, would stay. read_block and read_disk each check the frame format on their own
// (length, CRC, sequence): one shared frame check would shorten both.
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

/// A transaction's end frame ('C': Int64 commit_lsn | Int64 end_lsn) read right after `last`,
/// the last event read: that event is its transaction's last, and learns where its commit ends.
void set_transaction_end(const std::shared_ptr<logged_event>& last, std::string_view body) {
  if (!last || body.size() != 16) return;
  protocol::cursor c(body);
  const protocol::lsn commit{c.u64()}, end{c.u64()};
  if (last->id.commit_lsn == commit) last->txn_end = end;
}

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

constexpr std::size_t block_record_bytes = 512u << 10;   // a block's records, about
constexpr std::size_t block_events = 4096;
constexpr std::size_t blocks_budget = 16u << 20;         // what the kept blocks hold
constexpr auto block_keep = std::chrono::milliseconds(500);   // after its last use
constexpr auto block_unread_keep = std::chrono::seconds(5);  // done, not read from yet

/// Reads into b the events from seq on of a segment (fd), from the frame at offset, up to
/// byte_limit (what is written and committed) and seq_limit: up to a block's worth, or one large
/// record when it is the first. On any thread; a fault ends the events with b.error set.
struct block_args {
  std::shared_ptr<event_log::block> b;
  std::shared_ptr<file_descriptor> fd;   // the segment's, open while it is read
  std::size_t offset = 0, byte_limit = 0;
  std::uint64_t seq = 0, seq_limit = 0, base = 0;
  std::string name;
  log_reader::prepare_fn prepare;
};

void read_block(const block_args& a) {
  auto& b = *a.b;
  std::vector<std::shared_ptr<logged_event>> events;
  std::string buf;            // file bytes from buf_at
  std::size_t buf_at = a.offset;
  std::size_t record_bytes = 0;
  auto fail = [&](const std::string& why) { b.error = why; };
  const std::string& name = a.name;
  // Makes [at, at + n) of the file available in buf (reading ahead in large sequential reads).
  auto have = [&](std::size_t at, std::size_t n) -> bool {
    if (at >= buf_at && at + n <= buf_at + buf.size()) return true;
    if (at > buf_at) {   // keep what is from at on
      buf.erase(0, std::min(buf.size(), at - buf_at));
      buf_at = at;
    }
    const std::size_t want = std::max<std::size_t>(n, 1u << 20);
    const std::size_t upto = std::min(a.byte_limit, at + want);
    while (buf_at + buf.size() < upto) {
      const std::size_t from = buf_at + buf.size();
      const std::size_t old = buf.size();
      buf.resize(old + (upto - from));
      ssize_t r = ::pread(a.fd->fd, buf.data() + old, upto - from, static_cast<off_t>(from));
      if (r < 0 && errno == EINTR) {
        buf.resize(old);
        continue;
      }
      if (r <= 0) {
        buf.resize(old);
        return false;
      }
      buf.resize(old + static_cast<std::size_t>(r));
    }
    return at + n <= buf_at + buf.size();
  };
  std::size_t offset = a.offset;
  try {
    // (Past the limits, one more frame is read if it is the end frame of the last event's
    // transaction: that event then knows where its commit record ends.)
    std::shared_ptr<logged_event> last;
    bool large_read = false;
    for (;;) {
      const bool full = large_read || events.size() >= block_events || record_bytes >= block_record_bytes;
      if (full && !last) break;
      if (offset >= a.byte_limit) break;
      if (offset + 5 > a.byte_limit || !have(offset, 5)) {
        fail("event log " + name + " ends at offset " + std::to_string(offset) + ", before its " +
             std::to_string(a.byte_limit) + " written bytes");
        break;
      }
      protocol::cursor h(std::string_view(buf).substr(offset - buf_at, 5));
      const char type = static_cast<char>(h.u8());
      const std::uint32_t len = h.u32();
      if (len > a.byte_limit - offset || a.byte_limit - offset - len < 5 + 4) {
        fail("event log " + name + " damaged at offset " + std::to_string(offset) + " (frame length)");
        break;
      }
      if (type == 'E' && len >= large_record) {
        // Its sequence number first: one before seq is passed over unread; one after a block's
        // first event ends the block (a large record is read alone).
        if (len < 8 || !have(offset + 5, 8)) {
          fail("event log " + name + " ends inside the frame at offset " + std::to_string(offset));
          break;
        }
        protocol::cursor q(std::string_view(buf).substr(offset + 5 - buf_at, 8));
        const std::uint64_t s_seq = q.u64();
        if (s_seq >= a.seq_limit) break;
        if (s_seq < a.seq) {
          offset += frame_overhead + len;
          continue;
        }
        if (!events.empty()) break;
        if (s_seq != a.seq) {
          fail("event log " + name + " damaged at offset " + std::to_string(offset) + " (sequence)");
          break;
        }
        buf = std::string();
        std::string error;
        auto ev = read_large_frame(a.fd->fd, offset, len, a.base, name, s_seq, error);
        if (!ev) {
          fail(error);
          break;
        }
        // (read alone: the block ends here, but for its transaction's end frame if that follows)
        last = ev;
        events.push_back(std::move(ev));
        large_read = true;
        offset += frame_overhead + len;
        buf_at = offset;
        continue;
      }
      if (!have(offset, frame_overhead + len)) {
        fail("event log " + name + " ends inside the frame at offset " + std::to_string(offset));
        break;
      }
      if (full && type != 'C') break;
      const std::string_view frame = std::string_view(buf).substr(offset - buf_at, frame_overhead + len);
      protocol::cursor sum_at(frame.substr(5 + len));
      if (sum_at.u32() != protocol::crc32c(frame.substr(0, 5 + len))) {
        fail("event log " + name + " damaged at offset " + std::to_string(offset) + " (checksum)");
        break;
      }
      offset += frame_overhead + len;
      if (type == 'C') {
        set_transaction_end(last, frame.substr(5, len));
        if (full) break;
      }
      last.reset();
      if (type != 'E') continue;
      protocol::cursor p(frame.substr(5, len));
      const std::uint64_t s_seq = p.u64();
      if (s_seq >= a.seq_limit) break;
      if (s_seq < a.seq) continue;
      if (s_seq != a.seq + events.size()) {
        fail("event log " + name + " damaged at offset " + std::to_string(offset) + " (sequence)");
        break;
      }
      auto ev = make_event(s_seq, std::string(protocol::as_string_view(p.rest())));
      ev->end_offset = a.base + offset;
      record_bytes += len;
      last = ev;
      events.push_back(std::move(ev));
    }
  } catch (const std::exception& e) {   // (memory)
    fail("event log " + name + ": cannot read at offset " + std::to_string(offset) + ": " + e.what());
  }
  buf = std::string();
  if (events.empty() && b.error.empty())   // (never a silent nothing: a reader would wait on it forever)
    fail("event log " + name + ": event #" + std::to_string(a.seq) + " is not in the file before offset " +
         std::to_string(a.byte_limit));
  // What the readers asked for, made here rather than on the event loop (readers that came while
  // the block was read added theirs). A failure here is no fault of the log: what is not made
  // here is made on demand.
  if (a.prepare)
    for (auto& e : events) {
      const std::uint32_t want = b.want.load(std::memory_order_relaxed);
      if (!want) continue;
      try {
        a.prepare(*e, want);
      } catch (const std::exception&) {
      }
    }
  b.events.assign(events.begin(), events.end());
  a.fd->close();
}

}  // namespace

std::vector<event_ptr> event_log::read(std::uint64_t seq, std::size_t max, std::size_t max_bytes, std::string* error,
                                       bool* fetching, std::uint32_t prepare) const {
  std::vector<event_ptr> out;
  // Only committed transactions are read: a transaction still arriving is not visible.
  if (seq >= visible_seq_) return out;
  max = static_cast<std::size_t>(std::min<std::uint64_t>(max, visible_seq_ - seq));
  out = tail_.read(seq, max);
  if (!out.empty()) return out;
  if (background_ && fetching) return read_blocks(seq, max, max_bytes, error, fetching, prepare);
  out = read_disk(seq, max, max_bytes, error);
  for (const auto& e : out) tail_.share(e);
  return out;
}

void event_log::prune_blocks() const {
  const auto now = std::chrono::steady_clock::now();
  // Done blocks not used for a while go, and the least recently used past the budget.
  // A block nobody has read from yet stays (its reader is on its way), unless that was long ago.
  std::erase_if(blocks_, [&](const std::shared_ptr<block>& b) {
    if (!b->done || now - b->used <= (b->taken ? block_keep : block_unread_keep)) return false;
    blocks_memory_ -= b->memory;
    return true;
  });
  while (blocks_memory_ > blocks_budget) {
    auto lru = blocks_.end();
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
      if ((*it)->done && (*it)->taken && (lru == blocks_.end() || (*it)->used < (*lru)->used)) lru = it;
    if (lru == blocks_.end()) break;
    blocks_memory_ -= (*lru)->memory;
    blocks_.erase(lru);
  }
}

std::vector<event_ptr> event_log::read_blocks(std::uint64_t seq, std::size_t max, std::size_t max_bytes,
                                              std::string* error, bool* fetching, std::uint32_t want) const {
  std::vector<event_ptr> out;
  prune_blocks();
  std::shared_ptr<block> at, waiting, fault;
  for (const auto& b : blocks_) {
    if (!b->done) {
      // Being read from at or before seq: wait for it (asking for what this reader wants too).
      if (b->first <= seq && seq < b->first + block_events) waiting = b;
    } else if (b->first <= seq && seq < b->end()) {
      at = b;
    } else if (seq == b->end() && !b->error.empty()) {   // the fault after its events
      fault = b;
    }
  }
  if (!at && waiting) {
    waiting->want.fetch_or(want, std::memory_order_relaxed);
    *fetching = true;
    return out;
  }
  if (!at && fault) {
    if (error) *error = fault->error;
    return out;
  }
  if (at) {
    const auto& b = at;
    b->used = std::chrono::steady_clock::now();
    b->taken = true;
    std::size_t bytes = 0;
    for (auto i = static_cast<std::size_t>(seq - b->first); i < b->events.size() && out.size() < max; ++i) {
      if (!out.empty() && bytes >= max_bytes) break;
      bytes += b->events[i]->record.size();
      out.push_back(b->events[i]);
      // A record of megabytes is shared with any reader that reaches it while one holds it,
      // after its block is gone too (its encodings are made once).
      if (b->events[i]->record.size() >= large_record) tail_.share(b->events[i]);
    }
    // Half of it read: the next block is read meanwhile (not past what is visible, nor into the
    // memory tail, nor after a fault).
    const std::uint64_t next = b->end();
    if (b->error.empty() && out.back()->seq + 1 >= b->first + (next - b->first) / 2 && next < visible_seq_ &&
        (tail_.empty() || next < tail_.events().front()->seq)) {
      bool have = false;
      for (const auto& o : blocks_)
        if (o->first == next || (o->done && o->first <= next && next < o->end())) have = true;
      if (!have) {
        std::string ignored;   // (its fault, if any, is met when a reader gets there)
        start_block(next, b->want.load(std::memory_order_relaxed) | want, &ignored);
      }
    }
    return out;
  }
  if (start_block(seq, want, error)) *fetching = true;
  else if (error && error->empty())   // (never a silent nothing: the reader would spin on it)
    *error = "event log: event #" + std::to_string(seq) + " is neither in memory nor in the file";
  return out;
}

bool event_log::start_block(std::uint64_t seq, std::uint32_t want, std::string* error) const {
  for (const auto& s : segments_) {
    if (seq < s.first_seq || seq >= s.end_seq) continue;
    block_args a;
    a.seq = seq;
    a.base = s.base;
    a.name = s.path.filename().string();
    // What is written and committed: never a frame a reconnect may cut off, nor one still in
    // memory only (the tail has those).
    a.byte_limit = std::min<std::uint64_t>(s.bytes, visible_offset_ > s.base ? visible_offset_ - s.base : 0);
    a.seq_limit = std::min(s.end_seq, visible_seq_);
    // From where the block before it ended, or from the index entry at or before seq.
    a.offset = 0;
    auto at = std::upper_bound(s.index.begin(), s.index.end(), seq,
                               [](std::uint64_t v, const index_entry& e) { return v < e.seq; });
    if (at != s.index.begin()) a.offset = std::prev(at)->offset;
    for (const auto& b : blocks_)
      if (b->done && !b->events.empty() && b->end() == seq && b->events.back()->end_offset > s.base &&
          b->events.back()->end_offset - s.base > a.offset && b->events.back()->end_offset - s.base <= a.byte_limit &&
          b->events.front()->seq >= s.first_seq)
        a.offset = static_cast<std::size_t>(b->events.back()->end_offset - s.base);
    if (a.offset >= a.byte_limit) return false;   // not in the file yet
    // The file stays readable while its descriptor is open, whatever retention does.
    a.fd = std::make_shared<file_descriptor>(::open(s.path.c_str(), O_RDONLY | O_CLOEXEC));
    if (a.fd->fd < 0) {
      if (error) *error = "event log " + a.name + " unreadable: " + std::strerror(errno);
      return false;
    }
    auto b = std::make_shared<block>();
    b->first = seq;
    b->want.store(want, std::memory_order_relaxed);
    a.b = b;
    a.prepare = prepare_;
    try {
      background_([a = std::move(a)] { read_block(a); },
                  [this, b, alive = alive_] {
                    if (!*alive) return;
                    b->done = true;
                    b->used = std::chrono::steady_clock::now();
                    for (const auto& e : b->events) b->memory += e->memory();
                    blocks_memory_ += b->memory;
                    announce_fetched();
                  });
    } catch (const std::exception& e) {
      if (error) *error = "event log " + s.path.filename().string() + ": cannot start reading at event #" +
                          std::to_string(seq) + ": " + e.what();
      return false;
    }
    blocks_.push_back(std::move(b));
    ++background_reads_;
    return true;
  }
  return false;   // not retained
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
    std::shared_ptr<logged_event> last;   // (past the limits: one more frame if it is last's end frame)
    for (;;) {
      const bool full = !(out.size() < max && (out.empty() || read_bytes < max_bytes));
      if (full && !last) break;
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
      if (full && type != 'C') break;
      // A large record only as the first of a read: a batch of small ones does not load it too.
      if (type == 'E' && len >= large_record && !out.empty()) break;
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
      if (type == 'C') {
        set_transaction_end(last, std::string_view(frame_bytes).substr(5, len));
        if (full) break;
      }
      last.reset();
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
      last = ev;
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
