// walgate's own walsender (--replication-listen, issue 35) against real replication clients:
// pg_recvlogical (Debian's, of PostgreSQL 15: the npm servers ship no client programs) reading
// test_decoding from walgate, its output compared byte for byte with pg_recvlogical reading the
// real test_decoding on the upstream over the same changes.
//
// The assumptions this file breaks:
// - "what the log holds is what the plugin prints": every built-in type family, NULLs, TOAST
//   left unchanged, REPLICA IDENTITY FULL, a key change, a truncate of two tables with RESTART
//   IDENTITY, transactional and non-transactional messages, a partition, a 100,000-row
//   transaction, each printed as test_decoding prints it;
// - "a downstream slot lives as long as walgate's process": kill -9 walgate, restart it — the slot
//   and its confirmed position are there, and a client resuming gets exactly the rest (a client
//   that reconnects by itself, or is killed and started again, may see again what it asks for
//   again: whole transactions, nothing else);
// - "a client sends what it should": an active slot, an unknown plugin, physical replication,
//   SQL, the extended protocol, a 10 MB startup packet, a connection that is not a replication
//   one: each answered with PostgreSQL's error (or a clear one of walgate's), walgate unharmed.
// Label "walsender": on PostgreSQL 15 and 18.
#include "walgate/protocol/lsn.hpp"
#include "walgate/proxy/local_cluster.hpp"
#include "walgate/proxy/replication_server.hpp"
#include "walgate/proxy/sql_forwarder.hpp"

#include "fault_harness.hpp"
#include "test_cluster.hpp"

#include <boost/asio/read.hpp>
#include <boost/asio/ssl.hpp>
#include <doctest/doctest.h>
#include <libpq-fe.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

using namespace walgate;
using namespace walgate::test::fault_harness;

namespace {

const char* recvlogical() {
  static const std::string path = [] {
    for (const char* p : {"/usr/lib/postgresql/15/bin/pg_recvlogical", "/usr/bin/pg_recvlogical"})
      if (std::filesystem::exists(p)) return std::string(p);
    return std::string();
  }();
  return path.c_str();
}

/// A child process (stdout and stderr to a file).
struct child {
  pid_t pid = -1;
  std::filesystem::path log;
  void start(const std::vector<std::string>& args, const std::filesystem::path& log_file) {
    log = log_file;
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      sigset_t none;   // (nothing the test process blocks stays blocked in the client)
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      int fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  int stop(int sig = SIGINT) {
    if (pid <= 0) return -1;
    ::kill(pid, sig);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string output() const {
    std::ifstream f(log);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  ~child() {
    if (pid > 0) stop(SIGKILL);
  }
};

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::filesystem::path temp_dir(const char* what) {
  std::string t = (std::filesystem::temp_directory_path() / (std::string(what) + "-XXXXXX")).string();
  return mkdtemp(t.data());
}

/// Runs pg_recvlogical to completion (a slot's creation or dropping); its output.
std::pair<int, std::string> recvlogical_once(const std::vector<std::string>& args, const std::filesystem::path& dir) {
  child c;
  std::vector<std::string> all{recvlogical()};
  all.insert(all.end(), args.begin(), args.end());
  static int n = 0;
  c.start(all, dir / ("once-" + std::to_string(++n) + ".log"));
  int status = 0;
  waitpid(c.pid, &status, 0);
  c.pid = -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), c.output()};
}

/// The upstream and walgate with its walsender, on the server under test.
struct fixture {
  std::unique_ptr<proxy::local_cluster> pg;
  std::filesystem::path dir = temp_dir("walgate-walsender");
  walgate_process gw;
  std::uint16_t http_port = free_port();
  std::uint16_t repl_port = free_port();
  std::string timeout = "20";   ///< --replication-timeout
  std::string listen_host = "127.0.0.1";       ///< --replication-listen's address
  std::vector<std::string> extra_args;          ///< more flags for walgate

