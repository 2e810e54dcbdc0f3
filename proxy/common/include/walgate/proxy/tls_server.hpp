// The server side TLS of walgate's listeners — HTTP (--listen) and the walsender
// (--replication-listen) — from --tls-cert/--tls-key: one policy for both. Included only where a
// listener is made (it brings in Asio's SSL).
#pragma once

#include <boost/asio/ssl/context.hpp>

#include <memory>
#include <string>

namespace walgate::proxy {

/// TLS 1.2 at least, and for 1.2 only forward-secret AEAD suites (Mozilla's "intermediate" list,
/// without DHE); TLS 1.3's suites are OpenSSL's. No renegotiation, no compression. nullptr with
/// error when the certificate chain or the key cannot be used, or do not match.
std::shared_ptr<boost::asio::ssl::context> make_server_tls(const std::string& cert_file, const std::string& key_file,
                                                           std::string& error);

/// The tls-server-end-point channel binding data of the context's certificate (RFC 5929; what
/// SCRAM-SHA-256-PLUS binds to): empty when it cannot be made.
std::string server_end_point(boost::asio::ssl::context& ctx);

}  // namespace walgate::proxy
