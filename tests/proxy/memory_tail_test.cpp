// The event log's memory tail on its own: the budget, what may not leave it (not yet written,
// lingering large events), encodings counted, a cut-off transaction dropped, and events out of
// it shared while a reader holds them.
#include "walgate/proxy/memory_tail.hpp"
#include "walgate/proxy/event_log.hpp"
#include "walgate/proxy/sync_scheduler.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "temp_dir.hpp"

#include <doctest/doctest.h>

#include <filesystem>

using namespace walgate;
using namespace walgate::proxy;

namespace {
std::shared_ptr<logged_event> event(std::uint64_t seq, std::size_t record_bytes, std::uint64_t end_offset) {
  auto e = std::make_shared<logged_event>();
  e->seq = seq;
  e->id = transform::event_id{protocol::lsn{0x100 + seq}, 0};
  e->record.assign(record_bytes, 'x');
  e->end_offset = end_offset;
  return e;
}
}  // namespace

TEST_CASE("memory tail: the budget, and what stays past it") {
  // (a budget of half the events' records: over it whatever an event's fixed size is)
  memory_tail t(5'000);
  for (std::uint64_t i = 0; i < 10; ++i) t.push(event(i, 1000, (i + 1) * 1000));
  CHECK(t.bytes() > 10'000);
  t.evict(3000);   // only what is in the file may go: events ending at or before 3000
  REQUIRE(!t.empty());
  CHECK(t.events().front()->seq == 3);
  t.evict(100'000);
  CHECK(t.bytes() <= 5'000);
  CHECK(t.events().back()->seq == 9);
  const auto first = t.events().front()->seq;
  // An encoding cached on an event in it counts, and may push the oldest out.
  auto newest = t.events().back();
  CHECK(t.account(*newest, 5000));
  t.evict(100'000);
  CHECK(t.events().front()->seq > first);
  CHECK(t.bytes() <= 5'000 + 5000);
  // One not in it is not counted.
  auto outside = event(99, 10, 0);
  CHECK_FALSE(t.account(*outside, 5000));
}

TEST_CASE("memory tail: a large event lingers until 5 s after its commit; a cut-off one is dropped") {
  memory_tail t(1u << 20);   // 1 MiB: an event of 1 MiB or more is larger than half of it
  t.push(event(0, 100, 100));
  t.push(event(1, 2u << 20, (2u << 20) + 100));
  t.push(event(2, 100, (2u << 20) + 200));
  t.evict(UINT64_MAX);
  CHECK(t.events().front()->seq == 1);   // the small one before it went; the large one stays
  t.committed();                          // its 5 s start now: still there
  t.evict(UINT64_MAX);
  CHECK(t.events().front()->seq == 1);
  t.drop_from(1);   // the transaction was cut off (a reconnect): it and what follows go
  CHECK(t.events().size() == 0);
  CHECK(t.bytes() == 0);
}

TEST_CASE("memory tail: reads from it, and events out of it that a reader still holds") {
  memory_tail t(3000);
  for (std::uint64_t i = 0; i < 8; ++i) t.push(event(i, 1000, (i + 1) * 1000));
  std::vector<event_ptr> held(t.events().begin(), t.events().end());   // a reader is sending them all
  t.evict(UINT64_MAX);
  const auto front = t.events().front()->seq;
  REQUIRE(front > 2);
  // Out of the tail but held: shared, not read again, and the tail after them.
  auto r = t.read(1, 100);
  REQUIRE(r.size() == 7);
  for (std::size_t i = 0; i < r.size(); ++i) CHECK(r[i] == held[1 + i]);
  // A gap (an event nobody holds) ends what memory gives.
  held[2].reset();
  r.clear();
  auto upto = t.read(1, 100);
  REQUIRE(upto.size() == 1);
  CHECK(upto[0]->seq == 1);
  upto.clear();
  held.clear();
  CHECK(t.read(1, 10).empty());   // nobody holds them: not in memory any more
  CHECK(t.read(0, 10).empty());
  CHECK(t.read(front, 2).size() == 2);
}

TEST_CASE("sync scheduler: commits within the interval share one fdatasync; the durable position moves after it") {
  test::temp_dir dir("walgate-sync");
  {
    log_options o;
    o.dir = dir.path;
    std::string error;
    auto log = event_log::open(o, error);
    REQUIRE_MESSAGE(log, error);
    std::atomic<int> syncs{0};
    event_log::set_sync_observer([&](int) { ++syncs; });
    boost::asio::io_context io;
    sync_scheduler s(io.get_executor(), *log, std::chrono::milliseconds(50));
    bool failed = false;
    s.on_failure([&] { failed = true; }, [] { return false; });
    protocol::transaction_info txn[3];
    for (int i = 0; i < 3; ++i) {
      txn[i].commit_lsn = protocol::lsn{0x1000u + 0x100u * i};
      txn[i].end_lsn = protocol::lsn{0x1008u + 0x100u * i};
      REQUIRE(log->append(txn[i], {}));
      s.schedule();
    }
    CHECK_FALSE(log->durable_lsn().valid());   // nothing synced yet
    // The timer, the job on the sync thread, its end on the loop (the loop kept running, as it
    // is by its sockets in walgate).
    auto guard = boost::asio::make_work_guard(io);
    for (int i = 0; i < 500 && log->durable_lsn() != txn[2].end_lsn && !failed; ++i)
      io.run_one_for(std::chrono::milliseconds(10));
    CHECK_FALSE(failed);
    CHECK(log->durable_lsn() == txn[2].end_lsn);
    CHECK(syncs.load() >= 1);
    CHECK(syncs.load() <= 3);   // one job: the segment (and, at most, its file and directory once)
    event_log::set_sync_observer({});
  }
}

TEST_CASE("sync scheduler: on_durable says each advance of the durable position, once") {
  test::temp_dir dir("walgate-sync-durable");
  log_options o;
  o.dir = dir.path;
  std::string error;
  auto log = event_log::open(o, error);
  REQUIRE_MESSAGE(log, error);
  int durable_calls = 0;
  auto h = log->on_durable([&] { ++durable_calls; });
  boost::asio::io_context io;
  auto guard = boost::asio::make_work_guard(io);
  sync_scheduler s(io.get_executor(), *log, std::chrono::milliseconds(20));
  s.on_failure([] { FAIL("a sync failed"); }, [] { return false; });
  auto commit = [&](unsigned i) {
    protocol::transaction_info t;
    t.commit_lsn = protocol::lsn{0x1000u + 0x100u * i};
    t.end_lsn = protocol::lsn{0x1008u + 0x100u * i};
    REQUIRE(log->append(t, {}));
    s.schedule();
    return t.end_lsn;
  };
  auto run_until = [&](protocol::lsn l) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (log->durable_lsn() != l && std::chrono::steady_clock::now() < until) io.run_one_for(std::chrono::milliseconds(10));
    return log->durable_lsn() == l;
  };
  CHECK(durable_calls == 0);
  CHECK(run_until(commit(0)));
  CHECK(durable_calls == 1);
  CHECK(run_until(commit(1)));
  CHECK(durable_calls == 2);
  REQUIRE(log->sync());   // nothing new: no notification
  CHECK(durable_calls == 2);
  log->remove_listener(h);
}
