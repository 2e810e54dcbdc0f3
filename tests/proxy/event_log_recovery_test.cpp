// The event log across cut-off transactions, restarts, crashes and damage: what clients see,
// where a resume id leads, what recovery keeps and makes durable.
#include "walgate/proxy/event_log.hpp"

#include "large_transaction.hpp"
#include "temp_dir.hpp"

#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

using namespace walgate;
using namespace walgate::proxy;
namespace pg = walgate::protocol::pgoutput;
namespace fs = std::filesystem;
using protocol::lsn;
using transform::event_id;

namespace {
struct temp_dir : test::temp_dir {
  temp_dir() : test::temp_dir("walgate-rec") {}
};

/// Builds transactions of n inserts; begin/add/commit separately so a test can stop midway.
struct writer {
  pg::cached_relation rel;
  std::deque<std::string> values;
  std::deque<std::vector<pg::tuple_column>> rows;
  std::deque<protocol::transaction_info> txns;
  writer() {
    rel.oid = 1;
    rel.nspname = "public";
    rel.relname = "items";
    rel.columns = {{"id", 23, -1, true}};
  }
  protocol::transaction_info& txn(std::uint64_t commit_lsn) {
    auto& t = txns.emplace_back();
    t.commit_lsn = lsn{commit_lsn};
    t.end_lsn = lsn{commit_lsn + 8};
    return t;
  }
  void add(event_log& log, protocol::transaction_info& t, std::uint32_t i) {
    values.push_back(std::to_string(t.commit_lsn.value * 100 + i));
    rows.push_back({{pg::column_kind::text, protocol::as_bytes(values.back())}});
    transform::change c;
    c.txn = &t;
    c.kind = transform::op::insert;
    c.index = i;
    c.change_lsn = lsn{t.commit_lsn.value - 1};
    c.relation = &rel;
    c.after = rows.back();
    log.add(c);
  }
  /// begin, n adds, commit.
  void whole(event_log& log, std::uint64_t commit_lsn, std::uint32_t n) {
    auto& t = txn(commit_lsn);
    REQUIRE(log.begin(t.commit_lsn));
    for (std::uint32_t i = 0; i < n; ++i) add(log, t, i);
    log.commit(t.commit_lsn, t.end_lsn);
  }
};

std::vector<fs::path> segments(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("segment-", 0) == 0) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

log_options options(const fs::path& dir, bool fsync = false) {
  log_options o;
  o.dir = dir;
  o.fsync = fsync;
  return o;
}
}  // namespace

TEST_CASE("clients see a transaction only at its commit; a cut-off transaction was never visible") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  o.memory_bytes = 1;   // the tail holds only what is not in the file yet
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  writer w;
  w.whole(*log, 0x100, 3);
  const auto seen_offset = log->visible_offset();
  CHECK(log->visible_seq() == 3);
  // A transaction arriving: its events are held, not readable.
  auto& t = w.txn(0x200);
  REQUIRE(log->begin(t.commit_lsn));
  for (std::uint32_t i = 0; i < 4; ++i) w.add(*log, t, i);
  CHECK(log->next_seq() == 7);
  CHECK(log->visible_seq() == 3);
  CHECK(log->read(3, 10).empty());
  CHECK(log->read(0, 10).size() == 3);
  CHECK(log->visible_offset() == seen_offset);
  CHECK(log->end_offset() > seen_offset);
  CHECK(*log->seq_after({lsn{0x100}, 2}) == 3);   // the head clients see
  // The connection breaks: the transaction is dropped; nothing visible moves, not back either.
  log->abort();
  CHECK(log->next_seq() == 3);
  CHECK(log->visible_seq() == 3);
  CHECK(log->visible_offset() == seen_offset);
  CHECK(log->end_offset() == seen_offset);
  // The server sends it again, whole: the same seqs, visible at its commit.
  auto& again = w.txn(0x200);
  REQUIRE(log->begin(again.commit_lsn));
  for (std::uint32_t i = 0; i < 4; ++i) w.add(*log, again, i);
  log->commit(again.commit_lsn, again.end_lsn);
  CHECK(log->visible_seq() == 7);
  CHECK(log->visible_offset() > seen_offset);
  REQUIRE(log->sync());
  auto all = log->read(0, 100);
  REQUIRE(all.size() == 7);
  for (std::uint64_t i = 0; i < 7; ++i) CHECK(all[i]->seq == i);
  CHECK(all[6]->id.to_string() == "0/200:3");
  CHECK(*log->seq_after({lsn{0x200}, 1}) == 5);
  // An id past the newest event (a client saw what a crash then lost from the log): the head,
  // and the reader skips events up to it when the server sends them again.
  auto past = log->resume_after({lsn{0x300}, 4});
  CHECK(*past.seq == 7);
  CHECK(past.past_head);
  auto at = log->resume_after({lsn{0x200}, 3});
  CHECK(*at.seq == 7);
  CHECK_FALSE(at.past_head);
}

