// walgate-bench-nats WALGATE_BINARY SHARED_BENCH_DIR: the JetStream origin's publish rate
// (docs/benchmarks.md, *Scale-out*). A throwaway PostgreSQL 15 loaded with the standard
// workload (../shared/bench), three slots per round; each round drains one with pg_recvlogical
// (the reference), then runs the walgate binary with --nats on each of the others — to one
// nats-server (a stream of 1 replica) and to a 3-node cluster on loopback ports (3 replicas) —
// and times it from its start until the stream's last sequence is the workload's last change
// (every event published and confirmed by its PubAck). WALGATE_BENCH_ROUNDS=N (3).
#include "walgate/proxy/local_cluster.hpp"

#include "bench_process.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

using namespace walgate;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using walgate::bench::clock_type;
using walgate::bench::cpu_seconds;
using walgate::bench::free_port;
using walgate::bench::median;
using walgate::bench::since;

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
  for (int round = 0; round < rounds; ++round) {
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
  std::printf("\nmedian of %d rounds: published / pg_recvlogical drain: R1 %.2f, R3 %.2f (logged / drain %.2f)\n", rounds,
              median(r1_ratio), median(r3_ratio), median(r1_log_ratio));
  return 0;
}
