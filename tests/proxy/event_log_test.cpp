#include "walgate/proxy/event_log.hpp"
#include "walgate/transform/record.hpp"

#include "log_txn_builder.hpp"
#include "split_helpers.hpp"
#include "temp_dir.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <thread>

using namespace walgate;
using namespace walgate::proxy;
namespace pg = walgate::protocol::pgoutput;
using protocol::lsn;

using test::txn_builder;

namespace {
struct temp_dir : test::temp_dir {
  temp_dir() : test::temp_dir("walgate-log") {}
};

/// What a reader keeps with an event, as the log sees it (logged_event::attached): its memory.
struct attached_bytes final : event_attachment {
  explicit attached_bytes(std::size_t n) : bytes(n) {}
  std::size_t memory() const override { return bytes; }
  std::size_t bytes;
};

}  // namespace

TEST_CASE("append, group commit, durable position, refusal of redelivered transactions") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  std::vector<const logged_event*> published;
  std::vector<std::uint32_t> change_indexes;
  log->set_publish([&](const logged_event& e, const transform::change& c) {
    published.push_back(&e);
    change_indexes.push_back(c.index);
  });
  txn_builder b;
  protocol::transaction_info t1, t2, t3;
  CHECK(b.append(*log, 0x100, 3, t1));
  CHECK(b.append(*log, 0x200, 2, t2));
  CHECK(published.size() == 5);
  CHECK(published[4]->id.to_string() == "0/200:1");
  CHECK(published[4]->seq == 4);
  CHECK(published[0]->table == "items");
  CHECK(change_indexes == std::vector<std::uint32_t>{0, 1, 2, 0, 1});
  CHECK_FALSE(log->durable_lsn().valid());   // appended, not yet durable
  REQUIRE(log->sync());
  CHECK(log->durable_lsn().value == 0x208);
  CHECK_FALSE(b.append(*log, 0x200, 1, t3));   // the server resent it: refused
  CHECK_FALSE(b.append(*log, 0x150, 1, t3));
  CHECK(log->next_seq() == 5);
  CHECK(*log->seq_after(transform::event_id{lsn{0x100}, 2}) == 3);
  CHECK(*log->seq_after(transform::event_id{lsn{0x200}, 1}) == 5);
  CHECK(*log->seq_after(transform::event_id{lsn{0x900}, 0}) == 5);
  // Older than the first event, but nothing was ever dropped: everything is after it.
  CHECK(*log->seq_after(transform::event_id{lsn{0x50}, 0}) == 0);
}

TEST_CASE("recovery after a restart, and a torn tail is cut off") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  txn_builder b;
  protocol::transaction_info t1, t2, t3;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    b.append(*log, 0x100, 3, t1);
    b.append(*log, 0x200, 2, t2);
    REQUIRE(log->sync());
  }
  // A crash in the middle of writing the next transaction: half a frame at the end.
  std::filesystem::path seg;
  for (const auto& e : std::filesystem::directory_iterator(d.path))
    if (e.path().filename().string().rfind("segment-", 0) == 0) seg = e.path();
  {
    std::ofstream out(seg, std::ios::binary | std::ios::app);
    out << std::string("E\x00\x00\x00\x40partial", 12);
  }
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  CHECK(log->next_seq() == 5);
  CHECK(log->durable_lsn().value == 0x208);
  CHECK(log->last_commit_lsn().value == 0x200);
  // After a restart the newest events are in memory again (clients resuming share them).
  REQUIRE(log->tail().size() == 5);
  CHECK(log->tail().front()->seq == 0);
  auto events = log->read(1, 10);
  REQUIRE(events.size() == 4);
  CHECK(events[0] == log->tail()[1]);   // the same event, not a copy per reader
  CHECK(events[0]->id.to_string() == "0/100:1");
  CHECK(events[3]->id.to_string() == "0/200:1");
  CHECK(*log->seq_after(transform::event_id{lsn{0x100}, 1}) == 2);
  CHECK_FALSE(b.append(*log, 0x200, 1, t3));   // still refuses what it already has
  CHECK(b.append(*log, 0x300, 1, t3));
  REQUIRE(log->sync());
  CHECK(log->read(5, 10).size() == 1);
}

