// JWT verification (proxy/grants/src/jwt.cpp) and the authenticator (auth.cpp), with keys made by
// OpenSSL here: every algorithm, every rejection, the key files and their reloading, and where a
// request carries its token.
#include "jwt_helpers.hpp"
#include "temp_dir.hpp"

#include "walgate/protocol/base64.hpp"
#include "walgate/proxy/auth.hpp"
#include "walgate/proxy/jwt.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <thread>

using namespace walgate;
using namespace walgate::proxy;
using test::b64u;

namespace {

jwt::key_set jwks_of(const std::string& keys_json) {
  std::string error;
  auto s = jwt::key_set::from_jwks("{\"keys\":[" + keys_json + "]}", error);
  REQUIRE_MESSAGE(s, error);
  return std::move(*s);
}

std::string refusal(const std::string& token, const jwt::key_set& keys, jwt::options o = {}) {
  std::string error;
  auto v = jwt::verify(token, keys, o, test::unix_now(), error);
  CHECK_MESSAGE(!v, "accepted: " << token);
  CHECK(!error.empty());
  return error;
}

bool accepted(const std::string& token, const jwt::key_set& keys, jwt::options o = {}) {
  std::string error;
  auto v = jwt::verify(token, keys, o, test::unix_now(), error);
  INFO(error);
  return v.has_value();
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}

}  // namespace

TEST_CASE("base64url: strict, unpadded, canonical") {
  for (std::string s : std::vector<std::string>{"", "f", "fo", "foo", "foob", "fooba", "foobar", "\xff\xfe\xfd", std::string("\0\x01?>", 4)}) {
    auto e = protocol::base64url_encode(s);
    CHECK(e.find('=') == std::string::npos);
    auto d = protocol::base64url_decode(e);
    REQUIRE(d);
    CHECK(*d == s);
  }
  CHECK(protocol::base64url_encode("foobar") == "Zm9vYmFy");
  CHECK(protocol::base64url_encode("\xfb\xff") == "-_8");
  CHECK(*protocol::base64url_decode("-_8") == "\xfb\xff");
  CHECK_FALSE(protocol::base64url_decode("Zm9vYg=="));   // padding
  CHECK_FALSE(protocol::base64url_decode("+/8"));        // the standard alphabet
  CHECK_FALSE(protocol::base64url_decode("Zm9vY"));      // 1 mod 4
  CHECK_FALSE(protocol::base64url_decode("Zm9vYh"));     // unused bits set: not canonical
  CHECK_FALSE(protocol::base64url_decode("Zm9 v"));
}

TEST_CASE("every algorithm: a token signed by OpenSSL verifies; a changed bit anywhere does not") {
  std::vector<test::test_key> keys = {
      test::hmac_key("HS256", std::string(32, 'k')), test::hmac_key("HS384", std::string(48, 'k')),
      test::hmac_key("HS512", std::string(64, 'k')), test::rsa_key("RS256"), test::rsa_key("RS384"),
      test::rsa_key("RS512"), test::rsa_key("PS256"), test::rsa_key("PS384"), test::rsa_key("PS512"),
      test::ec_key("ES256"), test::ec_key("ES384"), test::ec_key("ES512"), test::ed25519_key()};
  for (const auto& k : keys) {
    INFO(k.alg);
    auto set = jwks_of(k.jwk("k1"));
    const std::string t = test::token(k, "\"tenant\":\"acme\",\"orgs\":[1,2]", "k1");
    std::string error;
    auto v = jwt::verify(t, set, {}, test::unix_now(), error);
    REQUIRE_MESSAGE(v, error);
    CHECK(v->subject == "user-1");
    CHECK(v->claims.at("tenant").as_string() == "acme");
    REQUIRE(v->exp);
    CHECK(*v->exp > test::unix_now());
    // Without kid: the key that verifies its alg is found.
    CHECK(accepted(test::token(k), set));
    // The signature, the payload, the header: one bit changed, refused.
    const auto d1 = t.find('.'), d2 = t.rfind('.');
    auto sig = *protocol::base64url_decode(t.substr(d2 + 1));
    sig[sig.size() / 2] ^= 1;
    CHECK(refusal(t.substr(0, d2 + 1) + b64u(sig), set) == "the token's signature is not valid");
    auto body = *protocol::base64url_decode(t.substr(d1 + 1, d2 - d1 - 1));
    body.replace(body.find("acme"), 4, "acmf");
    CHECK(refusal(t.substr(0, d1 + 1) + b64u(body) + t.substr(d2), set) == "the token's signature is not valid");
    // A signature cut short, or empty.
    CHECK(refusal(t.substr(0, d2 + 1) + b64u(sig.substr(0, sig.size() - 1)), set) == "the token's signature is not valid");
    CHECK(refusal(t.substr(0, d2 + 1), set) != "");
  }
  // A secret file's key verifies the HS ones too.
  for (const auto& k : std::vector<test::test_key>(keys.begin(), keys.begin() + 3)) {
    std::string error;
    auto s = jwt::key_set::from_secret(k.secret, error);
    REQUIRE(s);
    CHECK(accepted(test::token(k), *s));
  }
}

