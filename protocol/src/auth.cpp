#include "walgate/protocol/auth.hpp"

#include "walgate/protocol/base64.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/objects.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <unicode/usprep.h>
#include <unicode/ustring.h>

#include <array>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace walgate::protocol {

namespace {

std::string hex(const unsigned char* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(digits[p[i] >> 4]);
    out.push_back(digits[p[i] & 15]);
  }
  return out;
}

std::string md5_hex(std::string_view in) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(in.data(), in.size(), md, &len, EVP_md5(), nullptr);
  return hex(md, len);
}

using digest = std::array<unsigned char, 32>;

digest hmac_sha256(std::string_view key, std::string_view msg) {
  digest out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len);
  return out;
}

std::string_view view(const digest& d) { return {reinterpret_cast<const char*>(d.data()), d.size()}; }

/// Splits "a=..,b=..," attributes; returns the value of attribute `name` in position order.
struct attr_reader {
  std::string_view rest;
  bool next(char& name, std::string_view& value) {
    if (rest.empty()) return false;
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item.size() < 2 || item[1] != '=') return false;
    name = item[0];
    value = item.substr(2);
    return true;
  }
};

}  // namespace

std::string md5_password_response(std::string_view user, std::string_view password,
                                  std::string_view salt4) {
  std::string inner = md5_hex(std::string(password) + std::string(user));
  return "md5" + md5_hex(inner + std::string(salt4));
}

std::string scram_prepare_password(std::string_view password) {
  std::string raw(password);
  bool ascii = true;
  for (unsigned char ch : password) ascii = ascii && ch < 0x80;
  if (ascii || password.size() > 1024 * 1024) return raw;   // PostgreSQL's own limit is 1 MB
  UErrorCode st = U_ZERO_ERROR;
  std::int32_t n16 = 0;
  u_strFromUTF8(nullptr, 0, &n16, password.data(), static_cast<std::int32_t>(password.size()), &st);
  if (st != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(st)) return raw;   // not UTF-8
  std::u16string in(static_cast<std::size_t>(n16), u'\0');
  st = U_ZERO_ERROR;
  u_strFromUTF8(in.data(), n16, nullptr, password.data(), static_cast<std::int32_t>(password.size()), &st);
  if (U_FAILURE(st)) return raw;
  st = U_ZERO_ERROR;
  std::unique_ptr<UStringPrepProfile, decltype(&usprep_close)> profile(
      usprep_openByType(USPREP_RFC4013_SASLPREP, &st), &usprep_close);
  if (U_FAILURE(st) || !profile) return raw;
  // NFKC can expand a character many times over: size by a first pass.
  std::int32_t n = usprep_prepare(profile.get(), in.data(), n16, nullptr, 0, USPREP_DEFAULT, nullptr, &st);
  if (st != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(st)) return raw;   // prohibited, unassigned, bidi
  std::u16string out(static_cast<std::size_t>(n), u'\0');
  st = U_ZERO_ERROR;
  n = usprep_prepare(profile.get(), in.data(), n16, out.data(), n, USPREP_DEFAULT, nullptr, &st);
  if (U_FAILURE(st) || n == 0) return raw;   // PostgreSQL refuses an empty prepared password too
  std::int32_t n8 = 0;
  st = U_ZERO_ERROR;
  u_strToUTF8(nullptr, 0, &n8, out.data(), n, &st);
  if (st != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(st)) return raw;
  std::string prepared(static_cast<std::size_t>(n8), '\0');
  st = U_ZERO_ERROR;
  u_strToUTF8(prepared.data(), n8, nullptr, out.data(), n, &st);
  return U_FAILURE(st) ? raw : prepared;
}

scram_client::scram_client(std::string password, std::string user, std::string nonce,
                           std::string channel_binding_data, bool client_supports_binding)
    : password_(scram_prepare_password(password)), nonce_(std::move(nonce)),
      binding_data_(std::move(channel_binding_data)) {
  if (nonce_.empty()) {
    unsigned char raw[18];
    RAND_bytes(raw, sizeof raw);
    nonce_ = base64_encode({reinterpret_cast<const char*>(raw), sizeof raw});
  }
  if (!binding_data_.empty())
    gs2_header_ = "p=tls-server-end-point,,";
  else
    gs2_header_ = client_supports_binding ? "y,," : "n,,";
  // saslname escaping (RFC 5802 5.1): ',' -> =2C, '=' -> =3D
  std::string escaped;
  for (char ch : user) {
    if (ch == ',') escaped += "=2C";
    else if (ch == '=') escaped += "=3D";
    else escaped.push_back(ch);
  }
  client_first_bare_ = "n=" + escaped + ",r=" + nonce_;
  client_first_ = gs2_header_ + client_first_bare_;
}

