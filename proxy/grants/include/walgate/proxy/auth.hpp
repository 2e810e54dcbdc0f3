// Who a stream client is: its bearer token (a JWT, jwt.hpp) checked against the keys of the
// configured files — an HMAC secret file, a JWKS file, or both — and what it may see (the
// policy file's grants, policy.hpp); the files are read again on
// reload() (SIGHUP) and when a file changes (reload_if_changed(), polled), without dropping a
// connection: a reload that fails keeps the keys in use and says why. No Asio: the event loop
// calls it.
#pragma once

#include "walgate/proxy/jwt.hpp"
#include "walgate/proxy/policy.hpp"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace walgate::proxy {

struct auth_options {
  std::filesystem::path secret_file;   ///< HS256/384/512: the file's bytes (one trailing newline dropped)
  std::filesystem::path jwks_file;     ///< a JWKS document (RFC 7517)
  std::filesystem::path policy_file;   ///< the grants (policy.hpp); empty: every valid token sees everything
  jwt::options claims;                 ///< iss, aud, leeway, exp required
};

/// The identity a verified token gives a stream: its claims (grants come from them) and its
/// expiry, when the stream ends.
using identity = jwt::verified;

class authenticator {
 public:
  explicit authenticator(auth_options o);
  /// Reads the files (at start: an error stops walgate). False with error; the keys in use, if
  /// any, stay.
  bool reload(std::string& error);
  /// Reloads when a file's size, modification time or inode changed since the last read (or
  /// the last failed attempt). 1: reloaded, 0: unchanged, -1: changed and failed (error set).
  int reload_if_changed(std::string& error);
  /// The token checked at the current time; nullopt with the reason for the client.
  std::optional<identity> verify(std::string_view token, std::string& error, bool* signed_ok = nullptr) const;
  /// A policy is configured: requests are served within their token's grants.
  bool has_policy() const { return policy_ != nullptr; }
  /// The grants of a verified token (null: it matches no grant). Only with has_policy().
  std::shared_ptr<const grants> grants_for(const identity& who) const { return policy_->grants_for(who.claims); }
  std::size_t policy_grants() const { return policy_ ? policy_->size() : 0; }

  const auth_options& options() const { return opts_; }
  std::size_t keys() const { return keys_ ? keys_->size() : 0; }
  std::uint64_t reloads() const { return reloads_; }
  std::uint64_t reload_failures() const { return reload_failures_; }
  std::uint64_t accepted() const { return accepted_; }
  std::uint64_t refused() const { return refused_; }

 private:
  struct stamp {
    std::uint64_t size = 0, mtime_ns = 0, inode = 0;
    bool exists = false;
    bool operator==(const stamp&) const = default;
  };
  static stamp stat_file(const std::filesystem::path& p);
  auth_options opts_;
  std::shared_ptr<const jwt::key_set> keys_;
  std::shared_ptr<const policy> policy_;
  stamp secret_stamp_, jwks_stamp_, policy_stamp_;
  std::uint64_t reloads_ = 0, reload_failures_ = 0;
  mutable std::uint64_t accepted_ = 0, refused_ = 0;
};

/// Whether a verified token's claim `name` equals value: a string claim equal to it, a boolean or
/// integer claim whose JSON text it is (true matches "true"), or an array claim holding such an
/// item. (--metrics-claim: who may read /metrics.)
bool claim_equals(const identity& who, std::string_view name, std::string_view value);

/// Where a request's bearer token is (RFC 6750): the Authorization header ("Bearer <token>"),
/// the access_token query parameter (EventSource cannot set headers), or, on a WebSocket
/// upgrade, an offered subprotocol "bearer.<token>" (the one header a browser's WebSocket can
/// set). token empty and no error: none (another scheme than Bearer is not a token). error: the
/// request is malformed — tokens in more than one place (RFC 6750 2: one method per request) or
/// two in one.
struct bearer {
  std::string token;
  std::string error;
};
bearer find_bearer(std::string_view authorization, std::string_view query_token, std::string_view subprotocols);
/// Whether a Sec-WebSocket-Protocol offer lists protocol (comma-separated, spaces ignored).
bool offers_subprotocol(std::string_view subprotocols, std::string_view protocol);

}  // namespace walgate::proxy
