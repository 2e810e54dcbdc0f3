// walgate [serve]: the gateway — the replication stream into the event log, the log to clients.
// Also walgate edge (run_edge), which shares the server's options and the reloads on SIGHUP.
// Over 600 lines. serve() (about 220) is the start in order: the log opened and recovered, the
// publication, the spill directory, the initial snapshot's state, the replication client, the
// publisher, the server, the signals; each object lives on its stack, holding references to the
// ones before, until io.run() returns, so it stays one function. Seams if it grows: run_edge
// (about 85 lines) with reloads and server_options_of could be edge.cpp over a small internal
// header; the PostgreSQL helpers (ensure_publication, drop_unfinished_slot, watch_slot,
// slot_confirmed: about 100 lines) could be a file of their own. The spill directory is
// prepared in both commands, nearly alike.
#include "commands.hpp"

#include "walgate/protocol/commands.hpp"
#include "walgate/proxy/auth.hpp"
#include "walgate/proxy/event_log.hpp"
#include "walgate/proxy/failover.hpp"
#include "walgate/proxy/gateway.hpp"
#include "walgate/proxy/history.hpp"
#include "walgate/proxy/initial_snapshot.hpp"
#include "walgate/proxy/jetstream.hpp"
#include "walgate/proxy/pg_connection.hpp"
#include "walgate/proxy/replication_client.hpp"
#include "walgate/proxy/replication_server.hpp"
#include "walgate/proxy/sql_forwarder.hpp"
#include "walgate/proxy/server.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <libpq-fe.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>

namespace walgate::cli {

namespace asio = boost::asio;

void log_line(const std::string& s) {
  std::fprintf(stderr, "walgate: %s\n", s.c_str());
  std::fflush(stderr);
}

std::string exception_text(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
  }
  return "unknown exception";
}

