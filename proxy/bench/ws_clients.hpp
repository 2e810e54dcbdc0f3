// Raw WebSocket (and Server-Sent Events) clients for the benchmarks: many sockets read in one
// epoll loop, text frames counted (and whether compressed), events timed from their commit_time.
// Lean on purpose: they share the machine with walgate, and what is measured is the gateway.
#pragma once

#include "bench_process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::bench {

struct client {
  int fd = -1;
  bool sse = false;   // an EventSource's request (events counted by their data: lines)
  /// Times each event from its commit_time to now (into latencies_ms) — the latency phase's
  /// sample of clients.
  bool timed = false;
  std::vector<double>* samples = nullptr;   // where its latencies go (null: latencies_ms)
  std::string last_ts;
  std::chrono::system_clock::time_point last_commit;
  std::string buf;
  std::size_t frames = 0, compressed = 0;
  bool closed = false;
  std::string close_reason;   // a close frame's payload (its code and reason)
  ~client() {
    if (fd >= 0) ::close(fd);
  }
};

/// Connects and upgrades (sse: asks for Server-Sent Events instead); nonblocking after the
/// response head. Null when refused.
inline std::unique_ptr<client> connect_ws(std::uint16_t port, bool deflate, int n, bool sse = false, const std::string& headers = "",
                                   const std::string& query = "format=native") {
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
  std::string req = "GET /v1/ws?" + query + " HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" + headers;
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

inline std::vector<double> latencies_ms;   // of timed clients' events (unless a client names its own)
inline std::chrono::system_clock::time_point now_received;   // when the bytes being taken were read

/// A commit time as the native format writes it (2026-12-02T09:10:00.123456Z, UTC).
inline std::chrono::system_clock::time_point parse_utc(const std::string& ts) {
  std::tm tm{};
  strptime(ts.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  const double frac = ts.size() > 19 ? std::atof(ts.c_str() + 19) : 0;
  return std::chrono::system_clock::from_time_t(timegm(&tm)) + std::chrono::microseconds(static_cast<long>(frac * 1e6));
}

/// A timed client's event: its latency from the commit time in it.
inline void time_event(client& c, std::string_view msg) {
  static const std::string marker = "\"commit_time\":\"";
  const auto p = msg.find(marker);
  if (p == std::string_view::npos || msg.size() < p + marker.size() + 26) return;
  const std::string_view ts = msg.substr(p + marker.size(), 26);
  if (ts != c.last_ts) {   // (parsed once per transaction)
    c.last_ts = std::string(ts);
    c.last_commit = parse_utc(c.last_ts);
  }
  (c.samples ? *c.samples : latencies_ms).push_back(std::chrono::duration<double, std::milli>(now_received - c.last_commit).count());
}

/// Counts the complete data frames at the front of c's buffer (an EventSource's: its events).
inline void take(client& c) {
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
      if (c.timed && !(b0 & 0x40)) time_event(c, std::string_view(c.buf).substr(at + head, len));
    }
    if ((b0 & 0x0f) == 8) {
      c.closed = true;
      if (len >= 2) c.close_reason = std::to_string((static_cast<unsigned char>(c.buf[at + head]) << 8) | static_cast<unsigned char>(c.buf[at + head + 1])) +
                                     " " + c.buf.substr(at + head + 2, len - 2);
    }
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

/// Reads every client until each has `want` frames (or max_s pass, or all that are left closed).
inline void pump(std::vector<std::unique_ptr<client>>& cs, std::size_t want, double max_s = 120) {
  // epoll, not poll: poll's cost grows with every client at every call, and with 10,000 of them
  // the benchmark's own process took as much CPU as walgate on these two cores.
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) {
    std::perror("epoll_create1");
    std::exit(1);
  }
  std::size_t done = 0;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (cs[i]->frames >= want) {
      ++done;
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = i;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, cs[i]->fd, &ev);
  }
  std::vector<epoll_event> ready(1024);
  const auto start = clock_type::now();
  while (done < cs.size() && since(start) < max_s) {
    const int n = ::epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), 500);
    for (int k = 0; k < n; ++k) {
      auto& c = *cs[ready[static_cast<std::size_t>(k)].data.u64];
      char chunk[65536];
      ssize_t r;
      while ((r = ::recv(c.fd, chunk, sizeof chunk, 0)) > 0) c.buf.append(chunk, static_cast<std::size_t>(r));
      if (c.timed) now_received = std::chrono::system_clock::now();
      take(c);
      if (r == 0) c.closed = true;
      if (c.frames >= want || c.closed) {
        ++done;
        ::epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
      }
    }
  }
  ::close(ep);
}

}  // namespace walgate::bench