std::string_view scram_client::mechanism() const {
  return binding_data_.empty() ? "SCRAM-SHA-256" : "SCRAM-SHA-256-PLUS";
}

boost::system::result<std::string> scram_client::client_final(std::string_view server_first) {
  // server-first-message = [reserved-mext ","] nonce "," salt "," iteration-count ["," extensions]
  attr_reader r{server_first};
  char name = 0;
  std::string_view value, server_nonce, salt_b64, iter_s;
  if (!r.next(name, value) || name != 'r') {
    failure_ = "server-first-message has no nonce";
    return make_error_code(errc::auth_failed);
  }
  server_nonce = value;
  if (!r.next(name, value) || name != 's') {
    failure_ = "server-first-message has no salt";
    return make_error_code(errc::auth_failed);
  }
  salt_b64 = value;
  if (!r.next(name, value) || name != 'i') {
    failure_ = "server-first-message has no iteration count";
    return make_error_code(errc::auth_failed);
  }
  iter_s = value;
  if (server_nonce.size() <= nonce_.size() || server_nonce.substr(0, nonce_.size()) != nonce_) {
    failure_ = "server nonce does not extend the client nonce";
    return make_error_code(errc::auth_failed);
  }
  std::uint32_t iterations = 0;
  auto [p, ec] = std::from_chars(iter_s.data(), iter_s.data() + iter_s.size(), iterations);
  if (ec != std::errc{} || p != iter_s.data() + iter_s.size() || iterations == 0 ||
      iterations > max_scram_iterations) {
    failure_ = "server iteration count is invalid or above " + std::to_string(max_scram_iterations);
    return make_error_code(errc::auth_failed);
  }
  auto salt = base64_decode(salt_b64);
  if (!salt || salt->empty()) {
    failure_ = "server salt is not valid base64";
    return make_error_code(errc::auth_failed);
  }

  digest salted{};
  PKCS5_PBKDF2_HMAC(password_.data(), static_cast<int>(password_.size()),
                    reinterpret_cast<const unsigned char*>(salt->data()), static_cast<int>(salt->size()),
                    static_cast<int>(iterations), EVP_sha256(), static_cast<int>(salted.size()),
                    salted.data());
  digest client_key = hmac_sha256(view(salted), "Client Key");
  digest stored_key{};
  unsigned int len = 0;
  EVP_Digest(client_key.data(), client_key.size(), stored_key.data(), &len, EVP_sha256(), nullptr);

  std::string cbind_input = gs2_header_ + binding_data_;
  std::string final_without_proof = "c=" + base64_encode(cbind_input) + ",r=" + std::string(server_nonce);
  std::string auth_message =
      client_first_bare_ + "," + std::string(server_first) + "," + final_without_proof;
  digest client_signature = hmac_sha256(view(stored_key), auth_message);
  digest proof{};
  for (std::size_t i = 0; i < proof.size(); ++i) proof[i] = client_key[i] ^ client_signature[i];

  digest server_key = hmac_sha256(view(salted), "Server Key");
  digest server_signature = hmac_sha256(view(server_key), auth_message);
  expected_server_signature_ = base64_encode(view(server_signature));
  OPENSSL_cleanse(salted.data(), salted.size());

  return final_without_proof + ",p=" + base64_encode(view(proof));
}

boost::system::result<void> scram_client::verify_server_final(std::string_view server_final) const {
  attr_reader r{server_final};
  char name = 0;
  std::string_view value;
  if (!r.next(name, value)) {
    failure_ = "server-final-message is malformed";
    return make_error_code(errc::auth_failed);
  }
  if (name == 'e') {
    failure_ = "server reported SCRAM error: " + std::string(value);
    return make_error_code(errc::auth_failed);
  }
  if (name != 'v' || expected_server_signature_.empty() ||
      value.size() != expected_server_signature_.size() ||
      CRYPTO_memcmp(value.data(), expected_server_signature_.data(), value.size()) != 0) {
    failure_ = "server signature does not match: the server does not know the password";
    return make_error_code(errc::auth_failed);
  }
  return {};
}

// --- The server's side ---------------------------------------------------------------------------

