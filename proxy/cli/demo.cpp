// walgate demo: a throwaway PostgreSQL (local_cluster), a demo schema with a trickle of
// changes, and the gateway on it; Ctrl-C stops and removes everything.
#include "commands.hpp"

#include "walgate/proxy/local_cluster.hpp"

#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

namespace walgate::cli {

namespace {

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

}  // namespace

int run_demo(config s) {
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

}  // namespace walgate::cli
