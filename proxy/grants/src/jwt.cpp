// JWT verification (jwt.hpp): the compact JWS split and decoded strictly, the key picked by
// kid and alg, the signature checked by OpenSSL (HMAC, EVP_DigestVerify), then the claims.
#include "walgate/proxy/jwt.hpp"

#include "walgate/protocol/base64.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>
#include <openssl/rsa.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace walgate::proxy::jwt {

namespace json = boost::json;

namespace {

enum class family { hmac, rsa, rsa_pss, ecdsa, eddsa };
enum class kty { oct, rsa, ec, okp };

struct alg_info {
  std::string_view name;
  family fam;
  const EVP_MD* (*md)();
  std::size_t size;           // HMAC: the shortest secret; ECDSA: bytes of r and of s
  std::string_view curve;     // ECDSA: the JWK crv
};

constexpr alg_info algs[] = {
    {"HS256", family::hmac, EVP_sha256, 32, {}},     {"HS384", family::hmac, EVP_sha384, 48, {}},
    {"HS512", family::hmac, EVP_sha512, 64, {}},     {"RS256", family::rsa, EVP_sha256, 0, {}},
    {"RS384", family::rsa, EVP_sha384, 0, {}},       {"RS512", family::rsa, EVP_sha512, 0, {}},
    {"PS256", family::rsa_pss, EVP_sha256, 0, {}},   {"PS384", family::rsa_pss, EVP_sha384, 0, {}},
    {"PS512", family::rsa_pss, EVP_sha512, 0, {}},   {"ES256", family::ecdsa, EVP_sha256, 32, "P-256"},
    {"ES384", family::ecdsa, EVP_sha384, 48, "P-384"}, {"ES512", family::ecdsa, EVP_sha512, 66, "P-521"},
    {"EdDSA", family::eddsa, nullptr, 0, {}},
};

const alg_info* find_alg(std::string_view name) {
  for (const auto& a : algs)
    if (a.name == name) return &a;
  return nullptr;
}

/// A name from the token or the key file, safe to put in a message and a header: printable
/// ASCII without quotes or backslashes, at most 64 characters.
std::string shown(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out.push_back(c > 0x20 && c < 0x7f && c != '"' && c != '\\' ? c : '?');
  if (s.size() > 64) out += "...";
  return out;
}

struct bn_deleter {
  void operator()(BIGNUM* b) const { BN_free(b); }
};
using bn_ptr = std::unique_ptr<BIGNUM, bn_deleter>;

bn_ptr to_bn(std::string_view bytes) {
  return bn_ptr(BN_bin2bn(reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()), nullptr));
}

/// Builds a public key of type name ("RSA", "EC") from params.
EVP_PKEY* from_params(const char* name, OSSL_PARAM_BLD* bld) {
  EVP_PKEY* pkey = nullptr;
  OSSL_PARAM* params = OSSL_PARAM_BLD_to_param(bld);
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_from_name(nullptr, name, nullptr);
  if (params && ctx && EVP_PKEY_fromdata_init(ctx) == 1) EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params);
  EVP_PKEY_CTX_free(ctx);
  OSSL_PARAM_free(params);
  return pkey;
}

/// OpenSSL's check of a public key (EVP_PKEY_public_check): an EC point on its curve and not at
/// infinity; an RSA n odd, without a factor under 752, not a prime or a prime's power, and e odd
/// and above 1 (SP 800-56B 6.4.2.1, OpenSSL 3's non-FIPS bounds). False with reason (when given)
/// OpenSSL's reason for the refusal, or empty when it gave none.
bool public_check(EVP_PKEY* pkey, std::string* reason = nullptr) {
  ERR_clear_error();   // (the reason read below is this check's, not an earlier key's)
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_from_pkey(nullptr, pkey, nullptr);
  const bool ok = ctx && EVP_PKEY_public_check(ctx) == 1;
  EVP_PKEY_CTX_free(ctx);
  if (!ok && reason) {
    const unsigned long e = ERR_peek_last_error();
    const char* r = e ? ERR_reason_error_string(e) : nullptr;
    *reason = r ? r : "";
  }
  return ok;
}

const json::string* string_member(const json::object& o, std::string_view name) {
  const auto* v = o.if_contains(name);
  return v ? v->if_string() : nullptr;
}