TEST_CASE("after a restart the newest events, up to half the memory tail, are in memory again") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.segment_bytes = 4096;
  o.memory_bytes = 4096;
  o.fsync = false;
  txn_builder b;
  std::vector<protocol::transaction_info> txns(100);
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    for (int i = 0; i < 100; ++i)
      REQUIRE(b.append(*log, 0x1000 + 0x10 * static_cast<std::uint64_t>(i), 5, txns[static_cast<std::size_t>(i)]));
    REQUIRE(log->sync());
  }
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  REQUIRE_FALSE(log->tail().empty());
  CHECK(log->tail().back()->seq == log->next_seq() - 1);   // up to the head, without a hole
  for (std::size_t i = 1; i < log->tail().size(); ++i) CHECK(log->tail()[i]->seq == log->tail()[i - 1]->seq + 1);
  CHECK(log->tail().front()->seq > log->first_seq());      // not the whole log: the budget
  std::size_t bytes = 0;
  for (const auto& e : log->tail()) bytes += e->memory();
  CHECK(bytes <= o.memory_bytes);
  // Reading below the tail still comes from the file, and joins the tail without a seam.
  std::uint64_t expect = log->first_seq();
  while (expect < log->next_seq()) {
    auto batch = log->read(expect, 64);
    REQUIRE_FALSE(batch.empty());
    for (const auto& e : batch) CHECK(e->seq == expect++);
  }
  // New events follow on.
  protocol::transaction_info next;
  REQUIRE(b.append(*log, 0x9000, 2, next));
  CHECK(log->tail().back()->seq == log->next_seq() - 1);
}

TEST_CASE("segments roll, retention drops the oldest, the memory tail stays bounded") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.segment_bytes = 4096;
  o.retention_bytes = 16384;
  o.memory_bytes = 8192;
  o.fsync = false;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  txn_builder b;
  std::vector<protocol::transaction_info> txns(200);
  for (int i = 0; i < 200; ++i) {
    REQUIRE(b.append(*log, 0x1000 + 0x10 * static_cast<std::uint64_t>(i), 5, txns[static_cast<std::size_t>(i)]));
    REQUIRE(log->sync());
  }
  CHECK(log->disk_bytes() <= 16384 + 4096);
  CHECK(log->first_seq() > 0);
  std::size_t tail_bytes = 0;
  for (const auto& e : log->tail()) tail_bytes += e->memory();
  CHECK(tail_bytes <= 8192);
  // Everything retained can be read, from disk or memory, in order.
  std::uint64_t expect = log->first_seq();
  while (expect < log->next_seq()) {
    auto batch = log->read(expect, 50);
    REQUIRE_FALSE(batch.empty());
    for (const auto& e : batch) CHECK(e->seq == expect++);
  }
  CHECK_FALSE(log->seq_after(transform::event_id{lsn{0x1000}, 0}));   // dropped by retention
}

