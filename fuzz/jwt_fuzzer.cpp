// Tokens and key files: untrusted bytes through the JWT verifier and the JWKS reader. The first
// byte picks what the rest is:
//   0  a token, verified against fixed keys (an HMAC secret, and RSA, P-256 and Ed25519 public
//      keys made once for this target, their private halves thrown away): never accepted —
//      nobody can sign for them (and the seeds are not signed with the secret).
//   1  a token's header.payload, signed here with the HMAC secret and verified: the claims path;
//      what is accepted has an exp in the future and an object of claims.
//   2  a JWKS document: read or refused with a reason; one that is read has a key.
// Never a crash, never an unbounded allocation.
#include "walgate/protocol/base64.hpp"
#include "walgate/proxy/jwt.hpp"

#include <boost/json/src.hpp>   // header-only Boost.JSON: the fuzz build links no Boost library

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

using namespace walgate;

namespace {

const char* secret = "fuzzing-secret-of-at-least-32-bytes!";

const proxy::jwt::key_set& keys() {
  static const proxy::jwt::key_set k = [] {
    std::string error;
    auto s = proxy::jwt::key_set::from_secret(secret, error);
    auto j = proxy::jwt::key_set::from_jwks(
        R"({"keys":[
{"kty":"EC","kid":"p256","crv":"P-256","x":"TNeccGamipEanHqBznl-yRE6O3yDFh49PFuImMbQg_w","y":"oMh-8x8VUKhcMcAB3PlJ0nRHUGJlQTZB4h72c9vELXo"},
{"kty":"OKP","kid":"ed","crv":"Ed25519","x":"gtz9dfViK8bpY8IQAuRZOHLiBnnq-LzWlvfl9Igiuk4"},
{"kty":"RSA","kid":"rsa","e":"AQAB","n":"rXwhOHqhByP5S_YntBybUEsqB5_wEZYd-snS4ZeRlSsWWLx7RBnqc5NdyOinC7kL43xMjJVa0bd6_kNGgWx0caiyYET1caqvvCAi8i8gq8u-T8oHJ5ITqHaIwD0Kocp7X7Jlo_coiMurg6tmRZ_F7tyD6xFQjnwoILi_V9-JmXc8D4A8mB7IjuJcvW6vNj5N-kWG9NWtBucNbpNCYaDdVOrrpWW5KgcbUmy3IwCjzBz9b0NE_EgC0YgrXeAOe__bb9EZ5wBe0jvQmOs4E5q0hD_2akIp4Mc3H0hCWF14_RyUhBVnm2BRCbEVed8Q4Xcx3F6kcMqOlxvydasGfrLdhw"}]})",
        error);
    if (!s || !j) std::abort();
    s->merge(std::move(*j));
    return std::move(*s);
  }();
  return k;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::int64_t now = 1'800'000'000;
  proxy::jwt::options o;
  std::string error;
  switch (data[0] % 3) {
    case 0: {
      auto v = proxy::jwt::verify(in, keys(), o, now, error);
      if (v || error.empty()) std::abort();
      break;
    }
    case 1: {
      // header.payload as given (base64url already), signed with the secret.
      unsigned char mac[EVP_MAX_MD_SIZE];
      unsigned n = 0;
      HMAC(EVP_sha256(), secret, 36, reinterpret_cast<const unsigned char*>(in.data()), in.size(), mac, &n);
      const std::string token = std::string(in) + "." + protocol::base64url_encode(std::string_view(reinterpret_cast<char*>(mac), n));
      auto v = proxy::jwt::verify(token, keys(), o, now, error);
      if (!v && error.empty()) std::abort();
      if (v && (!v->exp || *v->exp + o.leeway.count() <= now)) std::abort();
      break;
    }
    case 2: {
      auto s = proxy::jwt::key_set::from_jwks(in, error);
      if (s ? s->size() == 0 : error.empty()) std::abort();
      break;
    }
  }
  return 0;
}
