// The subscription without sockets: a real event log in a temporary directory, read the way a
// transport reads it (next_batch, delivered), with every close reason and limit.
#include "walgate/proxy/event_log.hpp"
#include "walgate/proxy/policy.hpp"
#include "walgate/proxy/subscription.hpp"

#include "encoded_log.hpp"
#include "temp_dir.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

using namespace walgate;
using namespace walgate::proxy;
namespace pg = walgate::protocol::pgoutput;
using protocol::lsn;

namespace {

/// The log's segment file (these tests' logs have one).
std::filesystem::path only_segment(const std::filesystem::path& dir) {
  std::filesystem::path seg;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("segment-", 0) == 0) seg = e.path();
  REQUIRE(!seg.empty());
  return seg;
}

/// Changes a byte of a file behind the log's back.
void damage(const std::filesystem::path& file, std::size_t offset, char byte) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(byte);
}

/// What the gateway does with a thread, run when the test says: work() on a real thread, and
/// done() as the test's "event loop"; then both are gone, as asio leaves them.
struct manual_background {
  std::vector<std::pair<std::function<void()>, std::function<void()>>> jobs;
  explicit manual_background(event_log& log) {
    log.set_background([this](std::function<void()> work, std::function<void()> done) { jobs.emplace_back(work, done); });
  }
  void run(std::size_t i) {
    std::thread worker(jobs[i].first);
    worker.join();
    auto done = std::move(jobs[i].second);
    jobs[i] = {};
    done();
  }
  /// Runs the oldest job not run yet; false when there is none.
  bool run_next() {
    for (std::size_t i = 0; i < jobs.size(); ++i)
      if (jobs[i].second) {
        run(i);
        return true;
      }
    return false;
  }
};

/// Transactions of rows into two tables (public.a, other.b), inserts or deletes.
struct writer {
  pg::cached_relation a, b;
  std::deque<std::string> values;
  std::deque<std::vector<pg::tuple_column>> rows;
  std::deque<protocol::transaction_info> txns;
  std::uint64_t next_lsn = 0x1000;
  std::uint32_t xid = 0;   // set: each transaction has the next xid (0: none, as the other tests)
  writer() {
    a.oid = 1;
    a.nspname = "public";
    a.relname = "a";
    a.columns = {{"id", 23, -1, true}};
    b = a;
    b.oid = 2;
    b.nspname = "other";
    b.relname = "b";
  }
  /// One transaction of n changes to rel (op kind), each value `width` bytes long.
  /// One transaction of one insert into each relation given, in that order.
  void mixed(event_log& log, std::vector<pg::cached_relation*> rels) {
    auto& t = txns.emplace_back();
    t.commit_lsn = lsn{next_lsn};
    t.end_lsn = lsn{next_lsn + 8};
    t.xid = xid ? xid++ : 0;
    next_lsn += 0x100;
    std::vector<transform::change> changes;
    for (std::size_t i = 0; i < rels.size(); ++i) {
      values.push_back(std::to_string(t.commit_lsn.value + i));
      rows.push_back({{pg::column_kind::text, protocol::as_bytes(values.back())}});
      transform::change c;
      c.txn = &t;
      c.index = static_cast<std::uint32_t>(i);
      c.change_lsn = lsn{t.commit_lsn.value - 1};
      c.relation = rels[i];
      c.after = rows.back();
      changes.push_back(c);
    }
    REQUIRE(log.append(t, changes));
    REQUIRE(log.sync());
  }
  /// One transaction of a transactional logical message alone (its content: the prefix).
  std::deque<pg::message> messages;
  void message(event_log& log, const std::string& prefix) {
    auto& t = txns.emplace_back();
    t.xid = xid ? xid++ : 0;
    t.commit_lsn = lsn{next_lsn};
    t.end_lsn = lsn{next_lsn + 8};
    next_lsn += 0x100;
    values.push_back(prefix);
    auto& m = messages.emplace_back();
    m.xid = t.xid;
    m.transactional = true;
    m.message_lsn = lsn{t.commit_lsn.value - 1};
    m.prefix = values.back();
    m.content = protocol::as_bytes(values.back());
    transform::change c;
    c.kind = transform::op::message;
    c.txn = &t;
    c.change_lsn = m.message_lsn;
    c.message = &m;
    REQUIRE(log.append(t, {c}));
    REQUIRE(log.sync());
  }
  void txn(event_log& log, pg::cached_relation& rel, int n, transform::op kind = transform::op::insert,
           std::size_t width = 4) {
    auto& t = txns.emplace_back();
    t.xid = xid ? xid++ : 0;
    t.commit_lsn = lsn{next_lsn};
    t.end_lsn = lsn{next_lsn + 8};
    next_lsn += 0x100;
    std::vector<transform::change> changes;
    for (int i = 0; i < n; ++i) {
      std::string v = std::to_string(t.commit_lsn.value + i);
      v.resize(std::max(width, v.size()), '0');
      values.push_back(v);
      rows.push_back({{pg::column_kind::text, protocol::as_bytes(values.back())}});
      transform::change c;
      c.txn = &t;
      c.kind = kind;
      c.index = static_cast<std::uint32_t>(i);
      c.change_lsn = lsn{t.commit_lsn.value - 1};
      c.relation = &rel;
      if (kind == transform::op::delete_) {
        c.before_kind = 'K';
        c.before = rows.back();
      } else {
        c.after = rows.back();
      }
      changes.push_back(c);
    }
    REQUIRE(log.append(t, changes));
    REQUIRE(log.sync());
  }
};

struct fixture : test::encoded_log {
  writer w;
  explicit fixture(log_options o = {}) : encoded_log("walgate-sub", o) {}
  stream_request request(std::string_view query) {
    request_error err;
    auto r = parse_stream_query(query, err);
    REQUIRE_MESSAGE(r, err.message);
    return *r;
  }
};

/// Everything the subscription has now, batch by batch: (ids, bytes) per batch.
std::vector<std::vector<subscription::item>> drain(subscription& s) {
  std::vector<std::vector<subscription::item>> out;
  std::vector<subscription::item> batch;
  while (true) {
    s.next_batch(batch);
    if (batch.empty()) break;
    s.delivered(batch.back());
    out.push_back(batch);
  }
  return out;
}

std::vector<std::string> ids(const std::vector<std::vector<subscription::item>>& batches) {
  std::vector<std::string> out;
  for (const auto& b : batches)
    for (const auto& i : b) out.push_back(i.id.to_string());
  return out;
}

std::string text(const subscription::item& i) { return std::string(i.bytes->bytes()); }

/// A subscription resumed from the request's from= as the server starts one (resume_after, then
/// resume_in_transaction), drained.
std::vector<std::vector<subscription::item>> drain_resumed(fixture& f, const std::string& query, subscription::limits l = {}) {
  auto r = f.request(query);
  auto rp = f.log->resume_after(*r.from);
  REQUIRE(rp.seq);
  std::uint64_t seq = *rp.seq;
  std::optional<transform::event_id> skip;
  resume_in_transaction(*f.log, r, seq, skip);
  subscription s(*f.log, *f.enc, r, seq, skip, l);
  return drain(s);
}

}  // namespace

TEST_CASE("subscription: table and op filters, resume id, eager encodings for unfiltered readers") {
  fixture f;
  subscription all(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, {});
  subscription only_b(*f.log, *f.enc, f.request("/v1/stream?tables=other.*&format=wal2json"), 0, std::nullopt, {});
  subscription deletes(*f.log, *f.enc, f.request("/v1/stream?ops=delete"), 0, std::nullopt, {});
  CHECK(all.unfiltered());
  CHECK_FALSE(only_b.unfiltered());
  f.w.txn(*f.log, f.w.a, 2);
  f.w.txn(*f.log, f.w.b, 1);
  f.w.txn(*f.log, f.w.a, 1, transform::op::delete_);
  // The unfiltered native reader's encoding was made as each event was logged; wal2json only
  // when asked for.
  CHECK(made_encoding(*f.log->tail().front(), encoding::native));
  CHECK_FALSE(made_encoding(*f.log->tail().front(), encoding::wal2json));

  CHECK(ids(drain(all)) == std::vector<std::string>{"0/1000:0", "0/1000:1", "0/1100:0", "0/1200:0"});
  CHECK(all.resume_id() == "0/1200:0");
  CHECK(all.live());
  auto b = drain(only_b);
  REQUIRE(ids(b) == std::vector<std::string>{"0/1100:0"});
  CHECK(text(b[0][0]).find("\"table\":\"b\"") != std::string::npos);   // wal2json, as asked
  CHECK(ids(drain(deletes)) == std::vector<std::string>{"0/1200:0"});
  // What the encodings hold (made as the events were logged, and on demand) is counted in the
  // memory tail as it is made: each event's count there is its memory().
  for (const auto& e : f.log->tail()) CHECK(e->accounted == e->memory());
  // Nothing new: an empty batch, and still open.
  std::vector<subscription::item> batch;
  all.next_batch(batch);
  CHECK(batch.empty());
  CHECK_FALSE(all.ended());
  CHECK(all.lag_events() == 0);
  f.w.txn(*f.log, f.w.b, 3);
  CHECK(all.lag_events() == 3);
  CHECK(all.lag_bytes() > 0);
  CHECK(ids(drain(all)).size() == 3);
  CHECK(all.lag_bytes() == 0);
}