/// A NumericDate (RFC 7519 section 2) as whole seconds; nullopt when not a number.
std::optional<std::int64_t> numeric_date(const json::value& v) {
  constexpr auto lo = std::numeric_limits<std::int64_t>::min() / 2, hi = std::numeric_limits<std::int64_t>::max() / 2;
  if (v.is_int64()) return std::clamp<std::int64_t>(v.get_int64(), lo, hi);
  if (v.is_uint64()) return v.get_uint64() > static_cast<std::uint64_t>(hi) ? hi : static_cast<std::int64_t>(v.get_uint64());
  if (v.is_double()) {
    double d = std::floor(v.get_double());
    if (d <= static_cast<double>(lo)) return lo;
    if (d >= static_cast<double>(hi)) return hi;
    return static_cast<std::int64_t>(d);
  }
  return std::nullopt;
}

/// Leaves the thread's OpenSSL error queue empty however the scope ends (a failed verification
/// or key import queues errors).
struct clear_errors {
  ~clear_errors() { ERR_clear_error(); }
};

/// Keys a token without kid is tried with, at most: each is a signature check on the event loop.
constexpr int max_untargeted_keys = 4;

std::optional<json::object> parse_object(std::string_view text) {
  json::parse_options po;
  po.max_depth = 32;
  boost::system::error_code ec;
  json::value v = json::parse(text, ec, {}, po);
  if (ec || !v.is_object()) return std::nullopt;
  return std::move(v.as_object());
}

}  // namespace

struct key_set::key {
  std::string kid;
  bool has_kid = false;
  kty type = kty::oct;
  std::string alg;      // empty: any alg its type verifies
  std::string secret;   // oct
  std::string curve;    // EC: P-256, P-384, P-521
  EVP_PKEY* pkey = nullptr;
  key() = default;
  key(const key&) = delete;
  key& operator=(const key&) = delete;
  ~key() { EVP_PKEY_free(pkey); }

  bool verifies(const alg_info& a) const {
    if (!alg.empty() && alg != a.name) return false;
    switch (a.fam) {
      case family::hmac: return type == kty::oct && secret.size() >= a.size;
      case family::rsa:
      case family::rsa_pss: return type == kty::rsa;
      case family::ecdsa: return type == kty::ec && curve == a.curve;
      case family::eddsa: return type == kty::okp;
    }
    return false;
  }
};

key_set::key_set() = default;
key_set::~key_set() = default;
key_set::key_set(key_set&&) noexcept = default;
key_set& key_set::operator=(key_set&&) noexcept = default;

void key_set::merge(key_set&& other) {
  for (auto& k : other.keys_) keys_.push_back(std::move(k));
  other.keys_.clear();
}

std::optional<key_set> key_set::from_secret(std::string_view secret, std::string& error) {
  if (secret.size() < 32) {
    error = "the HMAC secret has " + std::to_string(secret.size()) + " bytes: at least 32 are needed (RFC 7518 3.2)";
    return std::nullopt;
  }
  auto k = std::make_shared<key>();
  k->type = kty::oct;
  k->secret = std::string(secret);
  key_set s;
  s.keys_.push_back(std::move(k));
  return s;
}

