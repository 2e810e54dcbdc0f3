// walgate's own walsender (--replication-listen, issue 35): a PostgreSQL wire-protocol server for
// logical replication connections, serving the event log to replication clients (pg_recvlogical,
// PostgreSQL subscribers) as the upstream server would — one upstream slot, any number of
// downstream slots, each with its own position, stored in the data directory.
//
// What it serves: TLS on an SSLRequest with --tls-cert/--tls-key; SCRAM-SHA-256 (and -PLUS on
// TLS) against the verifiers of --replication-users (PostgreSQL's rolpassword form; a user not in
// the file gets the same exchange and the same 28P01 as a wrong password), or trust when no users
// file is given (the configuration then allows a loopback address only); failed authentications
// counted per address (--auth-failures-per-minute, as tokens are), IDENTIFY_SYSTEM, SHOW, the SQL
// libpq's replication clients send by themselves, CREATE_REPLICATION_SLOT … LOGICAL test_decoding,
// wal2json or pgoutput (snapshot 'nothing'), DROP_REPLICATION_SLOT, START_REPLICATION … LOGICAL
// with the plugin's output emulated from the log (transform/output_plugin.hpp), and with
// --replication-sql forward a statement run on the upstream read-only (run_sql, sql_forwarder).
// Other plugins, physical replication, exported snapshots and SQL otherwise are answered with an
// ErrorResponse saying so.
//
// Assumptions, tested in tests/proxy/replication_server_test.cpp:
// - every transaction a slot's client is sent is in the log whole before any of it is sent (the
//   log makes a transaction visible at its commit): a client never sees half of one;
// - a slot starts after every transaction whose commit LSN is below max(the position asked for,
//   its confirmed_flush) — PostgreSQL's rule (SnapBuildXactNeedsSkip);
// - retention keeps what a slot has not confirmed (the hold: from the oldest confirmed position
//   of the slots), until the slot holds more than --replication-slot-max-mb: then it is
//   invalidated (stored in the slots' file), its hold let go, its stream ended, and
//   START_REPLICATION fails with PostgreSQL's text for it;
// - the log may still not hold where a slot is (a slot whose events went before this process
//   held them): START_REPLICATION then fails saying so, never streaming from a later point;
// - a keepalive's walEnd is never past what the client was sent, unless it was sent everything
//   the log holds: then it is walgate's durable position (no transaction below it is missing);
// - a client's flush position is taken up to what it was sent, never past, and written to the
//   slots' file (fsync, rename) within a burst delay; a slot exists on disk once
//   CREATE_REPLICATION_SLOT's answer is sent, and is gone from it once DROP's is;
// - a client may stop reading or sending at any time: the watchdog closes it at the timeout,
//   even while a write to it waits.
// - authentication comes before anything that names the upstream (its database, its
//   parameters): an unauthenticated client learns only that walgate is not connected yet (57P03);
// Runs on the executor of the log (the log is single-threaded); the slot file is written on a
// thread of its own.
#pragma once

#include "walgate/protocol/auth.hpp"
#include "walgate/transform/output_plugin.hpp"
#include "walgate/protocol/lsn.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace walgate::proxy {

class log_reader;
class metrics_registry;

/// The upstream as walgate's walsender reports it: its cluster, timeline, database and the
/// ParameterStatus values it sent walgate (nullopt until walgate has connected to it once).
struct upstream_identity {
  std::string system_id;
  std::uint32_t timeline = 0;
  std::string dbname;
  std::map<std::string, std::string> parameters;
};

