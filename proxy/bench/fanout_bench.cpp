// WebSocket fan-out benchmark (docs/benchmarks.md, "WebSocket compression"): one transaction of
// 2,000 one-row inserts to N WebSocket clients, with and without permessage-deflate offered
// (as browsers offer it), and the memory of 5,000 idle clients each way (and of 5,000 idle
// Server-Sent Events clients); against every walgate
// binary given, side by side in one run (the one before a change and the one after).
//   usage: walgate-bench-fanout PATH/TO/walgate [PATH/TO/other-walgate ...] [proxy/bench/node-peer/peer.mjs]
// (a .mjs gateway is the Node.js peer: pg-logical-replication + ws, run with node; npm install in
// its directory first)
// Clients are raw sockets in this process (one poll loop): each text frame is counted, and
// whether it came compressed (RSV1); a sample is checked to be the last row.
#include "walgate/proxy/local_cluster.hpp"

#include "bench_process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace walgate;
using namespace walgate::bench;

namespace {

struct client {
  int fd = -1;
  bool sse = false;   // an EventSource's request (events counted by their data: lines)
  std::string buf;
  std::size_t frames = 0, compressed = 0;
  bool closed = false;
  ~client() {
    if (fd >= 0) ::close(fd);
  }
};

/// Connects and upgrades (sse: asks for Server-Sent Events instead); nonblocking after the
/// response head. Null when refused.
std::unique_ptr<client> connect_ws(std::uint16_t port, bool deflate, int n, bool sse = false) {
  auto c = std::make_unique<client>();
  c->fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in src{}, a{};
  // Spread over 127.0.0.0/8 sources: ports per source address are what runs out.
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(0x7f000000u | static_cast<std::uint32_t>(2 + n / 20000));
  // The port is picked at connect, not by bind's search of the whole range (with thousands of
  // ports of that address in use, a search per bind makes connecting the clients quadratic).
  int one = 1;
  ::setsockopt(c->fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  ::bind(c->fd, reinterpret_cast<sockaddr*>(&src), sizeof src);
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(c->fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return nullptr;
  std::string req = "GET /v1/ws?format=native HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
  if (deflate) req += "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n";
  req += "\r\n";
  if (sse) req = "GET /v1/stream?format=native HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n";
  c->sse = sse;
  if (::send(c->fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) return nullptr;
  while (c->buf.find("\r\n\r\n") == std::string::npos) {
    char chunk[4096];
    ssize_t r = ::recv(c->fd, chunk, sizeof chunk, 0);
    if (r <= 0) return nullptr;
    c->buf.append(chunk, static_cast<std::size_t>(r));
  }
  if (c->buf.compare(0, 12, sse ? "HTTP/1.1 200" : "HTTP/1.1 101") != 0) return nullptr;
  c->buf.erase(0, c->buf.find("\r\n\r\n") + 4);
  ::fcntl(c->fd, F_SETFL, ::fcntl(c->fd, F_GETFL) | O_NONBLOCK);
  return c;
}

/// Counts the complete data frames at the front of c's buffer (an EventSource's: its events).
void take(client& c) {
  if (c.sse) {
    std::size_t at = 0, found;
    while ((found = c.buf.find("\ndata: ", at)) != std::string::npos) {
      ++c.frames;
      at = found + 7;
    }
    c.buf.erase(0, std::max(at, c.buf.size() > 8 ? c.buf.size() - 8 : 0));
    return;
  }
  std::size_t at = 0;
  while (c.buf.size() - at >= 2) {
    const auto b0 = static_cast<unsigned char>(c.buf[at]), b1 = static_cast<unsigned char>(c.buf[at + 1]);
    std::uint64_t len = b1 & 0x7f;
    std::size_t head = 2;
    if (len == 126) {
      if (c.buf.size() - at < 4) break;
      len = (static_cast<unsigned char>(c.buf[at + 2]) << 8) | static_cast<unsigned char>(c.buf[at + 3]);
      head = 4;
    } else if (len == 127) {
      if (c.buf.size() - at < 10) break;
      len = 0;
      for (int i = 0; i < 8; ++i) len = (len << 8) | static_cast<unsigned char>(c.buf[at + 2 + i]);
      head = 10;
    }
    if (c.buf.size() - at - head < len) break;
    if ((b0 & 0x0f) == 1) {
      ++c.frames;
      if (b0 & 0x40) ++c.compressed;
    }
    if ((b0 & 0x0f) == 8) c.closed = true;
    if ((b0 & 0x0f) == 9 && len <= 125) {
      // A ping: answered as a browser does (a pong with its payload, masked with a zero key),
      // or walgate closes the connection after --keepalive x 2 without one.
      std::string pong{static_cast<char>(0x8A), static_cast<char>(0x80 | len), 0, 0, 0, 0};
      pong.append(c.buf, at + head, len);
      ::send(c.fd, pong.data(), pong.size(), MSG_NOSIGNAL);
    }
    at += head + len;
  }
  c.buf.erase(0, at);
}

/// Reads every client until each has `want` frames (or 120 s pass, or all that are left closed).
void pump(std::vector<std::unique_ptr<client>>& cs, std::size_t want) {
  std::vector<pollfd> fds(cs.size());
  for (std::size_t i = 0; i < cs.size(); ++i) fds[i] = {cs[i]->fd, POLLIN, 0};
  std::size_t done = 0;
  for (auto& c : cs) done += c->frames >= want;
  const auto start = clock_type::now();
  while (done < cs.size() && since(start) < 120) {
    if (::poll(fds.data(), fds.size(), 500) <= 0) continue;
    for (std::size_t i = 0; i < cs.size(); ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto& c = *cs[i];
      char chunk[65536];
      ssize_t r;
      while ((r = ::recv(c.fd, chunk, sizeof chunk, 0)) > 0) c.buf.append(chunk, static_cast<std::size_t>(r));
      take(c);
      if (r == 0) c.closed = true;
      if (c.frames >= want || c.closed) {
        ++done;
        fds[i].fd = -1;
      }
    }
  }
}

}  // namespace

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
  auto pg = proxy::local_cluster::start(o, error);
  if (!pg) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  pg->sql("CREATE TABLE fan_items(id int PRIMARY KEY, note text); CREATE PUBLICATION fan_pub FOR TABLE fan_items");
  int next_id = 0;
  std::printf("one transaction of 2,000 one-row inserts (events of about 300 bytes) to N WebSocket clients\n");
  std::printf("%-28s %6s %5s %11s %8s %12s %11s %9s %8s\n", "walgate", "N", "pmd", "deliveries", "time s", "deliveries/s",
              "walgate CPU", "us each", "closed");
  int started = 0;
  // A walgate of its own (its own slot and data directory), listening when this returns.
  auto start = [&](const std::string& bin, std::uint16_t& port) -> pid_t {
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
      gw = spawn_logged({bin, "--pg", pg->conninfo(), "--slot", "fan_" + std::to_string(k), "--publication", "fan_pub",
                         "--data-dir", data, "--listen", "127.0.0.1:" + std::to_string(port), "--no-fsync", "--snapshot",
                         "never", "--max-clients", std::to_string(std::max<std::size_t>(12000, idle + 100))},
                        err);
    }
    std::unique_ptr<client> probe;
    for (int i = 0; i < 400 && !(probe = connect_ws(port, false, 0)); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
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
  for (int b = 1; b < argc; ++b) {
    const std::string bin = argv[b];
    const std::string name = bin.substr(bin.size() > 28 ? bin.size() - 28 : 0);
    std::uint16_t port = 0;
    pid_t gw = start(bin, port);
    struct run {
      std::size_t n;
      bool deflate;
    };
    for (run r : {run{100, false}, run{1000, false}, run{10000, false}, run{200, true}, run{1000, true}, run{10000, true}}) {
      std::vector<std::unique_ptr<client>> cs;
      for (std::size_t i = 0; i < r.n; ++i)
        if (auto c = connect_ws(port, r.deflate, static_cast<int>(i))) cs.push_back(std::move(c));
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
      std::printf("%-28s %6zu %5s %11zu %8.2f %12.0f %9.2f s %9.1f %8zu%s\n", name.c_str(), cs.size(), r.deflate ? "on" : "off",
                  frames, secs, frames / secs, cpu, frames ? cpu * 1e6 / frames : 0.0, closed,
                  r.deflate && compressed != frames ? " (some uncompressed)" : "");
      std::fflush(stdout);
      cs.clear();
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    stop(gw);
    // Idle clients' memory, each way in a fresh walgate: 5,000 clients (or WALGATE_BENCH_IDLE),
    // each given one event; and how fast they were accepted (connected and answered one by one)
    // (WebSocket without and with permessage-deflate, and Server-Sent Events).
    for (int kind = 0; kind < 3; ++kind) {
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