TEST_CASE("encodings: every format has its encoding and every encoding its format, by a table") {
  for (auto fmt : transform::all_formats) {
    CAPTURE(transform::to_string(fmt));
    const encoding_spec* s = spec_of(encoding_of(fmt, false));
    REQUIRE(s);
    CHECK(s->fmt == fmt);
    CHECK_FALSE(s->compact);
    CHECK_FALSE(s->include_schema);
  }
  CHECK(encoding_of(transform::format::pgoutput2json, true) == encoding::pgoutput2json_compact);
  CHECK(encoding_of(transform::format::debezium, true) == encoding::debezium);   // (no compact mode: its one)
  REQUIRE(spec_of(encoding::pgoutput2json_schema));
  CHECK(spec_of(encoding::pgoutput2json_schema)->fmt == transform::format::pgoutput2json);
  CHECK(spec_of(encoding::pgoutput2json_schema)->compact);
  CHECK(spec_of(encoding::pgoutput2json_schema)->include_schema);
  CHECK_FALSE(spec_of(encoding::count_));
  fixture f;
  CHECK(encoding_for(f.request("/v1/stream?format=wal2json")) == encoding::wal2json);
  CHECK(encoding_for(f.request("/v1/stream?format=pgoutput2json&compact=true")) == encoding::pgoutput2json_compact);
  CHECK(encoding_for(f.request("/v1/stream")) == encoding::native);
}

TEST_CASE("subscription: a costly where= that matches nothing does bounded work per call, and gets through") {
  fixture f;
  for (int i = 0; i < 50; ++i) f.w.txn(*f.log, f.w.a, 100);   // 5,000 events
  std::string list = "id%20in%20(";
  for (int i = 1; i <= 500; ++i) list += (i > 1 ? "," : "") + std::to_string(-i);
  list += ")";
  subscription s(*f.log, *f.enc, f.request("/v1/stream?from=0/0:0&where=" + list), 0, std::nullopt, {});
  std::vector<subscription::item> batch;
  s.next_batch(batch);
  CHECK(batch.empty());
  CHECK(s.pending());   // its work ran out, more to look at: the transport lets others run first
  int calls = 1;
  while (s.pending() && calls < 10'000) {
    s.next_batch(batch);
    CHECK(batch.empty());
    ++calls;
  }
  CHECK_FALSE(s.pending());
  CHECK_FALSE(s.ended());
  // 501 per event (the predicate's 500 items and the event), 32,768 a call: at most 65 events a
  // call, where the old bound was 8 reads of 512.
  CHECK(calls >= 5000 / 66);
  MESSAGE("5,000 events through a 500-item where=: " << calls << " calls");
  // And where= past the bound is refused (its cost: comparisons and list items).
  std::string big = "id%20in%20(";
  for (int i = 1; i <= 600; ++i) big += (i > 1 ? "," : "") + std::to_string(i);
  big += ")";
  request_error err;
  CHECK_FALSE(parse_stream_query("/v1/stream?where=" + big, err));
  CHECK(err.parameter == "where");
  CHECK_MESSAGE(err.message.find("where is too complex: 601 comparisons and list items, at most 512") != std::string::npos,
                err.message);
}

TEST_CASE("subscription: a batch ends at its byte budget or its event count, from memory and from disk") {
  log_options o;
  o.memory_bytes = 64 * 1024;   // most of the log is read back from disk
  fixture f(o);
  for (int i = 0; i < 40; ++i) f.w.txn(*f.log, f.w.a, 50, transform::op::insert, 100);   // 2,000 events
  subscription::limits l;
  l.batch_bytes = 16 * 1024;
  l.batch_events = 100;
  subscription s(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, l);
  auto batches = drain(s);
  std::size_t events = 0;
  for (const auto& b : batches) {
    std::size_t bytes = 0;
    for (const auto& i : b) bytes += i.bytes->size();
    CHECK(b.size() <= l.batch_events);
    // At most one event past the budget (the one that reached it).
    CHECK(bytes - b.back().bytes->size() < l.batch_bytes);
    events += b.size();
  }
  CHECK(events == 2000);
  CHECK(batches.size() >= 2000 * 200 / l.batch_bytes);   // the budget, not the count, ended most
  // Every event once, in order.
  auto all = ids(batches);
  CHECK(std::adjacent_find(all.begin(), all.end(), [](const auto& x, const auto& y) {
          return !(*transform::event_id::parse(x) < *transform::event_id::parse(y));
        }) == all.end());
  // Counted by events too.
  subscription::limits few;
  few.batch_events = 7;
  subscription t(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, few);
  std::vector<subscription::item> batch;
  t.next_batch(batch);
  CHECK(batch.size() == 7);
}

TEST_CASE("subscription: resume positions from every id, and an id past the head skips what it saw") {
  log_options o;
  // Not so small that a 3 MiB event lingers in it (then everything after it would stay): the
  // first two large events and what is around them are found on disk.
  o.memory_bytes = 7u << 20;
  fixture f(o);
  // Small and larger events, so that the index has entries by count and by bytes, and records
  // of more than 1 MiB (an entry of their own and one after them).
  for (int i = 0; i < 30; ++i) {
    f.w.txn(*f.log, f.w.a, 40, transform::op::insert, i % 3 == 0 ? 9000 : 10);
    if (i % 10 == 4) f.w.txn(*f.log, f.w.a, 1, transform::op::insert, 3u << 20);
    if (i == 20) f.w.txn(*f.log, f.w.a, 2, transform::op::insert, 3u << 20);
  }
  std::vector<std::string> every;
  {
    subscription s(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, {});
    every = ids(drain(s));
  }
  REQUIRE(every.size() == 1200 + 3 + 2);
  REQUIRE(f.log->tail().front()->seq > 700);   // the first two large events are only on disk
  for (std::size_t k = 0; k < every.size(); k += (k > 150 && k < 1100 ? 7 : 1)) {
    auto at = f.log->resume_after(*transform::event_id::parse(every[k]));
    REQUIRE(at.error.empty());
    REQUIRE(at.seq);
    CHECK(*at.seq == k + 1);
    subscription s(*f.log, *f.enc, f.request("/v1/stream"), *at.seq, std::nullopt, {});
    std::vector<subscription::item> batch;
    s.next_batch(batch);
    // The next event, or (after the last) nothing.
    CHECK((batch.empty() ? std::string() : batch.front().id.to_string()) ==
          (k + 1 < every.size() ? every[k + 1] : std::string()));
  }
  // An id between two of them (a transaction's index past its last event) resumes at the next,
  // a large one included.
  auto between = f.log->resume_after(transform::event_id{lsn{0x1000}, 99});
  REQUIRE(between.seq);
  CHECK(*between.seq == 40);
  for (std::size_t k = 0; k + 1 < every.size(); ++k) {
    auto id = *transform::event_id::parse(every[k]);
    auto next = *transform::event_id::parse(every[k + 1]);
    if (next.commit_lsn == id.commit_lsn) continue;   // (only ids past a transaction's last event)
    auto r = f.log->resume_after(transform::event_id{id.commit_lsn, id.index + 1000});
    REQUIRE(r.seq);
    CHECK(*r.seq == k + 1);
  }

  // Past the head: the log lost events a client saw (a crash before they were durable); the
  // server sends them again with the same ids, and this client skips them.
  auto past = transform::event_id{lsn{f.w.next_lsn}, 1};
  auto head = f.log->resume_after(past);
  REQUIRE(head.seq);
  CHECK(head.past_head);
  subscription s(*f.log, *f.enc, f.request("/v1/stream"), *head.seq, past, {});
  CHECK(s.resume_id() == past.to_string());
  f.w.txn(*f.log, f.w.a, 3);   // 0:…:0, 1 were seen; 2 is new
  auto got = ids(drain(s));
  CHECK(got == std::vector<std::string>{transform::event_id{past.commit_lsn, 2}.to_string()});

  // With transaction records: past the head at a transaction's commit, none of it again (not its
  // commit either); at an event inside one, the rest of it and its commit, no begin.
  const lsn next{f.w.next_lsn};
  const transform::event_id at_commit{next, 0, transform::event_id::mark::commit};
  const transform::event_id inside{lsn{f.w.next_lsn + 0x100}, 0};
  auto h1 = f.log->resume_after(at_commit);
  REQUIRE(h1.seq);
  CHECK(h1.past_head);
  subscription whole(*f.log, *f.enc, f.request("/v1/stream?transactions=true"), *h1.seq, at_commit, {});
  subscription part(*f.log, *f.enc, f.request("/v1/stream?transactions=true"), *h1.seq, inside, {});
  subscription grouped(*f.log, *f.enc, f.request("/v1/stream?group=transaction"), *h1.seq, at_commit, {});
  f.w.xid = 5000;              // (transactions with an xid: with records)
  f.w.txn(*f.log, f.w.a, 2);   // at `next`: seen whole
  f.w.txn(*f.log, f.w.a, 2);   // at next + 0x100: its event 0 seen
  const std::string second = lsn{f.w.next_lsn - 0x100}.to_string();
  auto w_ids = ids(drain(whole)), g_ids = ids(drain(grouped)), p_ids = ids(drain(part));
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& x : v) out += x + " ";
    return out;
  };
  INFO("whole: " << join(w_ids) << "| grouped: " << join(g_ids) << "| part: " << join(p_ids) << "| second " << second);
  CHECK(w_ids == std::vector<std::string>{second + ":B", second + ":0", second + ":1", second + ":C"});
  CHECK(g_ids == std::vector<std::string>{second + ":C"});
  CHECK(p_ids == std::vector<std::string>{second + ":1", second + ":C"});
}