  explicit fixture(const std::string& timezone = "UTC") {
    proxy::cluster_options o;
    o.name = "walsender";
    o.extra_conf = {"max_replication_slots = 20", "max_wal_senders = 20", "timezone = '" + timezone + "'"};
    std::string error;
    pg = proxy::local_cluster::start(o, error);
    REQUIRE_MESSAGE(pg, error);
  }
  std::string upstream() const { return pg->conninfo(); }
  std::string downstream() const {
    return "host=127.0.0.1 port=" + std::to_string(repl_port) + " user=postgres dbname=postgres sslmode=disable";
  }
  /// As user with password (PQconnectdb quoting).
  std::string downstream_as(const std::string& user, const std::string& password) const {
    std::string quoted;
    for (char c : password) {
      if (c == '\\' || c == '\'') quoted.push_back('\\');
      quoted.push_back(c);
    }
    std::string quoted_user;
    for (char c : user) {
      if (c == '\\' || c == '\'') quoted_user.push_back('\\');
      quoted_user.push_back(c);
    }
    return "host=127.0.0.1 port=" + std::to_string(repl_port) + " user='" + quoted_user +
           "' dbname=postgres sslmode=disable password='" + quoted + "'";
  }
  void start_walgate() {
    gw.args = {"--pg", upstream(), "--slot", "ws_slot", "--publication", "ws_pub", "--data-dir", (dir / "data").string(),
               "--listen", "127.0.0.1:" + std::to_string(http_port), "--replication-listen",
               listen_host + ":" + std::to_string(repl_port), "--status-interval", "500", "--replication-timeout", timeout};
    gw.args.insert(gw.args.end(), extra_args.begin(), extra_args.end());
    gw.start();
    REQUIRE_MESSAGE(test::wait_until([&] { return gw.this_run().find("streaming from PostgreSQL at") != std::string::npos; },
                                     std::chrono::seconds(60)),
                    gw.log());
  }
  /// Makes a slot on the upstream (ref_<name>) and on walgate (<name>), both with the plugin,
  /// with nothing written between the two.
  void make_slots(const std::string& name, const std::string& plugin = "test_decoding") {
    auto up = recvlogical_once({"-d", upstream(), "--slot", "ref_" + name, "--plugin", plugin, "--create-slot"}, dir);
    REQUIRE_MESSAGE(up.first == 0, up.second);
    auto down = recvlogical_once({"-d", downstream(), "--slot", name, "--plugin", plugin, "--create-slot"}, dir);
    REQUIRE_MESSAGE(down.first == 0, down.second << gw.log());
  }
  /// For each option set: a slot pair (ref_<prefix>N upstream, <prefix>N on walgate) with the
  /// plugin and a reader on each; the files, upstream's then walgate's for each set.
  std::vector<std::filesystem::path> start_pairs(const std::string& plugin, const std::string& prefix,
                                                 const std::vector<std::vector<std::string>>& option_sets,
                                                 std::vector<child>& readers) {
    std::vector<std::filesystem::path> files;
    readers = std::vector<child>(option_sets.size() * 2);
    for (std::size_t i = 0; i < option_sets.size(); ++i) {
      const std::string name = prefix + std::to_string(i);
      make_slots(name, plugin);
      start_reader(readers[2 * i], false, "ref_" + name, option_sets[i], "ref_" + name + ".out");
      start_reader(readers[2 * i + 1], true, name, option_sets[i], name + ".out");
      files.push_back(dir / ("ref_" + name + ".out"));
      files.push_back(dir / (name + ".out"));
    }
    return files;
  }
  void start_reader(child& c, bool on_walgate, const std::string& slot, const std::vector<std::string>& options,
                    const std::string& file) {
    std::vector<std::string> args{recvlogical(), "-d", on_walgate ? downstream() : upstream(), "--slot", slot, "--start",
                                  "-f", (dir / file).string(), "-F", "1", "-s", "1", "-v"};
    for (const auto& o : options) {
      args.push_back("-o");
      args.push_back(o);
    }
    c.start(args, dir / (file + ".log"));
  }
};

/// Until each file holds a line with `marker` and, after it, a COMMIT line ending in a newline.
bool wait_for_marker(const std::vector<std::filesystem::path>& files, const std::string& marker,
                     std::chrono::seconds limit = std::chrono::seconds(120)) {
  return test::wait_until(
      [&] {
        for (const auto& f : files) {
          auto text = read_file(f);
          auto at = text.find(marker);
          if (at == std::string::npos) return false;
          auto commit = text.find("\nCOMMIT", at);
          if (commit == std::string::npos || text.find('\n', commit + 1) == std::string::npos) return false;
        }
        return true;
      },
      limit);
}

/// Until each file holds `marker` and has not grown for a second and a half (the rest of the
/// marker's transaction written: wal2json's pieces and its "C" come after the row).
bool wait_for_marker_then_quiet(const std::vector<std::filesystem::path>& files, const std::string& marker,
                                std::chrono::seconds limit = std::chrono::seconds(120)) {
  if (!test::wait_until(
          [&] {
            for (const auto& f : files)
              if (read_file(f).find(marker) == std::string::npos) return false;
            return true;
          },
          limit))
    return false;
  std::vector<std::uintmax_t> sizes(files.size());
  auto stable_since = std::chrono::steady_clock::now();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until) {
    bool changed = false;
    for (std::size_t i = 0; i < files.size(); ++i) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(files[i], ec);
      if (size != sizes[i]) changed = true;
      sizes[i] = size;
    }
    if (changed) stable_since = std::chrono::steady_clock::now();
    if (std::chrono::steady_clock::now() - stable_since >= std::chrono::milliseconds(1500)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

/// The first line where a and b differ, with its neighbours (for a failing comparison).
std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream x(a), y(b);
  std::string la, lb;
  for (int n = 1;; ++n) {
    bool ga = static_cast<bool>(std::getline(x, la)), gb = static_cast<bool>(std::getline(y, lb));
    if (!ga && !gb) return "(no line differs: the ends differ)";
    if (!ga || !gb || la != lb)
      return "line " + std::to_string(n) + ":\n  upstream: " + (ga ? la.substr(0, 400) : "(end)") + "\n  walgate:  " +
             (gb ? lb.substr(0, 400) : "(end)");
  }
}

/// The workload of every kind, in transactions of its own.
void workload(proxy::local_cluster& pg) {
  pg.sql(
      "INSERT INTO ws_types VALUES (1, 'it''s \"q\" \\ back', 12.50, 'NaN', 'Infinity', true, '{a,\"b c\",NULL}', B'101', "
      "'ab', 'vc', '{\"k\": [1, 2.5]}', '{\"x\":1}', '2026-12-07 10:00:00.123456+00', '2026-12-07', '10:01:02', "
      "'1 year 2 mons 3 days 04:05:06.7', '\\xdeadbeef', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '192.168.0.1/24', "
      "'happy', '{1,2,3}', 'x', -32768, 9223372036854775807, 1.5e-7, '(1,2)', '[1,5)', 'a & b', 42, 'line1\nline2')");
  pg.sql("INSERT INTO ws_types (id) VALUES (2)");
  pg.sql("UPDATE ws_types SET t = 'changed', big = repeat('long text ', 5000) WHERE id = 1");
  pg.sql("UPDATE ws_types SET n = 1 WHERE id = 1");   // (big: unchanged TOAST)
  pg.sql("UPDATE ws_types SET id = 3 WHERE id = 2");  // a key change: old-key
  pg.sql("DELETE FROM ws_types WHERE id = 3");
  pg.sql("INSERT INTO ws_full VALUES (1, 'a', NULL), (2, 'b', 'c')");
  pg.sql("UPDATE ws_full SET v = 'z' WHERE id = 2");
  pg.sql("DELETE FROM ws_full WHERE id = 1");
  pg.sql("INSERT INTO ws_parted VALUES (5, 'low'), (150, 'high')");
  if (pg.server_major() >= 14) {   // (pgoutput sends logical messages from 14: on 13 the log has none)
    pg.sql("SELECT pg_logical_emit_message(true, 'tx', 'in a transaction')");
    pg.sql("SELECT pg_logical_emit_message(false, 'ntx', 'outside')");
    pg.sql("BEGIN; INSERT INTO ws_full VALUES (9, 'm', 'n'); SELECT pg_logical_emit_message(true, 'mid', 'x'); COMMIT");
  } else {
    pg.sql("INSERT INTO ws_full VALUES (9, 'm', 'n')");
  }
  pg.sql("INSERT INTO \"Ws Mixed\" (\"Key\", \"user\") VALUES (1, 'u')");
  pg.sql("TRUNCATE ws_full, \"Ws Mixed\" RESTART IDENTITY");
  // (A partitioned table's own TRUNCATE is not here: test_decoding names the parent with its
  // partitions, and pgoutput sends the partitions alone — the log cannot know the parent.)
  pg.sql("TRUNCATE ws_parted_low, ws_parted_high");
  pg.sql("INSERT INTO ws_big SELECT g, md5(g::text) FROM generate_series(1, 100000) g");
  pg.sql("INSERT INTO ws_full VALUES (424242, 'marker', 'end')");
}

void make_tables(proxy::local_cluster& pg) {
  pg.sql(
      "CREATE TYPE mood AS ENUM ('sad', 'happy');"
      "CREATE TABLE ws_types (id int PRIMARY KEY, t text, n numeric(10,2), nan numeric, inf float8, b bool, arr text[], "
      "  bits bit(3), c char(4), vc varchar(8), j jsonb, js json, ts timestamptz, d date, tm time, iv interval, "
      "  by bytea, u uuid, ip inet, m mood, ia int[], ch \"char\", s smallint, bg bigint, r real, pt point, rg int4range, "
      "  tsv tsvector, o oid, big text);"
      "CREATE TABLE ws_full (id int PRIMARY KEY, v text, w text); ALTER TABLE ws_full REPLICA IDENTITY FULL;"
      "CREATE TABLE ws_parted (id int, v text) PARTITION BY RANGE (id);"
      "CREATE TABLE ws_parted_low PARTITION OF ws_parted FOR VALUES FROM (0) TO (100);"
      "CREATE TABLE ws_parted_high PARTITION OF ws_parted FOR VALUES FROM (100) TO (1000);"
      "CREATE TABLE \"Ws Mixed\" (\"Key\" serial PRIMARY KEY, \"user\" text);"
      "CREATE TABLE ws_big (id int PRIMARY KEY, v text);"
      "CREATE PUBLICATION ws_pub FOR ALL TABLES");
}

}  // namespace

TEST_CASE("pg_recvlogical reads test_decoding from walgate, byte for byte what the server's own test_decoding sends") {
  REQUIRE_MESSAGE(recvlogical()[0] != '\0', "pg_recvlogical is not installed (.ci/install-deps.sh installs postgresql-15)");
  fixture f;
  make_tables(*f.pg);
  f.start_walgate();
  // Three option sets: the defaults, skip-empty-xacts, and neither xids nor... with timestamps.
  const std::vector<std::vector<std::string>> option_sets = {
      {}, {"skip-empty-xacts=1"}, {"include-xids=0", "include-timestamp=1", "skip-empty-xacts=on"}};
  std::vector<child> readers;
  const auto files = f.start_pairs("test_decoding", "td", option_sets, readers);
  workload(*f.pg);
  const bool done = wait_for_marker(files, "'marker'");
  for (auto& r : readers) r.stop();
  REQUIRE_MESSAGE(done, "a reader did not get the last transaction; walgate said:\n"
                            << f.gw.log() << "\nits reader said:\n" << readers[1].output());
  for (std::size_t i = 0; i < option_sets.size(); ++i) {
    const auto ref = read_file(files[2 * i]), got = read_file(files[2 * i + 1]);
    INFO("options: " << (option_sets[i].empty() ? std::string("(none)") : option_sets[i].front()));
    CHECK(ref.size() > 100000 * 40);   // (the 100,000-row transaction is there)
    CHECK_MESSAGE(ref == got, first_difference(ref, got));
  }
  // Without skip-empty-xacts the server prints the empty transactions too (the DDL's, none here
  // after the slots): the same bytes. The walgate files hold the type names test_decoding prints.
  CHECK(read_file(files[1]).find("m[public.mood]:'happy'") != std::string::npos);
  CHECK(read_file(files[1]).find("table public.ws_full, public.\"Ws Mixed\": TRUNCATE: restart_seqs") != std::string::npos);
  CHECK(f.gw.log().find("replication slot td0 made (test_decoding)") != std::string::npos);
  // Caught up, a client waiting for walgate's durable position (--endpos) is told it by a
  // keepalive and stops by itself (no row follows to carry it there).
  std::string durable;
  {
    PGconn* c = PQconnectdb((f.downstream() + " replication=database").c_str());
    REQUIRE(PQstatus(c) == CONNECTION_OK);
    PGresult* r = PQexec(c, "IDENTIFY_SYSTEM");
    REQUIRE(PQresultStatus(r) == PGRES_TUPLES_OK);
    durable = PQgetvalue(r, 0, 2);
    PQclear(r);
    PQfinish(c);
  }
  child at_end;
  at_end.start({recvlogical(), "-d", f.downstream(), "--slot", "td0", "--start", "--endpos", durable, "--no-loop", "-f",
                (f.dir / "endpos.out").string()},
               f.dir / "endpos.log");
  int status = -1;
  const bool stopped = test::wait_until([&] { return waitpid(at_end.pid, &status, WNOHANG) == at_end.pid; }, std::chrono::seconds(20));
  if (stopped) at_end.pid = -1;
  CHECK_MESSAGE(stopped, "pg_recvlogical --endpos " << durable << " did not stop: " << at_end.output());
  CHECK((stopped && WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

TEST_CASE("pg_recvlogical reads wal2json from walgate, format-version 1 and 2, byte for byte what the real wal2json sends") {
  REQUIRE_MESSAGE(recvlogical()[0] != '\0', "pg_recvlogical is not installed (.ci/install-deps.sh installs postgresql-15)");
  fixture f;
  // (wal2json is Debian's postgresql-15-wal2json: the upstream must be PostgreSQL 15 to load it)
  REQUIRE_MESSAGE(f.pg->server_major() == 15,
                  "the wal2json comparison runs on PostgreSQL 15 (postgresql-15-wal2json): WALGATE_PG_MAJORS selects it");
  make_tables(*f.pg);
  f.start_walgate();
  // Option sets that walk every branch of the plugin's output: format 1 on one line, pretty,
  // in chunks; typmods off, type oids, LSNs, xids and times; format 2 with its transaction
  // objects, without them, with table, action and message filters (an escaped space in a name).
  const std::vector<std::vector<std::string>> option_sets = {
      {},
      {"pretty-print=1", "include-xids=1", "include-timestamp=1", "include-lsn=1", "include-not-null=1"},
      {"write-in-chunks=1", "include-typmod=0", "include-type-oids=1", "filter-tables=public.ws_big", "add-msg-prefixes=ntx,tx"},
      {"format-version=2"},
      {"format-version=2", "include-xids=1", "include-timestamp=1", "include-lsn=1", "include-type-oids=1", "include-not-null=1"},
      {"format-version=2", "include-transaction=0", "include-schemas=0", "include-types=0",
       "add-tables=public.ws_full,*.ws_parted_low,public.Ws\\ Mixed", "actions=insert,delete,truncate", "filter-msg-prefixes=mid"}};
  std::vector<child> readers;
  const auto files = f.start_pairs("wal2json", "wj", option_sets, readers);
  workload(*f.pg);
  const bool done = wait_for_marker_then_quiet(files, "\"marker\"");
  for (auto& r : readers) r.stop();
  REQUIRE_MESSAGE(done, "a reader did not get the last transaction; walgate said:\n"
                            << f.gw.log() << "\nits reader said:\n" << readers[1].output());
  for (std::size_t i = 0; i < option_sets.size(); ++i) {
    const auto ref = read_file(files[2 * i]), got = read_file(files[2 * i + 1]);
    std::string named;
    for (const auto& o : option_sets[i]) named += o + " ";
    INFO("options: " << (named.empty() ? std::string("(none)") : named));
    const bool all_rows = named.find("add-tables") == std::string::npos && named.find("ws_big") == std::string::npos;
    CHECK(ref.size() > (all_rows ? 100000u * 40 : 500u));   // (the 100,000 rows, unless filtered out)
    CHECK_MESSAGE(ref == got, first_difference(ref, got));
  }
  // What the files show of the plugin's quirks, walgate's side (equal to the server's above):
  const auto v1 = read_file(files[1]), v2 = read_file(files[7]), pretty = read_file(files[3]);
  CHECK(v1.find("\"columntypes\":[\"integer\",\"text\",\"numeric(10,2)\"") != std::string::npos);
  CHECK(v1.find("\"char\",") != std::string::npos);   // ("char" as format_type() quotes it, not escaped)
  CHECK(v1.find("{\"change\":[]}") != std::string::npos);   // (a TRUNCATE's transaction: format 1 prints no truncate)
  CHECK(v2.find("{\"action\":\"T\"") != std::string::npos);
  CHECK(v2.find("\"identity\":[{\"name\":\"id\",\"type\":\"integer\",\"value\":2},{\"name\":\"v\",\"type\":\"text\",\"value\":\"b\"},{\"name\":\"w\",\"type\":\"text\",\"value\":\"c\"}]") != std::string::npos);
  CHECK(pretty.find("\n\t\"xid\": ") != std::string::npos);
  CHECK(f.gw.log().find("replication slot wj0 made (wal2json)") != std::string::npos);
  // A table named in add-tables that walgate's publication does not publish: an error, never a
  // stream that stays empty; one it publishes (or a pattern matching one) streams.
  auto down = recvlogical_once({"-d", f.downstream(), "--slot", "wjx", "--plugin", "wal2json", "--create-slot"}, f.dir);
  REQUIRE_MESSAGE(down.first == 0, down.second);
  for (const std::string named : {"public.nope", "nowhere.*", "public.ws_full,*.nope"}) {
    INFO(named);
    auto refused = recvlogical_once({"-d", f.downstream(), "--slot", "wjx", "--start", "--no-loop", "-o", "add-tables=" + named,
                                     "-f", "-"},
                                    f.dir);
    CHECK(refused.first != 0);
    CHECK(refused.second.find("named by the client is not in walgate's publication \"ws_pub\"") != std::string::npos);
  }
  auto accepted = recvlogical_once({"-d", f.downstream(), "--slot", "wjx", "--start", "--no-loop", "-o",
                                    "add-tables=public.ws_full,*.ws_big", "--endpos", "0/1", "-f", "-"},
                                   f.dir);
  CHECK_MESSAGE(accepted.first == 0, accepted.second << f.gw.log());
}

TEST_CASE("50 downstream slots on one upstream slot, wal2json through the standard workload's shape: each consumer's bytes the real plugin's") {
  REQUIRE_MESSAGE(recvlogical()[0] != '\0', "pg_recvlogical is not installed (.ci/install-deps.sh installs postgresql-15)");
  fixture f;
  REQUIRE_MESSAGE(f.pg->server_major() == 15, "the wal2json comparison runs on PostgreSQL 15 (postgresql-15-wal2json)");
  // ../shared/bench/workload.sql's table; load.sh's changes at a tenth of its rows (CI's time):
  // 10 transactions of 1000 inserts, 20% updated and 10% deleted in two large ones.
  f.pg->sql(
      "CREATE TABLE bench_orders(id bigserial PRIMARY KEY, customer_id int NOT NULL, status text NOT NULL, "
      "amount numeric(12,2) NOT NULL, paid boolean NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), "
      "tags text[], meta jsonb); CREATE TABLE ws_full (id int PRIMARY KEY, v text, w text); "
      "CREATE PUBLICATION ws_pub FOR ALL TABLES");
  f.start_walgate();
  // Two kinds of consumer, 25 each: format 2 with LSNs (walgate reads ahead to each
  // transaction's end for its "B") and format 1 as pg_recvlogical users run it by default.
  const std::vector<std::vector<std::string>> kinds = {{"format-version=2", "include-lsn=1", "include-xids=1"}, {}};
  constexpr int consumers = 50;
  std::vector<child> refs(kinds.size()), readers(consumers);
  std::vector<std::filesystem::path> files;
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    auto up = recvlogical_once({"-d", f.upstream(), "--slot", "ref_" + std::to_string(k), "--plugin", "wal2json", "--create-slot"}, f.dir);
    REQUIRE_MESSAGE(up.first == 0, up.second);
  }
  for (int i = 0; i < consumers; ++i) {
    auto down = recvlogical_once({"-d", f.downstream(), "--slot", "c" + std::to_string(i), "--plugin", "wal2json", "--create-slot"}, f.dir);
    REQUIRE_MESSAGE(down.first == 0, down.second << f.gw.log());
  }
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    f.start_reader(refs[k], false, "ref_" + std::to_string(k), kinds[k], "ref_" + std::to_string(k) + ".out");
    files.push_back(f.dir / ("ref_" + std::to_string(k) + ".out"));
  }
  for (int i = 0; i < consumers; ++i) {
    f.start_reader(readers[static_cast<std::size_t>(i)], true, "c" + std::to_string(i), kinds[static_cast<std::size_t>(i) % kinds.size()],
                   "c" + std::to_string(i) + ".out");
    files.push_back(f.dir / ("c" + std::to_string(i) + ".out"));
    // (at most 16 connections of one address in their startup at once: a moment between starts)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  f.pg->sql(
      "DO $$ DECLARE i int; BEGIN FOR i IN 0..9 LOOP "
      "INSERT INTO bench_orders(customer_id,status,amount,paid,tags,meta) "
      "SELECT g % 5000, (ARRAY['pending','paid','shipped'])[1 + g % 3], (g % 100000)/100.0, g % 2 = 0, "
      "ARRAY['t' || (g % 7), 'x'], jsonb_build_object('k', g, 'note', 'order ' || g) "
      "FROM generate_series(i*1000+1, (i+1)*1000) g; COMMIT; END LOOP; END $$");
  f.pg->sql("UPDATE bench_orders SET status='shipped', amount=amount+1 WHERE id % 5 = 0");
  f.pg->sql("DELETE FROM bench_orders WHERE id % 10 = 3");
  f.pg->sql("INSERT INTO ws_full VALUES (424242, 'marker', 'end')");
  const bool done = wait_for_marker_then_quiet(files, "\"marker\"", std::chrono::seconds(300));
  // The upstream's walsenders while 50 consumers read: walgate's one and the two references'.
  const auto senders = f.pg->sql("SELECT slot_name, active_pid FROM pg_replication_slots WHERE active ORDER BY slot_name");
  auto cpu_seconds = [](const std::string& pid) {
    std::ifstream stat("/proc/" + pid + "/stat");
    std::string line;
    std::getline(stat, line);
    std::istringstream fields(line.substr(line.rfind(')') + 2));
    std::vector<std::string> v(13);
    for (auto& x : v) fields >> x;   // (state … stime: fields 3 to 15)
    return (std::stod(v[11]) + std::stod(v[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
  };
  std::string cpu;
  for (const auto& row : senders) cpu += *row[0] + " " + std::to_string(cpu_seconds(*row[1])) + " s; ";
  MESSAGE("upstream walsenders' CPU with 50 downstream consumers: " << cpu);
  for (auto& r : readers) r.stop();
  for (auto& r : refs) r.stop();
  REQUIRE_MESSAGE(done, "a reader did not get the last transaction; walgate said:\n" << f.gw.log());
  CHECK(senders.size() == 3);   // (walgate's own slot and the two references: one decoder for all 50)
  std::vector<std::string> reference;
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    reference.push_back(read_file(files[k]));
    CHECK(reference.back().size() > 13000u * 100);
  }
  int equal = 0;
  for (int i = 0; i < consumers; ++i) {
    const auto got = read_file(files[kinds.size() + static_cast<std::size_t>(i)]);
    const auto& ref = reference[static_cast<std::size_t>(i) % kinds.size()];
    INFO("consumer c" << i);
    CHECK_MESSAGE(got == ref, first_difference(ref, got));
    equal += got == ref;
  }
  CHECK(equal == consumers);
}

TEST_CASE("downstream slots survive kill -9 of walgate: a resuming pg_recvlogical gets exactly the rest") {
  REQUIRE_MESSAGE(recvlogical()[0] != '\0', "pg_recvlogical is not installed (.ci/install-deps.sh installs postgresql-15)");
  fixture f;
  f.pg->sql("CREATE TABLE ws_k (id int PRIMARY KEY, v text); CREATE PUBLICATION ws_pub FOR ALL TABLES");
  f.start_walgate();
  f.make_slots("kk");
  child ref, got;
  f.start_reader(ref, false, "ref_kk", {"skip-empty-xacts=1"}, "ref.out");
  f.start_reader(got, true, "kk", {"skip-empty-xacts=1"}, "got.out");
  // A writer throughout: one row per transaction.
  std::atomic<bool> stop{false};
  std::atomic<int> written{0};
  std::thread writer([&] {
    sql_conn c(f.upstream());
    for (int i = 1; !stop; ++i) {
      if (c.exec("INSERT INTO ws_k VALUES (" + std::to_string(i) + ", md5('" + std::to_string(i) + "'))")) written = i;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  auto rows_in = [&](const std::filesystem::path& p) {
    auto t = read_file(p);
    std::size_t n = 0;
    for (auto at = t.find("INSERT:"); at != std::string::npos; at = t.find("INSERT:", at + 1)) ++n;
    return n;
  };
  // 1. pg_recvlogical stopped cleanly (its position confirmed), then walgate killed -9 and
  // restarted: the slot's confirmed position is what the restarted client resumes from.
  REQUIRE(test::wait_until([&] { return rows_in(f.dir / "got.out") > 200; }, std::chrono::seconds(60)));
  CHECK(got.stop(SIGINT) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(f.gw.kill_with(SIGKILL) == 128 + SIGKILL);
  const auto slots_file = read_file(f.dir / "data" / "replication-slots");
  CHECK_MESSAGE(slots_file.rfind("walgate replication slots 1\nkk test_decoding ", 0) == 0, slots_file);
  f.start_walgate();
  f.start_reader(got, true, "kk", {"skip-empty-xacts=1"}, "got.out");   // (appends)
  // 2. walgate killed -9 under a streaming client, twice: the client reconnects by itself
  // (pg_recvlogical retries every 5 s) and resumes from where it confirmed.
  // Each kill comes once the slot's file holds a position past the one its last start said
  // (the client confirms what it wrote each second, -s 1 -F 1): durable, the next start uses it.
  auto stored = [&] {
    auto text = read_file(f.dir / "data" / "replication-slots");
    auto at = text.find("\nkk test_decoding ");
    if (at == std::string::npos) return std::uint64_t{0};
    at += 18;
    auto l = protocol::lsn::parse(text.substr(at, text.find(' ', at) - at));
    return l ? l->value : 0;
  };
  for (int round = 0; round < 2; ++round) {
    const auto before = stored();
    REQUIRE_MESSAGE(test::wait_until([&] { return stored() > before; }, std::chrono::seconds(60)), f.gw.log());
    CHECK(f.gw.kill_with(SIGKILL) == 128 + SIGKILL);
    f.start_walgate();
  }
  // 3. pg_recvlogical itself killed -9 mid-stream and started again: it asks for the position it
  // had flushed, and gets exactly the rest from there (what it asks for again, again).
  {
    const auto before = stored();
    REQUIRE_MESSAGE(test::wait_until([&] { return stored() > before; }, std::chrono::seconds(60)), f.gw.log());
    CHECK(got.stop(SIGKILL) == 128 + SIGKILL);
    f.start_reader(got, true, "kk", {"skip-empty-xacts=1"}, "got.out");   // (appends)
    const auto again = rows_in(f.dir / "got.out");
    REQUIRE(test::wait_until([&] { return rows_in(f.dir / "got.out") > again + 50; }, std::chrono::seconds(60)));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  writer.join();
  f.pg->sql("INSERT INTO ws_k VALUES (424242, 'marker')");
  const bool done = wait_for_marker({f.dir / "ref.out", f.dir / "got.out"}, "'marker'");
  ref.stop();
  got.stop();
  REQUIRE_MESSAGE(done, f.gw.log() << got.output());
  // Whole transactions seen twice (what the client asked for again) are dropped; nothing else may differ.
  auto transactions = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string line, cur;
    while (std::getline(in, line)) {
      if (line.rfind("BEGIN", 0) == 0 && !cur.empty()) cur.clear();   // (cut off by a kill: sent again whole)
      cur += line + "\n";
      if (line.rfind("COMMIT", 0) == 0) {
        out.push_back(cur);
        cur.clear();
      }
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
  };
  const auto ref_tx = transactions(read_file(f.dir / "ref.out"));
  auto got_tx = transactions(read_file(f.dir / "got.out"));
  std::vector<std::string> deduplicated;
  std::set<std::string> seen;
  std::size_t repeated = 0;
  for (const auto& t : got_tx) {
    if (!seen.insert(t).second) {
      ++repeated;
      continue;
    }
    deduplicated.push_back(t);
  }
  // Each start resumed where the slot's confirmed position was stored, which moved on.
  std::vector<std::uint64_t> starts;
  {
    const auto log = f.gw.log();
    const std::string key = "replication slot kk streaming to connection ";
    for (auto at = log.find(key); at != std::string::npos; at = log.find(key, at + 1)) {
      auto from = log.find(" from ", at);
      auto end = log.find('\n', from);
      auto l = protocol::lsn::parse(log.substr(from + 6, end - from - 6));
      REQUIRE(l.has_value());
      starts.push_back(l->value);
    }
  }
  REQUIRE(starts.size() >= 4);
  for (std::size_t i = 1; i < starts.size(); ++i) CHECK(starts[i] >= starts[i - 1]);
  CHECK(starts[2] > starts[1]);   // (confirmed while streaming, kept across kill -9)
  CHECK(starts.back() > starts[2]);
  MESSAGE("transactions: " << ref_tx.size() << " from the server, " << got_tx.size() << " through walgate (" << repeated
                           << " seen again after a reconnection)");
  CHECK(ref_tx.size() > 600);
  CHECK(deduplicated == ref_tx);
}

TEST_CASE("what a replication client may send wrong: PostgreSQL's errors, walgate unharmed") {
  fixture f("Europe/Paris");
  f.timeout = "4";
  f.pg->sql("CREATE TABLE ws_e (id int PRIMARY KEY); CREATE PUBLICATION ws_pub FOR ALL TABLES");
  // Before walgate has reached PostgreSQL, it cannot say what the upstream is: 57P03.
  {
    walgate_process early;
    const auto port = free_port();
    early.args = {"--pg", "host=127.0.0.1 port=1 user=postgres dbname=postgres connect_timeout=2", "--slot", "x", "--publication",
                  "ws_pub", "--data-dir", (f.dir / "early").string(), "--listen", "127.0.0.1:" + std::to_string(free_port()),
                  "--replication-listen", "127.0.0.1:" + std::to_string(port)};
    early.start();
    REQUIRE(test::wait_until([&] { return early.log().find("replication clients served on") != std::string::npos; }));
    PGconn* c = PQconnectdb(("host=127.0.0.1 port=" + std::to_string(port) +
                             " user=postgres dbname=postgres replication=database sslmode=disable").c_str());
    CHECK(PQstatus(c) == CONNECTION_BAD);
    CHECK_MESSAGE(std::string(PQerrorMessage(c)).find("walgate has not connected to its upstream PostgreSQL yet") !=
                      std::string::npos,
                  PQerrorMessage(c));
    PQfinish(c);
    early.kill_with(SIGTERM);
  }
  f.start_walgate();
  auto connect = [&](const std::string& extra = " replication=database") {
    PGconn* c = PQconnectdb((f.downstream() + extra).c_str());
    return c;
  };
  auto error_of = [](PGconn* c, const std::string& q) {
    PGresult* r = PQexec(c, q.c_str());
    std::string e = PQresultStatus(r) == PGRES_FATAL_ERROR ? PQresultErrorMessage(r) : std::string("(no error)");
    std::string state = PQresultErrorField(r, PG_DIAG_SQLSTATE) ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : "";
    PQclear(r);
    return state + " " + e;
  };
  PGconn* a = connect();
  REQUIRE_MESSAGE(PQstatus(a) == CONNECTION_OK, PQerrorMessage(a));
  CHECK(std::string(PQparameterStatus(a, "server_version")) == f.pg->sql("SHOW server_version")[0][0].value());
  {
    PGresult* r = PQexec(a, "IDENTIFY_SYSTEM");
    REQUIRE(PQresultStatus(r) == PGRES_TUPLES_OK);
    CHECK(std::string(PQgetvalue(r, 0, 0)) == f.pg->sql("SELECT system_identifier::text FROM pg_control_system()")[0][0].value());
    CHECK(std::string(PQgetvalue(r, 0, 3)) == "postgres");
    PQclear(r);
  }
  {
    PGresult* r = PQexec(a, "IDENTIFY_SYSTEM");
    REQUIRE(PQresultStatus(r) == PGRES_TUPLES_OK);
    auto pos = protocol::lsn::parse(PQgetvalue(r, 0, 2));   // walgate's durable position
    auto now = protocol::lsn::parse(f.pg->sql("SELECT pg_current_wal_lsn()::text")[0][0].value());
    REQUIRE(pos.has_value());
    CHECK(pos->value > 0);
    CHECK(pos->value <= now->value);
    CHECK(std::string(PQgetvalue(r, 0, 1)) == "1");
    PQclear(r);
  }
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e1 LOGICAL test_decoding (SNAPSHOT 'nothing')") == " (no error)");
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e9 LOGICAL test_decoding (SNAPSHOT 'nothing', TWO_PHASE true, FAILOVER)") ==
        " (no error)");
  CHECK(read_file(f.dir / "data" / "replication-slots").find("\ne9 test_decoding ") != std::string::npos);
  CHECK(read_file(f.dir / "data" / "replication-slots").find(" two_phase,failover\n") != std::string::npos);
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e8 LOGICAL test_decoding NOEXPORT_SNAPSHOT") == " (no error)");
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e1 LOGICAL test_decoding (SNAPSHOT 'nothing')") ==
        "42710 ERROR:  replication slot \"e1\" already exists\n");
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT \"E-1\" LOGICAL test_decoding (SNAPSHOT 'nothing')")
            .rfind("42602 ERROR:  replication slot name \"E-1\" contains invalid character", 0) == 0);
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e2 LOGICAL decoderbufs (SNAPSHOT 'nothing')")
            .find("output plugin \"decoderbufs\" is not served by walgate yet") != std::string::npos);
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e2 LOGICAL test_decoding").find("cannot export a snapshot") != std::string::npos);
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e2 PHYSICAL").find("physical slots are not made here") != std::string::npos);
  CHECK(error_of(a, "START_REPLICATION 0/0").find("physical replication is not served here") != std::string::npos);
  CHECK(error_of(a, "SELECT 1").find("walgate's walsender does not run SQL") != std::string::npos);
  CHECK(error_of(a, "IDENTIFY_SYSTEM extra") == "42601 ERROR:  syntax error\n");   // (bison's bare text, as the server's)
  // (A name is cut to 63 bytes, quoted or not, with the server's lexer's NOTICE.)
  {
    static std::string notices;
    PQsetNoticeProcessor(a, [](void*, const char* m) { notices += m; }, nullptr);
    CHECK_MESSAGE(error_of(a, "CREATE_REPLICATION_SLOT \"" + std::string(64, 'n') + "\" LOGICAL test_decoding (SNAPSHOT 'nothing')") ==
                      " (no error)",
                  f.gw.log());
    CHECK(notices == "NOTICE:  identifier \"" + std::string(64, 'n') + "\" will be truncated to \"" + std::string(63, 'n') + "\"\n");
    CHECK(read_file(f.dir / "data" / "replication-slots").find("\n" + std::string(63, 'n') + " test_decoding ") != std::string::npos);
    CHECK(error_of(a, "DROP_REPLICATION_SLOT " + std::string(63, 'n')) == " (no error)");
  }
  // At most 1000 slots (temporary ones too): the next is PostgreSQL's 53400.
  {
    PGconn* t = connect();
    REQUIRE(PQstatus(t) == CONNECTION_OK);
    std::size_t before = 0;   // (the slots there are now, temporary ones too: /v1/slots lists them)
    {
      const auto listed = http_get(f.http_port, "/v1/slots").second;
      for (auto at = listed.find("{\"slot\":"); at != std::string::npos; at = listed.find("{\"slot\":", at + 1)) ++before;
    }
    REQUIRE(before > 0);
    std::string refused;
    std::size_t made_here = 0;
    for (std::size_t i = 0; i < 1100 && refused.empty(); ++i) {
      const auto e = error_of(t, "CREATE_REPLICATION_SLOT cap_" + std::to_string(i) + " TEMPORARY LOGICAL test_decoding (SNAPSHOT 'nothing')");
      if (e == " (no error)") ++made_here;
      else refused = e;
    }
    CHECK_MESSAGE(refused.rfind("53400 ERROR:  all replication slots are in use\nHINT:  Free one or increase max_replication_slots.", 0) == 0,
                  refused);
    CHECK(made_here + before == 1000);
    PQfinish(t);   // (its temporary slots go with it)
    CHECK(test::wait_until([&] { return error_of(a, "CREATE_REPLICATION_SLOT cap_after TEMPORARY LOGICAL test_decoding (SNAPSHOT 'nothing')") == " (no error)"; }));
    CHECK(error_of(a, "DROP_REPLICATION_SLOT cap_after") == " (no error)");
  }
  // The options as the server's parseCreateReplSlotOptions takes them.
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e3 LOGICAL test_decoding (SNAPSHOT 'nothing', RESERVE_WAL)") ==
        "42601 ERROR:  conflicting or redundant options\n");
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e3 LOGICAL test_decoding (SNAPSHOT 'nothing', SNAPSHOT 'nothing')") ==
        "42601 ERROR:  conflicting or redundant options\n");
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e3 LOGICAL test_decoding (SNAPSHOT 'bogus')") ==
        "22023 ERROR:  unrecognized value for CREATE_REPLICATION_SLOT option \"snapshot\": \"bogus\"\n");
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e3 LOGICAL test_decoding (SNAPSHOT 'nothing', TWO_PHASE maybe)") ==
        "42601 ERROR:  two_phase requires a Boolean value\n");
  CHECK(error_of(a, "CREATE_REPLICATION_SLOT e3 LOGICAL test_decoding (SNAPSHOT 'nothing', bogus)") ==
        "XX000 ERROR:  unrecognized option: bogus\n");
  CHECK(error_of(a, "SHOW work_mem") == "42704 ERROR:  unrecognized configuration parameter \"work_mem\"\n");
  CHECK(error_of(a, "START_REPLICATION SLOT nope LOGICAL 0/0") == "42704 ERROR:  replication slot \"nope\" does not exist\n");
  CHECK(error_of(a, "START_REPLICATION SLOT e1 LOGICAL 0/0 (\"include-xid\" '1')") ==
        "22023 ERROR:  option \"include-xid\" = \"1\" is unknown\n");
  // The session the log's values were printed in: UTC, ISO — said so, whatever the server's default.
  CHECK(std::string(PQparameterStatus(a, "TimeZone")) == "UTC");
  CHECK(std::string(PQparameterStatus(a, "DateStyle")) == "ISO, YMD");
  CHECK(f.pg->sql("SHOW timezone")[0][0].value() == "Europe/Paris");
  {
    PGresult* r = PQexec(a, "SHOW server_version_num");
    REQUIRE(PQresultStatus(r) == PGRES_TUPLES_OK);
    CHECK(std::string(PQgetvalue(r, 0, 0)) == f.pg->sql("SHOW server_version_num")[0][0].value());
    PQclear(r);
  }
  // A client silent while streaming: a keepalive asking for a reply after half the timeout (4 s),
  // then disconnected at the timeout.
  {
    PGconn* q = connect();
    REQUIRE(PQstatus(q) == CONNECTION_OK);
    CHECK(error_of(q, "CREATE_REPLICATION_SLOT quiet LOGICAL test_decoding (SNAPSHOT 'nothing')") == " (no error)");
    PGresult* r = PQexec(q, "START_REPLICATION SLOT quiet LOGICAL 0/0");
    REQUIRE(PQresultStatus(r) == PGRES_COPY_BOTH);
    PQclear(r);
    const auto began = std::chrono::steady_clock::now();
    bool asked = false;
    double asked_after = 0, closed_after = 0;
    for (;;) {
      char* buf = nullptr;
      int n = PQgetCopyData(q, &buf, 0);
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      if (n < 0) {
        closed_after = t;
        break;
      }
      if (n == 18 && buf[0] == 'k' && buf[17] == 1 && !asked) {
        asked = true;
        asked_after = t;
      }
      PQfreemem(buf);
    }
    CHECK(asked);
    CHECK(asked_after >= 1.5);
    CHECK(asked_after < 3.5);
    CHECK(closed_after >= 3.5);
    CHECK(closed_after < 8);
    // (walgate's log line may reach its file a moment after the client saw the socket close)
    CHECK(test::wait_until([&] { return f.gw.log().find("(slot quiet) sent nothing for 4000 ms: disconnected") != std::string::npos; },
                           std::chrono::seconds(5)));
    PQfinish(q);
  }
  // A client confirming what it was never sent: the slot does not move past what it was given.
  {
    PGconn* q = connect();
    REQUIRE(PQstatus(q) == CONNECTION_OK);
    CHECK(error_of(q, "CREATE_REPLICATION_SLOT far LOGICAL test_decoding (SNAPSHOT 'nothing')") == " (no error)");
    PGresult* r = PQexec(q, "START_REPLICATION SLOT far LOGICAL 0/0");
    REQUIRE(PQresultStatus(r) == PGRES_COPY_BOTH);
    PQclear(r);
    std::string update(1, 'r');
    for (int field = 0; field < 3; ++field) update += std::string(8, '\xff');
    update += std::string(8, '\0') + std::string(1, '\0');
    REQUIRE(PQputCopyData(q, update.data(), static_cast<int>(update.size())) == 1);
    REQUIRE(PQputCopyEnd(q, nullptr) == 1);
    REQUIRE(PQflush(q) == 0);
    char* buf = nullptr;
    while (PQgetCopyData(q, &buf, 0) > 0) PQfreemem(buf);
    PQfinish(q);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto file = read_file(f.dir / "data" / "replication-slots");
    auto at = file.find("\nfar test_decoding ");
    REQUIRE(at != std::string::npos);
    at += 19;
    auto l = protocol::lsn::parse(file.substr(at, file.find(' ', at) - at));
    REQUIRE(l.has_value());
    CHECK(l->value < 0xFFFFFFFF00000000ull);
  }
  // The extended protocol: refused, and the connection goes on.
  {
    PGresult* r = PQprepare(a, "s", "IDENTIFY_SYSTEM", 0, nullptr);
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
    CHECK(std::string(PQresultErrorMessage(r)).find("extended query protocol not supported in a replication connection") !=
          std::string::npos);
    PQclear(r);
    CHECK(error_of(a, "SHOW data_directory_mode") == " (no error)");
  }
  // An active slot: PostgreSQL's text, word for word (Debezium matches it).
  {
    child reader;
    f.start_reader(reader, true, "e1", {}, "e1.out");
    REQUIRE_MESSAGE(test::wait_until([&] { return f.gw.this_run().find("replication slot e1 streaming to connection") != std::string::npos; }),
                    f.gw.log() << reader.output());
    const auto e = error_of(a, "START_REPLICATION SLOT e1 LOGICAL 0/0");
    CHECK_MESSAGE(e.rfind("55006 ERROR:  replication slot \"e1\" is active for PID ", 0) == 0, e);
    CHECK(error_of(a, "DROP_REPLICATION_SLOT e1").rfind("55006 ERROR:  replication slot \"e1\" is active for PID ", 0) == 0);
    // DROP … WAIT waits for the slot to be let go.
    std::string waited;
    std::thread dropper([&] {
      PGconn* d = connect();
      waited = error_of(d, "DROP_REPLICATION_SLOT e1 WAIT");
      PQfinish(d);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    CHECK(waited.empty());   // (still waiting)
    CHECK(reader.stop(SIGINT) == 0);
    dropper.join();
    CHECK(waited == " (no error)");
    CHECK(error_of(a, "DROP_REPLICATION_SLOT e1").rfind("42704", 0) == 0);
  }
  // A temporary slot goes with its connection.
  {
    PGconn* t = connect();
    REQUIRE(PQstatus(t) == CONNECTION_OK);
    CHECK(error_of(t, "CREATE_REPLICATION_SLOT tmp1 TEMPORARY LOGICAL test_decoding (SNAPSHOT 'nothing')") == " (no error)");
    CHECK(error_of(a, "DROP_REPLICATION_SLOT tmp1").rfind("55006 ERROR:  replication slot \"tmp1\" is active for PID ", 0) == 0);
    CHECK(error_of(t, "CREATE_REPLICATION_SLOT tmp2 TEMPORARY LOGICAL test_decoding (SNAPSHOT 'nothing')") == " (no error)");
    PQfinish(t);
    CHECK(test::wait_until([&] { return error_of(a, "DROP_REPLICATION_SLOT tmp2").rfind("42704", 0) == 0; }));
    CHECK(error_of(a, "DROP_REPLICATION_SLOT tmp1").rfind("42704", 0) == 0);   // (both went with their connection)
    CHECK(read_file(f.dir / "data" / "replication-slots").find("tmp2") == std::string::npos);
  }
  PQfinish(a);
  // Not a replication connection: a FATAL that says what this endpoint serves.
  {
    PGconn* c = connect("");
    CHECK(PQstatus(c) == CONNECTION_BAD);
    CHECK(std::string(PQerrorMessage(c)).find("walgate serves logical replication connections only") != std::string::npos);
    PQfinish(c);
    c = connect(" replication=true");
    CHECK(PQstatus(c) == CONNECTION_BAD);
    PQfinish(c);
    c = PQconnectdb(("host=127.0.0.1 port=" + std::to_string(f.repl_port) +
                     " user=postgres dbname=other replication=database sslmode=disable").c_str());
    CHECK(std::string(PQerrorMessage(c)).find("database \"other\" does not exist") != std::string::npos);
    PQfinish(c);
  }
  // A startup packet of 10 MB: refused on its length alone, before anything is buffered.
  {
    asio::io_context io;
    tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), f.repl_port});
    std::string packet(8, '\0');
    const std::uint32_t len = 10u << 20;
    for (int i = 0; i < 4; ++i) packet[i] = static_cast<char>((len >> (24 - 8 * i)) & 0xff);
    packet[5] = 3;
    boost::system::error_code ec;
    asio::write(s, asio::buffer(packet), ec);
    std::string answer(4096, '\0');
    auto n = s.read_some(asio::buffer(answer), ec);
    answer.resize(ec ? 0 : n);
    CHECK(answer.find("invalid startup packet") != std::string::npos);
  }
  // SSLRequest and GSSENCRequest: 'N'; a CancelRequest: closed.
  for (std::uint32_t code : {80877103u, 80877104u, 80877102u}) {
    asio::io_context io;
    tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), f.repl_port});
    std::string packet;
    const std::uint32_t len = code == 80877102u ? 16 : 8;
    for (std::uint32_t v : {len, code, 42u, 7u}) {
      if (packet.size() == len) break;
      for (int i = 0; i < 4; ++i) packet.push_back(static_cast<char>((v >> (24 - 8 * i)) & 0xff));
    }
    boost::system::error_code ec;
    asio::write(s, asio::buffer(packet), ec);
    char answer[8];
    auto n = s.read_some(asio::buffer(answer), ec);
    const bool answered_n = !ec && n == 1 && answer[0] == 'N';
    const bool closed = ec == asio::error::eof;
    CHECK_MESSAGE((code == 80877102u ? closed : answered_n), "request code " << code);
  }
  // A connection that never finishes its startup is closed after 10 s.
  {
    asio::io_context io;
    tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), f.repl_port});
    const auto began = std::chrono::steady_clock::now();
    char c;
    boost::system::error_code ec;
    s.read_some(asio::buffer(&c, 1), ec);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    CHECK(ec == asio::error::eof);
    CHECK(waited >= 9);
    CHECK(waited < 20);
  }
  // 16 connections of one address in their startup at once; the next one is refused (no host
  // keeps the others out with connections that never authenticate).
  {
    asio::io_context io;
    std::vector<std::unique_ptr<tcp::socket>> held;
    for (int i = 0; i < 16; ++i) {
      held.push_back(std::make_unique<tcp::socket>(io));
      held.back()->connect({asio::ip::make_address("127.0.0.1"), f.repl_port});
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));   // (all accepted)
    tcp::socket extra(io);
    extra.connect({asio::ip::make_address("127.0.0.1"), f.repl_port});
    std::string answer(512, '\0');
    boost::system::error_code ec;
    auto n = extra.read_some(asio::buffer(answer), ec);
    answer.resize(ec ? 0 : n);
    CHECK_MESSAGE(answer.find("too many connections from 127.0.0.1 in their startup at once (16)") != std::string::npos, answer);
    CHECK(answer.find("53300") != std::string::npos);
  }
  // 256 connections at once (past their startup); the next one is told "too many clients".
  {
    // (the 16 above gone from walgate first: it notices their close as it reads)
    REQUIRE(test::wait_until([&] {
      PGconn* c = connect();
      const bool ok = PQstatus(c) == CONNECTION_OK;
      PQfinish(c);
      return ok;
    }));
    std::vector<PGconn*> held;
    std::string refused;
    for (int i = 0; i < 300 && refused.empty(); ++i) {
      PGconn* c = connect();
      if (PQstatus(c) == CONNECTION_OK) held.push_back(c);
      else refused = PQerrorMessage(c);
      if (PQstatus(c) != CONNECTION_OK) PQfinish(c);
    }
    CHECK_MESSAGE(refused.find("sorry, too many clients already") != std::string::npos, refused);
    CHECK(held.size() >= 255);   // (the connection above holds one place)
    CHECK(held.size() <= 256);
    for (auto* c : held) PQfinish(c);
  }
  // Walgate goes on: a new connection works (once the 256 above are gone).
  PGconn* b = nullptr;
  CHECK(test::wait_until([&] {
    if (b) PQfinish(b);
    b = connect();
    return PQstatus(b) == CONNECTION_OK;
  }));
  CHECK(error_of(b, "IDENTIFY_SYSTEM") == " (no error)");
  PQfinish(b);
  // A slots' file that does not read back exactly: walgate does not start on it.
  CHECK(f.gw.kill_with(SIGTERM) == 0);
  {
    std::ofstream(f.dir / "data" / "replication-slots") << "walgate replication slots 1\nbad name test_decoding 0/0 -\n";
  }
  f.gw.start();
  CHECK(f.gw.wait() == 1);
  CHECK_MESSAGE(f.gw.this_run().find("replication-slots: line 2 is not \"<slot> <plugin> <X/Y> <flags>\"") != std::string::npos,
                f.gw.this_run());
}