namespace {

constexpr std::string_view verifier_prefix = "SCRAM-SHA-256$";

std::string sha256(std::string_view in) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(in.data(), in.size(), md, &len, EVP_sha256(), nullptr);
  return {reinterpret_cast<const char*>(md), len};
}

/// n random bytes; a failing generator ends the process (a predictable nonce or salt is worse).
std::string random_bytes(std::size_t n) {
  std::string raw(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(n)) != 1) {
    std::fputs("walgate: OpenSSL's random generator failed: stopping rather than use a predictable nonce\n", stderr);
    std::abort();
  }
  return raw;
}
std::string random_base64(std::size_t n) { return base64_encode(random_bytes(n)); }

/// PostgreSQL's read_attr_value: "<attr>=<value>" up to a comma (taken) or the end.
bool read_attr(std::string_view& in, char attr, std::string_view& value, std::string& why) {
  if (in.empty() || in[0] != attr) {
    why = std::string("expected attribute \"") + attr + "\"";
    return false;
  }
  if (in.size() < 2 || in[1] != '=') {
    why = std::string("expected character \"=\" for attribute \"") + attr + "\"";
    return false;
  }
  in.remove_prefix(2);
  const auto comma = in.find(',');
  value = in.substr(0, comma);
  in = comma == std::string_view::npos ? std::string_view{} : in.substr(comma + 1);
  return true;
}

/// PostgreSQL's read_any_attr: an attribute named by a letter.
bool read_any_attr(std::string_view& in, char& attr, std::string_view& value, std::string& why) {
  if (in.empty() || !((in[0] >= 'a' && in[0] <= 'z') || (in[0] >= 'A' && in[0] <= 'Z'))) {
    why = "attribute expected";
    return false;
  }
  attr = in[0];
  return read_attr(in, attr, value, why);
}

/// RFC 5802's printable: %x21-2B / %x2D-7E (no comma).
bool printable(std::string_view s) {
  for (unsigned char c : s)
    if (c < 0x21 || c > 0x7e || c == ',') return false;
  return true;
}

}  // namespace

boost::system::result<scram_verifier> parse_scram_verifier(std::string_view text, std::string* why) {
  auto fail = [&](const char* reason) -> boost::system::result<scram_verifier> {
    if (why) *why = reason;
    return make_error_code(errc::invalid_value);
  };
  if (text.substr(0, verifier_prefix.size()) != verifier_prefix)
    return fail("not a SCRAM-SHA-256 verifier (it starts with \"SCRAM-SHA-256$\")");
  text.remove_prefix(verifier_prefix.size());
  const auto colon1 = text.find(':'), dollar = text.find('$');
  if (colon1 == std::string_view::npos || dollar == std::string_view::npos || colon1 > dollar)
    return fail("expected SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>");
  const auto iter_s = text.substr(0, colon1), salt_s = text.substr(colon1 + 1, dollar - colon1 - 1);
  const auto keys = text.substr(dollar + 1);
  const auto colon2 = keys.find(':');
  if (colon2 == std::string_view::npos) return fail("expected <StoredKey>:<ServerKey> after the salt");
  scram_verifier v;
  std::uint32_t iterations = 0;
  auto [p, ec] = std::from_chars(iter_s.data(), iter_s.data() + iter_s.size(), iterations);
  if (ec != std::errc{} || p != iter_s.data() + iter_s.size() || iterations == 0 || iterations > 0x7fffffffu ||
      iter_s[0] == '+')
    return fail("the iteration count is not a number from 1 to 2147483647");
  v.iterations = iterations;
  auto salt = base64_decode(salt_s);
  if (!salt || salt->empty() || salt->size() > 1024) return fail("the salt is not base64 of 1 to 1024 bytes");
  auto stored = base64_decode(keys.substr(0, colon2)), server = base64_decode(keys.substr(colon2 + 1));
  if (!stored || stored->size() != 32 || !server || server->size() != 32)
    return fail("StoredKey and ServerKey are not base64 of 32 bytes each");
  v.salt = std::move(*salt);
  v.stored_key = std::move(*stored);
  v.server_key = std::move(*server);
  return v;
}

