// Following the primary (issue 34), on a primary and a physical standby of it made by an online
// base backup (local_cluster::start_standby), both real servers started by the test.
//
// Which host: target_session_attrs (libpq's keyword) decides which host of --pg a connection
// keeps — walgate's own raw-socket connections by ParameterStatus in_hot_standby and
// default_transaction_read_only (14+) or by queries (13), and its libpq connections by libpq,
// pinned to the stream's server once it runs. The assumptions this file breaks:
// - "the first host that answers is the one": a standby listed first answers first;
// - "a standby stays a standby": passing over it is retryable (a promotion makes it the one);
// - "every connection of walgate goes to the same server": the stream and the snapshots'
//   libpq connections decide separately unless pinned (an exported snapshot lives on one
//   server; the issue's "snapshot … does not exist").
// Label "failover": on every server version (13 has no in_hot_standby: the query path).
#include "walgate/proxy/conninfo.hpp"
#include "walgate/proxy/failover.hpp"
#include "walgate/proxy/history.hpp"
#include "walgate/proxy/local_cluster.hpp"
#include "walgate/proxy/pg_connection.hpp"

#include "fault_harness.hpp"
#include "nats_harness.hpp"
#include "test_cluster.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/beast/http.hpp>

#include <doctest/doctest.h>
#include <libpq-fe.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

using namespace walgate;
using namespace walgate::test::fault_harness;

namespace {

/// A primary of a test's own: a server (port: as cluster_options::port) with <prefix>_a holding
/// `rows` rows, <prefix>_b, and <prefix>_pub publishing both.
std::unique_ptr<proxy::local_cluster> start_primary(const std::string& name, const std::string& prefix, int rows,
                                                    std::uint16_t port = 0) {
  proxy::cluster_options o;
  o.name = name;
  o.port = port;
  o.extra_conf = {"max_replication_slots = 20", "max_wal_senders = 20", "wal_keep_size = 256MB"};
  std::string error;
  auto primary = proxy::local_cluster::start(o, error);
  REQUIRE_MESSAGE(primary, error);
  primary->sql("CREATE TABLE " + prefix + "_a(id int PRIMARY KEY, v text NOT NULL); CREATE TABLE " + prefix +
               "_b(id int PRIMARY KEY, v text NOT NULL); INSERT INTO " + prefix +
               "_a SELECT g, md5(g::text) FROM generate_series(1000001, " + std::to_string(1000000 + rows) +
               ") g; CREATE PUBLICATION " + prefix + "_pub FOR TABLE " + prefix + "_a, " + prefix + "_b");
  return primary;
}

/// A primary and a standby that has replayed what the tests need, made once for this file (each
/// pair costs seconds): the sf_ tables (rows in sf_a before anything streams) and their
/// publication.
struct primary_and_standby {
  std::unique_ptr<proxy::local_cluster> primary, standby;
  primary_and_standby() {
    const std::string p = "sf";
    primary = start_primary("walgate-primary", p, 1000);
    std::string error;
    standby = proxy::local_cluster::start_standby(*primary, error);
    REQUIRE_MESSAGE(standby, error);
    REQUIRE(test::wait_until(
        [&] {
          try {
            auto r = standby->sql("SELECT count(*) FROM " + p + "_a");
            return r.size() == 1 && r[0][0] == std::string("1000");
          } catch (const std::exception&) {
            return false;
          }
        },
        std::chrono::seconds(60)));
  }
  /// "host=<standby>,<primary> port=…" (the standby first) plus extra.
  std::string standby_first(const std::string& extra = "") const {
    return "host=" + standby->socket_dir().string() + "," + primary->socket_dir().string() +
           " port=" + std::to_string(standby->port()) + "," + std::to_string(primary->port()) +
           " user=postgres dbname=postgres " + extra;
  }
  std::string primary_first(const std::string& extra = "") const {
    return "host=" + primary->socket_dir().string() + "," + standby->socket_dir().string() +
           " port=" + std::to_string(primary->port()) + "," + std::to_string(standby->port()) +
           " user=postgres dbname=postgres " + extra;
  }
};

primary_and_standby& servers() {
  static primary_and_standby pair;
  return pair;
}

struct attempt {
  bool ok = false;
  proxy::connection_info info;
  proxy::failure error;
  std::vector<std::string> passed;   // what the connection said of each host it passed over
};

attempt try_connect(const std::string& conninfo, bool replication) {
  auto parsed = proxy::parse_conninfo(conninfo);
  REQUIRE_MESSAGE(parsed.params, parsed.error);
  return test::run_sync<attempt>([&]() -> asio::awaitable<attempt> {
    proxy::pg_connection c(co_await asio::this_coro::executor);
    attempt a;
    auto r = co_await c.connect(*parsed.params, replication, [&a](const std::string& line) { a.passed.push_back(line); });
    a.ok = r.has_value();
    if (r) a.info = c.info();
    else a.error = r.error();
    co_return a;
  });
}

/// check_failover on a connection to the primary of conninfo (target_session_attrs primary).
proxy::failover_report failover_of(const std::string& conninfo, const std::string& slot) {
  auto parsed = proxy::parse_conninfo(conninfo);
  REQUIRE_MESSAGE(parsed.params, parsed.error);
  parsed.params->target_session_attrs = proxy::session_target::primary;
  auto r = test::run_sync<proxy::outcome<proxy::failover_report>>(
      [&]() -> asio::awaitable<proxy::outcome<proxy::failover_report>> {
        proxy::pg_connection c(co_await asio::this_coro::executor);
        if (auto ok = co_await c.connect(*parsed.params, false); !ok) co_return ok.error();
        co_return co_await proxy::check_failover(c, *parsed.params, slot);
      });
  REQUIRE_MESSAGE(r.has_value(), (r ? std::string() : r.error().message));
  return *r;
}

/// Until walgate streams from slot on q's server (and more: " AND failover"), or fails with its log.
/// Until gw streams from its slot. Assumptions broken by a slow machine (CI): a slot is active
/// while it is being made (before the initial snapshot is copied: a row written then may be in
/// it), and a walsender that served a process just stopped holds the slot a moment longer — so
/// walgate serve is waited for until its own run says it streams, and callers wait for the slot
/// to be released after a stop (wait_released) before the next start.
void wait_for_slot(sql_conn& q, const std::string& slot, walgate_process& gw, const std::string& more = "") {
  const bool serve = gw.args.empty() || gw.args[0] != "stream";   // (walgate stream says it on stdout)
  REQUIRE_MESSAGE(test::wait_until(
                      [&] {
                        std::vector<std::vector<std::string>> rows;
                        return q.exec("SELECT 1 FROM pg_replication_slots WHERE slot_name = '" + slot + "' AND active" + more,
                                      &rows) &&
                               !rows.empty() &&
                               (!serve || gw.this_run().find("streaming from PostgreSQL at") != std::string::npos);
                      },
                      std::chrono::seconds(60)),
                  gw.log());
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// Until the slot is synchronised to the standby (a persistent copy, not a temporary one the
/// standby has not caught up with yet, with a confirmed position): 90 s, then the standby's log.
/// A copy is kept once the slot's restart_lsn is within the standby's WAL: a record of the
/// running transactions written on the primary at each look lets its decoder move restart_lsn on
/// now (else within 15 s), and the synchronisation worker — which naps longer after each look
/// that keeps nothing, up to 30 s — keeps it at its next look (a round took 25–50 s without).
void wait_synced(sql_conn& on_standby, const std::string& slot, proxy::local_cluster& standby, proxy::local_cluster& primary) {
  REQUIRE_MESSAGE(test::wait_until(
                      [&] {
                        primary.try_sql("SELECT pg_log_standby_snapshot()");
                        std::vector<std::vector<std::string>> rows;
                        return on_standby.exec("SELECT 1 FROM pg_replication_slots WHERE slot_name = '" + slot +
                                                   "' AND synced AND NOT temporary AND confirmed_flush_lsn IS NOT NULL",
                                               &rows) &&
                               !rows.empty();
                      },
                      std::chrono::seconds(90)),
                  "the slot was not synchronised to the standby; standby log:\n" << std::ifstream(standby.log_file()).rdbuf());
}

/// host=primary,standby (the order a failover follows) as libpq and walgate read it.
std::string both_of(proxy::local_cluster& primary, proxy::local_cluster& standby) {
  return "host=" + primary.socket_dir().string() + "," + standby.socket_dir().string() + " port=" +
         std::to_string(primary.port()) + "," + std::to_string(standby.port()) + " user=postgres dbname=postgres";
}

/// walgate serve on pg, with <prefix>_slot and <prefix>_pub, listening on port, its event log in
/// a new temporary directory (returned): until it listens.
std::filesystem::path start_walgate(walgate_process& gw, const std::string& pg, const std::string& prefix,
                                    std::uint16_t port, const std::vector<std::string>& more = {}) {
  std::string t = (std::filesystem::temp_directory_path() / "walgate-failover-XXXXXX").string();
  const std::filesystem::path data_dir = mkdtemp(t.data());
  gw.args = {"--pg", pg, "--slot", prefix + "_slot", "--publication", prefix + "_pub", "--data-dir", data_dir.string(),
             "--listen", "127.0.0.1:" + std::to_string(port), "--status-interval", "500"};
  gw.args.insert(gw.args.end(), more.begin(), more.end());
  gw.start();
  REQUIRE_MESSAGE(test::wait_until([&] { return gw.listening.load(); }, std::chrono::seconds(60)), gw.log());
  return data_dir;
}

/// The standby stops receiving WAL (primary_conninfo emptied, reloaded); walgate (on port) logs
/// on under the caller's writer until its durable position is 4 KiB past what the standby
/// received, which is returned.
protocol::lsn cut_off_standby(proxy::local_cluster& standby, std::uint16_t port, walgate_process& gw) {
  standby.sql("ALTER SYSTEM SET primary_conninfo = ''");
  standby.sql("SELECT pg_reload_conf()");
  REQUIRE(test::wait_until([&] { return standby.sql("SELECT count(*) FROM pg_stat_wal_receiver")[0][0] == std::string("0"); },
                           std::chrono::seconds(30)));
  const std::string received_text = standby.sql("SELECT pg_last_wal_receive_lsn()::text")[0][0].value_or("");
  const auto received = protocol::lsn::parse(received_text);
  REQUIRE_MESSAGE(received, received_text);
  auto durable = [&] {
    const std::string m = metrics_text(port);
    const auto at = m.find("\nwalgate_durable_lsn ");
    return at == std::string::npos ? 0ull : std::strtoull(m.c_str() + at + 21, nullptr, 10);
  };
  REQUIRE_MESSAGE(test::wait_until([&] { return durable() > received->value + 4096; }, std::chrono::seconds(30)), gw.log());
  return *received;
}

/// The exit code of p once it ends by itself (90 s at most; then it is killed, and that fails).
int exit_code(walgate_process& p) {
  const bool ended = test::wait_until(
      [&] {
        siginfo_t info{};   // (exited, not reaped: wait() reaps it and its reader)
        return waitid(P_PID, static_cast<id_t>(p.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == p.pid;
      },
      std::chrono::seconds(90));
  CHECK_MESSAGE(ended, p.log());
  return ended ? p.wait() : p.kill_with(SIGKILL);
}

/// Until no walsender holds the slot.
void wait_released(sql_conn& q, const std::string& slot) {
  REQUIRE(test::wait_until(
      [&] {
        std::vector<std::vector<std::string>> rows;
        return q.exec("SELECT 1 FROM pg_replication_slots WHERE slot_name = '" + slot + "' AND NOT active", &rows) &&
               !rows.empty();
      },
      std::chrono::seconds(60)));
}


/// The rows of a snapshot=true request (its end marker's count), read to its end.
long snapshot_rows(std::uint16_t port, const std::string& target) {
  return test::run_sync<long>([&]() -> asio::awaitable<long> {
    tcp::socket s(co_await asio::this_coro::executor);
    co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port}, asio::use_awaitable);
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, "127.0.0.1");
    co_await http::async_write(s, req, asio::use_awaitable);
    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> p;
    p.body_limit(boost::none);
    co_await http::async_read_header(s, buf, p, asio::use_awaitable);
    std::string body, chunk(1 << 16, '\0');
    long n = 0;
    for (;;) {
      p.get().body().data = chunk.data();
      p.get().body().size = chunk.size();
      auto [ec, got] = co_await http::async_read_some(s, buf, p, asio::as_tuple(asio::use_awaitable));
      if (ec && ec != http::error::need_buffer) break;
      body.append(chunk.data(), chunk.size() - p.get().body().size);
      // The end marker: {"snapshot":"end","rows":<rows sent>,"resume_from":…}
      if (auto at = body.find("{\"snapshot\":\"end\",\"rows\":"); at != std::string::npos &&
                                                                  body.find(',', at + 25) != std::string::npos) {
        n = std::stol(body.substr(at + 25));
        break;
      }
    }
    co_return n;
  });
}

/// Whether a libpq connection to conninfo reaches a server in recovery.
bool libpq_in_recovery(const std::string& conninfo) {
  PGconn* c = PQconnectdb(conninfo.c_str());
  const std::string why = std::string(PQerrorMessage(c)) + " (" + conninfo + ")";
  REQUIRE_MESSAGE(PQstatus(c) == CONNECTION_OK, why);
  PGresult* r = PQexec(c, "SELECT pg_is_in_recovery()");
  REQUIRE(PQresultStatus(r) == PGRES_TUPLES_OK);
  const bool in = std::string(PQgetvalue(r, 0, 0)) == "t";
  PQclear(r);
  PQfinish(c);
  return in;
}

}  // namespace