std::optional<key_set> key_set::from_jwks(std::string_view text, std::string& error) {
  clear_errors guard;
  auto doc = parse_object(text);
  const json::array* list = doc ? (doc->if_contains("keys") ? doc->at("keys").if_array() : nullptr) : nullptr;
  if (!list) {
    error = "not a JWKS document: a JSON object with a \"keys\" array is expected";
    return std::nullopt;
  }
  if (list->size() > max_keys) {
    error = "the JWKS document has " + std::to_string(list->size()) + " keys; at most " + std::to_string(max_keys);
    return std::nullopt;
  }
  key_set s;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const json::object* o = (*list)[i].if_object();
    std::string name = "key " + std::to_string(i);
    auto fail = [&](std::string why) {
      error = name + ": " + why;
      return std::nullopt;
    };
    if (!o) return fail("not a JSON object");
    auto k = std::make_shared<key>();
    if (const auto* kid = o->if_contains("kid")) {
      if (!kid->is_string()) return fail("kid is not a string");
      k->kid = std::string(kid->get_string());
      k->has_kid = true;
      name += " (kid " + shown(k->kid) + ")";
    }
    if (const auto* use = o->if_contains("use"); use && !(use->is_string() && use->get_string() == "sig"))
      return fail("use is not \"sig\"");
    const auto* ty = string_member(*o, "kty");
    if (!ty) return fail("no kty");
    // The base64url members, each required.
    auto member = [&](std::string_view m, std::string& out) -> bool {
      const auto* v = string_member(*o, m);
      if (!v) {
        error = name + ": no " + std::string(m);
        return false;
      }
      auto d = protocol::base64url_decode(*v);
      if (!d || d->empty()) {
        error = name + ": " + std::string(m) + " is not base64url";
        return false;
      }
      out = std::move(*d);
      return true;
    };
    if (*ty == "oct") {
      k->type = kty::oct;
      if (!member("k", k->secret)) return std::nullopt;
      if (k->secret.size() < 32) return fail("k (an HMAC secret) has fewer than 32 bytes");
    } else if (*ty == "RSA") {
      k->type = kty::rsa;
      std::string n, e;
      if (!member("n", n) || !member("e", e)) return std::nullopt;
      bn_ptr bn = to_bn(n), be = to_bn(e);
      OSSL_PARAM_BLD* bld = OSSL_PARAM_BLD_new();
      if (bld && bn && be) {
        OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn.get());
        OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, be.get());
        k->pkey = from_params("RSA", bld);
      }
      OSSL_PARAM_BLD_free(bld);
      if (!k->pkey) return fail("not an RSA public key");
      if (EVP_PKEY_get_bits(k->pkey) < 2048)
        return fail("an RSA key of " + std::to_string(EVP_PKEY_get_bits(k->pkey)) + " bits: at least 2048 are needed");
      if (EVP_PKEY_get_bits(k->pkey) > 8192)
        return fail("an RSA key of " + std::to_string(EVP_PKEY_get_bits(k->pkey)) + " bits: at most 8192");
      // The public exponent, which OpenSSL's import does not check: with e = 1 a message's padded
      // encoding is its own signature (anyone forges any token), an even e is no RSA key, and one
      // over 256 bits (SP 800-56B's bound; 65537 is usual) only makes each verification dearer,
      // up to a signing's cost. (be is set: the key was built from it.)
      if (const int e_bits = BN_num_bits(be.get()); e_bits > 256)
        return fail("e (the public exponent) has " + std::to_string(e_bits) + " bits: at most 256");
      if (!BN_is_odd(be.get()) || BN_is_one(be.get()))
        return fail("e (the public exponent) is " +
                    (BN_num_bits(be.get()) <= 32 ? std::to_string(BN_get_word(be.get())) : std::string("even")) +
                    ": it must be odd and at least 3 (65537 is usual)");
      // Then OpenSSL's own check of n and e (after the size bounds: its primality test of n costs
      // a modular exponentiation of n's size, paid once per key and reload).
      if (std::string why; !public_check(k->pkey, &why))
        return fail("n and e are not an RSA public key" + (why.empty() ? std::string() : " (" + why + ")") +
                    ": EVP_PKEY_public_check refused them");
    } else if (*ty == "EC") {
      k->type = kty::ec;
      const auto* crv = string_member(*o, "crv");
      const char* group = nullptr;
      std::size_t size = 0;
      if (crv && *crv == "P-256") group = "prime256v1", size = 32;
      else if (crv && *crv == "P-384") group = "secp384r1", size = 48;
      else if (crv && *crv == "P-521") group = "secp521r1", size = 66;
      else return fail("crv is not P-256, P-384 or P-521");
      k->curve = std::string(*crv);
      std::string x, y;
      if (!member("x", x) || !member("y", y)) return std::nullopt;
      if (x.size() != size || y.size() != size)
        return fail("x and y of " + k->curve + " have " + std::to_string(size) + " bytes each");
      std::string pub = "\x04" + x + y;   // the uncompressed point
      OSSL_PARAM_BLD* bld = OSSL_PARAM_BLD_new();
      if (bld) {
        OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, group, 0);
        OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, pub.data(), pub.size());
        k->pkey = from_params("EC", bld);
      }
      OSSL_PARAM_BLD_free(bld);
      if (!k->pkey || !public_check(k->pkey)) return fail("(x, y) is not a point of " + k->curve);
    } else if (*ty == "OKP") {
      k->type = kty::okp;
      const auto* crv = string_member(*o, "crv");
      if (!crv || *crv != "Ed25519") return fail("crv is not Ed25519 (the one OKP curve supported)");
      std::string x;
      if (!member("x", x)) return std::nullopt;
      if (x.size() != 32) return fail("x of Ed25519 has 32 bytes");
      k->pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(x.data()),
                                            x.size());
      if (!k->pkey) return fail("not an Ed25519 public key");
    } else {
      return fail("kty " + shown(*ty) + " is not supported (RSA, EC, OKP, oct)");
    }
    if (const auto* a = o->if_contains("alg")) {
      const alg_info* info = a->is_string() ? find_alg(a->get_string()) : nullptr;
      if (!info) return fail("alg is not one walgate verifies");
      k->alg = std::string(info->name);
      if (!k->verifies(*info)) return fail("alg " + k->alg + " does not go with this key");
    }
    s.keys_.push_back(std::move(k));
  }
  if (s.keys_.empty()) {
    error = "the JWKS document has no keys";
    return std::nullopt;
  }
  return s;
}

