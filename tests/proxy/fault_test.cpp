// Nothing lost, proven the way it fails: the walgate executable (fsync on in its data directory)
// killed with SIGKILL at random moments, PostgreSQL stopped -m immediate, walsenders terminated
// inside transactions — while a writer commits inserts, updates that change keys, deletes,
// large transactions and truncates across tables, and a client reads NDJSON and always resumes
// from the last id it received. What it received is replayed into a model of each table and
// compared with SELECT: nothing missing, nothing twice, nothing out of order.
//
// These take minutes: ctest label "fault" (WALGATE_FAULT_CYCLES scales the cycle counts).
#include "walgate/transform/change.hpp"

#include "fault_harness.hpp"
#include "jwt_helpers.hpp"
#include "test_cluster.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>

#include <doctest/doctest.h>
#include <libpq-fe.h>

#include <poll.h>
#include <sys/mount.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

using namespace walgate;   // (asio, beast, http, websocket, json, tcp: from the harness)

using namespace walgate::test::fault_harness;

namespace {
/// /metrics' text, read with this bearer token when given (--auth jwt: one with the admin claim).
}  // namespace

TEST_CASE("kill -9 of walgate at random moments: the resuming client's replay equals SELECT") {
  scenario sc("fk");
  sc.start_streaming();
  resuming_client client(sc.port, "");
  writer w(test::cluster().conninfo(), "fk", 1);
  const int n = cycles(20);
  for (int i = 0; i < n; ++i) {
    if (i % 5 == 2) w.big_now = true;   // some kills land inside a large transaction
    std::this_thread::sleep_for(std::chrono::milliseconds(random_ms(150, 1200)));
    int rc = sc.gw.kill_with(SIGKILL);
    REQUIRE(rc == 128 + SIGKILL);
    sc.start();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  sc.verify(w, client);
  MESSAGE("kill -9 cycles: " << n << ", transactions streamed: " << sc.streamed());
  CHECK(sc.streamed() > 0);
  CHECK(client.connections >= static_cast<std::uint64_t>(n));
}

namespace {
/// The first n lines of a stream's body (NDJSON), or fewer when nothing more comes for 10 s.
std::vector<std::string> first_lines(std::uint16_t port, const std::string& target, std::size_t n) {
  asio::io_context io;
  tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(s, asio::buffer("GET " + target + " HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(boost::none);
  std::vector<std::string> out;
  boost::system::error_code ec;
  http::read_header(s, buf, parser, ec);
  std::size_t used = 0;
  while (!ec && out.size() < n) {
    test::parse_buffered(parser, buf);   // (what is left needs more: wait for the socket)
    auto& body = parser.get().body();
    for (auto nl = body.find('\n', used); nl != std::string::npos && out.size() < n; nl = body.find('\n', used)) {
      out.push_back(body.substr(used, nl - used));
      used = nl + 1;
    }
    if (out.size() >= n) break;
    pollfd p{s.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) break;
    http::read_some(s, buf, parser, ec);
  }
  return out;
}
}  // namespace

TEST_CASE("the initial snapshot under a writer, kill -9 in the middle of it: the replay from 0/0:0 equals SELECT") {
  scenario sc("fs");
  auto& pg = test::cluster();
  // Rows before walgate's slot exists: only the initial snapshot has them.
  pg.sql("INSERT INTO fs_a SELECT g + 10000000, md5(g::text) FROM generate_series(1, 300000) g;"
         "INSERT INTO fs_b SELECT g + 10000000, md5(g::text) FROM generate_series(1, 100000) g");
  // And changes all along: before the slot, during the copy, after; no TRUNCATE (it could empty
  // fs_b before the snapshot, and the counts below assume its rows are there).
  writer w(pg.conninfo(), "fs", 3, false);
  REQUIRE(test::wait_until([&] { return w.statements > 20; }));
  for (int i = 0; i < 2; ++i) {
    sc.start();
    // This start's own copy (the one killed before printed the same line).
    REQUIRE_MESSAGE(test::wait_until([&] { return sc.gw.this_run().find(" pieces on ") != std::string::npos; },
                                     std::chrono::seconds(30)),
                    sc.gw.log());
    // In the middle of the copy: 400,000 rows take a few hundred ms on a fast machine (the copy
    // runs on 4 connections, rows parsed on their threads), so the kill comes within 60 ms.
    std::this_thread::sleep_for(std::chrono::milliseconds(random_ms(5, 60)));
    const std::string before_kill = sc.gw.this_run();
    REQUIRE(sc.gw.kill_with(SIGKILL) == 128 + SIGKILL);
    REQUIRE_MESSAGE(before_kill.find("rows/s)") == std::string::npos, "the copy ended before the kill:\n" << before_kill);
  }
  sc.start_streaming();
  // Each start after a kill drops the slot the killed one made (the second one's line is in the log too).
  CHECK_MESSAGE(sc.gw.this_run().find("the initial snapshot was cut off last time") != std::string::npos, sc.gw.log());
  REQUIRE_MESSAGE(test::wait_until([&] { return sc.gw.log().find("rows/s)") != std::string::npos; }, std::chrono::seconds(60)),
                  sc.gw.log());
  resuming_client client(sc.port, "");
  sc.verify(w, client);
  // The model began with the snapshot's rows: more events than the writer's changes alone (the
  // writer deletes a few of the 400,000 rows before the snapshot, and inserts more).
  CHECK(client.events >= 390'000);
  // Debezium: source.snapshot "true" on the rows, "last" on the final one, none on the changes.
  const std::string log = sc.gw.log();
  const auto logged = log.find("logged as ");
  REQUIRE_MESSAGE(logged != std::string::npos, log);
  const std::string cp = log.substr(logged + 10, log.find(':', logged + 10) - logged - 10);
  const auto to = log.find(" to :", logged);
  REQUIRE(to != std::string::npos);
  const long last = std::strtol(log.c_str() + to + 5, nullptr, 10);
  REQUIRE(last >= 390'000);
  // Over: /metrics names no table any more (per table only while it ran), only the totals.
  const std::string metrics = metrics_text(sc.port);
  CHECK(metrics.find("\nwalgate_initial_snapshot_running 0\n") != std::string::npos);
  CHECK(metrics.find("table=") == std::string::npos);
  CHECK(metrics.find("\nwalgate_initial_snapshot_rows " + std::to_string(last + 1) + "\n") != std::string::npos);
  CHECK(metrics.find("\nwalgate_initial_snapshot_rows_estimated ") != std::string::npos);
  auto lines = first_lines(sc.port, "/v1/stream?format=debezium&from=" + cp + ":" + std::to_string(last - 2), 3);
  REQUIRE(lines.size() == 3);
  std::vector<std::string> marks;
  for (const auto& l : lines) {
    auto v = boost::json::parse(l).as_object();
    const auto& payload = v.contains("payload") ? v.at("payload").as_object() : v;
    const auto* snap = payload.at("source").as_object().if_contains("snapshot");
    marks.push_back(snap ? std::string(snap->as_string()) : std::string("(none)"));
  }
  CHECK(marks[0] == "true");
  CHECK(marks[1] == "last");
  CHECK(marks[2] != "true");
  CHECK(marks[2] != "last");
}

TEST_CASE("PostgreSQL stopped -m immediate and restarted: the resuming client's replay equals SELECT") {
  scenario sc("fi");
  sc.start_streaming();
  resuming_client client(sc.port, "");
  writer w(test::cluster().conninfo(), "fi", 2);
  const int n = cycles(10);
  for (int i = 0; i < n; ++i) {
    if (i % 3 == 1) w.big_now = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(random_ms(300, 1500)));
    std::string error;
    REQUIRE_MESSAGE(test::cluster().restart_immediate(error), error);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  sc.verify(w, client);
  MESSAGE("immediate-stop cycles: " << n);
  CHECK(sc.gw.pid > 0);   // walgate rode it out
}

TEST_CASE("walsenders terminated at random moments, inside large transactions too: live clients stay connected") {
  scenario sc("ft");
  sc.start_streaming();
  resuming_client client(sc.port, "");
  resuming_client filtered(sc.port, "&tables=public.ft_a");
  writer w(test::cluster().conninfo(), "ft", 3);
  sql_conn admin(test::cluster().conninfo());
  const int n = cycles(20);
  int inside_large = 0;
  for (int i = 0; i < n; ++i) {
    if (i % 3 == 0) {
      // A large transaction commits and is being sent: terminate while walgate receives it.
      auto before = w.bigs.load();
      w.big_now = true;
      test::wait_until([&] { return w.bigs.load() > before; }, std::chrono::seconds(20));
      std::this_thread::sleep_for(std::chrono::milliseconds(random_ms(20, 200)));
      ++inside_large;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(random_ms(100, 800)));
    }
    std::vector<std::vector<std::string>> rows;
    admin.exec("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '" + sc.slot +
                   "' AND active_pid IS NOT NULL",
               &rows);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  filtered.finish();
  sc.verify(w, client);
  MESSAGE("walsender terminations: " << n << " (" << inside_large << " just after a large commit), transactions streamed: "
                                      << sc.streamed());
  CHECK(sc.streamed() > 0);
  CHECK(client.connections == 1);   // never disconnected by a reconnect to PostgreSQL
  CHECK(client.disconnects == 0);
  CHECK(filtered.connections == 1);
  CHECK(filtered.disconnects == 0);
  CHECK(filtered.problems.empty());
  CHECK(client.close_reasons.empty());
  CHECK(sc.gw.log().find("reconnecting") != std::string::npos);   // the walsenders did go
}

namespace {
/// walgate's data directory on a tmpfs of its own, so that it fills up for real (ENOSPC); made
/// larger again to give the space back. Unmounted before the scenario removes the directory.
struct small_disk {
  std::filesystem::path dir;
  bool mounted = false;
  std::string error;
  explicit small_disk(std::filesystem::path d, const std::string& size) : dir(std::move(d)) {
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size + ",mode=0700").c_str()) == 0;
    if (!mounted) error = std::strerror(errno);
  }
  bool resize(const std::string& size) {
    return ::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT, ("size=" + size + ",mode=0700").c_str()) == 0;
  }
  ~small_disk() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
};
}  // namespace

TEST_CASE("the data directory runs out of space mid-stream, then space returns: the resuming client's replay equals SELECT") {
  scenario sc("fd");
  small_disk disk(sc.data_dir, "4m");
  // As root (CI runs so) the mount works, and must. A developer's unprivileged run says SKIPPED
  // and why.
  REQUIRE_MESSAGE((disk.mounted || ::geteuid() != 0), "cannot mount a tmpfs for the data directory as root: " << disk.error);
  if (!disk.mounted) {
    MESSAGE("SKIPPED: cannot mount a tmpfs for the data directory (" << disk.error << "); run as root");
    return;
  }
  sc.start_streaming();
  resuming_client client(sc.port, "");
  writer w(test::cluster().conninfo(), "fd", 4);
  // 4 MiB fill up within seconds of the writer's changes (some of its transactions are 20,000 rows).
  int status = 0;
  bool ended = test::wait_until(
      [&] {
        if (w.bigs < 8) w.big_now = true;   // (8 × 20,000 rows are far more than 4 MiB of log)
        return waitpid(sc.gw.pid, &status, WNOHANG) == sc.gw.pid;
      },
      std::chrono::seconds(120));
  REQUIRE_MESSAGE(ended, sc.gw.log());
  sc.gw.pid = -1;
  sc.gw.reader.join();
  const std::string said = sc.gw.log();
  INFO(said);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(said.find("No space left on device") != std::string::npos);
  // Nothing past the durable position it names was acknowledged to PostgreSQL.
  auto at = said.rfind("stopped; durable ");
  REQUIRE(at != std::string::npos);
  auto durable = protocol::lsn::parse(said.substr(at + 17, said.find(',', at) - at - 17));
  auto ack_at = said.find("acknowledged ", at);
  REQUIRE(ack_at != std::string::npos);
  auto acked = protocol::lsn::parse(said.substr(ack_at + 13, said.find('\n', ack_at) - ack_at - 13));
  REQUIRE(durable);
  REQUIRE(acked);
  CHECK(*acked <= *durable);
  sql_conn q(test::cluster().conninfo());
  std::vector<std::vector<std::string>> rows;
  REQUIRE(q.exec("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '" + sc.slot + "'", &rows));
  REQUIRE(rows.size() == 1);
  auto confirmed = protocol::lsn::parse(rows[0][0]);
  REQUIRE(confirmed);
  CHECK_MESSAGE(*confirmed <= *durable, "confirmed " << confirmed->to_string() << ", durable " << durable->to_string());
  // The space comes back: walgate starts, recovers the torn tail, and the client resumes.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  REQUIRE(disk.resize("512m"));
  sc.start();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  sc.verify(w, client);
  MESSAGE("durable up to " << durable->to_string() << " when the disk filled; slot confirmed " << confirmed->to_string());
  CHECK(client.connections >= 2);
}

namespace {
/// Inserts a row into table at every poll (until the slot exists a change is not streamed) until
/// p exits, within 30 s; its exit status (128 + signal when killed).
int exit_while_inserting(walgate_process& p, const std::string& table) {
  int rc = -1, row = 0;
  REQUIRE(test::wait_until(
      [&] {
        if (row < 300) test::cluster().sql("INSERT INTO " + table + " VALUES (" + std::to_string(++row) + ", 'boom')");
        int status = 0;
        if (waitpid(p.pid, &status, WNOHANG) != p.pid) return false;
        rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        p.pid = -1;
        p.reader.join();
        return true;
      },
      std::chrono::seconds(30)));
  return rc;
}
}  // namespace

TEST_CASE("an exception in the stream path ends walgate with a non-zero exit and the reason") {
  scenario sc("fx");
  sc.gw.env = {"WALGATE_TEST_THROW_IN_STREAM=1"};
  sc.start();
  CHECK(exit_while_inserting(sc.gw, "fx_a") == 1);
  MESSAGE(sc.gw.log());
  CHECK(sc.gw.log().find("the replication stream failed: test hook: an exception in the stream path") !=
        std::string::npos);
}

// `walgate stream` once ignored the exception its stream ended with and exited 0.
TEST_CASE("an exception in walgate stream's stream path: exit 1 and the reason") {
  scenario sc("fy");
  walgate_process p;
  p.args = {"stream", "--pg", test::cluster().conninfo(), "--slot", "fy_slot", "--publication", "fy_pub"};
  p.env = {"WALGATE_TEST_THROW_IN_STREAM=1"};
  p.start();
  CHECK(exit_while_inserting(p, "fy_a") == 1);
  CHECK_MESSAGE(p.log().find("the replication stream failed: test hook: an exception in the stream path") != std::string::npos,
                p.log());
}

namespace {

long long peak_rss_kib(pid_t pid) {
  std::ifstream st("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(st, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

/// One transaction of 1,000,000 inserts read live from 0/0:0 by a client of each transport,
/// with PostgreSQL streaming the transaction to walgate while it runs (on) or sending it at its
/// commit (off).
void million_row_transaction(const std::string& prefix, const std::string& streaming) {
  scenario sc(prefix);
  sc.gw.args.insert(sc.gw.args.end(), {"--streaming", streaming});
  sc.start_streaming();
  resuming_client nd(sc.port, "");
  resuming_client sse(sc.port, "", transport::sse);
  resuming_client ws(sc.port, "", transport::websocket);
  sql_conn c(test::cluster().conninfo());
  REQUIRE(c.exec("INSERT INTO " + prefix + "_a SELECT g, repeat('m', 200) FROM generate_series(1, 1000000) g"));
  REQUIRE(c.exec("INSERT INTO " + prefix + "_b VALUES (1, 'after')"));
  resuming_client* clients[] = {&nd, &sse, &ws};
  bool all = test::wait_until(
      [&] {
        for (auto* cl : clients) {
          std::lock_guard<std::mutex> g(cl->m);
          if (cl->events < 1'000'001) return false;
        }
        return true;
      },
      std::chrono::seconds(600));
  long long hwm_kb = peak_rss_kib(sc.gw.pid);
  for (auto* cl : clients) cl->finish();
  MESSAGE("streaming " << streaming << ": events " << nd.events << " (NDJSON), " << sse.events << " (SSE), " << ws.events
                       << " (WebSocket), walgate peak RSS " << hwm_kb / 1024 << " MiB, transactions streamed "
                       << sc.streamed());
  CHECK(all);
  for (auto* cl : clients) {
    CHECK(cl->events == 1'000'001);
    CHECK(cl->connections == 1);
    CHECK(cl->problems.empty());
    CHECK(cl->close_reasons.empty());
    CHECK(cl->tables[prefix + "_a"].size() == 1'000'000);
    CHECK(cl->tables[prefix + "_b"].size() == 1);
  }
  CHECK(sse.tables[prefix + "_a"] == nd.tables[prefix + "_a"]);
  CHECK(ws.tables[prefix + "_a"] == nd.tables[prefix + "_a"]);
  CHECK((sc.streamed() > 0) == (streaming == "on"));   // streamed to walgate only when asked
  CHECK(hwm_kb > 0);
  CHECK(hwm_kb <= 256 * 1024);
}

}  // namespace

TEST_CASE("a transaction of 1,000,000 inserts, streamed while it runs: every transport gets all of it, memory bounded") {
  million_row_transaction("fm", "on");
}

TEST_CASE("a transaction of 1,000,000 inserts, sent at its commit (--streaming off): every transport gets all of it") {
  million_row_transaction("fo", "off");
}

namespace {

/// Keeps an event of hundreds of megabytes small enough to check: every run of at least 64
/// 'x' becomes "~RUN<n>~" as the bytes arrive.
struct run_collapser {
  std::string out;
  std::size_t run = 0;
  void end_run() {
    if (run >= 64) out += "~RUN" + std::to_string(run) + "~";
    else out.append(run, 'x');
    run = 0;
  }
  void feed(std::string_view b) {
    std::size_t i = 0;
    while (i < b.size()) {
      if (b[i] == 'x') {
        std::size_t j = b.find_first_not_of('x', i);
        if (j == std::string_view::npos) j = b.size();
        run += j - i;
        i = j;
      } else {
        end_run();
        std::size_t j = b.find('x', i);
        if (j == std::string_view::npos) j = b.size();
        out.append(b.substr(i, j - i));
        i = j;
      }
    }
  }
  std::string take() {
    end_run();
    std::string r = std::move(out);
    out.clear();
    return r;
  }
};

/// Reads /v1/stream (NDJSON or SSE) or /v1/ws (plain or permessage-deflate) a piece at a time,
/// each event collapsed by run_collapser, until it has `want` events.
struct collapsing_reader {
  std::uint16_t port;
  std::string format;
  std::string mode;   // ndjson, sse, ws, ws-deflate
  std::size_t want;
  std::vector<std::string> events;
  std::string error;
  std::thread thread;
  collapsing_reader(std::uint16_t p, std::string f, std::string m, std::size_t w)
      : port(p), format(std::move(f)), mode(std::move(m)), want(w) {
    thread = std::thread([this] {
      try {
        run();
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
  }
  ~collapsing_reader() {
    if (thread.joinable()) thread.join();
  }
  void run() {
    asio::io_context io;
    tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), port});
    // A read that waits two minutes ends the reader with an error (the test fails, not hangs).
    timeval tv{120, 0};
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    run_collapser line;
    if (mode == "ws" || mode == "ws-deflate") {
      websocket::stream<tcp::socket&> w(s);
      w.read_message_max(0);
      websocket::permessage_deflate pmd;
      pmd.client_enable = mode == "ws-deflate";
      w.set_option(pmd);
      w.handshake("localhost", "/v1/ws?format=" + format + "&transactions=false&from=0/0:0");
      beast::flat_buffer buf;
      while (events.size() < want) {
        w.read_some(buf, 1u << 20);
        for (auto b : beast::buffers_range(buf.data())) line.feed({static_cast<const char*>(b.data()), b.size()});
        buf.consume(buf.size());
        if (w.is_message_done()) events.push_back(line.take());
      }
      return;
    }
    std::string req = "GET /v1/stream?format=" + format + "&transactions=false&from=0/0:0 HTTP/1.1\r\nHost: localhost\r\n" +
                      (mode == "sse" ? "Accept: text/event-stream\r\n" : "") + "\r\n";
    asio::write(s, asio::buffer(req));
    beast::flat_buffer buf;
    http::response_parser<http::empty_body> parser;
    parser.body_limit(boost::none);
    http::read_header(s, buf, parser);
    if (parser.get().result_int() != 200) throw std::runtime_error("HTTP " + std::to_string(parser.get().result_int()));
    // SSE: an event is its "data: " line; NDJSON: a line (blank keep-alives are none).
    auto on_body = [&](std::uint64_t, boost::beast::string_view body, boost::system::error_code&) -> std::size_t {
      std::string_view b(body.data(), body.size());
      while (!b.empty() && events.size() < want) {
        auto nl = b.find('\n');
        line.feed(b.substr(0, nl));
        if (nl == std::string_view::npos) break;
        b.remove_prefix(nl + 1);
        std::string l = line.take();
        if (mode == "sse") {
          if (l.rfind("data: ", 0) == 0) events.push_back(l.substr(6));
        } else if (!l.empty()) {
          events.push_back(std::move(l));
        }
      }
      return body.size();
    };
    parser.on_chunk_body(on_body);
    while (events.size() < want && !parser.is_done()) http::read_some(s, buf, parser);
  }
};

/// A row with one value of `mib` MiB: every format on every transport receives it whole (and
/// the small row after it), while walgate holds it about three times at most.
void huge_value(const std::string& prefix, std::size_t mib) {
  scenario sc(prefix);
  sc.start_streaming();
  const char* formats[] = {"native", "debezium", "pgoutput2json", "waltail", "wal2json"};
  const char* modes[] = {"ndjson", "sse", "ws", "ws-deflate"};
  std::vector<std::unique_ptr<collapsing_reader>> readers;
  for (const char* f : formats)
    for (const char* m : modes) readers.push_back(std::make_unique<collapsing_reader>(sc.port, f, m, 2));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));   // (connected before the row is logged: all read it live)
  const std::size_t size = mib << 20;
  sql_conn c(test::cluster().conninfo());
  REQUIRE(c.exec("INSERT INTO " + prefix + "_a VALUES (1, repeat('x', " + std::to_string(size) + "))"));
  REQUIRE(c.exec("INSERT INTO " + prefix + "_a VALUES (2, 'small')"));
  for (auto& r : readers) r->thread.join();
  long long hwm_kb = peak_rss_kib(sc.gw.pid);
  const std::string token = "~RUN" + std::to_string(size) + "~";
  for (auto& r : readers) {
    INFO(r->format << " over " << r->mode);
    CHECK_MESSAGE(r->error.empty(), r->error);
    REQUIRE(r->events.size() == 2);
    const std::string& big = r->events[0];
    // The value whole, once, inside an event that is valid JSON.
    auto at = big.find(token);
    CHECK(at != std::string::npos);
    CHECK(big.find(token, at + 1) == std::string::npos);
    CHECK(big.find("~RUN", at == std::string::npos ? 0 : at + token.size()) == std::string::npos);
    boost::system::error_code ec;
    json::parse(big, ec);
    CHECK_MESSAGE(!ec, big.substr(0, 300));
    CHECK(r->events[1].find("small") != std::string::npos);
    json::parse(r->events[1], ec);
    CHECK(!ec);
  }
  const std::string metrics = metrics_text(sc.port);
  MESSAGE(mib << " MiB value to " << readers.size() << " clients (5 formats x NDJSON, SSE, WebSocket, WebSocket with "
              << "permessage-deflate): walgate peak RSS " << hwm_kb / 1024 << " MiB");
  // Each format's encoding spilled once, and sent from the spill file to its four clients.
  auto spilled = metrics.find("\nwalgate_payloads_spilled_total ");
  CHECK_MESSAGE(metrics.find("walgate_payloads_spilled_total 5\n") != std::string::npos,
                metrics.substr(spilled == std::string::npos ? 0 : spilled, 40));
  CHECK(metrics.find("walgate_clients_disconnected_slow_total 0\n") != std::string::npos);
  CHECK(hwm_kb > 0);
  // The server's message, the record (kept in the memory tail), one encoding at a time.
  CHECK(hwm_kb / 1024 <= static_cast<long long>(mib * 7 / 2 + 128));
}

}  // namespace

TEST_CASE("a value of 100 MiB reaches every format on every transport, sent in pieces, memory bounded") {
  huge_value("fh", 100);
}

TEST_CASE("a value of 500 MiB reaches every format on every transport, sent in pieces, memory bounded") {
  huge_value("fg", 500);
}

namespace {
/// The status of a stream request with this bearer token (the response head only).
unsigned stream_status(std::uint16_t port, const std::string& token) {
  asio::io_context io;
  tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(s, asio::buffer("GET /v1/stream HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer " + token + "\r\n\r\n"));
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  boost::system::error_code ec;
  http::read_header(s, buf, parser, ec);
  return ec ? 0 : parser.get().result_int();
}
void write_jwks(const std::filesystem::path& p, const std::string& keys) {
  const auto tmp = p.string() + ".tmp";   // written whole, then moved over it: a rotation as a provider does it
  std::ofstream(tmp, std::ios::trunc) << "{\"keys\":[" + keys + "]}";
  std::filesystem::rename(tmp, p);
}
}  // namespace

TEST_CASE("the walgate executable rotates its keys on a changed JWKS file and on SIGHUP, while clients stream") {
  scenario sc("fa");
  auto a = test::ec_key("ES256"), b = test::ed25519_key(), c = test::rsa_key("RS256");
  const auto jwks = sc.data_dir.parent_path() / (sc.data_dir.filename().string() + "-jwks.json");
  write_jwks(jwks, a.jwk("a"));
  sc.gw.args.insert(sc.gw.args.end(), {"--auth", "jwt", "--jwks-file", jwks.string(), "--jwt-leeway", "0"});
  sc.start_streaming();
  const std::string ta = test::token(a, "", "a"), tb = test::token(b, "", "b"), tc = test::token(c, "", "c");
  CHECK(stream_status(sc.port, ta) == 200);
  CHECK(stream_status(sc.port, tb) == 401);
  // A client connected with key a's token; it streams on through the rotations.
  std::vector<std::string> got;
  std::thread client([&] { got = first_lines(sc.port, "/v1/stream?access_token=" + ta, 1); });
  // (/metrics with --auth jwt: a token with the admin claim, --metrics-claim's default)
  const std::string admin = test::token(a, R"("walgate_admin":true)", "a");
  REQUIRE(test::wait_until(
      [&] { return metrics_text(sc.port, admin).find("walgate_clients{transport=\"ndjson\"} 1\n") != std::string::npos; }));
  // The provider publishes b in place of a: seen within the 2 s poll, no signal.
  write_jwks(jwks, b.jwk("b"));
  REQUIRE_MESSAGE(test::wait_until([&] { return sc.gw.log().find("a key file changed: read again, 1 key(s)") != std::string::npos; },
                                   std::chrono::seconds(10)),
                  sc.gw.log());
  CHECK(stream_status(sc.port, tb) == 200);
  CHECK(stream_status(sc.port, ta) == 401);
  test::cluster().sql("INSERT INTO fa_a VALUES (1, 'after the rotation')");
  client.join();
  REQUIRE(got.size() == 1);
  CHECK(json::parse(got[0]).at("after").at("v") == "after the rotation");
  // A broken file: said, and the keys in use stay — after the poll, and after a SIGHUP.
  {
    std::ofstream(jwks, std::ios::trunc) << "{\"keys\":[";
  }
  REQUIRE(test::wait_until([&] { return sc.gw.log().find("the keys in use stay") != std::string::npos; },
                           std::chrono::seconds(10)));
  ::kill(sc.gw.pid, SIGHUP);
  REQUIRE_MESSAGE(test::wait_until([&] { return sc.gw.log().find("SIGHUP: " + jwks.string() + ": not a JWKS document") != std::string::npos; },
                                   std::chrono::seconds(10)),
                  sc.gw.log());
  CHECK(stream_status(sc.port, tb) == 200);   // (and the process is still there: SIGHUP does not end it)
  // SIGHUP after a fix reads it at once.
  write_jwks(jwks, b.jwk("b") + "," + c.jwk("c"));
  ::kill(sc.gw.pid, SIGHUP);
  REQUIRE_MESSAGE(test::wait_until([&] { return sc.gw.log().find("SIGHUP: key files read again: 2 key(s)") != std::string::npos; },
                                   std::chrono::seconds(10)),
                  sc.gw.log());
  CHECK(stream_status(sc.port, tc) == 200);
  CHECK(stream_status(sc.port, tb) == 200);
  // No token ever reaches the log; each refusal does, on a line of its own.
  const std::string log = sc.gw.log();
  for (const auto& t : {ta, tb, tc}) CHECK(log.find(t.substr(t.rfind('.') + 1)) == std::string::npos);
  CHECK_MESSAGE(log.find("walgate: refused 401 /v1/stream from 127.0.0.1: invalid token: ") != std::string::npos, log);
  std::filesystem::remove(jwks);
}

TEST_CASE("--origin none: changes replayed from a replication origin are not streamed (PostgreSQL 16+; before, walgate stops saying why); without it they come with their origin") {
  auto& pg = test::cluster();
  sql_conn q(pg.conninfo());
  std::vector<std::vector<std::string>> v;
  REQUIRE(q.exec("SELECT current_setting('server_version_num')::int / 10000", &v));
  const bool supported = std::stoi(v.at(0).at(0)) >= 16;
  REQUIRE(q.exec("SELECT pg_replication_origin_create('org_elsewhere')"));
  // One change made as if replayed from elsewhere (the session's origin set), one local.
  auto write = [&](const std::string& table) {
    REQUIRE(q.exec("SELECT pg_replication_origin_session_setup('org_elsewhere')"));
    REQUIRE(q.exec("INSERT INTO " + table + " VALUES (1, 'replayed')"));
    REQUIRE(q.exec("SELECT pg_replication_origin_session_reset()"));
    REQUIRE(q.exec("INSERT INTO " + table + " VALUES (2, 'local')"));
  };
  // --origin none.
  scenario none("org_none");
  none.gw.args.insert(none.gw.args.end(), {"--origin", "none"});
  std::vector<std::string> got;
  bool refused = false;
  if (supported) {
    none.start_streaming();
    write("org_none_a");
    got = first_lines(none.port, "/v1/stream?from=0/0:0", 1);
  } else {
    none.start();
    refused = test::wait_until([&] { return none.gw.log().find("the origin option needs PostgreSQL 16 or later") != std::string::npos; },
                               std::chrono::seconds(30));
    none.gw.kill_with(SIGKILL);
  }
  CHECK_MESSAGE(refused == !supported, none.gw.log());
  CHECK(got.size() == (supported ? 1u : 0u));
  for (const auto& l : got) CHECK(json::parse(l).at("after").at("v") == "local");
  // Without it: both, the replayed one with its origin in the native event.
  scenario any("org_any");
  any.start_streaming();
  write("org_any_a");
  auto both = first_lines(any.port, "/v1/stream?from=0/0:0", 2);
  REQUIRE(both.size() == 2);
  auto replayed = json::parse(both[0]).as_object(), local = json::parse(both[1]).as_object();
  CHECK(replayed.at("after").at("v") == "replayed");
  CHECK(replayed.at("origin") == "org_elsewhere");
  CHECK(local.at("after").at("v") == "local");
  CHECK_FALSE(local.contains("origin"));
  REQUIRE(q.exec("SELECT pg_replication_origin_drop('org_elsewhere')"));
}

namespace {
/// One event of the publication's tables (or a logical message) as a line both decoders can be
/// brought to: "insert <table> <id> <v>", "update …", "delete <table> <id>",
/// "message <0|1> <prefix> <content>".
std::optional<std::string> from_test_decoding(const std::string& line, const std::string& prefix) {
  // table public.dx_a: INSERT: id[integer]:5 v[text]:'abc'
  // message: transactional: 0 prefix: p, sz: 1 content:x
  if (line.rfind("message: transactional: ", 0) == 0) {
    const std::string tx = line.substr(24, 1);
    const auto p = line.find("prefix: ") + 8, comma = line.find(", sz: ", p), content = line.find(" content:", comma);
    return "message " + tx + " " + line.substr(p, comma - p) + " " + line.substr(content + 9);
  }
  const std::string head = "table public." + prefix + "_";
  if (line.rfind(head, 0) != 0) return std::nullopt;   // BEGIN, COMMIT, tables outside the publication
  const auto colon = line.find(": ");
  const std::string table = line.substr(13, colon - 13);
  if (table != prefix + "_a" && table != prefix + "_b") return std::nullopt;   // (outside the publication)
  const auto op_end = line.find(':', colon + 2);
  std::string op = line.substr(colon + 2, op_end - colon - 2);
  for (auto& c : op) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto id_at = line.find("id[integer]:") + 12;
  const std::string id = line.substr(id_at, line.find(' ', id_at) - id_at);
  if (op == "delete") return "delete " + table + " " + id;
  const auto v_at = line.find("v[text]:'") + 9;
  return op + " " + table + " " + id + " " + line.substr(v_at, line.rfind('\'') - v_at);
}

std::string from_native(const std::string& line) {
  const auto o = boost::json::parse(line).as_object();
  const std::string op(o.at("op").as_string());
  if (op == "message")
    return "message " + std::string(o.at("transactional").as_bool() ? "1" : "0") + " " +
           std::string(o.at("prefix").as_string()) + " " + std::string(o.at("content").as_string());
  const std::string table(o.at("table").as_string());
  if (op == "delete") return "delete " + table + " " + std::to_string(o.at("before").at("id").as_int64());
  return op + " " + table + " " + std::to_string(o.at("after").at("id").as_int64()) + " " +
         std::string(o.at("after").at("v").as_string());
}
}  // namespace

TEST_CASE("differential: walgate's log equals a second slot's decoding — messages at commit LSNs, empty, savepoint, streamed and two-phase transactions, walsenders terminated") {
  auto& pg = test::cluster();
  if (pg.server_major() < 14) {
    MESSAGE("SKIPPED on PostgreSQL " << pg.server_major() << ": pgoutput sends logical messages from 14");
    return;
  }
  scenario sc("dx");
  pg.sql("CREATE TABLE dx_other(id int PRIMARY KEY)");   // outside the publication
  sc.start_streaming();
  // The reference: test_decoding on a slot of its own, made after walgate's (and before the
  // writer): both decode the same WAL from before the first write.
  pg.sql("SELECT pg_create_logical_replication_slot('dx_ref', 'test_decoding')");

  std::atomic<bool> stop{false};
  std::atomic<int> written{0};
  std::string writer_error;
  std::thread writer([&] {
    sql_conn c(pg.conninfo());
    std::mt19937 rng(7);
    long long next = 1;
    int k = 0;
    auto t = [&] { return rng() % 2 ? std::string("dx_a") : std::string("dx_b"); };
    auto ins = [&](const std::string& table, const std::string& v) {
      return "INSERT INTO " + table + " VALUES (" + std::to_string(next++) + ", '" + v + "');";
    };
    auto must = [&](const std::string& q) {
      for (int tries = 0; tries < 50; ++tries) {
        if (c.exec(q)) return true;
        c.exec("ROLLBACK");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      writer_error = "cannot run: " + q;
      return false;
    };
    while (!stop && writer_error.empty() && k < 1500) {
      const std::string n = std::to_string(++k);
      std::string q;
      switch (rng() % 12) {
        case 0: q = ins(t(), "i" + n); break;
        case 1: {
          const std::string tb = t();
          q = "UPDATE " + tb + " SET v = 'u" + n + "' WHERE id = (SELECT min(id) FROM " + tb + ");";
          break;
        }
        case 2: {
          const std::string tb = t();
          q = "DELETE FROM " + tb + " WHERE id = (SELECT max(id) FROM " + tb + ");";
          break;
        }
        case 3:   // the lost transaction: its last statement a non-transactional message
          q = "BEGIN;" + ins(t(), "a" + n);
          q += ins(t(), "b" + n) + "SELECT pg_logical_emit_message(false, 'nt', 'last" + n + "'); COMMIT;";
          break;
        case 4: q = "SELECT pg_logical_emit_message(false, 'nt', 'alone" + n + "');"; break;
        case 5:
          q = "BEGIN;" + ins(t(), "t" + n) + "SELECT pg_logical_emit_message(true, 'tx', 'in" + n + "');";
          q += ins(t(), "t" + n) + "COMMIT;";
          break;
        case 6: {   // empty ones, and a message that outlives its rolled-back transaction
          const int which = static_cast<int>(rng() % 3);
          q = which == 0   ? "BEGIN; COMMIT;"
              : which == 1 ? "BEGIN; INSERT INTO dx_other VALUES (" + std::to_string(next++) + "); COMMIT;"
                           : "BEGIN; SELECT pg_logical_emit_message(false, 'nt', 'rb" + n + "');" + ins(t(), "rb" + n) +
                                 "ROLLBACK;";
          break;
        }
        case 7:   // savepoints: a rolled-back part, a released one
          q = "BEGIN;" + ins(t(), "s" + n) + "SAVEPOINT s1;";
          q += ins(t(), "gone" + n) + "ROLLBACK TO s1;";
          q += ins(t(), "kept" + n) + "SAVEPOINT s2; UPDATE dx_a SET v = 'sp" + n + "' WHERE id = (SELECT min(id) FROM dx_a); RELEASE s2;" +
              "SELECT pg_logical_emit_message(false, 'nt', 'sp" + n + "'); COMMIT;";
          break;
        case 8: {   // streamed while it runs (past logical_decoding_work_mem), messages inside; or aborted
          // (each part made in its own statement: the operands of + are not evaluated in order)
          const std::string from = std::to_string(next), to = std::to_string(next + 1499);
          next += 1500;
          const bool abort = rng() % 4 == 0;
          const std::string big = "INSERT INTO " + t() + " SELECT g, 'big" + n + "' FROM generate_series(" + from + ", " + to + ") g;";
          const std::string after = ins(t(), "after" + n);
          q = "BEGIN;" + big + "SELECT pg_logical_emit_message(false, 'nt', 'mid" + n +
              "'); SELECT pg_logical_emit_message(true, 'tx', 'big" + n + "');" + after +
              (abort ? "ROLLBACK;" : "SELECT pg_logical_emit_message(false, 'nt', 'end" + n + "'); COMMIT;");
          break;
        }
        case 9: {   // two-phase: a message between PREPARE and COMMIT PREPARED; some rolled back
          const std::string gid = "dxg" + n;
          if (!must("BEGIN;" + ins(t(), "p" + n) + "SELECT pg_logical_emit_message(true, 'tx', 'prep" + n +
                    "'); PREPARE TRANSACTION '" + gid + "';"))
            break;
          must("SELECT pg_logical_emit_message(false, 'nt', 'between" + n + "');");
          q = (rng() % 4 == 0 ? "ROLLBACK PREPARED '" : "COMMIT PREPARED '") + gid + "';";
          break;
        }
        default:
          q = ins(t(), "m" + n);
          q += ins(t(), "m" + n);
          break;
      }
      if (!q.empty() && !must(q)) break;
      ++written;
      std::this_thread::sleep_for(std::chrono::milliseconds(4));
    }
  });
  sql_conn admin(pg.conninfo());
  const int n = cycles(25);
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(random_ms(50, 500)));
    admin.exec("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '" + sc.slot +
               "' AND active_pid IS NOT NULL");
  }
  stop = true;
  writer.join();
  REQUIRE_MESSAGE(writer_error.empty(), writer_error);
  // (a message alone does not flush the WAL, and neither slot is sent what is not flushed: a
  // commit after it, of a table outside the publication, does)
  REQUIRE(admin.exec("SELECT pg_logical_emit_message(false, 'nt', 'the end'); INSERT INTO dx_other VALUES (0)"));

  // The reference, until it holds the end (the commit after it may not be flushed yet when
  // first asked).
  std::vector<std::string> expected;
  test::wait_until(
      [&] {
        std::vector<std::vector<std::string>> rows;
        REQUIRE(admin.exec("SELECT data FROM pg_logical_slot_get_changes('dx_ref', NULL, NULL, 'skip-empty-xacts', '1')", &rows));
        for (const auto& r : rows)
          if (auto e = from_test_decoding(r[0], "dx")) expected.push_back(*e);
        return !expected.empty() && expected.back() == "message 0 nt the end";
      },
      std::chrono::seconds(30));
  REQUIRE_MESSAGE(!expected.empty(), "test_decoding gave nothing");
  CHECK_MESSAGE(expected.back() == "message 0 nt the end", expected.back());

  auto lines = first_lines(sc.port, "/v1/stream?from=0/0:0", expected.size() + 1);   // (one more: none comes)
  std::vector<std::string> got;
  std::set<std::string> ids;
  std::optional<transform::event_id> previous;
  std::size_t disorder = 0;
  for (const auto& l : lines) {
    got.push_back(from_native(l));
    const std::string id(boost::json::parse(l).at("id").as_string());
    CHECK_MESSAGE(ids.insert(id).second, "a second event with the id " << id);
    const auto parsed = transform::event_id::parse(id);
    REQUIRE(parsed);
    if (previous && !(*previous < *parsed)) ++disorder;
    previous = parsed;
  }
  CHECK(disorder == 0);
  std::size_t first_difference = 0;
  while (first_difference < std::min(got.size(), expected.size()) && got[first_difference] == expected[first_difference])
    ++first_difference;
  CHECK_MESSAGE(got == expected, "walgate has " << got.size() << " events, test_decoding " << expected.size()
                                                << "; the first difference at " << first_difference << ": walgate "
                                                << (first_difference < got.size() ? got[first_difference] : "(none)")
                                                << ", test_decoding "
                                                << (first_difference < expected.size() ? expected[first_difference] : "(none)"));
  std::size_t messages = 0, at_commit = 0;
  for (const auto& e : expected) {
    messages += e.rfind("message 0", 0) == 0;
    at_commit += e.rfind("message 0 nt last", 0) == 0;
  }
  MESSAGE("statements " << written.load() << ", events " << expected.size() << ", non-transactional messages " << messages
                        << " (" << at_commit << " as a transaction's last statement), walsender terminations " << n
                        << ", transactions streamed " << sc.streamed());
  CHECK(at_commit > 0);
  CHECK(sc.streamed() > 0);
  CHECK(sc.gw.log().find("reconnecting") != std::string::npos);
  admin.exec("SELECT pg_drop_replication_slot('dx_ref')");
}

namespace {
/// SIGTERM to walgate, then up to 30 s for it to exit; `resume` (the backends stopped) runs
/// either way once the wait ends. Still running then: killed so that the test ends (exited
/// stays false). The seconds it took.
struct sigterm_result {
  bool exited = false;
  int status = 0;
  double took = 0;
};
sigterm_result sigterm_and_wait(walgate_process& gw, const std::function<void()>& resume) {
  sigterm_result r;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(::kill(gw.pid, SIGTERM) == 0);
  pid_t done = 0;
  while (done == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    done = ::waitpid(gw.pid, &r.status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  r.took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  resume();
  if (done == 0) {
    ::kill(gw.pid, SIGKILL);
    ::waitpid(gw.pid, &r.status, 0);
  }
  r.exited = done > 0;
  gw.pid = -1;
  gw.reader.join();
  return r;
}
}  // namespace

TEST_CASE("SIGTERM while a snapshot's backend answers nothing (stopped, cancel and all): walgate still exits within seconds") {
  scenario sc("fq");
  auto& pg = test::cluster();
  pg.sql("INSERT INTO fq_a SELECT g, md5(g::text) FROM generate_series(1, 1000) g");
  sc.start_streaming();
  // Streaming, so the initial snapshot is over (its slot is active while it is made: a lock
  // taken then held back the initial snapshot, the case of the next test, and walgate hung).
  REQUIRE_MESSAGE(test::wait_until([&] { return sc.gw.log().find("streaming from PostgreSQL at") != std::string::npos; },
                                   std::chrono::seconds(60)),
                  sc.gw.log());
  // The table locked: the snapshot's COPY waits for the lock inside libpq; then its backend is
  // stopped, so that not even the cancel walgate sends at shutdown is answered.
  sql_conn locker(pg.conninfo());
  REQUIRE(locker.exec("BEGIN; LOCK TABLE fq_a IN ACCESS EXCLUSIVE MODE"));
  std::thread reader([&] { first_lines(sc.port, "/v1/stream?snapshot=true&tables=public.fq_a", 1); });
  sql_conn admin(pg.conninfo());
  std::string backend;
  REQUIRE(test::wait_until(
      [&] {
        std::vector<std::vector<std::string>> rows;
        admin.exec("SELECT pid FROM pg_stat_activity WHERE application_name = 'walgate snapshot' AND wait_event_type = 'Lock'",
                   &rows);
        if (rows.empty()) return false;
        backend = rows[0][0];
        return true;
      },
      std::chrono::seconds(30)));
  const pid_t stopped = static_cast<pid_t>(std::stol(backend));
  REQUIRE(::kill(stopped, SIGSTOP) == 0);
  auto [exited, status, took] = sigterm_and_wait(sc.gw, [&] {
    ::kill(stopped, SIGCONT);   // (the backend goes on, and is cancelled)
    locker.exec("ROLLBACK");
  });
  reader.join();
  MESSAGE("walgate exited " << took << " s after SIGTERM");
  CHECK_MESSAGE(exited, "walgate did not exit within 30 s of SIGTERM:\n" << sc.gw.log());
  CHECK(took < 15);
  CHECK(WIFEXITED(status));
  CHECK(sc.gw.log().find("a snapshot connection did not end within 5 s of its cancel") != std::string::npos);
}

TEST_CASE("SIGTERM in the middle of the initial snapshot, its backends answering nothing: walgate exits within seconds; the next start takes the snapshot again") {
  // Assumption broken here: the initial snapshot's copy ends by itself. Its workers sit inside
  // libpq as long as their backends answer nothing; the shutdown cancels them and waits 5 s.
  scenario sc("fr");
  auto& pg = test::cluster();
  pg.sql("INSERT INTO fr_a SELECT g, md5(g::text) FROM generate_series(1, 1500000) g");
  sc.start();
  sql_conn admin(pg.conninfo());
  std::vector<pid_t> stopped;
  REQUIRE_MESSAGE(test::wait_until(
                      [&] {
                        std::vector<std::vector<std::string>> rows;
                        admin.exec("SELECT pid FROM pg_stat_activity WHERE application_name = 'walgate initial snapshot' "
                                   "AND state = 'active' AND query LIKE 'COPY%'",
                                   &rows);
                        for (const auto& r : rows) {
                          const auto pid = static_cast<pid_t>(std::stol(r[0]));
                          if (::kill(pid, SIGSTOP) == 0) stopped.push_back(pid);
                        }
                        return !stopped.empty();
                      },
                      std::chrono::seconds(60)),
                  sc.gw.log());
  auto [exited, status, took] = sigterm_and_wait(sc.gw, [&] {
    for (pid_t p : stopped) ::kill(p, SIGCONT);   // (they go on, and are cancelled)
  });
  MESSAGE("walgate exited " << took << " s after SIGTERM, " << stopped.size() << " copying backends stopped");
  CHECK_MESSAGE(exited, "walgate did not exit within 30 s of SIGTERM:\n" << sc.gw.log());
  CHECK(took < 15);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const std::string said = sc.gw.log();
  CHECK_MESSAGE(said.find("initial snapshot: a connection did not end within 5 s of its cancel: not waited for") !=
                    std::string::npos,
                said);
  CHECK_MESSAGE(said.find("rows/s)") == std::string::npos, said);   // (the copy did not end)

  // The next start drops the slot whose snapshot is gone and takes it again: the replay from
  // 0/0:0 equals SELECT.
  writer w(pg.conninfo(), "fr", 3, false);
  sc.start_streaming();
  CHECK_MESSAGE(sc.gw.this_run().find("the initial snapshot was cut off last time") != std::string::npos, sc.gw.log());
  REQUIRE_MESSAGE(test::wait_until([&] { return sc.gw.this_run().find("rows/s)") != std::string::npos; },
                                   std::chrono::seconds(120)),
                  sc.gw.log());
  resuming_client client(sc.port, "");
  sc.verify(w, client);
  CHECK(client.events >= 1'500'000);
}
