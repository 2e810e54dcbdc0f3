// Connection settings from a libpq conninfo string or URI, parsed by libpq's PQconninfoParse,
// with PostgreSQL's environment defaults (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE,
// PGSSLMODE, PGSSLROOTCERT, PGPASSFILE, PGAPPNAME, PGCONNECT_TIMEOUT, PGCHANNELBINDING...).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::proxy {

enum class ssl_mode { disable, allow, prefer, require, verify_ca, verify_full };
enum class channel_binding_mode { disable, prefer, require };

struct conn_endpoint {
  std::string host;      ///< A host name, an IP address, or a Unix socket directory (starts with '/').
  std::uint16_t port = 5432;
  bool is_unix_socket() const { return !host.empty() && host.front() == '/'; }
};

struct conn_params {
  std::vector<conn_endpoint> endpoints;   ///< Tried in order.
  std::string user;
  std::optional<std::string> password;    ///< From the string or PGPASSWORD; else the passfile.
  std::string dbname;
  std::string application_name = "walgate";
  ssl_mode sslmode = ssl_mode::prefer;
  std::string sslrootcert;                ///< CA file; empty: ~/.postgresql/root.crt if it exists.
  std::string sslcert, sslkey;            ///< Client certificate and key, optional.
  channel_binding_mode channel_binding = channel_binding_mode::prefer;
  std::string passfile;                   ///< Empty: ~/.pgpass.
  std::chrono::seconds connect_timeout{30};
};

struct conninfo_result {
  std::optional<conn_params> params;
  std::string error;   ///< One line, when params is empty.
};

/// Parses "host=... port=..." or "postgresql://user@host:port/db?sslmode=...". Unspecified
/// settings take PostgreSQL's environment defaults, then libpq's built-in ones.
conninfo_result parse_conninfo(std::string_view conninfo);

/// Looks up a password in a pgpass file ("host:port:database:user:password" lines, '*'
/// wildcards, '\' escapes). Ignored, as libpq does, if the file is group/world readable.
std::optional<std::string> lookup_passfile(const std::string& path, const conn_endpoint& ep,
                                           std::string_view dbname, std::string_view user);

std::string_view to_string(ssl_mode m);

}  // namespace walgate::proxy