TEST_CASE("SCRAM-SHA-256 against --replication-users: PostgreSQL's verifiers and walgate's, the same 28P01 for a wrong password and an unknown user, a limit per address, SIGHUP") {
  fixture f;
  f.pg->sql("CREATE TABLE ws_auth (id int PRIMARY KEY); CREATE PUBLICATION ws_pub FOR ALL TABLES");
  // A verifier PostgreSQL made (as pg_authid holds it) and one `walgate replication-user` made.
  f.pg->sql("SET password_encryption = 'scram-sha-256'; CREATE ROLE from_pg LOGIN PASSWORD 'made by postgres'");
  const std::string pg_verifier =
      f.pg->sql("SELECT rolpassword FROM pg_authid WHERE rolname = 'from_pg'")[0][0].value();
  REQUIRE(pg_verifier.rfind("SCRAM-SHA-256$", 0) == 0);
  const auto users = f.dir / "replication-users";
  std::string alice_line;
  {
    const std::string cmd = "printf 's3cret \\303\\251 and '\\''quotes'\\''\\n' | " + std::string(WALGATE_BINARY) +
                            " replication-user alice --iterations 1024";
    FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p);
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) alice_line += buf;
    REQUIRE(pclose(p) == 0);
  }
  REQUIRE(alice_line.rfind("alice SCRAM-SHA-256$1024:", 0) == 0);
  std::ofstream(users) << "# replication users\n\n" << alice_line << "from_pg   " << pg_verifier << "\n";
  f.listen_host = "0.0.0.0";   // (any address, once there are users)
  f.extra_args = {"--replication-users", users.string(), "--auth-failures-per-minute", "3"};
  f.start_walgate();
  CHECK(f.gw.this_run().find("SCRAM-SHA-256, 2 user(s)") != std::string::npos);
  const std::string alice_password = "s3cret \xc3\xa9 and 'quotes'";

  // pg_recvlogical authenticates with the password (PGPASSWORD) and makes a slot.
  {
    auto made = recvlogical_once({"-d", f.downstream_as("alice", alice_password), "--slot", "scram_slot", "--plugin",
                                  "test_decoding", "--create-slot"},
                                 f.dir);
    CHECK_MESSAGE(made.first == 0, made.second << f.gw.log());
  }
  // "ok" when connected and IDENTIFY_SYSTEM answered; else libpq's error.
  auto connect = [&](const std::string& conninfo) {
    PGconn* c = PQconnectdb((conninfo + " replication=database").c_str());
    std::string e = PQstatus(c) == CONNECTION_OK ? "" : PQerrorMessage(c);
    if (e.empty()) {
      PGresult* r = PQexec(c, "IDENTIFY_SYSTEM");
      if (PQresultStatus(r) != PGRES_TUPLES_OK) e = PQresultErrorMessage(r);
      PQclear(r);
    }
    PQfinish(c);
    return e.empty() ? std::string("ok") : e;
  };
  {  // what the client is told of itself: its own name, not walgate's upstream role
    PGconn* c = PQconnectdb((f.downstream_as("alice", alice_password) + " replication=database").c_str());
    REQUIRE_MESSAGE(PQstatus(c) == CONNECTION_OK, PQerrorMessage(c));
    CHECK(std::string(PQparameterStatus(c, "session_authorization")) == "alice");
    CHECK(std::string(PQparameterStatus(c, "is_superuser")) == "off");
    PQfinish(c);
  }
  CHECK(connect(f.downstream_as("from_pg", "made by postgres")) == "ok");   // PostgreSQL's own verifier
  CHECK(connect(f.downstream_as("alice", alice_password)) == "ok");
  // A wrong password and a user not in the file: the same FATAL (and the same exchange before it).
  const auto wrong = connect(f.downstream_as("alice", "not it"));
  CHECK_MESSAGE(wrong.find("FATAL:  password authentication failed for user \"alice\"") != std::string::npos, wrong);
  const auto nobody = connect(f.downstream_as("mallory", "anything"));
  CHECK_MESSAGE(nobody.find("FATAL:  password authentication failed for user \"mallory\"") != std::string::npos, nobody);
  // The database is named only after authentication.
  CHECK(nobody.find("walgate serves the database") == std::string::npos);
  CHECK(test::wait_until([&] {   // (the line reaches the test through walgate's stderr: soon, not at once)
    return f.gw.log().find("replication client from 127.0.0.1: authentication of user \"mallory\" failed") !=
           std::string::npos;
  }));
  // (Not even the password's hash crossed: neither appears in walgate's log.)
  CHECK(f.gw.log().find("not it") == std::string::npos);
  // The third failure this minute from 127.0.0.1: then even the right password waits.
  // (a user name that would forge a log line: escaped there)
  CHECK(connect(f.downstream_as("x\nwalgate: forged", "wrong")).find("password authentication failed") != std::string::npos);
  CHECK(test::wait_until([&] { return f.gw.log().find("user \"x\\x0awalgate: forged\" failed") != std::string::npos; }));
  CHECK(f.gw.log().find("\nwalgate: forged") == std::string::npos);
  const auto limited = connect(f.downstream_as("alice", alice_password));
  CHECK_MESSAGE(limited.find("too many failed authentications from 127.0.0.1: try again in") != std::string::npos, limited);
  CHECK(http_get(f.http_port, "/metrics").second.find("\nwalgate_replication_auth_failures_total 3\n") != std::string::npos);

  // SIGHUP reads the file again: a bad file leaves the users in use; a good one replaces them.
  std::ofstream(users) << alice_line << "nothing-after-the-name\n";
  ::kill(f.gw.pid, SIGHUP);
  CHECK(test::wait_until([&] { return f.gw.this_run().find("; the replication users in use stay") != std::string::npos; }));
  CHECK(f.gw.this_run().find("line 2: expected NAME VERIFIER") != std::string::npos);
  {  // a file over 16 MiB is not read (a file on disk is untrusted bytes too)
    std::ofstream(users) << alice_line;
    std::filesystem::resize_file(users, (16u << 20) + 1);
    ::kill(f.gw.pid, SIGHUP);
    CHECK(test::wait_until([&] { return f.gw.this_run().find(": larger than 16 MiB; the replication users in use stay") != std::string::npos; }));
  }
  std::ofstream(users) << alice_line;
  ::kill(f.gw.pid, SIGHUP);
  CHECK(test::wait_until([&] { return f.gw.this_run().find("replication users read again: 1 user(s)") != std::string::npos; }));
  CHECK(f.gw.kill_with(SIGTERM) == 0);

  // A users file that cannot be used stops walgate at its start.
  std::ofstream(users) << "alice SCRAM-SHA-256$4096:bad\n";
  f.gw.start();
  CHECK(f.gw.wait() == 1);
  CHECK_MESSAGE(f.gw.this_run().find("replication-users " + users.string() + ": line 1: user \"alice\": ") != std::string::npos,
                f.gw.this_run());
}

