// Snapshot benchmarks (docs/benchmarks.md), side by side with COPY in one run, on a table of
// 1,000,000 rows of the standard workload's shape (../shared/bench/workload.sql):
//   copy      psql -c "\copy bench_orders to '/dev/null'" (the reference), 3 times
//   initial   walgate creating its slot and copying the rows into its event log (--snapshot
//             initial), 3 rounds: the copy's time as walgate reports it, rows/s, peak RSS
//   client    /v1/stream?snapshot=true to one NDJSON client reading as fast as it can, 3 rounds:
//             time to the first row, to the end marker, rows/s
// usage: walgate-bench-snapshot PATH/TO/walgate [SHARED_BENCH_DIR]
#include "walgate/proxy/local_cluster.hpp"

#include "bench_process.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <signal.h>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace walgate;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using namespace walgate::bench;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PATH/TO/walgate [SHARED_BENCH_DIR]\n", argv[0]);
    return 2;
  }
  const std::string walgate = argv[1];
  const std::string bench = argc > 2 ? argv[2] : "../shared/bench";
  std::string error;
  proxy::cluster_options o;
  o.name = "walgate-bench-snapshot";
  auto pg = proxy::local_cluster::start(o, error);
  if (!pg) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  const std::string psql_args = "-h " + pg->socket_dir().string() + " -p " + std::to_string(pg->port()) + " -U postgres -d postgres";
  if (std::system(("psql -X -q " + psql_args + " -v ON_ERROR_STOP=1 -f " + bench + "/workload.sql >/dev/null 2>&1").c_str()) != 0)
    return 1;
  // load.sh's rows, 1,000,000 of them, without its updates and deletes.
  pg->sql("INSERT INTO bench_orders(customer_id,status,amount,paid,tags,meta) "
          "SELECT g % 5000, (ARRAY['pending','paid','shipped'])[1 + g % 3], (g % 100000)/100.0, g % 2 = 0, "
          "ARRAY['t' || (g % 7), 'x'], jsonb_build_object('k', g, 'note', 'order ' || g) FROM generate_series(1, 1000000) g");
  pg->sql("VACUUM ANALYZE bench_orders");
  pg->sql("CREATE PUBLICATION bench_pub FOR TABLE bench_orders");
  const double rows = 1'000'000;
  std::printf("bench_orders: 1,000,000 rows, %s\n", pg->sql("SELECT pg_size_pretty(pg_relation_size('bench_orders'))")[0][0]->c_str());

  // The reference.
  std::vector<double> copy_s;
  for (int i = 0; i < 3; ++i) {
    auto t = clock_type::now();
    if (std::system(("psql -X -q " + psql_args + " -c \"\\copy bench_orders to '/dev/null'\"").c_str()) != 0) return 1;
    copy_s.push_back(since(t));
  }
  const double copy = median(copy_s);
  std::printf("COPY (psql \\copy to /dev/null): %.2f s median of 3, %.0f rows/s\n", copy, rows / copy);

  // The initial snapshot into the log, and a per-client snapshot from the gateway it leaves.
  std::vector<double> initial_s, first_row_s, client_s;
  std::vector<long> hwm;
  for (int round = 0; round < 3; ++round) {
    const std::string data = (pg->dir() / ("walgate-data-" + std::to_string(round))).string();
    const std::string err = (pg->dir() / ("walgate-" + std::to_string(round) + ".log")).string();
    const std::uint16_t port = free_port();
    pid_t gw = spawn_logged({walgate, "--pg", pg->conninfo(), "--slot", "bench_snap_" + std::to_string(round), "--publication",
                      "bench_pub", "--data-dir", data, "--listen", "127.0.0.1:" + std::to_string(port), "--no-fsync"},
                     err);
    std::string log;
    auto t = clock_type::now();
    while (since(t) < 600 && (log = slurp(err)).find("rows/s)") == std::string::npos) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto at = log.find(" rows of ");
    auto in = log.find(" tables in ", at);
    if (at == std::string::npos || in == std::string::npos) {
      std::fprintf(stderr, "no initial snapshot line:\n%s\n", log.c_str());
      kill(gw, SIGKILL);
      return 1;
    }
    initial_s.push_back(std::strtod(log.c_str() + in + 11, nullptr));
    hwm.push_back(rss_kib(gw, "VmHWM:"));
    // One client, snapshot=true, read as fast as it comes.
    {
      asio::io_context io;
      tcp::socket s(io);
      for (int i = 0; i < 200; ++i) {
        boost::system::error_code ec;
        s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
        if (!ec) break;
        s = tcp::socket(io);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      auto c0 = clock_type::now();
      asio::write(s, asio::buffer(std::string("GET /v1/stream?snapshot=true&tables=public.bench_orders HTTP/1.1\r\nHost: localhost\r\n\r\n")));
      std::vector<char> buf(1 << 20);
      std::string tail;
      bool first = false;
      std::size_t lines = 0;
      while (true) {
        boost::system::error_code ec;
        std::size_t n = s.read_some(asio::buffer(buf), ec);
        if (ec) break;
        std::string_view chunk(buf.data(), n);
        if (!first && chunk.find("{\"id\"") != std::string_view::npos) {
          first = true;
          first_row_s.push_back(since(c0));
        }
        lines += static_cast<std::size_t>(std::count(chunk.begin(), chunk.end(), '\n'));
        tail.append(chunk);
        if (tail.size() > 4096) tail.erase(0, tail.size() - 4096);
        if (tail.find("{\"snapshot\":\"end\"") != std::string::npos) break;
      }
      client_s.push_back(since(c0));
    }
    kill(gw, SIGINT);
    waitpid(gw, nullptr, 0);
  }
  const double initial = median(initial_s), client = median(client_s);
  std::printf("initial snapshot into the log: %.2f s median of 3, %.0f rows/s = %.2f x COPY's rows/s; peak RSS %ld MiB\n",
              initial, rows / initial, copy / initial, *std::max_element(hwm.begin(), hwm.end()) / 1024);
  std::printf("per-client snapshot, NDJSON: first row after %.0f ms, all rows and the marker in %.2f s, %.0f rows/s = %.2f x COPY's\n",
              median(first_row_s) * 1000, client, rows / client, copy / client);
  return 0;
}
