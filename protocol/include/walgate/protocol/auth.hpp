// Password authentication exchanges: MD5 and SCRAM-SHA-256 (RFC 5802 / RFC 7677), with
// tls-server-end-point channel binding (RFC 5929) for SCRAM-SHA-256-PLUS. Pure computation on
// bytes (OpenSSL's libcrypto for the hashes), no sockets: the connection drives the steps.
#pragma once

#include "walgate/protocol/error.hpp"

#include <boost/system/result.hpp>

#include <cstdint>
#include <string>
#include <string_view>

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