TEST_CASE("subscription: close reasons — too slow, no longer retained, a damaged log, closed by the transport") {
  SUBCASE("slow: a live reader further behind than its lag bound") {
    fixture f;
    subscription::limits l;
    l.lag_bytes = 4096;
    subscription s(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, l);
    f.w.txn(*f.log, f.w.a, 1);
    drain(s);
    REQUIRE(s.live());
    for (int i = 0; i < 20; ++i) f.w.txn(*f.log, f.w.a, 10, transform::op::insert, 50);
    std::vector<subscription::item> batch;
    s.next_batch(batch);
    CHECK(batch.empty());
    CHECK(s.why() == subscription::end::slow);
    CHECK(s.reason().find("slow client") == 0);
    CHECK(s.resume_id() == "0/1000:0");
  }
  SUBCASE("one large transaction is not lag") {
    fixture f;
    subscription::limits l;
    l.lag_bytes = 4096;
    l.batch_events = 10;
    subscription s(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, l);
    f.w.txn(*f.log, f.w.a, 1);
    drain(s);
    f.w.txn(*f.log, f.w.a, 500, transform::op::insert, 50);
    CHECK(ids(drain(s)).size() == 500);
    CHECK_FALSE(s.ended());
  }
  SUBCASE("no longer retained: retention dropped the position") {
    log_options o;
    o.segment_bytes = 16 * 1024;
    o.retention_bytes = 32 * 1024;
    o.memory_bytes = 8 * 1024;
    fixture f(o);
    subscription s(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, {});
    for (int i = 0; i < 40; ++i) f.w.txn(*f.log, f.w.a, 20, transform::op::insert, 100);
    REQUIRE(f.log->first_seq() > 0);
    std::vector<subscription::item> batch;
    s.next_batch(batch);
    CHECK(batch.empty());
    CHECK(s.why() == subscription::end::not_retained);
    CHECK(s.reason() == "the resume position is no longer retained; take a new snapshot");
  }
  SUBCASE("damaged: a record read back from disk fails its checksum") {
    log_options o;
    o.memory_bytes = 4 * 1024;
    fixture f(o);
    for (int i = 0; i < 20; ++i) f.w.txn(*f.log, f.w.a, 10, transform::op::insert, 100);
    damage(only_segment(f.dir.path), 20, '\x7f');   // a byte of the first frame's payload
    subscription s(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, {});
    std::vector<subscription::item> batch;
    s.next_batch(batch);
    CHECK(batch.empty());
    CHECK(s.why() == subscription::end::damaged);
    CHECK(s.reason().find("checksum") != std::string::npos);
  }
  SUBCASE("closed by its transport: the first reason stands (a shutdown replaces it), and nothing more is read") {
    fixture f;
    subscription s(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, {});
    f.w.txn(*f.log, f.w.a, 2);
    s.close(subscription::end::client_gone, "the client closed the connection");
    s.close(subscription::end::slow, "slow client: a write took too long");
    std::vector<subscription::item> batch;
    s.next_batch(batch);
    CHECK(batch.empty());
    CHECK(s.why() == subscription::end::client_gone);
    CHECK(s.reason() == "the client closed the connection");
    CHECK(s.resume_id().empty());
    s.close(subscription::end::shutdown, "server shutting down");
    CHECK(s.why() == subscription::end::shutdown);
    CHECK(s.reason() == "server shutting down");
  }
}

TEST_CASE("subscription: pgoutput2json compact sends a table's schema first and again when it changes; tombstones") {
  fixture f;
  subscription s(*f.log, *f.enc, f.request("/v1/stream?format=pgoutput2json&compact=true"), 0, std::nullopt, {});
  subscription other(*f.log, *f.enc, f.request("/v1/stream?format=pgoutput2json-compact"), 0, std::nullopt, {});
  f.w.txn(*f.log, f.w.a, 2);
  f.w.txn(*f.log, f.w.b, 1);
  auto first = drain(s);
  auto all = std::vector<subscription::item>();
  for (auto& b : first) all.insert(all.end(), b.begin(), b.end());
  REQUIRE(all.size() == 3);
  CHECK(text(all[0]).find("\"s\":[") != std::string::npos);   // first row of public.a
  CHECK(text(all[1]).find("\"s\":[") == std::string::npos);
  CHECK(text(all[2]).find("\"s\":[") != std::string::npos);   // first row of other.b
  // The same bytes for every reader that needs them: shared, not made per client.
  auto o = drain(other);
  REQUIRE(!o.empty());
  CHECK(o[0][0].bytes == all[0].bytes);
  // public.a gets a column: its schema goes again, once.
  f.w.a.columns.push_back({"note", 25, -1, false});
  f.w.txn(*f.log, f.w.a, 2);
  auto next = drain(s);
  REQUIRE(next.size() == 1);
  REQUIRE(next[0].size() == 2);
  CHECK(text(next[0][0]).find("\"note\"") != std::string::npos);
  CHECK(text(next[0][1]).find("\"s\":[") == std::string::npos);

  // Debezium tombstones: a null-valued record with the key after each delete.
  subscription d(*f.log, *f.enc, f.request("/v1/stream?format=debezium&tombstones=true&ops=delete"), 0, std::nullopt, {});
  f.w.txn(*f.log, f.w.b, 1, transform::op::delete_);
  auto del = drain(d);
  REQUIRE(del.size() == 1);
  REQUIRE(del[0].size() == 2);
  CHECK(del[0][0].id == del[0][1].id);
  CHECK(text(del[0][1]).find("\"value\":null}") != std::string::npos);
  CHECK(text(del[0][1]).rfind("{\"key\":{\"id\":", 0) == 0);
}

TEST_CASE("subscription: pgoutput2json compact with column grants — its s is of the columns shown, not sent again for a "
          "hidden column's change") {
  // Issue 32, item 12: the "s" sent again when a column the token does not see was retyped,
  // renamed or added told the client of that change (its signature was of the whole table).
  fixture f;
  std::string error;
  auto p = policy::parse("[[grant]]\ntables = [\"public.emp\"]\ncolumns = [\"id\"]\n", error);
  REQUIRE_MESSAGE(p, error);
  auto r = f.request("/v1/stream?format=pgoutput2json&compact=true");
  REQUIRE_FALSE(authorize(p->grants_for(boost::json::object{}), r));
  subscription s(*f.log, *f.enc, r, 0, std::nullopt, {});
  pg::cached_relation emp;
  emp.oid = 3;
  emp.nspname = "public";
  emp.relname = "emp";
  emp.columns = {{"id", 23, -1, true}, {"salary", 1700, -1, false}};
  std::deque<protocol::transaction_info> txns;
  std::deque<std::string> values;
  std::deque<std::vector<pg::tuple_column>> rows;
  // One transaction of one insert of (id, "1000", …) with emp's columns as they are now.
  auto insert = [&](int id) {
    auto& t = txns.emplace_back();
    t.commit_lsn = lsn{f.w.next_lsn};
    t.end_lsn = lsn{f.w.next_lsn + 8};
    f.w.next_lsn += 0x100;
    auto& row = rows.emplace_back();
    for (std::size_t i = 0; i < emp.columns.size(); ++i) {
      values.push_back(i == 0 ? std::to_string(id) : "1000");
      row.push_back({pg::column_kind::text, protocol::as_bytes(values.back())});
    }
    transform::change c;
    c.txn = &t;
    c.change_lsn = lsn{t.commit_lsn.value - 1};
    c.relation = &emp;
    c.after = row;
    REQUIRE(f.log->append(t, {c}));
    REQUIRE(f.log->sync());
  };
  auto lines = [&] {
    std::vector<std::string> out;
    for (const auto& b : drain(s))
      for (const auto& i : b) out.push_back(text(i));
    return out;
  };
  const std::string shown = R"("s":["public.emp",["id",1,23]])";
  insert(1);
  insert(2);
  auto first = lines();
  REQUIRE(first.size() == 2);
  CHECK(first[0].find(shown) != std::string::npos);   // the first row: its columns shown, only
  CHECK(first[0].find("salary") == std::string::npos);
  CHECK(first[1].find("\"s\":") == std::string::npos);
  // The hidden column retyped, then renamed, then another hidden one added: no "s" again.
  emp.columns[1].type_oid = 20;
  insert(3);
  emp.columns[1].name = "pay";
  insert(4);
  emp.columns.push_back({"note", 25, -1, false});
  insert(5);
  auto hidden = lines();
  REQUIRE(hidden.size() == 3);
  for (const auto& l : hidden) CHECK(l.find("\"s\":") == std::string::npos);
  // A shown column's change: its "s" again, once.
  emp.columns[0].type_oid = 20;
  insert(6);
  insert(7);
  auto changed = lines();
  REQUIRE(changed.size() == 2);
  CHECK(changed[0].find(R"("s":["public.emp",["id",1,20]])") != std::string::npos);
  CHECK(changed[1].find("\"s\":") == std::string::npos);
}

