#include "walgate/proxy/conninfo.hpp"

#include <libpq-fe.h>

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

namespace walgate::proxy {

namespace {

std::string home_dir() {
  if (const char* h = std::getenv("HOME"); h && *h) return h;
  if (const passwd* pw = getpwuid(geteuid())) return pw->pw_dir;
  return {};
}

std::string os_user() {
  if (const passwd* pw = getpwuid(geteuid())) return pw->pw_name;
  return {};
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    auto comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

std::string_view to_string(ssl_mode m) {
  switch (m) {
    case ssl_mode::disable: return "disable";
    case ssl_mode::allow: return "allow";
    case ssl_mode::prefer: return "prefer";
    case ssl_mode::require: return "require";
    case ssl_mode::verify_ca: return "verify-ca";
    case ssl_mode::verify_full: return "verify-full";
  }
  return "?";
}

conninfo_result parse_conninfo(std::string_view conninfo) {
  conninfo_result out;
  char* err = nullptr;
  std::string text(conninfo);
  std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)> opts(PQconninfoParse(text.c_str(), &err),
                                                                     &PQconninfoFree);
  if (!opts) {
    std::string msg = err ? err : "out of memory";
    if (err) PQfreemem(err);
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    out.error = "invalid connection string: " + msg;
    return out;
  }
  // Defaults: environment variables first (PQconndefaults reads them), then built-ins.
  std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)> defs(PQconndefaults(), &PQconninfoFree);
  std::map<std::string, std::string> v;
  if (defs)
    for (auto* o = defs.get(); o->keyword; ++o)
      if (o->val && *o->val) v[o->keyword] = o->val;
  for (auto* o = opts.get(); o->keyword; ++o)
    if (o->val) v[o->keyword] = o->val;

  auto get = [&](const char* k) -> std::string {
    auto it = v.find(k);
    return it == v.end() ? std::string{} : it->second;
  };

  conn_params p;
  std::string hosts = get("host");
  if (hosts.empty()) hosts = get("hostaddr");
  if (hosts.empty()) hosts = "/var/run/postgresql";  // Debian's DEFAULT_PGSOCKET_DIR
  std::string ports = get("port");
  if (ports.empty()) ports = "5432";
  auto host_list = split_commas(hosts);
  auto port_list = split_commas(ports);
  if (port_list.size() != 1 && port_list.size() != host_list.size()) {
    out.error = "invalid connection string: " + std::to_string(port_list.size()) + " ports for " +
                std::to_string(host_list.size()) + " hosts";
    return out;
  }
  for (std::size_t i = 0; i < host_list.size(); ++i) {
    conn_endpoint ep;
    ep.host = host_list[i].empty() ? "/var/run/postgresql" : host_list[i];
    const std::string& ps = port_list.size() == 1 ? port_list[0] : port_list[i];
    unsigned port = 0;
    auto [ptr, ec] = std::from_chars(ps.data(), ps.data() + ps.size(), port);
    if (ec != std::errc{} || ptr != ps.data() + ps.size() || port == 0 || port > 65535) {
      out.error = "invalid port number: \"" + ps + "\"";
      return out;
    }
    ep.port = static_cast<std::uint16_t>(port);
    p.endpoints.push_back(std::move(ep));
  }
  p.user = get("user");
  if (p.user.empty()) p.user = os_user();
  p.dbname = get("dbname");
  if (p.dbname.empty()) p.dbname = p.user;
  if (v.count("password")) p.password = get("password");
  if (auto a = get("application_name"); !a.empty()) p.application_name = a;

  std::string mode = get("sslmode");
  if (mode.empty() || mode == "prefer") p.sslmode = ssl_mode::prefer;
  else if (mode == "disable") p.sslmode = ssl_mode::disable;
  else if (mode == "allow") p.sslmode = ssl_mode::allow;
  else if (mode == "require") p.sslmode = ssl_mode::require;
  else if (mode == "verify-ca") p.sslmode = ssl_mode::verify_ca;
  else if (mode == "verify-full") p.sslmode = ssl_mode::verify_full;
  else {
    out.error = "invalid sslmode value: \"" + mode + "\"";
    return out;
  }
  p.sslrootcert = get("sslrootcert");
  if (p.sslrootcert.empty()) {
    std::string def = home_dir() + "/.postgresql/root.crt";
    struct stat st{};
    if (::stat(def.c_str(), &st) == 0) p.sslrootcert = def;
  }
  // libpq: sslmode=require with a root certificate present behaves like verify-ca.
  if (p.sslmode == ssl_mode::require && !p.sslrootcert.empty()) p.sslmode = ssl_mode::verify_ca;
  p.sslcert = get("sslcert");
  p.sslkey = get("sslkey");

  std::string cb = get("channel_binding");
  if (cb.empty() || cb == "prefer") p.channel_binding = channel_binding_mode::prefer;
  else if (cb == "disable") p.channel_binding = channel_binding_mode::disable;
  else if (cb == "require") p.channel_binding = channel_binding_mode::require;
  else {
    out.error = "invalid channel_binding value: \"" + cb + "\"";
    return out;
  }
  p.passfile = get("passfile");
  if (p.passfile.empty()) p.passfile = home_dir() + "/.pgpass";
  if (auto t = get("connect_timeout"); !t.empty()) {
    int secs = 0;
    auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), secs);
    if (ec != std::errc{} || ptr != t.data() + t.size() || secs < 0) {
      out.error = "invalid connect_timeout value: \"" + t + "\"";
      return out;
    }
    // libpq: 0 means wait forever; we keep a bound, and values below 2 become 2.
    p.connect_timeout = std::chrono::seconds(secs == 0 ? 3600 : std::max(secs, 2));
  }
  out.params = std::move(p);
  return out;
}

namespace {
// Splits one pgpass field at an unescaped ':' and unescapes it.
bool next_field(std::string_view& line, std::string& field) {
  field.clear();
  std::size_t i = 0;
  for (; i < line.size(); ++i) {
    char c = line[i];
    if (c == '\\' && i + 1 < line.size()) {
      field.push_back(line[++i]);
    } else if (c == ':') {
      line = line.substr(i + 1);
      return true;
    } else {
      field.push_back(c);
    }
  }
  line = {};
  return false;
}
}  // namespace

std::optional<std::string> lookup_passfile(const std::string& path, const conn_endpoint& ep,
                                           std::string_view dbname, std::string_view user) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  if (st.st_mode & (S_IRWXG | S_IRWXO)) return std::nullopt;  // libpq ignores such files too
  std::ifstream in(path);
  std::string line;
  // libpq matches "localhost" for a Unix socket in the default directory.
  std::string host = ep.is_unix_socket() ? "localhost" : ep.host;
  std::string port = std::to_string(ep.port);
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::string_view rest = line;
    std::string f[5];
    bool ok = next_field(rest, f[0]) && next_field(rest, f[1]) && next_field(rest, f[2]) &&
              next_field(rest, f[3]);
    if (!ok) continue;
    next_field(rest, f[4]);
    auto match = [](const std::string& pat, std::string_view val) { return pat == "*" || pat == val; };
    if (match(f[0], host) && match(f[1], port) && match(f[2], dbname) && match(f[3], user)) return f[4];
  }
  return std::nullopt;
}

}  // namespace walgate::proxy
