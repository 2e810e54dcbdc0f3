#include "walgate/protocol/assembler.hpp"

#include "split_helpers.hpp"

#include <doctest/doctest.h>

using namespace walgate::protocol;
namespace pg = walgate::protocol::pgoutput;
using namespace std::string_literals;

namespace {

/// Writes every callback as one line, so that a whole run compares as one string.
struct recorder final : transaction_handler {
  std::string log;
  boost::system::error_code on_begin(const transaction_info& t) override {
    log += "begin xid=" + std::to_string(t.xid) + " commit=" + t.commit_lsn.to_string() +
           (t.origin ? " origin=" + *t.origin : "") + (t.streamed ? " streamed" : "") +
           (t.gid.empty() ? "" : " gid=" + t.gid) + "\n";
    return {};
  }
  boost::system::error_code on_change(const transaction_info&, const change_event& e) override {
    log += "  " + std::to_string(e.index) + " " + pg::name_of(pg::tag_of(*e.message)) + " @" + e.change_lsn.to_string();
    if (e.relation) log += " " + e.relation->relname;
    std::visit(
        [&](const auto& m) {
          if constexpr (requires { m.new_tuple; })
            for (const auto& c : m.new_tuple)
              log += " " + (c.kind == pg::column_kind::null ? "NULL"s : std::string(as_string_view(c.value)));
        },
        *e.message);
    log += "\n";
    return {};
  }
  boost::system::error_code on_commit(const transaction_info& t) override {
    log += "commit end=" + t.end_lsn.to_string() + "\n";
    return {};
  }
  boost::system::error_code on_message(lsn at, const pg::message& m) override {
    log += "message " + std::string(m.prefix) + " @" + at.to_string() + "\n";
    return {};
  }
};

struct fixture {
  pg::decode_context ctx{4, false, false};
  recorder rec;
  assembler_options opts;
  std::unique_ptr<assembler> a;
  std::uint64_t next_lsn = 0x100;
  std::vector<std::string> keep;   // the message bytes, alive as views require

  explicit fixture(std::size_t memory_limit = 64u << 20, std::filesystem::path spill_dir = {}) {
    opts.context = ctx;
    opts.memory_limit = memory_limit;
    opts.spill_dir = std::move(spill_dir);
    a = std::make_unique<assembler>(opts, rec);
  }
  boost::system::result<void, assembly_error> feed(const pg::any_message& m, bool in_stream = false) {
    pg::decode_context c = ctx;
    c.in_stream = in_stream;
    keep.push_back(pg::encode(m, c));
    next_lsn += 0x10;
    return a->feed(lsn{next_lsn}, as_bytes(keep.back()));
  }
  void ok(const pg::any_message& m, bool in_stream = false) {
    auto r = feed(m, in_stream);
    REQUIRE_MESSAGE(r.has_value(), (r.has_value() ? "" : r.error().message));
  }
};

std::vector<pg::relation_column> columns = {{1, "id", 23, -1}, {0, "name", 25, -1}};
pg::relation rel(std::uint32_t oid, const char* name, std::optional<std::uint32_t> xid = {}) {
  pg::relation r;
  r.xid = xid;
  r.oid = oid;
  r.nspname = "public";
  r.relname = name;
  r.columns = columns;
  return r;
}
std::vector<pg::tuple_column> row(const char* id, const char* name) {
  return {{pg::column_kind::text, as_bytes(std::string_view(id))}, {pg::column_kind::text, as_bytes(std::string_view(name))}};
}

}  // namespace

TEST_CASE("an ordinary transaction passes through with indexes; Truncate takes one per relation") {
  fixture f;
  auto r1 = row("1", "a"), r2 = row("1", "b");
  std::vector<std::uint32_t> oids = {16384, 16385};
  f.ok(pg::begin{lsn{0x900}, 42, 700});
  f.ok(pg::origin{lsn{0x55}, "node_a"});
  f.ok(rel(16384, "items"));
  f.ok(rel(16385, "other"));
  f.ok(pg::insert{{}, 16384, r1});
  f.ok(pg::update{{}, 16384, 0, {}, r2});
  f.ok(pg::delete_{{}, 16384, 'K', r2});
  f.ok(pg::truncate{{}, 1, oids});
  f.ok(pg::message{{}, true, lsn{0x1}, "app", as_bytes("x"s)});
  f.ok(pg::commit{0, lsn{0x900}, lsn{0x930}, 42});
  f.ok(pg::message{{}, false, lsn{0x2}, "audit", as_bytes("y"s)});
  CHECK(f.rec.log ==
        "begin xid=700 commit=0/900 origin=node_a\n"
        "  0 Insert @0/150 items 1 a\n"
        "  1 Update @0/160 items 1 b\n"
        "  2 Delete @0/170 items\n"
        "  3 Truncate @0/180\n"
        "  5 Message @0/190\n"
        "commit end=0/930\n"
        "message audit @0/1B0\n");
  CHECK_FALSE(f.a->in_transaction());
  CHECK(f.a->relations().find(16385)->relname == "other");
}