TEST_CASE("an RSA signature is exactly the modulus long: one with its leading zero byte cut is refused") {
  for (const char* alg : {"PS256", "RS256"}) {
    INFO(alg);
    auto k = test::rsa_key(alg);
    auto set = jwks_of(k.jwk());
    // Sign until a signature begins with a zero byte (1 in 256).
    std::string t, sig;
    for (int i = 0; i < 5000; ++i) {
      t = test::token(k, "\"n\":" + std::to_string(i));
      sig = *protocol::base64url_decode(t.substr(t.rfind('.') + 1));
      if (sig[0] == '\0') break;
    }
    REQUIRE(sig[0] == '\0');
    CHECK(accepted(t, set));
    CHECK(refusal(t.substr(0, t.rfind('.') + 1) + b64u(sig.substr(1)), set) == "the token's signature is not valid");
  }
}

TEST_CASE("a token without kid is tried with the first 4 keys of its alg; with kid, with its key wherever it is") {
  std::vector<test::test_key> ks;
  std::string doc;
  for (int i = 0; i < 5; ++i) {
    ks.push_back(test::ec_key("ES256"));
    doc += (i ? "," : "") + ks.back().jwk("k" + std::to_string(i));
  }
  auto set = jwks_of(doc);
  CHECK(accepted(test::token(ks[3]), set));
  CHECK(refusal(test::token(ks[4]), set) == "the token's signature is not valid");
  CHECK(accepted(test::token(ks[4], "", "k4"), set));
}