TEST_CASE("a transaction larger than the memory tail is read whole from the file once committed") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  o.memory_bytes = 64 << 10;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  writer w;
  auto& t = w.txn(0x100);
  REQUIRE(log->begin(t.commit_lsn));
  for (std::uint32_t i = 0; i < 40'000; ++i) w.add(*log, t, i);   // several MiB: most leaves the tail
  CHECK(log->tail().front()->seq > 0);
  CHECK(log->first_seq() == 0);   // nothing retention dropped: a client at 0 is not told to re-snapshot
  CHECK(log->read(0, 10).empty());
  log->commit(t.commit_lsn, t.end_lsn);
  std::uint64_t seq = 0;
  while (seq < log->visible_seq()) {
    auto batch = log->read(seq, 1000);
    REQUIRE_FALSE(batch.empty());
    for (const auto& e : batch) REQUIRE(e->seq == seq++);
  }
  CHECK(seq == 40'000);
}

TEST_CASE("a restart after a cut-off transaction that had opened a new segment resumes ids exactly") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  o.segment_bytes = 256;   // every transaction after the first opens a segment
  writer w;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    w.whole(*log, 0x100, 5);
    w.whole(*log, 0x200, 5);
    auto& t = w.txn(0x300);
    REQUIRE(log->begin(t.commit_lsn));   // rolls: a new, empty segment
    w.add(*log, t, 0);
    log->abort();                        // cut off, as by a reconnect
    REQUIRE(log->sync());
    CHECK(*log->seq_after({lsn{0x100}, 4}) == 5);
    CHECK(*log->seq_after({lsn{0x200}, 2}) == 8);
  }
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  CHECK(segments(d.path).size() == 3);   // the last one empty
  CHECK(log->visible_seq() == 10);
  // With the memory tail empty too, the ids come from the segments, not from the empty last one.
  o.memory_bytes = 1;
  log.reset();
  log = event_log::open(o, error);
  REQUIRE(log);
  CHECK(*log->seq_after({lsn{0x100}, 4}) == 5);
  CHECK(*log->seq_after({lsn{0x200}, 2}) == 8);
  CHECK(*log->seq_after({lsn{0x200}, 4}) == 10);
  CHECK(*log->seq_after({lsn{0x100}, 0}) == 1);
}

TEST_CASE("the last event of a segment retention dropped resumes at the first retained one") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  o.segment_bytes = 256;
  o.retention_bytes = 700;
  o.memory_bytes = 1;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  writer w;
  for (std::uint64_t i = 1; i <= 6; ++i) {
    w.whole(*log, 0x100 * i, 5);
    REQUIRE(log->sync());
  }
  REQUIRE(log->first_seq() > 0);
  const std::uint64_t first = log->first_seq();
  const std::uint64_t dropped_txn = first / 5;   // transactions 1.. of 5 events each
  CHECK(*log->seq_after({lsn{0x100 * dropped_txn}, 4}) == first);   // the dropped segment's last event
  CHECK_FALSE(log->seq_after({lsn{0x100 * dropped_txn}, 3}));      // before it: gone
  CHECK_FALSE(log->seq_after({}));                                   // 0/0:0: the start is gone
}