TEST_CASE("log_reader: tail notifications reach listeners until removed; background reads notify only theirs") {
  fixture f;
  int a = 0, b = 0, fetched = 0;
  auto ha = f.log->on_visible([&] { ++a; });
  f.log->on_visible([&] { ++b; });
  auto hf = f.log->on_fetched([&] { ++fetched; });
  f.log->announce();
  f.log->remove_listener(ha);
  f.log->announce();
  CHECK(a == 1);
  CHECK(b == 2);
  CHECK(fetched == 0);
  f.log->announce_fetched();
  CHECK(fetched == 1);
  CHECK(b == 2);
  f.log->remove_listener(hf);
  f.log->announce_fetched();
  CHECK(fetched == 1);
}

TEST_CASE("subscription: a filter passing over many events goes on until a match, a bounded amount at a time") {
  log_options o;
  o.memory_bytes = 16 * 1024;   // most of it from disk
  fixture f(o);
  for (int i = 0; i < 30; ++i) f.w.txn(*f.log, f.w.a, 100);   // 3,000 events the filter does not take
  f.w.txn(*f.log, f.w.b, 1);
  subscription::limits l;
  l.batch_events = 50;
  subscription s(*f.log, *f.enc, f.request("/v1/stream?tables=other.b"), 0, std::nullopt, l);
  std::vector<subscription::item> batch;
  int calls = 0, caught_up_too_early = 0;
  do {
    s.next_batch(batch);
    ++calls;
    // An empty batch says whether there is more to look at: never "caught up" before the match.
    caught_up_too_early += batch.empty() && !s.pending();
  } while (batch.empty() && calls < 100);
  CHECK(caught_up_too_early == 0);
  REQUIRE(batch.size() == 1);
  CHECK(batch[0].id.to_string() == f.w.txns.back().commit_lsn.to_string() + ":0");
  CHECK(calls >= 3000 / (50 * 8));   // bounded work per call: 8 reads of 50 events
  s.next_batch(batch);
  CHECK(batch.empty());
  CHECK_FALSE(s.pending());   // caught up: now wait for the log's notification
  CHECK(s.live());
}

TEST_CASE("subscription: a record of megabytes far behind is read off the event loop, then delivered") {
  log_options o;
  o.memory_bytes = 7u << 20;
  fixture f(o);
  manual_background bg(*f.log);
  auto& jobs = bg.jobs;
  int notified = 0, visible = 0;
  f.log->on_fetched([&] { ++notified; });
  f.w.txn(*f.log, f.w.a, 1);
  f.w.txn(*f.log, f.w.a, 1, transform::op::insert, 3u << 20);   // seq 1: 3 MiB
  for (int i = 0; i < 10; ++i) f.w.txn(*f.log, f.w.a, 1, transform::op::insert, 1u << 20);
  f.w.txn(*f.log, f.w.b, 1);
  REQUIRE(f.log->tail().front()->seq > 1);   // the large one is only on disk
  f.log->on_visible([&] { ++visible; });

  subscription s(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, {});
  subscription t(*f.log, *f.enc, f.request("/v1/stream"), 1, std::nullopt, {});
  std::vector<subscription::item> batch;
  s.next_batch(batch);
  CHECK(batch.empty());          // read in the background: the small event, not the large one with it
  CHECK_FALSE(s.pending());      // so: wait for the notification, do not spin
  CHECK(s.waiting());
  REQUIRE(jobs.size() == 1);
  bg.run(0);
  CHECK(notified == 1);
  CHECK(visible == 0);           // (not a notification of new events)
  s.next_batch(batch);
  REQUIRE(batch.size() == 1);
  CHECK(batch[0].id.to_string() == f.w.txns[0].commit_lsn.to_string() + ":0");
  s.delivered(batch.back());
  REQUIRE(jobs.size() == 2);     // its block read, the next one (the large record) was started
  s.next_batch(batch);
  CHECK(batch.empty());          // the large record is being read in the background
  CHECK_FALSE(s.ended());
  CHECK_FALSE(s.pending());
  t.next_batch(batch);           // another reader at the same place waits for the same read
  CHECK(batch.empty());
  CHECK_FALSE(t.pending());
  CHECK(t.waiting());            // (what the server's on_fetched wakes)
  CHECK(s.waiting());
  CHECK(jobs.size() == 2);
  CHECK(notified == 1);
  bg.run(1);                     // the read, then its completion on the loop: readers are notified
  CHECK(notified == 2);
  s.next_batch(batch);
  REQUIRE(!batch.empty());
  CHECK_FALSE(s.waiting());
  CHECK(batch[0].id.to_string() == f.w.txns[1].commit_lsn.to_string() + ":0");
  CHECK(batch[0].bytes->size() > (3u << 20));
  batch.clear();                 // (s no longer holds it either)
  t.next_batch(batch);           // the other reader woken by the same notification: the same read
  REQUIRE(!batch.empty());
  CHECK(batch[0].id.to_string() == f.w.txns[1].commit_lsn.to_string() + ":0");
  CHECK(jobs.size() == 3);       // not read again; the record after it is being read
  // Reading on reaches the end, each later large record the same way.
  auto rest = std::size_t{0};
  for (int guard = 0; guard < 100 && !s.ended(); ++guard) {
    s.next_batch(batch);
    if (!batch.empty()) {
      rest += batch.size();
      s.delivered(batch.back());
      continue;
    }
    if (s.pending()) continue;
    if (bg.run_next()) continue;
    break;
  }
  CHECK(rest == 11);
  CHECK_FALSE(s.pending());
}

