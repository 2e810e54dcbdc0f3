// The walgate executable.
//   walgate [serve] --pg CONNINFO --slot NAME --publication NAME ...   the gateway (serve.cpp)
//   walgate demo                                                     a throwaway PostgreSQL + the gateway (demo.cpp)
//   walgate stream --pg ... --slot ... --publication ...             print decoded messages (stream_command.cpp)
//   walgate edge --nats URL --nats-stream NAME ...                   serve from a JetStream stream (serve.cpp)
//   walgate --print-config                                           the configuration, checked, as TOML
// Settings (config.cpp): flags over WALGATE_* environment variables over the TOML config file.
#include "commands.hpp"

#include <cstdio>

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
    case command::edge: return run_edge(c);
    default: return serve(c);
  }
}