struct replication_server_options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;   ///< 0: any free port (port() says which)
  std::string data_dir;     ///< the slots' file goes here (replication-slots)
  bool fsync = true;
  std::function<std::optional<upstream_identity>()> identity;
  std::function<protocol::lsn()> durable_lsn;
  /// A client that sends nothing for this long is disconnected (wal_sender_timeout); a
  /// keepalive asking for a reply goes out after half of it.
  std::chrono::milliseconds timeout{60'000};
  std::function<void(const std::string&)> log;
  /// Keeps the log from letting go of events committed at or past an LSN (nullopt: none): the
  /// oldest confirmed position of the slots (event_log::hold_from_lsn).
  std::function<void(std::optional<protocol::lsn>)> hold;
  /// A slot holding more of the log than this — and than retention_bytes, which the log keeps
  /// anyway — is invalidated (0: no limit).
  std::uint64_t slot_max_bytes = 0;
  std::uint64_t retention_bytes = 0;
  /// The users file (--replication-users): SCRAM-SHA-256 when given; "" is trust.
  std::string users_file;
  /// Failed authentications of an address a minute before it waits (0: no limit).
  std::size_t auth_failures_per_minute = 30;
  /// --tls-cert/--tls-key: an SSLRequest is answered 'S' and the connection goes on in TLS (and
  /// SCRAM-SHA-256-PLUS is offered, bound to this certificate); "" : 'N'.
  std::string tls_cert, tls_key;
  /// walgate's publications (--publication): what a pgoutput subscriber may ask for.
  std::vector<std::string> publications;
  /// --replication-sql forward: runs a SQL statement upstream read-only and calls done, on the
  /// event loop, with the backend messages to relay (sql_forwarder); unset: SQL is an error.
  std::function<void(std::string sql, std::function<void(std::string)> done)> run_sql;
  /// Looks up the tables walgate's publications publish (and their NOT NULL columns), off the
  /// loop; done on the loop with them, or nullopt and why. Unset: tables a client names are not
  /// checked, and wal2json's include-not-null is refused.
  using table_list = std::vector<transform::published_table>;
  std::function<void(std::function<void(std::optional<table_list>, std::string)> done)> published_tables;
};

/// The users of a --replication-users file: a "NAME VERIFIER" line each, the verifier in
/// PostgreSQL's form (SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, what
/// `walgate replication-user NAME` prints and pg_authid.rolpassword holds); blank lines and lines
/// starting with # are skipped. False with error naming the line on a bad line or a name given twice.
bool parse_replication_users(std::string_view text, std::map<std::string, protocol::scram_verifier>& users,
                             std::string& error);

class replication_server {
 public:
  replication_server(boost::asio::io_context& io, replication_server_options o, log_reader& log);
  ~replication_server();
  replication_server(const replication_server&) = delete;
  replication_server& operator=(const replication_server&) = delete;

  /// Reads the slots' file and listens. False with error set when either fails.
  bool start(std::string& error);
  std::uint16_t port() const;
  /// Closes the listener and every connection.
  void stop();
  /// Reads the users file again (SIGHUP); the users in use stay when it cannot be used. False
  /// with error then, or when there is no users file.
  bool reload_users(std::string& error);
  std::size_t users() const;
  /// Reads --tls-cert/--tls-key again (SIGHUP), for connections from now on; the certificate in
  /// use stays when they cannot be used. False with error then, or when there is no TLS.
  bool reload_tls(std::string& error);

  /// What /metrics shows of one downstream slot.
  struct slot_figures {
    std::string name;
    std::string plugin;
    bool two_phase = false, failover = false;
    protocol::lsn confirmed;
    std::uint64_t held_bytes = 0;   ///< the log it keeps from retention (log_reader::bytes_held_from)
    bool active = false, temporary = false, invalidated = false;
  };
  std::vector<slot_figures> slots() const;
  std::size_t connections() const;
  std::uint64_t auth_failures() const;
  /// GET /v1/slots: {"slots":[{"slot", "plugin", "confirmed_flush_lsn", "held_bytes", "active",
  /// "temporary", "two_phase", "failover", "invalidated"}, …]}, by name.
  std::string slots_json() const;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

/// Registers the walsender's metrics (per slot: walgate_replication_slot_confirmed_lsn,
/// _held_bytes, _active, _invalidated; walgate_replication_connections,
/// walgate_replication_auth_failures_total), read through get (nullptr: none yet).
/// `walgate slots --data-dir D`: the slots' file of a data directory, one TOML [[slot]] table
/// each (name, plugin, confirmed_flush_lsn, two_phase, failover, invalidated); false with error
/// when it cannot be read (no file: no slots, true).
bool describe_slots_file(const std::string& data_dir, std::string& out, std::string& error);

void register_replication_metrics(metrics_registry& r, std::function<const replication_server*()> get);

}  // namespace walgate::proxy
