#include "walgate/proxy/tls_server.hpp"

#include "walgate/protocol/auth.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

namespace walgate::proxy {

namespace asio = boost::asio;

std::shared_ptr<asio::ssl::context> make_server_tls(const std::string& cert_file, const std::string& key_file,
                                                    std::string& error) {
  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
  boost::system::error_code ec;
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1 |
                       asio::ssl::context::no_compression,
                   ec);
  SSL_CTX* native = ctx->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  SSL_CTX_set_options(native, SSL_OP_NO_RENEGOTIATION);
  if (SSL_CTX_set_cipher_list(native,
                              "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
                              "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305") != 1) {
    error = "--tls-cert/--tls-key: OpenSSL has none of the TLS 1.2 cipher suites walgate uses";
    return nullptr;
  }
  if (!ec) ctx->use_certificate_chain_file(cert_file, ec);
  if (!ec) ctx->use_private_key_file(key_file, asio::ssl::context::pem, ec);
  if (!ec && SSL_CTX_check_private_key(native) != 1) ec = asio::error::invalid_argument;
  ERR_clear_error();
  if (ec) {
    error = "--tls-cert " + cert_file + " / --tls-key " + key_file + ": " +
            (ec == asio::error::invalid_argument ? std::string("the key does not match the certificate") : ec.message());
    return nullptr;
  }
  return ctx;
}

std::string server_end_point(asio::ssl::context& ctx) {
  X509* cert = SSL_CTX_get0_certificate(ctx.native_handle());
  if (!cert) return {};
  unsigned char* der = nullptr;
  const int n = i2d_X509(cert, &der);
  if (n <= 0) return {};
  std::string out = protocol::tls_server_end_point(std::string_view(reinterpret_cast<const char*>(der), static_cast<std::size_t>(n)));
  OPENSSL_free(der);
  return out;
}

}  // namespace walgate::proxy
