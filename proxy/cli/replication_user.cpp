// walgate slots: the downstream slots of a data directory, read from its replication-slots file
// (walgate running or not: the file is rewritten whole by a rename, never half-written).
//
// walgate replication-user NAME: a line for --replication-users — NAME and the SCRAM-SHA-256
// verifier of a password read on stdin, in PostgreSQL's form (what pg_authid.rolpassword holds,
// so a verifier copied from there serves too). The password itself is never written anywhere.
//
// Assumptions (tests/proxy/cli_test.cpp): the password is stdin up to its first line break (or
// its end), never empty; on a terminal it is asked for twice without echo and must match; a
// password that does not fit in 1 MiB is refused rather than read without end.
#include "commands.hpp"

#include "walgate/protocol/auth.hpp"
#include "walgate/proxy/replication_server.hpp"

#include <termios.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

namespace walgate::cli {

namespace {

constexpr std::size_t max_password = 1 << 20;

/// One line of stdin (without its line break); false at a read error or past max_password.
bool read_line(std::string& out) {
  out.clear();
  int ch = 0;
  while ((ch = std::getchar()) != EOF && ch != '\n') {
    if (out.size() >= max_password) return false;
    out.push_back(static_cast<char>(ch));
  }
  if (!out.empty() && out.back() == '\r') out.pop_back();
  return !std::ferror(stdin);
}

/// Asks on stderr and reads a line with echo off.
bool ask(const char* prompt, std::string& out) {
  std::fputs(prompt, stderr);
  std::fflush(stderr);
  termios old{};
  const bool tty = ::tcgetattr(STDIN_FILENO, &old) == 0;
  if (tty) {
    termios quiet = old;
    quiet.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet);
  }
  const bool ok = read_line(out);
  if (tty) ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &old);
  std::fputs("\n", stderr);
  return ok;
}

}  // namespace

int run_replication_user(const config& c) {
  std::string password;
  if (::isatty(STDIN_FILENO)) {
    std::string again;
    if (!ask("Password: ", password) || !ask("Password again: ", again)) {
      log_line("replication-user: the password could not be read");
      return 2;
    }
    if (password != again) {
      log_line("replication-user: the passwords differ");
      return 2;
    }
  } else if (!read_line(password)) {
    log_line("replication-user: the password could not be read from stdin (or is over 1 MiB)");
    return 2;
  }
  if (password.empty()) {
    log_line("replication-user: an empty password (give one on stdin: echo \"$PASSWORD\" | walgate replication-user " +
             c.replication_user_name + ")");
    return 2;
  }
  const auto v = protocol::make_scram_verifier(password, c.replication_user_iterations);
  std::printf("%s %s\n", c.replication_user_name.c_str(), protocol::format_scram_verifier(v).c_str());
  return std::fflush(stdout) == 0 ? 0 : 1;
}

int run_slots(const config& c) {
  std::string out, error;
  const std::string dir = c.slots_data_dir.empty() ? c.data_dir : c.slots_data_dir;
  if (!proxy::describe_slots_file(dir, out, error)) {
    log_line("slots: " + error);
    return 1;
  }
  std::fputs(out.c_str(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace walgate::cli
