// The walgate executable's configuration: one typed struct, filled from the TOML file (--config
// or WALGATE_CONFIG), then WALGATE_<NAME> variables, then flags — every value through the same
// parse and checks whatever set it, so a wrong value is the same one-line error from any
// source — and printed back by --print-config (secrets masked).
#pragma once

#include "walgate/transform/formats.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace walgate::cli {

struct config {
  std::string pg;                       ///< libpq conninfo or URI
  std::string slot = "walgate";
  std::vector<std::string> publications;
  std::string create_publication;       ///< "ALL TABLES" or a table list (stream_request.hpp's names)
  std::string listen = "127.0.0.1:8080";
  std::string listen_host = "127.0.0.1";   ///< from listen
  std::uint16_t listen_port = 8080;        ///< from listen
  std::string data_dir = "walgate-data";
  std::string replication_listen;             ///< HOST:PORT of walgate's own walsender ("": off)
  std::string replication_listen_host;        ///< from replication_listen
  std::uint16_t replication_listen_port = 0;  ///< from replication_listen
  std::string slots_data_dir;                 ///< walgate slots --data-dir D ("": --data-dir's)
  std::string replication_user_name;          ///< walgate replication-user NAME
  std::uint32_t replication_user_iterations = 4096;   ///< its --iterations
  std::string replication_users;              ///< file of "NAME VERIFIER" lines ("": trust, loopback only)
  std::size_t replication_slot_max_mb = 10240;   ///< a downstream slot holding more of the log is invalidated (0: no limit)
  std::size_t replication_timeout_s = 60;     ///< a replication client silent this long is disconnected
  bool replication_sql_forward = false;       ///< --replication-sql forward: SQL on a replication connection runs upstream, read-only
  std::string replication_sql_pg;             ///< the conninfo forwarded SQL runs on ("": --pg's)
  bool allow_unauthenticated = false;
  bool auth_jwt = false;                ///< --auth jwt: stream clients need a bearer token (a JWT)
  std::string jwt_secret_file, jwks_file, jwt_issuer, jwt_audience;
  std::string policy_file;              ///< --policy: the grants (tables, ops) tokens' claims give
  std::string metrics_claim = "walgate_admin=true";   ///< NAME=VALUE a token needs for /metrics (with --auth jwt)
  std::size_t jwt_leeway_s = 30;
  bool jwt_require_exp = true;
  std::string tls_cert, tls_key;
  int status_interval_ms = 10'000;
  std::size_t client_lag_mb = 64;
  std::size_t retention_mb = 1024;
  std::size_t tail_mb = 16;
  std::size_t max_streams_per_subject = 100;   ///< a token's sub at once (0: no limit)
  std::size_t max_streams_per_address = 0;     ///< one address (IPv4, IPv6 /64) at once (0: no limit)
  std::size_t auth_failures_per_minute = 30;   ///< invalid tokens of one address (0: no limit)
  std::size_t max_connections_per_address = 32;   ///< connections of one address that are not streams
  std::size_t max_other_connections = 256;        ///< connections that are not streams, in all
  std::size_t snapshots_per_minute_address = 300;   ///< per-client snapshots begun a minute (0: no limit)
  std::size_t snapshots_per_minute_subject = 60;
  std::size_t snapshots_per_minute_mux = 10;
  std::size_t max_clients = 0;          ///< 0: 10,000, or fewer if the open-file limit cannot hold them
  std::size_t ws_max_subscriptions = 64;   ///< subscriptions on one multiplexed WebSocket (/v1/mux)
  unsigned send_threads = 1;               ///< threads writing to plain-TCP WebSocket clients (0: the event loop)
  std::vector<std::string> allow_origins;
  std::vector<std::string> allow_hosts;
  std::string debezium_name = "walgate";
  std::string debezium_db;   // (walgate edge: source.db)
  bool debezium_transaction_metadata = false;
  std::size_t group_max_mb = 16;
  transform::encoder_options::decimal_mode decimal = transform::encoder_options::decimal_mode::string;
  transform::encoder_options::time_precision time = transform::encoder_options::time_precision::adaptive_time_microseconds;
  bool streaming = true;                ///< ask PostgreSQL 14+ to stream large transactions while they run
  bool failover_slot = true;            ///< PostgreSQL 17+: the slot is a failover slot (synchronised to standbys)
  std::string origin;                   ///< --origin none|any (PostgreSQL 16+); empty: not asked (any)
  bool no_fsync = false;
  bool initial_snapshot = true;            ///< --snapshot initial (the slot's rows into the log when walgate creates it) or never
  std::size_t snapshot_workers = 4;        ///< connections copying the initial snapshot
  std::size_t snapshot_concurrency = 4;    ///< per-client snapshots reading at once
  std::size_t snapshot_queue = 64;         ///< waiting for one; more: 503
  std::size_t snapshot_timeout_s = 300;    ///< statement timeout of a snapshot's COPY
  std::size_t snapshot_client_kb = 4096;   ///< encoded rows held per snapshot client
  // Scale-out: the event log published to a NATS JetStream stream (docs/api.md, *JetStream*).
  std::vector<std::string> nats;           ///< --nats URL,...: servers (any node of a cluster)
  std::string nats_stream;                 ///< --nats-stream NAME
  std::string nats_subject_prefix = "walgate";
  std::size_t nats_replicas = 1;
  std::size_t nats_max_mb = 0;             ///< the stream's max bytes in MiB (0: no limit)
  std::size_t nats_max_age_s = 0;          ///< the stream's max age (0: no limit)
  std::string capture;                  ///< walgate stream --capture
};

enum class command { serve, demo, stream, edge, print_config, replication_user, slots, exit_now };

struct load_result {
  command cmd = command::serve;
  int exit_code = 0;      ///< for exit_now: 0 (--help, --version) or 2 (a parse error), already printed
  std::string error;      ///< one line; exit 2
};

/// Reads the file, the environment and argv into c, with every check. An empty error and
/// cmd != exit_now: run cmd.
load_result load(config& c, int argc, char** argv);
/// The checks across settings for a command (what is required, what goes together); the
/// error names the settings.
std::string check(const config& c, command cmd);
/// The configuration as a TOML file that load() reads back to the same configuration, every
/// setting in it; the password in pg is masked.
std::string print(const config& c);
/// The listen address is a loopback one (served without authentication by default).
bool listens_on_loopback(const config& c);
/// WALGATE_<NAME> for a setting's name ("client-lag-mb" -> WALGATE_CLIENT_LAG_MB).
std::string env_name(std::string_view name);

}  // namespace walgate::cli