namespace {

bool verify_with(const key_set::key& k, const alg_info& a, std::string_view input, std::string_view sig);

}  // namespace

std::optional<verified> verify(std::string_view token, const key_set& keys, const options& o, std::int64_t now,
                               std::string& error, bool* signed_ok) {
  if (signed_ok) *signed_ok = false;
  auto fail = [&](std::string why) {
    error = std::move(why);
    return std::nullopt;
  };
  if (token.empty()) return fail("no token");
  if (token.size() > max_token_bytes)
    return fail("the token is longer than " + std::to_string(max_token_bytes) + " bytes");
  const auto d1 = token.find('.');
  const auto d2 = d1 == std::string_view::npos ? d1 : token.find('.', d1 + 1);
  if (d2 == std::string_view::npos) return fail("not a JWT: three base64url parts separated by '.' are expected");
  if (token.find('.', d2 + 1) != std::string_view::npos) {
    if (std::count(token.begin(), token.end(), '.') == 4) return fail("encrypted tokens (JWE) are not supported");
    return fail("not a JWT: three base64url parts separated by '.' are expected");
  }
  auto head_text = protocol::base64url_decode(token.substr(0, d1));
  if (!head_text) return fail("the token's header is not base64url");
  auto head = parse_object(*head_text);
  if (!head) return fail("the token's header is not a JSON object");
  const auto* alg_name = string_member(*head, "alg");
  if (!alg_name) return fail("the token's header has no alg");
  if (*alg_name == "none") return fail("unsigned tokens (alg none) are refused");
  const alg_info* alg = find_alg(*alg_name);
  if (!alg) return fail("alg " + shown(*alg_name) + " is not supported");
  if (head->contains("crit")) return fail("the token's header has crit: no JWS extension is supported");
  std::optional<std::string> kid;
  if (const auto* v = head->if_contains("kid")) {
    if (!v->is_string()) return fail("the token's kid is not a string");
    kid = std::string(v->get_string());
  }
  auto body_text = protocol::base64url_decode(token.substr(d1 + 1, d2 - d1 - 1));
  if (!body_text) return fail("the token's payload is not base64url");
  auto sig = protocol::base64url_decode(token.substr(d2 + 1));
  if (!sig) return fail("the token's signature is not base64url");

  // The key: the one(s) the token names, else the first few keys that verify its alg.
  bool named = false, suitable = false, good = false;
  int tried = 0;
  for (const auto& k : keys.keys()) {
    if (kid && !(k->has_kid && k->kid == *kid)) continue;
    named = true;
    if (!k->verifies(*alg)) continue;
    suitable = true;
    if (!kid && ++tried > max_untargeted_keys) break;
    if (verify_with(*k, *alg, token.substr(0, d2), *sig)) {
      good = true;
      break;
    }
  }
  if (kid && !named) return fail("no key has the token's kid " + shown(*kid));
  if (!suitable) return fail("no key verifies alg " + std::string(alg->name) + (kid ? " with kid " + shown(*kid) : ""));
  if (!good) return fail("the token's signature is not valid");
  if (signed_ok) *signed_ok = true;

  auto claims = parse_object(*body_text);
  if (!claims) return fail("the token's payload is not a JSON object");
  verified out;
  const std::int64_t leeway = o.leeway.count();
  if (const auto* v = claims->if_contains("exp")) {
    auto exp = numeric_date(*v);
    if (!exp) return fail("the token's exp is not a number");
    if (now - leeway >= *exp) return fail("the token has expired");
    out.exp = exp;
  } else if (o.require_exp) {
    return fail("the token has no exp (an expiry time is required)");
  }
  if (const auto* v = claims->if_contains("nbf")) {
    auto nbf = numeric_date(*v);
    if (!nbf) return fail("the token's nbf is not a number");
    if (now + leeway < *nbf) return fail("the token is not valid yet (nbf)");
  }
  if (const auto* v = claims->if_contains("iat")) {
    auto iat = numeric_date(*v);
    if (!iat) return fail("the token's iat is not a number");
    if (now + leeway < *iat) return fail("the token was issued in the future (iat)");
  }
  if (!o.issuer.empty()) {
    const auto* iss = string_member(*claims, "iss");
    if (!iss || *iss != o.issuer) return fail("the token's issuer (iss) is not the one accepted");
  }
  if (!o.audience.empty()) {
    bool ok = false;
    if (const auto* aud = claims->if_contains("aud")) {
      if (aud->is_string()) ok = aud->get_string() == o.audience;
      else if (aud->is_array())
        for (const auto& a : aud->get_array()) ok = ok || (a.is_string() && a.get_string() == o.audience);
    }
    if (!ok) return fail("the token is not for this audience (aud)");
  }
  if (const auto* sub = string_member(*claims, "sub")) out.subject = std::string(*sub);
  out.claims = std::move(*claims);
  return out;
}