TEST_CASE("target_session_attrs: each value keeps the host libpq would, on walgate's own connections") {
  auto& pg = servers();
  const auto standby_dir = pg.standby->socket_dir().string(), primary_dir = pg.primary->socket_dir().string();
  for (bool replication : {false, true}) {
    CAPTURE(replication);
    // No target: the first host that answers (the standby), as libpq's default any.
    auto any = try_connect(pg.standby_first(), replication);
    REQUIRE_MESSAGE(any.ok, any.error.message);
    CHECK(any.info.host == standby_dir);
    CHECK(any.passed.empty());

    for (const char* t : {"primary", "read-write"}) {
      CAPTURE(t);
      auto a = try_connect(pg.standby_first(std::string("target_session_attrs=") + t), replication);
      REQUIRE_MESSAGE(a.ok, a.error.message);
      CHECK(a.info.host == primary_dir);
      REQUIRE(a.passed.size() == 1);   // (the standby, and why)
      CHECK(a.passed[0].find(standby_dir) != std::string::npos);
      CHECK(a.passed[0].find("a standby (in recovery)") != std::string::npos);
      CHECK(a.passed[0].find(std::string("target_session_attrs=") + t) != std::string::npos);
    }
    for (const char* t : {"standby", "read-only", "prefer-standby"}) {
      CAPTURE(t);
      auto a = try_connect(pg.primary_first(std::string("target_session_attrs=") + t), replication);
      REQUIRE_MESSAGE(a.ok, a.error.message);
      CHECK(a.info.host == standby_dir);
      REQUIRE(a.passed.size() == 1);
      CHECK(a.passed[0].find(primary_dir) != std::string::npos);
    }
    // prefer-standby with no standby among the hosts: any, on a second pass.
    const std::string only_primary = pg.primary->conninfo("target_session_attrs=prefer-standby");
    auto prefer = try_connect(only_primary, replication);
    REQUIRE_MESSAGE(prefer.ok, prefer.error.message);
    CHECK(prefer.info.host == primary_dir);
    // standby with none: refused, retryable (a host may become one), naming each host and why.
    auto none = try_connect(pg.primary->conninfo("target_session_attrs=standby"), replication);
    REQUIRE_FALSE(none.ok);
    CHECK(none.error.retryable);
    CHECK(none.error.message.find("a primary (not in recovery)") != std::string::npos);
    CHECK(none.error.message.find("no host is a standby one") != std::string::npos);
    // read-write also passes over a primary whose sessions are read-only by default.
  }
  pg.primary->sql("ALTER SYSTEM SET default_transaction_read_only = on");
  pg.primary->sql("SELECT pg_reload_conf()");
  struct reset {   // (the primary is shared by this file's tests: reset however this one ends)
    proxy::local_cluster& c;
    ~reset() {
      c.try_sql("ALTER SYSTEM RESET default_transaction_read_only");
      c.try_sql("SELECT pg_reload_conf()");
    }
  } resets{*pg.primary};
  REQUIRE(test::wait_until([&] {
    return pg.primary->sql("SELECT current_setting('default_transaction_read_only')")[0][0] == std::string("on");
  }));
  auto ro = try_connect(pg.primary->conninfo("target_session_attrs=read-write"), false);
  CHECK_FALSE(ro.ok);
  CHECK(ro.error.message.find("read-only (default_transaction_read_only on)") != std::string::npos);
  auto ro_ok = try_connect(pg.primary->conninfo("target_session_attrs=read-only"), false);
  CHECK_MESSAGE(ro_ok.ok, ro_ok.error.message);
}