TEST_CASE("a frame whose checksum fails with whole frames after it is refused, untouched; a log of another layout is refused") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  txn_builder b;
  protocol::transaction_info t1, t2;
  std::uint64_t end_after_first = 0;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    b.append(*log, 0x100, 2, t1);
    end_after_first = log->end_offset();
    b.append(*log, 0x200, 2, t2);
    REQUIRE(log->sync());
  }
  std::filesystem::path seg;
  for (const auto& e : std::filesystem::directory_iterator(d.path))
    if (e.path().filename().string().rfind("segment-", 0) == 0) seg = e.path();
  REQUIRE(std::filesystem::file_size(seg) > end_after_first);
  {
    // Flip one bit in the second transaction's first event: CRC-32C catches it.
    std::fstream f(seg, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(static_cast<std::streamoff>(end_after_first + 20));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(static_cast<std::streamoff>(end_after_first + 20));
    f.write(&c, 1);
  }
  const auto size = std::filesystem::file_size(seg);
  {
    // The second event and the commit after the damage are whole: damage inside history, not a
    // torn last write. Refused, nothing cut (it used to be cut here, acknowledged events and all).
    CHECK_FALSE(event_log::open(o, error));
    CHECK_MESSAGE(error.find("is damaged at offset " + std::to_string(end_after_first)) != std::string::npos, error);
    CHECK(error.find("whole, valid frames follow (in it at offset") != std::string::npos);
    CHECK(std::filesystem::file_size(seg) == size);
    CHECK_FALSE(std::filesystem::exists(d.path / "damaged"));
  }
  // Cut short instead (a crash in the middle of its write): the second transaction is a torn
  // tail. Cut, the bytes kept aside; the first transaction stays.
  {
    std::fstream f(seg, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(static_cast<std::streamoff>(end_after_first + 20));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(static_cast<std::streamoff>(end_after_first + 20));
    f.write(&c, 1);   // (the flip undone)
  }
  std::filesystem::resize_file(seg, size - 7);
  {
    auto log = event_log::open(o, error);
    REQUIRE_MESSAGE(log, error);
    CHECK(log->next_seq() == 2);
    CHECK(log->durable_lsn().value == 0x108);
    CHECK(std::filesystem::file_size(seg) == end_after_first);
    const auto aside = d.path / "damaged" / (seg.filename().string() + "." + std::to_string(end_after_first) + ".cut");
    REQUIRE(std::filesystem::exists(aside));
    CHECK(std::filesystem::file_size(aside) == size - 7 - end_after_first);
    // end_offset of an event read from disk is where its frame ends.
    auto events = log->read(0, 10);
    REQUIRE(events.size() == 2);
    CHECK(events[1]->end_offset == end_after_first - 25);   // then its transaction's C frame
    CHECK(log->end_offset() == end_after_first);
  }
  // Another layout (an older FORMAT, or segments with no FORMAT file): refused, untouched.
  {
    std::ofstream(d.path / "FORMAT", std::ios::trunc) << "walgate event log 1\n";
  }
  CHECK_FALSE(event_log::open(o, error));
  CHECK(error.find("another layout (FORMAT: walgate event log 1)") != std::string::npos);
  std::filesystem::remove(d.path / "FORMAT");
  CHECK_FALSE(event_log::open(o, error));
  CHECK(error.find("no FORMAT file") != std::string::npos);
  CHECK(std::filesystem::file_size(seg) == end_after_first);
}

TEST_CASE("encodings count against the memory tail; end offsets grow with the log") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.memory_bytes = 64 * 1024;
  o.fsync = false;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  txn_builder b;
  std::vector<protocol::transaction_info> txns(20);
  for (int i = 0; i < 20; ++i) REQUIRE(b.append(*log, 0x1000 + 0x10 * static_cast<std::uint64_t>(i), 5, txns[static_cast<std::size_t>(i)]));
  REQUIRE(log->tail().size() == 100);
  REQUIRE(log->sync());   // (events not yet in the file are never evicted)
  std::uint64_t prev = 0;
  for (const auto& e : log->tail()) {
    CHECK(e->end_offset > prev);
    prev = e->end_offset;
  }
  CHECK(prev == log->end_offset() - 9 - 16);   // the last transaction's 'C' frame follows
  // Attaching 4 KiB to each event (as the server's encodings are), counted, pushes the oldest out.
  for (std::uint64_t seq = 0; seq < 100; ++seq) {
    auto batch = log->read(seq, 1);
    REQUIRE(batch.size() == 1);
    const auto& e = *batch[0];
    if (!e.attached) {
      e.attached = std::make_unique<attached_bytes>(4096);
      log->account_memory(e, 4096);
    }
  }
  std::size_t tail_bytes = 0;
  for (const auto& e : log->tail()) tail_bytes += e->memory();
  CHECK(tail_bytes <= 64 * 1024);
  CHECK(log->tail().size() < 20);
  CHECK(log->tail().back()->seq == 99);
}

TEST_CASE("a sync in two halves: durable only when the fdatasync has ended, dirty meanwhile") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  txn_builder b;
  protocol::transaction_info t1, t2;
  b.append(*log, 0x100, 2, t1);
  CHECK(log->dirty());
  auto job = log->begin_sync();
  REQUIRE(job.fd >= 0);
  CHECK(job.target.value == 0x108);
  CHECK(log->dirty());                       // written, not yet synced
  CHECK_FALSE(log->durable_lsn().valid());
  b.append(*log, 0x200, 1, t2);              // commits while the sync runs go with the next
  event_log::run_sync_job(job);              // (on the sync thread, in the gateway)
  REQUIRE(log->end_sync(job));
  CHECK(log->durable_lsn().value == 0x108);
  CHECK(log->durable_seq() == 2);            // (t1's two events; t2's not yet)
  CHECK(log->dirty());
  REQUIRE(log->sync());
  CHECK(log->durable_lsn().value == 0x208);
  CHECK(log->durable_seq() == 3);
  CHECK_FALSE(log->dirty());
  log.reset();
  auto again = event_log::open(o, error);    // what was recovered is durable
  REQUIRE(again);
  CHECK(again->durable_seq() == 3);
}