namespace {

bool verify_with(const key_set::key& k, const alg_info& a, std::string_view input, std::string_view sig) {
  clear_errors guard;
  const auto* data = reinterpret_cast<const unsigned char*>(input.data());
  // RSA signatures have exactly the modulus's length (RFC 8017 8.1.2, 8.2.2): OpenSSL's PSS
  // path would take one with its leading zero bytes cut, a second spelling of the same token.
  if ((a.fam == family::rsa || a.fam == family::rsa_pss) && sig.size() != static_cast<std::size_t>(EVP_PKEY_get_size(k.pkey)))
    return false;
  if (a.fam == family::hmac) {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (!HMAC(a.md(), k.secret.data(), static_cast<int>(k.secret.size()), data, input.size(), mac, &n)) return false;
    return sig.size() == n && CRYPTO_memcmp(mac, sig.data(), n) == 0;
  }
  std::string der;
  std::string_view s = sig;
  if (a.fam == family::ecdsa) {
    // JWS carries r and s as fixed-size big-endian integers (RFC 7518 3.4); OpenSSL verifies DER.
    if (sig.size() != 2 * a.size) return false;
    ECDSA_SIG* es = ECDSA_SIG_new();
    bn_ptr r = to_bn(sig.substr(0, a.size)), ss = to_bn(sig.substr(a.size));
    if (!es || !r || !ss || ECDSA_SIG_set0(es, r.get(), ss.get()) != 1) {
      ECDSA_SIG_free(es);
      return false;
    }
    r.release();
    ss.release();
    int len = i2d_ECDSA_SIG(es, nullptr);
    if (len > 0) {
      der.resize(static_cast<std::size_t>(len));
      auto* p = reinterpret_cast<unsigned char*>(der.data());
      i2d_ECDSA_SIG(es, &p);
    }
    ECDSA_SIG_free(es);
    if (der.empty()) return false;
    s = der;
  }
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_PKEY_CTX* pctx = nullptr;
  bool ok = ctx && EVP_DigestVerifyInit(ctx, &pctx, a.md ? a.md() : nullptr, nullptr, k.pkey) == 1;
  if (ok && a.fam == family::rsa_pss)
    ok = EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) == 1 &&
         EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) == 1 &&
         EVP_PKEY_CTX_set_rsa_mgf1_md(pctx, a.md()) == 1;
  if (ok)
    ok = EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(s.data()), s.size(), data, input.size()) == 1;
  EVP_MD_CTX_free(ctx);
  return ok;
}

}  // namespace

}  // namespace walgate::proxy::jwt
