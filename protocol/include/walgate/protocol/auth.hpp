// Password authentication exchanges: MD5 and SCRAM-SHA-256 (RFC 5802 / RFC 7677), with
// tls-server-end-point channel binding (RFC 5929) for SCRAM-SHA-256-PLUS. Pure computation on
// bytes (OpenSSL's libcrypto for the hashes), no sockets: the connection drives the steps.
#pragma once

#include "walgate/protocol/error.hpp"

#include <boost/system/result.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::protocol {

/// "md5" + hex(md5(hex(md5(password + user)) + salt)), as AuthenticationMD5Password expects.
std::string md5_password_response(std::string_view user, std::string_view password,
                                  std::string_view salt4);

/// A server that asks for more PBKDF2 iterations than this is refused: the exchange would let an
/// untrusted server burn our CPU. PostgreSQL's default is 4096 (scram_iterations, PG16+).
inline constexpr std::uint32_t max_scram_iterations = 10'000'000;

/// The SCRAM-SHA-256 client, one method per step of the exchange:
///   client_first() -> server-first -> client_final() -> server-final -> verify_server_final().
/// Errors (a nonce that does not extend ours, a bad server proof) are values, never exceptions.
class scram_client {
 public:
  /// channel_binding_data empty: plain SCRAM-SHA-256 ("n,," header, or "y,," when the client
  /// supports binding but the server did not offer PLUS). Otherwise SCRAM-SHA-256-PLUS with
  /// tls-server-end-point and these bytes (the hash of the server certificate).
  /// user is sent in client-first ("" for PostgreSQL, which takes the startup user).
  /// nonce empty: 18 random bytes, base64 encoded.
  scram_client(std::string password, std::string user = {}, std::string nonce = {},
               std::string channel_binding_data = {}, bool client_supports_binding = false);

  std::string_view mechanism() const;
  /// client-first-message: gs2-header "n=<user>,r=<nonce>".
  const std::string& client_first() const { return client_first_; }
  /// Takes server-first-message ("r=...,s=...,i=..."), returns client-final-message with proof.
  boost::system::result<std::string> client_final(std::string_view server_first);
  /// Takes server-final-message ("v=..." or "e=..."), checks the server signature.
  boost::system::result<void> verify_server_final(std::string_view server_final) const;
  /// A human-readable reason for the last failure (e.g. the server's e= value).
  const std::string& failure() const { return failure_; }

 private:
  std::string password_;
  std::string nonce_;
  std::string gs2_header_;
  std::string binding_data_;
  std::string client_first_bare_;
  std::string client_first_;
  std::string expected_server_signature_;
  mutable std::string failure_;
};

// --- The server's side (walgate's own walsender, issue 35) --------------------------------------
//
// Assumptions, each broken by a test in tests/protocol/auth_test.cpp:
// - a verifier comes from a file an operator wrote, but is parsed as untrusted bytes: exactly
//   "SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>" (PostgreSQL's rolpassword form),
//   strict base64, keys of 32 bytes, a salt of 1 to 1024 bytes, iterations 1 to INT32_MAX;
// - a client's SCRAM messages are untrusted: any byte string, cut anywhere, is a clear error,
//   never a crash; attributes come in RFC 5802's order and anything else is refused, as
//   PostgreSQL's auth-scram.c refuses it;
// - the user name in client-first is ignored (PostgreSQL takes the startup packet's), an
//   authorization identity (a=) and mandatory extensions (m=) are refused;
// - a client that says "y" (it supports channel binding, thinks the server does not) while the
//   server offers SCRAM-SHA-256-PLUS is refused: a downgrade;
// - a user without a verifier gets the same exchange as one with (a 16-byte mock salt derived
//   from the name and a secret, the iteration count the caller names), failing at the proof:
//   whether a user exists is not told by the exchange.