TEST_CASE("an id from before where the log began is not resumable; 0/0:0 reads from the start") {
  temp_dir d;
  std::string error;
  auto o = options(d.path, true);
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    // Nothing logged and no origin known: no id can be from this log.
    CHECK_FALSE(log->seq_after({lsn{0x50}, 0}));
    CHECK(*log->seq_after({}) == 0);
    REQUIRE(log->set_origin(lsn{0x1000}));
    CHECK(*log->seq_after({lsn{0x2000}, 0}) == 0);
    CHECK_FALSE(log->seq_after({lsn{0x500}, 3}));
    writer w;
    w.whole(*log, 0x1100, 2);
    REQUIRE(log->sync());
    REQUIRE(log->set_origin(lsn{0x9999}));   // set once: a log with events keeps its origin
    CHECK(log->origin().value == 0x1000);
  }
  auto log = event_log::open(o, error);   // stored
  REQUIRE(log);
  CHECK(log->origin().value == 0x1000);
  CHECK_FALSE(log->seq_after({lsn{0x500}, 3}));        // another log's id
  CHECK(*log->seq_after({lsn{0x1000}, 0}) == 0);       // after the origin, before the first event
  CHECK(*log->seq_after({}) == 0);
  CHECK(*log->seq_after({lsn{0x1100}, 0}) == 1);
}

TEST_CASE("a resume lookup that cannot read the file says so, instead of 'not retained'") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  o.memory_bytes = 1;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  writer w;
  w.whole(*log, 0x100, 5);
  w.whole(*log, 0x200, 5);
  REQUIRE(log->sync());
  fs::remove(segments(d.path).front());
  auto r = log->resume_after({lsn{0x100}, 2});
  CHECK_FALSE(r.seq);
  CHECK(r.error.find("unreadable") != std::string::npos);
}

TEST_CASE("stray files named segment-* are left alone") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  writer w;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    w.whole(*log, 0x100, 2);
  }
  std::ofstream(d.path / "segment-x.bak") << "junk";
  std::ofstream(d.path / "segment-00000000000000000000.log.orig") << "junk";
  std::ofstream(d.path / "segment-99999999999999999999.log") << "";   // 20 digits, past UINT64_MAX
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  CHECK(log->visible_seq() == 2);
  CHECK(fs::exists(d.path / "segment-x.bak"));
}

TEST_CASE("a torn segment that is not the last: cut when nothing complete follows, refused when something does") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  o.segment_bytes = 256;
  writer w;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    w.whole(*log, 0x100, 5);
    w.whole(*log, 0x200, 5);   // second segment
    REQUIRE(log->sync());
  }
  auto segs = segments(d.path);
  REQUIRE(segs.size() == 2);
  const auto first_size = fs::file_size(segs[0]);
  // A power cut after the roll: the first segment lost its last bytes, the second is empty.
  fs::resize_file(segs[0], first_size - 3);
  fs::resize_file(segs[1], 0);
  {
    auto log = event_log::open(o, error);
    REQUIRE_MESSAGE(log, error);
    CHECK(log->visible_seq() == 0);   // the first transaction's end frame was torn
    CHECK(segments(d.path).size() == 1);
    w.whole(*log, 0x300, 5);          // and the log goes on
    REQUIRE(log->sync());
    CHECK(log->visible_seq() == 5);
  }
  // Damage inside a segment that complete transactions follow: cutting would lose them.
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    w.whole(*log, 0x400, 5);
    REQUIRE(log->sync());
  }
  segs = segments(d.path);
  REQUIRE(segs.size() == 2);
  fs::resize_file(segs[0], fs::file_size(segs[0]) - 3);
  CHECK_FALSE(event_log::open(o, error));
  CHECK(error.find("is damaged at offset") != std::string::npos);
  CHECK(error.find("whole, valid frames follow (in segment-") != std::string::npos);
  CHECK(segments(d.path).size() == 2);   // untouched
}