scram_verifier make_scram_verifier(std::string_view password, std::uint32_t iterations, std::string salt) {
  scram_verifier v;
  v.iterations = iterations;
  if (salt.empty()) salt = random_bytes(16);
  v.salt = std::move(salt);
  const std::string prepared = scram_prepare_password(password);
  digest salted{};
  PKCS5_PBKDF2_HMAC(prepared.data(), static_cast<int>(prepared.size()),
                    reinterpret_cast<const unsigned char*>(v.salt.data()), static_cast<int>(v.salt.size()),
                    static_cast<int>(iterations), EVP_sha256(), static_cast<int>(salted.size()), salted.data());
  v.stored_key = sha256(view(hmac_sha256(view(salted), "Client Key")));
  v.server_key = std::string(view(hmac_sha256(view(salted), "Server Key")));
  OPENSSL_cleanse(salted.data(), salted.size());
  return v;
}

std::string format_scram_verifier(const scram_verifier& v) {
  return std::string(verifier_prefix) + std::to_string(v.iterations) + ":" + base64_encode(v.salt) + "$" +
         base64_encode(v.stored_key) + ":" + base64_encode(v.server_key);
}

std::string scram_mock_secret(std::string_view seed) { return sha256(seed); }

scram_server::scram_server(std::optional<scram_verifier> verifier, std::string_view user, std::string_view mock_secret,
                           std::string channel_binding_data, std::string nonce, std::uint32_t mock_iterations)
    : binding_data_(std::move(channel_binding_data)), server_nonce_(std::move(nonce)) {
  if (server_nonce_.empty()) server_nonce_ = random_base64(18);
  if (verifier) {
    verifier_ = std::move(*verifier);
  } else {
    // (PostgreSQL's scram_mock_salt: the same salt for the same name, every time, so that a
    // client cannot tell an unknown user from a wrong password; keys nobody can match)
    mock_ = true;
    verifier_.iterations = mock_iterations ? mock_iterations : 4096;
    verifier_.salt = sha256(std::string(mock_secret) + '\0' + std::string(user)).substr(0, 16);
    verifier_.stored_key = sha256(std::string(mock_secret) + "\1stored");
    verifier_.server_key = sha256(std::string(mock_secret) + "\1server");
  }
}

std::vector<std::string> scram_server::mechanisms() const {
  if (binding_data_.empty()) return {"SCRAM-SHA-256"};
  return {"SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"};
}

boost::system::result<std::string> scram_server::server_first(std::string_view mechanism, std::string_view in) {
  auto fail = [&](std::string why) -> boost::system::result<std::string> {
    failure_ = std::move(why);
    return make_error_code(errc::auth_failed);
  };
  if (first_done_) return fail("client-first-message sent twice");
  first_done_ = true;
  if (mechanism == "SCRAM-SHA-256-PLUS" && !binding_data_.empty())
    plus_ = true;
  else if (mechanism != "SCRAM-SHA-256")
    return fail("client selected an invalid SASL authentication mechanism");
  if (in.find('\0') != std::string_view::npos) return fail("malformed SCRAM message: a NUL byte in it");
  if (in.empty()) return fail("malformed SCRAM message: the message is empty");
  std::string_view rest = in;
  std::string why;
  const char flag = rest[0];
  if (plus_ && flag != 'p')
    return fail("the client selected SCRAM-SHA-256-PLUS, but the SCRAM message does not include channel binding data");
  if (flag == 'n' || flag == 'y') {
    if (flag == 'y' && !binding_data_.empty())
      return fail("SCRAM channel binding negotiation error: the client supports SCRAM channel binding but thinks the "
                  "server does not. However, this server does support channel binding");
    if (rest.size() < 2 || rest[1] != ',') return fail("malformed SCRAM message: comma expected after the channel-binding flag");
    rest.remove_prefix(2);
  } else if (flag == 'p') {
    if (!plus_)
      return fail("the client selected SCRAM-SHA-256 without channel binding, but the SCRAM message includes channel "
                  "binding data");
    std::string_view type;
    if (!read_attr(rest, 'p', type, why)) return fail("malformed SCRAM message: " + why);
    if (type != "tls-server-end-point") return fail("unsupported SCRAM channel-binding type \"" + std::string(type) + "\"");
  } else {
    return fail("malformed SCRAM message: unexpected channel-binding flag");
  }
  cbind_header_ = std::string(in.substr(0, in.size() - rest.size()));
  if (!rest.empty() && rest[0] == 'a') return fail("client uses authorization identity, but it is not supported");
  if (rest.empty() || rest[0] != ',') return fail("malformed SCRAM message: comma expected after the authorization identity");
  rest.remove_prefix(1);
  cbind_header_ += ',';
  client_first_bare_ = std::string(rest);
  if (!rest.empty() && rest[0] == 'm') return fail("client requires an unsupported SCRAM extension");
  std::string_view ignored_user, client_nonce;
  if (!read_attr(rest, 'n', ignored_user, why) || !read_attr(rest, 'r', client_nonce, why))
    return fail("malformed SCRAM message: " + why);
  if (client_nonce.empty() || !printable(client_nonce)) return fail("malformed SCRAM message: the client nonce is not printable");
  while (!rest.empty()) {
    char attr = 0;
    std::string_view value;
    if (!read_any_attr(rest, attr, value, why)) return fail("malformed SCRAM message: " + why);
  }
  nonce_ = std::string(client_nonce) + server_nonce_;
  server_first_ = "r=" + nonce_ + ",s=" + base64_encode(verifier_.salt) + ",i=" + std::to_string(verifier_.iterations);
  return server_first_;
}

