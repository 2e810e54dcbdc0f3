// The walgate executable.
//   walgate [serve] --pg CONNINFO --slot NAME --publication NAME ...   the gateway
//   walgate demo                                                     a throwaway PostgreSQL + the gateway
//   walgate stream --pg ... --slot ... --publication ...             print decoded messages
// Settings: flags over WALGATE_* environment variables over the TOML config file (--config).
#include "walgate/protocol/commands.hpp"
#include "walgate/protocol/pgoutput.hpp"
#include "walgate/proxy/event_log.hpp"
#include "walgate/proxy/gateway.hpp"
#include "walgate/proxy/local_cluster.hpp"
#include "walgate/proxy/pg_connection.hpp"
#include "walgate/proxy/replication_client.hpp"
#include "walgate/proxy/server.hpp"

#include <CLI/CLI.hpp>
#include <toml++/toml.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/as_tuple.hpp>

#include <libpq-fe.h>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <variant>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <thread>

namespace asio = boost::asio;
using namespace walgate;

namespace {

struct settings {
  std::string pg;
  std::string slot = "walgate";
  std::vector<std::string> publications;
  std::string create_publication;   // "ALL TABLES" or "schema.t1,schema.t2"
  std::string listen = "127.0.0.1:8080";
  std::string data_dir = "walgate-data";
  bool allow_unauthenticated = false;
  std::string tls_cert, tls_key;
  int status_interval_ms = 10'000;
  std::size_t client_lag_mb = 64;
  std::size_t retention_mb = 1024;
  std::size_t tail_mb = 16;
  std::size_t max_clients = 0;   // 0: 10,000, or fewer if the open-file limit cannot hold them
  std::vector<std::string> allow_origins;   // cross-origin pages allowed to read the stream
  std::vector<std::string> allow_hosts;     // Host names a loopback listener serves besides localhost
  std::string debezium_name = "walgate";
  std::string decimal_mode = "string";
  std::string time_precision = "adaptive_time_microseconds";
  std::string streaming = "on";   // ask PostgreSQL 14+ to stream large transactions while they run
  bool no_fsync = false;
};

void log_line(const std::string& s) {
  std::fprintf(stderr, "walgate: %s\n", s.c_str());
  std::fflush(stderr);
}

bool is_loopback(const std::string& host) {
  boost::system::error_code ec;
  auto a = asio::ip::make_address(host, ec);
  return !ec && a.is_loopback();
}

bool split_listen(const std::string& listen, std::string& host, std::uint16_t& port, std::string& error) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    error = "--listen: expected HOST:PORT, got '" + listen + "'";
    return false;
  }
  host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  try {
    int p = std::stoi(listen.substr(colon + 1));
    if (p < 0 || p > 65535) throw std::out_of_range("port");
    port = static_cast<std::uint16_t>(p);
  } catch (...) {
    error = "--listen: invalid port in '" + listen + "'";
    return false;
  }
  return true;
}

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

// Reads the slot's retained WAL every 10 s for /metrics (a plain SQL connection). It starts a
// second after the gateway, so the server starts the walsender's backend first, undisturbed.
asio::awaitable<void> watch_slot(proxy::conn_params conn, std::string slot, proxy::gateway_metrics& m, std::atomic<bool>& stop) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  t.expires_after(std::chrono::seconds(1));
  co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
  while (!stop) {
    proxy::pg_connection c(co_await asio::this_coro::executor);
    if (auto r = co_await c.connect(conn, false); r) {
      while (!stop) {
        auto q = co_await c.query("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM "
                                  "pg_catalog.pg_replication_slots WHERE slot_name = " + protocol::quote_literal(slot));
        if (!q) break;
        m.slot_retained_wal = q->rows.empty() || !q->rows[0][0] ? -1 : std::stoll(*q->rows[0][0]);
        t.expires_after(std::chrono::seconds(10));
        co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      }
    }
    t.expires_after(std::chrono::seconds(10));
    co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
  }
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
  explicit stream_sink(proxy::gateway& g) : gw_(g), throw_(std::getenv("WALGATE_TEST_THROW_IN_STREAM") != nullptr) {}
  void on_stream_start(const proxy::stream_start_info& i) override { gw_.on_stream_start(i); }
  boost::system::error_code on_xlog_data(const protocol::xlog_data& x) override {
    if (throw_) throw std::runtime_error("test hook: an exception in the stream path at " + x.wal_start.to_string());
    return gw_.on_xlog_data(x);
  }
  bool retry_after_failure() const override { return gw_.retry_after_failure(); }
  void on_keepalive(const protocol::primary_keepalive& k) override { gw_.on_keepalive(k); }
  protocol::lsn durable_lsn() const override { return gw_.durable_lsn(); }

 private:
  proxy::gateway& gw_;
  bool throw_;
};

