// What the benchmarks share to run and watch walgate (and other programs) as processes: the
// CPU seconds and memory /proc reports, a child with its stderr in a file, a free local port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace walgate::bench {

using clock_type = std::chrono::steady_clock;

inline double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// Seconds of CPU in pid's /proc stat: user + system (fields 14, 15), and with children_too its
/// reaped children's (16, 17); -1 when pid is gone.
inline double stat_cpu_seconds(pid_t pid, bool children_too) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = s.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  unsigned long t = 0;
  for (int i = 3; i <= 17 && rest >> field; ++i)
    if (i == 14 || i == 15 || (children_too && (i == 16 || i == 17))) t += std::stoul(field);
  return static_cast<double>(t) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

/// User + system CPU seconds of pid (its threads, the ended ones too), or -1.
inline double cpu_seconds(pid_t pid) { return stat_cpu_seconds(pid, false); }

/// CPU seconds of pid and of its children: its own user + system time, its ended children's
/// (reaped: cutime + cstime) and its live children's — for a server of processes (PostgreSQL's
/// postmaster, its backends and walsenders), or -1.
inline double tree_cpu_seconds(pid_t pid) {
  double total = stat_cpu_seconds(pid, true);
  if (total < 0) return -1;
  std::ifstream kids("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  for (long k; kids >> k;)
    if (double c = stat_cpu_seconds(static_cast<pid_t>(k), false); c > 0) total += c;
  return total;
}

/// A memory figure of pid's /proc status in KiB (VmRSS:, VmHWM:), or -1.
inline long rss_kib(pid_t pid, const char* field = "VmRSS:") {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  return -1;
}

/// A port on 127.0.0.1 that was free a moment ago.
inline std::uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// Starts argv (argv[0] a path) with its stderr written to the file err.
inline pid_t spawn_logged(const std::vector<std::string>& argv, const std::string& err) {
  std::fflush(stdout);   // or the child prints our buffered output again
  pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::fopen(err.c_str(), "w");
    if (f) dup2(fileno(f), 2);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  return pid;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace walgate::bench