namespace {

asio::awaitable<proxy::outcome<void>> ensure_publication(proxy::conn_params conn, std::string name, std::string what) {
  proxy::pg_connection c(co_await asio::this_coro::executor);
  if (auto r = co_await c.connect(conn, false); !r) co_return r.error();
  auto exists = co_await c.query("SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = " + protocol::quote_literal(name));
  if (!exists) co_return exists.error();
  if (!exists->rows.empty()) co_return proxy::outcome<void>{};
  std::string sql = "CREATE PUBLICATION " + protocol::quote_identifier(name);
  if (what == "ALL TABLES" || what == "all") {
    sql += " FOR ALL TABLES";
  } else {
    sql += " FOR TABLE ";
    std::string error;
    auto list = proxy::parse_table_list(what, false, true, error);   // (validated at start-up too)
    if (!list) co_return proxy::failure{{}, "--create-publication: " + error, {}, false};
    for (std::size_t i = 0; i < list->size(); ++i) sql += (i ? ", " : "") + proxy::sql_table_name((*list)[i]);
  }
  auto created = co_await c.query(sql);
  if (!created) co_return created.error();
  co_return proxy::outcome<void>{};
}

// The slot made for an initial snapshot that did not finish: its exported snapshot is gone, so
// it is dropped (the next start makes it and its snapshot again).
asio::awaitable<proxy::outcome<void>> drop_unfinished_slot(proxy::conn_params conn, std::string slot) {
  proxy::pg_connection c(co_await asio::this_coro::executor);
  if (auto r = co_await c.connect(conn, false); !r) co_return r.error();
  // The walsender of the process that was killed may hold the slot a moment longer (55006:
  // active): tried again for up to 30 s.
  asio::steady_timer t(co_await asio::this_coro::executor);
  for (int attempt = 0;; ++attempt) {
    auto q = co_await c.query("SELECT pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots "
                              "WHERE slot_name = " + protocol::quote_literal(slot));
    if (q) {
      if (!q->rows.empty())
        log_line("the initial snapshot was cut off last time: dropped slot " + slot + " to take it again");
      co_return proxy::outcome<void>{};
    }
    if (q.error().sqlstate != "55006" || attempt >= 150) co_return q.error();
    t.expires_after(std::chrono::milliseconds(200));
    co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

// Reads the slot's retained WAL every 10 s for /metrics (a plain SQL connection). It starts a
// second after the gateway, so the server starts the walsender's backend first, undisturbed.
/// The slot's retained WAL every 10 s, and (with --failover-slot on) whether it can survive a
/// failover at the first look and every minute: /metrics, and a log line when that changes.
asio::awaitable<void> watch_slot(proxy::conn_params conn, std::string slot, bool failover_slot, proxy::gateway_metrics& m,
                                 std::atomic<bool>& stop) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  t.expires_after(std::chrono::seconds(1));
  co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
  std::string said;   // the failover line last logged
  auto next_failover_check = std::chrono::steady_clock::now();
  while (!stop) {
    proxy::pg_connection c(co_await asio::this_coro::executor);
    if (auto r = co_await c.connect(conn, false); r) {
      while (!stop) {
        auto q = co_await c.query(
            "SELECT pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() "
            "END, restart_lsn)::bigint FROM pg_catalog.pg_replication_slots WHERE slot_name = " + protocol::quote_literal(slot));
        if (!q) break;
        m.slot_retained_wal = q->rows.empty() || !q->rows[0][0] ? -1 : std::stoll(*q->rows[0][0]);
        if (!failover_slot) {
          m.slot_failover_ready = 0;
        } else if (std::chrono::steady_clock::now() >= next_failover_check) {
          next_failover_check = std::chrono::steady_clock::now() + std::chrono::minutes(1);
          auto report = co_await proxy::check_failover(c, conn, slot);
          if (!report) break;
          m.slot_failover_ready = report->ready ? 1 : 0;
          if (auto line = report->summary(slot); line != said) {
            log_line(line);
            said = std::move(line);
          }
        }
        t.expires_after(std::chrono::seconds(10));
        co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      }
    }
    if (failover_slot) m.slot_failover_ready = -1;   // (not known while the server cannot be asked)
    said.clear();
    t.expires_after(std::chrono::seconds(10));
    co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

/// An existing log's slot's confirmed_flush_lsn, read before the log is opened: recovery never
/// cuts a transaction committed before it (it was acknowledged, so synced whole; damage there is
/// refused). Invalid when there is no log yet or the server cannot be asked (then recovery goes
/// by ACKED alone): five seconds at most.
protocol::lsn slot_confirmed(const std::string& data_dir, const std::string& conninfo, const std::string& slot) {
  bool has_log = false;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(data_dir, ec))
    has_log = has_log || e.path().filename().string().rfind("segment-", 0) == 0;
  if (!has_log) return {};
  const char* keys[] = {"connect_timeout", "dbname", "application_name", nullptr};
  const char* values[] = {"5", conninfo.c_str(), "walgate recovery check", nullptr};
  PGconn* c = PQconnectdbParams(keys, values, 1);
  protocol::lsn out;
  if (c && PQstatus(c) == CONNECTION_OK) {
    const char* params[] = {slot.c_str()};
    PGresult* r = PQexecParams(c, "SELECT confirmed_flush_lsn::text FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
                               1, nullptr, params, nullptr, nullptr, 0);
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
      if (auto l = protocol::lsn::parse(PQgetvalue(r, 0, 0))) out = *l;
    PQclear(r);
  }
  if (!out.valid()) {
    std::string why = c && PQstatus(c) != CONNECTION_OK ? std::string(PQerrorMessage(c)).substr(0, 200) : "no such slot";
    for (auto& ch : why)
      if (ch == '\n') ch = ' ';
    log_line("recovery: cannot read slot " + slot + "'s confirmed_flush_lsn before opening the event log (" + why +
             "): ACKED alone bounds what recovery may cut");
  }
  if (c) PQfinish(c);
  return out;
}

/// Sets the client limit so that every client, and the connections and files walgate needs
/// beside them, fit the open-file limit (raised to its hard limit first). An explicit
/// --max-clients that cannot fit is an error; the default shrinks to fit, and says so.
bool client_limit(std::size_t requested, proxy::server_options& so, std::string& error) {
  constexpr std::size_t own_files = 128;   // event log segments, PostgreSQL connections, spill files, libraries
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  const std::size_t files = rl.rlim_cur == RLIM_INFINITY ? SIZE_MAX : static_cast<std::size_t>(rl.rlim_cur);
  const std::size_t others = so.max_other_connections + own_files;
  const std::size_t fit = files > others ? files - others : 0;
  if (requested != 0) {
    if (requested > fit) {
      error = "--max-clients " + std::to_string(requested) + ": needs " + std::to_string(requested + others) +
              " open files but the limit (ulimit -n) is " + std::to_string(files) + "; raise it or lower --max-clients";
      return false;
    }
    so.max_clients = requested;
    return true;
  }
  so.max_clients = std::min<std::size_t>(10'000, fit);
  if (so.max_clients < 10'000)
    log_line("at most " + std::to_string(so.max_clients) + " clients: the open-file limit (ulimit -n) is " +
             std::to_string(files) + " (raise it, or set --max-clients, to silence this)");
  if (so.max_clients == 0) {
    error = "the open-file limit (ulimit -n) is " + std::to_string(files) + ": walgate needs at least " +
            std::to_string(others + 1);
    return false;
  }
  return true;
}

/// The gateway as the replication client's sink, with a test hook: WALGATE_TEST_THROW_IN_STREAM
/// set makes the first XLogData frame throw, as a bug in the stream path would (the tests check
/// that walgate then exits non-zero, saying why).
class stream_sink final : public proxy::replication_sink {
 public:
  /// pg: --pg; pinned: the libpq conninfo of the stream's server, set at each stream start
  /// (read by the snapshot service on the loop, while the stream runs).
  stream_sink(proxy::gateway& g, proxy::initial_snapshot* initial, std::string pg, std::string& pinned, const config& s)
      : gw_(g),
        initial_(initial),
        pg_(std::move(pg)),
        pinned_(pinned),
        s_(s),
        throw_(std::getenv("WALGATE_TEST_THROW_IN_STREAM") != nullptr) {}
  /// Set when the log must be cut before streaming on (the server's timeline left the log's
  /// history behind): serve then starts itself again, and the start makes the cut.
  bool restart_for_cut = false;

  // Which history the log follows, checked at every connection before anything is streamed.
  // Assumptions broken here (failover_test.cpp): the server is always the cluster the log came
  // from (a different system identifier: refused); a server on a later timeline shares the
  // log's WAL up to the switch point its history names and nothing after (the log past it is
  // cut: its positions may name other changes there, and the slot would skip the new
  // timeline's changes up to what walgate acknowledged on the old one).
  asio::awaitable<proxy::outcome<void>> on_connected(const proxy::stream_start_info& i) override {
    using k = proxy::history_verdict::kind;
    const std::filesystem::path dir = s_.data_dir;
    const bool fsync = !s_.no_fsync;
    const auto stored = proxy::read_followed_timeline(dir);
    // Everything visible to clients is durable first: the verdict goes by all the log holds (a
    // commit clients saw but not yet synced is history past the switch point too).
    gw_.flush();
    // (and by the last commit logged, synced or not: a sync job under way moves durable later)
    protocol::lsn reach = gw_.durable_lsn();
    if (const auto last = gw_.log().last_commit_lsn(); last.valid() && protocol::lsn{last.value + 1} > reach)
      reach = protocol::lsn{last.value + 1};
    auto v = proxy::check_history(stored, i.system_id, i.timeline, i.timeline_history, reach,
                                  "PostgreSQL at " + i.server.host + ":" + std::to_string(i.server.port), i.slot_confirmed);
    std::string error;
    switch (v.what) {
      case k::same:
        // Whether the server is a standby is kept too (check_history: a log decoded on a standby
        // follows that standby's later timelines).
        if (stored && stored->standby != i.in_recovery &&
            !proxy::write_followed_timeline(dir, {i.system_id, i.timeline, i.in_recovery}, fsync, error))
          co_return proxy::failure{{}, error, {}, false};
        co_return proxy::outcome<void>{};
      case k::retry: co_return proxy::failure{{}, v.message, {}, true};
      case k::refuse:
        if (!i.timeline_history_error.empty() && stored && stored->timeline != i.timeline)
          v.message += " (the server's timeline history could not be read: " + i.timeline_history_error + ")";
        co_return proxy::failure{{}, v.message, {}, false};
      case k::follow:
        if (!v.message.empty()) log_line(v.message);
        // A client may hold ids past the log's end from before a crash (visible, never synced):
        // on the timeline left they are not sent again, and the new one may reuse their
        // positions up to where its WAL is now — a resume from one there is answered 410.
        // (only before this process first streamed: within one, everything clients saw was
        // synced above, and a promotion followed live costs its clients nothing)
        // (not when the log's history past the switch point is the new timeline's own)
        if (!streamed_ && !v.promoted_under_us && stored && stored->timeline != i.timeline && i.server_wal_end > v.at &&
            !gw_.log().record_history_cut({v.at, i.server_wal_end, stored->timeline, i.timeline}))
          co_return proxy::failure{{}, gw_.log().error(), {}, false};
        if (!proxy::write_followed_timeline(dir, {i.system_id, i.timeline, i.in_recovery}, fsync, error))
          co_return proxy::failure{{}, error, {}, false};
        co_return proxy::outcome<void>{};
      case k::cut: break;
    }
    if (!s_.nats.empty())
      co_return proxy::failure{{}, "HISTORY DIVERGED: " + v.message + ". With --nats the JetStream stream holds that "
                                   "history too and is not cut: walgate stops. Start over with an empty --data-dir and "
                                   "stream (clients then need a new snapshot)",
                               {}, false};
    if (!proxy::write_cut_request(dir, {v.at, {}, stored->timeline, i.timeline}, fsync, error))
      co_return proxy::failure{{}, error, {}, false};
    restart_for_cut = true;
    co_return proxy::failure{{}, "HISTORY DIVERGED: " + v.message + ". The event log is cut at " + v.at.to_string() +
                                 " (what is cut is kept in damaged/ of the data directory): walgate starts again to cut "
                                 "it, then streams timeline " + std::to_string(i.timeline) +
                                 "; clients resuming from an id the cut covers (from " + v.at.to_string() +
                                 " to its last commit) are answered 410 and need a new snapshot",
                             {}, false};
  }
  asio::awaitable<proxy::outcome<void>> on_slot_created(const proxy::stream_start_info& i) override {
    if (!initial_ || !i.exported_snapshot) co_return proxy::outcome<void>{};
    // The exported snapshot exists on the stream's server alone: the copy's connections go there.
    std::string error, pinned = proxy::pinned_conninfo(pg_, i.server, i.server.address, error);
    if (pinned.empty()) co_return proxy::failure{{}, "--pg: " + error, {}, false};
    initial_->set_conninfo(std::move(pinned));
    co_return co_await initial_->run(*i.exported_snapshot, i.consistent_point);
  }
  void on_stream_start(const proxy::stream_start_info& i) override {
    streamed_ = true;
    std::string error, pinned = proxy::pinned_conninfo(pg_, i.server, i.server.address, error);
    if (!pinned.empty() && pinned != pinned_)
      log_line("streaming from PostgreSQL at " + i.server.host + ":" + std::to_string(i.server.port) +
               "; snapshots are taken there");
    pinned_ = std::move(pinned);
    gw_.on_stream_start(i);
    identity_ = proxy::upstream_identity{i.system_id, i.timeline, i.dbname, i.server_parameters};
  }
  boost::system::error_code on_xlog_data(const protocol::xlog_data& x) override {
    if (throw_) throw std::runtime_error("test hook: an exception in the stream path at " + x.wal_start.to_string());
    return gw_.on_xlog_data(x);
  }
  bool retry_after_failure() const override { return gw_.retry_after_failure(); }
  void on_keepalive(const protocol::primary_keepalive& k) override { gw_.on_keepalive(k); }
  protocol::lsn durable_lsn() const override { return gw_.durable_lsn(); }
  /// The upstream as the last stream start found it (walgate's walsender reports it).
  const std::optional<proxy::upstream_identity>& identity() const { return identity_; }

 private:
  std::optional<proxy::upstream_identity> identity_;
  proxy::gateway& gw_;
  proxy::initial_snapshot* initial_;
  std::string pg_;
  std::string& pinned_;
  const config& s_;
  bool throw_;
  bool streamed_ = false;   // (this process has streamed: what clients saw was synced before any verdict)
};

/// SIGHUP: the key files and the TLS certificate read again (the connections stay; what is in
/// use stays if that fails). The key files are also read again when they change (polled every
/// 2 s: a rotation by rewriting or renaming over the file needs no signal). Serve and edge.
class reloads {
 public:
  reloads(asio::io_context& io, const config& s, proxy::server_options& so, proxy::server& srv,
          proxy::replication_server* walsender = nullptr)
      : s_(s), so_(so), srv_(srv), walsender_(walsender), hangups_(io, SIGHUP), key_watch_(io) {
    on_hangup();
    watch_keys();
  }
  void cancel() {
    hangups_.cancel();
    key_watch_.cancel();
  }

 private:
  void on_hangup() {
    hangups_.async_wait([this](boost::system::error_code ec, int) {
      if (ec) return;
      if (so_.auth) {
        std::string e;
        if (so_.auth->reload(e)) log_line("SIGHUP: key files read again: " + std::to_string(so_.auth->keys()) + " key(s)" + grants());
        else log_line("SIGHUP: " + e + "; the keys in use stay");
      }
      if (!so_.tls_cert.empty()) {
        std::string e;
        if (srv_.reload_tls(e)) log_line("SIGHUP: TLS certificate and key read again (for new connections)");
        else log_line("SIGHUP: " + e + "; the certificate in use stays");
        if (walsender_) {
          if (walsender_->reload_tls(e)) log_line("SIGHUP: the walsender's TLS certificate and key read again (for new connections)");
          else log_line("SIGHUP: --replication-listen: " + e + "; the certificate in use stays");
        }
      }
      if (walsender_ && !s_.replication_users.empty()) {
        std::string e;
        if (walsender_->reload_users(e))
          log_line("SIGHUP: replication users read again: " + std::to_string(walsender_->users()) + " user(s)");
        else
          log_line("SIGHUP: " + e + "; the replication users in use stay");
      }
      if (!so_.auth && so_.tls_cert.empty() && s_.replication_users.empty())
        log_line("SIGHUP: nothing to read again (no --auth jwt, no TLS, no --replication-users)");
      on_hangup();
    });
  }
  void watch_keys() {
    if (!so_.auth) return;
    key_watch_.expires_after(std::chrono::seconds(2));
    key_watch_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      std::string e;
      int r = so_.auth->reload_if_changed(e);
      if (r > 0) log_line("a key file changed: read again, " + std::to_string(so_.auth->keys()) + " key(s)" + grants());
      else if (r < 0) log_line("a key file changed and cannot be used: " + e + "; the keys in use stay");
      watch_keys();
    });
  }
  std::string grants() const {
    return s_.policy_file.empty() ? "" : ", " + std::to_string(so_.auth->policy_grants()) + " grant(s)";
  }
  const config& s_;
  proxy::server_options& so_;
  proxy::server& srv_;
  proxy::replication_server* walsender_;
  asio::signal_set hangups_;
  asio::steady_timer key_watch_;
};

/// The server's options from the configuration (what serve and edge share); false, said, on an
/// error (a key file that cannot be read, a client limit that cannot be).
bool server_options_of(const config& s, const std::string& database, proxy::server_options& so) {
  std::string error;
  if (s.auth_jwt) {
    proxy::auth_options ao;
    ao.secret_file = s.jwt_secret_file;
    ao.jwks_file = s.jwks_file;
    ao.policy_file = s.policy_file;
    ao.claims.issuer = s.jwt_issuer;
    ao.claims.audience = s.jwt_audience;
    ao.claims.leeway = std::chrono::seconds(s.jwt_leeway_s);
    ao.claims.require_exp = s.jwt_require_exp;
    so.auth = std::make_shared<proxy::authenticator>(ao);
    const auto eq = s.metrics_claim.find('=');   // (NAME=VALUE: checked as the setting was read)
    so.metrics_claim = s.metrics_claim.substr(0, eq);
    so.metrics_claim_value = s.metrics_claim.substr(eq + 1);
    if (!so.auth->reload(error)) {
      log_line("--auth jwt: " + error);
      return false;
    }
    log_line("authentication: bearer tokens (JWT), " + std::to_string(so.auth->keys()) + " key(s)" +
             (s.policy_file.empty() ? "" : ", " + std::to_string(so.auth->policy_grants()) + " grant(s)") +
             (s.jwt_issuer.empty() ? "" : ", iss " + s.jwt_issuer) + (s.jwt_audience.empty() ? "" : ", aud " + s.jwt_audience) +
             "; /metrics for tokens with " + s.metrics_claim);
    // Without an audience, a token the keys' issuer signed for any of its applications is a
    // token for walgate too (an identity provider's keys usually sign for all of them).
    if (s.jwt_audience.empty())
      log_line("WARNING: --auth jwt without --jwt-audience: any token signed by these keys is accepted, whichever "
               "application it was issued for; set --jwt-audience to the aud walgate's tokens carry");
  }
  so.max_streams_per_subject = s.max_streams_per_subject;
  so.max_streams_per_address = s.max_streams_per_address;
  so.auth_failures_per_minute = s.auth_failures_per_minute;
  so.log = log_line;
  so.max_connections_per_address = s.max_connections_per_address;
  so.max_other_connections = s.max_other_connections;
  if (!client_limit(s.max_clients, so, error)) {
    log_line(error);
    return false;
  }
  so.allowed_origins = s.allow_origins;
  so.allowed_hosts = s.allow_hosts;
  so.host = s.listen_host;
  so.port = s.listen_port;
  so.tls_cert = s.tls_cert;
  so.tls_key = s.tls_key;
  so.client_lag_bytes = s.client_lag_mb << 20;
  so.ws_max_subscriptions = s.ws_max_subscriptions;
  so.send_threads = s.send_threads;
  so.encoder.server_name = s.debezium_name;
  so.debezium_transaction_metadata = s.debezium_transaction_metadata;
  so.group_max_bytes = s.group_max_mb << 20;
  so.encoder.database = database;
  so.encoder.decimal = s.decimal;
  so.encoder.time = s.time;
  so.snapshot.conninfo = s.pg;   // (serve() gives it the default target and the stream's server)
  so.snapshot.publications = s.publications;
  so.snapshot.max_running = s.snapshot_concurrency;
  so.snapshot.max_queued = s.snapshot_queue;
  so.snapshot.statement_timeout = std::chrono::seconds(s.snapshot_timeout_s);
  so.snapshot.client_bytes = s.snapshot_client_kb << 10;
  so.snapshot.per_address_minute = s.snapshots_per_minute_address;
  so.snapshot.per_subject_minute = s.snapshots_per_minute_subject;
  so.snapshot.per_connection_minute = s.snapshots_per_minute_mux;
  return true;
}

}  // namespace

/// Runs the gateway until SIGINT/SIGTERM or a failure reconnecting cannot fix.
int serve(const config& s, const std::function<void(std::uint16_t)>& on_listening) {
  // SIGHUP reads the key files and the certificate again once serving; until then (connecting,
  // creating the publication) it is ignored rather than ending the process.
  std::signal(SIGHUP, SIG_IGN);
  auto parsed = proxy::parse_conninfo(s.pg);
  if (!parsed.params) {   // (checked as the setting was read; the environment's PG* may differ now)
    log_line("--pg: " + parsed.error);
    return 2;
  }
  std::string error;
  // Which host of --pg: the one target_session_attrs names (libpq's keyword), primary when it
  // names none and there are several — for the stream and for every libpq connection
  // (snapshots, the catalog, the slot read before recovery). While the stream runs, libpq
  // connections go to its server (pinned_conninfo): an exported snapshot exists there alone.
  // (one host: whatever it is, as before — a single standby streams on 16+)
  if (!parsed.params->target_session_attrs && parsed.params->endpoints.size() > 1)
    parsed.params->target_session_attrs = proxy::session_target::primary;
  const std::string libpq_conninfo =
      parsed.params->target_session_attrs ? proxy::with_default_target(s.pg, *parsed.params->target_session_attrs, error) : s.pg;
  if (libpq_conninfo.empty()) {
    log_line("--pg: " + error);
    return 2;
  }
  if (!listens_on_loopback(s) && !s.auth_jwt)
    log_line("WARNING: serving unauthenticated on " + s.listen + ": anyone who can reach it reads every change");
  proxy::server_options so;
  if (!server_options_of(s, parsed.params->dbname, so)) return 2;
  std::string stream_conninfo;   // (the stream's server, once it runs: stream_sink)
  so.snapshot.conninfo = libpq_conninfo;
  proxy::replication_client* streaming_client = nullptr;   // (made below)
  // Pinned while the stream runs; between streams (a failover under way) libpq chooses again.
  so.snapshot.pinned = [&stream_conninfo, &streaming_client] {
    return streaming_client && streaming_client->streaming() ? stream_conninfo : std::string();
  };
  if (std::filesystem::exists(std::filesystem::path(s.data_dir) / "EDGE")) {
    log_line("--data-dir " + s.data_dir + " is a walgate edge's copy of a stream (it has an EDGE file): give this walgate a data directory of its own");
    return 1;
  }

  proxy::log_options lo;
  lo.dir = s.data_dir;
  lo.retention_bytes = s.retention_mb << 20;
  lo.memory_bytes = s.tail_mb << 20;
  lo.fsync = !s.no_fsync;
  {
    // A cut the last run asked for (the server's timeline left the log's history): made
    // before anything reads the log.
    std::string said;
    if (!proxy::event_log::cut_history(s.data_dir, lo.fsync, said, error)) {
      log_line(error);
      return 1;
    }
    if (!said.empty()) log_line(said);
  }
  lo.acknowledged = slot_confirmed(s.data_dir, libpq_conninfo, s.slot);
  auto log = proxy::event_log::open(lo, error);
  if (!log) {
    log_line(error);
    return 1;
  }
  asio::io_context io;
  if (!s.create_publication.empty()) {
    std::optional<proxy::outcome<void>> r;
    asio::co_spawn(io, ensure_publication(*parsed.params, s.publications.front(), s.create_publication),
                   [&](std::exception_ptr e, proxy::outcome<void> v) {
                     if (e) v = proxy::failure{{}, exception_text(e), {}, false};
                     r = std::move(v);
                   });
    io.run();
    io.restart();
    if (!r || !*r) {
      log_line("--create-publication: " + (r ? r->error().message : std::string("failed")));
      return 1;
    }
  }

  // Large transactions reach the gateway while they run (streaming) and are held until their
  // commit — in memory up to a bound, then in spill files of walgate's own data directory
  // (created exclusively, mode 0600; dropped with their transaction, and at every start).
  protocol::assembler_options ao;
  ao.spill_dir = std::filesystem::path(s.data_dir) / "spill";
  {
    std::error_code ec;
    std::filesystem::remove_all(ao.spill_dir, ec);
    if (!ec) std::filesystem::create_directory(ao.spill_dir, ec);
    if (!ec) std::filesystem::permissions(ao.spill_dir, std::filesystem::perms::owner_all, ec);
    if (ec) {
      log_line("cannot prepare the spill directory " + ao.spill_dir.string() + ": " + ec.message());
      return 1;
    }
  }
  // (Large encodings too: one unlinked file per event and format, sent from in pieces.)
  so.spill_dir = ao.spill_dir;
  proxy::gateway gw(io.get_executor(), *log, ao);
  proxy::replication_settings rs;
  rs.conn = *parsed.params;
  rs.log = [](const std::string& line) { log_line(line); };
  rs.slot = s.slot;
  rs.publications = s.publications;
  rs.messages_when_supported = true;
  rs.streaming_when_supported = s.streaming;
  rs.failover_slot = s.failover_slot;
  if (!s.origin.empty()) rs.origin = s.origin;   // (PostgreSQL 16+: before, the stream does not start, saying so)
  rs.status_interval = std::chrono::milliseconds(s.status_interval_ms);
  // The initial snapshot: when walgate creates the slot (never for one that exists), its exported
  // snapshot goes into the log before the first streamed transaction.
  std::unique_ptr<proxy::initial_snapshot> initial;
  if (s.initial_snapshot) {
    proxy::initial_snapshot_options io_opts;
    io_opts.conninfo = libpq_conninfo;   // (pinned to the stream's server when the slot is made: stream_sink)
    io_opts.publications = s.publications;
    io_opts.workers = s.snapshot_workers;
    io_opts.fsync = !s.no_fsync;
    initial = std::make_unique<proxy::initial_snapshot>(io.get_executor(), *log, io_opts);
    rs.export_snapshot = true;
    rs.before_create_slot = [&s, fsync = !s.no_fsync]() -> std::string {
      std::string e;
      proxy::write_initial_state(s.data_dir, proxy::initial_state::pending, fsync, e);
      return e;
    };
    so.extra_metrics.push_back([&initial](proxy::metrics_registry& m) { initial->register_metrics(m); });
    // Cut off by a crash or a kill last time: the log holds none of it, and the slot made for it
    // has lost its snapshot; it is dropped, and made again with a new one.
    if (proxy::read_initial_state(s.data_dir) == proxy::initial_state::pending) {
      if (log->next_seq() > 0) {   // it was logged whole (one transaction) before the cut
        std::string e;
        if (!proxy::write_initial_state(s.data_dir, proxy::initial_state::done, !s.no_fsync, e)) {
          log_line(e);
          return 1;
        }
      } else {
        std::optional<proxy::outcome<void>> r;
        asio::co_spawn(io, drop_unfinished_slot(*parsed.params, s.slot), [&](std::exception_ptr e, proxy::outcome<void> v) {
          if (e) v = proxy::failure{{}, exception_text(e), {}, false};
          r = std::move(v);
        });
        io.run();
        io.restart();
        if (!r || !*r) {
          log_line("the initial snapshot was cut off last time, and its slot cannot be dropped: " +
                   (r ? r->error().message : std::string("failed")));
          return 1;
        }
      }
    }
  }
  stream_sink sink(gw, initial.get(), s.pg, stream_conninfo, s);
  proxy::replication_client client(io.get_executor(), rs, sink);
  streaming_client = &client;
  gw.set_backlog_probe([&client] { return client.backlog(); });
  struct unprobe {   // (gone before the client)
    proxy::gateway& g;
    ~unprobe() { g.set_backlog_probe(nullptr); }
  } unprobe_backlog{gw};
  client.set_retry_handler([&gw](const proxy::failure& f, std::chrono::milliseconds d) {
    const bool refused = f.message.rfind("stream consumer failed", 0) == 0;   // the gateway refused what came
    log_line((!refused || gw.stream_fault().empty() ? f.message : gw.stream_fault()) + " (reconnecting in " +
             std::to_string(d.count()) + " ms)");
  });
  // Scale-out: the log published to JetStream, in order, exactly once (its own thread; the log
  // keeps what the stream has not confirmed).
  std::unique_ptr<proxy::jetstream_publisher> publisher;
  if (!s.nats.empty()) {
    proxy::jetstream_options jo;
    jo.servers = s.nats;
    jo.stream = s.nats_stream;
    jo.subject_prefix = s.nats_subject_prefix;
    jo.replicas = static_cast<int>(s.nats_replicas);
    jo.max_bytes = s.nats_max_mb ? static_cast<std::int64_t>(s.nats_max_mb << 20) : -1;
    jo.max_age = std::chrono::seconds(s.nats_max_age_s);
    jo.cursor_file = (std::filesystem::path(s.data_dir) / "jetstream.cursor").string();
    publisher = std::make_unique<proxy::jetstream_publisher>(
        *log, [&io](std::function<void()> f) { asio::post(io, std::move(f)); }, jo, log_line);
    so.extra_metrics.push_back([&publisher](proxy::metrics_registry& m) { publisher->register_metrics(m); });
    publisher->start();
    log_line("publishing the event log to JetStream stream " + s.nats_stream + " on " + s.nats_subject_prefix + ".> at " +
             s.nats.front() + (s.nats.size() > 1 ? " (+" + std::to_string(s.nats.size() - 1) + ")" : ""));
  }
  // walgate's own walsender (started below, once the HTTP server listens): its metrics read
  // through this pointer.
  std::unique_ptr<proxy::sql_forwarder> forwarder;   // (--replication-sql forward; before walsender: it outlives it)
  std::unique_ptr<proxy::replication_server> walsender;
  if (!s.replication_listen.empty()) {
    so.extra_metrics.push_back([&walsender](proxy::metrics_registry& m) {
      proxy::register_replication_metrics(m, [&walsender]() -> const proxy::replication_server* { return walsender.get(); });
    });
    so.slots_json = [&walsender] { return walsender ? walsender->slots_json() : std::string("{\"slots\":[]}"); };
  }
  proxy::server_status st;
  st.streaming = [&] { return client.streaming(); };
  st.reconnects = [&] { return client.reconnects(); };
  gw.set_reply_request([&client] { client.request_reply(); });
  so.server_wal_end = [&gw] { return gw.metrics().server_wal_end; };
  proxy::server srv(io.get_executor(), so, gw, st);
  if (!srv.start(error)) {
    log_line(error);
    return 1;
  }
  log_line("listening on " + s.listen_host + ":" + std::to_string(srv.port()) + (so.tls_cert.empty() ? "" : " (TLS)") +
           "; event log in " + s.data_dir + " (next event " + std::to_string(log->next_seq()) + ")");
  // walgate's own walsender: replication clients read the log as from the server.
  if (!s.replication_listen.empty()) {
    proxy::replication_server_options ro;
    ro.host = s.replication_listen_host;
    ro.port = s.replication_listen_port;
    ro.data_dir = s.data_dir;
    ro.fsync = !s.no_fsync;
    ro.identity = [&sink] { return sink.identity(); };
    ro.durable_lsn = [&gw] { return gw.durable_lsn(); };
    ro.timeout = std::chrono::seconds(s.replication_timeout_s);
    ro.hold = [&log](std::optional<protocol::lsn> from) { log->hold_from_lsn(from); };
    ro.slot_max_bytes = static_cast<std::uint64_t>(s.replication_slot_max_mb) << 20;
    ro.retention_bytes = static_cast<std::uint64_t>(s.retention_mb) << 20;
    ro.log = [](const std::string& line) { log_line(line); };
    ro.users_file = s.replication_users;
    ro.auth_failures_per_minute = s.auth_failures_per_minute;
    ro.publications = s.publications;
    ro.tls_cert = s.tls_cert;
    ro.tls_key = s.tls_key;
    forwarder = std::make_unique<proxy::sql_forwarder>(s.replication_sql_pg.empty() ? libpq_conninfo : s.replication_sql_pg,
                                                      [&io](std::function<void()> f) { asio::post(io, std::move(f)); });
    if (s.replication_sql_forward)
      ro.run_sql = [&forwarder](std::string sql, std::function<void(std::string)> done) {
        forwarder->run(std::move(sql), std::move(done));
      };
    ro.published_tables = [&forwarder, pubs = s.publications](
                              std::function<void(std::optional<proxy::sql_forwarder::table_list>, std::string)> done) {
      forwarder->published_tables(pubs, std::move(done));
    };
    walsender = std::make_unique<proxy::replication_server>(io, std::move(ro), *log);
    if (!walsender->start(error)) {
      log_line(error);
      return 1;
    }
    log_line("replication clients served on " + s.replication_listen_host + ":" + std::to_string(walsender->port()) +
             " (logical: test_decoding, wal2json, pgoutput; " + (s.tls_cert.empty() ? "" : "TLS; ") +
             (s.replication_sql_forward ? "SQL forwarded read-only; " : "") +
             (s.replication_users.empty() ? std::string("trust on loopback")
                                          : "SCRAM-SHA-256, " + std::to_string(walsender->users()) + " user(s)") +
             ")");
  }
  if (on_listening) on_listening(srv.port());

  reloads reload(io, s, so, srv, walsender.get());

  std::atomic<bool> stop{false};
  asio::co_spawn(io, watch_slot(*parsed.params, s.slot, s.failover_slot, gw.metrics(), stop), asio::detached);
  int rc = 0;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  bool signalled = false;   // (SIGINT/SIGTERM: no start again in place, even for a cut — the next start makes it)
  auto shutdown = [&] {
    stop = true;
    srv.stop();       // clients: going away, with their resume ids
    if (walsender) walsender->stop();
    if (initial) initial->stop();   // (a copy under way: cancelled, dropped, taken again next start)
    gw.flush();       // everything logged is durable...
    client.stop();    // ...and the final status update says so
    reload.cancel();
  };
  // Armed until the loop ends: a signal during the shutdown is seen too (not swallowed).
  std::function<void()> on_signal = [&] {
    signals.async_wait([&](boost::system::error_code ec, int) {
      if (ec) return;
      signalled = true;
      if (!stop) {
        log_line("stopping");
        shutdown();
      }
      on_signal();
    });
  };
  on_signal();
  bool failure_logged = false;
  // The event log failed (disk full, I/O error): stop rather than go on without storing. Nothing
  // past the durable position was acknowledged; a restart resumes from it.
  gw.on_failure([&] {
    if (failure_logged) return;
    failure_logged = true;
    log_line(gw.failure() + "; stopping (durable up to " + gw.durable_lsn().to_string() +
             ": a restart resumes from there)");
    rc = 1;
    if (!stop) shutdown();
  });
  asio::co_spawn(io, client.run(), [&](std::exception_ptr e, proxy::outcome<void> r) {
    // Every way out that is not a requested shutdown is a failure a supervisor must see.
    if (e) {
      log_line("the replication stream failed: " + exception_text(e) + "; stopping (durable up to " + gw.durable_lsn().to_string() +
               ": a restart resumes from there)");
      failure_logged = true;
      rc = 1;
    } else if (!r) {
      log_line(r.error().message);
      if (!gw.failure().empty() && !failure_logged) log_line(gw.failure());
      failure_logged = true;
      rc = 1;
    } else if (!stop) {
      log_line("the replication stream ended without a shutdown being asked for; stopping");
      rc = 1;
    }
    if (!stop) shutdown();
    // Let the last writes go out, then end the loop.
    auto t = std::make_shared<asio::steady_timer>(io, std::chrono::seconds(2));
    t->async_wait([&io, t](boost::system::error_code) { io.stop(); });
  });
  io.run();
  gw.flush();
  if (publisher) publisher->stop();   // (what it had in flight is found in the stream next time)
  auto p = client.positions();
  log_line("stopped; durable " + gw.durable_lsn().to_string() + ", acknowledged " + p.acknowledged.to_string());
  if (sink.restart_for_cut && !signalled) {
    log_line("starting again to cut the event log");
    return restart_exit;
  }
  return rc;
}


/// walgate edge: the stream mirrored into this process's own event log (a cache in --data-dir),
/// served with the same server; until SIGINT/SIGTERM.
int run_edge(const config& s, const std::function<void(std::uint16_t)>& on_listening) {
  std::signal(SIGHUP, SIG_IGN);
  if (!listens_on_loopback(s) && !s.auth_jwt)
    log_line("WARNING: serving unauthenticated on " + s.listen + ": anyone who can reach it reads every change");
  proxy::server_options so;
  if (!server_options_of(s, s.debezium_db, so)) return 2;
  so.edge = true;
  std::string error;
  // Never an origin's log (an edge appends what the stream holds to what is there): a directory
  // that holds anything is an edge's only with the EDGE file it writes into an empty one.
  const std::filesystem::path dir = s.data_dir;
  {
    std::error_code ec;
    if (std::filesystem::is_directory(dir, ec) && !std::filesystem::is_empty(dir, ec) && !std::filesystem::exists(dir / "EDGE")) {
      log_line("--data-dir " + s.data_dir + " is not a walgate edge's (it holds files, and no EDGE file): an origin walgate's "
               "event log is never an edge's; give the edge an empty or new directory of its own");
      return 1;
    }
    std::filesystem::create_directories(dir, ec);
    std::ofstream(dir / "EDGE") << "the event log of a walgate edge: a copy of a JetStream stream; deleted, the edge copies the stream again\n";
    if (ec || !std::filesystem::exists(dir / "EDGE")) {
      log_line("cannot prepare the data directory " + s.data_dir + (ec ? ": " + ec.message() : ""));
      return 1;
    }
  }
  proxy::log_options lo;
  lo.dir = s.data_dir;
  lo.retention_bytes = s.retention_mb << 20;
  lo.memory_bytes = s.tail_mb << 20;
  lo.fsync = false;   // (a cache of the stream: what a crash loses comes again from it)
  auto log = proxy::event_log::open(lo, error);
  if (!log) {
    log_line(error);
    return 1;
  }
  asio::io_context io;
  protocol::assembler_options ao;
  ao.spill_dir = std::filesystem::path(s.data_dir) / "spill";
  {
    std::error_code ec;
    std::filesystem::remove_all(ao.spill_dir, ec);
    if (!ec) std::filesystem::create_directory(ao.spill_dir, ec);
    if (ec) {
      log_line("cannot prepare the spill directory " + ao.spill_dir.string() + ": " + ec.message());
      return 1;
    }
  }
  so.spill_dir = ao.spill_dir;
  // The gateway's log side only (no replication stream reaches it): the server's hooks on the
  // events appended.
  proxy::gateway gw(io.get_executor(), *log, ao);
  proxy::jetstream_options jo;
  jo.servers = s.nats;
  jo.stream = s.nats_stream;
  jo.subject_prefix = s.nats_subject_prefix;
  proxy::jetstream_mirror mirror(*log, [&io](std::function<void()> f) { asio::post(io, std::move(f)); }, jo, log_line);
  so.extra_metrics.push_back([&mirror](proxy::metrics_registry& m) { mirror.register_metrics(m); });
  so.unavailable = [&mirror] { return mirror.not_ready(); };
  proxy::server_status st;
  st.streaming = [&] { return mirror.streaming(); };
  st.reconnects = [] { return 0; };
  proxy::server srv(io.get_executor(), so, gw, st);
  if (!srv.start(error)) {
    log_line(error);
    return 1;
  }
  mirror.start();
  log_line("listening on " + s.listen_host + ":" + std::to_string(srv.port()) + (so.tls_cert.empty() ? "" : " (TLS)") +
           "; edge of JetStream stream " + s.nats_stream + ", its mirror in " + s.data_dir + " (next event " +
           std::to_string(log->next_seq()) + ")");
  if (on_listening) on_listening(srv.port());
  reloads reload(io, s, so, srv);
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int) {
    if (ec) return;
    log_line("stopping");
    reload.cancel();
    srv.stop();
    auto t = std::make_shared<asio::steady_timer>(io, std::chrono::seconds(2));
    t->async_wait([&io, t](boost::system::error_code) { io.stop(); });
  });
  io.run();
  mirror.stop();
  log_line("stopped");
  return 0;
}

}  // namespace walgate::cli