TEST_CASE("a hold keeps what a consumer has not confirmed past the retention; moved on, retention drops it") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.segment_bytes = 4096;
  o.retention_bytes = 16384;
  o.memory_bytes = 8192;   // (the memory tail holds no old events: what is retained is the files')
  o.fsync = false;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  log->hold_from(0);   // (the JetStream publisher, before it knows where the stream ends)
  txn_builder b;
  std::vector<protocol::transaction_info> txns(200);
  for (int i = 0; i < 200; ++i) {
    REQUIRE(b.append(*log, 0x1000 + 0x10 * static_cast<std::uint64_t>(i), 5, txns[static_cast<std::size_t>(i)]));
    REQUIRE(log->sync());
  }
  CHECK(log->first_seq() == 0);   // all of it, past the retention
  CHECK(log->disk_bytes() > 3 * 16384);
  log->hold_from(600);            // confirmed up to event 599: what is before its segment may go
  CHECK(log->first_seq() > 0);
  CHECK(log->first_seq() <= 600);
  CHECK(log->disk_bytes() > 16384);
  log->hold_from(std::nullopt);   // no hold: the retention alone
  CHECK(log->disk_bytes() <= 16384 + 4096);
  CHECK(log->read(log->first_seq(), 1).front()->seq == log->first_seq());
}

TEST_CASE("a hold by commit LSN (downstream slots) keeps every event committed at or past it; bytes_held_from measures it") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.segment_bytes = 4096;
  o.retention_bytes = 16384;
  o.memory_bytes = 8192;
  o.fsync = false;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  log->hold_from_lsn(lsn{0x1000});   // (a slot at the first transaction's commit: it needs all of them)
  txn_builder b;
  std::vector<protocol::transaction_info> txns(200);
  for (int i = 0; i < 200; ++i) {
    REQUIRE(b.append(*log, 0x1000 + 0x10 * static_cast<std::uint64_t>(i), 5, txns[static_cast<std::size_t>(i)]));
    REQUIRE(log->sync());
  }
  CHECK(log->first_seq() == 0);   // all of it, past the retention
  const auto all = log->bytes_held_from(lsn{0x1000});
  CHECK(all == log->end_offset());   // from the very first event
  CHECK(log->bytes_held_from(lsn{0x1000 + 0x10 * 199 + 1}) == 0);   // past every commit: nothing
  // The slot confirmed past transaction 99 (commit 0x1630): transactions 100 on are needed.
  const lsn past_99{0x1000 + 0x10 * 99 + 1};
  const auto held = log->bytes_held_from(past_99);
  CHECK(held < all);
  CHECK(held > log->end_offset() - log->read(500, 1).front()->end_offset);   // (transactions 100-199 at least)
  CHECK(held <= log->end_offset() - log->read(500, 1).front()->end_offset + 65536 + 4096);   // (an index step more, at most)
  log->hold_from_lsn(past_99);
  CHECK(log->first_seq() > 0);
  CHECK(log->first_seq() <= 500);   // transaction 100's first event is still there
  CHECK(log->read(500, 1).front()->seq == 500);
  log->hold_from_lsn(std::nullopt);
  CHECK(log->disk_bytes() <= 16384 + 4096);
}

TEST_CASE("an event is readable from the tail until it is in the file, then from the file") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.memory_bytes = 1;   // the tail keeps only what it must
  o.fsync = false;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  txn_builder b;
  protocol::transaction_info t1;
  b.append(*log, 0x100, 5, t1);
  CHECK(log->tail().size() == 5);   // not written yet: held
  auto before = log->read(0, 10);
  REQUIRE(before.size() == 5);
  std::vector<logged_event> copies;
  for (const auto& e : before) copies.push_back({e->seq, e->id, e->record, e->schema, e->table, e->kind, e->xid, e->end_offset});
  REQUIRE(log->sync());
  CHECK(log->tail().size() == 1);
  // Out of the tail but still held (a client sending them): the same events, not read again.
  auto held = log->read(0, 10);
  REQUIRE(held.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) CHECK(held[i] == before[i]);
  before.clear();
  held.clear();
  auto after = log->read(0, 10);    // held by nobody: from the file
  REQUIRE(after.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK(after[i]->id == copies[i].id);
    CHECK(after[i]->record == copies[i].record);
    CHECK(after[i]->end_offset == copies[i].end_offset);
  }
  // Read from the file while another reader holds the same events: one copy for both.
  auto again = log->read(1, 2);
  REQUIRE(again.size() == 2);
  CHECK(again[0] == after[1]);
  CHECK(again[1] == after[2]);
}