TEST_CASE("recovery makes what it keeps durable before anything is acknowledged (simulated power cut)") {
  temp_dir d;
  auto o = options(d.path, true);
  // A walgate killed after writing and before its fdatasync: the bytes are in the page cache.
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::string e;
    auto log = event_log::open(o, e);
    if (!log) _exit(3);
    writer w;
    w.whole(*log, 0x100, 3);
    w.whole(*log, 0x200, 3);
    auto job = log->begin_sync();   // written, never synced
    _exit(job.fd >= 0 ? 0 : 4);
  }
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  // What reached stable storage, by file (the hook sees every sync the log makes).
  std::map<std::string, std::uint64_t> synced;
  event_log::set_sync_observer([&](int fd) {
    struct stat st {};
    char link[512];
    auto n = readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link, sizeof link - 1);
    if (n <= 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    link[n] = 0;
    synced[link] = static_cast<std::uint64_t>(st.st_size);
  });
  lsn recovered;
  {
    std::string error;
    auto log = event_log::open(o, error);
    REQUIRE_MESSAGE(log, error);
    recovered = log->durable_lsn();
    CHECK(recovered.value == 0x208);   // what a restart acknowledges
    event_log::set_sync_observer({});   // (the power goes before this log syncs anything itself)
  }
  // The power goes: every segment falls back to what was synced.
  for (const auto& seg : segments(d.path)) {
    auto it = synced.find(fs::canonical(seg).string());
    fs::resize_file(seg, it == synced.end() ? 0 : it->second);
  }
  std::string error;
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  CHECK(log->durable_lsn() == recovered);
  CHECK(log->visible_seq() == 6);
}

TEST_CASE("retention below the segment size keeps the newest segment with events: a restart still knows the head") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  o.segment_bytes = 256;
  o.retention_bytes = 1;   // smaller than any segment
  o.memory_bytes = 1;
  writer w;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    for (std::uint64_t i = 1; i <= 4; ++i) {
      w.whole(*log, 0x100 * i, 5);
      REQUIRE(log->sync());
    }
    auto& t = w.txn(0x500);
    REQUIRE(log->begin(t.commit_lsn));   // rolls: only an empty segment would be left
    w.add(*log, t, 0);
    log->abort();
    REQUIRE(log->sync());
  }
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  CHECK(log->visible_seq() == 20);
  auto head = log->resume_after({lsn{0x400}, 4});   // the newest event: the head, no skipping
  CHECK(*head.seq == 20);
  CHECK_FALSE(head.past_head);
  CHECK_FALSE(log->seq_after({lsn{0x100}, 1}));      // dropped: 410, not a silent head
  CHECK_FALSE(log->seq_after({}));
}

TEST_CASE("resuming from the last event in the file when the next ones are only in memory") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  o.memory_bytes = 1;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  writer w;
  w.whole(*log, 0x100, 3);
  REQUIRE(log->sync());     // in the file; the tail keeps only the newest
  w.whole(*log, 0x200, 3);  // committed, not yet written: held in the tail
  REQUIRE(log->tail().front()->seq <= 3);
  auto r = log->resume_after({lsn{0x100}, 2});
  CHECK(r.error.empty());
  CHECK(*r.seq == 3);
}

namespace {
/// Flips one bit of the file at offset.
void flip(const fs::path& p, std::uint64_t offset, char mask = 0x10) {
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c ^= mask;
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}
std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
/// A log of one transaction of 3 events (commit 0/100, ending at 0/108), then `txns` of 50 each
/// (commits 0/200, 0/300…), synced; the offset after the first one.
std::uint64_t three_then_fifties(const log_options& o, writer& w, std::uint64_t txns) {
  std::string error;
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  w.whole(*log, 0x100, 3);
  const std::uint64_t after_first = log->end_offset();
  for (std::uint64_t i = 0; i < txns; ++i) w.whole(*log, 0x200 + i * 0x100, 50);
  REQUIRE(log->sync());
  return after_first;
}
}  // namespace

