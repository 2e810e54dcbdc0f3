// Bearer tokens that are JWTs (RFC 7519) in the JWS compact serialization (RFC 7515), verified
// with OpenSSL: HS256/384/512 (a shared secret), RS256/384/512 and PS256/384/512 (RSA, at least
// 2048 bits), ES256/384/512 (P-256, P-384, P-521) and EdDSA (Ed25519), the keys from a JWKS
// document (RFC 7517) or a secret. The token is untrusted: its parts are decoded strictly
// (base64url without padding, JSON by Boost.JSON with a depth limit), its `alg` must match the
// key's type (never `none`, never an HMAC with a public key), and `exp`, `nbf`, `iat`, `iss`,
// `aud` are checked. Errors say what is wrong with the token, never anything about the key.
// No Asio here: the fuzz target and the unit tests compile it alone.
#pragma once

#include <boost/json/object.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::proxy::jwt {

/// Tokens longer than this are refused before anything is decoded.
constexpr std::size_t max_token_bytes = 16 * 1024;
/// Keys in one JWKS document, at most.
constexpr std::size_t max_keys = 256;

/// The keys tokens are verified with. Immutable once made; shared by the connections that
/// verify with it while a reload makes the next one.
class key_set {
 public:
  struct key;
  key_set();
  ~key_set();
  key_set(key_set&&) noexcept;
  key_set& operator=(key_set&&) noexcept;

  /// A JWKS document: {"keys":[…]}. Every key must be usable: kty RSA (n, e; 2048 to 8192 bits,
  /// e odd, at least 3 and at most 256 bits, and the pair passing OpenSSL's
  /// EVP_PKEY_public_check), EC (crv P-256/P-384/P-521, x, y: a point on the curve, checked the
  /// same way), OKP (crv Ed25519, x) or oct (k, at least 32 bytes); "use", when present, "sig";
  /// "alg", when present, one this key's type can verify (it then verifies only that alg).
  /// Private members (d, p, q…) are ignored.
  /// nullopt with error naming the key (its index and kid) and what is wrong.
  static std::optional<key_set> from_jwks(std::string_view json, std::string& error);
  /// One HMAC secret (HS256 needs at least 32 bytes, HS384 48, HS512 64; shorter than 32 is an
  /// error here).
  static std::optional<key_set> from_secret(std::string_view secret, std::string& error);

  /// Adds other's keys to these.
  void merge(key_set&& other);
  std::size_t size() const { return keys_.size(); }
  const std::vector<std::shared_ptr<const key>>& keys() const { return keys_; }

 private:
  std::vector<std::shared_ptr<const key>> keys_;
};

struct options {
  std::string issuer;                  ///< non-empty: `iss` must equal it
  std::string audience;                ///< non-empty: `aud` (a string or an array) must hold it
  std::chrono::seconds leeway{30};     ///< clock skew allowed on exp, nbf and iat
  bool require_exp = true;             ///< a token without `exp` is refused
};

/// A token that passed every check.
struct verified {
  boost::json::object claims;          ///< the payload, as sent
  std::optional<std::int64_t> exp;     ///< seconds since the epoch (a fraction cut off)
  std::string subject;                 ///< `sub`, when a string
};

/// Verifies a compact JWS token at time now (seconds since the epoch): the signature with a
/// key of keys (by `kid` when the token names one, else each key that can verify its alg), then
/// the claims. nullopt with error: why, for the client (no key material, the token itself
/// never quoted; `kid` and `alg` cut to 64 printable characters). signed_ok (when given) says
/// whether the signature was good: a token refused for its claims (expired…) was not forged.
std::optional<verified> verify(std::string_view token, const key_set& keys, const options& o, std::int64_t now,
                               std::string& error, bool* signed_ok = nullptr);

}  // namespace walgate::proxy::jwt
