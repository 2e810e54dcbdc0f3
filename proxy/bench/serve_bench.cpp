// Serving benchmarks (docs/benchmarks.md), side by side with the reference in one run:
//   drain    the standard workload (../shared/bench) drained, in each of N rounds (env
//            WALGATE_BENCH_DRAINS, default 5) and each from its own identical slot, by
//            pg_recvlogical, by the floor consumer (walgate's replication client dropping every
//            frame: what receiving the stream costs) and by walgate to an NDJSON client: wall
//            time ratio, CPU seconds of each side and of the walsenders, walgate's peak RSS;
//            the medians of the rounds are quoted. Over TCP to 127.0.0.1 (PostgreSQL on
//            another host, as at the edge), or the Unix-domain socket with WALGATE_BENCH_UNIX=1.
//   latency  commit-to-client latency at a steady 2,000 changes/s with 100 WebSocket clients
//   memory   RSS growth per idle WebSocket client, 5,000 of them
// usage: walgate-bench-serve PATH/TO/walgate [SHARED_BENCH_DIR]      (env WALGATE_BENCH_DRAIN_ONLY=1:
//        the drain rounds only)
//        walgate-bench-serve --floor CONNINFO SLOT END_LSN            (the floor consumer)
#include "walgate/protocol/lsn.hpp"
#include "walgate/proxy/local_cluster.hpp"
#include "walgate/proxy/replication_client.hpp"

#include "bench_process.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <libpq-fe.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <signal.h>
#include <sstream>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace walgate;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using walgate::bench::clock_type;
using walgate::bench::cpu_seconds;
using walgate::bench::free_port;
using walgate::bench::rss_kib;

namespace {

pid_t spawn(const std::vector<std::string>& argv, const std::string& out = "/dev/null") {
  std::fflush(stdout);   // or the child prints our buffered output again
  pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::freopen(out.c_str(), "w", stdout);
    (void)f;
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    _exit(127);
  }
  return pid;
}

/// The words of environment variable name (a command prefix such as "strace -f -o FILE"); none
/// when it is unset.
std::vector<std::string> env_words(const char* name) {
  std::vector<std::string> out;
  if (const char* w = std::getenv(name)) {
    std::istringstream words(w);
    for (std::string x; words >> x;) out.push_back(x);
  }
  return out;
}