TEST_CASE("damage early in the newest segment, whole frames after it: refused and untouched, whatever the bit") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  writer w;
  const std::uint64_t after_first = three_then_fifties(o, w, 200);   // 10,000 acknowledged events
  auto segs = segments(d.path);
  REQUIRE(segs.size() == 1);
  const std::string before = file_bytes(segs[0]);
  // A bit in the payload, in the type byte, in the length (the frame then seems to end far past
  // the file, or early), in the CRC: each time the whole frames after it are found.
  for (std::uint64_t at : {after_first + 20, after_first, after_first + 1, after_first + 3, after_first + 4,
                           after_first + 60}) {
    for (char mask : {char(0x01), char(0x10), char(0x80)}) {
      flip(segs[0], at, mask);
      CHECK_FALSE(event_log::open(o, error));
      CHECK_MESSAGE(error.find("whole, valid frames follow") != std::string::npos, at << ": " << error);
      CHECK(file_bytes(segs[0]) == before.substr(0, at) + char(before[at] ^ mask) + before.substr(at + 1));
      flip(segs[0], at, mask);
    }
  }
  CHECK_FALSE(fs::exists(d.path / "damaged"));
  auto log = event_log::open(o, error);   // undamaged again: everything there
  REQUIRE_MESSAGE(log, error);
  CHECK(log->visible_seq() == 3 + 200 * 50);
}

// Assumption: whole frames after damage mean acknowledged history, unless the slot says otherwise.
// A power cut can keep later unsynced pages and lose earlier ones; when the slot's position shows
// that nothing from the damage on was acknowledged, it is cut (the server sends it again).
TEST_CASE("damage with whole frames after it, all past the slot's confirmed position: cut and kept aside; one byte less, refused") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  writer w;
  const std::uint64_t after_first = three_then_fifties(o, w, 20);
  auto seg = segments(d.path).at(0);
  const std::string before = file_bytes(seg);
  const std::uint64_t at = after_first + 20;
  flip(seg, at, char(0x10));
  const std::string damaged = file_bytes(seg);
  // The slot acknowledged the second transaction (it ends at 0x208): the damage is in history.
  auto acked = o;
  acked.acknowledged = lsn{0x208};
  CHECK_FALSE(event_log::open(acked, error));
  CHECK_MESSAGE(error.find("whole, valid frames follow") != std::string::npos, error);
  // Not even past the first one's end by a byte: refused too.
  acked.acknowledged = lsn{0x109};
  CHECK_FALSE(event_log::open(acked, error));
  CHECK(file_bytes(seg) == damaged);
  // Without the slot's position (ACKED alone may be behind it): refused.
  CHECK_FALSE(event_log::open(o, error));
  CHECK(file_bytes(seg) == damaged);
  CHECK_FALSE(fs::exists(d.path / "damaged"));
  // At the first transaction's end: nothing after it was acknowledged. Cut, every byte kept.
  acked.acknowledged = lsn{0x108};
  {
    auto log = event_log::open(acked, error);
    REQUIRE_MESSAGE(log, error);
    CHECK(log->visible_seq() == 3);
    CHECK(log->durable_lsn() == lsn{0x108});
  }
  CHECK(fs::file_size(seg) == after_first);
  const auto aside = d.path / "damaged" / (seg.filename().string() + "." + std::to_string(after_first) + ".cut");
  REQUIRE(fs::exists(aside));
  CHECK(file_bytes(aside) == damaged.substr(after_first));
  // And the stream goes on from there: the same transactions logged again.
  {
    auto log = event_log::open(acked, error);
    REQUIRE_MESSAGE(log, error);
    w.whole(*log, 0x200, 50);
    CHECK(log->visible_seq() == 53);
  }
}