TEST_CASE("a streamed transaction is held until Stream Commit; a subtransaction abort drops only its part") {
  fixture f;
  auto r1 = row("1", "kept"), r2 = row("2", "aborted"), r3 = row("3", "nested"), r4 = row("4", "after");
  f.ok(pg::stream_start{800, true});
  f.ok(rel(16384, "items", 800), true);
  f.ok(pg::insert{800, 16384, r1}, true);
  f.ok(pg::insert{801, 16384, r2}, true);   // subtransaction 801
  f.ok(pg::stream_stop{});
  // An ordinary transaction commits in between and is delivered at once.
  f.ok(pg::begin{lsn{0x500}, 1, 900});
  f.ok(pg::commit{0, lsn{0x500}, lsn{0x510}, 1});
  f.ok(pg::stream_start{800, false});
  f.ok(pg::insert{802, 16384, r3}, true);   // nested inside 801
  f.ok(pg::stream_stop{});
  CHECK(f.a->open_streams() == 1);
  f.ok(pg::stream_abort{800, 801, {}, {}});
  f.ok(pg::stream_start{800, false});
  f.ok(pg::insert{800, 16384, r4}, true);
  f.ok(pg::stream_stop{});
  f.ok(pg::stream_commit{800, 0, lsn{0xA00}, lsn{0xA10}, 5});
  CHECK(f.rec.log ==
        "begin xid=900 commit=0/500\ncommit end=0/510\n"
        "begin xid=800 commit=0/A00 streamed\n"
        "  0 Insert @0/130 items 1 kept\n"
        "  1 Insert @0/1D0 items 4 after\n"
        "commit end=0/A10\n");
  CHECK(f.a->open_streams() == 0);
  CHECK(f.a->memory_bytes() == 0);
}

TEST_CASE("a top-level Stream Abort drops the whole transaction") {
  fixture f;
  auto r1 = row("1", "x");
  f.ok(pg::stream_start{800, true});
  f.ok(rel(16384, "items", 800), true);
  f.ok(pg::insert{800, 16384, r1}, true);
  f.ok(pg::stream_stop{});
  f.ok(pg::stream_abort{800, 800, {}, {}});
  CHECK(f.rec.log.empty());
  CHECK(f.a->open_streams() == 0);
  CHECK(f.a->memory_bytes() == 0);
}

TEST_CASE("two-phase: held at Prepare, released at Commit Prepared, dropped at Rollback Prepared") {
  fixture f;
  auto r1 = row("1", "prepared"), r2 = row("2", "rolled back");
  f.ok(pg::begin_prepare{lsn{0x300}, lsn{0x310}, 7, 810, "g1"});
  f.ok(rel(16384, "items"));
  f.ok(pg::insert{{}, 16384, r1});
  f.ok(pg::prepare{0, lsn{0x300}, lsn{0x310}, 7, 810, "g1"});
  f.ok(pg::begin_prepare{lsn{0x400}, lsn{0x410}, 8, 811, "g2"});
  f.ok(pg::insert{{}, 16384, r2});
  f.ok(pg::prepare{0, lsn{0x400}, lsn{0x410}, 8, 811, "g2"});
  CHECK(f.rec.log.empty());
  CHECK(f.a->held_prepared() == 2);
  f.ok(pg::rollback_prepared{0, lsn{0x410}, lsn{0x500}, 8, 9, 811, "g2"});
  f.ok(pg::commit_prepared{0, lsn{0x600}, lsn{0x610}, 10, 810, "g1"});
  CHECK(f.rec.log ==
        "begin xid=810 commit=0/600 gid=g1\n"
        "  0 Insert @0/130 items 1 prepared\n"
        "commit end=0/610\n");
  CHECK(f.a->held_prepared() == 0);
}

TEST_CASE("a streamed transaction prepared with Stream Prepare, then committed") {
  fixture f;
  auto r1 = row("1", "s");
  f.ok(pg::stream_start{820, true});
  f.ok(rel(16384, "items", 820), true);
  f.ok(pg::insert{820, 16384, r1}, true);
  f.ok(pg::stream_stop{});
  f.ok(pg::stream_prepare{{0, lsn{0x700}, lsn{0x710}, 3, 820, "sg"}});
  CHECK(f.a->held_prepared() == 1);
  f.ok(pg::commit_prepared{0, lsn{0x800}, lsn{0x810}, 4, 820, "sg"});
  CHECK(f.rec.log == "begin xid=820 commit=0/800 streamed gid=sg\n  0 Insert @0/130 items 1 s\ncommit end=0/810\n");
}