TEST_CASE("retention keeps what a downstream slot has not confirmed, past --retention-mb, until --replication-slot-max-mb invalidates it") {
  fixture f;
  f.pg->sql("CREATE TABLE ws_big (id int PRIMARY KEY, v text); CREATE PUBLICATION ws_pub FOR ALL TABLES");
  f.extra_args = {"--retention-mb", "1"};
  f.start_walgate();
  auto made = recvlogical_once({"-d", f.downstream(), "--slot", "holder", "--plugin", "test_decoding", "--create-slot"}, f.dir);
  REQUIRE_MESSAGE(made.first == 0, made.second);
  // 80 transactions of 1 MB each (incompressible): the log rolls past its first 64 MiB segment,
  // which a 1 MB retention would let go at once, but for the slot that has not read it.
  auto write_mb = [&](int from, int n) {
    for (int i = from; i < from + n; ++i)
      f.pg->sql("INSERT INTO ws_big SELECT " + std::to_string(i) +
                ", (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 32768))");
  };
  write_mb(1, 80);
  const auto before_marker = *protocol::lsn::parse(f.pg->sql("SELECT pg_current_wal_lsn()::text")[0][0].value());
  f.pg->sql("INSERT INTO ws_big VALUES (0, 'marker')");
  auto holder_confirmed = [&] {
    const auto text = read_file(f.dir / "data" / "replication-slots");
    const auto at = text.find("\nholder test_decoding ");
    if (at == std::string::npos) return protocol::lsn{};
    const auto from = at + std::string("\nholder test_decoding ").size();
    return protocol::lsn::parse(text.substr(from, text.find(' ', from) - from)).value_or(protocol::lsn{});
  };
  {
    child reader;
    f.start_reader(reader, true, "holder", {}, "holder.out");
    const bool done = wait_for_marker({f.dir / "holder.out"}, "'marker'");
    // (its position confirmed and stored past the 80 MB: it holds none of them any more)
    CHECK(test::wait_until([&] { return holder_confirmed() > before_marker; }, std::chrono::seconds(30)));
    reader.stop();
    REQUIRE_MESSAGE(done, reader.output() << f.gw.log());
    const auto out = read_file(f.dir / "holder.out");
    std::size_t inserts = 0;
    for (auto at = out.find("table public.ws_big: INSERT:"); at != std::string::npos;
         at = out.find("table public.ws_big: INSERT:", at + 1))
      ++inserts;
    CHECK(inserts == 81);   // every one, from the start: nothing the slot needed was let go
  }
  std::size_t segments = 0;
  for (const auto& e : std::filesystem::directory_iterator(f.dir / "data"))
    segments += e.path().extension() == ".log" ? 1 : 0;
  MESSAGE("log segments after the slot read everything: " << segments);

  // A slot that never confirms, with a limit of 10 MB (made after walgate starts again with
  // it): invalidated once it holds more, in the file too.
  auto dropped = recvlogical_once({"-d", f.downstream(), "--slot", "holder", "--drop-slot"}, f.dir);
  REQUIRE_MESSAGE(dropped.first == 0, dropped.second);
  CHECK(f.gw.kill_with(SIGTERM) == 0);
  f.extra_args = {"--retention-mb", "1", "--replication-slot-max-mb", "10"};
  f.start_walgate();
  made = recvlogical_once({"-d", f.downstream(), "--slot", "lagger", "--plugin", "test_decoding", "--create-slot"}, f.dir);
  REQUIRE_MESSAGE(made.first == 0, made.second);
  // A client streams from it, reading everything and confirming nothing: invalidated under it,
  // its stream ends with the reason.
  PGconn* streaming = PQconnectdb((f.downstream() + " replication=database").c_str());
  REQUIRE(PQstatus(streaming) == CONNECTION_OK);
  PGresult* started = PQexec(streaming, "START_REPLICATION SLOT lagger LOGICAL 0/0");
  REQUIRE(PQresultStatus(started) == PGRES_COPY_BOTH);
  PQclear(started);
  int copy_end = 0;
  std::thread drain([&] {
    char* buf = nullptr;
    int n = 0;
    while ((n = PQgetCopyData(streaming, &buf, 0)) > 0) PQfreemem(buf);
    copy_end = n;
  });
  write_mb(100, 40);
  REQUIRE_MESSAGE(test::wait_until([&] { return f.gw.this_run().find("replication slot lagger invalidated") != std::string::npos; },
                                   std::chrono::seconds(60)),
                  f.gw.this_run());
  drain.join();   // (bounded: walgate ends a silent client at --replication-timeout anyway)
  CHECK(copy_end < 0);
  {
    std::string ended;
    while (PGresult* e = PQgetResult(streaming)) {
      if (PQresultStatus(e) == PGRES_FATAL_ERROR) ended += PQresultErrorMessage(e);
      PQclear(e);
    }
    ended += PQerrorMessage(streaming);
    CHECK_MESSAGE(ended.find("replication slot \"lagger\" was invalidated: it held more of walgate's event log than "
                             "--replication-slot-max-mb") != std::string::npos,
                  ended);
  }
  PQfinish(streaming);
  CHECK(test::wait_until([&] {
    return read_file(f.dir / "data" / "replication-slots").find("\nlagger test_decoding ") != std::string::npos &&
           read_file(f.dir / "data" / "replication-slots").find(" invalidated\n") != std::string::npos;
  }));
  // /metrics says so, per slot.
  {
    const auto text = http_get(f.http_port, "/metrics").second;
    CHECK_MESSAGE(text.find("\nwalgate_replication_slot_invalidated{slot=\"lagger\"} 1\n") != std::string::npos, text);
    CHECK(text.find("\nwalgate_replication_slot_held_bytes{slot=\"lagger\"} 0\n") != std::string::npos);
    CHECK(text.find("\nwalgate_replication_slot_active{slot=\"lagger\"} 0\n") != std::string::npos);
    CHECK(text.find("\nwalgate_replication_auth_failures_total 0\n") != std::string::npos);
  }
  PGconn* c = PQconnectdb((f.downstream() + " replication=database").c_str());
  REQUIRE(PQstatus(c) == CONNECTION_OK);
  PGresult* r = PQexec(c, "START_REPLICATION SLOT lagger LOGICAL 0/0");
  CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
  const std::string major = f.pg->sql("SHOW server_version_num")[0][0].value().substr(0, 2);
  const std::string expected = major == "18" ? "can no longer access replication slot \"lagger\""
                               : major >= "16" ? "can no longer get changes from replication slot \"lagger\""
                                               : "cannot read from logical replication slot \"lagger\"";
  CHECK_MESSAGE(std::string(PQresultErrorMessage(r)).find(expected) != std::string::npos, PQresultErrorMessage(r));
  CHECK(std::string(PQresultErrorField(r, PG_DIAG_SQLSTATE)) == "55000");
  CHECK(std::string(PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL) ? PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL) : "")
            .find("invalidated") != std::string::npos);
  PQclear(r);
  // A slot within the limit is not invalidated: it streams.
  r = PQexec(c, "CREATE_REPLICATION_SLOT fresh LOGICAL test_decoding (SNAPSHOT 'nothing')");
  CHECK(PQresultStatus(r) == PGRES_TUPLES_OK);
  PQclear(r);
  r = PQexec(c, "START_REPLICATION SLOT fresh LOGICAL 0/0");
  CHECK_MESSAGE(PQresultStatus(r) == PGRES_COPY_BOTH, PQresultErrorMessage(r) << f.gw.this_run());
  PQclear(r);
  CHECK(test::wait_until([&] {
    const auto text = http_get(f.http_port, "/metrics").second;
    return text.find("\nwalgate_replication_slot_active{slot=\"fresh\"} 1\n") != std::string::npos &&
           text.find("\nwalgate_replication_slot_invalidated{slot=\"fresh\"} 0\n") != std::string::npos &&
           text.find("\nwalgate_replication_connections 1\n") != std::string::npos;
  }));
  // /v1/slots and `walgate slots` list them.
  {
    const auto [status, body] = http_get(f.http_port, "/v1/slots");
    CHECK(status == 200);
    CHECK_MESSAGE(body.find("{\"slot\":\"lagger\",\"plugin\":\"test_decoding\",\"confirmed_flush_lsn\":\"") != std::string::npos,
                  body);
    CHECK(body.find("\"held_bytes\":0,\"active\":false,\"temporary\":false,\"two_phase\":false,\"failover\":false,"
                    "\"invalidated\":true}") != std::string::npos);
    CHECK(body.find("{\"slot\":\"fresh\",") != std::string::npos);
    CHECK(body.rfind("{\"slots\":[", 0) == 0);
    std::string listed;
    FILE* p = popen((std::string(WALGATE_BINARY) + " slots --data-dir " + (f.dir / "data").string()).c_str(), "r");
    REQUIRE(p);
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) listed += buf;
    CHECK(pclose(p) == 0);
    CHECK_MESSAGE(listed.find("[[slot]]\nname = \"lagger\"\nplugin = \"test_decoding\"\nconfirmed_flush_lsn = \"") !=
                      std::string::npos,
                  listed);
    CHECK(listed.find("invalidated = true\n") != std::string::npos);
    CHECK(listed.find("name = \"fresh\"") != std::string::npos);
  }
  PQfinish(c);
}