TEST_CASE("damage with whole frames after it, past the slot: still refused when ACKED is past it, or the initial snapshot is pending") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  writer w;
  const std::uint64_t after_first = three_then_fifties(o, w, 20);
  auto seg = segments(d.path).at(0);
  flip(seg, after_first + 20, char(0x10));
  const std::string damaged = file_bytes(seg);
  auto by_slot = o;
  by_slot.acknowledged = lsn{0x108};   // the slot: nothing after the first transaction
  // ACKED (stored while everything logged was synced) past the damaged transaction's end: it was
  // acknowledged whatever the slot says.
  REQUIRE(event_log::store_acked(d.path, lsn{0x208}, false, error));
  CHECK_FALSE(event_log::open(by_slot, error));
  CHECK_MESSAGE(error.find("whole, valid frames follow") != std::string::npos, error);
  CHECK(file_bytes(seg) == damaged);
  REQUIRE(event_log::store_acked(d.path, lsn{0x100}, false, error));
  // The initial snapshot pending: the slot's position acknowledged nothing of the log.
  std::ofstream(d.path / "SNAPSHOT") << "pending\n";
  CHECK_FALSE(event_log::open(by_slot, error));
  CHECK_MESSAGE(error.find("the initial snapshot pending") != std::string::npos, error);
  CHECK(file_bytes(seg) == damaged);
  CHECK_FALSE(fs::exists(d.path / "damaged"));
  // Neither: cut.
  fs::remove(d.path / "SNAPSHOT");
  auto log = event_log::open(by_slot, error);
  REQUIRE_MESSAGE(log, error);
  CHECK(log->visible_seq() == 3);
}

TEST_CASE("damage in a segment with whole transactions in the next, none acknowledged: the later segment moved aside too") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  o.segment_bytes = 256;   // every transaction after the first opens a segment
  writer w;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    w.whole(*log, 0x100, 5);
    w.whole(*log, 0x200, 5);
    w.whole(*log, 0x300, 5);
    REQUIRE(log->sync());
  }
  auto segs = segments(d.path);
  REQUIRE(segs.size() == 3);
  // Damage in the second segment's transaction; the third is whole.
  flip(segs[1], 30, char(0x01));
  const std::string third = file_bytes(segs[2]);
  auto by_slot = o;
  by_slot.acknowledged = lsn{0x109};   // the first transaction (ends at 0x108) and no more
  CHECK_FALSE(event_log::open(by_slot, error));   // one byte past its end: refused
  CHECK(segments(d.path).size() == 3);
  by_slot.acknowledged = lsn{0x108};
  {
    auto log = event_log::open(by_slot, error);
    REQUIRE_MESSAGE(log, error);
    CHECK(log->visible_seq() == 5);
  }
  segs = segments(d.path);
  REQUIRE(segs.size() == 2);   // the second, cut to nothing; the third moved aside whole
  CHECK(fs::file_size(segs[1]) == 0);
  bool kept = false;
  for (const auto& e : fs::directory_iterator(d.path / "damaged"))
    kept = kept || (e.path().filename().string().find(".cut") != std::string::npos && file_bytes(e.path()) == third);
  CHECK(kept);
}