/// A PostgreSQL SCRAM-SHA-256 verifier (pg_authid.rolpassword).
struct scram_verifier {
  std::uint32_t iterations = 4096;
  std::string salt;         ///< raw bytes
  std::string stored_key;   ///< 32 raw bytes: H(ClientKey)
  std::string server_key;   ///< 32 raw bytes: HMAC(SaltedPassword, "Server Key")
};
/// Parses "SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>"; nullopt with why.
boost::system::result<scram_verifier> parse_scram_verifier(std::string_view text, std::string* why = nullptr);
/// The verifier of a password (SASLprep'd as PostgreSQL does), with salt (16 random bytes when
/// empty) and iterations.
scram_verifier make_scram_verifier(std::string_view password, std::uint32_t iterations = 4096, std::string salt = {});
/// A secret for mock salts from seed (SHA-256 of it): stable while seed is (walgate seeds it
/// with its users file, so that an unknown user's salt is the same after a restart, as a real
/// user's is).
std::string scram_mock_secret(std::string_view seed);
/// Its text form, as PostgreSQL stores and prints it.
std::string format_scram_verifier(const scram_verifier& v);

/// The SCRAM-SHA-256 server, one method per step:
///   client-first -> server_first() -> server-first; client-final -> server_final() -> server-final.
/// After server_final() succeeds the client proved it knows the password.
class scram_server {
 public:
  /// verifier: the user's, or nullopt for a user without one (a mock exchange that fails).
  /// mock_secret: the process's secret the mock salt is derived from (with the user name).
  /// channel_binding_data: the tls-server-end-point hash of the server's certificate when the
  /// connection is on TLS (then SCRAM-SHA-256-PLUS is offered), empty otherwise.
  /// nonce: the server's part of the nonce (18 random bytes, base64, when empty).
  /// mock_iterations: the iteration count a user without a verifier is told (the one most of
  /// the real users have, so that it tells nothing).
  scram_server(std::optional<scram_verifier> verifier, std::string_view user, std::string_view mock_secret,
               std::string channel_binding_data = {}, std::string nonce = {}, std::uint32_t mock_iterations = 4096);

  /// The mechanisms to offer, in PostgreSQL's order.
  std::vector<std::string> mechanisms() const;
  /// The client chose mechanism, sent client-first: server-first, or an error (failure() says
  /// why: a malformed message, an unknown mechanism, a channel-binding mismatch).
  boost::system::result<std::string> server_first(std::string_view mechanism, std::string_view client_first);
  /// client-final: server-final ("v=..."), or auth_failed — failure() says whether the message
  /// was malformed (proof_failed() false) or the proof did not hold (proof_failed() true).
  boost::system::result<std::string> server_final(std::string_view client_final);
  const std::string& failure() const { return failure_; }
  bool proof_failed() const { return proof_failed_; }

 private:
  scram_verifier verifier_;
  bool mock_ = false;
  std::string binding_data_;
  std::string server_nonce_;
  bool plus_ = false;
  std::string cbind_header_;        ///< gs2 header as the client sent it ("n,,", "y,,", "p=tls-server-end-point,,")
  std::string nonce_;               ///< client nonce + server nonce
  std::string client_first_bare_, server_first_;
  bool first_done_ = false, final_done_ = false;
  std::string failure_;
  bool proof_failed_ = false;
};

/// The tls-server-end-point channel binding data (RFC 5929 section 4.1): the hash of the DER
/// certificate with the certificate's signature hash, where MD5 and SHA-1 become SHA-256.
/// Empty on an unparseable certificate or one whose signature algorithm has no known hash.
std::string tls_server_end_point(std::string_view der_certificate);

/// SASLprep (RFC 4013) as PostgreSQL applies it to SCRAM passwords (libpq and the server alike):
/// an ASCII password is unchanged; otherwise non-ASCII spaces become spaces, characters
/// "commonly mapped to nothing" go, the rest is NFKC-normalized (ICU's RFC 4013 profile). A
/// password that is not valid UTF-8, prepares to nothing, or holds a prohibited or unassigned
/// character or a bad mix of directions is used as its raw bytes, as PostgreSQL does.
std::string scram_prepare_password(std::string_view password);

}  // namespace walgate::protocol
