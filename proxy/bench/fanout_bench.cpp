// WebSocket fan-out benchmark (docs/benchmarks.md, "WebSocket compression"): one transaction of
// 2,000 one-row inserts to N WebSocket clients, with and without permessage-deflate offered
// (as browsers offer it), and the memory of 5,000 idle clients each way (and of 5,000 idle
// Server-Sent Events clients); against every walgate
// binary given, side by side in one run (the one before a change and the one after).
//   usage: walgate-bench-fanout PATH/TO/walgate [PATH/TO/other-walgate ...] [proxy/bench/node-peer/peer.mjs]
// (a .mjs gateway is the Node.js peer: pg-logical-replication + ws, run with node; npm install in
// its directory first)
// Clients are raw sockets in this process (one epoll loop): each text frame is counted, and
// whether it came compressed (RSV1); a sample is checked to be the last row.
#include "walgate/proxy/local_cluster.hpp"

#include "bench_process.hpp"
#include "ws_clients.hpp"
#include "walgate/protocol/base64.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <string_view>
#include <ctime>

using namespace walgate;
using namespace walgate::bench;

/// An HS256 JWT with these claims (members of its JSON object), signed with secret.
std::string hs256_token(const std::string& secret, const std::string& claims) {
  auto b64 = [](const std::string& in) { return protocol::base64url_encode(in); };
  const std::string input = b64(R"({"alg":"HS256","typ":"JWT"})") + "." + b64("{" + claims + "}");
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(input.data()),
       input.size(), mac, &len);
  return input + "." + b64(std::string(reinterpret_cast<const char*>(mac), len));
}