TEST_CASE("subscription: far behind, the log is read in blocks off the event loop, shared by readers near each other, "
          "with their encodings made there") {
  log_options o;
  o.memory_bytes = 1;   // (the tail keeps only the newest event)
  o.segment_bytes = 1u << 20;
  fixture f(o);
  f.log->set_prepare(f.enc->preparer());
  manual_background bg(*f.log);
  // 10,000 events of about 250 bytes (their encodings large enough to be compressed), 3 segments
  for (int i = 0; i < 40; ++i) f.w.txn(*f.log, i % 3 ? f.w.a : f.w.b, 250, transform::op::insert, 200);
  REQUIRE(f.log->visible_seq() == 10000);
  REQUIRE(f.log->tail().front()->seq > 9000);

  // What the file holds, read at once (no background reader given): what every way must deliver.
  // (Copies: events a reader holds are shared from memory, and these must not be.)
  struct copy {
    transform::event_id id;
    std::string record, table;
    std::uint64_t end_offset;
  };
  std::vector<copy> expected;
  for (std::uint64_t seq = 0; seq < f.log->visible_seq();) {
    auto batch = f.log->read(seq, 1000);
    REQUIRE(!batch.empty());
    for (auto& e : batch) expected.push_back({e->id, e->record, e->table, e->end_offset});
    seq = batch.back()->seq + 1;
  }
  REQUIRE(expected.size() == 10000);

  subscription native(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, {});
  subscription deb(*f.log, *f.enc, f.request("/v1/stream?format=debezium"), 0, std::nullopt, {});
  subscription deflating(*f.log, *f.enc, f.request("/v1/stream?format=waltail"), 0, std::nullopt, {});
  deflating.set_deflate(12);
  subscription far(*f.log, *f.enc, f.request("/v1/stream?tables=other.b"), 6000, std::nullopt, {});
  std::vector<subscription::item> batch;
  for (auto* s : {&native, &deb, &deflating}) {
    s->next_batch(batch);
    CHECK(batch.empty());
    CHECK_FALSE(s->pending());
  }
  CHECK(bg.jobs.size() == 1);   // one read for the three of them, asked for their three encodings
  far.next_batch(batch);
  CHECK(batch.empty());
  CHECK(bg.jobs.size() == 2);   // another place in the file: a read of its own
  bg.run(0);
  // The block's events came with the encodings its readers wanted, made on the reader thread.
  bool fetching = false;
  auto block = f.log->read(0, 10000, 1u << 30, nullptr, &fetching);
  CHECK_FALSE(fetching);
  REQUIRE(block.size() > 1000);   // a block of 512 KiB of records
  CHECK(block.size() < 2500);
  CHECK(made_encoding(*block.front(), encoding::native));
  CHECK(made_encoding(*block.front(), encoding::debezium));
  REQUIRE(made_encoding(*block.back(), encoding::waltail));
  CHECK_FALSE(made_encoding(*block.front(), encoding::wal2json));
  std::size_t made = 1;
  CHECK(made_encoding(*block.back(), encoding::waltail)->deflated(12, &made));
  CHECK(made == 0);   // (compressed there too)
  REQUIRE(bg.jobs.size() == 3);   // this read of all of it (past its half) started the next block

  // Each reads on to the end, running the reads as they are asked for: everything, in order,
  // byte for byte what the file holds, in a bounded number of reads.
  std::map<subscription*, std::vector<std::string>> got;
  for (int guard = 0; guard < 100000; ++guard) {
    bool progress = false;
    for (auto* s : {&native, &deb, &deflating, &far}) {
      s->next_batch(batch);
      if (batch.empty()) continue;
      progress = true;
      s->delivered(batch.back());
      for (auto& i : batch) got[s].push_back(i.id.to_string());
    }
    if (!progress && !bg.run_next()) break;
  }
  for (auto* s : {&native, &deb, &deflating}) {
    REQUIRE(got[s].size() == 10000);
    for (std::size_t i = 0; i < 10000; ++i) REQUIRE(got[s][i] == expected[i].id.to_string());
    CHECK_FALSE(s->ended());
  }
  std::size_t in_b = 0;
  for (std::size_t i = 6000; i < 10000; ++i) in_b += expected[i].table == "b";
  CHECK(got[&far].size() == in_b);
  CHECK(bg.jobs.size() < 40);   // about 10,000 events / 2,000 per block, and the far reader's
  // Blocks and the file agree on every record, across segment boundaries.
  std::size_t segments = 0;
  for (const auto& e : std::filesystem::directory_iterator(f.dir.path))
    segments += e.path().filename().string().rfind("segment-", 0) == 0;
  CHECK(segments >= 3);
  for (std::uint64_t seq = 0; seq < 9000;) {
    fetching = false;
    auto b = f.log->read(seq, 10000, 1u << 30, nullptr, &fetching);
    // Nothing returned: only while a read it started runs (then run it, and read again).
    REQUIRE((!b.empty() || (fetching && bg.run_next())));
    if (b.empty()) continue;
    for (auto& e : b) {
      REQUIRE(e->seq == seq);
      CHECK(e->record == expected[seq].record);
      CHECK(e->end_offset == expected[seq].end_offset);
      ++seq;
    }
  }
}