TEST_CASE("past the memory limit held transactions spill to disk and replay identically") {
  std::string expected;
  for (std::size_t limit : {std::size_t{64} << 20, std::size_t{256}}) {
    fixture f(limit);
    std::vector<std::vector<pg::tuple_column>> rows;
    std::vector<std::string> names;
    names.reserve(200);
    rows.reserve(200);
    f.ok(pg::stream_start{830, true});
    f.ok(rel(16384, "items", 830), true);
    for (int i = 0; i < 200; ++i) {
      names.push_back("row " + std::to_string(i) + std::string(50, 'x'));
      rows.push_back({{pg::column_kind::text, as_bytes(names.back())}, {pg::column_kind::null, {}}});
      f.ok(pg::insert{i % 2 ? 831u : 830u, 16384, rows.back()}, true);
      if (i == 150) {
        f.ok(pg::stream_stop{});
        f.ok(pg::stream_abort{830, 831, {}, {}});   // drops everything from 831's first row (row 1) on
        f.ok(pg::stream_start{830, false});
      }
    }
    f.ok(pg::stream_stop{});
    if (limit == 256) {
      CHECK(f.a->spilled_bytes() > 0);
      CHECK(f.a->memory_bytes() <= 256);
    } else {
      CHECK(f.a->spilled_bytes() == 0);
    }
    f.ok(pg::stream_commit{830, 0, lsn{0xF00}, lsn{0xF10}, 1});
    CHECK(f.a->memory_bytes() == 0);
    if (expected.empty()) expected = f.rec.log;
    else CHECK(f.rec.log == expected);
  }
  CHECK(expected.find("row 0x") != std::string::npos);
  CHECK(expected.find("row 1x") == std::string::npos);
  CHECK(expected.find("row 150") == std::string::npos);
  CHECK(expected.find("row 151") != std::string::npos);   // streamed after the abort: kept
}

TEST_CASE("protocol violations are errors naming the message") {
  auto r1 = row("1", "x");
  {
    fixture f;
    auto r = f.feed(pg::commit{0, lsn{1}, lsn{2}, 3});
    REQUIRE_FALSE(r);
    CHECK(r.error().message.find("Commit at 0/110 outside a transaction") != std::string::npos);
  }
  {
    fixture f;
    f.ok(pg::begin{lsn{0x900}, 1, 1});
    auto r = f.feed(pg::insert{{}, 99, r1});
    REQUIRE_FALSE(r);
    CHECK(r.error().message.find("relation 99 that no Relation message described") != std::string::npos);
  }
  {
    fixture f;
    auto r = f.feed(pg::stream_commit{5, 0, lsn{1}, lsn{2}, 3});
    REQUIRE_FALSE(r);
    CHECK(r.error().message.find("never streamed") != std::string::npos);
  }
  {
    fixture f;
    auto r = f.feed(pg::commit_prepared{0, lsn{1}, lsn{2}, 3, 4, "nope"});
    REQUIRE_FALSE(r);
    CHECK(r.error().message.find("'nope'") != std::string::npos);
  }
  {
    fixture f;
    f.ok(pg::begin{lsn{0x900}, 1, 1});
    auto r = f.feed(pg::begin{lsn{0x901}, 1, 2});
    REQUIRE_FALSE(r);
    CHECK(r.error().message.find("inside a transaction") != std::string::npos);
  }
  {
    fixture f;
    f.ok(pg::begin{lsn{0x900}, 1, 1});
    auto r = f.feed(pg::commit{0, lsn{0x901}, lsn{0x910}, 1});
    REQUIRE_FALSE(r);
    CHECK(r.error().message.find("does not match") != std::string::npos);
  }
}

TEST_CASE("spill files: created exclusively, mode 0600, removed with their transaction; a spill that fails is an error") {
  std::string t = (std::filesystem::temp_directory_path() / "walgate-spill-XXXXXX").string();
  std::filesystem::path dir = mkdtemp(t.data());
  auto files = [&] {
    std::vector<std::filesystem::path> out;
    for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path());
    return out;
  };
  std::vector<std::string> names;
  std::vector<std::vector<pg::tuple_column>> rows;
  names.reserve(100);
  rows.reserve(100);
  {
    fixture f(256, dir);
    f.ok(pg::stream_start{900, true});
    f.ok(rel(16384, "items", 900), true);
    for (int i = 0; i < 20; ++i) {
      names.push_back(std::string(100, 'a' + static_cast<char>(i)));
      rows.push_back({{pg::column_kind::text, as_bytes(names.back())}, {pg::column_kind::null, {}}});
      f.ok(pg::insert{900, 16384, rows.back()}, true);
    }
    auto spilled = files();
    REQUIRE(spilled.size() == 1);
    CHECK((std::filesystem::status(spilled[0]).permissions() & std::filesystem::perms::all) ==
          (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));
    f.ok(pg::stream_stop{});
    f.ok(pg::stream_abort{900, 900, {}, {}});
    CHECK(files().empty());   // dropped with the transaction
  }
  {
    // The spill directory is gone (or full): the bound cannot be kept, and feed says so at once.
    fixture f(256, dir / "missing");
    f.ok(pg::stream_start{901, true});
    f.ok(rel(16384, "items", 901), true);
    bool failed = false;
    for (int i = 0; i < 20 && !failed; ++i) {
      auto r = f.feed(pg::insert{901, 16384, rows[static_cast<std::size_t>(i)]}, true);
      if (!r) {
        failed = true;
        CHECK(r.error().message.find("cannot create spill file") != std::string::npos);
      }
    }
    CHECK(failed);
  }
  std::filesystem::remove_all(dir);
}