TEST_CASE("--replication-users files: comments, blank lines, CRLF; a name twice, a long name, a line without a verifier refused with its line") {
  const std::string v = "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
                        "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=";
  std::map<std::string, protocol::scram_verifier> users;
  std::string error;
  CHECK(proxy::parse_replication_users("# users\r\n\r\n  alice\t" + v + "  \r\nbob " + v + "\n", users, error));
  CHECK(users.size() == 2);
  CHECK(users.at("alice").iterations == 4096);
  CHECK(proxy::parse_replication_users("", users, error));
  CHECK(users.empty());
  auto refused = [&](const std::string& text, const std::string& why) {
    std::map<std::string, protocol::scram_verifier> kept{{"keep", {}}};
    std::string e;
    CHECK_FALSE(proxy::parse_replication_users(text, kept, e));
    CHECK_MESSAGE(e.find(why) != std::string::npos, e);
    CHECK(kept.count("keep") == 1);   // (what was there stays)
  };
  refused("alice " + v + "\nalice " + v + "\n", "line 2: user \"alice\" is given twice");
  refused(std::string(64, 'n') + " " + v + "\n", "line 1: the user name is longer than 63 bytes");
  refused("\n\nalice\n", "line 3: expected NAME VERIFIER");
  refused("alice md5abc\n", "line 1: user \"alice\": not a SCRAM-SHA-256 verifier");
}