TEST_CASE("reading a damaged, short or missing segment says so, after the events before the fault") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.memory_bytes = 1;   // reads come from the file
  o.fsync = false;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  txn_builder b;
  protocol::transaction_info t1, t2;
  b.append(*log, 0x100, 5, t1);
  b.append(*log, 0x200, 5, t2);
  REQUIRE(log->sync());
  std::string why;
  std::vector<std::uint64_t> end_offsets;
  {
    auto good = log->read(0, 100, &why);
    REQUIRE(good.size() == 10);
    for (const auto& e : good) end_offsets.push_back(e->end_offset);
  }   // (events nobody holds are read from the file again, not shared)
  CHECK(why.empty());
  auto segment = d.path / "segment-00000000000000000000.log";
  auto flip = [&](std::uint64_t at) {
    std::fstream f(segment, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x40));
  };
  // A byte of event 3's record (before its checksum): events 0..2, then the fault.
  flip(end_offsets[3] - 6);
  CHECK(log->read(0, 100, &why).size() == 3);
  CHECK(why == "event log segment-00000000000000000000.log damaged at offset " + std::to_string(end_offsets[2]) +
                   " (checksum)");
  why.clear();
  CHECK(log->read(3, 100, &why).empty());
  CHECK_FALSE(why.empty());
  flip(end_offsets[3] - 6);   // repaired
  why.clear();
  CHECK(log->read(0, 100, &why).size() == 10);
  CHECK(why.empty());
  // Shorter than what was written.
  std::filesystem::resize_file(segment, end_offsets[6] + 3);
  why.clear();
  CHECK(log->read(0, 100, &why).size() == 7);
  CHECK(why.find("ends at offset " + std::to_string(end_offsets[6]) + ", before its") != std::string::npos);
  std::filesystem::resize_file(segment, end_offsets[5] + 12);
  why.clear();
  CHECK(log->read(0, 100, &why).size() == 6);
  CHECK(why.find("ends inside the frame at offset " + std::to_string(end_offsets[5])) != std::string::npos);
  // Gone.
  std::filesystem::remove(segment);
  why.clear();
  CHECK(log->read(0, 100, &why).empty());
  CHECK(why == "event log segment-00000000000000000000.log unreadable: No such file or directory");
}

TEST_CASE("resuming inside a segment's first transaction, from the file: exactly after that event") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.memory_bytes = 1;   // the lookup goes to the file
  o.fsync = false;
  auto log = event_log::open(o, error);
  REQUIRE(log);
  txn_builder b;
  protocol::transaction_info t1, t2;
  b.append(*log, 0x100, 5, t1);
  b.append(*log, 0x200, 2, t2);
  REQUIRE(log->sync());
  REQUIRE(log->tail().size() == 1);
  for (std::uint32_t i = 0; i < 5; ++i) CHECK(log->seq_after({lsn{0x100}, i}) == i + 1);
  CHECK(log->seq_after({lsn{0x200}, 0}) == 6);
  CHECK(log->seq_after({lsn{0x80}, 0}) == 0);   // before the first event of a log that dropped nothing
}

TEST_CASE("a segment roll syncs the full segment and the directory on the sync job, not on the spot") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.segment_bytes = 256;   // every transaction after the first rolls
  auto log = event_log::open(o, error);
  REQUIRE(log);
  REQUIRE(log->sync());    // the first segment's directory entry
  txn_builder b;
  protocol::transaction_info t1, t2;
  b.append(*log, 0x100, 5, t1);
  REQUIRE(log->sync());
  CHECK(log->durable_lsn().value == 0x108);
  b.append(*log, 0x200, 5, t2);   // rolls: the first segment is written, its sync is pending
  CHECK(std::distance(std::filesystem::directory_iterator(d.path), {}) == 3);   // FORMAT + 2 segments
  CHECK(log->dirty());
  auto job = log->begin_sync();
  REQUIRE(job.fd >= 0);
  CHECK(job.before.size() == 2);   // the rolled segment, then the directory
  CHECK(log->durable_lsn().value == 0x108);
  event_log::run_sync_job(job);
  CHECK(job.error == 0);
  REQUIRE(log->end_sync(job));
  CHECK(log->durable_lsn().value == 0x208);
  CHECK_FALSE(log->dirty());
  log.reset();
  auto again = event_log::open(o, error);
  REQUIRE(again);
  CHECK(again->next_seq() == 10);
}

