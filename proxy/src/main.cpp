// The walgate executable.
//   walgate demo                  a throwaway PostgreSQL with a trickle of changes, streamed
//   walgate stream --pg ... --slot ... --publication ...   stream from a server and print frames
#include "walgate/protocol/pgoutput.hpp"
#include "walgate/protocol/replication.hpp"
#include "walgate/proxy/local_cluster.hpp"
#include "walgate/proxy/pg_connection.hpp"
#include "walgate/proxy/replication_client.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <libpq-fe.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <thread>

namespace asio = boost::asio;
using namespace walgate;

namespace {

constexpr const char* usage = R"(walgate — PostgreSQL logical replication as JSON for the web

usage:
  walgate demo
      Start a throwaway PostgreSQL (initdb in a temp dir, wal_level=logical), create a demo
      schema with a steady trickle of inserts, updates and deletes, and stream it. Ctrl-C stops
      everything and leaves nothing behind.

  walgate stream --pg CONNINFO --slot NAME --publication NAME[,NAME...] [options]
      Stream from a server over walgate's own replication client and print each decoded message.
        --pg CONNINFO          libpq connection string or URI (PG* environment honoured)
        --slot NAME            logical replication slot (created if missing)
        --publication NAMES    publication(s) to stream, comma separated
        --no-create-slot       fail instead of creating a missing slot
        --temporary-slot       create the slot TEMPORARY (dropped when the connection ends)
        --status-interval MS   status update interval while idle (default 10000)
        --capture FILE         append every byte read from the server to FILE

  walgate --help | --version
)";

/// Prints each decoded pgoutput message (rows as column=value with their table), and treats a
/// printed transaction as durable: the flush position reported to the server is the end LSN of
/// the last Commit printed (a Commit's WAL start is its end LSN). Between transactions, a
/// keepalive's WAL end is durable too: nothing is outstanding.
class print_sink final : public proxy::replication_sink {
 public:
  explicit print_sink(std::FILE* out) : out_(out) {}

  void on_stream_start(const proxy::stream_start_info& i) override {
    context_ = protocol::pgoutput::decode_context{i.proto_version, false, false};
    std::fprintf(out_, "-- streaming from PostgreSQL %d, pgoutput proto_version %u, from %s\n", i.server_major,
                 i.proto_version, i.start.to_string().c_str());
    std::fflush(out_);
  }

  boost::system::error_code on_xlog_data(const protocol::xlog_data& x) override {
    namespace pg = protocol::pgoutput;
    auto decoded = decoder_.decode(x.data, context_);
    if (!decoded) {
      std::fprintf(stderr, "walgate: cannot decode the message at %s: %s\n", x.wal_start.to_string().c_str(),
                   decoded.error().message().c_str());
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
    std::fprintf(out_, "%s\n", line.c_str());
    if (tag == 'C') {
      in_transaction_ = false;
      std::fflush(out_);
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

  std::FILE* out_;
  protocol::pgoutput::decoder decoder_;
  protocol::pgoutput::decode_context context_;
  protocol::pgoutput::relation_cache relations_;
  bool in_transaction_ = false;
  protocol::lsn durable_;
};

int run_stream(asio::io_context& io, proxy::replication_settings settings, const std::string& capture) {
  print_sink sink(stdout);
  proxy::replication_client client(io.get_executor(), std::move(settings), sink);
  if (!capture.empty()) client.set_capture_file(capture);
  client.set_retry_handler([](const proxy::failure& f, std::chrono::milliseconds d) {
    std::fprintf(stderr, "walgate: %s\nwalgate: reconnecting in %lld ms\n", f.message.c_str(),
                 static_cast<long long>(d.count()));
  });
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int) {
    if (!ec) client.stop();
  });
  int rc = 0;
  asio::co_spawn(io, client.run(), [&](std::exception_ptr e, proxy::outcome<void> r) {
    signals.cancel();
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "walgate: %s\n", ex.what());
      }
      rc = 1;
    } else if (!r) {
      std::fprintf(stderr, "walgate: %s\n", r.error().message.c_str());
      rc = 1;
    }
  });
  io.run();
  auto p = client.positions();
  std::fprintf(stderr, "walgate: stopped; received %s, durable %s, acknowledged %s\n",
               p.received.to_string().c_str(), p.durable.to_string().c_str(), p.acknowledged.to_string().c_str());
  return rc;
}