TEST_CASE("TLS on --replication-listen with --tls-cert/--tls-key: 'S', SCRAM-SHA-256-PLUS bound to the certificate, pg_recvlogical over it; a bad handshake leaves the rest unharmed") {
  fixture f;
  f.pg->sql("CREATE TABLE ws_tls (id int PRIMARY KEY, v text); CREATE PUBLICATION ws_pub FOR ALL TABLES");
  // A certificate for localhost (its own root), and a user with a password.
  const std::string make_cert = "cd '" + f.dir.string() +
                                "' && openssl req -x509 -newkey rsa:2048 -nodes -subj '/CN=localhost' -addext "
                                "'subjectAltName=DNS:localhost' -days 2 -keyout server.key -out server.crt >/dev/null 2>&1";
  REQUIRE(std::system(make_cert.c_str()) == 0);
  std::string line;
  {
    FILE* p = popen(("printf 'tls pass\\n' | " + std::string(WALGATE_BINARY) + " replication-user app --iterations 1024").c_str(), "r");
    REQUIRE(p);
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) line += buf;
    REQUIRE(pclose(p) == 0);
  }
  std::ofstream(f.dir / "users") << line;
  f.extra_args = {"--replication-users", (f.dir / "users").string(), "--tls-cert", (f.dir / "server.crt").string(),
                  "--tls-key", (f.dir / "server.key").string()};
  f.start_walgate();
  const std::string base = "host=localhost hostaddr=127.0.0.1 port=" + std::to_string(f.repl_port) + " user=app dbname=postgres";
  const std::string verified = base + " sslmode=verify-full sslrootcert=" + (f.dir / "server.crt").string();
  // "ok, TLS" / "ok, clear" when connected and IDENTIFY_SYSTEM answered; else libpq's error.
  auto connect = [&](const std::string& conninfo) {
    PGconn* c = PQconnectdb((conninfo + " replication=database").c_str());
    std::string e = PQstatus(c) == CONNECTION_OK ? "" : PQerrorMessage(c);
    const bool on_tls = PQsslInUse(c) == 1;
    if (e.empty()) {
      PGresult* r = PQexec(c, "IDENTIFY_SYSTEM");
      if (PQresultStatus(r) != PGRES_TUPLES_OK) e = PQresultErrorMessage(r);
      PQclear(r);
    }
    PQfinish(c);
    return e.empty() ? std::string(on_tls ? "ok, TLS" : "ok, clear") : e;
  };
  // The certificate verified by name; channel binding required: libpq accepts only
  // SCRAM-SHA-256-PLUS bound to that certificate, which walgate offers on TLS alone.
  CHECK(connect(verified + " password='tls pass' channel_binding=require") == "ok, TLS");
  CHECK(connect(base + " sslmode=require password='tls pass'") == "ok, TLS");
  CHECK(connect(base + " sslmode=disable password='tls pass'") == "ok, clear");
  CHECK(connect(base + " sslmode=disable password='tls pass' channel_binding=require").find("channel binding") != std::string::npos);
  CHECK(connect(verified + " password='wrong' channel_binding=require").find("password authentication failed for user \"app\"") !=
        std::string::npos);
  CHECK(connect(base + " host=127.0.0.1 sslmode=verify-full sslrootcert=" + (f.dir / "server.crt").string() +
                " password='tls pass'")
            .find("does not match host name") != std::string::npos);   // (verify-full: the name is checked)
  // pg_recvlogical over TLS with channel binding: a slot, a change, the stream.
  const std::string recv_conn = verified + " password='tls pass' channel_binding=require";
  auto made = recvlogical_once({"-d", recv_conn, "--slot", "tls_slot", "--plugin", "test_decoding", "--create-slot"}, f.dir);
  REQUIRE_MESSAGE(made.first == 0, made.second << f.gw.log());
  child reader;
  reader.start({recvlogical(), "-d", recv_conn, "--slot", "tls_slot", "--start", "-f", (f.dir / "tls.out").string(), "-F", "1"},
               f.dir / "tls.log");
  f.pg->sql("INSERT INTO ws_tls VALUES (1, 'over TLS')");
  // A client that answers 'S' with garbage: its connection ends, logged; the stream goes on.
  {
    asio::io_context io;
    tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), f.repl_port});
    const unsigned char ssl_request[] = {0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f};
    boost::system::error_code ec;
    asio::write(s, asio::buffer(ssl_request), ec);
    char answer = 0;
    asio::read(s, asio::buffer(&answer, 1), ec);
    CHECK(answer == 'S');
    asio::write(s, asio::buffer(std::string("this is no ClientHello\r\n\r\n")), ec);
    char rest[64];
    s.read_some(asio::buffer(rest), ec);   // (closed by walgate, or an alert and then closed)
  }
  CHECK(test::wait_until([&] { return f.gw.log().find("TLS handshake failed") != std::string::npos; }, std::chrono::seconds(10)));
  const unsigned char ssl_request[] = {0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f};
  // Bytes after the SSLRequest before its answer: PostgreSQL's refusal (nothing is read as TLS).
  {
    asio::io_context io;
    tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), f.repl_port});
    std::string packet(reinterpret_cast<const char*>(ssl_request), sizeof ssl_request);
    packet += "early";
    boost::system::error_code ec;
    asio::write(s, asio::buffer(packet), ec);
    std::string answer(4096, '\0');
    answer.resize(s.read_some(asio::buffer(answer), ec));
    CHECK(answer.find("received unencrypted data after SSL request") != std::string::npos);
  }
  // An SSLRequest inside TLS: PostgreSQL's FATAL for a protocol it does not know.
  {
    asio::io_context io;
    tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), f.repl_port});
    boost::system::error_code ec;
    asio::write(s, asio::buffer(ssl_request), ec);
    char answer = 0;
    asio::read(s, asio::buffer(&answer, 1), ec);
    REQUIRE(answer == 'S');
    asio::ssl::context ctx(asio::ssl::context::tls_client);
    ctx.set_verify_mode(asio::ssl::verify_none);
    asio::ssl::stream<tcp::socket&> ts(s, ctx);
    ts.handshake(asio::ssl::stream_base::client, ec);
    REQUIRE_MESSAGE(!ec, ec.message());
    asio::write(ts, asio::buffer(ssl_request), ec);
    std::string fatal(4096, '\0');
    fatal.resize(ts.read_some(asio::buffer(fatal), ec));
    CHECK(fatal.find("unsupported frontend protocol 1234.5679") != std::string::npos);
    CHECK(fatal.find("0A000") != std::string::npos);
  }
  f.pg->sql("INSERT INTO ws_tls VALUES (2, 'after the bad handshake')");
  CHECK(test::wait_until([&] { return read_file(f.dir / "tls.out").find("'after the bad handshake'") != std::string::npos; },
                         std::chrono::seconds(30)));
  reader.stop();
  const auto out = read_file(f.dir / "tls.out");
  CHECK(out.find("table public.ws_tls: INSERT: id[integer]:1 v[text]:'over TLS'") != std::string::npos);
  // SIGHUP reads the certificate again for the walsender too.
  ::kill(f.gw.pid, SIGHUP);
  CHECK(test::wait_until([&] { return f.gw.log().find("SIGHUP: the walsender's TLS certificate and key read again") != std::string::npos; },
                         std::chrono::seconds(10)));
  CHECK(connect(verified + " password='tls pass' channel_binding=require") == "ok, TLS");
}

