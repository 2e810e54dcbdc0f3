// Failed authentications counted per peer address in fixed windows: past the limit, an address
// waits for the rest of its window. One count for every door walgate has — bearer tokens on the
// HTTP side (proxy/http's admission keeps two of these), passwords on the replication side
// (proxy/walsender) — so that both limit alike (--auth-failures-per-minute).
//
// Assumptions, each broken by a test in tests/proxy/admission_test.cpp (through admission, and alone):
// - an address's window starts at its first failure and lasts `window`; at `limit` failures
//   inside it the address waits until the window ends (a limit of 0: nothing counted);
// - an attacker with many addresses cannot grow the map without bound: at most max_tracked
//   addresses are remembered; when full, the expired ones go (looked for at most once a second)
//   and a new address past that is not counted;
// - an address is an IPv4 address, or an IPv6 /64 (one host's usual share): peer_key.
// No Asio and no clock of its own: the caller passes the time.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace walgate::proxy {

/// An address's text for the limits: a.b.c.d; an IPv4-mapped IPv6 address as its IPv4; other
/// IPv6 addresses as their /64 ("2001:db8:1:2::/64").
std::string peer_key(bool v6, const std::array<unsigned char, 16>& bytes);

class failure_window {
 public:
  struct options {
    std::size_t limit = 0;                ///< failures of an address per window (0: no limit)
    std::chrono::seconds window{60};
    std::size_t max_tracked = 65536;      ///< addresses remembered
  };
  failure_window() = default;
  explicit failure_window(options o) : opts_(o) {}
  const options& opts() const { return opts_; }

  /// Seconds until address may try again; nullopt: it may now.
  std::optional<std::int64_t> wait(std::string_view address, std::chrono::steady_clock::time_point now) const;
  /// address failed once more.
  void count(std::string_view address, std::chrono::steady_clock::time_point now);
  std::size_t tracked() const { return by_address_.size(); }

 private:
  struct failures {
    std::chrono::steady_clock::time_point since;
    std::size_t n = 0;
  };
  options opts_;
  std::unordered_map<std::string, failures> by_address_;
  std::chrono::steady_clock::time_point swept_{};   // the last sweep (at most one a second)
};

}  // namespace walgate::proxy