/// A gateway given as a .mjs script: the Node.js peer, run with node.
bool is_peer(const std::string& bin) { return bin.size() > 4 && bin.compare(bin.size() - 4, 4, ".mjs") == 0; }

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PATH/TO/walgate [PATH/TO/other-walgate ...]\n", argv[0]);
    return 2;
  }
  // Idle clients per kind: 5,000, or WALGATE_BENCH_IDLE (100000 for docs/benchmarks.md's
  // 100,000-client figures). Each needs a descriptor here and one in walgate: as root the limit
  // is raised to what that takes (walgate, started from here, inherits it).
  const char* idle_env = std::getenv("WALGATE_BENCH_IDLE");
  const std::size_t idle = idle_env ? std::strtoull(idle_env, nullptr, 10) : 5000;
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  const rlim_t want = static_cast<rlim_t>(std::max<std::size_t>(idle, 10000) + 20000);
  if (rl.rlim_max < want) {
    rlimit raised{want, want};
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < idle + 2000) {
    std::fprintf(stderr, "%zu idle clients need %zu open files here (and as many in walgate); the limit is %llu\n", idle,
                 idle + 2000, static_cast<unsigned long long>(rl.rlim_cur));
    return 1;
  }
  std::string error;
  proxy::cluster_options o;
  o.name = "walgate-bench-fanout";
  // A walsender sends a transaction once its WAL is flushed: with synchronous_commit off that
  // waits for the WAL writer (up to 200 ms), which the latency phase would measure. UTC: the
  // reference's commit times are printed in the server's time zone.
  o.extra_conf = {"synchronous_commit = on", "timezone = 'UTC'"};
  auto pg = proxy::local_cluster::start(o, error);
  if (!pg) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  pg->sql("CREATE TABLE fan_items(id int PRIMARY KEY, note text); CREATE PUBLICATION fan_pub FOR TABLE fan_items");
  // pg_recvlogical on slot (test_decoding) for at most seconds, each line it prints given to
  // on_line until that returns false; then it is stopped.
  auto recvlogical = [&](const std::string& slot, int seconds, const std::vector<std::string>& options, auto on_line) {
    std::vector<std::string> argv = {"timeout", std::to_string(seconds), (pg->bindir() / "pg_recvlogical").string(), "-d",
                                     pg->conninfo(), "-S", slot, "--start", "-F", "0", "-f", "-"};
    argv.insert(argv.end(), options.begin(), options.end());
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return;
    const pid_t child = ::fork();
    if (child < 0) {
      ::close(out[0]);
      ::close(out[1]);
      return;
    }
    if (child == 0) {
      ::dup2(out[1], 1);   // (dup2's copy is not close-on-exec)
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 2);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    ::close(out[1]);
    FILE* f = ::fdopen(out[0], "r");
    char line[8192];
    while (f && std::fgets(line, sizeof line, f))
      if (!on_line(static_cast<const char*>(line))) break;
    ::kill(child, SIGTERM);   // (timeout passes it on to pg_recvlogical)
    ::waitpid(child, nullptr, 0);
    if (f) std::fclose(f);
    else ::close(out[0]);
  };
  int next_id = 0;
  std::printf("one transaction of 2,000 one-row inserts (events of about 300 bytes) to N WebSocket clients\n");
  std::printf("%-28s %6s %5s %11s %8s %12s %11s %9s %8s\n", "walgate", "N", "pmd", "deliveries", "time s", "deliveries/s",
              "walgate CPU", "us each", "closed");
  int started = 0;
  // A walgate of its own (its own slot and data directory), listening when this returns.
  auto start = [&](const std::string& bin, std::uint16_t& port, const std::vector<std::string>& extra = {}) -> pid_t {
    const int k = ++started;
    port = free_port();
    const std::string data = (pg->dir() / ("fan-data-" + std::to_string(k))).string();
    const std::string err = (pg->dir() / ("fan-" + std::to_string(k) + ".log")).string();
    pid_t gw = 0;
    if (is_peer(bin)) {   // the Node.js peer (proxy/bench/node-peer): its slot made here
      pg->sql("SELECT pg_create_logical_replication_slot('fan_" + std::to_string(k) + "', 'pgoutput')");
      gw = spawn_logged({"/usr/bin/env", "node", bin, pg->socket_dir().string(), std::to_string(pg->port()),
                         "fan_" + std::to_string(k), "fan_pub", std::to_string(port)},
                        err);
    } else {
      std::vector<std::string> args = {bin, "--pg", pg->conninfo(), "--slot", "fan_" + std::to_string(k), "--publication", "fan_pub",
                                       "--data-dir", data, "--listen", "127.0.0.1:" + std::to_string(port), "--no-fsync", "--snapshot",
                                       "never", "--max-clients", std::to_string(std::max<std::size_t>(12000, idle + 100))};
      args.insert(args.end(), extra.begin(), extra.end());
      gw = spawn_logged(args, err);
    }
    std::unique_ptr<client> probe;
    const std::string probe_headers = extra.empty() ? "" : "Authorization: Bearer " + hs256_token(std::string(32, 's'), "\"all\":true") + "\r\n";
    for (int i = 0; i < 400 && !(probe = connect_ws(port, false, 0, false, probe_headers)); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!probe) {
      std::fprintf(stderr, "walgate did not start:\n%s\n", slurp(err).c_str());
      std::exit(1);
    }
    return gw;
  };
  auto stop = [](pid_t gw) {
    kill(gw, SIGINT);
    waitpid(gw, nullptr, 0);
  };
  if (std::getenv("WALGATE_BENCH_GRANTS")) {
    // Row grants at scale (docs/benchmarks.md, "Row grants"): 1,000 WebSocket clients of 100
    // tenants (tenant = {claims.tenant}: 10 clients each) against the same 1,000 clients
    // unfiltered (a grant of every row), on one walgate, the same number of deliveries each way:
    // 2,000 events to every unfiltered client; 200,000 events over the 100 tenants (2,000 to
    // each filtered client), in 100 transactions each way.
    pg->sql("CREATE TABLE fan_t(id int PRIMARY KEY, tenant int, note text); ALTER TABLE fan_t REPLICA IDENTITY FULL;"
            "ALTER PUBLICATION fan_pub ADD TABLE fan_t");
    const std::string secret(32, 's');
    const auto dir = pg->dir();
    { std::ofstream(dir / "secret") << secret; }
    {
      std::ofstream(dir / "policy.toml") << "[[grant]]\nwhen = { all = true }\ntables = [\"public.fan_t\", \"public.fan_items\"]\n\n"
                                            "[[grant]]\nwhen = { all = false }\ntables = [\"public.fan_t\"]\nrows = \"tenant = {claims.tenant}\"\n";
    }
    // PostgreSQL's processes (the backend inserting, the walsender decoding) and the benchmark's
    // clients share the two cores with walgate: their CPU in each phase too.
    pid_t postmaster = 0;
    { std::ifstream(pg->datadir() / "postmaster.pid") >> postmaster; }
    auto self_cpu = [] {
      rusage u{};
      getrusage(RUSAGE_SELF, &u);
      return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
    };
    std::printf("%-10s %6s %8s %11s %8s %12s %11s %9s %8s %7s %9s\n", "clients", "N", "events", "deliveries", "time s", "deliveries/s",
                "walgate CPU", "us each", "closed", "PG CPU", "bench CPU");
    int id = 0;
    // events rows after id in 100 transactions (one request), each row's tenant its id % 100.
    auto hundred_transactions = [](int id, int events) {
      std::string sql;
      const int per = events / 100;
      for (int done = 0; done < events; done += per)
        sql += "BEGIN; INSERT INTO fan_t SELECT g, g % 100, 'note ' || repeat(md5(g::text), 4) FROM generate_series(" +
               std::to_string(id + done + 1) + ", " + std::to_string(id + done + per) + ") g; COMMIT;";
      return sql;
    };
    // WALGATE_BENCH_GRANTS=filtered or =unfiltered: that phase alone, 5 rounds (for a profiler).
    const std::string only = std::getenv("WALGATE_BENCH_GRANTS");
    const int rounds = only == "filtered" || only == "unfiltered" ? 5 : 2;
    // Each walgate given (the one before a change and the one after), a round each in turn,
    // started afresh (its own slot: nothing else reads the stream while it is measured).
    for (int round = 0; round < rounds; ++round)
      for (int b = 1; b < argc; ++b) {
        const std::string bin = argv[b];
        std::printf("-- %s\n", bin.c_str());
        std::uint16_t port = 0;
        pid_t gw = start(bin, port, {"--auth", "jwt", "--jwt-secret-file", (dir / "secret").string(), "--policy",
                                     (dir / "policy.toml").string(), "--jwt-exp", "optional", "--max-streams-per-subject", "0",
                                     "--auth-failures-per-minute", "0"});
        // The third phase, the floor: the filtered phase's 200,000 events to one filtered client
        // (its tenant's 2,000) — what PostgreSQL takes to make and send them and walgate to log
        // them, whatever the clients cost.
        for (int phase : {0, 1, 2}) {
          const bool filtered = phase != 0;
          if ((only == "filtered" && phase != 1) || (only == "unfiltered" && filtered)) continue;
          std::vector<std::unique_ptr<client>> cs;
          const int nclients = phase == 2 ? 1 : 1000;
          for (int i = 0; i < nclients; ++i) {
            const std::string claims = filtered ? "\"all\":false,\"tenant\":" + std::to_string(i % 100) : "\"all\":true";
            if (auto c = connect_ws(port, false, i, false, "Authorization: Bearer " + hs256_token(secret, claims) + "\r\n",
                                    "format=native&tables=public.fan_t"))
              cs.push_back(std::move(c));
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          // (a first event: each client has caught up, and the filtered ones are with the router)
          pg->sql("INSERT INTO fan_t VALUES (" + std::to_string(++id) + ", -1, 'warm-up')");
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          for (auto& c : cs) c->frames = 0;
          const int events = filtered ? 200000 : 2000;
          const double cpu0 = cpu_seconds(gw), pg0 = tree_cpu_seconds(postmaster), self0 = self_cpu();
          auto t = clock_type::now();
          // 100 transactions, sent as one request: each client gets 20 events of each (the same
          // batches both ways) — 20 rows each for the unfiltered clients, 2,000 rows (20 of each
          // tenant) for the filtered ones.
          pg->sql(hundred_transactions(id, events));
          id += events;
          pump(cs, 2000);
          const double secs = since(t), cpu = cpu_seconds(gw) - cpu0, pg_cpu = tree_cpu_seconds(postmaster) - pg0,
                       own_cpu = self_cpu() - self0;
          std::size_t frames = 0, closed = 0;
          std::string reason;
          for (auto& c : cs) {
            frames += c->frames, closed += c->closed;
            if (reason.empty() && c->closed) reason = c->close_reason.empty() ? "(no close frame)" : c->close_reason;
          }
          if (!reason.empty()) std::printf("closed: %s\n", reason.c_str());
          std::printf("%-10s %6zu %8d %11zu %8.2f %12.0f %9.2f s %9.2f %8zu %5.2f s %7.2f s\n", phase == 2 ? "floor" : filtered ? "100 tenants" : "unfiltered", cs.size(),
                      events, frames, secs, frames / secs, cpu, frames ? cpu * 1e6 / frames : 0.0, closed, pg_cpu, own_cpu);
          std::fflush(stdout);
          cs.clear();
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
        }
        stop(gw);
        if (!only.empty() && only != "1") continue;
        // The reference, walgate stopped: the filtered phase's 100 transactions of 2,000 rows to
        // pg_recvlogical (test_decoding, a slot of its own), timed from the request until its
        // 100th COMMIT line — what PostgreSQL takes to make and send them to a consumer that
        // does nothing with them.
        const std::string ref_slot = "fan_grants_ref_" + std::to_string(round) + "_" + std::to_string(b);
        pg->sql("SELECT pg_create_logical_replication_slot('" + ref_slot + "', 'test_decoding')");
        std::atomic<int> commits{0};
        std::atomic<bool> started{false};
        clock_type::time_point done_at{};
        std::thread ref([&] {
          recvlogical(ref_slot, 60, {}, [&](const char* line) {
            started = true;
            if (std::strncmp(line, "COMMIT", 6) != 0 || ++commits < 101) return true;
            done_at = clock_type::now();
            return false;
          });
        });
        // (a first transaction: pg_recvlogical is streaming)
        for (int i = 0; i < 200 && !started; ++i) {
          pg->sql("INSERT INTO fan_t VALUES (" + std::to_string(++id) + ", -1, 'warm-up')");
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        commits = 1;   // (the warm-ups: one or more, all in by now)
        const double pg0 = tree_cpu_seconds(postmaster);
        const auto t = clock_type::now();
        pg->sql(hundred_transactions(id, 200000));
        id += 200000;
        ref.join();
        const double pg_cpu = tree_cpu_seconds(postmaster) - pg0;
        std::printf("%-10s %6d %8d %11s %8.2f %12s %11s %9s %8s %5.2f s\n", "recvlogical", 1, 200000, "-",
                    commits >= 101 ? std::chrono::duration<double>(done_at - t).count() : -1.0, "-", "-", "-", "-", pg_cpu);
        std::fflush(stdout);
        // (its walsender may outlive pg_recvlogical by a moment: dropped once the slot is inactive)
        for (int i = 0; i < 100; ++i) {
          auto gone = pg->sql("SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots WHERE slot_name = '" +
                              ref_slot + "' AND NOT active");
          if (!gone.empty() && gone[0][0] == std::optional<std::string>("1")) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
    return 0;
  }
  for (int b = 1; b < argc; ++b) {
    const std::string bin = argv[b];
    const std::string name = bin.substr(bin.size() > 28 ? bin.size() - 28 : 0);
    std::uint16_t port = 0;
    pid_t gw = start(bin, port);
    struct run {
      std::size_t n;
      bool deflate;
      bool sse = false;   // EventSource clients (WALGATE_BENCH_BURSTS=N:sse)
    };
    // WALGATE_BENCH_ONLY_IDLE: the idle clients' memory alone (no bursts, no latency phase).
    const bool only_idle = std::getenv("WALGATE_BENCH_ONLY_IDLE") != nullptr;
    std::vector<run> runs = {run{100, false}, run{1000, false}, run{10000, false}, run{200, true}, run{1000, true}, run{10000, true}};
    if (only_idle) runs.clear();
    // WALGATE_BENCH_BURSTS=10000:off,10000:on,10000:sse,...: those bursts instead (WebSocket
    // without and with permessage-deflate, Server-Sent Events).
    if (const char* b = std::getenv("WALGATE_BENCH_BURSTS")) {
      runs.clear();
      std::string list = b;
      for (std::size_t at = 0; at < list.size();) {
        auto comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        const std::string item = list.substr(at, comma - at);
        runs.push_back(run{std::strtoull(item.c_str(), nullptr, 10), item.find(":on") != std::string::npos,
                           item.find(":sse") != std::string::npos});
        at = comma + 1;
      }
    }
    for (run r : runs) {
      std::vector<std::unique_ptr<client>> cs;
      for (std::size_t i = 0; i < r.n; ++i)
        if (auto c = connect_ws(port, r.deflate, static_cast<int>(i), r.sse)) cs.push_back(std::move(c));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const double cpu0 = cpu_seconds(gw);
      auto t = clock_type::now();
      pg->sql("INSERT INTO fan_items SELECT g, 'note ' || repeat(md5(g::text), 4) FROM generate_series(" +
              std::to_string(next_id + 1) + ", " + std::to_string(next_id + 2000) + ") g");
      next_id += 2000;
      pump(cs, 2000);
      const double secs = since(t), cpu = cpu_seconds(gw) - cpu0;
      std::size_t frames = 0, closed = 0, compressed = 0;
      for (auto& c : cs) frames += c->frames, closed += c->closed, compressed += c->compressed;
      std::printf("%-28s %6zu %5s %11zu %8.2f %12.0f %9.2f s %9.1f %8zu%s\n", name.c_str(), cs.size(),
                  r.sse ? "sse" : r.deflate ? "on" : "off",
                  frames, secs, frames / secs, cpu, frames ? cpu * 1e6 / frames : 0.0, closed,
                  r.deflate && compressed != frames ? " (some uncompressed)" : "");
      std::fflush(stdout);
      cs.clear();
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    if (!is_peer(bin) && !only_idle && !std::getenv("WALGATE_BENCH_NO_LATENCY")) {
      // Commit -> client latency at 1,000,000 deliveries/s: 10,000 clients (uncompressed), 100
      // changes a second (10 transactions of 10 rows) for 10 s; 100 of the clients time every
      // event from the commit time in it. Meanwhile pg_recvlogical (test_decoding with commit
      // times) on a slot of its own times the same transactions as they reach it: the
      // reference, in the same run.
      // WALGATE_BENCH_LATENCY_TPS: transactions of 10 rows a second (10: 1 M deliveries/s).
      const int tps = std::getenv("WALGATE_BENCH_LATENCY_TPS") ? std::max(1, std::atoi(std::getenv("WALGATE_BENCH_LATENCY_TPS"))) : 10;
      std::vector<std::unique_ptr<client>> cs;
      for (std::size_t i = 0; i < 10000; ++i)
        if (auto c = connect_ws(port, false, static_cast<int>(i))) cs.push_back(std::move(c));
      for (std::size_t i = 0; i < cs.size() && i < 100; ++i) cs[i]->timed = true;
      latencies_ms.clear();
      const std::string ref_slot = "fan_ref_" + std::to_string(b);
      pg->sql("SELECT pg_create_logical_replication_slot('" + ref_slot + "', 'test_decoding')");
      std::vector<double> ref_ms;
      std::thread ref([&] {
        recvlogical(ref_slot, 16, {"-o", "include-timestamp=1"}, [&](const char* line) {
          const auto now = std::chrono::system_clock::now();
          const std::string l(line);
          const auto at = l.find(" (at ");
          if (l.rfind("COMMIT", 0) != 0 || at == std::string::npos || l.size() < at + 5 + 26) return true;
          std::string ts = l.substr(at + 5, 26);   // 2026-12-02 09:10:00.123456 (UTC)
          ts[10] = 'T';
          ref_ms.push_back(std::chrono::duration<double, std::milli>(now - parse_utc(ts)).count());
          return true;
        });
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      const double cpu0 = cpu_seconds(gw);
      std::thread load([&] {
        const auto t0 = clock_type::now();
        for (int n = 0; n < 10 * tps; ++n) {
          pg->sql("INSERT INTO fan_items SELECT g, 'note ' || repeat(md5(g::text), 4) FROM generate_series(" +
                  std::to_string(next_id + 1) + ", " + std::to_string(next_id + 10) + ") g");
          next_id += 10;
          std::this_thread::sleep_until(t0 + std::chrono::microseconds(1000000L * (n + 1) / tps));
        }
      });
      pump(cs, static_cast<std::size_t>(100 * tps));
      load.join();
      const double cpu = cpu_seconds(gw) - cpu0;
      ref.join();
      std::size_t frames = 0, closed = 0;
      for (auto& c : cs) frames += c->frames, closed += c->closed;
      auto pct = [](std::vector<double> v, double q) {
        if (v.empty()) return -1.0;
        std::sort(v.begin(), v.end());
        return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
      };
      std::printf("%-28s commit -> client at %d changes/s to %zu clients for 10 s (%zu deliveries, "
                  "%zu closed; walgate %.1f CPU s): p50 %.2f ms, p99 %.2f ms, max %.2f ms (%zu samples); "
                  "pg_recvlogical: p50 %.2f ms, p99 %.2f ms, max %.2f ms (%zu transactions)\n",
                  name.c_str(), 10 * tps, cs.size(), frames, closed, cpu, pct(latencies_ms, 0.5), pct(latencies_ms, 0.99),
                  pct(latencies_ms, 1.0), latencies_ms.size(), pct(ref_ms, 0.5), pct(ref_ms, 0.99), pct(ref_ms, 1.0),
                  ref_ms.size());
      std::fflush(stdout);
      pg->sql("SELECT pg_drop_replication_slot('" + ref_slot + "')");
    }
    stop(gw);
    // Idle clients' memory, each way in a fresh walgate: 5,000 clients (or WALGATE_BENCH_IDLE),
    // each given one event; and how fast they were accepted (connected and answered one by one)
    // (WebSocket without and with permessage-deflate, and Server-Sent Events).
    for (int kind = 0; kind < 3 && idle > 0; ++kind) {   // (WALGATE_BENCH_IDLE=0: none)
      const bool deflate = kind == 1, sse = kind == 2;
      if (sse && is_peer(bin)) continue;   // (WebSocket only)
      gw = start(bin, port);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const long before = rss_kib(gw);
      std::vector<std::unique_ptr<client>> cs;
      const auto t0 = clock_type::now();
      for (std::size_t i = 0; i < idle; ++i)
        if (auto c = connect_ws(port, deflate, static_cast<int>(i), sse)) cs.push_back(std::move(c));
      const double accept_s = since(t0);
      pg->sql("INSERT INTO fan_items VALUES (" + std::to_string(++next_id) + ", 'note ' || repeat(md5('x'), 4))");
      pump(cs, 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const long after = rss_kib(gw);
      std::size_t got = 0;
      for (auto& c : cs) got += c->frames >= 1;
      std::printf("%-28s %zu idle clients, %-11s: %zu connected (%.0f/s), %zu given an event, RSS +%.1f KiB each\n",
                  name.c_str(), idle, sse ? "SSE" : deflate ? "WS, pmd on" : "WS, pmd off", cs.size(),
                  static_cast<double>(cs.size()) / accept_s, got, static_cast<double>(after - before) / static_cast<double>(idle));
      std::fflush(stdout);
      cs.clear();
      stop(gw);
    }
  }
  return 0;
}