TEST_CASE("a record of megabytes: written from where it is made, read back from the file and after a restart; it stays in the tail past its transaction") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.memory_bytes = 64 * 1024;   // far smaller than the record
  o.fsync = false;
  const std::string big(3u << 20, 'v');   // 3 MiB: past the 1 MiB written straight to the file
  pg::cached_relation rel;
  rel.oid = 1;
  rel.nspname = "public";
  rel.relname = "items";
  rel.columns = {{"v", 25, -1, false}};
  std::vector<pg::tuple_column> big_row{{pg::column_kind::text, protocol::as_bytes(big)}};
  const std::string small = "small";
  std::vector<pg::tuple_column> small_row{{pg::column_kind::text, protocol::as_bytes(small)}};
  auto change = [&](const protocol::transaction_info& t, std::uint32_t index, const std::vector<pg::tuple_column>& row) {
    transform::change c;
    c.txn = &t;
    c.kind = transform::op::insert;
    c.index = index;
    c.change_lsn = t.commit_lsn;
    c.relation = &rel;
    c.after = row;
    return c;
  };
  std::string big_record;
  {
    auto log = event_log::open(o, error);
    REQUIRE_MESSAGE(log, error);
    protocol::transaction_info t;
    t.commit_lsn = lsn{0x1000};
    t.end_lsn = lsn{0x1008};
    // One transaction: the big row, then small ones after it (which push the tail past its
    // bound): the big one is still in memory at the commit, and for a while after it.
    std::vector<transform::change> changes{change(t, 0, big_row)};
    for (std::uint32_t i = 1; i <= 3; ++i) changes.push_back(change(t, i, small_row));
    REQUIRE(log->append(t, changes));
    REQUIRE(log->sync());
    REQUIRE(log->tail().size() == 4);
    CHECK(log->tail().front()->seq == 0);
    big_record = log->tail().front()->record;
    protocol::transaction_info t2;
    t2.commit_lsn = lsn{0x2000};
    t2.end_lsn = lsn{0x2008};
    REQUIRE(log->append(t2, {change(t2, 0, small_row)}));
    REQUIRE(log->sync());
    CHECK(log->tail().front()->seq == 0);   // (within its 5 s)
    auto v = transform::read_record(protocol::as_bytes(big_record));
    REQUIRE(v);
    REQUIRE((*v)->get().after.size() == 1);
    CHECK(protocol::as_string_view((*v)->get().after[0].value) == big);
  }
  // After a restart: the frame written straight to the file passes its checksum and reads back.
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  CHECK(log->visible_seq() == 5);
  std::string why;
  auto first = log->read(0, 100, &why);
  CHECK(why.empty());
  REQUIRE(first.size() == 1);   // (reads from the file are bounded in bytes: the big one alone)
  CHECK(first[0]->record == big_record);
  CHECK(first[0]->id == (transform::event_id{lsn{0x1000}, 0}));
  auto rest = log->read(1, 100, &why);
  CHECK(why.empty());
  REQUIRE(rest.size() == 4);
  CHECK(rest.back()->id == (transform::event_id{lsn{0x2000}, 0}));
}