boost::system::result<std::string> scram_server::server_final(std::string_view in) {
  proof_failed_ = false;
  auto fail = [&](std::string why) -> boost::system::result<std::string> {
    failure_ = std::move(why);
    return make_error_code(errc::auth_failed);
  };
  if (!first_done_ || server_first_.empty() || final_done_) return fail("client-final-message out of turn");
  final_done_ = true;
  if (in.find('\0') != std::string_view::npos) return fail("malformed SCRAM message: a NUL byte in it");
  std::string_view rest = in, binding, nonce;
  std::string why;
  if (!read_attr(rest, 'c', binding, why)) return fail("malformed SCRAM message: " + why);
  if (binding != base64_encode(cbind_header_ + (plus_ ? binding_data_ : std::string())))
    return fail(plus_ ? "SCRAM channel binding check failed"
                      : "unexpected SCRAM channel-binding attribute in client-final-message");
  if (!read_attr(rest, 'r', nonce, why)) return fail("malformed SCRAM message: " + why);
  // Extensions up to the proof, which comes last.
  std::size_t proof_at = 0;
  std::string_view proof_b64;
  for (;;) {
    proof_at = in.size() - rest.size();
    char attr = 0;
    std::string_view value;
    if (!read_any_attr(rest, attr, value, why)) return fail("malformed SCRAM message: " + why + " (the proof p= comes last)");
    if (attr == 'p') {
      proof_b64 = value;
      break;
    }
  }
  if (!rest.empty() || in.back() == ',') return fail("malformed SCRAM message: garbage at the end of client-final-message");
  auto proof = base64_decode(proof_b64);
  if (!proof || proof->size() != 32) return fail("malformed SCRAM message: malformed proof in client-final-message");
  if (nonce != nonce_) return fail("invalid SCRAM response: nonce does not match");
  // proof_at points at "p=": the message without the proof ends before the comma ahead of it.
  const std::string_view without_proof = in.substr(0, proof_at - 1);
  const std::string auth_message = client_first_bare_ + "," + server_first_ + "," + std::string(without_proof);
  const digest client_signature = hmac_sha256(verifier_.stored_key, auth_message);
  std::string client_key(32, '\0');
  for (std::size_t i = 0; i < 32; ++i)
    client_key[i] = static_cast<char>(static_cast<unsigned char>((*proof)[i]) ^ client_signature[i]);
  const std::string computed = sha256(client_key);
  if (mock_ || CRYPTO_memcmp(computed.data(), verifier_.stored_key.data(), 32) != 0) {
    proof_failed_ = true;
    return fail("the proof does not hold: wrong password, or no such user");
  }
  return "v=" + base64_encode(view(hmac_sha256(verifier_.server_key, auth_message)));
}

std::string tls_server_end_point(std::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  std::unique_ptr<X509, decltype(&X509_free)> cert(d2i_X509(nullptr, &p, static_cast<long>(der.size())),
                                                   &X509_free);
  if (!cert) return {};
  int algo_nid = 0;
  if (!OBJ_find_sigid_algs(X509_get_signature_nid(cert.get()), &algo_nid, nullptr)) return {};
  const EVP_MD* md = nullptr;
  // RFC 5929 4.1: MD5 and SHA-1 are replaced by SHA-256.
  if (algo_nid == NID_md5 || algo_nid == NID_sha1)
    md = EVP_sha256();
  else
    md = EVP_get_digestbynid(algo_nid);
  if (md == nullptr) return {};
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!X509_digest(cert.get(), md, out, &len)) return {};
  return {reinterpret_cast<const char*>(out), len};
}

}  // namespace walgate::protocol