TEST_CASE("claims: exp, nbf, iat with the leeway; iss; aud as a string or a list") {
  auto k = test::hmac_key("HS256", std::string(40, 's'));
  auto set = jwks_of(k.jwk());
  jwt::options o;
  o.leeway = std::chrono::seconds(30);
  CHECK(refusal(test::token(k, "", "", -31), set, o) == "the token has expired");
  CHECK(accepted(test::token(k, "", "", -20), set, o));   // within the leeway
  o.leeway = std::chrono::seconds(0);
  CHECK(refusal(test::token(k, "", "", 0), set, o) == "the token has expired");   // exp is the first second it is not valid
  const auto now = test::unix_now();
  CHECK(refusal(test::token(k, "\"nbf\":" + std::to_string(now + 100)), set, o) == "the token is not valid yet (nbf)");
  CHECK(accepted(test::token(k, "\"nbf\":" + std::to_string(now - 1)), set, o));
  CHECK(refusal(test::token(k, "\"iat\":" + std::to_string(now + 100)), set, o) == "the token was issued in the future (iat)");
  CHECK(accepted(test::token(k, "\"iat\":" + std::to_string(now - 10) + ".5"), set, o));   // a fraction
  o.leeway = std::chrono::seconds(200);
  CHECK(accepted(test::token(k, "\"nbf\":" + std::to_string(now + 100)), set, o));
  CHECK(refusal(test::sign(k, R"({"alg":"HS256"})", R"({"exp":"tomorrow"})"), set) == "the token's exp is not a number");
  CHECK(refusal(test::sign(k, R"({"alg":"HS256"})", R"({"sub":"x"})"), set) ==
        "the token has no exp (an expiry time is required)");
  o.require_exp = false;
  CHECK(accepted(test::sign(k, R"({"alg":"HS256"})", R"({"sub":"x"})"), set, o));
  jwt::options iss;
  iss.issuer = "https://id.example";
  CHECK(accepted(test::token(k, R"("iss":"https://id.example")"), set, iss));
  CHECK(refusal(test::token(k, R"("iss":"https://evil.example")"), set, iss) == "the token's issuer (iss) is not the one accepted");
  CHECK(refusal(test::token(k), set, iss) == "the token's issuer (iss) is not the one accepted");
  jwt::options aud;
  aud.audience = "walgate";
  CHECK(accepted(test::token(k, R"("aud":"walgate")"), set, aud));
  CHECK(accepted(test::token(k, R"("aud":["api","walgate"])"), set, aud));
  CHECK(refusal(test::token(k, R"("aud":["api","web"])"), set, aud) == "the token is not for this audience (aud)");
  CHECK(refusal(test::token(k, R"("aud":"walgate2")"), set, aud) == "the token is not for this audience (aud)");
  CHECK(refusal(test::token(k), set, aud) == "the token is not for this audience (aud)");
}

TEST_CASE("alg: never none, never an HMAC with a public key, only what the key says") {
  auto rsa = test::rsa_key("RS256");
  auto set = jwks_of(rsa.jwk("r1"));
  const std::string claims = "{\"exp\":" + std::to_string(test::unix_now() + 60) + "}";
  CHECK(refusal(b64u(R"({"alg":"none"})") + "." + b64u(claims) + ".", set) == "unsigned tokens (alg none) are refused");
  CHECK(refusal(b64u(R"({"alg":"None"})") + "." + b64u(claims) + ".", set) == "alg None is not supported");
  // The classic confusion: HS256 "signed" with the RSA public key's bytes (its JWK, its n).
  for (const std::string& secret : {rsa.jwk("r1"), *protocol::base64url_decode(rsa.kty_members.substr(
                                                        rsa.kty_members.find("\"n\":\"") + 5,
                                                        rsa.kty_members.find("\",\"e\"") - rsa.kty_members.find("\"n\":\"") - 5))}) {
    auto forged = test::hmac_key("HS256", secret);
    CHECK(refusal(test::token(forged, "", "r1"), set) == "no key verifies alg HS256 with kid r1");
    CHECK(refusal(test::token(forged), set) == "no key verifies alg HS256");
  }
  // A key whose JWK names RS256 does not verify PS256 (same key type).
  auto pinned = jwks_of(rsa.jwk("r1", true));
  auto ps = rsa;
  ps.alg = "PS256";
  CHECK(accepted(test::token(rsa, "", "r1"), pinned));
  CHECK(refusal(test::token(ps, "", "r1"), pinned) == "no key verifies alg PS256 with kid r1");
  CHECK(accepted(test::token(ps, "", "r1"), set));   // (unpinned: RSA verifies PS256 too)
  // ES256 needs P-256: a P-384 key does not verify it.
  auto p384 = test::ec_key("ES384");
  auto wrong = p384;
  wrong.alg = "ES256";
  CHECK(refusal(test::token(wrong), jwks_of(p384.jwk())) == "no key verifies alg ES256");
  // HS512 needs a secret of 64 bytes.
  auto short_secret = test::hmac_key("HS512", std::string(40, 'x'));
  CHECK(refusal(test::token(short_secret), jwks_of(short_secret.jwk())) == "no key verifies alg HS512");
  CHECK(refusal(test::sign(rsa, R"({"alg":"RS256","crit":["exp"]})", claims), set) ==
        "the token's header has crit: no JWS extension is supported");
  CHECK(refusal(test::sign(rsa, R"({"alg":"XS256"})", claims), set) == "alg XS256 is not supported");
  CHECK(refusal(test::sign(rsa, R"({"typ":"JWT"})", claims), set) == "the token's header has no alg");
}

TEST_CASE("kid selects the key; an unknown kid is refused; several keys without kid are each tried") {
  auto a = test::ec_key("ES256"), b = test::ec_key("ES256"), c = test::ed25519_key();
  auto set = jwks_of(a.jwk("a") + "," + b.jwk("b") + "," + c.jwk("c"));
  CHECK(accepted(test::token(a, "", "a"), set));
  CHECK(accepted(test::token(b, "", "b"), set));
  CHECK(accepted(test::token(c, "", "c"), set));
  CHECK(refusal(test::token(a, "", "b"), set) == "the token's signature is not valid");
  CHECK(refusal(test::token(a, "", "zz\\\"\\n"), set) == "no key has the token's kid zz??");
  CHECK(accepted(test::token(b), set));   // no kid: a and b are tried
  auto other = test::ec_key("ES256");
  CHECK(refusal(test::token(other), set) == "the token's signature is not valid");
  CHECK(refusal(test::sign(a, R"({"alg":"ES256","kid":7})", "{}"), set) == "the token's kid is not a string");
}

TEST_CASE("malformed tokens: a clear reason, never a crash") {
  auto k = test::hmac_key("HS256", std::string(32, 'q'));
  auto set = jwks_of(k.jwk());
  const std::string good = test::token(k);
  CHECK(accepted(good, set));
  CHECK(refusal("", set) == "no token");
  CHECK(refusal("abc", set) == "not a JWT: three base64url parts separated by '.' are expected");
  CHECK(refusal("a.b", set) == "not a JWT: three base64url parts separated by '.' are expected");
  CHECK(refusal("a.b.c.d", set) == "not a JWT: three base64url parts separated by '.' are expected");
  CHECK(refusal("a.b.c.d.e", set) == "encrypted tokens (JWE) are not supported");
  CHECK(refusal("e30=.e30.", set) == "the token's header is not base64url");
  CHECK(refusal(b64u("{\"alg\":") + ".e30.", set) == "the token's header is not a JSON object");
  CHECK(refusal(b64u("[1]") + ".e30.", set) == "the token's header is not a JSON object");
  const auto d1 = good.find('.'), d2 = good.rfind('.');
  CHECK(refusal(good.substr(0, d1) + ".e30+." + good.substr(d2 + 1), set) == "the token's payload is not base64url");
  CHECK(refusal(good.substr(0, d2) + ".sig=", set) == "the token's signature is not base64url");
  CHECK(refusal(test::sign(k, R"({"alg":"HS256"})", "[1,2]"), set) == "the token's payload is not a JSON object");
  CHECK(refusal(test::sign(k, R"({"alg":"HS256"})", "{\"exp\":1"), set) == "the token's payload is not a JSON object");
  CHECK(refusal(std::string(jwt::max_token_bytes + 1, 'a'), set) == "the token is longer than 16384 bytes");
  std::string deep(100, '[');
  CHECK(refusal(test::sign(k, R"({"alg":"HS256"})", "{\"a\":" + deep + "}"), set) ==
        "the token's payload is not a JSON object");
  // Every prefix of a good token: refused, each with a reason.
  for (std::size_t n = 0; n < good.size(); ++n) {
    std::string error;
    CHECK_FALSE(jwt::verify(good.substr(0, n), set, {}, test::unix_now(), error));
    CHECK(!error.empty());
  }
}

TEST_CASE("JWKS documents: every key checked, each fault named") {
  auto bad = [](const std::string& doc) {
    std::string error;
    auto s = jwt::key_set::from_jwks(doc, error);
    CHECK_MESSAGE(!s, doc);
    return error;
  };
  CHECK(bad("") == "not a JWKS document: a JSON object with a \"keys\" array is expected");
  CHECK(bad("{\"keys\":{}}") == "not a JWKS document: a JSON object with a \"keys\" array is expected");
  CHECK(bad("{\"keys\":[]}") == "the JWKS document has no keys");
  CHECK(bad("{\"keys\":[1]}") == "key 0: not a JSON object");
  CHECK(bad("{\"keys\":[{\"kty\":\"XYZ\"}]}") == "key 0: kty XYZ is not supported (RSA, EC, OKP, oct)");
  CHECK(bad("{\"keys\":[{\"kid\":\"a\"}]}") == "key 0 (kid a): no kty");
  auto small = test::rsa_key("RS256", 1024);
  CHECK(bad("{\"keys\":[" + small.jwk("old") + "]}") == "key 0 (kid old): an RSA key of 1024 bits: at least 2048 are needed");
  auto ec = test::ec_key("ES256");
  std::string off = ec.jwk("e");
  auto ypos = off.find("\"y\":\"") + 5;
  off[ypos] = off[ypos] == 'A' ? 'B' : 'A';   // another y: not on the curve
  CHECK(bad("{\"keys\":[" + off + "]}") == "key 0 (kid e): (x, y) is not a point of P-256");
  CHECK(bad(R"({"keys":[{"kty":"EC","crv":"P-256","x":"AAAA","y":"AAAA"}]})") == "key 0: x and y of P-256 have 32 bytes each");
  CHECK(bad(R"({"keys":[{"kty":"EC","crv":"secp256k1","x":"AAAA","y":"AAAA"}]})") ==
        "key 0: crv is not P-256, P-384 or P-521");
  CHECK(bad(R"({"keys":[{"kty":"OKP","crv":"X25519","x":"AAAA"}]})") ==
        "key 0: crv is not Ed25519 (the one OKP curve supported)");
  CHECK(bad(R"({"keys":[{"kty":"oct","k":"c2hvcnQ"}]})") == "key 0: k (an HMAC secret) has fewer than 32 bytes");
  CHECK(bad(R"({"keys":[{"kty":"oct","k":"not base64url!"}]})") == "key 0: k is not base64url");
  CHECK(bad(R"({"keys":[{"kty":"RSA","e":"AQAB"}]})") == "key 0: no n");
  CHECK(bad(R"({"keys":[{"kty":"RSA","e":"AQAB","n":")" + b64u(std::string(1026, '\xff')) + "\"}]}") ==
        "key 0: an RSA key of 8208 bits: at most 8192");
  auto rsa = test::rsa_key("RS256");
  std::string enc = rsa.jwk("r");
  enc.replace(enc.find("\"use\":\"sig\""), 11, "\"use\":\"enc\"");
  CHECK(bad("{\"keys\":[" + enc + "]}") == "key 0 (kid r): use is not \"sig\"");
  std::string mismatched = rsa.jwk("r");
  mismatched.insert(1, "\"alg\":\"ES256\",");
  CHECK(bad("{\"keys\":[" + mismatched + "]}") == "key 0 (kid r): alg ES256 does not go with this key");
  // A good key after a bad one does not save the document: it is refused whole.
  CHECK(bad("{\"keys\":[" + rsa.jwk("r") + ",{\"kty\":\"oct\"}]}") == "key 1: no k");
  // A JWK with its private members (as some providers' files have): they are ignored, the public
  // key verifies.
  auto ed = test::ed25519_key();
  std::string with_private = ed.jwk("p");
  with_private.insert(1, "\"d\":\"" + b64u(std::string(32, 'p')) + "\",");
  std::string error;
  auto priv = jwt::key_set::from_jwks("{\"keys\":[" + with_private + "]}", error);
  REQUIRE_MESSAGE(priv, error);
  CHECK(accepted(test::token(ed, "", "p"), *priv));
  CHECK_FALSE(jwt::key_set::from_secret("too short", error));
  CHECK(error == "the HMAC secret has 9 bytes: at least 32 are needed (RFC 7518 3.2)");
}

TEST_CASE("RSA keys are checked as they are read: e odd, at least 3, at most 256 bits; n and e by OpenSSL's public check") {
  auto rsa = test::rsa_key("RS256");
  const std::string n_bytes = test::bn_param(rsa.pkey.get(), OSSL_PKEY_PARAM_RSA_N);
  auto doc = [](const std::string& n, const std::string& e) {
    return R"({"keys":[{"kty":"RSA","kid":"r","n":")" + b64u(n) + R"(","e":")" + e + R"("}]})";
  };
  auto refused = [](const std::string& d) {
    std::string error;
    auto s = jwt::key_set::from_jwks(d, error);
    CHECK_MESSAGE(!s, d);
    return error;
  };
  // e = 1 ("AQ"): every message is its own signature, anyone would sign any token. Refused, as
  // are an even e (no RSA key), e = 0 and a 1 with leading zero bytes (the same number).
  const std::string odd = ": it must be odd and at least 3 (65537 is usual)";
  CHECK(refused(doc(n_bytes, "AQ")) == "key 0 (kid r): e (the public exponent) is 1" + odd);
  CHECK(refused(doc(n_bytes, "AAE")) == "key 0 (kid r): e (the public exponent) is 1" + odd);
  CHECK(refused(doc(n_bytes, "Ag")) == "key 0 (kid r): e (the public exponent) is 2" + odd);
  CHECK(refused(doc(n_bytes, "AA")) == "key 0 (kid r): e (the public exponent) is 0" + odd);
  CHECK(refused(doc(n_bytes, b64u(std::string("\x01\x00\x00", 3)))) == "key 0 (kid r): e (the public exponent) is 65536" + odd);
  CHECK(refused(doc(n_bytes, b64u(std::string(8, '\x02')))) == "key 0 (kid r): e (the public exponent) is even" + odd);
  // Over 256 bits (SP 800-56B's bound): refused, odd or not.
  CHECK(refused(doc(n_bytes, b64u("\x01" + std::string(31, '\0') + "\x01"))) ==
        "key 0 (kid r): e (the public exponent) has 257 bits: at most 256");
  // n refused by EVP_PKEY_public_check: even, or with a small factor (n times 3).
  std::string even = n_bytes;
  even.back() = static_cast<char>(even.back() & ~1);
  const std::string not_a_key = "key 0 (kid r): n and e are not an RSA public key";
  auto e1 = refused(doc(even, "AQAB"));
  CHECK_MESSAGE(e1.starts_with(not_a_key), e1);
  CHECK_MESSAGE(e1.ends_with(": EVP_PKEY_public_check refused them"), e1);
  BIGNUM* tripled = BN_bin2bn(reinterpret_cast<const unsigned char*>(n_bytes.data()), static_cast<int>(n_bytes.size()), nullptr);
  REQUIRE(tripled != nullptr);
  REQUIRE(BN_mul_word(tripled, 3) == 1);
  const std::string by_three = test::bn_bytes(tripled);
  BN_free(tripled);
  auto e2 = refused(doc(by_three, "AQAB"));
  CHECK_MESSAGE(e2.starts_with(not_a_key), e2);
  // The usual e = 65537 ("AQAB") and the smallest one allowed, 3: read; a token of the 65537
  // key verifies (and with e = 3 the same n verifies nothing of that key's: another key).
  std::string error;
  auto three = jwt::key_set::from_jwks(doc(n_bytes, "Aw"), error);
  REQUIRE_MESSAGE(three, error);
  auto usual = jwt::key_set::from_jwks(doc(n_bytes, "AQAB"), error);
  REQUIRE_MESSAGE(usual, error);
  CHECK(accepted(test::token(rsa, "", "r"), *usual));
  CHECK(refusal(test::token(rsa, "", "r"), *three) == "the token's signature is not valid");
  for (const char* alg : {"PS256", "RS512"}) {
    auto k = test::rsa_key(alg);
    CHECK(accepted(test::token(k, "", "k"), jwks_of(k.jwk("k"))));
  }
  // EC keys (checked by the same OpenSSL call) and Ed25519 ones are read and verify as before.
  for (const char* alg : {"ES256", "ES384", "ES512"}) {
    auto k = test::ec_key(alg);
    CHECK(accepted(test::token(k, "", "e"), jwks_of(k.jwk("e", true))));
  }
  auto ed = test::ed25519_key();
  CHECK(accepted(test::token(ed, "", "d"), jwks_of(ed.jwk("d"))));
}

TEST_CASE("the authenticator: key files, reloaded when they change; a bad reload keeps the keys in use") {
  test::temp_dir dir;
  auto a = test::ec_key("ES256"), b = test::ed25519_key();
  auto secret = test::hmac_key("HS256", std::string(32, 'z'));
  const auto jwks = dir.path / "keys.json", sec = dir.path / "secret";
  write_file(jwks, "{\"keys\":[" + a.jwk("a") + "]}");
  write_file(sec, secret.secret + "\n");   // (a trailing newline is not part of the secret)
  auth_options o;
  o.jwks_file = jwks;
  o.secret_file = sec;
  authenticator auth(o);
  std::string error;
  REQUIRE_MESSAGE(auth.reload(error), error);
  CHECK(auth.keys() == 2);
  CHECK(auth.verify(test::token(a, "", "a"), error));
  CHECK(auth.verify(test::token(secret), error));
  CHECK_FALSE(auth.verify(test::token(b, "", "b"), error));
  CHECK(error == "no key has the token's kid b");
  CHECK(auth.reload_if_changed(error) == 0);
  // Rotation: b replaces a.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  write_file(jwks, "{\"keys\":[" + b.jwk("b") + "]}");
  CHECK(auth.reload_if_changed(error) == 1);
  CHECK(auth.verify(test::token(b, "", "b"), error));
  CHECK_FALSE(auth.verify(test::token(a, "", "a"), error));
  // A broken file: the keys in use stay, and it is said once per change.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  write_file(jwks, "{\"keys\":[");
  CHECK(auth.reload_if_changed(error) == -1);
  CHECK(error.find("not a JWKS document") != std::string::npos);
  CHECK(auth.reload_if_changed(error) == 0);
  CHECK(auth.verify(test::token(b, "", "b"), error));
  CHECK(auth.reload_failures() == 1);
  std::filesystem::remove(sec);
  CHECK(auth.reload_if_changed(error) == -1);
  CHECK(error.find("secret") != std::string::npos);
  CHECK(auth.verify(test::token(secret), error));
  CHECK(auth.accepted() == 5);
}

TEST_CASE("where a request carries its token: one place, the Bearer scheme") {
  auto t = [](std::string_view a, std::string_view q, std::string_view p) { return find_bearer(a, q, p); };
  CHECK(t("Bearer abc.def.ghi", "", "").token == "abc.def.ghi");
  CHECK(t("bearer   abc.def.ghi ", "", "").token == "abc.def.ghi");
  CHECK(t("BEARER x", "", "").token == "x");
  CHECK(t("Basic dXNlcjpwYXNz", "", "").token.empty());
  CHECK(t("Basic dXNlcjpwYXNz", "", "").error.empty());
  CHECK(t("Bearer", "", "").error == "malformed Authorization header: use Authorization: Bearer <token>");
  CHECK(t("Bearerx", "", "").token.empty());
  CHECK(t("Bearer ", "", "").error == "malformed Authorization header: use Authorization: Bearer <token>");
  CHECK(t("Bearer a b", "", "").error == "malformed Authorization header: use Authorization: Bearer <token>");
  CHECK(t("", "q.q.q", "").token == "q.q.q");
  CHECK(t("", "", "walgate, bearer.p.p.p").token == "p.p.p");
  CHECK(t("", "", "bearer.p.p.p,walgate").token == "p.p.p");
  CHECK(t("", "", "walgate").token.empty());
  CHECK(t("", "", "bearer.a, bearer.b").error == "more than one bearer.<token> subprotocol offered");
  CHECK(t("Bearer x", "y", "").error.find("more than one way") != std::string::npos);
  CHECK(t("", "y", "walgate, bearer.x").error.find("more than one way") != std::string::npos);
  CHECK(offers_subprotocol("a, walgate ,b", "walgate"));
  CHECK_FALSE(offers_subprotocol("walgatex", "walgate"));
}
