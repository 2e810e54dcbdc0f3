// Restart of a large event log: one transaction of N MiB (records of 1 MiB: the initial snapshot
// of a big database, a bulk UPDATE) in one segment, then the log opened in a child process: its
// wall time and peak RSS, side by side with reading the same file once (the floor: recovery
// reads and checksums every byte). Usage: walgate-bench-recovery DIR [MiB=1024]
#include "large_transaction.hpp"

#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

using namespace walgate;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: walgate-bench-recovery DIR [MiB=1024]\n");
    return 2;
  }
  const std::filesystem::path dir = std::filesystem::path(argv[1]) / "walgate-bench-recovery";
  const unsigned mib = argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 1024;
  std::filesystem::remove_all(dir);
  proxy::log_options o;
  o.dir = dir;
  o.fsync = false;
  std::string error;
  {
    auto log = proxy::event_log::open(o, error);
    if (!log) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return 1;
    }
    if (!bench::log_large_transaction(*log, mib)) {
      std::fprintf(stderr, "%s\n", log->error().c_str());
      return 1;
    }
  }
  std::filesystem::path seg;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("segment-", 0) == 0) seg = e.path();
  const auto bytes = std::filesystem::file_size(seg);
  for (int round = 0; round < 3; ++round) {
    // The floor: the file read once, in 1 MiB reads.
    auto t0 = std::chrono::steady_clock::now();
    int fd = ::open(seg.c_str(), O_RDONLY);
    std::string buf(1u << 20, '\0');
    while (::read(fd, buf.data(), buf.size()) > 0) {
    }
    ::close(fd);
    const double read_s = seconds_since(t0);
    // The restart, in a child: its peak RSS is what opening the log needs.
    t0 = std::chrono::steady_clock::now();
    pid_t child = fork();
    if (child == 0) {
      std::string e;
      auto log = proxy::event_log::open(o, e);
      _exit(log && log->visible_seq() == mib ? 0 : 1);
    }
    int status = 0;
    rusage ru{};
    wait4(child, &status, 0, &ru);
    const double open_s = seconds_since(t0);
    std::printf("segment %.0f MiB: restart %.2f s, peak RSS %ld MiB (%s); reading the file once %.2f s; ratio %.2f\n",
                static_cast<double>(bytes) / (1 << 20), open_s, ru.ru_maxrss / 1024,
                WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "ok" : "FAILED", read_s, open_s / read_s);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