double cpu_of(const rusage& ru) {
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

std::string sql1(const std::string& conninfo, const std::string& q) {
  PGconn* c = PQconnectdb(conninfo.c_str());
  PGresult* r = PQexec(c, q.c_str());
  std::string v = PQntuples(r) > 0 && !PQgetisnull(r, 0, 0) ? PQgetvalue(r, 0, 0) : "";
  PQclear(r);
  PQfinish(c);
  return v;
}

/// Samples the walsender of a slot until stop; returns its last CPU seconds.
struct walsender_watch {
  std::atomic<bool> stop{false};
  std::atomic<double> cpu{0};
  std::atomic<long> sleeps{0};   // voluntary context switches: waits for the socket, mostly
  std::thread t;
  walsender_watch(std::string conninfo, std::string slot) {
    t = std::thread([this, conninfo, slot] {
      pid_t pid = 0;
      while (!stop) {
        if (!pid) pid = std::atoi(sql1(conninfo, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '" + slot + "'").c_str());
        if (pid) {
          double c = cpu_seconds(pid);
          if (c >= 0) cpu = c;
          long v = rss_kib(pid, "voluntary_ctxt_switches:");
          if (v >= 0) sleeps = v;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(pid ? 20 : 5));
      }
    });
  }
  double finish() {
    stop = true;
    t.join();
    return cpu;
  }
};

bool wait_ready(std::uint16_t port) {
  for (int i = 0; i < 3000; ++i) {
    asio::io_context io;
    tcp::socket s(io);
    boost::system::error_code ec;
    s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
    if (!ec) {
      std::string req = "GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
      asio::write(s, asio::buffer(req), ec);
      char buf[64] = {};
      s.read_some(asio::buffer(buf), ec);
      if (std::string(buf).find(" 200 ") != std::string::npos) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

/// An NDJSON client of walgate on port, reading from the first event until it has counted
/// `changes` event lines (or the connection ends); returns how many it counted.
/// How many times a drain was ended by walgate (a slow client's close: more than --client-lag-mb
/// behind) and went on from its resume_from, as a client does; said with the figures.
std::atomic<long> drain_resumes{0};

long ndjson_drain(std::uint16_t port, long changes) {
  long received = 0;
  std::string from = "0/0:0";
  // A stream walgate ends says why and where to resume in its last line: the drain goes on from
  // there (the end line is not an event), as a client does. Anything else ends the drain.
  for (;;) {
    asio::io_context io;
    tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), port});
    std::string req = "GET /v1/stream?format=native&from=" + from + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
    asio::write(s, asio::buffer(req));
    // One event per line; a blank line is a keep-alive. (Counting a marker such as {"id": would
    // also count rows whose first column is named id.)
    std::vector<char> buf(1 << 20);
    char prev = '\n';
    std::string head;   // the response head, skipped
    std::string last;   // the body's last bytes: the end line, when walgate ends the stream
    bool in_body = false;
    while (received < changes) {
      boost::system::error_code ec;
      std::size_t n = s.read_some(asio::buffer(buf), ec);
      if (ec) break;
      std::size_t i = 0;
      if (!in_body) {
        head.append(buf.data(), n);
        auto end = head.find("\r\n\r\n");
        if (end == std::string::npos) continue;
        in_body = true;
        i = n - (head.size() - end - 4);
      }
      last.append(buf.data() + i, n - i);
      if (last.size() > 4096) last.erase(0, last.size() - 4096);
      // Chunk-size lines end in \r\n, events in \n alone: count a \n after a character other
      // than \n or \r.
      while (i < n) {
        const char* nl = static_cast<const char*>(std::memchr(buf.data() + i, '\n', n - i));
        if (!nl) {
          prev = buf[n - 1];
          break;
        }
        std::size_t at = static_cast<std::size_t>(nl - buf.data());
        char before = at > i ? buf[at - 1] : prev;
        if (before != '\n' && before != '\r') ++received;
        prev = '\n';
        i = at + 1;
      }
    }
    if (received >= changes) return received;
    const auto line = last.rfind("{\"error\":\"slow client");
    const auto key = line == std::string::npos ? line : last.find("\"resume_from\":\"", line);
    if (key == std::string::npos) return received;
    const auto id_at = key + std::string("\"resume_from\":\"").size();
    from = last.substr(id_at, last.find('"', id_at) - id_at);
    --received;   // (the end line)
    ++drain_resumes;
  }
}

/// The floor consumer (walgate-bench-serve --floor CONNINFO SLOT END_LSN): walgate's own
/// replication client draining a slot to END_LSN and dropping every frame. What receiving the
/// stream costs before anything is done with it.
class floor_sink final : public proxy::replication_sink {
 public:
  floor_sink(protocol::lsn end, std::function<void()> done) : end_(end), done_(std::move(done)) {}
  boost::system::error_code on_xlog_data(const protocol::xlog_data& x) override {
    ++frames_;
    char tag = x.data.empty() ? 0 : static_cast<char>(x.data[0]);
    in_txn_ = tag == 'C' ? false : tag == 'B' ? true : in_txn_;
    if (tag == 'C') durable_ = x.wal_start;
    if (tag == 'C' && x.wal_start >= end_) std::_Exit(0);
    // WALGATE_BENCH_FLOOR_NAP_US=N: a consumer that lets the stream pile up, sleeping N µs
    // (outside the event loop: no wake-ups) after each N µs of reading — what coalesced reads
    // would save, and what they cost in wall time.
    if (nap_us_ > 0 && clock_type::now() - last_nap_ > std::chrono::microseconds(nap_us_)) {
      usleep(static_cast<useconds_t>(nap_us_));
      last_nap_ = clock_type::now();
    }
    return {};
  }
  void on_keepalive(const protocol::primary_keepalive& k) override {
    if (!in_txn_ && k.wal_end >= end_ && !finished_) std::_Exit(0);
  }
  protocol::lsn durable_lsn() const override { return durable_; }

 private:
  clock_type::time_point last_nap_{};
  long nap_us_ = std::getenv("WALGATE_BENCH_FLOOR_NAP_US") ? std::atol(std::getenv("WALGATE_BENCH_FLOOR_NAP_US")) : 0;
  protocol::lsn end_, durable_;
  std::function<void()> done_;
  bool in_txn_ = false, finished_ = false;
  std::size_t frames_ = 0;
};

int floor_main(const std::string& conninfo, const std::string& slot, const std::string& end) {
  asio::io_context io;
  proxy::replication_settings s;
  auto parsed = proxy::parse_conninfo(conninfo);
  if (!parsed.params) return 2;
  s.conn = *parsed.params;
  s.slot = slot;
  s.publications = {"bench_pub"};
  s.create_slot = false;
  s.proto_version = 1;
  s.max_attempts = 1;
  if (const char* a = std::getenv("WALGATE_BENCH_FLOOR_ACK_MS")) s.ack_delay = std::chrono::milliseconds(std::atol(a));
  std::unique_ptr<proxy::replication_client> client;
  floor_sink sink(*protocol::lsn::parse(end), [&] { client->stop(); });
  client = std::make_unique<proxy::replication_client>(io.get_executor(), s, sink);
  int rc = 0;
  asio::co_spawn(io, client->run(), [&](std::exception_ptr, proxy::outcome<void> r) {
    if (!r) {
      std::fprintf(stderr, "%s\n", r.error().message.c_str());
      rc = 1;
    }
  });
  io.run();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: walgate-bench-serve PATH/TO/walgate [SHARED_BENCH_DIR]\n");
    return 2;
  }
  if (std::string_view(argv[1]) == "--floor" && argc == 5) return floor_main(argv[2], argv[3], argv[4]);
  std::string walgate = argv[1], bench = argc > 2 ? argv[2] : "../shared/bench";
  std::string self = "/proc/self/exe";
  {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) self.assign(buf, static_cast<std::size_t>(n));
  }
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);

  std::string error;
  proxy::cluster_options o;
  o.name = "walgate-bench";
  // synchronous_commit on, as on most servers: a logical walsender sends a transaction once its
  // WAL is flushed, and with it off that waits for the WAL writer (wal_writer_delay, 200 ms).
  o.extra_conf = {"max_connections = 200", "synchronous_commit = on"};
  auto pg = proxy::local_cluster::start(o, error);
  if (!pg) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  std::string conninfo = pg->conninfo();
  // The drains' connection: TCP to 127.0.0.1 (as to a server on another host), or with
  // WALGATE_BENCH_UNIX=1 the Unix-domain socket.
  std::string stream_conninfo = std::getenv("WALGATE_BENCH_UNIX") ? conninfo : pg->tcp_conninfo("user=postgres dbname=postgres");
  std::string psql_args = "-h " + pg->socket_dir().string() + " -p " + std::to_string(pg->port()) + " -U postgres -d postgres";
  if (std::system(("psql -X -q " + psql_args + " -v ON_ERROR_STOP=1 -f " + bench + "/workload.sql >/dev/null 2>&1").c_str()) != 0)
    return 1;
  pg->sql("CREATE PUBLICATION bench_pub FOR TABLE bench_orders");
  // WALGATE_BENCH_DRAINS=N (default 5) drain rounds, each on its own slots: pg_recvlogical, the
  // floor consumer, then walgate. The figures quoted are the medians of the rounds' ratios.
  int rounds = 5;
  if (const char* n = std::getenv("WALGATE_BENCH_DRAINS")) rounds = std::max(1, std::atoi(n));
  for (int i = 0; i < rounds; ++i)
    for (const char* kind : {"ref", "floor", "gw"})
      pg->sql("SELECT pg_create_logical_replication_slot('bench_" + std::string(kind) + "_" + std::to_string(i) + "', 'pgoutput')");
  if (std::system((bench + "/load.sh " + psql_args).c_str()) != 0) return 1;
  std::string end = *pg->sql("SELECT pg_current_wal_lsn()")[0][0];
  long changes = std::stol(*pg->sql("SELECT 260000")[0][0]);
  std::printf("workload loaded; end LSN %s; %d drain rounds over %s\n", end.c_str(), rounds,
              std::getenv("WALGATE_BENCH_UNIX") ? "the Unix-domain socket" : "TCP to 127.0.0.1");

  std::string bindir = pg->bindir().string();
  std::string data_root = (pg->dir() / "walgate-data").string();
  std::vector<double> wall_ratios, cpu_ratios, floor_ratios;
  pid_t gw = 0;
  std::uint16_t port = 0;
  for (int round = 0; round < rounds; ++round) {
    std::string suffix = "_" + std::to_string(round);
    // Each round drains the three slots one after the other; the order alternates (walgate
    // first in odd rounds) so that the machine's drift in speed does not favour one side.
    bool last = round + 1 == rounds;
    int status = 0;
    double ref_s = 0, ref_cpu = 0, ref_walsender = 0, floor_s = 0, floor_cpu = 0, floor_walsender = 0;
    double gw_s = 0, gw_cpu = 0, gw_walsender = 0, ready_s = 0;
    long ref_waits = 0, gw_waits = 0, gw_hwm = 0, received = 0, gw_resumes = 0;
    auto run_ref = [&]() -> bool {
      // --- the reference ---
      walsender_watch ref_ws(conninfo, "bench_ref" + suffix);
      auto t0 = clock_type::now();
      auto ref_argv = env_words("WALGATE_BENCH_REF_WRAP");   // diagnosis only, as WALGATE_BENCH_WRAP
      for (const auto& a : std::vector<std::string>{bindir + "/pg_recvlogical", "-d", stream_conninfo, "--start", "-S", "bench_ref" + suffix, "-o",
                         "proto_version=1", "-o", "publication_names=bench_pub", "--endpos=" + end, "-F", "0", "-f", "-",
                                                    "--no-loop"})
        ref_argv.push_back(a);
      pid_t ref = spawn(ref_argv);
      rusage ru{};
      wait4(ref, &status, 0, &ru);
      ref_s = std::chrono::duration<double>(clock_type::now() - t0).count();
      ref_cpu = cpu_of(ru);
      ref_walsender = ref_ws.finish();
      ref_waits = ref_ws.sleeps;

      return true;
    };
    auto run_floor = [&]() -> bool {
      // --- the floor: walgate's replication client alone, every frame read and dropped ---
      walsender_watch floor_ws(conninfo, "bench_floor" + suffix);
      auto t0 = clock_type::now();
      auto fl_argv = env_words("WALGATE_BENCH_FLOOR_WRAP");   // diagnosis only, as WALGATE_BENCH_WRAP
      for (const auto& a : {self, std::string("--floor"), stream_conninfo, "bench_floor" + suffix, end}) fl_argv.push_back(a);
      pid_t fl = spawn(fl_argv);
      rusage ru{};
      wait4(fl, &status, 0, &ru);
      floor_s = std::chrono::duration<double>(clock_type::now() - t0).count();
      floor_cpu = cpu_of(ru);
      floor_walsender = floor_ws.finish();
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "the floor consumer failed\n");
        return false;
      }

      return true;
    };
    auto run_gw = [&]() -> bool {
      // --- walgate to an NDJSON client ---
      std::string data = data_root + suffix;
      port = free_port();
      walsender_watch gw_ws(conninfo, "bench_gw" + suffix);
      auto t0 = clock_type::now();
      // WALGATE_BENCH_WRAP="strace -f -tt -o FILE": run walgate under a tracer (diagnosis only: the
      // CPU figures are then the tracer's).
      auto gw_argv = env_words("WALGATE_BENCH_WRAP");
      for (const auto& a : std::vector<std::string>{walgate, "--pg", stream_conninfo, "--slot", "bench_gw" + suffix, "--publication",
                                                    "bench_pub", "--data-dir", data, "--listen", "127.0.0.1:" + std::to_string(port)})
        gw_argv.push_back(a);
      gw = spawn(gw_argv);
      if (!wait_ready(port)) {
        std::fprintf(stderr, "walgate did not become ready\n");
        kill(gw, SIGKILL);
        return false;
      }
      ready_s = std::chrono::duration<double>(clock_type::now() - t0).count();
      // WALGATE_BENCH_PERF=FILE: record a CPU profile of walgate during the last round's drain.
      // WALGATE_BENCH_ATTACH="COMMAND ARGS": run COMMAND ARGS PID of walgate during it
      // (e.g. "strace -c -f -o /tmp/drain.strace -p").
      pid_t perf = 0;
      if (const char* f = std::getenv("WALGATE_BENCH_PERF"); f && last)
        perf = spawn({"perf", "record", "-F", "4000", "-o", f, "-p", std::to_string(gw)});
      else if (auto argv_attach = env_words("WALGATE_BENCH_ATTACH"); !argv_attach.empty() && last) {
        argv_attach.push_back(std::to_string(gw));
        perf = spawn(argv_attach);
      }
      const long resumes_before = drain_resumes;
      received = ndjson_drain(port, changes);
      gw_resumes = drain_resumes - resumes_before;
      gw_s = std::chrono::duration<double>(clock_type::now() - t0).count();
      gw_cpu = cpu_seconds(gw);
      gw_hwm = rss_kib(gw, "VmHWM:");
      gw_walsender = gw_ws.finish();
      gw_waits = gw_ws.sleeps;
      if (perf) {
        kill(perf, SIGINT);
        waitpid(perf, &status, 0);
      }
      if (received != changes) {
        std::fprintf(stderr, "the NDJSON client received %ld of %ld changes\n", received, changes);
        kill(gw, SIGKILL);   // (no walgate left behind, reconnecting to a server that is gone)
        waitpid(gw, &status, 0);
        return false;
      }
      if (!last) {   // the last round's walgate serves the phases below
        kill(gw, SIGTERM);
        waitpid(gw, &status, 0);
      }
      return true;
    };
    bool ok = round % 2 == 0 ? run_ref() && run_floor() && run_gw() : run_gw() && run_ref() && run_floor();
    if (!ok) return 1;
    std::printf("\nround %d (%s first): drain of %ld changes\n", round + 1, round % 2 == 0 ? "pg_recvlogical" : "walgate", received);
    std::printf("  pg_recvlogical   %6.2f s wall, %5.2f CPU s; walsender %5.2f CPU s, %ld waits\n", ref_s, ref_cpu, ref_walsender, ref_waits);
    std::printf("  floor consumer   %6.2f s wall, %5.2f CPU s; walsender %5.2f CPU s (%.0f%%)\n", floor_s, floor_cpu,
                floor_walsender, 100.0 * floor_cpu / std::max(floor_walsender, 0.001));
    std::printf("  walgate (NDJSON) %6.2f s wall, %5.2f CPU s; walsender %5.2f CPU s, %ld waits; peak RSS %ld MiB%s\n", gw_s,
                gw_cpu, gw_walsender, gw_waits, gw_hwm / 1024,
                gw_resumes ? ("; the client was " + std::to_string(gw_resumes) +
                              " times more than --client-lag-mb behind and resumed from its resume_from").c_str()
                           : "");
    std::printf("  (walgate was streaming and serving %.2f s after it was started)\n", ready_s);
    std::printf("  ratio walgate/reference wall %.2f; walgate CPU / its walsender CPU %.0f%%\n", gw_s / ref_s,
                100.0 * gw_cpu / std::max(gw_walsender, 0.001));
    wall_ratios.push_back(gw_s / ref_s);
    cpu_ratios.push_back(gw_cpu / std::max(gw_walsender, 0.001));
    floor_ratios.push_back(floor_cpu / std::max(floor_walsender, 0.001));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::printf("\ndrain, median of %d rounds: wall walgate/pg_recvlogical %.2f (range %.2f-%.2f); CPU walgate/walsender %.0f%% "
              "(range %.0f-%.0f%%); floor consumer CPU/walsender %.0f%%\n",
              rounds, median(wall_ratios), *std::min_element(wall_ratios.begin(), wall_ratios.end()),
              *std::max_element(wall_ratios.begin(), wall_ratios.end()), 100 * median(cpu_ratios),
              100 * *std::min_element(cpu_ratios.begin(), cpu_ratios.end()),
              100 * *std::max_element(cpu_ratios.begin(), cpu_ratios.end()), 100 * median(floor_ratios));
  if (std::getenv("WALGATE_BENCH_DRAIN_ONLY")) {
    kill(gw, SIGTERM);
    waitpid(gw, nullptr, 0);
    return 0;
  }

  // --- latency: 100 WebSocket clients, 2,000 changes/s for 15 s ---
  // The clients are lean on purpose — they share the machine with walgate and PostgreSQL: a
  // hand-made upgrade, then raw reads parsed as unmasked server frames, and a commit time parsed
  // once per transaction, so what is measured is the gateway, not the readers.
  auto latency_phase = [&](int readers_n) -> int {
    asio::io_context io;
    struct ws_client {
      explicit ws_client(asio::io_context& io) : s(io) {}
      tcp::socket s;
      std::vector<char> buf = std::vector<char>(1 << 16);
      std::string carry;
      std::string last_ts;
      std::chrono::system_clock::time_point last_commit;
      std::pair<std::uint64_t, std::uint64_t> last_id{0, 0};   // (commit LSN, index)
      long messages = 0, out_of_order = 0;
    };
    std::vector<std::unique_ptr<ws_client>> clients;
    // Samples by window: before the catch-up readers start (the whole phase without them), and
    // while they read.
    std::vector<double> latencies_ms, during_ms;
    latencies_ms.reserve(4'000'000);
    std::atomic<bool> measuring{false};
    std::atomic<int> window{0};   // 0: before, 1: catch-up readers reading, 2: after them
    for (int i = 0; i < 100; ++i) {
      auto cl = std::make_unique<ws_client>(io);
      cl->s.connect({asio::ip::make_address("127.0.0.1"), port});
      cl->s.set_option(tcp::no_delay(true));
      std::string req = "GET /v1/ws?format=native HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                        "Sec-WebSocket-Version: 13\r\n\r\n";
      asio::write(cl->s, asio::buffer(req));
      while (cl->carry.find("\r\n\r\n") == std::string::npos) {
        std::size_t n = cl->s.read_some(asio::buffer(cl->buf));
        cl->carry.append(cl->buf.data(), n);
      }
      if (cl->carry.rfind("HTTP/1.1 101", 0) != 0) {
        std::fprintf(stderr, "WebSocket upgrade refused: %s\n", cl->carry.substr(0, cl->carry.find('\r')).c_str());
        return 1;
      }
      cl->carry.erase(0, cl->carry.find("\r\n\r\n") + 4);
      clients.push_back(std::move(cl));
    }
    const std::string marker = "\"commit_time\":\"";
    // One text frame's payload: its latency, from the commit time in it to now.
    auto on_message = [&](ws_client& cl, std::string_view msg, std::chrono::system_clock::time_point now) {
      // Every id must be past the one before: nothing delivered twice or out of order.
      ++cl.messages;
      if (std::getenv("WALGATE_BENCH_DEBUG") && &cl == clients[0].get() && (cl.messages < 3 || cl.messages % 20000 == 0))
        std::printf("client 0 message %ld: %.*s\n", cl.messages, static_cast<int>(std::min<std::size_t>(msg.size(), 400)), msg.data());
      if (msg.rfind("{\"id\":\"", 0) == 0) {
        std::string_view id = msg.substr(7, msg.find('"', 7) - 7);
        auto slash = id.find('/'), colon = id.find(':');
        if (slash != std::string_view::npos && colon != std::string_view::npos) {
          auto num = [](std::string_view t, int base) {
            std::uint64_t v = 0;
            std::from_chars(t.data(), t.data() + t.size(), v, base);
            return v;
          };
          std::pair<std::uint64_t, std::uint64_t> v{(num(id.substr(0, slash), 16) << 32) | num(id.substr(slash + 1, colon - slash - 1), 16),
                                                    num(id.substr(colon + 1), 10)};
          if (!(cl.last_id < v)) ++cl.out_of_order;
          cl.last_id = v;
        }
      }
      auto p = msg.find(marker);
      if (p == std::string_view::npos || !measuring || msg.size() < p + marker.size() + 26) return;
      std::string_view ts = msg.substr(p + marker.size(), 26);
      if (ts != cl.last_ts) {
        cl.last_ts = std::string(ts);
        std::tm tm{};
        strptime(cl.last_ts.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
        double frac = std::stod(cl.last_ts.substr(19, 7));
        cl.last_commit = std::chrono::system_clock::from_time_t(timegm(&tm)) +
                         std::chrono::microseconds(static_cast<long>(frac * 1e6));
      }
      const double ms = std::chrono::duration<double, std::milli>(now - cl.last_commit).count();
      if (window == 0) latencies_ms.push_back(ms);
      else if (window == 1) during_ms.push_back(ms);
    };
    std::function<void(ws_client&)> read_more = [&](ws_client& cl) {
      cl.s.async_read_some(asio::buffer(cl.buf), [&](boost::system::error_code ec, std::size_t n) {
        if (ec) return;
        auto now = std::chrono::system_clock::now();
        cl.carry.append(cl.buf.data(), n);
        std::size_t pos = 0;
        while (cl.carry.size() - pos >= 2) {
          auto b0 = static_cast<unsigned char>(cl.carry[pos]), b1 = static_cast<unsigned char>(cl.carry[pos + 1]);
          std::size_t len = b1 & 0x7f, head = 2;
          if (len == 126) {
            if (cl.carry.size() - pos < 4) break;
            len = (static_cast<unsigned char>(cl.carry[pos + 2]) << 8) | static_cast<unsigned char>(cl.carry[pos + 3]);
            head = 4;
          } else if (len == 127) {
            if (cl.carry.size() - pos < 10) break;
            len = 0;
            for (int k = 0; k < 8; ++k) len = (len << 8) | static_cast<unsigned char>(cl.carry[pos + 2 + static_cast<std::size_t>(k)]);
            head = 10;
          }
          if (cl.carry.size() - pos < head + len) break;
          if ((b0 & 0x0f) == 1) on_message(cl, std::string_view(cl.carry).substr(pos + head, len), now);
          pos += head + len;
        }
        cl.carry.erase(0, pos);
        read_more(cl);
      });
    };
    for (auto& cl : clients) read_more(*cl);
    std::thread reader([&] { io.run(); });
    // WALGATE_BENCH_PERF_LATENCY=FILE: a CPU profile of walgate during this phase.
    pid_t perf_lat = 0;
    if (const char* f = std::getenv("WALGATE_BENCH_PERF_LATENCY"))
      perf_lat = spawn({"perf", "record", "-F", "1000", "-g", "-o", f, "-p", std::to_string(gw)});
    double lat_cpu0 = cpu_seconds(gw), self_cpu0 = cpu_seconds(getpid());
    const auto phase_t0 = clock_type::now();
    walsender_watch lat_ws(conninfo, "bench_gw_" + std::to_string(rounds - 1));
    int transactions = 0;
    // With catch-up readers: 8 s of load alone, then readers_n NDJSON clients that each read the
    // log from 0/0:0 (its first `changes` events, from disk past the memory tail) while the load
    // goes on, until the last of them is done (at most 120 s).
    std::vector<std::thread> readers;
    std::vector<double> reader_s(static_cast<std::size_t>(readers_n), 0);
    std::vector<long> reader_events(static_cast<std::size_t>(readers_n), 0);
    std::atomic<int> readers_left{readers_n};
    double catchup_s = 0, catchup_cpu = 0;
    std::thread load([&] {
      PGconn* c = PQconnectdb(conninfo.c_str());
      auto start = clock_type::now();
      int n = 0;
      clock_type::time_point catchup_start{};
      double cpu_at_start = 0;
      // 200 transactions of 10 rows per second = 2,000 changes/s, paced.
      while (readers_n ? (readers.empty() || readers_left > 0) && clock_type::now() - start < std::chrono::seconds(130)
                       : clock_type::now() - start < std::chrono::seconds(16)) {
        if (clock_type::now() - start > std::chrono::seconds(1)) measuring = true;
        if (readers_n && readers.empty() && clock_type::now() - start > std::chrono::seconds(8)) {
          catchup_start = clock_type::now();
          cpu_at_start = cpu_seconds(gw);
          window = 1;
          for (int r = 0; r < readers_n; ++r)
            readers.emplace_back([&, r, catchup_start] {
              reader_events[static_cast<std::size_t>(r)] = ndjson_drain(port, changes);
              reader_s[static_cast<std::size_t>(r)] = std::chrono::duration<double>(clock_type::now() - catchup_start).count();
              if (--readers_left == 0) window = 2;
            });
        }
        if (readers_n && !readers.empty() && readers_left == 0 && catchup_s == 0) {
          catchup_s = std::chrono::duration<double>(clock_type::now() - catchup_start).count();
          catchup_cpu = cpu_seconds(gw) - cpu_at_start;
        }
        PQclear(PQexec(c, "INSERT INTO bench_orders(customer_id,status,amount,paid) SELECT g, 'paid', 1.5, true "
                          "FROM generate_series(1,10) g"));
        ++n;
        std::this_thread::sleep_until(start + std::chrono::microseconds(5000L * n));
      }
      transactions = n;
      PQfinish(c);
      for (auto& t : readers) t.join();
      if (readers_n && catchup_s == 0) {
        catchup_s = std::chrono::duration<double>(clock_type::now() - catchup_start).count();
        catchup_cpu = cpu_seconds(gw) - cpu_at_start;
      }
    });
    load.join();
    const double phase_s = std::chrono::duration<double>(clock_type::now() - phase_t0).count();
    double lat_cpu = cpu_seconds(gw) - lat_cpu0, self_cpu = cpu_seconds(getpid()) - self_cpu0;
    double lat_walsender = lat_ws.finish();
    if (perf_lat) {
      kill(perf_lat, SIGINT);
      waitpid(perf_lat, nullptr, 0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    io.stop();
    reader.join();
    std::sort(latencies_ms.begin(), latencies_ms.end());
    std::sort(during_ms.begin(), during_ms.end());
    auto pct_of = [](const std::vector<double>& v, double q) { return v.empty() ? -1.0 : v[static_cast<std::size_t>(q * (v.size() - 1))]; };
    auto pct = [&](double q) { return pct_of(latencies_ms, q); };
    long messages = 0, out_of_order = 0;
    for (const auto& cl : clients) {
      messages += cl->messages;
      out_of_order += cl->out_of_order;
    }
    std::printf("\nlatency, commit to WebSocket client, 100 clients, 2,000 changes/s: %zu samples; %ld messages, "
                "%ld not after the one before\n",
                latencies_ms.size(), messages, out_of_order);
    std::printf("  load: %d transactions of 10 rows in %.0f s; CPU of one core: walgate %.0f%%, the benchmark's "
                "readers and load %.0f%%, walsender %.0f s in all\n",
                transactions, phase_s, 100.0 * lat_cpu / phase_s, 100.0 * self_cpu / phase_s, lat_walsender);
    std::printf("  %sp50 %.2f ms, p99 %.2f ms, max %.2f ms; walgate CPU %.0f%% of one core\n", readers_n ? "before the catch-up readers: " : "",
                pct(0.5), pct(0.99), pct(1.0), 100.0 * lat_cpu / phase_s);
    if (readers_n) {
      long events = 0;
      for (auto e : reader_events) events += e;
      std::printf("  during the catch-up (%zu samples): p50 %.2f ms, p99 %.2f ms, max %.2f ms; p99 during / before %.2f\n",
                  during_ms.size(), pct_of(during_ms, 0.5), pct_of(during_ms, 0.99), pct_of(during_ms, 1.0),
                  pct_of(during_ms, 0.99) / std::max(pct(0.99), 0.001));
      std::printf("  %d catch-up readers from 0/0:0 (NDJSON, native): %ld events in %.2f s = %.0f events/s in all; "
                  "walgate %.2f CPU s meanwhile; each reader done after",
                  readers_n, events, catchup_s, static_cast<double>(events) / std::max(catchup_s, 0.001), catchup_cpu);
      for (auto t : reader_s) std::printf(" %.1f", t);
      std::printf(" s\n");
      // (A reader stops once it has counted `changes` events: it may count a few more, from its last read.)
      for (auto e : reader_events)
        if (e < changes) {
          std::fprintf(stderr, "a catch-up reader received %ld of %ld changes\n", e, changes);
          return 1;
        }
    }
    return 0;
  };
  if (latency_phase(0) != 0) {
    kill(gw, SIGKILL);
    return 1;
  }

  // --- catch-up: the same live load and clients, and 10 readers from 0/0:0 meanwhile ---
  // walgate is started again on the same slot and data directory with a 1 MiB memory tail, so
  // that the readers read the log from disk (WALGATE_BENCH_CATCHUP_READERS=N, 0: skipped).
  if (int readers_n = std::getenv("WALGATE_BENCH_CATCHUP_READERS") ? std::atoi(std::getenv("WALGATE_BENCH_CATCHUP_READERS")) : 10;
      readers_n > 0) {
    kill(gw, SIGTERM);
    waitpid(gw, nullptr, 0);
    auto gw_argv = env_words("WALGATE_BENCH_WRAP");
    for (const auto& a : std::vector<std::string>{walgate, "--pg", stream_conninfo, "--slot", "bench_gw_" + std::to_string(rounds - 1),
                                                  "--publication", "bench_pub", "--data-dir", data_root + "_" + std::to_string(rounds - 1),
                                                  "--listen", "127.0.0.1:" + std::to_string(port), "--tail-mb", "1"})
      gw_argv.push_back(a);
    gw = spawn(gw_argv);
    if (!wait_ready(port)) {
      std::fprintf(stderr, "walgate did not become ready again\n");
      kill(gw, SIGKILL);
      return 1;
    }
    // First alone (nothing else running): what reading the log costs; then beside the live load.
    {
      std::vector<std::thread> alone;
      std::vector<long> got(static_cast<std::size_t>(readers_n), 0);
      const double cpu0 = cpu_seconds(gw);
      const auto t0 = clock_type::now();
      for (int r = 0; r < readers_n; ++r) alone.emplace_back([&, r] { got[static_cast<std::size_t>(r)] = ndjson_drain(port, changes); });
      for (auto& t : alone) t.join();
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      long events = 0;
      for (auto e : got) events += e;
      std::printf("\ncatch-up alone: walgate started again with --tail-mb 1; %d NDJSON readers from 0/0:0: %ld events in %.2f s = "
                  "%.0f events/s in all; walgate %.2f CPU s (%.2f us per event delivered)\n",
                  readers_n, events, s, static_cast<double>(events) / s, cpu_seconds(gw) - cpu0,
                  1e6 * (cpu_seconds(gw) - cpu0) / static_cast<double>(std::max(events, 1L)));
      std::this_thread::sleep_for(std::chrono::seconds(3));   // (its blocks of the log dropped)
    }
    std::printf("\ncatch-up beside the live load: %d readers from 0/0:0 after 8 s of load\n", readers_n);
    if (latency_phase(readers_n) != 0) {
      kill(gw, SIGKILL);
      return 1;
    }
  }

  // --- memory: 5,000 idle WebSocket clients ---
  {
    long before = rss_kib(gw);
    asio::io_context io;
    std::vector<std::unique_ptr<websocket::stream<tcp::socket>>> idle;
    for (int i = 0; i < 5000; ++i) {
      auto ws = std::make_unique<websocket::stream<tcp::socket>>(io);
      boost::system::error_code ec;
      ws->next_layer().connect({asio::ip::make_address("127.0.0.1"), port}, ec);
      if (!ec) ws->handshake("localhost", "/v1/ws?format=native", ec);
      if (ec) {
        std::printf("client %d: %s\n", i, ec.message().c_str());
        break;
      }
      idle.push_back(std::move(ws));
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
    long after = rss_kib(gw);
    std::printf("\nmemory: %zu idle WebSocket clients: RSS %ld -> %ld KiB, %.1f KiB per client\n", idle.size(), before,
                after, idle.empty() ? 0.0 : static_cast<double>(after - before) / static_cast<double>(idle.size()));
  }
  int status = 0;
  kill(gw, SIGTERM);
  waitpid(gw, &status, 0);
  std::printf("\nwalgate exited with %d on SIGTERM\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}