TEST_CASE("a conninfo pinned to one host, and the default target for libpq connections") {
  auto& pg = servers();
  std::string error;
  const std::string both = pg.standby_first();
  // Pinned to the primary: libpq reaches it though the standby is listed first.
  const proxy::conn_endpoint primary{pg.primary->socket_dir().string(), pg.primary->port(), {}};
  const std::string pinned = proxy::pinned_conninfo(both, primary, "", error);
  REQUIRE_MESSAGE(!pinned.empty(), error);
  CHECK(pinned.find("target_session_attrs='any'") != std::string::npos);
  CHECK_FALSE(libpq_in_recovery(pinned));
  const proxy::conn_endpoint standby{pg.standby->socket_dir().string(), pg.standby->port(), {}};
  CHECK(libpq_in_recovery(proxy::pinned_conninfo(both, standby, "", error)));
  // The address connected to wins over the name (which may resolve elsewhere), and an empty
  // one is written empty: PGHOSTADDR from the environment cannot redirect the pin.
  const std::string by_address = proxy::pinned_conninfo("host=localhost port=1 dbname=x", {"localhost", 5432, {}}, "127.0.0.1", error);
  CHECK(by_address.find("host='localhost'") != std::string::npos);
  CHECK(by_address.find("hostaddr='127.0.0.1'") != std::string::npos);
  CHECK(by_address.find("port='5432'") != std::string::npos);
  CHECK(pinned.find("hostaddr=''") != std::string::npos);
  setenv("PGHOSTADDR", "127.0.0.2", 1);
  CHECK_FALSE(libpq_in_recovery(pinned));   // (reached over the Unix socket, not 127.0.0.2)
  unsetenv("PGHOSTADDR");
  // A URI too, and values that need quoting.
  std::string socket = pg.standby->socket_dir().string();
  for (std::size_t at = 0; (at = socket.find('/', at)) != std::string::npos;) socket.replace(at, 1, "%2F");
  const std::string uri =
      "postgresql://postgres@" + socket + ":" + std::to_string(pg.standby->port()) + "/postgres?application_name=it%27s";
  const std::string pinned_uri = proxy::pinned_conninfo(uri, primary, "", error);
  REQUIRE_MESSAGE(!pinned_uri.empty(), error);
  CHECK(pinned_uri.find("application_name='it\\'s'") != std::string::npos);
  CHECK_FALSE(libpq_in_recovery(pinned_uri));
  // The default target for libpq: primary, unless the conninfo names one.
  CHECK_FALSE(libpq_in_recovery(proxy::with_default_target(both, proxy::session_target::primary, error)));
  CHECK(libpq_in_recovery(proxy::with_default_target(both + " target_session_attrs=standby",
                                                     proxy::session_target::primary, error)));
  CHECK(proxy::with_default_target("host=/x port=1 target_session_attrs=any", proxy::session_target::primary, error) ==
        "host=/x port=1 target_session_attrs=any");
  CHECK(proxy::pinned_conninfo("host='unterminated", primary, "", error).empty());
  // Whether a slot can survive a failover: before 17 never, and the report says why.
  {
    // (17+: this standby is set up for no slot synchronisation, and the slot is not made yet)
    auto report = failover_of(both, "sf_slot");
    CHECK_FALSE(report.ready);
    const std::string said = report.summary("sf_slot");
    if (pg.primary->server_major() < 17) {
      CHECK_MESSAGE(said.find("failover slots need PostgreSQL 17 or later") != std::string::npos, said);
    } else {
      CHECK_MESSAGE(said.find("the slot does not exist on the primary yet") != std::string::npos, said);
      CHECK_MESSAGE(said.find("needs sync_replication_slots = on") != std::string::npos, said);
    }
  }
  CHECK(error.find("invalid connection string") != std::string::npos);
}

