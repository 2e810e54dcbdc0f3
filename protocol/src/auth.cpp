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
