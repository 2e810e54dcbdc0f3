// The configuration: one table of every setting (settings()), read from each of its sources —
// the TOML file, WALGATE_* environment variables, each command's flags — through the same
// checks, the last source winning; check() for what settings need together; --print-config.
// Near 600 lines because about 200 of them are that table: one entry per setting, with its help
// text and its check, in the order errors are reported. It is one list on purpose: a setting
// added there is a flag, a variable and a config key at once. If the file grows, the table could
// move to a file of its own (setting and its builders in an internal header), leaving the
// readers here.
#include "config.hpp"

#include "walgate/protocol/commands.hpp"
#include "walgate/proxy/conninfo.hpp"
#include "walgate/proxy/stream_request.hpp"

#include <CLI/CLI.hpp>
#include <boost/asio/ip/address.hpp>
#include <libpq-fe.h>
#include <toml++/toml.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <sstream>

namespace walgate::cli {

namespace {

using transform::encoder_options;

enum class kind { text, number, flag, list };

/// A value's fault: a syntax error is named by where the value came from ("WALGATE_X: not a
/// number"); a value error is the same text whatever set it.
struct fault {
  bool syntax = false;
  std::string message;
};

struct setting {
  const char* name;   ///< the long flag without --, the config key, WALGATE_<NAME>
  const char* help;
  kind k;
  unsigned commands;   ///< bit per command that takes it as a flag
  std::function<fault(config&, const std::vector<std::string>&)> set;
  std::function<void(const config&, toml::table&, const char* key)> show;
};

constexpr unsigned on_serve = 1, on_demo = 2, on_stream = 4, on_edge = 8;
/// What `walgate edge` takes: what serving takes, but what concerns PostgreSQL and publishing.
bool edge_takes(const char* name) {
  for (const char* not_edge : {"pg", "slot", "publication", "create-publication", "status-interval", "streaming", "failover-slot", "origin",
                               "snapshot", "snapshot-workers", "snapshot-concurrency", "snapshot-queue", "snapshot-timeout",
                               "snapshot-client-kb", "snapshots-per-minute-per-address", "snapshots-per-minute-per-subject",
                               "snapshots-per-minute-per-mux", "nats-replicas", "nats-max-mb", "nats-max-age", "no-fsync",
                               "replication-listen", "replication-timeout"})
    if (std::string_view(name) == not_edge) return false;
  return true;
}

std::string source_names(const char* name) {
  return std::string("--") + name + " (or " + env_name(name) + ", or " + name + " in the config file)";
}

/// Plain decimal digits only: no sign, no unit, no trailing text.
bool digits(const std::string& t, std::uint64_t& out) {
  if (t.empty() || t.size() > 19 || t.find_first_not_of("0123456789") != std::string::npos) return false;
  out = std::stoull(t);
  return true;
}

template <class T>
setting number(const char* name, const char* help, T config::*field, std::uint64_t lo, std::uint64_t hi,
               unsigned commands = on_serve, const char* unit = "") {
  return {name, help, kind::number, commands,
          [=](config& c, const std::vector<std::string>& v) -> fault {
            std::uint64_t n = 0;
            if (!digits(v.front(), n)) return {true, "not a number"};
            if (n < lo || n > hi)
              return {false, source_names(name) + ": " + v.front() + " is not in [" + std::to_string(lo) + ", " +
                                 std::to_string(hi) + "]" + unit};
            c.*field = static_cast<T>(n);
            return {};
          },
          [=](const config& c, toml::table& t, const char* key) { t.insert(key, static_cast<std::int64_t>(c.*field)); }};
}

setting text(const char* name, const char* help, std::string config::*field, unsigned commands = on_serve,
             std::function<std::string(const std::string&)> check = {}) {
  return {name, help, kind::text, commands,
          [=](config& c, const std::vector<std::string>& v) -> fault {
            if (check)
              if (auto e = check(v.front()); !e.empty()) return {false, e};
            c.*field = v.front();
            return {};
          },
          [=](const config& c, toml::table& t, const char* key) { t.insert(key, c.*field); }};
}

setting flag(const char* name, const char* help, bool config::*field) {
  return {name, help, kind::flag, on_serve,
          [=](config& c, const std::vector<std::string>& v) -> fault {
            const auto& t = v.front();
            if (t == "1" || t == "true" || t == "yes") c.*field = true;
            else if (t == "0" || t == "false" || t == "no" || t.empty()) c.*field = false;
            else return {true, "expected true or false"};
            return {};
          },
          [=](const config& c, toml::table& t, const char* key) { t.insert(key, c.*field); }};
}

setting list(const char* name, const char* help, std::vector<std::string> config::*field, unsigned commands = on_serve,
             std::function<std::string(const std::string&)> check = {}) {
  return {name, help, kind::list, commands,
          [=](config& c, const std::vector<std::string>& v) -> fault {
            std::vector<std::string> out;
            for (const auto& item : v) {
              if (check)
                if (auto e = check(item); !e.empty()) return {false, e};
              out.push_back(item);
            }
            c.*field = std::move(out);
            return {};
          },
          [=](const config& c, toml::table& t, const char* key) {
            toml::array a;
            for (const auto& s : c.*field) a.push_back(s);
            t.insert(key, std::move(a));
          }};
}

/// One of a few words, kept as the typed value.
template <class T>
setting choice(const char* name, const char* help, T config::*field, std::vector<std::pair<const char*, T>> words) {
  return {name, help, kind::text, on_serve,
          [=](config& c, const std::vector<std::string>& v) -> fault {
            for (const auto& [w, value] : words)
              if (v.front() == w) {
                c.*field = value;
                return {};
              }
            std::string e = source_names(name) + ": '" + v.front() + "' is not one of";
            for (const auto& [w, value] : words) e += std::string(" ") + w;
            return {false, e};
          },
          [=](const config& c, toml::table& t, const char* key) {
            for (const auto& [w, value] : words)
              if (c.*field == value) t.insert(key, std::string(w));
          }};
}

/// HOST:PORT of the setting `name`, split; "" or the error.
std::string split_host_port(const char* name, const std::string& listen, std::string& host, std::uint16_t& port_out) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) return source_names(name) + ": expected HOST:PORT, got '" + listen + "'";
  host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::uint64_t port = 0;
  if (!digits(listen.substr(colon + 1), port) || port > 65535)
    return source_names(name) + ": invalid port in '" + listen + "'";
  boost::system::error_code ec;
  boost::asio::ip::make_address(host, ec);
  if (ec) return source_names(name) + ": invalid address '" + host + "' (an IP address: 127.0.0.1, 0.0.0.0, [::1])";
  port_out = static_cast<std::uint16_t>(port);
  return {};
}