TEST_CASE("event log: blocks read in the background are kept 0.5 s after their last use, and at most 16 MiB of them") {
  log_options o;
  o.memory_bytes = 16u << 20;
  fixture f(o);
  manual_background bg(*f.log);
  for (int i = 0; i < 12; ++i) f.w.txn(*f.log, f.w.a, 1, transform::op::insert, 3u << 20);   // 3 MiB each
  REQUIRE(f.log->tail().front()->seq >= 7);   // 0-6 only in the file
  bool fetching = false;
  // One event read as a reader does: a block started, run (with any other started), then read.
  auto read_at = [&](std::uint64_t seq) {
    fetching = false;
    auto r = f.log->read(seq, 1, 1u << 30, nullptr, &fetching);
    if (r.empty() && fetching) {
      while (bg.run_next()) {
      }
      r = f.log->read(seq, 1, 1u << 30, nullptr, &fetching);
    }
    REQUIRE(r.size() == 1);
    CHECK(r[0]->seq == seq);
  };
  for (std::uint64_t seq = 0; seq < 7; ++seq) read_at(seq);   // 7 blocks of 3 MiB: past 16 MiB
  const auto jobs = bg.jobs.size();
  CHECK(jobs >= 7);   // (and the one after 6, read ahead, when it is not in the tail)
  CHECK(jobs <= 8);
  fetching = false;
  CHECK(f.log->read(6, 1, 1u << 30, nullptr, &fetching).size() == 1);   // kept: just used
  CHECK(f.log->read(5, 1, 1u << 30, nullptr, &fetching).size() == 1);
  CHECK(bg.jobs.size() == jobs);
  CHECK(f.log->read(0, 1, 1u << 30, nullptr, &fetching).empty());   // the least recently used went
  CHECK(fetching);
  CHECK(bg.jobs.size() == jobs + 1);
  while (bg.run_next()) {
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  f.w.txn(*f.log, f.w.b, 1);   // (a commit prunes the blocks too)
  const auto n = bg.jobs.size();
  fetching = false;
  CHECK(f.log->read(5, 1, 1u << 30, nullptr, &fetching).empty());   // unused for 0.5 s: gone
  CHECK(fetching);
  CHECK(bg.jobs.size() == n + 1);
}

TEST_CASE("event log: a block larger than the budget is kept until its reader has read it") {
  log_options o;
  o.memory_bytes = 40u << 20;   // (17 MiB records do not linger in it)
  fixture f(o);
  manual_background bg(*f.log);
  for (int i = 0; i < 3; ++i) f.w.txn(*f.log, f.w.a, 1, transform::op::insert, 17u << 20);
  REQUIRE(f.log->tail().front()->seq >= 1);
  bool fetching = false;
  CHECK(f.log->read(0, 1, 1u << 30, nullptr, &fetching).empty());
  REQUIRE(fetching);
  REQUIRE(bg.run_next());
  fetching = false;
  auto r = f.log->read(0, 1, 1u << 30, nullptr, &fetching);   // (a prune ran first: the block stayed)
  REQUIRE(r.size() == 1);
  CHECK(r[0]->record.size() > (17u << 20));
  CHECK_FALSE(fetching);
  CHECK(bg.jobs.size() == 1);
  // Read from, it is over the budget and goes; a reader that reaches the record while another
  // holds it shares it still.
  fetching = false;
  auto again = f.log->read(0, 1, 1u << 30, nullptr, &fetching);
  REQUIRE(again.size() == 1);
  CHECK(again[0].get() == r[0].get());
  CHECK(bg.jobs.size() == 1);
}

TEST_CASE("subscription: a damaged frame in a block read in the background: the events before it, then the reason") {
  log_options o;
  o.memory_bytes = 1;
  fixture f(o);
  manual_background bg(*f.log);
  f.w.txn(*f.log, f.w.a, 100);
  f.w.txn(*f.log, f.w.a, 1);
  auto seg = only_segment(f.dir.path);
  damage(seg, std::filesystem::file_size(seg) / 2, '#');
  subscription s(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, {});
  std::size_t delivered = 0;
  std::vector<subscription::item> batch;
  for (int guard = 0; guard < 100 && !s.ended(); ++guard) {
    s.next_batch(batch);
    if (!batch.empty()) {
      delivered += batch.size();
      s.delivered(batch.back());
    } else if (!bg.run_next()) {
      break;
    }
  }
  CHECK(delivered > 10);
  CHECK(delivered < 100);
  CHECK(s.why() == subscription::end::damaged);
  CHECK(s.reason().find("checksum") != std::string::npos);
  CHECK(s.resume_id() == f.w.txns[0].commit_lsn.to_string() + ":" + std::to_string(delivered - 1));
}

TEST_CASE("subscription: a damaged record of megabytes read in the background ends the subscription, saying why") {
  log_options o;
  o.memory_bytes = 7u << 20;
  fixture f(o);
  manual_background bg(*f.log);
  f.w.txn(*f.log, f.w.a, 1, transform::op::insert, 3u << 20);   // seq 0: 3 MiB
  for (int i = 0; i < 8; ++i) f.w.txn(*f.log, f.w.a, 1, transform::op::insert, 1u << 20);
  REQUIRE(f.log->tail().front()->seq > 0);
  damage(only_segment(f.dir.path), 1u << 20, '#');   // a byte in the middle of its value
  subscription s(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, {});
  std::vector<subscription::item> batch;
  s.next_batch(batch);
  CHECK(batch.empty());
  REQUIRE(bg.jobs.size() == 1);
  bg.run(0);
  s.next_batch(batch);
  CHECK(batch.empty());
  CHECK(s.why() == subscription::end::damaged);
  CHECK(s.reason().find("checksum") != std::string::npos);
}

namespace {
std::vector<std::string> texts(const std::vector<std::vector<subscription::item>>& batches) {
  std::vector<std::string> out;
  for (const auto& b : batches)
    for (const auto& i : b) {
      REQUIRE(!i.bytes->spilled());
      out.push_back(text(i));
    }
  return out;
}
}  // namespace

TEST_CASE("subscription: transaction records around each transaction, counted per client, resumable from any id") {
  fixture f;
  f.w.xid = 900;
  auto& a = f.w.a;
  auto& b = f.w.b;
  f.w.mixed(*f.log, {&a, &b, &a});   // 0/1000, xid 900
  f.w.mixed(*f.log, {&b, &b});       // 0/1100, xid 901
  f.w.mixed(*f.log, {&a});           // 0/1200, xid 902
  const std::string time = "\"commit_time\":\"2000-01-01T00:00:00.000000Z\"";

  SUBCASE("native, every table") {
    subscription s(*f.log, *f.enc, f.request("/v1/stream?transactions=true"), 0, std::nullopt, {});
    auto got = drain(s);
    CHECK(ids(got) == std::vector<std::string>{"0/1000:B", "0/1000:0", "0/1000:1", "0/1000:2", "0/1000:C", "0/1100:B", "0/1100:0",
                                               "0/1100:1", "0/1100:C", "0/1200:B", "0/1200:0", "0/1200:C"});
    auto t = texts(got);
    CHECK(t[0] == "{\"id\":\"0/1000:B\",\"op\":\"begin\",\"xid\":900,\"commit_lsn\":\"0/1000\"," + time + "}");
    CHECK(t[4] == "{\"id\":\"0/1000:C\",\"op\":\"commit\",\"xid\":900,\"commit_lsn\":\"0/1000\"," + time +
                      ",\"events\":3,\"tables\":[{\"schema\":\"public\",\"table\":\"a\",\"events\":2},"
                      "{\"schema\":\"other\",\"table\":\"b\",\"events\":1}]}");
    CHECK(s.resume_id() == "0/1200:C");
    // A new transaction: its records as it arrives (the commit once it is all visible).
    f.w.mixed(*f.log, {&b});
    CHECK(ids(drain(s)) == std::vector<std::string>{"0/1300:B", "0/1300:0", "0/1300:C"});
  }
  SUBCASE("filtered: only what the client is sent is counted; a transaction with nothing for it has no records") {
    subscription s(*f.log, *f.enc, f.request("/v1/stream?transactions=true&tables=public.a"), 0, std::nullopt, {});
    auto got = drain(s);
    CHECK(ids(got) == std::vector<std::string>{"0/1000:B", "0/1000:0", "0/1000:2", "0/1000:C", "0/1200:B", "0/1200:0", "0/1200:C"});
    CHECK(texts(got)[3] == "{\"id\":\"0/1000:C\",\"op\":\"commit\",\"xid\":900,\"commit_lsn\":\"0/1000\"," + time +
                               ",\"events\":2,\"tables\":[{\"schema\":\"public\",\"table\":\"a\",\"events\":2}]}");
  }
  SUBCASE("empty_transactions=true: a transaction of a table the client asked for, with nothing for it, has its begin and "
          "commit, counted 0; one of other tables alone has nothing") {
    // where= leaves nothing of 0/1200 (public.a's row 4608); 0/1100 is other.b's alone: another's
    // transaction, whose xid, commit LSN and time this client is not told (issue 32, item 6).
    const std::string q = "/v1/stream?transactions=true&tables=public.a&where=id%20%3C%204600&empty_transactions=true";
    subscription s(*f.log, *f.enc, f.request(q), 0, std::nullopt, {});
    auto got = drain(s);
    CHECK(ids(got) == std::vector<std::string>{"0/1000:B", "0/1000:0", "0/1000:2", "0/1000:C", "0/1200:B", "0/1200:C"});
    auto t = texts(got);
    REQUIRE(t.size() == 6);
    CHECK(t[4] == "{\"id\":\"0/1200:B\",\"op\":\"begin\",\"xid\":902,\"commit_lsn\":\"0/1200\"," + time + "}");
    CHECK(t[5] == "{\"id\":\"0/1200:C\",\"op\":\"commit\",\"xid\":902,\"commit_lsn\":\"0/1200\"," + time +
                      ",\"events\":0,\"tables\":[]}");
    // Resumed from the empty one's begin: its commit; from an event before it: the rest.
    auto resumed = [&](const std::string& from) { return ids(drain_resumed(f, q + "&from=" + from)); };
    CHECK(resumed("0/1200:B") == std::vector<std::string>{"0/1200:C"});
    CHECK(resumed("0/1100:C") == std::vector<std::string>{"0/1200:B", "0/1200:C"});
    CHECK(resumed("0/1000:2") == std::vector<std::string>{"0/1000:C", "0/1200:B", "0/1200:C"});
    // wal2json (ops= leaves nothing of other.b's inserts: 0/1000 and 0/1100 empty, 0/1200 not
    // other.b's at all) and group=transaction too.
    subscription w(*f.log, *f.enc,
                   f.request("/v1/stream?format=wal2json&transactions=true&tables=other.b&ops=delete&empty_transactions=true"), 0,
                   std::nullopt, {});
    auto wt = texts(drain(w));
    CHECK(wt == std::vector<std::string>{R"({"action":"B","xid":900,"timestamp":"2000-01-01 00:00:00+00"})",
                                         R"({"action":"C","xid":900,"timestamp":"2000-01-01 00:00:00+00"})",
                                         R"({"action":"B","xid":901,"timestamp":"2000-01-01 00:00:00+00"})",
                                         R"({"action":"C","xid":901,"timestamp":"2000-01-01 00:00:00+00"})"});
    subscription g(*f.log, *f.enc,
                   f.request("/v1/stream?group=transaction&tables=public.a&where=id%20%3C%204600&empty_transactions=true"), 0,
                   std::nullopt, {});
    auto gt = drain(g);
    CHECK(ids(gt) == std::vector<std::string>{"0/1000:C", "0/1200:C"});
    auto gtt = texts(gt);
    REQUIRE(gtt.size() == 2);
    CHECK(gtt[1] ==
          R"({"xid":902,"commit_lsn":"0/1200","commit_time":"2000-01-01T00:00:00.000000Z","part":1,"last":true,"events":[]})");
    // Asked for without transaction records: refused.
    request_error err;
    CHECK_FALSE(parse_stream_query("/v1/stream?empty_transactions=true&transactions=false", err));
    CHECK(err.parameter == "empty_transactions");
    CHECK_FALSE(parse_stream_query("/v1/stream?empty_transactions=true&format=waltail", err));
    CHECK(parse_stream_query("/v1/stream?empty_transactions=true&format=wal2json", err));
  }
  SUBCASE("off unless asked (the server turns it on for wal2json): no records") {
    subscription s(*f.log, *f.enc, f.request("/v1/stream?format=wal2json"), 0, std::nullopt, {});
    CHECK(ids(drain(s)).size() == 6);
  }
  SUBCASE("wal2json: B and C as the plugin writes them with include-xids and include-timestamp") {
    subscription s(*f.log, *f.enc, f.request("/v1/stream?format=wal2json&transactions=true&tables=other.b"), 0, std::nullopt, {});
    auto t = texts(drain(s));
    REQUIRE(t.size() == 7);
    CHECK(t[0] == R"({"action":"B","xid":900,"timestamp":"2000-01-01 00:00:00+00"})");
    CHECK(t[1].rfind(R"({"action":"I","schema":"other","table":"b",)", 0) == 0);
    CHECK(t[2] == R"({"action":"C","xid":900,"timestamp":"2000-01-01 00:00:00+00"})");
    CHECK(t[3] == R"({"action":"B","xid":901,"timestamp":"2000-01-01 00:00:00+00"})");
    CHECK(t[6] == R"({"action":"C","xid":901,"timestamp":"2000-01-01 00:00:00+00"})");
  }
  SUBCASE("debezium: BEGIN/END records, each change's transaction block with this client's orders") {
    subscription s(*f.log, *f.enc, f.request("/v1/stream?format=debezium&transactions=true&tables=public.a,other.b"), 0,
                   std::nullopt, {});
    auto t = texts(drain(s));
    REQUIRE(t.size() == 12);
    CHECK(t[0] == R"({"status":"BEGIN","id":"900:4096","ts_ms":946684800000,"event_count":null,"data_collections":null})");
    auto block = [](const std::string& ev) { return ev.substr(ev.find(",\"transaction\":")); };
    CHECK(block(t[1]) == R"(,"transaction":{"id":"900:4096","total_order":1,"data_collection_order":1}})");
    CHECK(block(t[2]) == R"(,"transaction":{"id":"900:4096","total_order":2,"data_collection_order":1}})");
    CHECK(block(t[3]) == R"(,"transaction":{"id":"900:4096","total_order":3,"data_collection_order":2}})");
    CHECK(t[4] == R"({"status":"END","id":"900:4096","ts_ms":946684800000,"event_count":3,"data_collections":[)"
                  R"({"data_collection":"public.a","event_count":2},{"data_collection":"other.b","event_count":1}]})");
    // The shared encoding is left as it is: a client without records has null.
    subscription plain(*f.log, *f.enc, f.request("/v1/stream?format=debezium"), 0, std::nullopt, {});
    auto p = texts(drain(plain));
    REQUIRE(p.size() == 6);
    CHECK(block(p[0]) == R"(,"transaction":null})");
    CHECK(p[0].substr(0, p[0].find(",\"transaction\":")) == t[1].substr(0, t[1].find(",\"transaction\":")));
  }
  SUBCASE("resumed from a begin, an event or a commit: the rest, no record twice, the commit's counts whole") {
    auto resumed = [&](const std::string& query) {
      auto got = drain_resumed(f, query);
      return std::make_pair(ids(got), texts(got));
    };
    auto [from_begin, t1] = resumed("/v1/stream?transactions=true&from=0/1000:B");
    CHECK(from_begin == std::vector<std::string>{"0/1000:0", "0/1000:1", "0/1000:2", "0/1000:C", "0/1100:B", "0/1100:0", "0/1100:1",
                                                 "0/1100:C", "0/1200:B", "0/1200:0", "0/1200:C"});
    CHECK(t1[3].find("\"events\":3,") != std::string::npos);
    auto [from_event, t2] = resumed("/v1/stream?transactions=true&tables=public.a&from=0/1000:0");
    CHECK(from_event == std::vector<std::string>{"0/1000:2", "0/1000:C", "0/1200:B", "0/1200:0", "0/1200:C"});
    CHECK(t2[1].find("\"events\":2,\"tables\":[{\"schema\":\"public\",\"table\":\"a\",\"events\":2}]") != std::string::npos);
    auto [from_last, t3] = resumed("/v1/stream?transactions=true&from=0/1100:1");
    CHECK(from_last == std::vector<std::string>{"0/1100:C", "0/1200:B", "0/1200:0", "0/1200:C"});
    CHECK(t3[0].find("\"events\":2,") != std::string::npos);
    auto [from_commit, t4] = resumed("/v1/stream?transactions=true&from=0/1100:C");
    CHECK(from_commit == std::vector<std::string>{"0/1200:B", "0/1200:0", "0/1200:C"});
    // Debezium's orders, resumed inside: as if never cut off.
    auto [dbz, t5] = resumed("/v1/stream?format=debezium&transactions=true&from=0/1000:1");
    REQUIRE(t5.size() == 9);
    CHECK(t5[0].find(R"("total_order":3,"data_collection_order":2})") != std::string::npos);
    // Without records, a begin's id resumes at its first event, a commit's after its last.
    auto [plain_b, t6] = resumed("/v1/stream?from=0/1100:B");
    CHECK(plain_b == std::vector<std::string>{"0/1100:0", "0/1100:1", "0/1200:0"});
    auto [plain_c, t7] = resumed("/v1/stream?from=0/1100:C");
    CHECK(plain_c == std::vector<std::string>{"0/1200:0"});
  }
}

TEST_CASE("subscription: empty_transactions=true has records only of transactions of a table the token may see") {
  // Issue 32, item 6: every transaction's xid, commit LSN and time went to every token, other
  // tenants' included. Now only a transaction with an event of a table (or a message) the token
  // may see and the client asked for, of which its filters (row grants, ops=) left nothing.
  fixture f;
  f.w.xid = 700;
  auto& a = f.w.a;
  auto& b = f.w.b;
  f.w.mixed(*f.log, {&a});       // 0/1000, xid 700: public.a's row 4096 (within x's rows)
  f.w.mixed(*f.log, {&b, &b});   // 0/1100, xid 701: other.b alone (y's table)
  f.w.mixed(*f.log, {&a});       // 0/1200, xid 702: public.a's row 4608 (outside x's rows)
  f.w.message(*f.log, "other");  // 0/1300, xid 703: a transactional message alone
  std::string error;
  auto p = policy::parse(R"(
[[grant]]
when = { tenant = "x" }
tables = ["public.a"]
rows = "id < 4600"

[[grant]]
when = { tenant = "y" }
tables = ["other.b"]
ops = ["insert", "message"]
)",
                         error);
  REQUIRE_MESSAGE(p, error);
  auto granted = [&](const char* tenant, const std::string& query) {
    auto r = f.request(query);
    boost::json::object claims;
    claims["tenant"] = tenant;
    auto g = p->grants_for(claims);
    REQUIRE(g);
    REQUIRE_FALSE(authorize(g, r));
    return r;
  };
  auto got = [&](const stream_request& r) {
    subscription s(*f.log, *f.enc, r, 0, std::nullopt, {});
    return ids(drain(s));
  };
  // x: 0/1200 (its table, no row of it within x's grant) empty; nothing of y's table, nor of a
  // message (not granted to x).
  CHECK(got(granted("x", "/v1/stream?transactions=true&empty_transactions=true")) ==
        std::vector<std::string>{"0/1000:B", "0/1000:0", "0/1000:C", "0/1200:B", "0/1200:C"});
  CHECK(got(granted("x", "/v1/stream?group=transaction&empty_transactions=true")) ==
        std::vector<std::string>{"0/1000:C", "0/1200:C"});
  // y asking for messages only: other.b's 0/1100 empty, the message's whole; nothing of public.a.
  CHECK(got(granted("y", "/v1/stream?transactions=true&empty_transactions=true&ops=message")) ==
        std::vector<std::string>{"0/1100:B", "0/1100:C", "0/1300:B", "0/1300:0", "0/1300:C"});
  // A message of a prefix not asked for is not the client's to know of either.
  CHECK(got(granted("y", "/v1/stream?transactions=true&empty_transactions=true&ops=insert,message&prefixes=app*")) ==
        std::vector<std::string>{"0/1100:B", "0/1100:0", "0/1100:1", "0/1100:C"});
}