TEST_CASE("walgate with a standby listed first: stream, initial snapshot and snapshot=true on the primary; the replay equals SELECT") {
  auto& pg = servers();
  std::string t = (std::filesystem::temp_directory_path() / "walgate-failover-XXXXXX").string();
  const std::filesystem::path data_dir = mkdtemp(t.data());
  const std::uint16_t port = free_port();
  walgate_process gw;
  gw.args = {"--pg", pg.standby_first(), "--slot", "sf_slot", "--publication", "sf_pub", "--data-dir", data_dir.string(),
             "--listen", "127.0.0.1:" + std::to_string(port), "--status-interval", "500"};
  gw.start();
  REQUIRE_MESSAGE(test::wait_until([&] { return gw.listening.load(); }, std::chrono::seconds(60)), gw.log());
  sql_conn q(pg.primary->conninfo());
  wait_for_slot(q, "sf_slot", gw, "");
  const std::string said = gw.log();
  CHECK_MESSAGE(said.find("passed over: it is a standby (in recovery) (target_session_attrs=primary)") != std::string::npos,
                said);
  CHECK(said.find("does not exist") == std::string::npos);

  // From 0/0:0: the initial snapshot's 1,000 rows (copied on the primary, in the slot's exported
  // snapshot), then the changes.
  resuming_client client(port, "");
  writer w(pg.primary->conninfo(), "sf", 7, false);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  w.finish();
  table_model a, b;
  const bool equal = replay_equals(client, q, "sf", a, b);
  client.finish();
  CHECK_MESSAGE(equal, "the client's replay differs from SELECT on the primary; walgate said:\n" << gw.log());
  CHECK_MESSAGE(gw.log().find("streaming from PostgreSQL at " + pg.primary->socket_dir().string()) != std::string::npos,
                gw.log());
  // The initial snapshot's rows were copied (the writer may since have deleted or rekeyed any one
  // of them: the replay's equality with SELECT shows the rest).
  CHECK_MESSAGE(gw.log().find("initial snapshot: 1,000 rows of 2 tables") != std::string::npos, gw.log());
  CHECK(client.duplicates == 0);
  for (const auto& p : client.problems) FAIL_CHECK(p);
  CHECK(w.statements > 0);

  // snapshot=true: a per-client snapshot, on the stream's server.
  const long rows = snapshot_rows(port, "/v1/stream?snapshot=true&tables=public.sf_a");
  CHECK_MESSAGE(rows == static_cast<long>(a.size()), "snapshot rows " << rows << " of " << a.size() << "; walgate said:\n" << gw.log());
  // PostgreSQL 17+: a failover slot (--failover-slot on, the default); off alters it back at
  // the next start, and on again (a slot made before, or by another tool).
  const bool has_failover = pg.primary->server_major() >= 17;
  auto failover = [&] {   // (before 17 there is no such flag: the slot, and false)
    std::vector<std::vector<std::string>> r;
    REQUIRE(q.exec(std::string("SELECT ") + (has_failover ? "failover" : "false") +
                       " FROM pg_replication_slots WHERE slot_name = 'sf_slot'",
                   &r));
    REQUIRE(r.size() == 1);
    return r[0][0] == "t";
  };
  CHECK(failover() == has_failover);
  gw.kill_with(SIGTERM);
  wait_released(q, "sf_slot");
  for (const char* value : {"off", "on"}) {
    CAPTURE(value);
    walgate_process again;
    again.args = gw.args;
    again.args.insert(again.args.end(), {"--failover-slot", value});
    again.start();
    wait_for_slot(q, "sf_slot", again, "");
    CHECK(failover() == (has_failover && std::string(value) == "on"));
    // (altered and said on 17+; before, nothing to do)
    CHECK_MESSAGE((again.log().find(std::string("a failover slot (--failover-slot ") + value + ")") != std::string::npos) ==
                      has_failover,
                  again.log());
    again.kill_with(SIGTERM);
    wait_released(q, "sf_slot");
  }
  // walgate stream (no --failover-slot of its own) leaves the slot as it is.
  walgate_process stream;
  stream.args = {"stream", "--pg", pg.standby_first(), "--slot", "sf_slot", "--publication", "sf_pub"};
  stream.start();
  wait_for_slot(q, "sf_slot", stream);
  stream.kill_with(SIGTERM);
  CHECK_MESSAGE(failover() == has_failover, stream.log());
  CHECK(stream.log().find("failover slot") == std::string::npos);
  std::filesystem::remove_all(data_dir);
}

