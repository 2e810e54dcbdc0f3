// The walgate executable's commands (main.cpp dispatches to them).
#pragma once

#include "config.hpp"

#include <cstdint>
#include <exception>
#include <functional>
#include <string>

namespace walgate::cli {

/// "walgate: <s>" on stderr.
void log_line(const std::string& s);
/// What an exception a coroutine ended with says ("unknown exception" when it is no std::exception).
std::string exception_text(std::exception_ptr e);
/// serve()'s exit code when it must start again (main then executes itself again, same pid,
/// same arguments): the event log is to be cut before streaming on (history.hpp).
inline constexpr int restart_exit = 75;
/// The gateway (serve.cpp), until SIGINT/SIGTERM or a failure; on_listening gets the port.
int serve(const config& c, const std::function<void(std::uint16_t)>& on_listening = {});
/// An edge (serve.cpp): the HTTP API served from the JetStream stream an origin publishes to.
int run_edge(const config& c, const std::function<void(std::uint16_t)>& on_listening = {});
/// A throwaway PostgreSQL with a trickle of changes, and the gateway on it (demo.cpp).
int run_demo(config c);
/// Prints each decoded message of the stream (stream_command.cpp).
int run_stream(const config& c);
/// Prints "NAME VERIFIER" for --replication-users from a password on stdin (replication_user.cpp).
int run_replication_user(const config& c);
/// Prints the downstream slots of a data directory (replication_user.cpp).
int run_slots(const config& c);

}  // namespace walgate::cli