TEST_CASE("subscription: transaction records of a Debezium encoding in a spill file") {
  test::temp_dir spill{"walgate-sub-spill"};
  fixture f;
  f.enc = std::make_unique<encoding_cache>(*f.log, encoding_cache::options{{}, spill.path, 64});   // every encoding spilled
  f.w.xid = 7;
  f.w.txn(*f.log, f.w.a, 2, transform::op::insert, (1u << 20) + 100);   // (records of 1 MiB or more may be spilled)
  subscription s(*f.log, *f.enc, f.request("/v1/stream?format=debezium&transactions=true"), 0, std::nullopt, {});
  std::vector<subscription::item> got;
  for (const auto& b : drain(s)) got.insert(got.end(), b.begin(), b.end());
  REQUIRE(got.size() == 4);
  CHECK(got[0].id.to_string() == "0/1000:B");
  CHECK(got[3].id.to_string() == "0/1000:C");
  for (std::size_t k : {1u, 2u}) {
    const auto& p = *got[k].bytes;
    REQUIRE(p.spilled());
    std::string whole(p.size(), '\0'), error;
    REQUIRE_MESSAGE(p.read(0, whole, error), error);
    const std::string block = R"(,"transaction":{"id":"7:4096","total_order":)" + std::to_string(k) +
                              R"(,"data_collection_order":)" + std::to_string(k) + "}}";
    CHECK(whole.ends_with(block));
    CHECK(whole.rfind(R"({"before":null,"after":{"id":)", 0) == 0);
    CHECK(whole.size() > (1u << 20));
    // Read in two pieces split at every offset near the end (the file's bytes, then the
    // block) and at a stride before: the same bytes.
    std::vector<std::size_t> cuts;
    for (std::size_t cut = 0; cut < whole.size() - 300; cut += 4099) cuts.push_back(cut);
    for (std::size_t cut = whole.size() - 300; cut <= whole.size(); ++cut) cuts.push_back(cut);
    for (std::size_t cut : cuts) {
      std::string x(cut, '\0'), y(whole.size() - cut, '\0');
      REQUIRE(p.read(0, x, error));
      REQUIRE(p.read(cut, y, error));
      REQUIRE(x + y == whole);
    }
  }
  // keys=true around that: the key, the spilled bytes with the block, the end; read alike.
  subscription k(*f.log, *f.enc, f.request("/v1/stream?format=debezium&transactions=true&keys=true"), 0, std::nullopt, {});
  std::vector<subscription::item> keyed;
  for (const auto& b : drain(k)) keyed.insert(keyed.end(), b.begin(), b.end());
  REQUIRE(keyed.size() == 4);
  const auto& p = *keyed[1].bytes;
  REQUIRE(p.spilled());
  std::string whole(p.size(), '\0'), error;
  REQUIRE_MESSAGE(p.read(0, whole, error), error);
  CHECK(whole.rfind(R"({"key":{"id":)", 0) == 0);
  CHECK(whole.ends_with(R"("total_order":1,"data_collection_order":1}}})"));
  for (std::size_t cut = 0; cut <= whole.size(); cut += (cut < 300 || cut + 300 > whole.size()) ? 1 : 4099) {
    std::string x(cut, '\0'), y(whole.size() - cut, '\0');
    REQUIRE(p.read(0, x, error));
    REQUIRE(p.read(cut, y, error));
    REQUIRE(x + y == whole);
  }
}