TEST_CASE("a PostgreSQL subscriber applies from walgate (pgoutput, --replication-sql forward) under a writer, through three kill -9 of walgate: equal tables, no duplicate key") {
  fixture f;
  const char* schema =
      "CREATE TYPE mood AS ENUM ('sad', 'happy');"
      "CREATE TABLE sub_a (id int PRIMARY KEY, v text, m mood, n numeric(10,2), at timestamptz);"
      "CREATE TABLE sub_full (id int PRIMARY KEY, v text); ALTER TABLE sub_full REPLICA IDENTITY FULL;";
  f.pg->sql(schema);
  f.pg->sql("CREATE PUBLICATION ws_pub FOR ALL TABLES");
  // The role forwarded SQL runs as: no REPLICATION, no superuser, no pg_logical_emit_message.
  const char* restricted =
      "CREATE ROLE fwd LOGIN; DO $$ DECLARE f regprocedure; BEGIN FOR f IN SELECT oid::regprocedure FROM pg_proc "
      "WHERE proname = 'pg_logical_emit_message' LOOP EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f); "
      "END LOOP; END $$";
  f.pg->sql(restricted);
  f.extra_args = {"--replication-sql", "forward", "--replication-sql-pg", f.pg->conninfo("").replace(f.pg->conninfo("").find("user=postgres"), 13, "user=fwd")};
  f.start_walgate();
  // The subscriber: the same server version, the same tables.
  proxy::cluster_options so;
  so.name = "subscriber";
  std::string error;
  auto sub = proxy::local_cluster::start(so, error);
  REQUIRE_MESSAGE(sub, error);
  sub->sql(schema);
  // A SQL statement through the walsender: run upstream read-only, relayed; a write refused by
  // the server; two statements at once refused too.
  {
    PGconn* c = PQconnectdb((f.downstream() + " replication=database").c_str());
    REQUIRE(PQstatus(c) == CONNECTION_OK);
    PGresult* r = PQexec(c, "SELECT pubname, puballtables FROM pg_catalog.pg_publication ORDER BY 1");
    REQUIRE(PQresultStatus(r) == PGRES_TUPLES_OK);
    CHECK(PQntuples(r) == 1);
    CHECK(std::string(PQgetvalue(r, 0, 0)) == "ws_pub");
    CHECK(std::string(PQgetvalue(r, 0, 1)) == "t");
    CHECK(PQftype(r, 1) == 16);   // (the server's RowDescription: bool)
    PQclear(r);
    // Comments and line ends as the server's lexer reads them: a COPY behind a nested comment
    // or a \r-ended one is no query.
    for (const char* hidden : {"/* /* */ select */ COPY (SELECT 1) TO STDOUT", "--\rCOPY (SELECT 1) TO STDOUT /*\nselect */",
                               "SELECT ts_rewrite('a'::tsquery, 'SELECT 1')"}) {
      INFO(hidden);
      r = PQexec(c, hidden);
      CHECK(std::string(PQresultErrorField(r, PG_DIAG_SQLSTATE) ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : "") == "42501");
      PQclear(r);
    }
    r = PQexec(c, "INSERT INTO sub_a (id) VALUES (-1)");   // (no query: not sent)
    CHECK(std::string(PQresultErrorField(r, PG_DIAG_SQLSTATE)) == "42501");
    PQclear(r);
    r = PQexec(c, "WITH w AS (INSERT INTO sub_a (id) VALUES (-1) RETURNING id) SELECT id FROM w");
    CHECK(std::string(PQresultErrorField(r, PG_DIAG_SQLSTATE)) == "25006");   // (sent: the read-only transaction refuses it)
    PQclear(r);
    r = PQexec(c, "COMMIT; INSERT INTO sub_a (id) VALUES (-2)");
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
    PQclear(r);
    // What a read-only transaction does not stop is not sent at all: a logical message forged
    // into every slot's stream, a backend terminated, SQL run from a string, a hidden name, a
    // statement that is no query.
    for (const char* refused : {"SELECT pg_logical_emit_message(false, 'x', 'forged')", "SELECT pg_terminate_backend(1)",
                                "select * from pg_drop_replication_slot('ws_slot')", "SELECT query_to_xml('select 1', true, true, '')",
                                "SELECT U&\"pg_sleep\"(1)", "DO $$ BEGIN END $$", "COPY sub_a TO STDOUT", "CALL p()"}) {
      INFO(refused);
      r = PQexec(c, refused);
      CHECK(std::string(PQresultErrorField(r, PG_DIAG_SQLSTATE) ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : "") == "42501");
      CHECK(std::string(PQresultErrorMessage(r)).find("walgate does not forward this statement") != std::string::npos);
      PQclear(r);
    }
    // A result past 64 MiB: cancelled and an error, walgate's memory untouched.
    r = PQexec(c, "SELECT repeat('x', 1000000) FROM generate_series(1, 80)");
    CHECK(std::string(PQresultErrorField(r, PG_DIAG_SQLSTATE) ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : "") == "54000");
    PQclear(r);
    r = PQexec(c, "/* a comment first */ WITH x AS (SELECT 1 AS one) SELECT one FROM x");
    CHECK(PQresultStatus(r) == PGRES_TUPLES_OK);
    PQclear(r);
    r = PQexec(c, "IDENTIFY_SYSTEM");   // (the connection goes on)
    CHECK(PQresultStatus(r) == PGRES_TUPLES_OK);
    PQclear(r);
    PQfinish(c);
    CHECK(f.pg->sql("SELECT count(*) FROM sub_a")[0][0].value() == "0");
  }
  sub->sql("CREATE SUBSCRIPTION ws_sub CONNECTION '" + f.downstream() +
           "' PUBLICATION ws_pub WITH (copy_data = false)");
  // A writer throughout: inserts, updates (the enum, a FULL table), deletes, one a transaction.
  std::atomic<bool> stop{false};
  std::atomic<int> done{0};
  std::thread writer([&] {
    sql_conn c(f.upstream());
    for (int i = 1; !stop; ++i) {
      const std::string n = std::to_string(i);
      const bool ok = c.exec("BEGIN; INSERT INTO sub_a VALUES (" + n + ", md5('" + n + "'), '" + (i % 2 ? "happy" : "sad") +
                             "', " + n + ".25, now()); INSERT INTO sub_full VALUES (" + n + ", 'x'); "
                             "UPDATE sub_a SET v = 'u' || v, m = 'sad' WHERE id = " + std::to_string(i / 2) + "; "
                             "UPDATE sub_full SET v = 'y' WHERE id = " + std::to_string(i / 3) + "; "
                             "DELETE FROM sub_full WHERE id = " + std::to_string(i / 4) + "; COMMIT");
      if (ok) done = i;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  auto same = [&] {
    const std::string q =
        "SELECT (SELECT coalesce(md5(string_agg(format('%s|%s|%s|%s|%s', id, v, m, n, at), ',' ORDER BY id)), '') FROM sub_a) || "
        "(SELECT coalesce(md5(string_agg(format('%s|%s', id, v), ',' ORDER BY id)), '') FROM sub_full)";
    const auto a = f.pg->sql(q), b = sub->sql(q);
    return !a.empty() && !b.empty() && a[0][0] == b[0][0];
  };
  auto applied = [&] { return std::stoi(sub->sql("SELECT count(*) FROM sub_a")[0][0].value_or("0")); };
  // Each round: the subscriber streaming from this walgate and applying, then walgate killed
  // mid-stream (the subscriber reconnects by itself, wal_retrieve_retry_interval later).
  for (int round = 1; round <= 3; ++round) {
    REQUIRE_MESSAGE(test::wait_until([&] { return f.gw.this_run().find("ws_sub streaming to connection") != std::string::npos; },
                                     std::chrono::seconds(60)),
                    f.gw.log());
    const int before = applied();
    REQUIRE(test::wait_until([&] { return applied() > before + 20; }, std::chrono::seconds(60)));
    CHECK(f.gw.kill_with(SIGKILL) == 128 + SIGKILL);
    f.start_walgate();
  }
  REQUIRE(test::wait_until([&] { return done > 400; }, std::chrono::seconds(120)));
  stop = true;
  writer.join();
  const bool equal = test::wait_until(same, std::chrono::seconds(120));
  const auto sub_log = read_file(sub->log_file());
  CHECK_MESSAGE(equal, "the subscriber did not end equal (upstream " << f.pg->sql("SELECT count(*) || ' ' || max(id) FROM sub_a")[0][0].value_or("")
                                                                       << ", subscriber " << sub->sql("SELECT count(*) || ' ' || max(id) FROM sub_a")[0][0].value_or("")
                                                                       << "); its log:\n" << sub_log.substr(sub_log.size() > 6000 ? sub_log.size() - 6000 : 0)
                                                                        << "\nwalgate's:\n" << f.gw.log());
  CHECK(sub_log.find("duplicate key") == std::string::npos);
  CHECK(sub->sql("SELECT count(*) FROM sub_a")[0][0].value() == std::to_string(done.load()));
  std::size_t starts = 0;
  for (auto at = sub_log.find("apply worker for subscription"); at != std::string::npos; at = sub_log.find("apply worker for subscription", at + 1))
    ++starts;
  CHECK(starts >= 4);   // (the first start and one after each kill)
  MESSAGE("writer transactions: " << done.load() << "; the subscriber's apply worker started " << starts << " times");
  sub->sql("ALTER SUBSCRIPTION ws_sub DISABLE; ALTER SUBSCRIPTION ws_sub SET (slot_name = NONE); DROP SUBSCRIPTION ws_sub");
}

TEST_CASE("sql_forwarder: a full queue, an upstream it cannot reach, a statement past its timeout — each answered with its error, in order of arrival") {
  fixture f;
  std::mutex m;
  std::vector<std::function<void()>> posted;
  auto post = [&](std::function<void()> fn) {
    std::lock_guard lock(m);
    posted.push_back(std::move(fn));
  };
  auto sqlstate_of = [](const std::string& bytes) {   // (an ErrorResponse's C field)
    auto at = bytes.find(std::string("\0C", 2));
    return at == std::string::npos ? std::string() : std::string(bytes.c_str() + at + 2);
  };
  // Nothing may wait: every statement is answered at once with 53300.
  {
    proxy::sql_forwarder none(f.upstream(), post, 1, 0);
    std::string got;
    none.run("SELECT 1", [&](std::string b) { got = std::move(b); });
    CHECK(sqlstate_of(got) == "53300");
  }
  // Unreachable: 08006, through the loop's post.
  {
    proxy::sql_forwarder away("host=127.0.0.1 port=1 connect_timeout=2 dbname=postgres", post);
    std::string got;
    away.run("SELECT 1", [&](std::string b) { got = std::move(b); });
    REQUIRE(test::wait_until([&] {
      std::lock_guard lock(m);
      for (auto& fn : posted) fn();
      posted.clear();
      return !got.empty();
    }, std::chrono::seconds(20)));
    CHECK(sqlstate_of(got) == "08006");
  }
  auto run_and_wait = [&](proxy::sql_forwarder& fw, const std::string& sql) {
    std::string got;
    fw.run(sql, [&](std::string b) { got = std::move(b); });
    REQUIRE(test::wait_until([&] {
      std::lock_guard lock(m);
      for (auto& fn : posted) fn();
      posted.clear();
      return !got.empty();
    }, std::chrono::seconds(20)));
    return got;
  };
  // The wall: walgate's own role (a superuser here) may not run forwarded SQL, nor a role that
  // may still emit logical messages (PUBLIC can, by default).
  {
    proxy::sql_forwarder own(f.upstream(), post);
    const auto got = run_and_wait(own, "SELECT 1");
    CHECK(sqlstate_of(got) == "42501");
    CHECK(got.find("--replication-sql-pg") != std::string::npos);
    f.pg->sql("CREATE ROLE plain LOGIN");
    proxy::sql_forwarder plain(f.pg->conninfo("").replace(f.pg->conninfo("").find("user=postgres"), 13, "user=plain"), post);
    CHECK(sqlstate_of(run_and_wait(plain, "SELECT 1")) == "42501");
    f.pg->sql("DO $$ DECLARE f regprocedure; BEGIN FOR f IN SELECT oid::regprocedure FROM pg_proc WHERE proname = "
              "'pg_logical_emit_message' LOOP EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f); END LOOP; END $$");
    const auto ok = run_and_wait(plain, "SELECT 1");
    CHECK(ok.find("SELECT 1") != std::string::npos);   // (CommandComplete's tag)
    CHECK(sqlstate_of(ok).empty());
  }
  // Past the statement timeout: the server's cancel, relayed (57014).
  {
    proxy::sql_forwarder slow(f.pg->conninfo("").replace(f.pg->conninfo("").find("user=postgres"), 13, "user=plain"), post, 4, 16, 300);
    std::string got;
    slow.run("SELECT count(*) FROM generate_series(1, 1000000000)", [&](std::string b) { got = std::move(b); });
    REQUIRE(test::wait_until([&] {
      std::lock_guard lock(m);
      for (auto& fn : posted) fn();
      posted.clear();
      return !got.empty();
    }, std::chrono::seconds(20)));
    CHECK(sqlstate_of(got) == "57014");
  }
}