/// Runs the gateway until SIGINT/SIGTERM or a failure reconnecting cannot fix.
int serve(const settings& s, const std::function<void(std::uint16_t)>& on_listening = {}) {
  auto parsed = proxy::parse_conninfo(s.pg);
  if (!parsed.params) {
    log_line("--pg: " + parsed.error);
    return 2;
  }
  if (s.publications.empty()) {
    log_line("--publication is required");
    return 2;
  }
  if (!protocol::valid_slot_name(s.slot)) {
    log_line("--slot: invalid slot name '" + s.slot + "': use 1-63 characters of a-z, 0-9 and _");
    return 2;
  }
  std::string host, error;
  std::uint16_t port = 0;
  if (!split_listen(s.listen, host, port, error)) {
    log_line(error);
    return 2;
  }
  if (!is_loopback(host)) {
    if (!s.allow_unauthenticated) {
      log_line("--listen " + s.listen + " is not a loopback address and authentication is not configured: pass "
               "--allow-unauthenticated to serve the stream to anyone who can reach it");
      return 2;
    }
    log_line("WARNING: serving unauthenticated on " + s.listen + ": anyone who can reach it reads every change");
  }
  if (s.tls_cert.empty() != s.tls_key.empty()) {
    log_line("--tls-cert and --tls-key go together");
    return 2;
  }
  proxy::server_options so;
  if (!client_limit(s.max_clients, so, error)) {
    log_line(error);
    return 2;
  }
  for (const auto& o : s.allow_origins) {
    bool ok = o == "*" || ((o.rfind("http://", 0) == 0 || o.rfind("https://", 0) == 0) &&
                           o.find('/', o.find("://") + 3) == std::string::npos && o.size() > o.find("://") + 3);
    if (!ok) {
      log_line("--allow-origin: '" + o + "' is not an origin: use scheme://host[:port] (no path), or *");
      return 2;
    }
  }
  so.allowed_origins = s.allow_origins;
  so.allowed_hosts = s.allow_hosts;
  so.host = host;
  so.port = port;
  so.tls_cert = s.tls_cert;
  so.tls_key = s.tls_key;
  so.client_lag_bytes = s.client_lag_mb << 20;
  so.encoder.server_name = s.debezium_name;
  so.encoder.database = parsed.params->dbname;
  if (s.decimal_mode == "string") so.encoder.decimal = transform::encoder_options::decimal_mode::string;
  else if (s.decimal_mode == "double") so.encoder.decimal = transform::encoder_options::decimal_mode::double_;
  else if (s.decimal_mode == "precise") so.encoder.decimal = transform::encoder_options::decimal_mode::precise;
  else {
    log_line("--debezium-decimal-mode: use string, double or precise");
    return 2;
  }
  if (s.time_precision == "connect") so.encoder.time = transform::encoder_options::time_precision::connect;
  else if (s.time_precision != "adaptive_time_microseconds") {
    log_line("--debezium-time-precision: use adaptive_time_microseconds or connect");
    return 2;
  }

  proxy::log_options lo;
  lo.dir = s.data_dir;
  lo.retention_bytes = s.retention_mb << 20;
  lo.memory_bytes = s.tail_mb << 20;
  lo.fsync = !s.no_fsync;
  auto log = proxy::event_log::open(lo, error);
  if (!log) {
    log_line(error);
    return 1;
  }
  asio::io_context io;
  if (!s.create_publication.empty()) {
    std::optional<proxy::outcome<void>> r;
    asio::co_spawn(io, ensure_publication(*parsed.params, s.publications.front(), s.create_publication),
                   [&](std::exception_ptr, proxy::outcome<void> v) { r = std::move(v); });
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
  rs.slot = s.slot;
  rs.publications = s.publications;
  rs.messages_when_supported = true;
  rs.streaming_when_supported = s.streaming == "on";
  rs.status_interval = std::chrono::milliseconds(s.status_interval_ms);
  stream_sink sink(gw);
  proxy::replication_client client(io.get_executor(), rs, sink);
  client.set_retry_handler([&gw](const proxy::failure& f, std::chrono::milliseconds d) {
    const bool refused = f.message.rfind("stream consumer failed", 0) == 0;   // the gateway refused what came
    log_line((!refused || gw.stream_fault().empty() ? f.message : gw.stream_fault()) + " (reconnecting in " +
             std::to_string(d.count()) + " ms)");
  });
  proxy::server_status st;
  st.streaming = [&] { return client.streaming(); };
  st.reconnects = [&] { return client.reconnects(); };
  proxy::server srv(io.get_executor(), so, gw, st);
  if (!srv.start(error)) {
    log_line(error);
    return 1;
  }
  log_line("listening on " + host + ":" + std::to_string(srv.port()) + (so.tls_cert.empty() ? "" : " (TLS)") +
           "; event log in " + s.data_dir + " (next event " + std::to_string(log->next_seq()) + ")");
  if (on_listening) on_listening(srv.port());

  std::atomic<bool> stop{false};
  asio::co_spawn(io, watch_slot(*parsed.params, s.slot, gw.metrics(), stop), asio::detached);
  int rc = 0;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  auto shutdown = [&] {
    stop = true;
    srv.stop();       // clients: going away, with their resume ids
    gw.flush();       // everything logged is durable...
    client.stop();    // ...and the final status update says so
    signals.cancel();
  };
  signals.async_wait([&](boost::system::error_code ec, int) {
    if (!ec) {
      log_line("stopping");
      shutdown();
    }
  });
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
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        what = x.what();
      } catch (...) {
      }
      log_line("the replication stream failed: " + what + "; stopping (durable up to " + gw.durable_lsn().to_string() +
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
  auto p = client.positions();
  log_line("stopped; durable " + gw.durable_lsn().to_string() + ", acknowledged " + p.acknowledged.to_string());
  return rc;
}

// --- walgate stream: print decoded messages ---------------------------------------------------

class print_sink final : public proxy::replication_sink {
 public:
  void on_stream_start(const proxy::stream_start_info& i) override {
    context_ = protocol::pgoutput::decode_context{i.proto_version, false, false};
    std::printf("-- streaming from PostgreSQL %d, pgoutput proto_version %u, from %s\n", i.server_major, i.proto_version,
                i.start.to_string().c_str());
    std::fflush(stdout);
  }
  boost::system::error_code on_xlog_data(const protocol::xlog_data& x) override {
    namespace pg = protocol::pgoutput;
    auto decoded = decoder_.decode(x.data, context_);
    if (!decoded) {
      log_line("cannot decode the message at " + x.wal_start.to_string() + ": " + decoded.error().message());
      return make_error_code(decoded.error().code);
    }
    char tag = pg::tag_of(*decoded);
    std::string line = x.wal_start.to_string() + "  " + pg::name_of(tag);
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, pg::begin>) {
            line += " xid " + std::to_string(m.xid);
            in_transaction_ = true;
          } else if constexpr (std::is_same_v<T, pg::commit>) {
            line += " end " + m.end_lsn.to_string();
          } else if constexpr (std::is_same_v<T, pg::relation>) {
            const auto& r = relations_.update(m);
            line += " " + r.nspname + "." + r.relname + " (" + std::to_string(r.columns.size()) + " columns)";
          } else if constexpr (std::is_same_v<T, pg::insert>) {
            line += row(m.relation_oid, m.new_tuple);
          } else if constexpr (std::is_same_v<T, pg::update>) {
            line += row(m.relation_oid, m.new_tuple);
          } else if constexpr (std::is_same_v<T, pg::delete_>) {
            line += row(m.relation_oid, m.old_tuple);
          }
        },
        *decoded);
    std::printf("%s\n", line.c_str());
    if (tag == 'C') {
      in_transaction_ = false;
      std::fflush(stdout);
      // A printed transaction is "durable" for this command: its Commit's WAL start is its end LSN.
      durable_ = std::max(durable_, x.wal_start);
    }
    return {};
  }
  void on_keepalive(const protocol::primary_keepalive& k) override {
    if (!in_transaction_) durable_ = std::max(durable_, k.wal_end);
  }
  protocol::lsn durable_lsn() const override { return durable_; }

 private:
  std::string row(std::uint32_t oid, protocol::pgoutput::tuple_view t) const {
    const auto* r = relations_.find(oid);
    if (!r) return " (relation " + std::to_string(oid) + " not described)";
    std::string out = " " + r->nspname + "." + r->relname;
    for (std::size_t i = 0; i < t.size() && i < r->columns.size(); ++i) {
      out += " " + r->columns[i].name + "=";
      switch (t[i].kind) {
        case protocol::pgoutput::column_kind::null: out += "NULL"; break;
        case protocol::pgoutput::column_kind::unchanged_toast: out += "(unchanged)"; break;
        default: out += protocol::as_string_view(t[i].value);
      }
    }
    return out;
  }
  protocol::pgoutput::decoder decoder_;
  protocol::pgoutput::decode_context context_;
  protocol::pgoutput::relation_cache relations_;
  bool in_transaction_ = false;
  protocol::lsn durable_;
};

