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
/// libpq's target_session_attrs: which of the hosts a connection keeps. read-write: not in
/// recovery and default_transaction_read_only off; read-only: either of those; primary: not in
/// recovery; standby: in recovery; prefer-standby: a standby if any host is one, else any.
enum class session_target { any, read_write, read_only, primary, standby, prefer_standby };

struct conn_endpoint {
  std::string host;      ///< A host name, an IP address, or a Unix socket directory (starts with '/').
  std::uint16_t port = 5432;
  /// hostaddr: the numeric address connected to over TCP instead of resolving host, which stays
  /// the name TLS verifies and pgpass matches (as in libpq). Empty: host decides.
  std::string address;
  bool is_unix_socket() const { return address.empty() && !host.empty() && host.front() == '/'; }
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
  /// target_session_attrs as the string (or PGTARGETSESSIONATTRS) gave it; unset: the
  /// connection's own default (any for libpq; for walgate's stream primary when several hosts
  /// are listed: with_default_target).
  std::optional<session_target> target_session_attrs;
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
std::string_view to_string(session_target t);
/// A host's state, as a connection to it found it (ParameterStatus in_hot_standby and
/// default_transaction_read_only on 14+, queries before).
struct session_state {
  bool in_recovery = false;
  bool read_only = false;   ///< default_transaction_read_only on, or in recovery
};
/// Whether a host in state s is one target keeps (prefer_standby: a standby; the caller tries
/// any host on a second pass). Empty when kept, else why not ("a standby", "read-only"...).
std::string passed_over(session_target target, const session_state& s);

/// A libpq conninfo that reaches exactly the server walgate's stream is on: host (the name,
/// for TLS and pgpass) and port of the endpoint it chose, hostaddr the address it connected to
/// (empty for a Unix socket: written empty, so that PGHOSTADDR cannot redirect it), and
/// target_session_attrs any — so that libpq's connections (snapshots) go where the stream is:
/// an exported snapshot exists on that server alone, and a name may resolve to another. The
/// other keywords as conninfo gives them (a URI is turned into keywords). Empty with error when
/// conninfo cannot be parsed.
std::string pinned_conninfo(const std::string& conninfo, const conn_endpoint& to, const std::string& address,
                            std::string& error);
/// conninfo with target_session_attrs=target added unless it names one itself (libpq's default
/// is any; walgate's stream and its libpq connections default to primary).
std::string with_default_target(const std::string& conninfo, session_target target, std::string& error);

}  // namespace walgate::proxy
