// The history an event log follows (history.hpp): the verdict at each connection, TIMELINE, CUT
// and CUTS, and the cut itself (event_log::cut_history) on real segment files.
#include "walgate/proxy/event_log.hpp"
#include "walgate/proxy/history.hpp"

#include "log_txn_builder.hpp"
#include "temp_dir.hpp"

#include <doctest/doctest.h>

#include <deque>
#include <filesystem>
#include <fstream>

using namespace walgate;
using namespace walgate::proxy;
using protocol::lsn;
namespace fs = std::filesystem;

namespace {

/// txn_builder's transactions, each kept here (a logged transaction's info outlives the call).
struct rows {
  test::txn_builder b;
  std::deque<protocol::transaction_info> txns;
  bool append(event_log& log, std::uint64_t commit_lsn, int n) { return b.append(log, commit_lsn, n, txns.emplace_back()); }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void put(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
std::size_t count_in(const fs::path& dir) {
  std::size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("the verdict at a connection: same, follow, cut, retry, refuse") {
  using k = history_verdict::kind;
  const std::vector<protocol::timeline_switch> history{{1, lsn{0x3000}}, {2, lsn{0x5000}}};   // (the server on 3)
  const std::string where = "PostgreSQL at h:5432";
  // No TIMELINE yet: followed from now on, quietly.
  auto v = check_history(std::nullopt, "7", 3, history, lsn{0x9000}, where);
  CHECK(v.what == k::follow);
  CHECK(v.message.empty());
  followed_timeline t{"7", 2};
  CHECK(check_history(t, "7", 2, {}, lsn{0x9000}, where).what == k::same);
  // Another cluster: refused, whatever its timeline.
  v = check_history(t, "8", 2, {}, lsn{0x10}, where);
  CHECK(v.what == k::refuse);
  CHECK(v.message.find("another database cluster (system identifier 8)") != std::string::npos);
  // An earlier timeline: a server not yet following the promotion (another attempt may find the new primary).
  v = check_history(followed_timeline{"7", 3}, "7", 2, {}, lsn{0x10}, where);
  CHECK(v.what == k::retry);
  // A later timeline that left ours at 0x5000: up to there the log is shared history...
  v = check_history(t, "7", 3, history, lsn{0x5000}, where);
  CHECK(v.what == k::follow);
  CHECK(v.at == lsn{0x5000});
  CHECK(v.message.find("left timeline 2 at 0/5000") != std::string::npos);
  // ...one byte past it is not (a commit or an acknowledgement of the timeline left).
  v = check_history(t, "7", 3, history, lsn{0x5001}, where);
  CHECK(v.what == k::cut);
  CHECK(v.at == lsn{0x5000});
  CHECK(v.message.find("never had") != std::string::npos);
  // The log's last connection was to a standby, and the server holds the slot: it is that
  // standby (its slot is its own), which followed a new timeline or was promoted while walgate
  // decoded on it — the log's history past the switch point is the server's: followed, not cut,
  // whatever the slot's position (another consumer may have moved it), and through any number
  // of timelines.
  const followed_timeline on_standby{"7", 2, true};
  for (auto confirmed : {lsn{0x6000}, lsn{0x5000}, lsn{0x1000}}) {
    v = check_history(on_standby, "7", 3, history, lsn{0x7000}, where, confirmed);
    CHECK(v.what == k::follow);
    CHECK(v.promoted_under_us);
    CHECK(v.at == lsn{0x5000});
    CHECK(v.message.find("it holds the slot walgate decoded on it as a standby") != std::string::npos);
  }
  v = check_history(followed_timeline{"7", 1, true}, "7", 3, history, lsn{0x4000}, where, lsn{0x100});
  CHECK(v.what == k::follow);
  // A standby's log, but no slot on the server (another server, promoted): cut.
  v = check_history(on_standby, "7", 3, history, lsn{0x7000}, where, std::nullopt);
  CHECK(v.what == k::cut);
  CHECK_FALSE(v.promoted_under_us);
  // The log's last connection was to a primary: a slot on the new one (a synchronised copy, or one
  // another consumer acknowledged past the switch point) says nothing of the log's history — cut.
  for (auto confirmed : {std::optional<lsn>{lsn{0x6000}}, std::optional<lsn>{lsn{0x5000}}, std::optional<lsn>{}}) {
    v = check_history(t, "7", 3, history, lsn{0x7000}, where, confirmed);
    CHECK(v.what == k::cut);
    CHECK_FALSE(v.promoted_under_us);
  }
  // Two promotions while walgate was away: timeline 1 left at 0x3000 (the 2 → 3 switch is past it).
  v = check_history(followed_timeline{"7", 1}, "7", 3, history, lsn{0x4000}, where);
  CHECK(v.what == k::cut);
  CHECK(v.at == lsn{0x3000});
  // A timeline the server's history does not name: not an ancestor (a sibling promoted elsewhere).
  v = check_history(followed_timeline{"7", 4}, "7", 5, {{1, lsn{0x3000}}, {3, lsn{0x6000}}}, lsn{0x10}, where);
  CHECK(v.what == k::refuse);
  CHECK(v.message.find("does not include timeline 4") != std::string::npos);
}

TEST_CASE("TIMELINE, CUT and CUTS: written whole, read back, anything else is none") {
  test::temp_dir d("walgate-history");
  std::string error;
  CHECK_FALSE(read_followed_timeline(d.path));
  REQUIRE(write_followed_timeline(d.path, {"7412345678901234567", 3}, true, error));
  CHECK(slurp(d.path / "TIMELINE") == "7412345678901234567 3\n");
  auto t = read_followed_timeline(d.path);
  REQUIRE(t);
  CHECK(t->system_id == "7412345678901234567");
  CHECK(t->timeline == 3);
  CHECK_FALSE(t->standby);
  CHECK_FALSE(fs::exists(d.path / "TIMELINE.tmp"));
  REQUIRE(write_followed_timeline(d.path, {"7412345678901234567", 4, true}, true, error));
  CHECK(slurp(d.path / "TIMELINE") == "7412345678901234567 4 standby\n");
  t = read_followed_timeline(d.path);
  REQUIRE(t);
  CHECK(t->timeline == 4);
  CHECK(t->standby);
  for (const char* bad : {"7 3", "x 3\n", "7 0\n", "7 x\n", "7  3\n", " 3\n", "7 99999999999\n", "", "7 3 primary\n",
                          "7 standby\n", "7 3 standby", " standby\n"}) {
    CAPTURE(bad);
    put(d.path / "TIMELINE", bad);
    CHECK_FALSE(read_followed_timeline(d.path));
  }
  CHECK_FALSE(read_cut_request(d.path));
  REQUIRE(write_cut_request(d.path, {lsn{0x5000}, {}, 2, 3}, true, error));
  CHECK(slurp(d.path / "CUT") == "0/5000 - 2 3\n");
  auto c = read_cut_request(d.path);
  REQUIRE(c);
  CHECK(c->at == lsn{0x5000});
  CHECK_FALSE(c->last.valid());
  CHECK(c->from_timeline == 2);
  CHECK(c->to_timeline == 3);
  for (const char* bad : {"0/5000 - 2 3", "0/5000 - 2\n", "0/50G0 - 2 3\n", "0/5000 - 2 3 4\n", "0/5000 x 2 3\n"}) {
    CAPTURE(bad);
    put(d.path / "CUT", bad);
    CHECK_FALSE(read_cut_request(d.path));
  }
  // CUTS: a torn last line (a crash while appending) is none; a line made twice counts once.
  put(d.path / "CUTS", "0/5000 0/6000 2 3\n0/5000 0/6000 2 3\nnot a cut\n0/7000 - 3 4\n0/9000 0/9");
  auto cuts = read_history_cuts(d.path);
  REQUIRE(cuts.size() == 1);
  CHECK(cuts[0].at == lsn{0x5000});
  CHECK(cuts[0].last == lsn{0x6000});
  CHECK(cuts[0].covers(lsn{0x5000}));
  CHECK(cuts[0].covers(lsn{0x6000}));
  CHECK_FALSE(cuts[0].covers(lsn{0x4FFF}));
  CHECK_FALSE(cuts[0].covers(lsn{0x6001}));
}

TEST_CASE("the cut: what committed from the switch point on moved aside, ACKED lowered, CUTS says it, the log goes on") {
  for (const std::size_t segment_bytes : {std::size_t{64} << 20, std::size_t{200}}) {   // (one segment; a segment per transaction)
    CAPTURE(segment_bytes);
    test::temp_dir d("walgate-history");
    std::string error, said;
    log_options o;
    o.dir = d.path;
    o.segment_bytes = segment_bytes;
    rows r;
    {
      auto log = event_log::open(o, error);
      REQUIRE_MESSAGE(log, error);
      REQUIRE(r.append(*log, 0x100, 3));
      REQUIRE(r.append(*log, 0x200, 2));
      REQUIRE(r.append(*log, 0x300, 1));   // (from here on: of the timeline left at 0x250)
      REQUIRE(r.append(*log, 0x400, 2));
      REQUIRE(log->sync());
      REQUIRE(event_log::store_acked(d.path, lsn{0x408}, true, error));
    }
    // Nothing asked: nothing done.
    REQUIRE(event_log::cut_history(d.path, true, said, error));
    CHECK(said.empty());
    REQUIRE(write_cut_request(d.path, {lsn{0x250}, {}, 1, 2}, true, error));
    REQUIRE_MESSAGE(event_log::cut_history(d.path, true, said, error), error);
    CHECK_MESSAGE(said.find("history cut at 0/250: the transactions committed from there to 0/400") != std::string::npos, said);
    CHECK_FALSE(fs::exists(d.path / "CUT"));
    CHECK(count_in(d.path / "damaged") >= 1);   // (moved aside, never deleted)
    {
      auto log = event_log::open(o, error);
      REQUIRE_MESSAGE(log, error);
      CHECK(log->next_seq() == 5);
      CHECK(log->last_commit_lsn() == lsn{0x200});
      CHECK(log->durable_lsn() == lsn{0x208});
      CHECK(log->acked_lsn() == lsn{0x250});   // (the stream goes on from the switch point)
      REQUIRE(log->history_cuts().size() == 1);
      const auto& c = log->history_cuts()[0];
      CHECK(c.at == lsn{0x250});
      CHECK(c.last == lsn{0x400});
      CHECK(c.from_timeline == 1);
      CHECK(c.to_timeline == 2);
      CHECK(log->read(0, 100).size() == 5);
    }
    // The same cut asked again (a crash after the cut, before CUT was removed; the start makes
    // it again before anything is streamed): nothing more to cut, CUTS unchanged.
    REQUIRE(write_cut_request(d.path, {lsn{0x250}, {}, 1, 2}, true, error));
    REQUIRE_MESSAGE(event_log::cut_history(d.path, true, said, error), error);
    CHECK_MESSAGE(said.find("nothing was logged past it") != std::string::npos, said);
    {
      auto log = event_log::open(o, error);
      REQUIRE_MESSAGE(log, error);
      CHECK(log->next_seq() == 5);
      CHECK(log->history_cuts().size() == 1);
      // The new timeline's transactions, at positions the old one had used too.
      REQUIRE(r.append(*log, 0x300, 2));
      REQUIRE(log->sync());
      CHECK(log->next_seq() == 7);
    }
    // A switch point past everything logged: nothing to cut.
    REQUIRE(write_cut_request(d.path, {lsn{0x900}, {}, 2, 3}, true, error));
    REQUIRE_MESSAGE(event_log::cut_history(d.path, true, said, error), error);
    CHECK_MESSAGE(said.find("nothing was logged past it") != std::string::npos, said);
  }
}

TEST_CASE("the cut's boundary: a commit at the switch point is cut, one ending there is kept") {
  for (const std::uint64_t at : {std::uint64_t{0x200}, std::uint64_t{0x208}}) {   // (0x200: a commit; 0x208: its end)
    CAPTURE(at);
    test::temp_dir d("walgate-history");
    std::string error, said;
    log_options o;
    o.dir = d.path;
    rows r;
    {
      auto log = event_log::open(o, error);
      REQUIRE(log);
      REQUIRE(r.append(*log, 0x100, 1));
      REQUIRE(r.append(*log, 0x200, 2));   // (commit record 0x200..0x208)
      REQUIRE(r.append(*log, 0x208, 1));   // (the next record begins where it ends)
      REQUIRE(log->sync());
    }
    REQUIRE(write_cut_request(d.path, {lsn{at}, {}, 1, 2}, true, error));
    REQUIRE_MESSAGE(event_log::cut_history(d.path, true, said, error), error);
    auto log = event_log::open(o, error);
    REQUIRE(log);
    if (at == 0x200) {
      CHECK(log->next_seq() == 1);   // 0x200 and 0x208 cut
      CHECK(log->last_commit_lsn() == lsn{0x100});
    } else {
      CHECK(log->next_seq() == 3);   // 0x200 kept (it ends at 0x208), 0x208 cut
      CHECK(log->last_commit_lsn() == lsn{0x200});
    }
    REQUIRE(log->history_cuts().size() == 1);
    CHECK(log->history_cuts()[0].last == lsn{0x208});
  }
}

TEST_CASE("a cut that would remove the initial snapshot is refused") {
  test::temp_dir d("walgate-history");
  std::string error, said;
  log_options o;
  o.dir = d.path;
  rows r;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    REQUIRE(r.append(*log, 0x300, 2));   // (as the snapshot: the log's first transaction)
    REQUIRE(r.append(*log, 0x400, 1));
    REQUIRE(log->sync());
  }
  put(d.path / "SNAPSHOT", "done\n");
  REQUIRE(write_cut_request(d.path, {lsn{0x300}, {}, 1, 2}, true, error));
  CHECK_FALSE(event_log::cut_history(d.path, true, said, error));
  CHECK_MESSAGE(error.find("first transaction (its initial snapshot, at 0/300)") != std::string::npos, error);
  // Past it: cut as any other.
  REQUIRE(write_cut_request(d.path, {lsn{0x350}, {}, 1, 2}, true, error));
  REQUIRE_MESSAGE(event_log::cut_history(d.path, true, said, error), error);
}

TEST_CASE("a cut past the log's beginning is refused: everything in it is of the timeline left") {
  test::temp_dir d("walgate-history");
  std::string error, said;
  log_options o;
  o.dir = d.path;
  rows r;
  {
    auto log = event_log::open(o, error);
    REQUIRE(log);
    REQUIRE(log->set_origin(lsn{0x500}));
    REQUIRE(r.append(*log, 0x600, 2));
    REQUIRE(log->sync());
  }
  REQUIRE(write_cut_request(d.path, {lsn{0x500}, {}, 1, 2}, true, error));
  CHECK_FALSE(event_log::cut_history(d.path, true, said, error));
  CHECK_MESSAGE(error.find("the event log began at 0/500, past 0/500") != std::string::npos, error);
  CHECK(fs::exists(d.path / "CUT"));   // (nothing changed)
  auto log = event_log::open(o, error);
  REQUIRE(log);
  CHECK(log->next_seq() == 2);
}