int run_stream(const settings& s, const std::string& capture) {
  auto parsed = proxy::parse_conninfo(s.pg);
  if (!parsed.params) {
    log_line("--pg: " + parsed.error);
    return 2;
  }
  asio::io_context io;
  print_sink sink;
  proxy::replication_settings rs;
  rs.conn = *parsed.params;
  rs.slot = s.slot;
  rs.publications = s.publications;
  rs.status_interval = std::chrono::milliseconds(s.status_interval_ms);
  proxy::replication_client client(io.get_executor(), rs, sink);
  if (!capture.empty()) client.set_capture_file(capture);
  client.set_retry_handler([](const proxy::failure& f, std::chrono::milliseconds d) {
    log_line(f.message + " (reconnecting in " + std::to_string(d.count()) + " ms)");
  });
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int) {
    if (!ec) client.stop();
  });
  int rc = 0;
  asio::co_spawn(io, client.run(), [&](std::exception_ptr, proxy::outcome<void> r) {
    signals.cancel();
    if (!r) {
      log_line(r.error().message);
      rc = 1;
    }
  });
  io.run();
  return rc;
}

// --- walgate demo ------------------------------------------------------------------------------

void trickle(const std::string& conninfo, std::atomic<bool>& stop) {
  PGconn* c = PQconnectdb(conninfo.c_str());
  if (PQstatus(c) != CONNECTION_OK) {
    log_line(std::string("demo: ") + PQerrorMessage(c));
    PQfinish(c);
    return;
  }
  std::mt19937 rng(42);
  const char* statements[] = {
      "INSERT INTO orders(customer_id, status, amount) SELECT id, 'pending', round((random()*200)::numeric, 2) "
      "FROM customers ORDER BY random() LIMIT 1",
      "UPDATE orders SET status = CASE status WHEN 'pending' THEN 'paid' WHEN 'paid' THEN 'shipped' ELSE status END, "
      "updated_at = now() WHERE id = (SELECT id FROM orders WHERE status <> 'shipped' ORDER BY random() LIMIT 1)",
      "INSERT INTO customers(name, email) VALUES ('customer ' || floor(random()*100000), "
      "'c' || floor(random()*100000) || '@example.com')",
      "DELETE FROM orders WHERE id = (SELECT id FROM orders WHERE status = 'shipped' ORDER BY id LIMIT 1)",
  };
  while (!stop) {
    PQclear(PQexec(c, statements[rng() % 4]));
    for (int i = 0; i < 10 && !stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  PQfinish(c);
}

int run_demo(settings s) {
  std::string error;
  proxy::cluster_options o;
  o.name = "walgate-demo";
  // A commit is sent to walgate when its WAL is flushed: with synchronous_commit off that waits
  // for the WAL writer (up to 200 ms); on, as on most servers, changes show at once.
  o.extra_conf = {"synchronous_commit = on"};
  log_line("demo: starting a throwaway PostgreSQL...");
  auto cluster = proxy::local_cluster::start(o, error);
  if (!cluster) {
    log_line("demo: " + error);
    return 1;
  }
  std::string setup = cluster->try_sql(
      "CREATE TABLE customers(id bigserial PRIMARY KEY, name text NOT NULL, email text, "
      "created_at timestamptz NOT NULL DEFAULT now());"
      "CREATE TABLE orders(id bigserial PRIMARY KEY, customer_id bigint NOT NULL REFERENCES customers, "
      "status text NOT NULL, amount numeric(12,2) NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());"
      "INSERT INTO customers(name, email) SELECT 'customer ' || g, 'c' || g || '@example.com' "
      "FROM generate_series(1, 20) g;");
  if (!setup.empty()) {
    log_line("demo: setting up the demo schema failed: " + setup);
    return 1;
  }
  s.pg = cluster->conninfo();
  s.slot = "walgate_demo";
  s.publications = {"walgate_demo"};
  s.create_publication = "ALL TABLES";
  s.data_dir = (cluster->dir() / "walgate-data").string();
  std::atomic<bool> stop{false};
  std::thread t;
  int rc = serve(s, [&](std::uint16_t port) {
    std::string base = "http://127.0.0.1:" + std::to_string(port);
    std::fprintf(stderr,
                 "\nwalgate demo: PostgreSQL %d is changing rows in public.customers and public.orders.\n"
                 "  open      %s/\n"
                 "  curl      curl -N '%s/v1/stream?format=native'\n"
                 "  SSE       new EventSource('%s/v1/stream?format=debezium')   (in the page's console;\n"
                 "  WebSocket new WebSocket('ws://127.0.0.1:%u/v1/ws?format=waltail')   other origins need --allow-origin)\n"
                 "  psql      psql '%s'   (make changes of your own)\n"
                 "  Ctrl-C stops everything and leaves nothing running.\n\n",
                 cluster->server_major(), base.c_str(), base.c_str(), base.c_str(), port, cluster->conninfo().c_str());
    t = std::thread(trickle, cluster->conninfo(), std::ref(stop));
  });
  stop = true;
  if (t.joinable()) t.join();
  cluster.reset();
  log_line("demo: PostgreSQL stopped and its directory removed");
  return rc;
}

}  // namespace

namespace {

// One setting: its name (the long flag without --, the config key, WALGATE_<NAME> in the
// environment) and where it goes.
struct binding {
  const char* name;
  std::variant<std::string*, int*, std::size_t*, bool*, std::vector<std::string>*> target;
};

std::vector<std::string> split_list(const std::string& v) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    auto c = v.find(',', start);
    out.push_back(v.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) break;
    start = c + 1;
  }
  return out;
}

