// The fault tests' harness: the walgate executable as a process (killed, restarted), a writer
// committing the mixed workload, a client that resumes from the last id it received and replays
// into a model of each table, and the comparison with SELECT. Shared by fault_tests and the
// JetStream tests.
#pragma once

#include "walgate/transform/change.hpp"

#include "http_reading.hpp"
#include "test_cluster.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>

#include <doctest/doctest.h>
#include <libpq-fe.h>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

namespace walgate::test::fault_harness {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace json = boost::json;
using tcp = asio::ip::tcp;

inline int cycles(int n) {
  const char* f = std::getenv("WALGATE_FAULT_CYCLES");
  double scale = f ? std::atof(f) : 1.0;
  return std::max(1, static_cast<int>(n * scale));
}

inline std::uint16_t free_port() {
  asio::io_context io;
  tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

/// The walgate executable, its stderr collected.
struct walgate_process {
  std::vector<std::string> args;
  std::vector<std::string> env;
  pid_t pid = -1;
  int err_fd = -1;
  std::thread reader;
  std::mutex m;
  std::string output;          // every start's stderr, one after the other
  std::size_t run_from = 0;    // where this start's stderr begins in it
  std::atomic<bool> listening{false};

  // Assumption: a later start's lines are told apart from an earlier one's (a test that waits
  // for a line must not be satisfied by the process it killed before).
  void start() {
    listening = false;
    {
      std::lock_guard<std::mutex> g(m);
      run_from = output.size();
    }
    int p[2];
    REQUIRE(pipe(p) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      dup2(p[1], 2);
      close(p[0]);
      close(p[1]);
      for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv{const_cast<char*>(WALGATE_BINARY)};
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(WALGATE_BINARY, argv.data());
      _exit(127);
    }
    close(p[1]);
    err_fd = p[0];
    reader = std::thread([this, fd = err_fd] {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) {
        std::lock_guard<std::mutex> g(m);
        output.append(buf, static_cast<std::size_t>(n));
        if (output.find("listening on", run_from) != std::string::npos) listening = true;
      }
      close(fd);
    });
  }
  /// Waits for the process to end; its exit status (128 + signal when killed).
  int wait() {
    int status = 0;
    waitpid(pid, &status, 0);
    reader.join();
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  int kill_with(int sig) {
    ::kill(pid, sig);
    return wait();
  }
  std::string log() {
    std::lock_guard<std::mutex> g(m);
    return output;
  }
  /// What the latest start printed.
  std::string this_run() {
    std::lock_guard<std::mutex> g(m);
    return output.substr(run_from);
  }
  ~walgate_process() {
    if (pid > 0) kill_with(SIGKILL);
  }
};

/// A libpq connection that reconnects after the server went away.
struct sql_conn {
  std::string conninfo;
  PGconn* c = nullptr;
  explicit sql_conn(std::string ci) : conninfo(std::move(ci)) {}
  ~sql_conn() {
    if (c) PQfinish(c);
  }
  /// Runs q; false when it failed (connection lost, or an error).
  bool exec(const std::string& q, std::vector<std::vector<std::string>>* rows = nullptr) {
    if (!c || PQstatus(c) != CONNECTION_OK) {
      if (c) PQfinish(c);
      c = PQconnectdb(conninfo.c_str());
      if (PQstatus(c) != CONNECTION_OK) return false;
    }
    PGresult* r = PQexec(c, q.c_str());
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (ok && rows) {
      rows->clear();
      for (int i = 0; i < PQntuples(r); ++i) {
        rows->emplace_back();
        for (int j = 0; j < PQnfields(r); ++j) rows->back().push_back(PQgetvalue(r, i, j));
      }
    }
    PQclear(r);
    return ok;
  }
};

using table_model = std::map<long long, std::string>;   // id -> v

enum class transport { ndjson, sse, websocket };

/// Reads NDJSON, SSE or WebSocket (native format) from walgate, resuming from the last id it
/// received after every disconnect, and replays the events into a model of each table.
struct resuming_client {
  std::atomic<std::uint16_t> port;
  std::atomic<std::uint16_t> alt_port{0};   // set: where to go when port does not answer
  std::string query;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::mutex m;
  std::map<std::string, table_model> tables;
  std::string last_id = "0/0:0";
  transform::event_id last{};
  std::uint64_t events = 0, connections = 0, disconnects = 0, duplicates = 0;
  std::vector<std::string> problems;   // anything a client must never see
  std::vector<std::string> close_reasons;
  /// A 410 (its history cut after a failover, or retention) is then no problem: the client
  /// drops its model and starts over from 0/0:0, as an application takes a new snapshot.
  std::atomic<bool> start_over_on_410{false};
  std::uint64_t starts_over = 0;
  void start_over() {   // (m held)
    tables.clear();
    last = {};
    last_id = "0/0:0";
    ++starts_over;
  }

  bool sse = false;   // Server-Sent Events instead of NDJSON
  bool ws = false;
  std::atomic<int> ws_fd{-1};   // shut down to end a blocking WebSocket read
  resuming_client(std::uint16_t p, std::string q, transport t = transport::ndjson)
      : port(p), query(std::move(q)), sse(t == transport::sse), ws(t == transport::websocket) {
    thread = std::thread([this] { ws ? run_ws() : run(); });
  }
  ~resuming_client() { finish(); }
  void finish() {
    stop = true;
    {
      std::lock_guard<std::mutex> g(m);   // (the socket is not closed while this holds)
      if (ws_fd >= 0) ::shutdown(ws_fd, SHUT_RDWR);
    }
    if (thread.joinable()) thread.join();
  }

  /// Connects to walgate; false, after a short wait, while it is not listening.
  bool connect_or_wait(tcp::socket& s) {
    boost::system::error_code ec;
    s.connect({asio::ip::make_address("127.0.0.1"), port.load()}, ec);
    // Nothing listening on a port of the ephemeral range (a server just killed): the kernel may
    // give the socket that very port and connect it to itself (TCP simultaneous open), and the
    // client would read its own request. Not a server: as refused.
    if (!ec) {
      boost::system::error_code e1, e2;
      if (s.local_endpoint(e1) == s.remote_endpoint(e2)) {
        s.close(e1);
        ec = asio::error::connection_refused;
      }
    }
    if (ec) {
      // Another server to go to (an edge killed: its clients resume on another edge).
      if (alt_port) port = alt_port.exchange(port.load());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return !ec;
  }

  /// The body of a plain request resuming from `from` now (why a WebSocket upgrade was refused).
  std::string why_refused(const std::string& from) {
    asio::io_context io;
    tcp::socket s(io);
    boost::system::error_code ec;
    s.connect({asio::ip::make_address("127.0.0.1"), port.load()}, ec);
    if (ec) return "(no answer)";
    http::request<http::empty_body> req{http::verb::get, "/v1/stream?format=native&from=" + from + query, 11};
    req.set(http::field::host, "localhost");
    http::write(s, req, ec);
    beast::flat_buffer b;
    http::response_parser<http::string_body> p;
    http::read_header(s, b, p, ec);
    if (ec) return "(no answer)";
    if (p.get().result_int() == 200) return "(200 now)";
    http::read(s, b, p, ec);
    return p.get().body();
  }

  void run_ws() {
    while (!stop) {
      asio::io_context io;
      tcp::socket s(io);
      if (!connect_or_wait(s)) continue;
      boost::system::error_code ec;
      {
        std::lock_guard<std::mutex> g(m);
        if (stop) break;
        ws_fd = s.native_handle();
      }
      websocket::stream<tcp::socket&> w(s);
      w.read_message_max(0);
      std::string from;
      {
        std::lock_guard<std::mutex> g(m);
        from = last_id;
      }
      websocket::response_type res;
      w.handshake(res, "localhost", "/v1/ws?format=native&from=" + from + query, ec);
      if (ec) {
        {
          std::lock_guard<std::mutex> g(m);
          ws_fd = -1;
          // (walgate went away mid-handshake: retried; an answer that is not an upgrade: wrong).
          // Beast presets the response to 500 before it writes the request, so the status says
          // nothing when the exchange itself failed: only a WebSocket-level refusal counts.
          // A 503 (an edge still copying the stream, too many clients) says to try again.
          if (ec.category() == websocket::make_error_code(websocket::error::upgrade_declined).category() &&
              res.result_int() == 410 && start_over_on_410)
            start_over();
          else if (ec.category() == websocket::make_error_code(websocket::error::upgrade_declined).category() &&
                   res.result_int() != 503)
            problems.push_back("HTTP " + std::to_string(res.result_int()) + " resuming from " + from + ": " + why_refused(from));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;   // walgate went away, or refused
      }
      {
        std::lock_guard<std::mutex> g(m);
        ++connections;
      }
      beast::flat_buffer buf;
      while (!stop) {
        w.read(buf, ec);
        if (ec) break;
        std::string message = beast::buffers_to_string(buf.data());
        buf.consume(buf.size());
        std::lock_guard<std::mutex> g(m);
        apply(message);
      }
      std::lock_guard<std::mutex> g(m);
      ws_fd = -1;
      if (ec == websocket::error::closed) close_reasons.push_back(std::string(w.reason().reason.data(), w.reason().reason.size()));
      if (!stop) ++disconnects;
    }
  }

  void apply(const std::string& line) {
    auto v = json::parse(line);
    auto& o = v.as_object();
    if (o.contains("error")) {
      close_reasons.push_back(line);
      return;
    }
    std::string id_text(o.at("id").as_string());
    auto id = transform::event_id::parse(id_text);
    if (!id) {
      problems.push_back("bad id " + id_text);
      return;
    }
    if (!(last < *id)) {
      ++duplicates;   // an id not after the one before: twice, or out of order
      problems.push_back("event " + id_text + " after " + last.to_string());
      return;
    }
    last = *id;
    last_id = id_text;
    ++events;
    std::string op(o.at("op").as_string());
    if (op == "message") return;
    auto& t = tables[std::string(o.at("table").as_string())];
    auto key = [](const json::value& row) { return row.as_object().at("id").to_number<long long>(); };
    if (op == "insert" || op == "read") {   // (read: a row of the initial snapshot)
      if (op == "read" && t.contains(key(o.at("after")))) problems.push_back("a snapshot row twice at " + id_text);
      t[key(o.at("after"))] = std::string(o.at("after").at("v").as_string());
    } else if (op == "update") {
      if (!o.at("before").is_null()) t.erase(key(o.at("before")));
      t[key(o.at("after"))] = std::string(o.at("after").at("v").as_string());
    } else if (op == "delete") {
      if (!t.erase(key(o.at("before")))) problems.push_back("delete of a row not in the model at " + id_text);
    } else if (op == "truncate") {
      t.clear();
    }
  }

  void run() {
    while (!stop) {
      asio::io_context io;
      tcp::socket s(io);
      if (!connect_or_wait(s)) continue;
      boost::system::error_code ec;
      std::string from;
      {
        std::lock_guard<std::mutex> g(m);
        from = last_id;
      }
      std::string req = "GET /v1/stream?format=native&from=" + from + query + " HTTP/1.1\r\nHost: localhost\r\n" +
                        (sse ? "Accept: text/event-stream\r\n" : "") + "\r\n";
      asio::write(s, asio::buffer(req), ec);
      beast::flat_buffer buf;
      http::response_parser<http::string_body> parser;
      parser.body_limit(boost::none);
      http::read_header(s, buf, parser, ec);
      if (ec) continue;   // walgate went away before answering
      bool refused = false;
      {
        std::lock_guard<std::mutex> g(m);
        ++connections;
        if (parser.get().result_int() != 200) {
          // (a 503 says to try again: an edge still copying the stream, too many clients)
          if (parser.get().result_int() == 410 && start_over_on_410)
            start_over();
          else if (parser.get().result_int() != 503)
            problems.push_back("HTTP " + std::to_string(parser.get().result_int()) + " resuming from " + from);
          refused = true;
        }
      }
      if (refused) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      std::size_t consumed = 0;
      // Each round: what the buffer holds is parsed and its lines applied; what is left needs
      // more bytes, so the read waits for the socket (a stop is never held by a blocking read).
      while (!stop) {
        test::parse_buffered(parser, buf);
        auto& body = parser.get().body();
        std::size_t nl;
        {
          std::lock_guard<std::mutex> g(m);
          while ((nl = body.find('\n', consumed)) != std::string::npos) {
            std::string line = body.substr(consumed, nl - consumed);
            consumed = nl + 1;
            if (sse) {
              if (line.rfind("data: ", 0) == 0) apply(line.substr(6));   // (id:, retry:, comments: not events)
            } else if (!line.empty()) {
              apply(line);
            }
          }
        }
        if (consumed > (1u << 20)) {
          body.erase(0, consumed);
          consumed = 0;
        }
        if (ec || parser.is_done()) break;
        pollfd p{s.native_handle(), POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        http::read_some(s, buf, parser, ec);
      }
      std::lock_guard<std::mutex> g(m);
      if (!stop) ++disconnects;
    }
  }
};

/// Inserts, updates (some changing the key), deletes, multi-table and large transactions,
/// truncates, until stopped; reconnects after the server went away.
struct writer {
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> statements{0};
  std::atomic<bool> big_now{false};   // run a large transaction next
  std::atomic<std::uint64_t> bigs{0};
  std::string prefix;
  bool truncates;   // TRUNCATE now and then (off where a test counts rows that were there before)
  writer(const std::string& conninfo, std::string p, unsigned seed, bool truncate = true)
      : prefix(std::move(p)), truncates(truncate) {
    thread = std::thread([this, conninfo, seed] { run(conninfo, seed); });
  }
  ~writer() { finish(); }
  void finish() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
  void run(const std::string& conninfo, unsigned seed) {
    sql_conn c(conninfo);
    std::mt19937 rng(seed);
    long long next = 1;
    const std::string a = prefix + "_a", b = prefix + "_b";
    auto pick = [&](const std::string& t) {
      return "(SELECT id FROM " + t + " ORDER BY random() LIMIT 1)";
    };
    while (!stop) {
      std::string t = rng() % 2 ? a : b;
      std::string q;
      if (big_now.exchange(false)) {
        q = "INSERT INTO " + t + " SELECT g, md5(g::text) FROM generate_series(" + std::to_string(next) + ", " +
            std::to_string(next + 20'000 - 1) + ") g";
        next += 20'000;
        ++bigs;
      } else {
        switch (rng() % 10) {
          case 0: case 1: case 2:
            q = "INSERT INTO " + t + " VALUES (" + std::to_string(next++) + ", 'v" + std::to_string(rng() % 1000) + "')";
            break;
          case 3: case 4:
            q = "UPDATE " + t + " SET v = 'u" + std::to_string(rng() % 1000) + "' WHERE id = " + pick(t);
            break;
          case 5:   // the key changes: the old key comes in before
            q = "UPDATE " + t + " SET id = " + std::to_string(next++) + " WHERE id = " + pick(t);
            break;
          case 6:
            q = "DELETE FROM " + t + " WHERE id = " + pick(t);
            break;
          case 7: case 8:   // one transaction across both tables
            q = "BEGIN; INSERT INTO " + a + " VALUES (" + std::to_string(next) + ", 'x'); INSERT INTO " + b + " VALUES (" +
                std::to_string(next + 1) + ", 'y'); UPDATE " + a + " SET v = 'z' WHERE id = " + pick(a) +
                "; DELETE FROM " + b + " WHERE id = " + pick(b) + "; COMMIT";
            next += 2;
            break;
          case 9:
            q = rng() % 20 == 0 && truncates ? "TRUNCATE " + b
                                : "INSERT INTO " + t + " SELECT g, 'm' FROM generate_series(" + std::to_string(next) +
                                      ", " + std::to_string(next + 199) + ") g";
            if (q.rfind("INSERT", 0) == 0) next += 200;
            break;
        }
      }
      if (!c.exec(q)) {
        c.exec("ROLLBACK");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      ++statements;
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
  }
};

inline table_model select_table(sql_conn& c, const std::string& t) {
  std::vector<std::vector<std::string>> rows;
  REQUIRE(c.exec("SELECT id, v FROM " + t, &rows));
  table_model m;
  for (const auto& r : rows) m[std::stoll(r[0])] = r[1];
  return m;
}

/// Waits until c's replay of <prefix>_a and <prefix>_b equals SELECT through q (a and b: the
/// tables as last selected); false after 90 s.
inline bool replay_equals(resuming_client& c, sql_conn& q, const std::string& prefix, table_model& a, table_model& b) {
  return test::wait_until(
      [&] {
        a = select_table(q, prefix + "_a");
        b = select_table(q, prefix + "_b");
        std::lock_guard<std::mutex> g(c.m);
        return c.tables[prefix + "_a"] == a && c.tables[prefix + "_b"] == b;
      },
      std::chrono::seconds(90));
}

/// A GET of target from walgate (with a bearer token when given): status and body ({0, ""} when
/// it does not answer).
inline std::pair<unsigned, std::string> http_get(std::uint16_t port, const std::string& target, const std::string& bearer = "") {
  asio::io_context io;
  tcp::socket s(io);
  boost::system::error_code ec;
  s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return {0, {}};
  asio::write(s, asio::buffer("GET " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" +
                              (bearer.empty() ? std::string() : "Authorization: Bearer " + bearer + "\r\n") + "\r\n"),
              ec);
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  http::read(s, buf, res, ec);
  return {res.result_int(), res.body()};
}

/// walgate's /metrics text (with a bearer token when given; "" when it does not answer).
inline std::string metrics_text(std::uint16_t port, const std::string& bearer = "") {
  return http_get(port, "/metrics", bearer).second;
}

struct scenario {
  std::string prefix, slot, pub;
  std::filesystem::path data_dir;
  std::uint16_t port = free_port();
  walgate_process gw;
  explicit scenario(const std::string& p) : prefix(p), slot(p + "_slot"), pub(p + "_pub") {
    auto& pg = test::cluster();
    // Transactions past 64 kB of decoded changes are streamed to walgate while they run (it asks
    // for streaming) and held in its spill files until their commit: the large ones here are.
    static bool small_work_mem = [&] {
      pg.sql("ALTER SYSTEM SET logical_decoding_work_mem = '64kB'");
      pg.sql("SELECT pg_reload_conf()");
      return true;
    }();
    (void)small_work_mem;
    pg.sql("CREATE TABLE " + p + "_a(id int PRIMARY KEY, v text NOT NULL); CREATE TABLE " + p +
           "_b(id int PRIMARY KEY, v text NOT NULL); CREATE PUBLICATION " + pub + " FOR TABLE " + p + "_a, " + p + "_b");
    std::string t = (std::filesystem::temp_directory_path() / "walgate-fault-XXXXXX").string();
    data_dir = mkdtemp(t.data());
    gw.args = {"--pg", pg.conninfo(), "--slot", slot, "--publication", pub, "--data-dir", data_dir.string(),
               "--listen", "127.0.0.1:" + std::to_string(port), "--status-interval", "500"};
  }
  ~scenario() { std::filesystem::remove_all(data_dir); }
  void start() {
    gw.start();
    REQUIRE_MESSAGE(test::wait_until([&] { return gw.listening.load(); }, std::chrono::seconds(30)), gw.log());
  }
  /// The first start: also until walgate has made its slot (what is written before that is not
  /// in the stream at all, and the model would lack it).
  void start_streaming() {
    start();
    sql_conn q(test::cluster().conninfo());
    REQUIRE_MESSAGE(test::wait_until(
                        [&] {
                          std::vector<std::vector<std::string>> rows;
                          return q.exec("SELECT 1 FROM pg_replication_slots WHERE slot_name = '" + slot + "' AND active",
                                        &rows) &&
                                 !rows.empty();
                        },
                        std::chrono::seconds(30)),
                    gw.log());
  }
  /// Stops the writer, waits until the client's model equals SELECT, and checks everything.
  void verify(writer& w, resuming_client& c) {
    w.finish();
    sql_conn q(test::cluster().conninfo());
    table_model a, b;
    bool equal = replay_equals(c, q, prefix, a, b);
    c.finish();
    MESSAGE("statements " << w.statements.load() << ", large transactions " << w.bigs.load() << ", events received " << c.events
                          << ", connections " << c.connections << ", rows " << a.size() + b.size());
    CHECK_MESSAGE(equal, "the client's replay differs from SELECT; walgate said:\n" << gw.log());
    CHECK(c.duplicates == 0);
    for (const auto& p : c.problems) FAIL_CHECK(p);
    CHECK(c.problems.empty());
    CHECK(c.events > 0);
    CHECK(w.statements > 0);
  }
  /// Transactions the server streamed to this slot's walgate while they ran.
  long long streamed() {
    std::vector<std::vector<std::string>> rows;
    sql_conn q(test::cluster().conninfo());
    REQUIRE(q.exec("SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = '" + slot + "'", &rows));
    return rows.empty() ? 0 : std::stoll(rows[0][0]);
  }
};

inline std::mt19937& rng() {
  static std::mt19937 r(std::random_device{}());
  return r;
}
inline int random_ms(int lo, int hi) { return lo + static_cast<int>(rng()() % static_cast<unsigned>(hi - lo + 1)); }

}  // namespace walgate::test::fault_harness
