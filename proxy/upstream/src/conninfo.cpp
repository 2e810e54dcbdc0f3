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

std::string_view to_string(session_target t) {
  switch (t) {
    case session_target::any: return "any";
    case session_target::read_write: return "read-write";
    case session_target::read_only: return "read-only";
    case session_target::primary: return "primary";
    case session_target::standby: return "standby";
    case session_target::prefer_standby: return "prefer-standby";
  }
  return "?";
}

std::string passed_over(session_target target, const session_state& s) {
  switch (target) {
    case session_target::any: return {};
    case session_target::read_write:
      return s.in_recovery ? "a standby (in recovery)" : s.read_only ? "read-only (default_transaction_read_only on)" : "";
    case session_target::read_only: return s.read_only || s.in_recovery ? "" : "read-write";
    case session_target::primary: return s.in_recovery ? "a standby (in recovery)" : "";
    case session_target::standby:
    case session_target::prefer_standby: return s.in_recovery ? "" : "a primary (not in recovery)";
  }
  return {};
}

namespace {

using options_ptr = std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)>;

options_ptr parse_options(const std::string& conninfo, std::string& error) {
  char* err = nullptr;
  options_ptr opts(PQconninfoParse(conninfo.c_str(), &err), &PQconninfoFree);
  if (!opts) {
    error = err ? err : "out of memory";
    if (err) PQfreemem(err);
    while (!error.empty() && (error.back() == '\n' || error.back() == ' ')) error.pop_back();
    error = "invalid connection string: " + error;
  }
  return opts;
}

/// A keyword=value conninfo of the options set, with replace's keywords instead of their own.
std::string keywords_of(const PQconninfoOption* opts, const std::map<std::string, std::string>& replace) {
  std::string out;
  auto add = [&out](const std::string& k, const std::string& v) {
    if (!out.empty()) out += ' ';
    out += k + "='";
    for (char c : v) {
      if (c == '\'' || c == '\\') out += '\\';
      out += c;
    }
    out += '\'';
  };
  for (auto* o = opts; o->keyword; ++o)
    if (o->val && !replace.count(o->keyword)) add(o->keyword, o->val);
  for (const auto& [k, v] : replace) add(k, v);
  return out;
}

}  // namespace

std::string pinned_conninfo(const std::string& conninfo, const conn_endpoint& to, const std::string& address,
                            std::string& error) {
  auto opts = parse_options(conninfo, error);
  if (!opts) return {};
  // Every keyword that decides the server written, the empty ones too (an empty value keeps
  // PGHOST/PGHOSTADDR from the environment out, as no value would not).
  return keywords_of(opts.get(), {{"host", to.host},
                                  {"hostaddr", address},
                                  {"port", std::to_string(to.port)},
                                  {"target_session_attrs", "any"}});
}

std::string with_default_target(const std::string& conninfo, session_target target, std::string& error) {
  auto opts = parse_options(conninfo, error);
  if (!opts) return {};
  for (auto* o = opts.get(); o->keyword; ++o)
    if (o->val && std::string_view(o->keyword) == "target_session_attrs") return conninfo;
  if (const char* e = std::getenv("PGTARGETSESSIONATTRS"); e && *e) return conninfo;
  return keywords_of(opts.get(), {{"target_session_attrs", std::string(to_string(target))}});
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
  // host and hostaddr, as libpq pairs them: the i-th address is the i-th host's (connected to
  // without resolving the name); hostaddr alone names the hosts too.
  const std::string addrs = get("hostaddr");
  std::string hosts = get("host");
  const auto addr_list = addrs.empty() ? std::vector<std::string>{} : split_commas(addrs);
  if (hosts.empty()) hosts = addrs;
  if (hosts.empty()) hosts = "/var/run/postgresql";  // Debian's DEFAULT_PGSOCKET_DIR
  std::string ports = get("port");
  if (ports.empty()) ports = "5432";
  auto host_list = split_commas(hosts);
  auto port_list = split_commas(ports);
  if (!addr_list.empty() && addr_list.size() != host_list.size()) {
    out.error = "invalid connection string: could not match " + std::to_string(host_list.size()) + " host names to " +
                std::to_string(addr_list.size()) + " hostaddr values";
    return out;
  }
  if (port_list.size() != 1 && port_list.size() != host_list.size()) {
    out.error = "invalid connection string: " + std::to_string(port_list.size()) + " ports for " +
                std::to_string(host_list.size()) + " hosts";
    return out;
  }
  for (std::size_t i = 0; i < host_list.size(); ++i) {
    conn_endpoint ep;
    if (!addr_list.empty()) ep.address = addr_list[i];
    ep.host = !host_list[i].empty() ? host_list[i] : !ep.address.empty() ? ep.address : "/var/run/postgresql";
    // (an empty entry — "postgresql://a,b/db" gives port "," — is the default, as in libpq)
    const std::string& listed = port_list.size() == 1 ? port_list[0] : port_list[i];
    const std::string ps = listed.empty() ? "5432" : listed;
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
  // target_session_attrs as given (the string, or PGTARGETSESSIONATTRS), never libpq's built-in
  // default ("any"): unset, each connection has its own default (walgate's stream: primary).
  std::string given_target;
  for (auto* o = opts.get(); o->keyword; ++o)
    if (o->val && std::string_view(o->keyword) == "target_session_attrs") given_target = o->val;
  if (given_target.empty())
    if (const char* e = std::getenv("PGTARGETSESSIONATTRS")) given_target = e;
  if (const auto& t = given_target; !t.empty()) {
    if (t == "any") p.target_session_attrs = session_target::any;
    else if (t == "read-write") p.target_session_attrs = session_target::read_write;
    else if (t == "read-only") p.target_session_attrs = session_target::read_only;
    else if (t == "primary") p.target_session_attrs = session_target::primary;
    else if (t == "standby") p.target_session_attrs = session_target::standby;
    else if (t == "prefer-standby") p.target_session_attrs = session_target::prefer_standby;
    else {
      out.error = "invalid target_session_attrs value: \"" + t + "\"";
      return out;
    }
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