TEST_CASE("subscription: keys=true wraps each event as {key, value} with the format's key, made once and shared") {
  fixture f;
  f.w.txn(*f.log, f.w.a, 1);                            // 0/1000: insert id 4096
  f.w.txn(*f.log, f.w.a, 1, transform::op::delete_);   // 0/1100: delete id 4352
  auto values = [&](const char* query) {
    subscription s(*f.log, *f.enc, f.request(query), 0, std::nullopt, {});
    std::vector<subscription::item> got;
    for (const auto& b : drain(s)) got.insert(got.end(), b.begin(), b.end());
    return got;
  };
  auto plain = values("/v1/stream?format=debezium");
  auto keyed = values("/v1/stream?format=debezium&keys=true&tombstones=true");
  REQUIRE(plain.size() == 2);
  REQUIRE(keyed.size() == 3);
  CHECK(text(keyed[0]) == "{\"key\":{\"id\":4096},\"value\":" + text(plain[0]) + "}");
  CHECK(text(keyed[1]) == "{\"key\":{\"id\":4352},\"value\":" + text(plain[1]) + "}");
  CHECK(text(keyed[2]) == R"({"key":{"id":4352},"value":null})");   // the tombstone as it was
  // Made once per event and encoding: another client of it gets the same bytes.
  auto again = values("/v1/stream?format=debezium&keys=true");
  CHECK(again[0].bytes == keyed[0].bytes);
  auto p2j = values("/v1/stream?format=pgoutput2json&keys=true");
  auto p2j_plain = values("/v1/stream?format=pgoutput2json");
  CHECK(text(p2j[0]) == "{\"key\":[4096],\"value\":" + text(p2j_plain[0]) + "}");
  CHECK(text(p2j[1]) == "{\"key\":[4352],\"value\":" + text(p2j_plain[1]) + "}");
  auto compact = values("/v1/stream?format=pgoutput2json&compact=true&keys=true");
  CHECK(text(compact[0]).rfind("{\"key\":[4096],\"value\":{", 0) == 0);
  auto wt = values("/v1/stream?format=waltail&keys=true");
  CHECK(text(wt[0]).rfind(R"({"key":"public.a:4096","value":{"op":"insert")", 0) == 0);
  CHECK(text(wt[1]).rfind(R"({"key":"public.a:4352","value":{"op":"delete")", 0) == 0);
  // With Debezium's transaction records: each record keyed by the transaction's id.
  fixture g;
  g.w.xid = 5;
  g.w.txn(*g.log, g.w.a, 1);
  subscription s(*g.log, *g.enc, g.request("/v1/stream?format=debezium&keys=true&transactions=true"), 0, std::nullopt, {});
  auto t = texts(drain(s));
  REQUIRE(t.size() == 3);
  CHECK(t[0] == R"({"key":{"id":"5:4096"},"value":{"status":"BEGIN","id":"5:4096","ts_ms":946684800000,"event_count":null,"data_collections":null}})");
  CHECK(t[1].rfind(R"({"key":{"id":4096},"value":{"before":null,)", 0) == 0);
  CHECK(t[1].ends_with(R"("transaction":{"id":"5:4096","total_order":1,"data_collection_order":1}}})"));
  CHECK(t[2].rfind(R"({"key":{"id":"5:4096"},"value":{"status":"END",)", 0) == 0);
  request_error err;
  CHECK_FALSE(parse_stream_query("/v1/stream?keys=true", err));
  CHECK(err.parameter == "keys");
  CHECK_FALSE(parse_stream_query("/v1/stream?format=wal2json&keys=true", err));
}

TEST_CASE("subscription: group=transaction sends each transaction whole as one message, split past the limit, resumable from a part") {
  fixture f;
  f.w.xid = 900;
  auto& a = f.w.a;
  auto& b = f.w.b;
  f.w.mixed(*f.log, {&a, &b, &a});   // 0/1000
  f.w.mixed(*f.log, {&b, &b});       // 0/1100
  f.w.mixed(*f.log, {&a});           // 0/1200
  auto plain = [&](const char* query) {
    subscription s(*f.log, *f.enc, f.request(query), 0, std::nullopt, {});
    return texts(drain(s));
  };
  const auto events = plain("/v1/stream");
  REQUIRE(events.size() == 6);
  const std::string head = R"({"xid":900,"commit_lsn":"0/1000","commit_time":"2000-01-01T00:00:00.000000Z",)";
  {
    subscription s(*f.log, *f.enc, f.request("/v1/stream?group=transaction"), 0, std::nullopt, {});
    auto got = drain(s);
    CHECK(ids(got) == std::vector<std::string>{"0/1000:C", "0/1100:C", "0/1200:C"});
    auto t = texts(got);
    CHECK(t[0] == head + R"("part":1,"last":true,"events":[)" + events[0] + "," + events[1] + "," + events[2] + "]}");
    CHECK(t[2].find(R"("xid":902,)") != std::string::npos);
  }
  {
    // Filtered: a transaction with nothing for the client has no message; wal2json's B/C are not
    // added (the message holds the transaction).
    subscription s(*f.log, *f.enc, f.request("/v1/stream?group=transaction&tables=public.a&format=wal2json"), 0, std::nullopt, {});
    auto got = drain(s);
    CHECK(ids(got) == std::vector<std::string>{"0/1000:C", "0/1200:C"});
    CHECK(texts(got)[0].find(R"("events":[{"action":"I","schema":"public","table":"a",)") != std::string::npos);
  }
  // Past the limit: parts, each with its number; a part's id is its last event's.
  subscription::limits l;
  l.group_bytes = events[0].size() + 2;   // one event a part
  subscription split(*f.log, *f.enc, f.request("/v1/stream?group=transaction"), 0, std::nullopt, l);
  auto parts = drain(split);
  CHECK(ids(parts) == std::vector<std::string>{"0/1000:0", "0/1000:1", "0/1000:C", "0/1100:0", "0/1100:C", "0/1200:C"});
  auto pt = texts(parts);
  CHECK(pt[0] == head + R"("part":1,"last":false,"events":[)" + events[0] + "]}");
  CHECK(pt[1] == head + R"("part":2,"last":false,"events":[)" + events[1] + "]}");
  CHECK(pt[2] == head + R"("part":3,"last":true,"events":[)" + events[2] + "]}");
  // Resumed from a part: the next part, numbered as before; from the last: the next transaction.
  auto resumed = [&](const char* from) { return texts(drain_resumed(f, std::string("/v1/stream?group=transaction&from=") + from, l)); };
  auto r1 = resumed("0/1000:0");
  REQUIRE(r1.size() == 5);
  CHECK(r1[0] == pt[1]);
  CHECK(r1[1] == pt[2]);
  auto r2 = resumed("0/1000:C");
  REQUIRE(r2.size() == 3);
  CHECK(r2[0] == pt[3]);
  request_error err;
  CHECK_FALSE(parse_stream_query("/v1/stream?group=transaction&transactions=true", err));
  CHECK_FALSE(parse_stream_query("/v1/stream?group=rows", err));
  CHECK(err.parameter == "group");
}

TEST_CASE("subscription: a group=transaction message of more than 1 MiB is read from its events where they are") {
  fixture f;
  f.w.xid = 3;
  f.w.txn(*f.log, f.w.a, 300, transform::op::insert, 4000);
  subscription plain(*f.log, *f.enc, f.request("/v1/stream"), 0, std::nullopt, {});
  std::string joined;
  for (const auto& e : texts(drain(plain))) joined += (joined.empty() ? "" : ",") + e;
  subscription s(*f.log, *f.enc, f.request("/v1/stream?group=transaction"), 0, std::nullopt, {});
  std::vector<subscription::item> got;
  for (const auto& b : drain(s)) got.insert(got.end(), b.begin(), b.end());
  REQUIRE(got.size() == 1);
  const auto& p = *got[0].bytes;
  REQUIRE(p.spilled());   // (read piece by piece, as a spill file is)
  std::string whole(p.size(), '\0'), error;
  REQUIRE_MESSAGE(p.read(0, whole, error), error);
  CHECK(whole == R"({"xid":3,"commit_lsn":"0/1000","commit_time":"2000-01-01T00:00:00.000000Z","part":1,"last":true,"events":[)" +
                     joined + "]}");
  for (std::size_t cut = 0; cut <= whole.size(); cut += (cut < 5000 || cut + 5000 > whole.size()) ? 1 : 997) {
    std::string x(cut, '\0'), y(whole.size() - cut, '\0');
    REQUIRE(p.read(0, x, error));
    REQUIRE(p.read(cut, y, error));
    REQUIRE(x + y == whole);
  }
}
