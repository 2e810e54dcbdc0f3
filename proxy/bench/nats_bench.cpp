// walgate-bench-nats WALGATE_BINARY SHARED_BENCH_DIR: the JetStream origin's publish rate
// (docs/benchmarks.md, *Scale-out*). A throwaway PostgreSQL 15 loaded with the standard
// workload (../shared/bench), three slots per round; each round drains one with pg_recvlogical
// (the reference), then runs the walgate binary with --nats on each of the others — to one
// nats-server (a stream of 1 replica) and to a 3-node cluster on loopback ports (3 replicas) —
// and times it from its start until the stream's last sequence is the workload's last change
// (every event published and confirmed by its PubAck). WALGATE_BENCH_ROUNDS=N (3).
// Then the edges: an origin publishing to the 3-node cluster and two `walgate edge`s; commit ->
// client latency at 2,000 changes/s, 50 WebSocket clients on the origin and 50 on an edge in the
// same run; then the deliveries/s of 100 clients reading the log from its start, on the origin
// alone, on one edge alone and spread over two edges. WALGATE_BENCH_EDGE_ONLY=1: only these.
#include "walgate/proxy/local_cluster.hpp"

#include "bench_process.hpp"
#include "ws_clients.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <libpq-fe.h>

using namespace walgate;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using walgate::bench::clock_type;
using walgate::bench::cpu_seconds;
using walgate::bench::free_port;
using walgate::bench::median;
using walgate::bench::since;
using walgate::bench::client;
using walgate::bench::connect_ws;
using walgate::bench::pump;

