// The walgate executable.
//   walgate [serve] --pg CONNINFO --slot NAME --publication NAME ...   the gateway (serve.cpp)
//   walgate demo                                                     a throwaway PostgreSQL + the gateway (demo.cpp)
//   walgate stream --pg ... --slot ... --publication ...             print decoded messages (stream_command.cpp)
//   walgate edge --nats URL --nats-stream NAME ...                   serve from a JetStream stream (serve.cpp)
//   walgate replication-user NAME < password                        a --replication-users line (replication_user.cpp)
//   walgate slots [--data-dir D]                                     the downstream slots, as TOML (replication_user.cpp)
//   walgate --print-config                                           the configuration, checked, as TOML
// Settings (config.cpp): flags over WALGATE_* environment variables over the TOML config file.
#include "commands.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

int main(int argc, char** argv) {
  using namespace walgate::cli;
  config c;
  auto r = load(c, argc, argv);
  if (r.cmd == command::exit_now) return r.exit_code;
  if (!r.error.empty()) {
    std::fprintf(stderr, "walgate: %s\n", r.error.c_str());
    return 2;
  }
  switch (r.cmd) {
    case command::print_config: std::fputs(print(c).c_str(), stdout); return 0;
    case command::demo: return run_demo(c);
    case command::stream: return run_stream(c);
    case command::replication_user: return run_replication_user(c);
    case command::slots: return run_slots(c);
    case command::edge: return run_edge(c);
    default: {
      const int rc = serve(c);
      if (rc != restart_exit) return rc;
      // Started again as the same process (its pid, arguments and environment): a supervisor
      // sees no exit, and the start runs every check again.
      std::fflush(nullptr);
      // Nothing but stdin, stdout and stderr goes across (a connection left behind, a lock).
      std::error_code ec;
      std::vector<int> fds;
      for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
        const int fd = std::atoi(e.path().filename().c_str());
        if (fd > 2) fds.push_back(fd);
      }
      for (int fd : fds) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
      ::execv("/proc/self/exe", argv);
      std::fprintf(stderr, "walgate: cannot start again (%s): exiting for the supervisor to start it\n", std::strerror(errno));
      return 1;
    }
  }
}