std::string check_listen(config& c, const std::string& listen) {
  std::string host;
  std::uint16_t port = 0;
  if (auto e = split_host_port("listen", listen, host, port); !e.empty()) return e;
  c.listen = listen;
  c.listen_host = host;
  c.listen_port = port;
  return {};
}

const std::vector<setting>& settings() {
  static const std::vector<setting> all = [] {
    std::vector<setting> s;
    // (Parsed where it is used, by check(): the demo ignores it.)
    s.push_back(text("pg", "libpq connection string or URI (PG* environment honoured)", &config::pg,
                     on_serve | on_stream));
    s.push_back(text("slot", "logical replication slot (created if missing)", &config::slot, on_serve | on_stream,
                     [](const std::string& v) -> std::string {
                       return protocol::valid_slot_name(v)
                                  ? std::string()
                                  : source_names("slot") + ": invalid slot name '" + v +
                                        "': use 1-63 characters of a-z, 0-9 and _";
                     }));
    s.push_back(list("publication", "publication(s) to stream", &config::publications, on_serve | on_stream,
                     [](const std::string& v) {
                       return v.empty() ? source_names("publication") + ": an empty name" : std::string();
                     }));
    s.push_back(number("status-interval", "status update interval while idle, ms (100-60000)", &config::status_interval_ms,
                       100, 60'000, on_serve | on_stream, " ms"));
    s.push_back(text("create-publication",
                     "create the publication if missing: 'ALL TABLES' or a table list (schema.t1,\"Other Schema\".\"T 2\")",
                     &config::create_publication, on_serve, [](const std::string& v) -> std::string {
                       if (v.empty() || v == "ALL TABLES" || v == "all") return {};
                       std::string why;
                       if (!proxy::parse_table_list(v, false, true, why)) return source_names("create-publication") + ": " + why;
                       return {};
                     }));
    setting listen{"listen", "HOST:PORT to serve on", kind::text, on_serve | on_demo,
                   [](config& c, const std::vector<std::string>& v) -> fault {
                     if (auto e = check_listen(c, v.front()); !e.empty()) return {false, e};
                     return {};
                   },
                   [](const config& c, toml::table& t, const char* key) { t.insert(key, c.listen); }};
    s.push_back(listen);
    s.push_back(setting{"replication-listen",
                        "HOST:PORT of walgate's own walsender: replication clients (pg_recvlogical) read the log there "
                        "(a loopback address, or any with --replication-users)",
                        kind::text, on_serve,
                        [](config& c, const std::vector<std::string>& v) -> fault {
                          if (v.front().empty()) {   // (off: what --print-config writes when it is)
                            c.replication_listen.clear();
                            return {};
                          }
                          std::string host;
                          std::uint16_t port = 0;
                          if (auto e = split_host_port("replication-listen", v.front(), host, port); !e.empty()) return {false, e};
                          c.replication_listen = v.front();
                          c.replication_listen_host = host;
                          c.replication_listen_port = port;
                          return {};
                        },
                        [](const config& c, toml::table& t, const char* key) {
                          t.insert(key, c.replication_listen);
                        }});
    s.push_back(text("replication-users",
                     "file of replication users and their SCRAM-SHA-256 verifiers, a \"NAME VERIFIER\" line each "
                     "(walgate replication-user NAME prints one); replication clients then authenticate with SCRAM",
                     &config::replication_users, on_serve));
    s.push_back(number("replication-slot-max-mb",
                       "event log a downstream slot may hold (retention keeps what it has not confirmed) before it "
                       "is invalidated, as max_slot_wal_keep_size; 0: no limit",
                       &config::replication_slot_max_mb, 0, 16'777'216, on_serve));
    s.push_back(choice<bool>("replication-sql",
                             "none: SQL on a replication connection is an error; forward: one statement runs on the "
                             "upstream in a READ ONLY transaction, rolled back, its result relayed (subscribers' catalog queries)",
                             &config::replication_sql_forward, {{"none", false}, {"forward", true}}));
    s.push_back(text("replication-sql-pg",
                     "libpq conninfo forwarded SQL runs on: a role without REPLICATION that may read the catalogs "
                     "(empty: --pg's, walgate's own role)",
                     &config::replication_sql_pg, on_serve));
    s.push_back(number("replication-timeout", "a replication client silent this long is disconnected, s (1-3600)",
                       &config::replication_timeout_s, 1, 3600, on_serve, " s"));
    s.push_back(text("data-dir", "directory of the event log", &config::data_dir, on_serve,
                     [](const std::string& v) {
                       return v.empty() ? source_names("data-dir") + ": an empty path" : std::string();
                     }));
    s.push_back(flag("allow-unauthenticated", "allow a non-loopback --listen without authentication",
                     &config::allow_unauthenticated));
    s.push_back(choice<bool>("auth", "none, or jwt: stream clients need a bearer token (a JWT) verified with the key files",
                             &config::auth_jwt, {{"none", false}, {"jwt", true}}));
    s.push_back(text("jwt-secret-file", "file of the HMAC secret of HS256/384/512 tokens (at least 32 bytes)",
                     &config::jwt_secret_file));
    s.push_back(text("jwks-file", "JWKS file (RFC 7517) of the RSA, EC, Ed25519 or HMAC keys tokens are verified with",
                     &config::jwks_file));
    s.push_back(text("policy", "TOML file of [[grant]]s: the tables and ops each token may see, from its claims",
                     &config::policy_file));
    s.push_back(text("jwt-issuer", "the iss tokens must have (empty: not checked)", &config::jwt_issuer));
    s.push_back(text("jwt-audience", "an aud tokens must have (empty: not checked)", &config::jwt_audience));
    s.push_back(text("metrics-claim",
                     "NAME=VALUE: the claim a token needs for /metrics with --auth jwt (a JSON true matches true)",
                     &config::metrics_claim, on_serve, [](const std::string& v) -> std::string {
                       return v.find('=') != std::string::npos && v.front() != '='
                                  ? std::string()
                                  : source_names("metrics-claim") + ": '" + v +
                                        "' is not NAME=VALUE (a claim and the value it must have: walgate_admin=true)";
                     }));
    s.push_back(number("jwt-leeway", "clock skew allowed on exp, nbf and iat, s (0-3600)", &config::jwt_leeway_s, 0, 3600,
                       on_serve, " s"));
    s.push_back(choice<bool>("jwt-exp", "required: a token without exp is refused; optional", &config::jwt_require_exp,
                             {{"required", true}, {"optional", false}}));
    s.push_back(text("tls-cert", "PEM certificate chain for HTTPS/WSS", &config::tls_cert));
    s.push_back(text("tls-key", "PEM private key for HTTPS/WSS", &config::tls_key));
    // Megabyte figures stay far from overflowing when shifted into bytes.
    s.push_back(number("client-lag-mb", "a client further behind than this is disconnected (1-65536)",
                       &config::client_lag_mb, 1, 65'536));
    s.push_back(number("retention-mb", "event log kept on disk (1-16777216)", &config::retention_mb, 1,
                       std::uint64_t{1} << 24));
    s.push_back(number("tail-mb", "newest events (and their encodings) kept in memory for live clients (1-65536)",
                       &config::tail_mb, 1, 65'536));
    s.push_back(number("max-clients", "stream clients at once (more get 503); 0: 10000, or what the open-file limit allows",
                       &config::max_clients, 0, 1'000'000));
    s.push_back(number("max-streams-per-subject",
                       "streams of one token subject (sub) at once, /v1/mux subscriptions included (more get 429); 0: no limit",
                       &config::max_streams_per_subject, 0, 1'000'000));
    s.push_back(number("max-streams-per-address",
                       "streams from one address (IPv4, or IPv6 /64) at once (more get 429); 0: no limit",
                       &config::max_streams_per_address, 0, 1'000'000));
    s.push_back(number("auth-failures-per-minute",
                       "invalid tokens from one address in a minute before its stream requests get 429 until the minute "
                       "ends (and, counted apart, failed replication passwords before its replication connections are "
                       "refused); 0: no limit",
                       &config::auth_failures_per_minute, 0, 1'000'000));
    s.push_back(number("max-connections-per-address",
                       "connections of one address that are not streams (waiting for or answering a request); at the "
                       "limit a new one replaces its oldest idle one (1-100000)",
                       &config::max_connections_per_address, 1, 100'000));
    s.push_back(number("max-other-connections",
                       "connections that are not streams, in all, beside --max-clients (16-100000)",
                       &config::max_other_connections, 16, 100'000));
    s.push_back(number("snapshots-per-minute-per-address",
                       "per-client snapshots (snapshot=true) one address may begin in a minute (more get 429); 0: no limit",
                       &config::snapshots_per_minute_address, 0, 1'000'000));
    s.push_back(number("snapshots-per-minute-per-subject",
                       "per-client snapshots one token subject may begin in a minute (more get 429); 0: no limit",
                       &config::snapshots_per_minute_subject, 0, 1'000'000));
    s.push_back(number("snapshots-per-minute-per-mux",
                       "per-client snapshots one /v1/mux connection may begin in a minute (more get 429); 0: no limit",
                       &config::snapshots_per_minute_mux, 0, 1'000'000));
    s.push_back(number("group-max-mb",
                       "a group=transaction message is split into parts past this many MiB of events (1-1024)",
                       &config::group_max_mb, 1, 1024));
    s.push_back(number("ws-max-subscriptions", "subscriptions on one multiplexed WebSocket, /v1/mux (1-10000)",
                       &config::ws_max_subscriptions, 1, 10'000));
    s.push_back(number("send-threads",
                       "threads that write to plain-TCP WebSocket clients beside the event loop (0-16); 0: the loop writes",
                       &config::send_threads, 0, 16));
    s.push_back(list("allow-origin", "origin (scheme://host[:port], or *) whose pages may read the stream across origins",
                     &config::allow_origins, on_serve, [](const std::string& o) -> std::string {
                       bool ok = o == "*" || ((o.rfind("http://", 0) == 0 || o.rfind("https://", 0) == 0) &&
                                              o.find('/', o.find("://") + 3) == std::string::npos &&
                                              o.size() > o.find("://") + 3);
                       return ok ? std::string()
                                 : source_names("allow-origin") + ": '" + o +
                                       "' is not an origin: use scheme://host[:port] (no path), or *";
                     }));
    s.push_back(list("allow-host",
                     "Host name served on a loopback --listen besides localhost (a reverse proxy's public name; * for any)",
                     &config::allow_hosts));
    s.push_back(text("debezium-name", "Debezium source.name", &config::debezium_name));
    s.push_back(text("debezium-db", "Debezium source.db on an edge (the origin's database name; the stream does not carry it)",
                     &config::debezium_db, on_edge));
    s.push_back(flag("debezium-transaction-metadata",
                     "debezium streams carry transaction records and each change's transaction block unless a request "
                     "says transactions=false (provide.transaction.metadata)",
                     &config::debezium_transaction_metadata));
    s.push_back(choice<encoder_options::decimal_mode>(
        "debezium-decimal-mode", "string, double or precise", &config::decimal,
        {{"string", encoder_options::decimal_mode::string},
         {"double", encoder_options::decimal_mode::double_},
         {"precise", encoder_options::decimal_mode::precise}}));
    s.push_back(choice<encoder_options::time_precision>(
        "debezium-time-precision", "adaptive_time_microseconds or connect", &config::time,
        {{"adaptive_time_microseconds", encoder_options::time_precision::adaptive_time_microseconds},
         {"connect", encoder_options::time_precision::connect}}));
    s.push_back(choice<bool>(
        "streaming",
        "on: PostgreSQL 14+ sends large transactions while they run (held here until their commit); off: at commit",
        &config::streaming, {{"on", true}, {"off", false}}));
    s.push_back(choice<bool>(
        "failover-slot",
        "on: on PostgreSQL 17+ the slot is a failover slot, synchronised to standbys (sync_replication_slots) so that the "
        "stream goes on from a promoted one; off: it is not",
        &config::failover_slot, {{"on", true}, {"off", false}}));
    s.push_back(text("origin",
                     "none: changes replayed from a replication origin are not streamed (bidirectional setups); any "
                     "(PostgreSQL 16+)",
                     &config::origin, on_serve, [](const std::string& v) -> std::string {
                       return v.empty() || v == "none" || v == "any"
                                  ? std::string()
                                  : source_names("origin") + ": '" + v + "' is not one of none any";
                     }));
    s.push_back(choice<bool>(
        "snapshot",
        "initial: when walgate creates the slot, the rows of the published tables go into the log first; never: changes only",
        &config::initial_snapshot, {{"initial", true}, {"never", false}}));
    s.push_back(number("snapshot-workers", "connections copying the initial snapshot (1-64)", &config::snapshot_workers, 1, 64));
    s.push_back(number("snapshot-concurrency", "per-client snapshots (snapshot=true) reading at once (1-256)",
                       &config::snapshot_concurrency, 1, 256));
    s.push_back(number("snapshot-queue", "snapshot requests waiting for one of those; more get 503 (0-100000)",
                       &config::snapshot_queue, 0, 100'000));
    s.push_back(number("snapshot-timeout", "statement timeout of a snapshot's copy of a table, s (1-86400)",
                       &config::snapshot_timeout_s, 1, 86'400, on_serve, " s"));
    s.push_back(number("snapshot-client-kb", "encoded snapshot rows held per client before the copy waits (64-1048576)",
                       &config::snapshot_client_kb, 64, 1'048'576));
    s.push_back(list("nats", "NATS server URL(s), nats://host:port: publish the event log to JetStream (with --nats-stream)",
                     &config::nats, on_serve, [](const std::string& u) -> std::string {
                       return u.rfind("nats://", 0) == 0 || u.rfind("tls://", 0) == 0
                                  ? std::string()
                                  : source_names("nats") + ": '" + u + "' is not a NATS URL: use nats://host:port";
                     }));
    s.push_back(text("nats-stream", "the JetStream stream the event log is published to (created if missing)",
                     &config::nats_stream, on_serve, [](const std::string& v) -> std::string {
                       bool ok = v.empty() || (v.size() <= 255 &&
                                 v.find_first_of(" \t\r\n.*>/\\") == std::string::npos);
                       return ok ? std::string()
                                 : source_names("nats-stream") + ": '" + v +
                                       "' cannot name a stream (no spaces, '.', '*', '>', '/' or '\\')";
                     }));
    s.push_back(text("nats-subject-prefix", "subjects <prefix>.<schema>.<table> and <prefix>.~message",
                     &config::nats_subject_prefix, on_serve, [](const std::string& v) -> std::string {
                       bool ok = !v.empty() && v.front() != '.' && v.back() != '.' && v.find("..") == std::string::npos;
                       for (char ch : v)
                         ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                                     ch == '_' || ch == '-' || ch == '.');
                       return ok ? std::string()
                                 : source_names("nats-subject-prefix") + ": '" + v +
                                       "' is not a subject prefix: dot-separated tokens of A-Z a-z 0-9 _ -";
                     }));
    s.push_back(number("nats-replicas", "replicas of the stream walgate creates, and checks (1-5)", &config::nats_replicas, 1, 5));
    s.push_back(number("nats-max-mb", "the stream's size limit, MiB, oldest dropped past it (0: no limit; 0-16777216)",
                       &config::nats_max_mb, 0, std::uint64_t{1} << 24));
    s.push_back(number("nats-max-age", "the stream's age limit, s (0: no limit; 0-315360000)", &config::nats_max_age_s, 0,
                       315'360'000, on_serve, " s"));
    s.push_back(flag("no-fsync", "do not fdatasync the event log (benchmarks only: acknowledges unsynced data)",
                     &config::no_fsync));
    return s;
  }();
  return all;
}

const setting* find(std::string_view name) {
  for (const auto& s : settings())
    if (name == s.name) return &s;
  return nullptr;
}

std::vector<std::string> split_list(const std::string& v) {
  std::vector<std::string> out;
  if (v.empty()) return out;
  std::size_t start = 0;
  while (true) {
    auto c = v.find(',', start);
    out.push_back(v.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) break;
    start = c + 1;
  }
  return out;
}

/// Sets s from values that came from `from` (how a syntax error names the source).
std::string apply(config& c, const setting& s, std::vector<std::string> values, const std::string& from) {
  if (s.k != kind::list && values.size() > 1) values = {values.back()};   // the last one given wins
  if (values.empty() && s.k != kind::list) values.emplace_back();   // (an empty list stays empty)
  auto f = s.set(c, values);
  if (f.message.empty()) return {};
  return f.syntax ? from + ": " + f.message : f.message;
}

/// What each setting was given, and by whom (for a syntax error's name): later sources replace
/// earlier ones, and only the value that wins is checked.
struct given_value {
  std::vector<std::string> values;
  std::string from;
};
using assignments = std::map<const setting*, given_value>;

std::string load_file(assignments& out, const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return "--config " + path + ": " + std::string(e.description());
  }
  for (const auto& [key, node] : t) {
    std::string k(key.str());
    const setting* s = find(k);
    if (!s) return "--config " + path + ": unknown setting '" + k + "'";
    std::vector<std::string> values;
    if (auto v = node.value_exact<std::string>()) values.push_back(*v);
    else if (auto i = node.value_exact<std::int64_t>()) values.push_back(*i < 0 ? "-" : std::to_string(*i));
    else if (auto b = node.value_exact<bool>()) values.push_back(*b ? "true" : "false");
    else if (auto* arr = node.as_array()) {
      for (const auto& el : *arr) {
        auto sv = el.value_exact<std::string>();
        if (!sv) return "--config " + path + ": " + k + ": a list of strings is expected";
        values.push_back(*sv);
      }
      if (s->k != kind::list) return "--config " + path + ": " + k + ": one value is expected, not a list";
    } else {
      return "--config " + path + ": setting '" + k + "' has an unsupported type";
    }
    if (s->k == kind::list && !node.as_array()) values = split_list(values.front());
    // (A file's list is taken as it is: its items are not split at commas.)
    out[s] = {std::move(values), "--config " + path + ": " + k};
  }
  return {};
}

/// The password of a conninfo (keywords or URI) replaced by ********, in keyword form.
std::string masked_conninfo(const std::string& pg) {
  if (pg.empty()) return pg;
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(pg.c_str(), &err);
  if (!opts) {
    if (err) PQfreemem(err);
    return "(unparsable)";
  }
  std::string out;
  for (auto* o = opts; o->keyword; ++o) {
    if (!o->val) continue;
    // Every secret libpq knows (password, sslpassword…: shown as '*' by its own dialogs).
    const bool secret = (o->dispchar && o->dispchar[0] == '*') || std::string(o->keyword).find("password") != std::string::npos;
    std::string v = secret ? "********" : o->val;
    std::string q;
    for (char ch : v) {
      if (ch == '\'' || ch == '\\') q += '\\';
      q += ch;
    }
    out += (out.empty() ? "" : " ") + std::string(o->keyword) + "='" + q + "'";
  }
  PQconninfoFree(opts);
  return out;
}

}  // namespace

std::string env_name(std::string_view name) {
  std::string out = "WALGATE_";
  for (char c : name) out.push_back(c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  return out;
}

load_result load(config& c, int argc, char** argv) {
  load_result r;
  // --config is needed before the flags are parsed (they override what it sets).
  std::string file;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--config") file = argv[i + 1];
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind("--config=", 0) == 0) file = std::string(argv[i]).substr(9);
  if (file.empty())
    if (const char* v = std::getenv("WALGATE_CONFIG")) file = v;
  assignments given;
  if (!file.empty()) {
    r.error = load_file(given, file);
    if (!r.error.empty()) return r;
  }
  for (const auto& s : settings()) {
    std::string name = env_name(s.name);
    if (const char* v = std::getenv(name.c_str()))
      given[&s] = {s.k == kind::list ? split_list(v) : std::vector<std::string>{v}, name};
  }

  CLI::App app{"walgate — PostgreSQL logical replication as JSON for browsers, WebSocket clients and curl\n"
               "Settings: flags over WALGATE_<FLAG> environment variables over the --config TOML file."};
  app.set_version_flag("--version", "walgate 0.1.0");
  std::string config_flag;
  bool print_config = false;
  app.add_option("--config", config_flag, "TOML config file (keys as the long flags without --)");
  app.add_flag("--print-config", print_config,
               "print the configuration (file, environment and flags combined, checked; the password masked) as TOML "
               "and exit");
  auto* demo = app.add_subcommand("demo", "a throwaway PostgreSQL with a trickle of changes, and the gateway");
  auto* stream = app.add_subcommand("stream", "stream from a server and print each decoded message");
  auto* edge = app.add_subcommand("edge", "serve the HTTP API from a JetStream stream an origin walgate publishes (--nats)");
  stream->add_option("--capture", c.capture, "append every byte read from the server to FILE");
  auto* slots_cmd = app.add_subcommand("slots", "list the downstream slots of a data directory (walgate's walsender), as TOML");
  slots_cmd->add_option("--data-dir", c.slots_data_dir, "the data directory (default: --data-dir's)");
  auto* replication_user = app.add_subcommand(
      "replication-user",
      "print a --replication-users line for NAME: its SCRAM-SHA-256 verifier, from a password read on stdin");
  replication_user->add_option("NAME", c.replication_user_name, "the user name replication clients give")->required();
  replication_user->add_option("--iterations", c.replication_user_iterations,
                               "PBKDF2 iterations (PostgreSQL's scram_iterations; default 4096)")
      ->check(CLI::Range(1u, 10'000'000u));
  // Each setting's flag on each command that takes it: the text is kept and set as the file's
  // and the environment's values are, after them.
  struct flag_option {
    const setting* s;
    CLI::Option* opt;
    std::vector<std::string> values;
    bool on = false;
  };
  std::deque<flag_option> flags;
  const config defaults;
  for (const auto& s : settings()) {
    for (auto [cmd, bit] : {std::pair{&app, on_serve}, {demo, on_demo}, {stream, on_stream}, {edge, on_edge}}) {
      if (bit == on_edge ? !((s.commands & on_edge) || ((s.commands & on_serve) && edge_takes(s.name))) : !(s.commands & bit))
        continue;
      auto& g = flags.emplace_back();
      g.s = &s;
      std::string flag_name = std::string("--") + s.name;
      if (s.k == kind::flag) {
        g.opt = cmd->add_flag(flag_name, g.on, s.help);
      } else {
        g.opt = cmd->add_option(flag_name, g.values, s.help);
        if (s.k == kind::list) g.opt->delimiter(',')->type_name("LIST");
        else g.opt->expected(1)->type_name(s.k == kind::number ? "N" : std::string(s.name) == "listen" || std::string(s.name) == "replication-listen" ? "HOST:PORT" : "TEXT");
        toml::table t;
        s.show(defaults, t, "v");
        if (auto v = t["v"].value<std::string>(); v && !v->empty()) g.opt->default_str(*v);
        else if (auto n = t["v"].value<std::int64_t>()) g.opt->default_str(std::to_string(*n));
      }
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version: 0. Any other (an unknown flag, a value missing or not taken): CLI11's
    // message on stderr, and 2 as for every wrong setting (not CLI11's own codes, 105-115).
    r.cmd = command::exit_now;
    r.exit_code = app.exit(e) == static_cast<int>(CLI::ExitCodes::Success) ? 0 : 2;
    return r;
  }
  for (auto& g : flags) {
    if (g.opt->count() == 0) continue;
    given[g.s] = {g.s->k == kind::flag ? std::vector<std::string>{g.on ? "true" : "false"} : g.values,
                  std::string("--") + g.s->name};
  }
  // In the table's order, so that the first wrong setting is the one reported whatever its source.
  for (const auto& s : settings()) {
    auto it = given.find(&s);
    if (it == given.end()) continue;
    r.error = apply(c, s, it->second.values, it->second.from);
    if (!r.error.empty()) return r;
  }
  r.cmd = print_config ? command::print_config
          : *replication_user ? command::replication_user
          : *slots_cmd ? command::slots
          : *demo     ? command::demo
          : *stream   ? command::stream
          : *edge     ? command::edge
                      : command::serve;
  r.error = check(c, r.cmd);
  return r;
}

bool listens_on_loopback(const config& c) {
  boost::system::error_code ec;
  auto a = boost::asio::ip::make_address(c.listen_host, ec);
  return !ec && a.is_loopback();
}

std::string check(const config& c, command cmd) {
  if (cmd == command::serve) {
    if (c.pg.empty()) return "--pg is required (or WALGATE_PG, or pg in the --config file); see walgate --help";
    if (c.publications.empty()) return "--publication is required (or WALGATE_PUBLICATION, or publication in the --config file)";
  }
  if (cmd == command::serve || cmd == command::stream || (cmd == command::print_config && !c.pg.empty())) {
    // (walgate stream may take everything from the PG* environment, as libpq does.)
    auto parsed = proxy::parse_conninfo(c.pg);
    if (!parsed.params) return source_names("pg") + ": " + parsed.error;
  }
  if (cmd == command::replication_user) {
    const auto& n = c.replication_user_name;
    if (n.empty() || n.size() > 63) return "replication-user: NAME has 1 to 63 bytes";
    for (unsigned char ch : n)
      if (ch <= ' ' || ch == 0x7f) return "replication-user: NAME holds a space or a control character";
    if (n[0] == '#') return "replication-user: NAME cannot start with # (the users file's comments do)";
  }
  if (cmd == command::edge && (c.nats.empty() || c.nats_stream.empty()))
    return "walgate edge needs --nats and --nats-stream (the stream an origin walgate publishes to)";
  if (cmd == command::serve || cmd == command::demo || cmd == command::edge || cmd == command::print_config) {
    if (c.tls_cert.empty() != c.tls_key.empty()) return "--tls-cert and --tls-key go together";
    if (c.nats.empty() != c.nats_stream.empty()) return "--nats and --nats-stream go together";
    if (c.auth_jwt && c.jwt_secret_file.empty() && c.jwks_file.empty())
      return "--auth jwt needs a key file: --jwt-secret-file or --jwks-file (or both)";
    if (!c.auth_jwt && (!c.jwt_secret_file.empty() || !c.jwks_file.empty() || !c.jwt_issuer.empty() ||
                        !c.jwt_audience.empty() || !c.policy_file.empty()))
      return "--jwt-secret-file, --jwks-file, --jwt-issuer, --jwt-audience and --policy go with --auth jwt";
    if (!c.auth_jwt && c.metrics_claim != config{}.metrics_claim)
      return "--metrics-claim goes with --auth jwt (without it /metrics needs no token)";
    if (!c.replication_users.empty() && c.replication_listen.empty())
      return "--replication-users goes with --replication-listen";
    if (!c.replication_listen.empty() && c.replication_users.empty()) {
      boost::system::error_code ec;
      if (!boost::asio::ip::make_address(c.replication_listen_host, ec).is_loopback() || ec)
        return source_names("replication-listen") + ": " + c.replication_listen +
               " is not a loopback address and replication clients are not authenticated: give "
               "--replication-users (SCRAM-SHA-256), or listen on 127.0.0.1 or [::1] (trust)";
    }
    if (!listens_on_loopback(c) && !c.auth_jwt && !c.allow_unauthenticated)
      return "--listen " + c.listen +
             " is not a loopback address and authentication is not configured: use --auth jwt, or pass "
             "--allow-unauthenticated to serve the stream to anyone who can reach it";
  }
  return {};
}

std::string print(const config& c) {
  toml::table t;
  for (const auto& s : settings()) s.show(c, t, s.name);
  t.insert_or_assign("pg", masked_conninfo(c.pg));
  std::ostringstream o;
  o << "# walgate --print-config: the file, WALGATE_* and flags combined (the password in pg masked)\n" << t << "\n";
  return o.str();
}

}  // namespace walgate::cli
