// Keys made by OpenSSL in the test, their public JWKs, and tokens signed with them: what an
// identity provider does, written here with OpenSSL's own calls so that walgate's verifier is
// checked against an independent signer.
#pragma once

#include "walgate/protocol/base64.hpp"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rsa.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

namespace walgate::test {

inline std::string b64u(std::string_view s) { return protocol::base64url_encode(s); }

inline std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct pkey_deleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using pkey_ptr = std::shared_ptr<EVP_PKEY>;

/// A signing key and its public JWK (members without braces' kid: added by jwk()).
struct test_key {
  std::string alg;        // the JWS alg it signs
  pkey_ptr pkey;          // null for HMAC
  std::string secret;     // HMAC
  std::string kty_members;   // "\"kty\":\"RSA\",\"n\":…,\"e\":…"
  std::size_t ec_size = 0;

  /// The public JWK, with kid when given (and alg when with_alg).
  std::string jwk(const std::string& kid = "", bool with_alg = false) const {
    std::string o = "{" + kty_members;
    if (!kid.empty()) o += ",\"kid\":\"" + kid + "\"";
    if (with_alg) o += ",\"alg\":\"" + alg + "\"";
    return o + ",\"use\":\"sig\"}";
  }
};

inline std::string bn_bytes(const BIGNUM* b, std::size_t pad = 0) {
  std::string out(static_cast<std::size_t>(BN_num_bytes(b)), '\0');
  BN_bn2bin(b, reinterpret_cast<unsigned char*>(out.data()));
  if (out.size() < pad) out.insert(0, pad - out.size(), '\0');
  return out;
}

inline std::string bn_param(EVP_PKEY* k, const char* name, std::size_t pad = 0) {
  BIGNUM* b = nullptr;
  if (EVP_PKEY_get_bn_param(k, name, &b) != 1) throw std::runtime_error(std::string("no ") + name);
  std::string out = bn_bytes(b, pad);
  BN_free(b);
  return out;
}

inline test_key hmac_key(const std::string& alg, std::string secret) {
  test_key k;
  k.alg = alg;
  k.secret = std::move(secret);
  k.kty_members = "\"kty\":\"oct\",\"k\":\"" + b64u(k.secret) + "\"";
  return k;
}

inline test_key rsa_key(const std::string& alg, unsigned bits = 2048) {
  test_key k;
  k.alg = alg;
  k.pkey = pkey_ptr(EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<std::size_t>(bits)), pkey_deleter{});
  k.kty_members = "\"kty\":\"RSA\",\"n\":\"" + b64u(bn_param(k.pkey.get(), OSSL_PKEY_PARAM_RSA_N)) + "\",\"e\":\"" +
                  b64u(bn_param(k.pkey.get(), OSSL_PKEY_PARAM_RSA_E)) + "\"";
  return k;
}

inline test_key ec_key(const std::string& alg) {
  test_key k;
  k.alg = alg;
  const char* group = alg == "ES256" ? "P-256" : alg == "ES384" ? "P-384" : "P-521";
  k.ec_size = alg == "ES256" ? 32 : alg == "ES384" ? 48 : 66;
  k.pkey = pkey_ptr(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", group), pkey_deleter{});
  k.kty_members = std::string("\"kty\":\"EC\",\"crv\":\"") + group + "\",\"x\":\"" +
                  b64u(bn_param(k.pkey.get(), OSSL_PKEY_PARAM_EC_PUB_X, k.ec_size)) + "\",\"y\":\"" +
                  b64u(bn_param(k.pkey.get(), OSSL_PKEY_PARAM_EC_PUB_Y, k.ec_size)) + "\"";
  return k;
}

inline test_key ed25519_key() {
  test_key k;
  k.alg = "EdDSA";
  k.pkey = pkey_ptr(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"), pkey_deleter{});
  unsigned char pub[32];
  std::size_t n = sizeof pub;
  EVP_PKEY_get_raw_public_key(k.pkey.get(), pub, &n);
  k.kty_members = "\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"x\":\"" + b64u(std::string(reinterpret_cast<char*>(pub), n)) + "\"";
  return k;
}

inline const EVP_MD* md_of(const std::string& alg) {
  if (alg.ends_with("256")) return EVP_sha256();
  if (alg.ends_with("384")) return EVP_sha384();
  return EVP_sha512();
}

/// The signature over input, as JWS carries it.
inline std::string sign_input(const test_key& k, const std::string& input) {
  const auto* data = reinterpret_cast<const unsigned char*>(input.data());
  if (k.alg.starts_with("HS")) {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    HMAC(md_of(k.alg), k.secret.data(), static_cast<int>(k.secret.size()), data, input.size(), mac, &n);
    return std::string(reinterpret_cast<char*>(mac), n);
  }
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_PKEY_CTX* pctx = nullptr;
  EVP_DigestSignInit(ctx, &pctx, k.alg == "EdDSA" ? nullptr : md_of(k.alg), nullptr, k.pkey.get());
  if (k.alg.starts_with("PS")) {
    EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING);
    EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST);
  }
  std::size_t n = 0;
  EVP_DigestSign(ctx, nullptr, &n, data, input.size());
  std::string sig(n, '\0');
  EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &n, data, input.size());
  sig.resize(n);
  EVP_MD_CTX_free(ctx);
  if (k.alg.starts_with("ES")) {   // DER -> r || s, each of the curve's size
    const auto* p = reinterpret_cast<const unsigned char*>(sig.data());
    ECDSA_SIG* es = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(sig.size()));
    std::string raw = bn_bytes(ECDSA_SIG_get0_r(es), k.ec_size) + bn_bytes(ECDSA_SIG_get0_s(es), k.ec_size);
    ECDSA_SIG_free(es);
    return raw;
  }
  return sig;
}

/// A compact JWS: header and payload as given (JSON text), signed with k.
inline std::string sign(const test_key& k, const std::string& header, const std::string& payload) {
  std::string input = b64u(header) + "." + b64u(payload);
  return input + "." + b64u(sign_input(k, input));
}

/// A token with the usual header ({"alg","typ","kid"?}) and claims (exp an hour away unless given).
inline std::string token(const test_key& k, const std::string& claims_members = "", const std::string& kid = "",
                         std::int64_t exp_in = 3600) {
  std::string header = "{\"alg\":\"" + k.alg + "\",\"typ\":\"JWT\"" + (kid.empty() ? "" : ",\"kid\":\"" + kid + "\"") + "}";
  std::string claims = "{\"sub\":\"user-1\",\"exp\":" + std::to_string(unix_now() + exp_in);
  if (!claims_members.empty()) claims += "," + claims_members;
  return sign(k, header, claims + "}");
}

}  // namespace walgate::test