/// Sets a binding from text (environment); empty string when it worked, else the error.
std::string assign(const binding& b, const std::string& text) {
  try {
    return std::visit(
        [&](auto* p) -> std::string {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, std::string>) *p = text;
          else if constexpr (std::is_same_v<T, int>) {
            std::size_t used = 0;
            if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return "not a number";
            int v = std::stoi(text, &used);
            if (used != text.size()) return "not a number";
            *p = v;
          } else if constexpr (std::is_same_v<T, std::size_t>) {
            std::size_t used = 0;
            if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return "not a number";
            auto v = std::stoull(text, &used);
            *p = static_cast<std::size_t>(v);
          }
          else if constexpr (std::is_same_v<T, bool>) {
            if (text == "1" || text == "true" || text == "yes") *p = true;
            else if (text == "0" || text == "false" || text == "no" || text.empty()) *p = false;
            else return "expected true or false";
          } else *p = split_list(text);
          return {};
        },
        b.target);
  } catch (const std::exception&) {
    return "not a number";
  }
}

std::string env_name(const char* name) {
  std::string out = "WALGATE_";
  for (const char* c = name; *c; ++c) out.push_back(*c == '-' ? '_' : static_cast<char>(std::toupper(*c)));
  return out;
}

/// The config file (TOML, keys as the long flags) and then the environment, into the settings;
/// the command line is parsed after, so flags win over environment over file.
bool load_config_and_env(const std::vector<binding>& bindings, const std::string& config, std::string& error) {
  if (!config.empty()) {
    toml::table t;
    try {
      t = toml::parse_file(config);
    } catch (const toml::parse_error& e) {
      error = "--config " + config + ": " + std::string(e.description());
      return false;
    }
    for (const auto& [key, node] : t) {
      std::string k(key.str());
      auto it = std::find_if(bindings.begin(), bindings.end(), [&](const binding& b) { return k == b.name; });
      if (it == bindings.end()) {
        error = "--config " + config + ": unknown setting '" + k + "'";
        return false;
      }
      std::string text;
      if (auto v = node.value<std::string>()) text = *v;
      else if (auto i = node.value<std::int64_t>()) text = std::to_string(*i);
      else if (auto b = node.value<bool>()) text = *b ? "true" : "false";
      else if (auto* arr = node.as_array()) {
        for (const auto& el : *arr)
          if (auto sv = el.value<std::string>()) text += (text.empty() ? "" : ",") + *sv;
      } else {
        error = "--config " + config + ": setting '" + k + "' has an unsupported type";
        return false;
      }
      if (auto e = assign(*it, text); !e.empty()) {
        error = "--config " + config + ": " + k + ": " + e;
        return false;
      }
    }
  }
  for (const auto& b : bindings) {
    std::string name = env_name(b.name);
    if (const char* v = std::getenv(name.c_str())) {
      if (auto e = assign(b, v); !e.empty()) {
        error = name + ": " + e;
        return false;
      }
    }
  }
  return true;
}