TEST_CASE("events added without the memory tail: from the file once committed, the tail again after them, gone on abort") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.fsync = false;
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  txn_builder b;
  protocol::transaction_info t1, bulk, t3, t4;
  REQUIRE(b.append(*log, 0x100, 3, t1));
  CHECK(log->tail().size() == 3);   // held, not yet in the file
  // Records made elsewhere (as the initial snapshot's copying threads make them).
  bulk.commit_lsn = lsn{0x200};
  bulk.end_lsn = lsn{0x200};
  std::vector<std::string> records;
  for (std::uint32_t i = 0; i < 5; ++i) records.push_back(b.read_record(bulk, "row" + std::to_string(i), i));
  REQUIRE(log->begin(lsn{0x200}));
  for (std::uint32_t i = 0; i < 5; ++i)
    log->add_record(records[i], {lsn{0x200}, i}, transform::op::read, 0, "public", "items", false);
  CHECK(log->tail().empty());          // the held events went to the file first
  CHECK(log->read(3, 10).empty());     // not visible before the commit
  log->commit(lsn{0x200}, lsn{0x200});
  CHECK(log->error().empty());
  auto all = log->read(0, 100);
  REQUIRE(all.size() == 8);
  for (std::size_t i = 0; i < 8; ++i) CHECK(all[i]->seq == i);
  CHECK(all[2]->id.to_string() == "0/100:2");
  for (std::uint32_t i = 0; i < 5; ++i) {
    CHECK(all[3 + i]->id == transform::event_id{lsn{0x200}, i});
    CHECK(all[3 + i]->record == records[i]);
    CHECK(all[3 + i]->kind == transform::op::read);
    CHECK(all[3 + i]->table == "items");
  }
  all.clear();
  // The tail starts again after them: the next transaction is read from memory, at its seqs.
  REQUIRE(b.append(*log, 0x300, 2, t3));
  REQUIRE(log->tail().size() == 2);
  auto next = log->read(8, 10);
  REQUIRE(next.size() == 2);
  CHECK(next[0] == log->tail().front());
  CHECK(next[0]->seq == 8);
  CHECK(next[1]->id.to_string() == "0/300:1");
  // Cut off before its commit: nothing of it stays, and its seqs are used again.
  REQUIRE(log->begin(lsn{0x400}));
  log->add_record(records[0], {lsn{0x400}, 0}, transform::op::read, 0, "public", "items", false);
  log->add_record(records[1], {lsn{0x400}, 1}, transform::op::read, 0, "public", "items", false);
  log->abort();
  REQUIRE(b.append(*log, 0x400, 1, t4));
  auto last = log->read(10, 10);
  REQUIRE(last.size() == 1);
  CHECK(last[0]->id.to_string() == "0/400:0");
  CHECK(last[0]->kind == transform::op::insert);
  auto resumed = log->resume_after({lsn{0x200}, 2});
  REQUIRE(resumed.seq);
  CHECK(*resumed.seq == 6);
  // And after a restart, all of it from the file.
  REQUIRE(log->sync());
  log.reset();
  log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  auto again = log->read(0, 100);
  REQUIRE(again.size() == 11);
  for (std::uint32_t i = 0; i < 5; ++i) CHECK(again[3 + i]->record == records[i]);
  CHECK(again[10]->id.to_string() == "0/400:0");
}

TEST_CASE("a record of megabytes added without hold: written at once as large records are, read back") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.fsync = false;
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  txn_builder b;
  protocol::transaction_info bulk;
  bulk.commit_lsn = lsn{0x300};
  bulk.end_lsn = lsn{0x300};
  const std::string big(3u << 20, 'v');
  const std::vector<std::string> records{b.read_record(bulk, "s", 0), b.read_record(bulk, big, 1), b.read_record(bulk, "s", 2)};
  REQUIRE(log->begin(lsn{0x300}));
  log->add_record(records[0], {lsn{0x300}, 0}, transform::op::read, 0, "public", "items", false);
  log->add_record(records[1], {lsn{0x300}, 1}, transform::op::read, 0, "public", "items", false);
  REQUIRE(log->tail().size() == 1);   // the large one, written at once and held as large events are
  CHECK(log->tail().front()->seq == 1);
  log->add_record(records[2], {lsn{0x300}, 2}, transform::op::read, 0, "public", "items", false);
  CHECK(log->tail().empty());   // until the next one not held: the tail starts again after it
  log->commit(lsn{0x300}, lsn{0x300});
  REQUIRE(log->error().empty());
  // All of it from the file.
  std::vector<event_ptr> all;
  for (std::uint64_t seq = 0; seq < 3 && all.size() == seq;) {
    auto got = log->read(seq, 10);
    REQUIRE_FALSE(got.empty());
    for (auto& e : got) all.push_back(e);
    seq = all.size();
  }
  REQUIRE(all.size() == 3);
  for (std::uint32_t i = 0; i < 3; ++i) {
    CHECK(all[i]->seq == i);
    CHECK(all[i]->record == records[i]);
  }
  REQUIRE(log->sync());
  log.reset();
  log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  std::vector<event_ptr> again;
  while (again.size() < 3) {
    auto got = log->read(again.size(), 10);
    REQUIRE_FALSE(got.empty());
    for (auto& e : got) again.push_back(e);
  }
  CHECK(again[1]->record == records[1]);
  CHECK(again[2]->record == records[2]);
}