TEST_CASE("a torn tail — cut short, zeros after it, a garbage write — is cut and moved aside; an acknowledged one is refused") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  writer w;
  std::uint64_t whole_end = 0;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    w.whole(*log, 0x100, 3);
    whole_end = log->end_offset();
    w.whole(*log, 0x200, 40);
    REQUIRE(log->sync());
  }
  auto seg = segments(d.path).at(0);
  const std::string full = file_bytes(seg);
  struct tail_case {
    const char* what;
    std::string bytes;
  };
  const std::vector<tail_case> cases = {
      {"cut short in a frame", full.substr(0, full.size() - 11)},
      {"cut short, then zeros (a crash after the size grew, before the data)", full.substr(0, full.size() - 400) + std::string(8192, '\0')},
      {"cut short, then bytes that are no frame", full.substr(0, whole_end + 150) + std::string(3000, 'E')},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    fs::remove_all(d.path / "damaged");
    std::ofstream(seg, std::ios::binary | std::ios::trunc) << c.bytes;
    auto log = event_log::open(o, error);
    REQUIRE_MESSAGE(log, error);
    CHECK(log->visible_seq() == 3);
    CHECK(fs::file_size(seg) == whole_end);
    const auto aside = d.path / "damaged" / (seg.filename().string() + "." + std::to_string(whole_end) + ".cut");
    REQUIRE(fs::exists(aside));
    CHECK(file_bytes(aside) == c.bytes.substr(whole_end));   // every byte cut, kept
  }
  // ACKED past the torn transaction's commit: it was on disk whole when that was stored, so the
  // damage is no torn write. Refused, untouched.
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    w.whole(*log, 0x300, 40);
    REQUIRE(log->sync());
  }
  REQUIRE(event_log::store_acked(d.path, lsn{0x400}, false, error));
  const auto size = fs::file_size(seg);
  fs::resize_file(seg, size - 5);
  CHECK_FALSE(event_log::open(o, error));
  CHECK_MESSAGE(error.find("inside a transaction committed at 0/300, before the position walgate acknowledged (0/400") !=
                    std::string::npos,
                error);
  CHECK(fs::file_size(seg) == size - 5);
  // ACKED older than it (stored while idle, before the busy stream), but the slot, read before
  // the log is opened, was acknowledged past it: refused the same, untouched.
  REQUIRE(event_log::store_acked(d.path, lsn{0x100}, false, error));
  auto by_slot = o;
  by_slot.acknowledged = lsn{0x308};
  CHECK_FALSE(event_log::open(by_slot, error));
  CHECK_MESSAGE(error.find("acknowledged (0/308, the slot's confirmed_flush_lsn)") != std::string::npos, error);
  CHECK(fs::file_size(seg) == size - 5);
  // Neither past it: a torn write, cut.
  by_slot.acknowledged = lsn{0x300};
  auto log = event_log::open(by_slot, error);
  REQUIRE_MESSAGE(log, error);
  CHECK(log->durable_lsn() < lsn{0x300});
}

TEST_CASE("a log that lost every segment begins where its stream does again: older ids are 410, not a silent gap") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  writer w;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    REQUIRE(log->set_origin(lsn{0x50}));
    w.whole(*log, 0x100, 3);
    w.whole(*log, 0x200, 3);
    REQUIRE(log->sync());
  }
  for (const auto& s : segments(d.path)) fs::remove(s);
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  CHECK(log->visible_seq() == 0);
  // The stream starts again where the slot is (the gateway moves the origin of an empty log up).
  REQUIRE(log->set_origin(lsn{0x300}));
  CHECK(log->origin() == lsn{0x300});
  REQUIRE(log->set_origin(lsn{0x280}));   // never down
  CHECK(log->origin() == lsn{0x300});
  w.whole(*log, 0x400, 2);   // sequence numbers start at 0 again
  CHECK(log->visible_seq() == 2);
  CHECK_FALSE(log->resume_after(event_id{lsn{0x100}, 1}).seq);   // 410: from before this log's events
  CHECK_FALSE(log->resume_after(event_id{lsn{0x200}, 2}).seq);
  CHECK(log->resume_after(event_id{}).seq == 0);                   // 0/0:0: the log's start
  CHECK(log->resume_after(event_id{lsn{0x400}, 0}).seq == 1);
  REQUIRE(log->set_origin(lsn{0x500}));   // holding events, the origin stays
  CHECK(log->origin() == lsn{0x300});
}

TEST_CASE("restart memory is bounded by blocks, not by the segment: one transaction of 320 MiB") {
  temp_dir d;
  std::string error;
  auto o = options(d.path);
  o.memory_bytes = 16u << 20;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    // One transaction of 320 records of 1 MiB: one segment, however large.
    REQUIRE(bench::log_large_transaction(*log, 320));
  }
  REQUIRE(segments(d.path).size() == 1);
  REQUIRE(fs::file_size(segments(d.path)[0]) > (320ull << 20) - (1u << 20));
  // Opened in a child of its own: its peak RSS is what a restart needs.
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::string e;
    auto log = event_log::open(o, e);
    _exit(log && log->visible_seq() == 320 ? 0 : 1);
  }
  int status = 0;
  rusage ru{};
  REQUIRE(wait4(child, &status, 0, &ru) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  MESSAGE("restart of a 320 MiB segment: peak RSS " << ru.ru_maxrss / 1024 << " MiB");
  CHECK(ru.ru_maxrss < 96 * 1024);   // KiB: the old recovery read the segment whole (> 320 MiB)
}