namespace {

pid_t spawn(const std::vector<std::string>& argv, const std::string& err = "/dev/null") {
  return walgate::bench::spawn_logged(argv, err);
}

/// A metric of walgate's /metrics; -1 when it does not answer or has no such line.
long long metric(std::uint16_t port, const std::string& name) {
  asio::io_context io;
  tcp::socket s(io);
  boost::system::error_code ec;
  s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return -1;
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  asio::write(s, asio::buffer(req), ec);
  std::string body;
  char buf[8192];
  for (;;) {
    auto n = s.read_some(asio::buffer(buf), ec);
    body.append(buf, n);
    if (ec) break;
  }
  auto at = body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::atoll(body.c_str() + at + name.size() + 2);
}

bool port_open(std::uint16_t port) {
  asio::io_context io;
  tcp::socket s(io);
  boost::system::error_code ec;
  s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
  return !ec;
}

struct nats_nodes {
  std::vector<pid_t> pids;
  std::vector<std::uint16_t> ports;
  std::string urls;
  nats_nodes(std::size_t n, const std::filesystem::path& root) {
    std::vector<std::uint16_t> cports;
    for (std::size_t i = 0; i < n; ++i) {
      ports.push_back(free_port());
      cports.push_back(free_port());
    }
    for (std::size_t i = 0; i < n; ++i) {
      const auto dir = root / ("n" + std::to_string(i));
      std::filesystem::create_directories(dir);
      std::vector<std::string> a = {"/usr/sbin/nats-server", "-js", "-a", "127.0.0.1", "-p", std::to_string(ports[i]), "-sd",
                                    dir.string(), "--server_name", "b" + std::to_string(i)};
      if (n > 1) {
        std::string routes;
        for (std::size_t j = 0; j < n; ++j)
          if (j != i) routes += (routes.empty() ? "" : ",") + std::string("nats://127.0.0.1:") + std::to_string(cports[j]);
        a.insert(a.end(), {"--cluster_name", "bench", "--cluster", "nats://127.0.0.1:" + std::to_string(cports[i]), "--routes", routes});
      }
      pids.push_back(spawn(a, (dir / "server.log").string()));
      urls += (i ? "," : "") + std::string("nats://127.0.0.1:") + std::to_string(ports[i]);
    }
    for (auto p : ports)
      for (int i = 0; i < 400 && !port_open(p); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  double cpu() const {
    double c = 0;
    for (auto p : pids) c += std::max(0.0, cpu_seconds(p));
    return c;
  }
  ~nats_nodes() {
    for (auto p : pids) {
      kill(p, SIGTERM);
      int st;
      waitpid(p, &st, 0);
    }
  }
};


/// The percentile q of sorted v (-1: empty).
double pct(const std::vector<double>& v, double q) { return v.empty() ? -1.0 : v[static_cast<std::size_t>(q * (v.size() - 1))]; }

/// Waits until f() (at most `s` seconds); whether it came true.
template <class F>
bool wait_for(F f, double s) {
  const auto t0 = clock_type::now();
  while (!f()) {
    if (since(t0) > s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

/// The edges: an origin publishing to the cluster, two edges mirroring it.
int edges(proxy::local_cluster& pg, const std::string& conninfo, const std::string& walgate, nats_nodes& cluster, int replicas,
          int rounds) {
  const std::string r = "r" + std::to_string(replicas);
  pg.sql("SELECT pg_create_logical_replication_slot('bench_edge_" + r + "', 'pgoutput')");
  const auto dir = std::getenv("WALGATE_BENCH_KEEP") ? std::filesystem::path(std::getenv("WALGATE_BENCH_KEEP")) / ("edges_" + r) : pg.dir() / ("edges_" + r);
  std::filesystem::create_directories(dir);
  const std::string stream = "BENCH_EDGE_" + r, prefix = "bench.edge." + r;
  const std::uint16_t origin_port = free_port();
  pid_t origin = spawn({walgate, "--pg", conninfo, "--slot", "bench_edge_" + r, "--publication", "bench_pub", "--data-dir",
                        (dir / "origin").string(), "--listen", "127.0.0.1:" + std::to_string(origin_port), "--nats", cluster.urls,
                        "--nats-stream", stream, "--nats-subject-prefix", prefix, "--nats-replicas", std::to_string(replicas)},
                       (dir / "origin.log").string());
  std::vector<std::uint16_t> edge_ports;
  std::vector<pid_t> edge_pids;
  auto stop_all = [&] {
    for (pid_t p : edge_pids) kill(p, SIGTERM);
    kill(origin, SIGTERM);
    for (pid_t p : edge_pids) waitpid(p, nullptr, 0);
    waitpid(origin, nullptr, 0);
  };
  if (!wait_for([&] { return metric(origin_port, "walgate_nats_connected") == 1; }, 60)) {
    std::fprintf(stderr, "the origin did not connect to NATS (see %s)\n", (dir / "origin.log").c_str());
    stop_all();
    return 1;
  }
  for (int i = 1; i <= 2; ++i) {
    const std::string name = "edge" + std::to_string(i);
    edge_ports.push_back(free_port());
    edge_pids.push_back(spawn({walgate, "edge", "--nats", cluster.urls, "--nats-stream", stream, "--nats-subject-prefix", prefix,
                               "--data-dir", (dir / name).string(), "--listen", "127.0.0.1:" + std::to_string(edge_ports.back())},
                              (dir / (name + ".log")).string()));
    if (!wait_for([&] { return metric(edge_ports.back(), "walgate_edge_consuming") == 1; }, 60)) {
      std::fprintf(stderr, "edge %d does not consume the stream (see %s)\n", i, (dir / (name + ".log")).c_str());
      stop_all();
      return 1;
    }
  }

  // An edge serves once it holds an event: one transaction first.
  pg.sql("INSERT INTO bench_orders(customer_id,status,amount,paid) VALUES (1, 'paid', 1.5, true)");
  for (std::size_t i = 0; i < edge_ports.size(); ++i)
    if (!wait_for([&] { return metric(edge_ports[i], "walgate_edge_ready") == 1; }, 60)) {
      std::fprintf(stderr, "edge %zu is not ready\n", i + 1);
      stop_all();
      return 1;
    }

  // --- commit -> client latency, 2,000 changes/s for 16 s: 50 clients on the origin, 50 on edge 1 ---
  std::vector<double> at_origin, at_edge;
  at_origin.reserve(2'000'000);
  at_edge.reserve(2'000'000);
  std::vector<std::unique_ptr<client>> cs;
  for (int i = 0; i < 100; ++i) {
    auto c = connect_ws(i < 50 ? origin_port : edge_ports[0], false, i);
    if (!c) {
      std::fprintf(stderr, "a WebSocket client was refused\n");
      stop_all();
      return 1;
    }
    c->samples = i < 50 ? &at_origin : &at_edge;
    cs.push_back(std::move(c));
  }
  std::atomic<int> transactions{0};
  std::thread load([&] {
    PGconn* c = PQconnectdb(conninfo.c_str());
    const auto start = clock_type::now();
    int n = 0;
    while (clock_type::now() - start < std::chrono::seconds(16)) {   // 200 transactions of 10 rows a second
      PQclear(PQexec(c, "INSERT INTO bench_orders(customer_id,status,amount,paid) SELECT g, 'paid', 1.5, true "
                        "FROM generate_series(1,10) g"));
      ++n;
      std::this_thread::sleep_until(start + std::chrono::microseconds(5000L * n));
    }
    transactions = n;
    PQfinish(c);
  });
  const double origin_cpu0 = cpu_seconds(origin), edge_cpu0 = cpu_seconds(edge_pids[0]), nats_cpu0 = cluster.cpu();
  pump(cs, SIZE_MAX, 1.0);   // (the first second not timed)
  for (auto& c : cs) c->timed = true;
  const auto timed_t0 = clock_type::now();
  pump(cs, SIZE_MAX, 15.0);
  load.join();
  const double timed_s = since(timed_t0);
  for (auto& c : cs) c->timed = false;
  pump(cs, std::size_t(10) * static_cast<std::size_t>(transactions.load()), 10.0);
  const double origin_cpu = cpu_seconds(origin) - origin_cpu0, edge_cpu = cpu_seconds(edge_pids[0]) - edge_cpu0,
               nats_cpu = cluster.cpu() - nats_cpu0;
  std::size_t short_clients = 0, closed = 0;
  for (auto& c : cs) {
    short_clients += c->frames < std::size_t(10) * static_cast<std::size_t>(transactions.load());
    closed += c->closed;
  }
  cs.clear();
  std::sort(at_origin.begin(), at_origin.end());
  std::sort(at_edge.begin(), at_edge.end());
  std::printf("\nedges, JetStream R%d: commit -> WebSocket client at 2,000 changes/s (%d transactions of 10 rows), "
              "origin -> JetStream -> edge, one run:\n", replicas, transactions.load());
  std::printf("  50 clients on the origin:  p50 %6.2f ms, p99 %6.2f ms, max %7.2f ms (%zu samples); origin %.0f%% of a core\n",
              pct(at_origin, 0.5), pct(at_origin, 0.99), pct(at_origin, 1.0), at_origin.size(), 100 * origin_cpu / timed_s);
  std::printf("  50 clients on edge 1:      p50 %6.2f ms, p99 %6.2f ms, max %7.2f ms (%zu samples); edge %.0f%% of a core, "
              "nats-servers %.0f%%\n",
              pct(at_edge, 0.5), pct(at_edge, 0.99), pct(at_edge, 1.0), at_edge.size(), 100 * edge_cpu / timed_s,
              100 * nats_cpu / timed_s);
  std::printf("  edge / origin: p50 %.2f, p99 %.2f; clients short of every change: %zu; closed: %zu\n",
              pct(at_edge, 0.5) / pct(at_origin, 0.5), pct(at_edge, 0.99) / pct(at_origin, 0.99), short_clients, closed);
  if (short_clients || closed) {
    stop_all();
    return 1;
  }

  // --- deliveries: 100 clients each reading the whole log from 0/0:0 ---
  const long long events = metric(origin_port, "walgate_log_next_seq");
  const long long published = metric(origin_port, "walgate_nats_stream_last_seq");
  for (auto p : edge_ports)
    if (!wait_for([&] { return metric(p, "walgate_edge_stream_seq") >= published; }, 60)) {
      std::fprintf(stderr, "an edge did not mirror the stream's %lld messages\n", published);
      stop_all();
      return 1;
    }
  struct setup {
    const char* name;
    std::vector<std::uint16_t> ports;
    std::vector<pid_t> pids;
    std::vector<double> rate;
  };
  std::vector<setup> setups = {{"one walgate (the origin) alone", {origin_port}, {origin}, {}},
                               {"one edge alone", {edge_ports[0]}, {edge_pids[0]}, {}},
                               {"two edges together", {edge_ports[0], edge_ports[1]}, {edge_pids[0], edge_pids[1]}, {}}};
  std::printf("\nedges, JetStream R%d: deliveries of 100 WebSocket clients reading the log from 0/0:0 (%lld events each):\n", replicas, events);
  for (int round = 0; round < rounds; ++round)
    for (auto& st : setups) {
      double cpu0 = 0;
      for (pid_t p : st.pids) cpu0 += cpu_seconds(p);
      const auto t0 = clock_type::now();
      std::vector<std::unique_ptr<client>> readers;
      for (int i = 0; i < 100; ++i) {
        auto c = connect_ws(st.ports[static_cast<std::size_t>(i) % st.ports.size()], false, i, false, "", "format=native&from=0/0:0");
        if (c) readers.push_back(std::move(c));
      }
      pump(readers, static_cast<std::size_t>(events));
      const double s = since(t0);
      double cpu = -cpu0;
      for (pid_t p : st.pids) cpu += cpu_seconds(p);
      std::size_t frames = 0, done = 0;
      for (auto& c : readers) {
        frames += c->frames;
        done += c->frames >= static_cast<std::size_t>(events);
      }
      st.rate.push_back(static_cast<double>(frames) / s);
      std::printf("  round %d, %-32s %6.2f s, %9.0f deliveries/s, %zu of %zu clients got every event; serving CPU %.2f s\n",
                  round + 1, st.name, s, static_cast<double>(frames) / s, done, readers.size(), cpu);
      if (done != 100) {
        stop_all();
        return 1;
      }
    }
  std::printf("  median deliveries/s: origin alone %.0f, one edge %.0f, two edges %.0f; two edges / one walgate %.2f\n",
              median(setups[0].rate), median(setups[1].rate), median(setups[2].rate), median(setups[2].rate) / median(setups[0].rate));
  stop_all();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: walgate-bench-nats WALGATE_BINARY SHARED_BENCH_DIR\n");
    return 2;
  }
  const std::string walgate = argv[1], bench = argv[2];
  if (!std::filesystem::exists("/usr/sbin/nats-server")) {
    std::fprintf(stderr, "nats-server is not installed (.ci/install-deps.sh installs it)\n");
    return 1;
  }
  proxy::cluster_options o;
  o.name = "walgate-bench-nats";
  o.extra_conf = {"max_connections = 100", "synchronous_commit = on"};
  std::string error;
  auto pg = proxy::local_cluster::start(o, error);
  if (!pg) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  const std::string conninfo = pg->tcp_conninfo("user=postgres dbname=postgres");
  const std::string psql_args = "-h " + pg->socket_dir().string() + " -p " + std::to_string(pg->port()) + " -U postgres -d postgres";
  if (std::system(("psql -X -q " + psql_args + " -v ON_ERROR_STOP=1 -f " + bench + "/workload.sql >/dev/null 2>&1").c_str()) != 0)
    return 1;
  pg->sql("CREATE PUBLICATION bench_pub FOR TABLE bench_orders");
  int rounds = 3;
  if (const char* n = std::getenv("WALGATE_BENCH_ROUNDS")) rounds = std::max(1, std::atoi(n));
  for (int i = 0; i < rounds; ++i)
    for (const char* kind : {"ref", "r1", "r3"})
      pg->sql("SELECT pg_create_logical_replication_slot('bench_" + std::string(kind) + "_" + std::to_string(i) + "', 'pgoutput')");
  if (std::system((bench + "/load.sh " + psql_args + " >/dev/null").c_str()) != 0) return 1;
  const std::string end = *pg->sql("SELECT pg_current_wal_lsn()")[0][0];
  const long long changes = 260000;
  std::printf("workload loaded (%lld changes); end LSN %s; %d rounds\n", changes, end.c_str(), rounds);

  const auto root = pg->dir() / "nats";
  nats_nodes one(1, root / "r1");
  nats_nodes three(3, root / "r3");
  std::this_thread::sleep_for(std::chrono::seconds(3));   // (the cluster elects its JetStream leader)

  std::vector<double> r1_ratio, r3_ratio, r1_log_ratio;
  const bool edge_only = std::getenv("WALGATE_BENCH_EDGE_ONLY") != nullptr;
  for (int round = 0; round < rounds && !edge_only; ++round) {
    const std::string suffix = "_" + std::to_string(round);
    // The reference: pg_recvlogical draining a slot to the end.
    auto t0 = clock_type::now();
    pid_t ref = spawn({pg->bindir().string() + "/pg_recvlogical", "-d", conninfo, "--start", "-S", "bench_ref" + suffix, "-o",
                       "proto_version=1", "-o", "publication_names=bench_pub", "--endpos=" + end, "-F", "0", "-f", "/dev/null",
                       "--no-loop"});
    int st = 0;
    waitpid(ref, &st, 0);
    const double ref_s = since(t0);
    // walgate publishing to each: from its start until the stream holds the last change.
    auto publish = [&](const char* kind, nats_nodes& nodes, int replicas, double& logged_s, double& cpu, double& nats_cpu) {
      const std::uint16_t port = free_port();
      const std::string data = (pg->dir() / ("data_" + std::string(kind) + suffix)).string();
      const double nats_before = nodes.cpu();
      auto start = clock_type::now();
      pid_t gw = spawn({walgate, "--pg", conninfo, "--slot", "bench_" + std::string(kind) + suffix, "--publication", "bench_pub",
                        "--data-dir", data, "--listen", "127.0.0.1:" + std::to_string(port), "--nats", nodes.urls,
                        "--nats-stream", "BENCH_" + std::string(kind) + suffix, "--nats-subject-prefix",
                        "bench." + std::string(kind) + suffix, "--nats-replicas", std::to_string(replicas)},
                       data + ".log");
      logged_s = 0;
      double published_s = 0;
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (!logged_s && metric(port, "walgate_log_next_seq") >= changes) logged_s = since(start);
        if (metric(port, "walgate_nats_stream_last_seq") >= changes) {
          published_s = since(start);
          break;
        }
        if (since(start) > 600) {
          std::fprintf(stderr, "walgate did not publish everything in 10 minutes (see %s.log)\n", data.c_str());
          break;
        }
      }
      cpu = cpu_seconds(gw);
      nats_cpu = nodes.cpu() - nats_before;
      kill(gw, SIGTERM);
      waitpid(gw, &st, 0);
      return published_s;
    };
    double r1_logged = 0, r1_cpu = 0, r1_nats = 0, r3_logged = 0, r3_cpu = 0, r3_nats = 0;
    const double r1_s = publish("r1", one, 1, r1_logged, r1_cpu, r1_nats);
    const double r3_s = publish("r3", three, 3, r3_logged, r3_cpu, r3_nats);
    std::printf("\nround %d\n", round + 1);
    std::printf("  pg_recvlogical drain            %6.2f s\n", ref_s);
    std::printf("  walgate -> JetStream R1          %6.2f s to the last PubAck (%6.2f s to the last change logged); "
                "walgate %5.2f CPU s, nats-server %5.2f CPU s; %.0f events/s\n",
                r1_s, r1_logged, r1_cpu, r1_nats, changes / r1_s);
    std::printf("  walgate -> JetStream R3 cluster  %6.2f s to the last PubAck (%6.2f s to the last change logged); "
                "walgate %5.2f CPU s, nats-servers %5.2f CPU s; %.0f events/s\n",
                r3_s, r3_logged, r3_cpu, r3_nats, changes / r3_s);
    r1_ratio.push_back(r1_s / ref_s);
    r3_ratio.push_back(r3_s / ref_s);
    r1_log_ratio.push_back(r1_logged / ref_s);
  }
  if (!edge_only)
    std::printf("\nmedian of %d rounds: published / pg_recvlogical drain: R1 %.2f, R3 %.2f (logged / drain %.2f)\n", rounds,
                median(r1_ratio), median(r3_ratio), median(r1_log_ratio));
  if (int r = edges(*pg, conninfo, walgate, one, 1, rounds); r != 0) return r;
  if (std::getenv("WALGATE_BENCH_R1_ONLY")) return 0;
  return edges(*pg, conninfo, walgate, three, 3, rounds);
}