// A steady trickle of realistic changes on the demo schema, through libpq (plain SQL).
void trickle(const std::string& conninfo, std::atomic<bool>& stop) {
  PGconn* c = PQconnectdb(conninfo.c_str());
  if (PQstatus(c) != CONNECTION_OK) {
    std::fprintf(stderr, "walgate demo: %s", PQerrorMessage(c));
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
    const char* sql = statements[rng() % 4];
    PGresult* r = PQexec(c, sql);
    PQclear(r);
    for (int i = 0; i < 10 && !stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  PQfinish(c);
}

int run_demo() {
  std::string error;
  proxy::cluster_options o;
  o.name = "walgate-demo";
  std::fprintf(stderr, "walgate demo: starting a throwaway PostgreSQL...\n");
  auto cluster = proxy::local_cluster::start(o, error);
  if (!cluster) {
    std::fprintf(stderr, "walgate demo: %s\n", error.c_str());
    return 1;
  }
  std::string setup = cluster->try_sql(
      "CREATE TABLE customers(id bigserial PRIMARY KEY, name text NOT NULL, email text, "
      "created_at timestamptz NOT NULL DEFAULT now());"
      "CREATE TABLE orders(id bigserial PRIMARY KEY, customer_id bigint NOT NULL REFERENCES customers, "
      "status text NOT NULL, amount numeric(12,2) NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());"
      "INSERT INTO customers(name, email) SELECT 'customer ' || g, 'c' || g || '@example.com' "
      "FROM generate_series(1, 20) g;"
      "CREATE PUBLICATION walgate_demo FOR ALL TABLES;");
  if (!setup.empty()) {
    std::fprintf(stderr, "walgate demo: setting up the demo schema failed: %s\n", setup.c_str());
    return 1;
  }
  std::fprintf(stderr,
               "walgate demo: PostgreSQL %d on port %d (socket dir %s), publication walgate_demo\n"
               "walgate demo: streaming changes; press Ctrl-C to stop\n",
               cluster->server_major(), cluster->port(), cluster->socket_dir().c_str());

  auto parsed = proxy::parse_conninfo(cluster->conninfo());
  proxy::replication_settings s;
  s.conn = *parsed.params;
  s.slot = "walgate_demo";
  s.publications = {"walgate_demo"};
  std::atomic<bool> stop{false};
  std::thread t(trickle, cluster->conninfo(), std::ref(stop));
  asio::io_context io;
  int rc = run_stream(io, s, {});
  stop = true;
  t.join();
  cluster.reset();
  std::fprintf(stderr, "walgate demo: PostgreSQL stopped and its directory removed\n");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(usage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::puts("walgate 0.1.0");
    return 0;
  }
  if (args[0] == "demo") return run_demo();
  if (args[0] != "stream") {
    std::fprintf(stderr, "walgate: unknown command \"%s\" (try walgate --help)\n", args[0].c_str());
    return 2;
  }
  std::string pg, capture;
  proxy::replication_settings s;
  for (std::size_t i = 1; i < args.size(); ++i) {
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "walgate: %s needs a value\n", flag);
        std::exit(2);
      }
      return args[++i];
    };
    const std::string& a = args[i];
    if (a == "--pg") pg = value("--pg");
    else if (a == "--slot") s.slot = value("--slot");
    else if (a == "--publication") {
      std::string v = value("--publication");
      std::size_t start = 0;
      for (;;) {
        auto comma = v.find(',', start);
        s.publications.push_back(v.substr(start, comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (a == "--no-create-slot") s.create_slot = false;
    else if (a == "--temporary-slot") s.temporary_slot = true;
    else if (a == "--status-interval") s.status_interval = std::chrono::milliseconds(std::stol(value("--status-interval")));
    else if (a == "--capture") capture = value("--capture");
    else {
      std::fprintf(stderr, "walgate: unknown option \"%s\" (try walgate --help)\n", a.c_str());
      return 2;
    }
  }
  auto parsed = proxy::parse_conninfo(pg);
  if (!parsed.params) {
    std::fprintf(stderr, "walgate: --pg: %s\n", parsed.error.c_str());
    return 2;
  }
  if (s.slot.empty() || s.publications.empty()) {
    std::fprintf(stderr, "walgate: --slot and --publication are required\n");
    return 2;
  }
  s.conn = *parsed.params;
  asio::io_context io;
  return run_stream(io, s, capture);
}