TEST_CASE("a transaction's last event knows where its commit ends: from memory, from the file past a read's limit, after a restart") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.memory_bytes = 1 << 20;
  o.fsync = false;
  auto ends = [](const std::vector<event_ptr>& events) {
    std::vector<std::uint64_t> out;
    for (const auto& e : events) out.push_back(e->txn_end.value);
    return out;
  };
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    txn_builder b;
    protocol::transaction_info t1, t2;
    REQUIRE(b.append(*log, 0x100, 3, t1));   // (ends at 0x108)
    REQUIRE(b.append(*log, 0x200, 2, t2));   // (ends at 0x208)
    // From the memory tail: set at the commit, on the last event only.
    CHECK(ends(log->read(0, 10)) == std::vector<std::uint64_t>{0, 0, 0x108, 0, 0x208});
    REQUIRE(log->sync());
  }
  // After a restart, from the file: a read that stops at its limit right after a transaction's
  // last event still reads that transaction's end frame; one that stops inside does not invent it.
  o.memory_bytes = 1;
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  CHECK(ends(log->read(0, 3)) == std::vector<std::uint64_t>{0, 0, 0x108});
  CHECK(ends(log->read(0, 2)) == std::vector<std::uint64_t>{0, 0});
  CHECK(ends(log->read(1, 10)) == std::vector<std::uint64_t>{0, 0x108, 0, 0x208});
  CHECK(ends(log->read(4, 1)) == std::vector<std::uint64_t>{0x208});
}

TEST_CASE("a transaction of one record of megabytes: its end known when read from the file directly and in the background") {
  temp_dir d;
  std::string error;
  log_options o;
  o.dir = d.path;
  o.memory_bytes = 64 * 1024;
  o.fsync = false;
  const std::string big(3u << 20, 'v');   // (past the 1 MiB written straight to the file and read alone)
  pg::cached_relation rel;
  rel.oid = 1;
  rel.nspname = "public";
  rel.relname = "items";
  rel.columns = {{"v", 25, -1, false}};
  std::vector<pg::tuple_column> row{{pg::column_kind::text, protocol::as_bytes(big)}};
  {
    auto log = event_log::open(o, error);
    REQUIRE_MESSAGE(log, error);
    for (std::uint64_t i = 0; i < 2; ++i) {
      protocol::transaction_info t;
      t.commit_lsn = lsn{0x1000 * (i + 1)};
      t.end_lsn = lsn{0x1000 * (i + 1) + 0x30};
      transform::change c;
      c.txn = &t;
      c.kind = transform::op::insert;
      c.change_lsn = t.commit_lsn;
      c.relation = &rel;
      c.after = row;
      REQUIRE(log->append(t, {c}));
      REQUIRE(log->sync());
    }
  }
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  REQUIRE(log->visible_seq() == 2);
  auto direct = log->read(0, 10);
  REQUIRE(direct.size() == 1);   // (a large record is read alone)
  CHECK(direct[0]->txn_end == lsn{0x1030});
  direct.clear();
  // In the background (the reader thread's blocks, run here at once): the same, for each of the two.
  std::vector<std::pair<std::function<void()>, std::function<void()>>> jobs;
  log->set_background([&jobs](std::function<void()> work, std::function<void()> done) { jobs.emplace_back(work, done); });
  for (std::uint64_t seq = 0; seq < 2; ++seq) {
    std::vector<event_ptr> got;
    bool went_to_background = false;
    for (int tries = 0; tries < 10 && got.empty(); ++tries) {
      bool fetching = false;
      std::string e;
      got = log->read(seq, 10, 1 << 20, &e, &fetching);
      went_to_background = went_to_background || fetching;
      auto run = std::move(jobs);
      jobs.clear();
      for (auto& [work, done] : run) {
        work();
        done();
      }
    }
    REQUIRE(!got.empty());
    // (the block reader's path, not the direct one: seq 1's block is read ahead while seq 0's is
    // taken, so it is there at once)
    CHECK((went_to_background || seq == 1));
    CHECK(got[0]->seq == seq);
    CHECK(got[0]->txn_end == lsn{0x1000 * (seq + 1) + 0x30});
  }
}