/// Checks every setting where it ends up, whatever set it (flag, WALGATE_* variable or the
/// config file): a wrong value is the same one-line error from any source.
bool validate(const settings& s, std::string& error) {
  auto range = [&](const char* name, std::uint64_t v, std::uint64_t lo, std::uint64_t hi) {
    if (v >= lo && v <= hi) return true;
    error = std::string("--") + name + " (or " + env_name(name) + ", or " + name + " in the config file): " +
            std::to_string(v) + " is not in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return false;
  };
  if (s.status_interval_ms < 100 || s.status_interval_ms > 60'000) {
    error = "--status-interval (or WALGATE_STATUS_INTERVAL, or status-interval in the config file): " +
            std::to_string(s.status_interval_ms) + " is not in [100, 60000] ms";
    return false;
  }
  // Megabyte figures stay far from overflowing when shifted into bytes.
  if (!range("client-lag-mb", s.client_lag_mb, 1, 65'536)) return false;
  if (!range("retention-mb", s.retention_mb, 1, std::uint64_t{1} << 24)) return false;
  if (!range("tail-mb", s.tail_mb, 1, 65'536)) return false;
  if (!range("max-clients", s.max_clients, 0, 1'000'000)) return false;
  auto member = [&](const char* name, const std::string& v, std::initializer_list<const char*> allowed) {
    for (const char* a : allowed)
      if (v == a) return true;
    error = std::string("--") + name + " (or " + env_name(name) + ", or " + name + " in the config file): '" + v +
            "' is not one of";
    for (const char* a : allowed) error += std::string(" ") + a;
    return false;
  };
  if (!member("debezium-decimal-mode", s.decimal_mode, {"string", "double", "precise"})) return false;
  if (!member("debezium-time-precision", s.time_precision, {"adaptive_time_microseconds", "connect"})) return false;
  if (!member("streaming", s.streaming, {"on", "off"})) return false;
  if (!s.create_publication.empty() && s.create_publication != "ALL TABLES" && s.create_publication != "all") {
    std::string why;
    if (!proxy::parse_table_list(s.create_publication, false, true, why)) {
      error = "--create-publication (or WALGATE_CREATE_PUBLICATION, or create-publication in the config file): " + why;
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"walgate — PostgreSQL logical replication as JSON for browsers, WebSocket clients and curl\n"
               "Settings: flags over WALGATE_<FLAG> environment variables over the --config TOML file."};
  app.set_version_flag("--version", "walgate 0.1.0");
  settings s, stream_settings;
  std::string capture, config;
  app.add_option("--config", config, "TOML config file (keys as the long flags without --)");
  std::vector<binding> bindings = {
      {"pg", &s.pg}, {"slot", &s.slot}, {"publication", &s.publications}, {"status-interval", &s.status_interval_ms},
      {"create-publication", &s.create_publication}, {"listen", &s.listen}, {"data-dir", &s.data_dir},
      {"allow-unauthenticated", &s.allow_unauthenticated}, {"tls-cert", &s.tls_cert}, {"tls-key", &s.tls_key},
      {"client-lag-mb", &s.client_lag_mb}, {"retention-mb", &s.retention_mb}, {"tail-mb", &s.tail_mb}, {"max-clients", &s.max_clients}, {"allow-origin", &s.allow_origins}, {"allow-host", &s.allow_hosts}, {"debezium-name", &s.debezium_name},
      {"debezium-decimal-mode", &s.decimal_mode}, {"debezium-time-precision", &s.time_precision},
      {"streaming", &s.streaming}, {"no-fsync", &s.no_fsync}};
  // --config is needed before the flags are parsed (they override what it sets).
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--config") config = argv[i + 1];
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind("--config=", 0) == 0) config = std::string(argv[i]).substr(9);
  if (config.empty())
    if (const char* c = std::getenv("WALGATE_CONFIG")) config = c;
  std::string error;
  if (!load_config_and_env(bindings, config, error)) {
    std::fprintf(stderr, "walgate: %s\n", error.c_str());
    return 2;
  }
  auto add_common = [&](CLI::App* a, settings& st) {
    a->add_option("--pg", st.pg, "libpq connection string or URI (PG* environment honoured)");
    a->add_option("--slot", st.slot, "logical replication slot (created if missing)")->capture_default_str();
    a->add_option("--publication", st.publications, "publication(s) to stream")->delimiter(',');
    a->add_option("--status-interval", st.status_interval_ms, "status update interval while idle, ms (100-60000)")
        ->capture_default_str();
  };
  add_common(&app, s);
  app.add_option("--create-publication", s.create_publication,
                 "create the publication if missing: 'ALL TABLES' or a table list (schema.t1,schema.t2)");
  app.add_option("--listen", s.listen, "HOST:PORT to serve on")->capture_default_str();
  app.add_option("--data-dir", s.data_dir, "directory of the event log")->capture_default_str();
  app.add_flag("--allow-unauthenticated", s.allow_unauthenticated, "allow a non-loopback --listen without authentication");
  app.add_option("--tls-cert", s.tls_cert, "PEM certificate chain for HTTPS/WSS");
  app.add_option("--tls-key", s.tls_key, "PEM private key for HTTPS/WSS");
  app.add_option("--client-lag-mb", s.client_lag_mb, "a client further behind than this is disconnected (1-65536)")
      ->capture_default_str();
  app.add_option("--retention-mb", s.retention_mb, "event log kept on disk (1-16777216)")->capture_default_str();
  app.add_option("--tail-mb", s.tail_mb, "newest events (and their encodings) kept in memory for live clients (1-65536)")
      ->capture_default_str();
  app.add_option("--max-clients", s.max_clients,
                 "stream clients at once (more get 503); 0: 10000, or what the open-file limit allows")
      ->capture_default_str();
  app.add_option("--allow-origin", s.allow_origins,
                 "origin (scheme://host[:port], or *) whose pages may read the stream across origins")
      ->delimiter(',');
  app.add_option("--allow-host", s.allow_hosts,
                 "Host name served on a loopback --listen besides localhost (a reverse proxy's public name; * for any)")
      ->delimiter(',');
  app.add_option("--debezium-name", s.debezium_name, "Debezium source.name")->capture_default_str();
  app.add_option("--debezium-decimal-mode", s.decimal_mode, "string, double or precise")->capture_default_str();
  app.add_option("--debezium-time-precision", s.time_precision, "adaptive_time_microseconds or connect")
      ->capture_default_str();
  app.add_option("--streaming", s.streaming,
                 "on: PostgreSQL 14+ sends large transactions while they run (held here until their commit); off: at commit")
      ->capture_default_str();
  app.add_flag("--no-fsync", s.no_fsync, "do not fdatasync the event log (benchmarks only: acknowledges unsynced data)");
  auto* demo = app.add_subcommand("demo", "a throwaway PostgreSQL with a trickle of changes, and the gateway");
  demo->add_option("--listen", s.listen, "HOST:PORT to serve on");
  auto* stream = app.add_subcommand("stream", "stream from a server and print each decoded message");
  add_common(stream, stream_settings);
  stream->add_option("--capture", capture, "append every byte read from the server to FILE");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const settings* st : {&s, &stream_settings}) {
    if (!validate(*st, error)) {
      std::fprintf(stderr, "walgate: %s\n", error.c_str());
      return 2;
    }
  }
  if (*demo) return run_demo(s);
  if (*stream) return run_stream(stream_settings, capture);
  if (s.pg.empty()) {
    std::fprintf(stderr, "walgate: --pg is required (or WALGATE_PG, or pg in the --config file); see walgate --help\n");
    return 2;
  }
  return serve(s);
}
