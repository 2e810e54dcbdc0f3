// Limits on who may open how many streams, and how fast a peer may fail to authenticate
// (internal to proxy/http; no Asio, so that it is unit-tested alone):
//
//   - concurrent streams per subject (a verified token's `sub`) and per peer address: a stream
//     request (/v1/stream, /v1/ws), a /v1/mux connection and each of its subscriptions hold a
//     slot while they live; one more is refused (429, Retry-After);
//   - failed authentications per peer address (a token whose signature does not hold: malformed,
//     an unknown kid, a bad signature — not one refused for its claims, as an expired one) in a
//     fixed window: past the limit, that address's stream requests are refused (429,
//     Retry-After: the rest of the window) before any token is verified;
//   - the same, counted apart with the same limit, for genuine tokens refused for their claims
//     (expired, not yet valid, another issuer or audience): each cost a signature verification
//     on the event loop (RSA-8192 the dearest), which one leaked expired token would otherwise
//     buy without end. A count of its own: a forger's tokens and a client's retried expired one
//     do not add up;
//   - one log line per refused request (status, address, subject when known, reason — never
//     the token), at most log_per_second lines a second (then one line counting the rest).
//
// A peer's address is its IPv4 address, or its IPv6 /64 (one host's usual share of addresses).
// The maps are bounded: at most max_tracked addresses in each count (when full, the expired
// ones go, looked for at most once a second; then the new address is not tracked).
#pragma once

#include "walgate/proxy/failure_window.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace walgate::proxy {

class admission {
 public:
  struct options {
    std::size_t per_subject = 0;        ///< streams of one subject at once (0: no limit)
    std::size_t per_address = 0;        ///< streams of one address at once (0: no limit)
    /// Failed authentications of an address per window, and (counted apart) its tokens refused
    /// for their claims (0: no limit).
    std::size_t auth_failures = 0;
    std::chrono::seconds window{60};
    std::size_t max_tracked = 65536;    ///< addresses with failures remembered (in each count)
    std::size_t log_per_second = 20;
  };
  /// Why a request was refused: the label of walgate_refused_total.
  enum class reason : std::uint8_t {
    no_token, invalid_token, invalid_request, forbidden, subject_limit, address_limit, auth_rate_limit,
    too_many_clients, count_
  };
  static const char* name(reason r);

  admission() = default;
  explicit admission(options o) : opts_(o) {}
  const options& opts() const { return opts_; }
  /// Where refusals are logged (none: not logged).
  void set_log(std::function<void(const std::string&)> f) { log_ = std::move(f); }

  /// A stream's place under the caps, given back when it goes.
  class slot {
   public:
    slot() = default;
    slot(slot&& o) noexcept : a_(o.a_), subject_(std::move(o.subject_)), address_(std::move(o.address_)) { o.a_ = nullptr; }
    slot& operator=(slot&& o) noexcept;
    ~slot() { release(); }
    slot(const slot&) = delete;
    slot& operator=(const slot&) = delete;

   private:
    friend class admission;
    void release();
    admission* a_ = nullptr;
    std::string subject_, address_;
  };
  /// A slot for a stream of subject (empty: none known) from address, or nullopt with why
  /// (subject_limit or address_limit) and the message.
  std::optional<slot> take(std::string_view subject, std::string_view address, reason& why, std::string& message);
  std::size_t streams_of_subject(std::string_view subject) const;
  std::size_t streams_of_address(std::string_view address) const;

  /// The count that makes an address wait.
  enum class count_kind : std::uint8_t {
    invalid_tokens,    ///< tokens whose signature did not hold (failed())
    refused_claims     ///< genuine tokens refused for their claims (claims_refused())
  };
  /// Seconds until address may try to authenticate again; nullopt: it may now. which (when
  /// given, and not nullopt): the count over the limit (of two, the one with the longer wait).
  std::optional<std::int64_t> blocked(std::string_view address, std::chrono::steady_clock::time_point now,
                                      count_kind* which = nullptr) const;
  /// address failed to authenticate: a token whose signature did not hold (malformed, an unknown
  /// kid, a bad signature).
  void failed(std::string_view address, std::chrono::steady_clock::time_point now);
  /// address sent a genuine token (its signature held) refused for its claims: expired, not yet
  /// valid, another issuer or audience. Counted apart from failed(), with the same limit.
  void claims_refused(std::string_view address, std::chrono::steady_clock::time_point now);

  /// Counts a refusal and logs its line: "refused <status> <path> from <address> (subject
  /// <sub>): <message>".
  void refused(reason why, unsigned status, std::string_view path, std::string_view address, std::string_view subject,
               std::string_view message, std::chrono::steady_clock::time_point now);
  std::uint64_t refusals(reason r) const { return counts_[static_cast<std::size_t>(r)]; }

 private:
  options opts_;
  std::function<void(const std::string&)> log_;
  std::unordered_map<std::string, std::size_t> subjects_, addresses_;
  failure_window::options window_options() const { return {opts_.auth_failures, opts_.window, opts_.max_tracked}; }
  failure_window failures_{window_options()};   // tokens whose signature did not hold
  failure_window claims_{window_options()};     // genuine tokens refused for their claims
  std::array<std::uint64_t, static_cast<std::size_t>(reason::count_)> counts_{};
  std::chrono::steady_clock::time_point log_second_{};
  std::size_t logged_ = 0, unlogged_ = 0;
};

}  // namespace walgate::proxy