// PostgreSQL 17+ (ctest registers it there only): a failover slot synchronised to the standby
// (sync_replication_slots, synchronized_standby_slots naming the standby's physical slot, so
// that walgate never holds a transaction the standby lacks), the primary stopped -m immediate
// under a writer, the standby promoted: walgate, on host=primary,standby, goes on from the synced
// slot without a restart; the resuming client's replay equals SELECT on the new primary.
// Before 17 (no failover slots) the promoted standby has no copy of the slot: walgate, holding
// changes from it, refuses it with what to do — and never makes a new slot at the new primary's
// current position (which would skip what happened since without a trace).
void promoted_without_the_slot(proxy::local_cluster& primary, proxy::local_cluster& standby) {
  const std::string both = both_of(primary, standby);
  std::string t = (std::filesystem::temp_directory_path() / "walgate-failover-XXXXXX").string();
  const std::filesystem::path data_dir = mkdtemp(t.data());
  walgate_process gw;
  gw.args = {"--pg", both, "--slot", "fp_slot", "--publication", "fp_pub", "--data-dir", data_dir.string(), "--listen",
             "127.0.0.1:" + std::to_string(free_port()), "--status-interval", "500"};
  gw.start();
  sql_conn on_primary(primary.conninfo());
  wait_for_slot(on_primary, "fp_slot", gw, "");
  {
    writer w(both + " target_session_attrs=read-write", "fp", 17, false);
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  primary.stop_immediate();
  standby.sql("SELECT pg_promote(true, 60)");
  // It stops (a refusal reconnecting cannot fix), saying why and what to do.
  CHECK(exit_code(gw) == 1);
  const std::string said = gw.log();
  CHECK_MESSAGE(said.find("replication slot \"fp_slot\" does not exist, but changes up to") != std::string::npos, said);
  CHECK_MESSAGE(said.find("a new slot would start at the server's current position") != std::string::npos, said);
  CHECK(standby.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'fp_slot'")[0][0] == std::string("0"));
  std::filesystem::remove_all(data_dir);
}

// 17+: the safe configuration, the primary stopped -m immediate under a writer, the standby
// promoted; walgate goes on from the synced slot (the test case below).
void promoted_with_the_synced_slot(proxy::local_cluster& primary_cluster) {
  std::string error;
  auto* primary = &primary_cluster;
  auto standby = proxy::local_cluster::start_standby(*primary, error, {"sync_replication_slots = on"});
  REQUIRE_MESSAGE(standby, error);
  const std::string both_early = both_of(*primary, *standby);
  {
    // Not yet: no slot, synchronized_standby_slots unset — each said, with what to set.
    auto report = failover_of(both_early, "fp_slot");
    CHECK_FALSE(report.ready);
    const std::string said = report.summary("fp_slot");
    CHECK_MESSAGE(said.find("the slot does not exist on the primary yet") != std::string::npos, said);
    CHECK_MESSAGE(said.find("synchronized_standby_slots is not set on the primary") != std::string::npos, said);
    CHECK_MESSAGE(said.find("has no synchronised copy of the slot yet") != std::string::npos, said);
    // Only the primary listed: nothing can be said of standbys.
    CHECK(failover_of(primary->conninfo(), "fp_slot").summary("fp_slot").find("no standby is listed in --pg") !=
          std::string::npos);
  }
  primary->sql("ALTER SYSTEM SET synchronized_standby_slots = '" + standby->standby_slot() + "'");
  primary->sql("SELECT pg_reload_conf()");
  const std::string both = both_of(*primary, *standby);

  const std::uint16_t port = free_port();
  walgate_process gw;
  const std::filesystem::path data_dir = start_walgate(gw, both, "fp", port);
  sql_conn on_primary(primary->conninfo()), on_standby(standby->conninfo());
  wait_for_slot(on_primary, "fp_slot", gw, " AND failover");
  resuming_client client(port, "");
  resuming_client sse_client(port, "", transport::sse);
  resuming_client ws_client(port, "", transport::websocket);
  // The writer follows the primary (libpq's read-write: the new one once promoted).
  writer w(both + " target_session_attrs=read-write", "fp", 13, false);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  // The slot synchronised to the standby (a persistent copy, not a temporary one the standby has
  // not caught up with yet), and walgate's acknowledgements reaching it.
  wait_synced(on_standby, "fp_slot", *standby, *primary);
  {
    auto report = failover_of(both, "fp_slot");
    CHECK_MESSAGE(report.ready, report.summary("fp_slot"));
    REQUIRE(report.ready_standbys.size() == 1);
    CHECK(report.ready_standbys[0] == standby->socket_dir().string() + ":" + std::to_string(standby->port()));
  }
  // walgate said whether it could, at its first look (a minute before it looks again).
  CHECK_MESSAGE(gw.log().find("replication slot \"fp_slot\" can") != std::string::npos, gw.log());
  {
    // /metrics says what the last line said (1: can survive; 0: cannot yet).
    const std::string log = gw.log(), metrics = metrics_text(port);
    const auto last = log.rfind("replication slot \"fp_slot\" can");
    const bool can = log.compare(last, 44, "replication slot \"fp_slot\" can survive a fai") == 0;
    CHECK_MESSAGE(metrics.find(std::string("\nwalgate_slot_failover_ready ") + (can ? "1" : "0") + "\n") != std::string::npos,
                  metrics);
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const pid_t before = gw.pid;
  primary->stop_immediate();
  // Promoted 6 s after the failure (a failover manager's detection time): walgate tries the
  // hosts meanwhile, the standby passed over each time.
  std::this_thread::sleep_for(std::chrono::seconds(6));
  standby->sql("SELECT pg_promote(true, 60)");
  // How long from the promotion (the new primary takes writes) to its first change reaching a
  // client: a marker row committed at once (a measurement, quoted in docs/benchmarks.md; the
  // checks below do not depend on it).
  const auto promoted = std::chrono::steady_clock::now();
  const auto from_new = protocol::lsn::parse(standby->sql("SELECT pg_current_wal_lsn()::text")[0][0].value_or(""));
  REQUIRE(from_new);
  standby->sql("INSERT INTO fp_b VALUES (2000000001, 'marker')");
  const bool reached = test::wait_until(
      [&] {
        std::lock_guard<std::mutex> g(client.m);
        return client.last.commit_lsn >= *from_new;
      },
      std::chrono::seconds(60));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - promoted).count();
  CHECK_MESSAGE(reached, gw.log());
  MESSAGE("promotion to the first change of the new primary at a client: " << took << " s");
  std::this_thread::sleep_for(std::chrono::seconds(3));
  w.finish();
  sql_conn after(standby->conninfo());
  table_model a, b;
  for (auto* c : {&client, &sse_client, &ws_client}) {
    CHECK_MESSAGE(replay_equals(*c, after, "fp", a, b), "a client's replay differs from SELECT on the promoted standby; walgate said:\n" << gw.log());
    c->finish();
    CHECK(c->duplicates == 0);
    for (const auto& p : c->problems) FAIL_CHECK(p);
  }
  // The initial snapshot's rows were copied (the writer may since have deleted or rekeyed any one
  // of them: the replay's equality with SELECT shows the rest).
  CHECK_MESSAGE(gw.log().find("initial snapshot: 500 rows of 2 tables") != std::string::npos, gw.log());
  CHECK(w.statements > 0);
  (void)before;
  CHECK(count_of(gw.log(), "walgate: listening on ") == 1);   // no restart, not even in place
  // A promotion followed live costs the clients nothing: no cut, and a resume from the last id
  // (the new primary's) is served.
  CHECK(metrics_text(port).find("\nwalgate_history_cuts 0\n") != std::string::npos);
  CHECK(client.why_refused(client.last_id) == "(200 now)");
  const std::string said = gw.log();
  CHECK_MESSAGE(said.find("streaming from PostgreSQL at " + standby->socket_dir().string()) != std::string::npos, said);
  MESSAGE("statements " << w.statements.load() << ", events " << client.events << ", rows " << a.size() + b.size());
  gw.kill_with(SIGTERM);
  std::filesystem::remove_all(data_dir);
}

TEST_CASE("the primary fails, the standby is promoted: from 17 walgate goes on from the synced failover slot, nothing lost, nothing twice; before, it refuses the slot-less new primary") {
  auto primary = start_primary("walgate-primary", "fp", 500);
  std::string error;
  if (primary->server_major() < 17) {
    auto standby = proxy::local_cluster::start_standby(*primary, error);
    REQUIRE_MESSAGE(standby, error);
    promoted_without_the_slot(*primary, *standby);
  } else {
    promoted_with_the_synced_slot(*primary);
  }
}

// The unsafe configuration (PostgreSQL 17+, where a promoted standby has the slot): no
// synchronized_standby_slots, and the standby stops receiving WAL while walgate goes on logging
// from the primary. The primary stops, the standby is promoted: its timeline left the old one
// at a switch point before what walgate logged last. walgate must not serve a mixed history:
// it finds the divergence at its next connection, cuts its log at the switch point, starts
// itself again (the same process), and a client resuming past the switch point gets 410 and
// starts over — the test fails if any client's model keeps a transaction the new primary lacks.
TEST_CASE("a promotion to a standby that never had what walgate logged: the log is cut at the switch point, clients past it get 410 and start over; the replay equals SELECT on the new primary") {
  auto primary = start_primary("walgate-diverging", "fd", 300);
  std::string error;
  if (primary->server_major() < 17) {
    MESSAGE("SKIPPED on PostgreSQL " << primary->server_major()
                                     << ": a promoted standby has a copy of the slot only with failover slots (17+); the "
                                        "verdicts and the cut are unit-tested in log_tests (history_test.cpp)");
    return;
  }
  auto standby = proxy::local_cluster::start_standby(*primary, error, {"sync_replication_slots = on"});
  REQUIRE_MESSAGE(standby, error);
  const std::string both = both_of(*primary, *standby);
  const std::uint16_t port = free_port();
  walgate_process gw;
  const std::filesystem::path data_dir = start_walgate(gw, both, "fd", port);
  sql_conn on_primary(primary->conninfo()), on_standby(standby->conninfo());
  wait_for_slot(on_primary, "fd_slot", gw, " AND failover");
  resuming_client client(port, "");
  resuming_client sse_client(port, "", transport::sse);
  resuming_client ws_client(port, "", transport::websocket);
  for (auto* c : {&client, &sse_client, &ws_client}) c->start_over_on_410 = true;
  writer w(both + " target_session_attrs=read-write", "fd", 19, false);
  wait_synced(on_standby, "fd_slot", *standby, *primary);
  // The standby stops receiving; walgate logs on past what it has.
  const auto received = cut_off_standby(*standby, port, gw);
  const std::string received_text = received.to_string();
  const pid_t before = gw.pid;
  primary->stop_immediate();
  standby->sql("SELECT pg_promote(true, 60)");
  // Found at the first connection to the new primary, cut, started again, following timeline 2.
  REQUIRE_MESSAGE(test::wait_until([&] { return gw.log().find("following timeline 2") != std::string::npos; },
                                   std::chrono::seconds(90)),
                  gw.log());
  std::this_thread::sleep_for(std::chrono::seconds(3));
  w.finish();
  sql_conn after(standby->conninfo());
  table_model a, b;
  for (auto* c : {&client, &sse_client, &ws_client}) {
    CHECK_MESSAGE(replay_equals(*c, after, "fd", a, b),
                  "a client's replay differs from SELECT on the promoted standby; walgate said:\n" << gw.log());
    c->finish();
    CHECK(c->starts_over >= 1);   // (each was past the switch point when walgate started again)
    CHECK(c->duplicates == 0);
    for (const auto& p : c->problems) FAIL_CHECK(p);
  }
  const std::string said = gw.log();
  CHECK_MESSAGE(said.find("HISTORY DIVERGED: PostgreSQL at " + standby->socket_dir().string()) != std::string::npos, said);
  CHECK_MESSAGE(said.find("starting again to cut the event log") != std::string::npos, said);
  CHECK_MESSAGE(said.find("history cut at ") != std::string::npos, said);
  (void)before;
  CHECK(count_of(said, "walgate: listening on ") == 2);   // (started again in place, once; /metrics below answers)
  CHECK(w.statements > 0);
  // CUTS says what was cut; a resume from one of its ids is 410, saying why.
  // Two: the cut (to the last commit logged from timeline 1), and the range the new timeline's
  // WAL covered when walgate followed it (ids a client may hold from before: none resumed there).
  const auto cuts = proxy::read_history_cuts(data_dir);
  REQUIRE(cuts.size() == 2);
  CHECK(cuts[1].at == cuts[0].at);
  CHECK(cuts[0].at <= received);
  CHECK(cuts[0].from_timeline == 1);
  CHECK(cuts[0].to_timeline == 2);
  CHECK(std::filesystem::exists(data_dir / "damaged"));
  {
    resuming_client probe(port, "");
    const std::string why = probe.why_refused(cuts[0].last.to_string() + ":0");
    probe.finish();
    CHECK_MESSAGE(why.find("was logged from PostgreSQL's timeline 1, which the server left at " + cuts[0].at.to_string()) !=
                      std::string::npos,
                  why);
  }
  CHECK(metrics_text(port).find("\nwalgate_history_cuts 2\n") != std::string::npos);
  MESSAGE("cut at " << cuts[0].at.to_string() << " (standby received up to " << received_text << "), last cut commit "
                    << cuts[0].last.to_string() << "; statements " << w.statements.load() << ", rows " << a.size() + b.size());
  gw.kill_with(SIGTERM);
  std::filesystem::remove_all(data_dir);
}

// PostgreSQL 16+: logical decoding on a standby, so that the primary pays nothing for the
// gateway. walgate on host=primary,standby with target_session_attrs=standby: the stream, the
// slot (made on the standby: it waits for the primary's next running-transactions record, which
// walgate says) and the initial snapshot (exported by the standby's slot) on the standby; the
// replay from 0/0:0 equals SELECT on the standby once it has replayed the writer's last commit.
// snapshot=true is refused there, saying why (snapshot.cpp).
// Assumptions this breaks: the server walgate streams from can write WAL (an insert position, a
// failover slot, a slot made at once); a snapshot lists the transactions it sees as running.
TEST_CASE("logical decoding from a standby (16+): the slot, the initial snapshot and the stream on the standby, the replay equals SELECT; snapshot=true refused with why") {
  auto& pg = servers();
  if (pg.primary->server_major() < 16) {
    MESSAGE("SKIPPED on PostgreSQL " << pg.primary->server_major() << ": logical decoding on a standby needs 16 or later");
    return;
  }
  pg.primary->sql("CREATE TABLE sb_a(id int PRIMARY KEY, v text NOT NULL); CREATE TABLE sb_b(id int PRIMARY KEY, v text NOT NULL); "
                  "INSERT INTO sb_a SELECT g, md5(g::text) FROM generate_series(1000001, 1000500) g; "
                  "CREATE PUBLICATION sb_pub FOR TABLE sb_a, sb_b");
  std::string error;
  auto standby = proxy::local_cluster::start_standby(*pg.primary, error, {"hot_standby_feedback = on"});
  REQUIRE_MESSAGE(standby, error);
  sql_conn on_primary(pg.primary->conninfo()), on_standby(standby->conninfo());
  // Replayed to the primary's position now (the tables and the publication are there).
  auto caught_up = [&] {
    const std::string at = *pg.primary->sql("SELECT pg_current_wal_lsn()::text")[0][0];
    return test::wait_until([&] {
      return *standby->sql("SELECT pg_last_wal_replay_lsn() >= '" + at + "'::pg_lsn")[0][0] == std::string("t");
    }, std::chrono::seconds(60));
  };
  REQUIRE(caught_up());
  // The standby alone in --pg: walgate takes it whatever it is (and, once promoted, goes on there).
  const std::uint16_t port = free_port();
  walgate_process gw;
  std::string t = (std::filesystem::temp_directory_path() / "walgate-failover-XXXXXX").string();
  const std::filesystem::path data_dir = mkdtemp(t.data());
  gw.args = {"--pg", standby->conninfo(), "--slot", "sb_slot", "--publication", "sb_pub", "--data-dir", data_dir.string(),
             "--listen", "127.0.0.1:" + std::to_string(port), "--status-interval", "500"};
  gw.start();
  // The slot is made once the standby replays a running-transactions record: the primary writes
  // one every 15 s when busy; pg_log_standby_snapshot() writes one now. walgate says it waits
  // (before the first, so that the line is there: the test asks for the record only after it).
  REQUIRE_MESSAGE(test::wait_until([&] { return gw.log().find("pg_log_standby_snapshot()") != std::string::npos; },
                                   std::chrono::seconds(60)),
                  gw.log());
  REQUIRE_MESSAGE(test::wait_until(
                      [&] {
                        on_primary.exec("SELECT pg_log_standby_snapshot()");
                        return gw.this_run().find("streaming from PostgreSQL at " + standby->socket_dir().string()) !=
                               std::string::npos;
                      },
                      std::chrono::seconds(90)),
                  gw.log());
  const std::string said = gw.log();
  CHECK_MESSAGE(said.find("initial snapshot: 500 rows of 2 tables") != std::string::npos, said);
  CHECK(standby->sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'sb_slot'")[0][0] == std::string("1"));
  CHECK(pg.primary->sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'sb_slot'")[0][0] == std::string("0"));

  resuming_client client(port, "");
  resuming_client ws_client(port, "", transport::websocket);
  {
    writer w(pg.primary->conninfo(), "sb", 23, false);
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
  REQUIRE(caught_up());
  table_model a, b, a2, b2;
  const bool equal = replay_equals(client, on_standby, "sb", a, b);
  const bool ws_equal = replay_equals(ws_client, on_standby, "sb", a2, b2);
  client.finish();
  ws_client.finish();
  CHECK_MESSAGE(equal, "the client's replay differs from SELECT on the standby; walgate said:\n" << gw.log());
  CHECK_MESSAGE(ws_equal, "the WebSocket client's replay differs from SELECT on the standby; walgate said:\n" << gw.log());
  CHECK(client.duplicates == 0);
  CHECK(ws_client.duplicates == 0);
  for (const auto& p : client.problems) FAIL_CHECK(p);
  for (const auto& p : ws_client.problems) FAIL_CHECK(p);
  // snapshot=true: refused (501), saying why and what to do instead — a standby's snapshot has no
  // list of the transactions it sees as running (pg_current_snapshot() there is xmin:xmax alone),
  // so its rows cannot be joined exactly to the stream.
  {
    const auto [status, body] = http_get(port, "/v1/stream?snapshot=true&tables=public.sb_a");
    CHECK(status == 501);
    CHECK_MESSAGE(body.find("per-client snapshots are not taken on a standby") != std::string::npos, body);
    CHECK_MESSAGE(body.find("from=0/0:0 replays what the log holds") != std::string::npos, body);
  }
  CHECK(gw.log().find("warning: this standby has") == std::string::npos);   // (hot_standby_feedback on, a slot)
  // A standby without hot_standby_feedback (the file's shared one, for a moment): said, with what to set.
  {
    pg.standby->sql("ALTER SYSTEM SET hot_standby_feedback = off");
    pg.standby->sql("SELECT pg_reload_conf()");
    REQUIRE(test::wait_until([&] { return *pg.standby->sql("SHOW hot_standby_feedback")[0][0] == std::string("off"); }));
    walgate_process warned;
    warned.args = {"stream", "--pg", pg.standby_first("target_session_attrs=standby"), "--slot", "sbw_slot", "--publication", "sb_pub"};
    warned.start();
    CHECK_MESSAGE(test::wait_until([&] { return warned.log().find("warning: this standby has hot_standby_feedback off") != std::string::npos; },
                                   std::chrono::seconds(60)),
                  warned.log());
    CHECK_MESSAGE(warned.log().find("Set hot_standby_feedback = on") != std::string::npos, warned.log());
    warned.kill_with(SIGTERM);
    // (the slot, if made meanwhile, dropped: the shared standby keeps nothing of this test)
    REQUIRE(test::wait_until([&] {
      return pg.standby->try_sql("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'sbw_slot'")
          .empty();
    }));
    pg.standby->sql("ALTER SYSTEM RESET hot_standby_feedback");
    pg.standby->sql("SELECT pg_reload_conf()");
    REQUIRE(test::wait_until([&] { return *pg.standby->sql("SHOW hot_standby_feedback")[0][0] == std::string("on"); }));
  }
  // walgate keeps that its log is decoded on a standby.
  {
    const auto followed = proxy::read_followed_timeline(data_dir);
    REQUIRE(followed);
    CHECK(followed->standby);
    CHECK(followed->timeline == 1);
  }
  // The standby promoted (the primary left running: the writer moves to the new one): the stream
  // goes on from the same slot on the new timeline, nothing lost, nothing twice.
  resuming_client after(port, "");
  standby->sql("SELECT pg_promote(true, 60)");
  {
    writer w(standby->conninfo(), "sb", 31, false);
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
  table_model a3, b3;
  CHECK_MESSAGE(replay_equals(after, on_standby, "sb", a3, b3),
                "the replay after the promotion differs from SELECT on the promoted standby; walgate said:\n" << gw.log());
  after.finish();
  CHECK(after.duplicates == 0);
  for (const auto& p : after.problems) FAIL_CHECK(p);
  CHECK_MESSAGE(gw.log().find("HISTORY DIVERGED") == std::string::npos, gw.log());
  CHECK_MESSAGE(metrics_text(port).find("walgate_history_cuts 0") != std::string::npos, metrics_text(port));
  // The stream went on through the promotion on one connection: the log's TIMELINE still says
  // the timeline left, and the log holds history past the switch point — the new timeline's own.
  // A restart (a reconnection) follows it, not cuts it: the slot there was acknowledged past the
  // switch point (history.cpp). Once walgate acknowledged the writer's last commit:
  const std::string end = *standby->sql("SELECT pg_current_wal_lsn()::text")[0][0];
  REQUIRE_MESSAGE(test::wait_until([&] {
    return *standby->sql("SELECT confirmed_flush_lsn >= '" + end + "'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'sb_slot'")[0][0] ==
           std::string("t");
  }, std::chrono::seconds(60)), gw.log());
  gw.kill_with(SIGTERM);
  wait_released(on_standby, "sb_slot");
  walgate_process again;
  again.args = gw.args;
  again.start();
  wait_for_slot(on_standby, "sb_slot", again);
  {
    resuming_client replay(port, "");
    writer w(standby->conninfo(), "sb", 37, false);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    w.finish();
    table_model a4, b4;
    CHECK_MESSAGE(replay_equals(replay, on_standby, "sb", a4, b4),
                  "the replay after the restart differs from SELECT on the promoted standby; walgate said:\n" << again.log());
    replay.finish();
    CHECK(replay.duplicates == 0);
    CHECK(replay.starts_over == 0);
    for (const auto& p : replay.problems) FAIL_CHECK(p);
  }
  CHECK_MESSAGE(again.log().find("it holds the slot walgate decoded on it as a standby") != std::string::npos, again.log());
  {
    const auto followed = proxy::read_followed_timeline(data_dir);   // (now a primary, on timeline 2)
    REQUIRE(followed);
    CHECK_FALSE(followed->standby);
    CHECK(followed->timeline == 2);
  }
  CHECK_MESSAGE(again.log().find("HISTORY DIVERGED") == std::string::npos, again.log());
  CHECK_MESSAGE(metrics_text(port).find("walgate_history_cuts 0") != std::string::npos, metrics_text(port));
  again.kill_with(SIGTERM);
  // (the promoted standby's physical slot on the shared primary, dropped: it would hold WAL)
  pg.primary->sql("SELECT pg_drop_replication_slot('" + standby->standby_slot() + "')");
  std::filesystem::remove_all(data_dir);
}

// PostgreSQL 17+: three failovers in a row, under one writer, with one walgate that never
// restarts. Each round adds a new standby of the current primary (slot synchronisation on, the
// primary's synchronized_standby_slots naming it), waits until the failover slot is synchronised
// there, stops the primary -m immediate and promotes the standby. walgate's --pg names every
// server from the start, on ports chosen ahead (a host not made yet is down: passed over).
// Clients on NDJSON and WebSocket resume by id throughout; at the end each replay equals SELECT
// on the last primary, nothing twice, no cut, no restart.
// Assumptions this breaks: a failover slot's copy is synchronised once (a promoted standby's
// slot, synchronised again to the next standby, carries walgate's position on); a log follows
// one timeline change (the TIMELINE file moves on each time, and each switch point is checked
// against the log).
TEST_CASE("three failovers in a row (17+): one walgate follows each promoted standby; the replay equals SELECT on the last primary") {
  std::vector<std::uint16_t> ports;
  for (int i = 0; i < 4; ++i) {
    std::uint16_t p = 0;
    do p = free_port();
    while (std::find(ports.begin(), ports.end(), p) != ports.end());
    ports.push_back(p);
  }
  std::string error;
  std::vector<std::unique_ptr<proxy::local_cluster>> servers_made;
  servers_made.push_back(start_primary("walgate-thrice", "f3", 300, ports[0]));
  if (servers_made.back()->server_major() < 17) {
    MESSAGE("SKIPPED on PostgreSQL " << servers_made.back()->server_major()
                                     << ": a promoted standby keeps the slot only with failover slots (17+)");
    return;
  }
  // Every server, by TCP on its port, the order they become primary in.
  std::string hosts = "host=", port_list = " port=";
  for (std::size_t i = 0; i < ports.size(); ++i) {
    hosts += std::string(i ? "," : "") + "127.0.0.1";
    port_list += std::string(i ? "," : "") + std::to_string(ports[i]);
  }
  const std::string all = hosts + port_list + " user=postgres dbname=postgres";
  std::uint16_t port = 0;
  do port = free_port();
  while (std::find(ports.begin(), ports.end(), port) != ports.end());
  walgate_process gw;
  const std::filesystem::path data_dir = start_walgate(gw, all, "f3", port);
  {
    sql_conn on_first(servers_made.back()->conninfo());
    wait_for_slot(on_first, "f3_slot", gw, " AND failover");
  }
  resuming_client client(port, "");
  resuming_client ws_client(port, "", transport::websocket);
  writer w(all + " target_session_attrs=read-write", "f3", 41, false);
  for (int round = 1; round <= 3; ++round) {
    CAPTURE(round);
    proxy::local_cluster& primary = *servers_made.back();
    auto standby = proxy::local_cluster::start_standby(primary, error, {"sync_replication_slots = on"}, ports[round]);
    REQUIRE_MESSAGE(standby, error);
    primary.sql("ALTER SYSTEM SET synchronized_standby_slots = '" + standby->standby_slot() + "'");
    primary.sql("SELECT pg_reload_conf()");
    sql_conn on_standby(standby->conninfo());
    const auto t0 = std::chrono::steady_clock::now();
    wait_synced(on_standby, "f3_slot", *standby, primary);
    const auto t1 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    primary.stop_immediate();
    standby->sql("SELECT pg_promote(true, 60)");
    // The new primary's first change reaches a client (walgate streams from it).
    const auto from_new = protocol::lsn::parse(standby->sql("SELECT pg_current_wal_lsn()::text")[0][0].value_or(""));
    REQUIRE(from_new);
    standby->sql("INSERT INTO f3_b VALUES (" + std::to_string(2000000000 + round) + ", 'round " + std::to_string(round) + "')");
    CHECK_MESSAGE(test::wait_until(
                      [&] {
                        std::lock_guard<std::mutex> g(client.m);
                        return client.last.commit_lsn >= *from_new;
                      },
                      std::chrono::seconds(60)),
                  gw.log());
    MESSAGE("round " << round << ": synchronised in " << std::chrono::duration<double>(t1 - t0).count() << " s, first change after "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() - 1 << " s");
    servers_made.push_back(std::move(standby));
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  w.finish();
  sql_conn last(servers_made.back()->conninfo());
  table_model a, b;
  for (auto* c : {&client, &ws_client}) {
    CHECK_MESSAGE(replay_equals(*c, last, "f3", a, b), "a client's replay differs from SELECT on the last primary; walgate said:\n" << gw.log());
    c->finish();
    CHECK(c->duplicates == 0);
    CHECK(c->starts_over == 0);
    for (const auto& p : c->problems) FAIL_CHECK(p);
  }
  CHECK(b.count(2000000003) == 1);
  CHECK(w.statements > 0);
  CHECK(count_of(gw.log(), "walgate: listening on ") == 1);   // never restarted
  CHECK(metrics_text(port).find("\nwalgate_history_cuts 0\n") != std::string::npos);
  // Each promotion followed: timeline 4 at the end.
  const auto followed = proxy::read_followed_timeline(data_dir);
  REQUIRE(followed);
  CHECK(followed->timeline == 4);
  MESSAGE("three failovers: statements " << w.statements.load() << ", events " << client.events << ", rows " << a.size() + b.size());
  gw.kill_with(SIGTERM);
  std::filesystem::remove_all(data_dir);
}

// PostgreSQL 17+, with --nats (a JetStream stream of one node) and an edge serving it: the
// primary fails under a writer and the synchronised standby is promoted — the publisher goes on
// from the stream's last id on the new primary, as after any restart, and the edge's client sees
// no gap and nothing twice (its replay equals SELECT on the new primary). Then a second
// promotion, unsafe (a new standby of the new primary that stops receiving while walgate logs
// on): the JetStream stream holds history the next primary never had, and is not cut — walgate
// stops (exit 1), saying so, and publishes nothing of the new timeline.
// Assumptions this breaks: the publisher's position survives only restarts (not a promotion
// followed live); a divergence can always be repaired in walgate's own log.
TEST_CASE("--nats across promotions (17+): the publisher goes on from the stream's last id, an edge's client sees no gap; a divergence stops walgate") {
  if (test::nats_harness::nats_server_binary().empty()) {
    MESSAGE("SKIPPED: nats-server is not installed (.ci/install-deps.sh installs Debian's nats-server)");
    return;
  }
  auto primary = start_primary("walgate-jsf", "fj", 300);
  std::string error;
  if (primary->server_major() < 17) {
    MESSAGE("SKIPPED on PostgreSQL " << primary->server_major() << ": a promoted standby keeps the slot only with failover slots (17+)");
    return;
  }
  auto standby = proxy::local_cluster::start_standby(*primary, error, {"sync_replication_slots = on"});
  REQUIRE_MESSAGE(standby, error);
  primary->sql("ALTER SYSTEM SET synchronized_standby_slots = '" + standby->standby_slot() + "'");
  primary->sql("SELECT pg_reload_conf()");
  test::nats_harness::nats_cluster nats(1);
  const std::string both = both_of(*primary, *standby);
  const std::uint16_t port = free_port();
  walgate_process gw;
  const std::filesystem::path data_dir =
      start_walgate(gw, both, "fj", port, {"--nats", nats.urls(), "--nats-stream", "WG_FJ", "--nats-subject-prefix", "wg.fj"});
  sql_conn on_primary(primary->conninfo()), on_standby(standby->conninfo());
  wait_for_slot(on_primary, "fj_slot", gw, " AND failover");
  // The edge.
  const std::uint16_t edge_port = free_port();
  std::string t = (std::filesystem::temp_directory_path() / "walgate-edge-XXXXXX").string();
  const std::filesystem::path edge_dir = mkdtemp(t.data());
  walgate_process edge;
  edge.args = {"edge", "--nats", nats.urls(), "--nats-stream", "WG_FJ", "--nats-subject-prefix", "wg.fj", "--listen",
               "127.0.0.1:" + std::to_string(edge_port), "--data-dir", edge_dir.string()};
  edge.start();
  REQUIRE_MESSAGE(test::wait_until([&] { return edge.listening.load(); }, std::chrono::seconds(30)), edge.log());
  REQUIRE_MESSAGE(test::wait_until([&] { return metrics_text(edge_port).find("\nwalgate_edge_ready 1\n") != std::string::npos; },
                                   std::chrono::seconds(60)),
                  edge.log());
  resuming_client at_edge(edge_port, "");
  at_edge.start_over_on_410 = true;   // (counted: none expected)
  {
    writer w(both + " target_session_attrs=read-write", "fj", 47, false);
    wait_synced(on_standby, "fj_slot", *standby, *primary);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    primary->stop_immediate();
    standby->sql("SELECT pg_promote(true, 60)");
    std::this_thread::sleep_for(std::chrono::seconds(3));
    w.finish();
    CHECK(w.statements > 0);
  }
  table_model a, b;
  CHECK_MESSAGE(replay_equals(at_edge, on_standby, "fj", a, b),
                "the edge client's replay differs from SELECT on the promoted standby; walgate said:\n" << gw.log() << "\nthe edge said:\n"
                                                                                                      << edge.log());
  CHECK(at_edge.duplicates == 0);
  CHECK(at_edge.starts_over == 0);
  for (const auto& p : at_edge.problems) FAIL_CHECK(p);
  CHECK(count_of(gw.log(), "walgate: listening on ") == 1);
  CHECK_MESSAGE(gw.log().find("streaming from PostgreSQL at " + standby->socket_dir().string()) != std::string::npos, gw.log());

  // The second promotion, unsafe: a standby of the new primary, no synchronized_standby_slots
  // naming it, cut off while walgate (and the JetStream stream) go on past what it received.
  auto next = proxy::local_cluster::start_standby(*standby, error, {"sync_replication_slots = on"});
  REQUIRE_MESSAGE(next, error);
  sql_conn on_next(next->conninfo());
  const std::string all = "host=" + standby->socket_dir().string() + "," + next->socket_dir().string() + " port=" +
                          std::to_string(standby->port()) + "," + std::to_string(next->port()) + " user=postgres dbname=postgres";
  {
    writer w(standby->conninfo(), "fj", 53, false);
    wait_synced(on_next, "fj_slot", *next, *standby);
    cut_off_standby(*next, port, gw);
    standby->stop_immediate();
    w.finish();
  }
  next->sql("SELECT pg_promote(true, 60)");
  // walgate's --pg does not name the next server: it is given as the new first host by a restart
  // with the same data directory and stream (as an operator's failover manager would repoint it).
  gw.kill_with(SIGTERM);
  walgate_process again;
  again.args = gw.args;
  for (std::size_t i = 0; i + 1 < again.args.size(); ++i)
    if (again.args[i] == "--pg") again.args[i + 1] = all;
  again.start();
  CHECK(exit_code(again) == 1);
  const std::string said = again.log();
  CHECK_MESSAGE(said.find("HISTORY DIVERGED: PostgreSQL at " + next->socket_dir().string()) != std::string::npos, said);
  CHECK_MESSAGE(said.find("With --nats the JetStream stream holds that history too and is not cut: walgate stops") != std::string::npos,
                said);
  CHECK_FALSE(std::filesystem::exists(data_dir / "CUT"));   // (nothing asked of the log: the stream is not cut)
  CHECK(proxy::read_history_cuts(data_dir).empty());
  edge.kill_with(SIGTERM);
  std::filesystem::remove_all(edge_dir);
  std::filesystem::remove_all(data_dir);
}
