// The authenticator (auth.hpp): the key files read and watched, tokens verified at the current
// time, and where a request carries its token.
#include "walgate/proxy/auth.hpp"

#include <sys/stat.h>

#include <cctype>
#include <chrono>
#include <fstream>
#include <sstream>

namespace walgate::proxy {

namespace {

/// Key files are small; anything past this is not one.
constexpr std::uintmax_t max_key_file = 1u << 20;

bool read_file(const std::filesystem::path& p, std::string& out, std::string& error) {
  std::error_code ec;
  auto size = std::filesystem::file_size(p, ec);
  if (ec) {
    error = p.string() + ": " + ec.message();
    return false;
  }
  if (size > max_key_file) {
    error = p.string() + ": " + std::to_string(size) + " bytes; a key file has at most " + std::to_string(max_key_file);
    return false;
  }
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in) {
    error = p.string() + ": cannot be read";
    return false;
  }
  out = std::move(s).str();
  return true;
}

bool iequals_prefix(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != std::tolower(static_cast<unsigned char>(prefix[i]))) return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

authenticator::authenticator(auth_options o) : opts_(std::move(o)) {}

authenticator::stamp authenticator::stat_file(const std::filesystem::path& p) {
  stamp st;
  struct stat sb {};
  if (p.empty() || ::stat(p.c_str(), &sb) != 0) return st;
  st.exists = true;
  st.size = static_cast<std::uint64_t>(sb.st_size);
  st.mtime_ns = static_cast<std::uint64_t>(sb.st_mtim.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(sb.st_mtim.tv_nsec);
  st.inode = static_cast<std::uint64_t>(sb.st_ino);
  return st;
}

bool authenticator::reload(std::string& error) {
  secret_stamp_ = stat_file(opts_.secret_file);
  jwks_stamp_ = stat_file(opts_.jwks_file);
  policy_stamp_ = stat_file(opts_.policy_file);
  jwt::key_set all;
  if (!opts_.secret_file.empty()) {
    std::string text;
    if (!read_file(opts_.secret_file, text, error)) {
      ++reload_failures_;
      return false;
    }
    // A file written by echo or an editor ends with a newline that is not part of the secret.
    if (text.ends_with("\r\n")) text.resize(text.size() - 2);
    else if (text.ends_with('\n')) text.pop_back();
    std::string why;
    auto s = jwt::key_set::from_secret(text, why);
    if (!s) {
      error = opts_.secret_file.string() + ": " + why;
      ++reload_failures_;
      return false;
    }
    all.merge(std::move(*s));
  }
  if (!opts_.jwks_file.empty()) {
    std::string text;
    if (!read_file(opts_.jwks_file, text, error)) {
      ++reload_failures_;
      return false;
    }
    std::string why;
    auto s = jwt::key_set::from_jwks(text, why);
    if (!s) {
      error = opts_.jwks_file.string() + ": " + why;
      ++reload_failures_;
      return false;
    }
    all.merge(std::move(*s));
  }
  if (all.size() == 0) {
    error = "no key file is configured (--jwt-secret-file, --jwks-file)";
    ++reload_failures_;
    return false;
  }
  std::shared_ptr<const policy> pol;
  if (!opts_.policy_file.empty()) {
    std::string text;
    if (!read_file(opts_.policy_file, text, error)) {
      ++reload_failures_;
      return false;
    }
    std::string why;
    auto p = policy::parse(text, why);
    if (!p) {
      error = opts_.policy_file.string() + ": " + why;
      ++reload_failures_;
      return false;
    }
    pol = std::make_shared<const policy>(std::move(*p));
  }
  // Keys and policy change together, or not at all.
  keys_ = std::make_shared<const jwt::key_set>(std::move(all));
  policy_ = std::move(pol);
  ++reloads_;
  return true;
}

int authenticator::reload_if_changed(std::string& error) {
  if (stat_file(opts_.secret_file) == secret_stamp_ && stat_file(opts_.jwks_file) == jwks_stamp_ &&
      stat_file(opts_.policy_file) == policy_stamp_)
    return 0;
  return reload(error) ? 1 : -1;
}

std::optional<identity> authenticator::verify(std::string_view token, std::string& error, bool* signed_ok) const {
  if (!keys_) {
    error = "no keys are loaded";
    ++refused_;
    return std::nullopt;
  }
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
  auto v = jwt::verify(token, *keys_, opts_.claims, now.count(), error, signed_ok);
  ++(v ? accepted_ : refused_);
  return v;
}

bool offers_subprotocol(std::string_view list, std::string_view protocol) {
  while (!list.empty()) {
    auto comma = list.find(',');
    if (trim(list.substr(0, comma)) == protocol) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

bool claim_equals(const identity& who, std::string_view name, std::string_view value) {
  const boost::json::value* claim = who.claims.if_contains(name);
  if (!claim) return false;
  auto equal = [value](const boost::json::value& v) {
    if (v.is_string()) return std::string_view(v.get_string()) == value;
    if (v.is_bool()) return value == (v.get_bool() ? "true" : "false");
    if (v.is_int64()) return value == std::to_string(v.get_int64());
    if (v.is_uint64()) return value == std::to_string(v.get_uint64());
    return false;   // (a fraction, null, an object: never)
  };
  if (claim->is_array()) {
    for (const auto& item : claim->get_array())
      if (equal(item)) return true;
    return false;
  }
  return equal(*claim);
}

bearer find_bearer(std::string_view authorization, std::string_view query_token, std::string_view subprotocols) {
  bearer b;
  int places = 0;
  authorization = trim(authorization);
  if (iequals_prefix(authorization, "bearer") &&
      (authorization.size() == 6 || authorization[6] == ' ' || authorization[6] == '\t')) {
    auto t = trim(authorization.substr(6));
    if (t.empty() || t.find_first_of(" \t,") != std::string_view::npos) {
      b.error = "malformed Authorization header: use Authorization: Bearer <token>";
      return b;
    }
    b.token = std::string(t);
    ++places;
  }
  int offered = 0;
  for (std::string_view rest = subprotocols; !rest.empty();) {
    auto comma = rest.find(',');
    auto item = trim(rest.substr(0, comma));
    if (item.size() > 7 && item.substr(0, 7) == "bearer.") {
      if (++offered == 1) b.token = std::string(item.substr(7));
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (offered > 1) {
    b.error = "more than one bearer.<token> subprotocol offered";
    b.token.clear();
    return b;
  }
  places += offered;
  if (!query_token.empty()) {
    b.token = std::string(query_token);
    ++places;
  }
  if (places > 1) {
    b.error = "the token is sent in more than one way (Authorization, access_token, Sec-WebSocket-Protocol): use one";
    b.token.clear();
  }
  return b;
}

}  // namespace walgate::proxy
