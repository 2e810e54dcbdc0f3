// The PostgreSQL server the integration tests run against: one per test process, started on
// first use from $WALGATE_PG_BINDIR (or the newest Debian server), with roles for every
// authentication method, TLS, and pg_hba rules that pick the method by role name.
#pragma once

#include "walgate/proxy/failure.hpp"
#include "walgate/proxy/local_cluster.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <thread>

namespace walgate::test {

inline const std::vector<std::string>& default_hba() {
  static const std::vector<std::string> lines = {
      "local all all trust",
      "hostnossl all tls_only 127.0.0.1/32 reject",
      "host all trust_user 127.0.0.1/32 trust",
      "host all md5_user 127.0.0.1/32 md5",
      "host all scram_user 127.0.0.1/32 scram-sha-256",
      "host all unicode_user 127.0.0.1/32 scram-sha-256",
      "host all tls_only 127.0.0.1/32 scram-sha-256",
      "host all password_user 127.0.0.1/32 password",
      "host all norepl_user 127.0.0.1/32 trust",
      "host all all 127.0.0.1/32 trust",
  };
  return lines;
}

inline proxy::local_cluster& cluster() {
  static std::unique_ptr<proxy::local_cluster> c = [] {
    proxy::cluster_options o;
    o.name = "walgate-test";
    o.tls = true;
    o.hba = default_hba();
    // Every test case streams from slots of its own (left in place: they are cheap while idle).
    o.extra_conf = {"max_replication_slots = 40", "max_wal_senders = 40"};
    std::string error;
    auto started = proxy::local_cluster::start(o, error);
    if (!started) {
      std::fprintf(stderr, "cannot start the test cluster: %s\n", error.c_str());
      std::exit(2);
    }
    started->sql(
        "SET password_encryption = 'md5';"
        "CREATE ROLE md5_user LOGIN REPLICATION PASSWORD 'md5 secret';"
        "CREATE ROLE password_user LOGIN REPLICATION PASSWORD 'plain secret';"
        "SET password_encryption = 'scram-sha-256';"
        "CREATE ROLE scram_user LOGIN REPLICATION PASSWORD 'scram secret';"
        // fullwidth "pass", a no-break space, "wo" + combining diaeresis + "rd": SASLprep makes
        // it "pass w\u00f6rd", on the server and in every client that follows RFC 4013
        "CREATE ROLE unicode_user LOGIN PASSWORD '\uff50\uff41\uff53\uff53\u00a0wo\u0308rd';"
        "CREATE ROLE tls_only LOGIN REPLICATION PASSWORD 'tls secret';"
        "CREATE ROLE trust_user LOGIN REPLICATION;"
        "CREATE ROLE norepl_user LOGIN;");
    std::fprintf(stderr, "test cluster: PostgreSQL %d on port %d in %s\n", started->server_major(), started->port(),
                 started->dir().c_str());
    return started;
  }();
  return *c;
}

/// Runs a coroutine to completion on its own io_context and returns its result.
template <class T>
T run_sync(std::function<boost::asio::awaitable<T>()> make, std::chrono::seconds limit = std::chrono::seconds(60)) {
  boost::asio::io_context io;
  std::optional<T> result;
  std::exception_ptr error;
  boost::asio::co_spawn(io, make(), [&](std::exception_ptr e, T r) {
    error = e;
    if (!e) result.emplace(std::move(r));
  });
  io.run_for(limit);
  if (error) std::rethrow_exception(error);
  if (!result) throw std::runtime_error("coroutine did not finish in time");
  return std::move(*result);
}

/// Polls cond every 20 ms until it holds or the limit passes.
inline bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

}  // namespace walgate::test
