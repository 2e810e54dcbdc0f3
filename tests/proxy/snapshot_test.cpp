// Per-client snapshots (snapshot=true) on a real PostgreSQL: the rows in every format and
// transport, values byte-equal to the live stream's, then the changes with no gap and no
// duplicate while a writer commits inserts, updates, deletes and key changes (a long-running
// writer stays open across the snapshots, and the replication connection is cut twice); the
// concurrency limit; a client cut off during its snapshot; a resume after it.
#include "gateway_harness.hpp"
#include "test_cluster.hpp"
#include "type_cases.hpp"

#include <libpq-fe.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

using namespace walgate;
using namespace walgate::test::harness;

namespace {

bool is_marker(const json::value& v) {
  return v.is_object() && v.as_object().contains("snapshot") && v.as_object().at("snapshot") == "end";
}

/// The NDJSON lines of a snapshot=true stream up to and including its end marker.
std::vector<std::string> until_marker(stream_client& c, std::size_t limit = 10'000'000) {
  std::vector<std::string> out;
  while (out.size() < limit) {
    auto l = c.events(1);
    if (l.empty()) break;
    out.push_back(l[0]);
    if (l[0].rfind("{\"snapshot\":\"end\"", 0) == 0) break;
  }
  return out;
}

/// A table's rows as native JSON objects would give them, from SELECT row_to_json.
std::vector<std::string> select_rows(const std::string& table) {
  std::vector<std::string> out;
  for (auto& r : test::cluster().sql("SELECT row_to_json(t)::text FROM " + table + " t"))
    out.push_back(json::serialize(json::parse(*r[0])));
  std::sort(out.begin(), out.end());
  return out;
}

/// A client's view of the tables, built from native events: snapshot rows, then changes. A row
/// state seen twice (an insert of a key it holds) or a change to a row it does not hold (a gap)
/// is a failure.
struct model {
  std::map<std::string, std::map<std::string, json::object>> keyed;   // table -> key -> row
  std::map<std::string, std::multiset<std::string>> full;             // keyless tables: rows
  std::set<std::string> keyless;
  std::vector<std::string> errors;
  bool marker = false, done = false;
  std::size_t rows = 0, changes_before_marker = 0;

  static std::string key_of(const json::object& row) { return json::serialize(row.at("id")); }

  void apply(const std::string& line) {
    auto v = json::parse(line);
    if (is_marker(v)) {
      if (marker) errors.push_back("two end markers");
      marker = true;
      return;
    }
    if (!v.is_object() || !v.as_object().contains("schema")) {
      errors.push_back("not an event: " + line.substr(0, 300));
      done = true;   // (the stream's end line: nothing more comes)
      return;
    }
    auto& e = v.as_object();
    std::string table = std::string(e.at("schema").as_string()) + "." + std::string(e.at("table").as_string());
    std::string op(e.at("op").as_string());
    if (table == "public.snap_done") {
      done = true;
      return;
    }
    if (op == "read") {
      ++rows;
      if (marker) errors.push_back("a snapshot row after the end marker");
    } else if (!marker) {
      ++changes_before_marker;
    }
    if (keyless.contains(table)) {
      auto& rows_of = full[table];
      auto remove = [&](const json::value& r) {
        auto it = rows_of.find(json::serialize(r));
        if (it == rows_of.end()) errors.push_back(table + ": no such row to change: " + json::serialize(r));
        else rows_of.erase(it);
      };
      if (op == "read" || op == "insert") rows_of.insert(json::serialize(e.at("after")));
      else if (op == "update") {
        remove(e.at("before"));
        rows_of.insert(json::serialize(e.at("after")));
      } else if (op == "delete") remove(e.at("before"));
      return;
    }
    auto& rows_of = keyed[table];
    if (op == "read" || op == "insert") {
      auto row = e.at("after").as_object();
      auto k = key_of(row);
      if (rows_of.contains(k)) errors.push_back(table + ": " + op + " of a row already there: " + k);
      rows_of[k] = row;
    } else if (op == "update") {
      auto row = e.at("after").as_object();
      std::string old = e.at("before").is_object() ? key_of(e.at("before").as_object()) : key_of(row);
      auto it = rows_of.find(old);
      if (it == rows_of.end()) {
        errors.push_back(table + ": update of a row not there: " + old);
        return;
      }
      for (auto& [name, value] : row)   // a TOASTed value the update did not touch: as it was
        if (value == "__unchanged_toast__") value = it->second.at(name);
      // snap_k's updates add 1 to v, or change the key (v kept), or are the long-running
      // writer's (v = -1): an update seen twice, or one missed, shows here.
      if (table == "public.snap_k") {
        const auto was = it->second.at("v").to_number<long long>(), now = row.at("v").to_number<long long>();
        const bool key_changed = e.at("before").is_object();
        if (!(key_changed ? now == was : (now == was + 1 || now == -1)))
          errors.push_back(table + ": v went from " + std::to_string(was) + " to " + std::to_string(now) + " at " + old);
      }
      rows_of.erase(it);
      auto k = key_of(row);
      if (rows_of.contains(k)) errors.push_back(table + ": update onto a row already there: " + k);
      rows_of[k] = row;
    } else if (op == "delete") {
      auto k = key_of(e.at("before").as_object());
      if (!rows_of.erase(k)) errors.push_back(table + ": delete of a row not there: " + k);
    }
  }

  std::vector<std::string> rows_of(const std::string& table) const {
    std::vector<std::string> out;
    if (keyless.contains(table)) {
      if (auto it = full.find(table); it != full.end()) out.assign(it->second.begin(), it->second.end());
    } else if (auto it = keyed.find(table); it != keyed.end()) {
      for (const auto& [k, row] : it->second) out.push_back(json::serialize(row));
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

/// A libpq connection of the test's own (the writers).
struct pq {
  PGconn* c;
  pq() : c(PQconnectdb(test::cluster().conninfo().c_str())) { REQUIRE(PQstatus(c) == CONNECTION_OK); }
  ~pq() { PQfinish(c); }
  std::string exec(const std::string& sql) {
    PGresult* r = PQexec(c, sql.c_str());
    std::string error = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK
                            ? std::string()
                            : std::string(PQresultErrorMessage(r));
    PQclear(r);
    return error;
  }
};

/// Random inserts, updates, deletes and key changes on the test tables until stop; each a
/// transaction of its own or a few together. Ids 1-10 of snap_k are the long-running writer's.
void write_randomly(std::atomic<bool>& stop, std::atomic<std::uint64_t>& committed, unsigned seed) {
  pq w;
  std::mt19937 rng(seed);
  int next = 1'000'000 + static_cast<int>(seed) * 100'000;
  auto some = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  while (!stop) {
    std::string sql;
    int n = some(1, 3);
    if (n > 1) sql += "BEGIN;";
    for (int i = 0; i < n; ++i) {
      switch (some(0, 9)) {
        case 0: sql += "INSERT INTO snap_k VALUES (" + std::to_string(next++) + ", 1, 'new');"; break;
        case 1: sql += "UPDATE snap_k SET v = v + 1 WHERE id = " + std::to_string(some(11, 20'000)) + ";"; break;
        case 2: sql += "DELETE FROM snap_k WHERE id = " + std::to_string(some(11, 20'000)) + ";"; break;
        case 3:   // a key change
          sql += "UPDATE snap_k SET id = " + std::to_string(next++) + " WHERE id = " + std::to_string(some(11, 20'000)) + ";";
          break;
        case 4: sql += "INSERT INTO snap_full VALUES (" + std::to_string(some(0, 50)) + ", 'dup');"; break;
        case 5:
          sql += "DELETE FROM snap_full WHERE ctid = (SELECT ctid FROM snap_full WHERE a = " + std::to_string(some(0, 50)) +
                 " LIMIT 1);";
          break;
        case 6: sql += "UPDATE snap_full SET b = b || 'x' WHERE a = " + std::to_string(some(0, 50)) + ";"; break;
        case 7:   // across the partitions, and within one
          sql += "UPDATE snap_part SET id = id + 5000 WHERE id = " + std::to_string(some(1, 4000)) + ";";
          sql += "INSERT INTO snap_part VALUES (" + std::to_string(next++ % 10'000) + ", 'p') ON CONFLICT DO NOTHING;";
          break;
        case 8:   // the small column (the TOASTed one unchanged), or the big one
          if (some(0, 1))
            sql += "UPDATE snap_toast SET v = v + 1 WHERE id = " + std::to_string(some(1, 12)) + ";";
          else
            sql += "UPDATE snap_toast SET big = repeat(md5(random()::text), 1000) WHERE id = " +
                   std::to_string(some(1, 12)) + ";";
          break;
        default: sql += "DELETE FROM snap_part WHERE id = " + std::to_string(some(1, 9999)) + ";"; break;
      }
    }
    if (n > 1) sql += "COMMIT;";
    auto error = w.exec(sql);
    if (!error.empty() && n > 1) w.exec("ROLLBACK");   // (a key change onto a taken id: rare, harmless)
    else ++committed;
  }
}

void create_tables(const char* publication) {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE snap_k(id int PRIMARY KEY, v int, pad text);"
         "INSERT INTO snap_k SELECT g, g, repeat('p', g % 50) FROM generate_series(1, 20000) g;"
         "CREATE TABLE snap_full(a int, b text); ALTER TABLE snap_full REPLICA IDENTITY FULL;"
         "INSERT INTO snap_full SELECT g % 50, 'r' FROM generate_series(1, 500) g;"
         "CREATE TABLE snap_part(id int PRIMARY KEY, v text) PARTITION BY RANGE (id);"
         "CREATE TABLE snap_part_a PARTITION OF snap_part FOR VALUES FROM (0) TO (5000);"
         "CREATE TABLE snap_part_b PARTITION OF snap_part FOR VALUES FROM (5000) TO (20000);"
         "INSERT INTO snap_part SELECT g, 'v' || g FROM generate_series(1, 4000) g;"
         "CREATE TABLE snap_toast(id int PRIMARY KEY, v int, big text);"
         "INSERT INTO snap_toast SELECT g, 0, repeat(md5(g::text), 5000) FROM generate_series(1, 12) g;"
         "CREATE TABLE snap_done(id int PRIMARY KEY);");
  pg.sql(std::string("CREATE PUBLICATION ") + publication +
         " FOR TABLE snap_k, snap_full, snap_part, snap_toast, snap_done WITH (publish_via_partition_root = true)");
}

const char* model_tables[] = {"public.snap_k", "public.snap_full", "public.snap_part", "public.snap_toast"};

void check_model(const model& m, const std::string& who) {
  INFO(who);
  CHECK(m.marker);
  CHECK(m.done);
  CHECK(m.errors.empty());
  for (const auto& e : m.errors) {
    MESSAGE(e);
    if (&e - &m.errors.front() > 10) break;
  }
  for (const char* t : model_tables) {
    INFO(t);
    auto want = select_rows(t);
    auto got = m.rows_of(t);
    CHECK(got.size() == want.size());
    CHECK(got == want);
  }
}

/// Reads a client to the end marker and on until the sentinel row, into a model.
template <class Next>
void follow(model& m, Next next) {
  m.keyless = {"public.snap_full"};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (!m.done && std::chrono::steady_clock::now() < deadline) {
    auto line = next();
    if (!line) break;
    if (line->empty()) continue;
    m.apply(*line);
  }
}

}  // namespace

TEST_CASE("snapshot=true on every format and transport: the rows, the end marker, then the changes") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE snapf(id int PRIMARY KEY, name text); INSERT INTO snapf VALUES (1, 'one'), (2, 'two'), (3, NULL);"
         "CREATE TABLE snapf_other(id int PRIMARY KEY); INSERT INTO snapf_other VALUES (7);"
         "CREATE TABLE snapf_unpublished(id int);"
         "CREATE PUBLICATION snapf_pub FOR TABLE snapf, snapf_other");
  running_gateway g("snapf_slot", "snapf_pub");
  pg.sql("INSERT INTO snapf_other VALUES (8)");   // logged before any snapshot: in the rows, not again

  const char* formats[] = {"native", "debezium", "pgoutput2json", "waltail", "wal2json"};
  for (const char* f : formats) {
    INFO("format " << f);
    const std::string q = std::string("/v1/stream?snapshot=true&transactions=false&tables=public.snapf&format=") + f;
    stream_client nd(g.port(), q);
    if (nd.status() != 200) MESSAGE(get_path(g.port(), q).second);
    REQUIRE(nd.status() == 200);
    auto lines = until_marker(nd);
    REQUIRE(lines.size() == 4);
    auto marker = json::parse(lines[3]).as_object();
    CHECK(marker.at("snapshot") == "end");
    CHECK(marker.at("rows") == 3);
    std::string resume(marker.at("resume_from").as_string());
    CHECK(transform::event_id::parse(resume));
    std::set<std::string> keys;
    for (int i = 0; i < 3; ++i) {
      auto row = json::parse(lines[i]).as_object();
      std::string fs = f;
      if (fs == "native") {
        CHECK(row.at("op") == "read");
        CHECK(row.at("commit_lsn") == "0/0");
        CHECK(row.at("before").is_null());
        keys.insert(json::serialize(row.at("after").at("id")));
      } else if (fs == "debezium") {
        CHECK(row.at("op") == "r");
        CHECK(row.at("source").at("snapshot") == (i == 2 ? "last" : "true"));
        CHECK(row.at("source").at("lsn").is_null());
        CHECK(row.at("before").is_null());
        keys.insert(json::serialize(row.at("after").at("id")));
      } else if (fs == "pgoutput2json") {
        CHECK(row.at("c") == "C");
        CHECK(row.at("w") == 0);
        CHECK(row.at("t") == "public.snapf");
        keys.insert(json::serialize(row.at("r").at("id")));
      } else if (fs == "waltail") {
        CHECK(row.at("op") == "read");
        CHECK(row.at("commit_lsn") == "0/0");
        CHECK(row.at("seq") == i + 1);
        CHECK(row.at("old").is_null());
        keys.insert(std::string(row.at("idempotency_key").as_string()));
      } else {
        CHECK(row.at("action") == "I");
        CHECK(row.at("table") == "snapf");
        keys.insert(json::serialize(row.at("columns")));
      }
    }
    CHECK(keys.size() == 3);   // three different rows (and three idempotency keys)
    // Then the changes: one insert, in the format's live shape.
    pg.sql(std::string("INSERT INTO snapf VALUES (100, '") + f + "')");
    auto live = nd.events(1);
    REQUIRE(live.size() == 1);
    auto ev = json::parse(live[0]).as_object();
    const std::string fs = f;
    if (fs == "native" || fs == "waltail") CHECK(ev.at("op") == "insert");
    else if (fs == "debezium") CHECK(ev.at("op") == "c");
    else if (fs == "pgoutput2json") CHECK(ev.at("c") == "I");
    else CHECK(ev.at("action") == "I");
    // A resume from the marker's id starts after it: that insert, no snapshot again.
    stream_client again(g.port(), q + "&from=" + resume);
    auto resumed = again.events(1);
    REQUIRE(resumed.size() == 1);
    CHECK(resumed[0] == live[0]);
    pg.sql(std::string("DELETE FROM snapf WHERE id = 100"));
    CHECK(nd.events(1).size() == 1);
  }
  {
    INFO("pgoutput2json compact: s with the first row of each table, keys from the primary key");
    stream_client nd(g.port(), "/v1/stream?snapshot=true&format=pgoutput2json&compact=true");
    auto lines = until_marker(nd);
    REQUIRE(lines.size() == 6);   // snapf 3, snapf_other 2, the marker
    CHECK(json::parse(lines[0]).at("s").at(0) == "public.snapf");
    CHECK(json::parse(lines[0]).at("s").at(1).at(1) == 1);   // id: a key column
    CHECK(!json::parse(lines[1]).as_object().contains("s"));
    CHECK(json::parse(lines[3]).at("s").at(0) == "public.snapf_other");
    CHECK(json::parse(lines[3]).at("r") == json::parse("[7]"));
  }
  {
    INFO("Server-Sent Events: rows without ids, an snapshot-end event with the id; Last-Event-ID resumes after it");
    stream_client sse(g.port(), "/v1/stream?snapshot=true&tables=public.snapf",
                      {{"Accept", "text/event-stream"}});
    REQUIRE(sse.status() == 200);
    std::vector<std::string> raw;
    while (raw.size() < 40) {
      auto l = sse.lines(1);
      REQUIRE(l.size() == 1);
      raw.push_back(l[0]);
      if (l[0].rfind("data: {\"snapshot\":\"end\"", 0) == 0) break;
    }
    std::size_t ids = 0, rows = 0;
    std::string event_line, id_line;
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i].rfind("id: ", 0) == 0) ++ids, id_line = raw[i];
      if (raw[i].rfind("event: ", 0) == 0) event_line = raw[i];
      if (raw[i].rfind("data: {\"id\"", 0) == 0) ++rows;
    }
    CHECK(rows == 3);
    CHECK(ids == 1);   // only the marker
    CHECK(event_line == "event: snapshot-end");
    std::string marker_id = id_line.substr(4);
    pg.sql("INSERT INTO snapf VALUES (200, 'after the marker')");
    auto next = sse.sse(1);
    REQUIRE(next.size() == 1);
    stream_client resumed(g.port(), "/v1/stream?snapshot=true&tables=public.snapf",
                          {{"Accept", "text/event-stream"}, {"Last-Event-ID", marker_id}});
    auto first = resumed.sse(1);
    REQUIRE(first.size() == 1);
    CHECK(first[0] == next[0]);   // no snapshot again: straight to what followed the marker
    pg.sql("DELETE FROM snapf WHERE id = 200");
  }
  {
    INFO("WebSocket: a message per row, the marker message, then changes");
    ws_client ws(g.port(), "/v1/ws?snapshot=true&tables=public.snapf_other", true);
    auto m = ws.messages(3);
    REQUIRE(m.size() == 3);
    CHECK(json::parse(m[0]).at("op") == "read");
    CHECK(json::parse(m[1]).at("op") == "read");
    CHECK(is_marker(json::parse(m[2])));
    pg.sql("INSERT INTO snapf_other VALUES (9)");
    auto live = ws.messages(1);
    REQUIRE(live.size() == 1);
    CHECK(json::parse(live[0]).at("op") == "insert");
  }
  {
    INFO("refusals: a table not published is 400, a bad value 400");
    auto [code, body] = get_path(g.port(), "/v1/stream?snapshot=true&tables=public.snapf_unpublished");
    CHECK(code == 400);
    CHECK(body.find("not in the publication") != std::string::npos);
    CHECK(get_path(g.port(), "/v1/stream?snapshot=maybe").first == 400);
  }
}

TEST_CASE("snapshot rows are byte-equal to the live stream's rows, every type, every format") {
  auto& pg = test::cluster();
  pg.sql(test::case_types_sql);
  const int major = pg.server_major();
  std::string create = "CREATE TABLE snap_types(id int PRIMARY KEY, big text";
  for (const auto& c : test::cases) create += std::string(", ") + c.name + " " + c.type;
  pg.sql(create + "); CREATE PUBLICATION snap_types_pub FOR TABLE snap_types");
  running_gateway g("snap_types_slot", "snap_types_pub");
  const char* formats[] = {"native", "debezium", "pgoutput2json", "waltail", "wal2json"};
  std::vector<std::unique_ptr<stream_client>> live;
  for (const char* f : formats)
    live.push_back(std::make_unique<stream_client>(g.port(), std::string("/v1/stream?transactions=false&format=") + f));
  std::string values;
  for (const auto& c : test::cases)
    values += std::string(", ") + (std::string(c.name) == "num_inf" && major < 14 ? "'NaN'" : c.value);
  // A row of every value, one with a TOASTed megabyte, one of NULLs.
  pg.sql("INSERT INTO snap_types VALUES (1, 'small'" + values + ")");
  pg.sql("INSERT INTO snap_types VALUES (2, repeat(md5('x'), 40000)" + values + ")");
  pg.sql("INSERT INTO snap_types(id) VALUES (3)");
  for (std::size_t i = 0; i < 5; ++i) {
    INFO("format " << formats[i]);
    auto inserts = live[i]->events(3);
    REQUIRE(inserts.size() == 3);
    stream_client snap(g.port(), std::string("/v1/stream?snapshot=true&transactions=false&format=") + formats[i]);
    auto rows = until_marker(snap);
    REQUIRE(rows.size() == 4);
    const std::string fs = formats[i];
    const char* member = fs == "pgoutput2json" ? "r" : fs == "waltail" ? "data" : fs == "wal2json" ? "columns" : "after";
    for (int k = 0; k < 3; ++k) {
      auto a = json::parse(inserts[k]).as_object().at(member);
      auto b = json::parse(rows[k]).as_object().at(member);
      CHECK(json::serialize(a) == json::serialize(b));
      // and the text itself, byte for byte (numbers too: 1.50 stays 1.50)
      CHECK(test::raw_member(inserts[k], member) == test::raw_member(rows[k], member));
    }
  }
}

TEST_CASE("snapshots while a writer commits: every client's rows then changes equal SELECT, nothing twice") {
  create_tables("snap_pub");
  server_options so;
  so.client_lag_bytes = std::size_t{1} << 30;   // (exactness here, not the slow-client rule: readers parse every line)
  running_gateway g("snap_slot", "snap_pub", so);
  // A long-running writer: open before the snapshots, committed after they are taken.
  pq longrun;
  REQUIRE(longrun.exec("BEGIN; UPDATE snap_k SET v = -1 WHERE id = 1; INSERT INTO snap_k VALUES (5000000, 0, 'long');"
                       "DELETE FROM snap_k WHERE id = 2") == "");
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> committed{0};
  std::thread w1([&] { write_randomly(stop, committed, 1); });
  std::thread w2([&] { write_randomly(stop, committed, 2); });
  REQUIRE(test::wait_until([&] { return committed > 50; }));

  const std::string tables = "&tables=public.snap_k,public.snap_full,public.snap_part,public.snap_toast,public.snap_done";
  constexpr int clients = 6;
  std::vector<model> models(clients);
  std::vector<std::thread> readers;
  std::atomic<int> markers{0};
  int terminated = 0;
  for (int i = 0; i < clients; ++i) {
    readers.emplace_back([&, i] {
      auto& m = models[i];
      const int kind = i % 3;   // NDJSON, SSE, WebSocket
      if (kind == 0) {
        stream_client c(g.port(), "/v1/stream?snapshot=true" + tables);
        follow(m, [&]() -> std::optional<std::string> {
          auto l = c.events(1);
          if (l.empty()) return std::nullopt;
          if (l[0].rfind("{\"snapshot\"", 0) == 0) ++markers;
          return l[0];
        });
      } else if (kind == 1) {
        stream_client c(g.port(), "/v1/stream?snapshot=true" + tables, {{"Accept", "text/event-stream"}});
        follow(m, [&]() -> std::optional<std::string> {
          auto l = c.sse(1);
          if (l.empty()) return std::nullopt;
          if (l[0].second.rfind("{\"snapshot\"", 0) == 0) ++markers;
          return l[0].second;
        });
      } else {
        ws_client c(g.port(), "/v1/ws?snapshot=true" + tables);
        follow(m, [&]() -> std::optional<std::string> {
          auto l = c.messages(1);
          if (l.empty()) {
            m.errors.push_back("WebSocket closed: " + std::string(c.ws.reason().reason.c_str()));
            return std::nullopt;
          }
          if (l[0].rfind("{\"snapshot\"", 0) == 0) ++markers;
          return l[0];
        });
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));   // staggered, under the writers
    // The replication connection cut twice meanwhile (a transaction half received is dropped
    // and sent again): snapshots waiting for the stream's position wait through the reconnect.
    if (i == 1 || i == 4) {
      auto active = [] {
        return test::cluster().sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'snap_slot' AND active")[0][0] ==
               "1";
      };
      test::wait_until(active);
      terminated += std::stoi(*test::cluster().sql("SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots "
                                                   "WHERE slot_name = 'snap_slot' AND active")[0][0]);
    }
  }
  CHECK(terminated == 2);
  REQUIRE(test::wait_until([&] { return markers == clients; }, std::chrono::seconds(120)));
  REQUIRE(longrun.exec("COMMIT") == "");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  w1.join();
  w2.join();
  test::cluster().sql("INSERT INTO snap_done VALUES (1)");
  for (auto& r : readers) r.join();
  MESSAGE("writer transactions committed: " << committed.load() << ", replication reconnects: " << g.client->reconnects());
  CHECK(g.client->reconnects() >= 2);
  std::size_t changes_in_window = 0;
  for (int i = 0; i < clients; ++i) {
    check_model(models[i], "client " + std::to_string(i) + " (" + (i % 3 == 0 ? "ndjson" : i % 3 == 1 ? "sse" : "ws") + ")");
    CHECK(models[i].rows > 20'000);
    changes_in_window += models[i].changes_before_marker;
  }
  MESSAGE("changes delivered between snapshot rows and end markers: " << changes_in_window);
  // The long-running writer's changes (committed after every snapshot was taken, so in none of
  // their rows) came to everyone as changes: each model equals SELECT, which has them.
  auto& pg = test::cluster();
  CHECK(pg.sql("SELECT v FROM snap_k WHERE id = 1")[0][0] == "-1");
  CHECK(pg.sql("SELECT count(*) FROM snap_k WHERE id = 2")[0][0] == "0");
  CHECK(pg.sql("SELECT pad FROM snap_k WHERE id = 5000000")[0][0] == "long");
}

TEST_CASE("100 clients ask for a snapshot at once: at most --snapshot-concurrency read, all end exact") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE snap_many(id int PRIMARY KEY, v int); INSERT INTO snap_many SELECT g, 0 FROM generate_series(1, 2000) g;"
         "CREATE TABLE snap_many_done(id int PRIMARY KEY);"
         "CREATE PUBLICATION snap_many_pub FOR TABLE snap_many, snap_many_done");
  server_options so;   // (the harness points snapshots at the test database and the publication)
  so.snapshot.max_running = 4;
  so.snapshot.max_queued = 200;
  running_gateway g("snap_many_slot", "snap_many_pub", so);
  std::atomic<bool> stop{false};
  // Each snapshot transaction seen, as an interval inside its true one: from its xact_start to
  // the latest sample that found it still open (at or after its start). pg_stat_activity reads
  // one backend after another, so a single sample's count can include one transaction that just
  // ended and the next that just began; the largest overlap of these intervals cannot.
  std::map<std::pair<std::string, long long>, std::pair<long long, long long>> seen_open;
  std::thread watch([&] {
    pq p;
    while (!stop) {
      PGresult* r = PQexec(p.c, "SELECT pid::text, (extract(epoch FROM xact_start) * 1000000)::bigint, "
                                "(extract(epoch FROM greatest(xact_start, statement_timestamp())) * 1000000)::bigint "
                                "FROM pg_stat_activity WHERE application_name = 'walgate snapshot' "
                                "AND state IN ('active', 'idle in transaction') AND xact_start IS NOT NULL");
      for (int i = 0; i < PQntuples(r); ++i) {
        const long long from = std::atoll(PQgetvalue(r, i, 1)), at = std::atoll(PQgetvalue(r, i, 2));
        auto& iv = seen_open.try_emplace({PQgetvalue(r, i, 0), from}, from, at).first->second;
        iv.second = std::max(iv.second, at);
      }
      PQclear(r);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::thread writer([&] {
    pq w;
    std::mt19937 rng(7);
    while (!stop) w.exec("UPDATE snap_many SET v = v + 1 WHERE id = " + std::to_string(rng() % 2000 + 1));
  });
  constexpr int clients = 100;
  std::vector<std::map<std::string, std::string>> seen(clients);
  std::vector<std::string> errors(clients);
  std::atomic<int> markers{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < clients; ++i)
    readers.emplace_back([&, i] {
      stream_client c(g.port(), "/v1/stream?snapshot=true");
      if (c.status() != 200) {
        errors[i] = "status " + std::to_string(c.status());
        return;
      }
      bool marker = false;
      while (true) {
        auto l = c.events(1);
        if (l.empty()) {
          errors[i] = "ended early";
          return;
        }
        auto v = json::parse(l[0]);
        if (is_marker(v)) {
          marker = true;
          ++markers;
          continue;
        }
        if (!v.as_object().contains("table")) {
          errors[i] = "ended: " + l[0];
          return;
        }
        auto& e = v.as_object();
        if (e.at("table") == "snap_many_done") break;
        auto id = json::serialize(e.at("after").at("id"));
        if (e.at("op") == "read" && (marker || seen[i].contains(id))) errors[i] = "a row read twice or after the marker";
        if (e.at("op") != "read" && !seen[i].contains(id)) errors[i] = "an update of a row not read";
        // each update adds 1 to v: one seen twice or missed shows
        if (e.at("op") == "update" && seen[i].contains(id) &&
            json::parse(seen[i][id]).at("v").to_number<long long>() + 1 != e.at("after").at("v").to_number<long long>())
          errors[i] = "an update seen twice or missed at id " + id;
        seen[i][id] = json::serialize(e.at("after"));
      }
      if (!marker) errors[i] = "no end marker";
    });
  REQUIRE(test::wait_until([&] { return markers == clients; }, std::chrono::seconds(240)));
  stop = true;
  writer.join();
  watch.join();
  pg.sql("INSERT INTO snap_many_done VALUES (1)");
  for (auto& r : readers) r.join();
  std::vector<std::pair<long long, int>> edges;   // (time, +1 opened / -1 closed); closings first at a tie
  for (const auto& [k, iv] : seen_open) {
    edges.emplace_back(iv.first, +1);
    edges.emplace_back(iv.second + 1, -1);   // [from, last seen]: closed after its last microsecond
  }
  std::sort(edges.begin(), edges.end());
  int open = 0, most = 0;
  for (const auto& e : edges) most = std::max(most, open += e.second);
  MESSAGE("snapshot transactions seen: " << seen_open.size() << ", most at once: " << most);
  CHECK(most <= 4);
  CHECK(most >= 1);
  std::map<std::string, std::string> want;
  for (auto& r : pg.sql("SELECT id::text, row_to_json(t)::text FROM snap_many t"))
    want[*r[0]] = json::serialize(json::parse(*r[1]));
  for (int i = 0; i < clients; ++i) {
    INFO("client " << i);
    CHECK(errors[i] == "");
    CHECK(seen[i] == want);
  }
  auto [code, metrics] = get_path(g.port(), "/metrics");
  CHECK(metrics.find("walgate_snapshots_total 100") != std::string::npos);
  CHECK(metrics.find("walgate_snapshots_running 0") != std::string::npos);
}

TEST_CASE("over the snapshot queue: 503 with Retry-After; a client gone while queued or during its snapshot frees its place") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE snap_big(id int PRIMARY KEY, pad text);"
         "INSERT INTO snap_big SELECT g, repeat('x', 100) FROM generate_series(1, 100000) g;"
         "CREATE PUBLICATION snap_big_pub FOR TABLE snap_big");
  server_options so;
  so.snapshot.max_running = 1;
  so.snapshot.max_queued = 1;
  so.snapshot.client_bytes = 64 << 10;
  running_gateway g("snap_big_slot", "snap_big_pub", so);
  auto running = [&] {
    return get_path(g.port(), "/metrics").second.find("walgate_snapshots_running 1") != std::string::npos;
  };
  {
    // Reads one row and stops reading: its snapshot holds the only slot (the copy waits for it).
    auto stalled = std::make_unique<stream_client>(g.port(), "/v1/stream?snapshot=true");
    REQUIRE(stalled->status() == 200);
    REQUIRE(stalled->events(1).size() == 1);
    REQUIRE(running());
    // One waits in the queue (its response has not begun)...
    asio::io_context cio;
    tcp::socket waiting(cio);
    waiting.connect({asio::ip::make_address("127.0.0.1"), g.port()});
    asio::write(waiting, asio::buffer(std::string("GET /v1/stream?snapshot=true HTTP/1.1\r\nHost: localhost\r\n\r\n")));
    auto metric = [&](const std::string& line) {
      return get_path(g.port(), "/metrics").second.find(line) != std::string::npos;
    };
    REQUIRE(test::wait_until([&] { return metric("walgate_snapshots_queued 1"); }));
    // ...so one more is refused.
    stream_client refused(g.port(), "/v1/stream?snapshot=true");
    CHECK(refused.status() == 503);
    CHECK(refused.header("Retry-After") == "5");
    CHECK(get_path(g.port(), "/metrics").second.find("walgate_snapshots_rejected_total 1") != std::string::npos);
    // The queued one hangs up: its place goes at once, and it is never taken.
    waiting.close();
    CHECK(test::wait_until([&] { return metric("walgate_snapshots_queued 0"); }));
    // Cut off in the middle of its rows: its snapshot ends, and so does its transaction.
    stalled.reset();
  }
  REQUIRE(test::wait_until([&] { return !running(); }, std::chrono::seconds(40)));
  REQUIRE(test::wait_until([&] {
    return pg.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'walgate snapshot'")[0][0] == "0";
  }));
  // Asking again starts it again, whole.
  stream_client again(g.port(), "/v1/stream?snapshot=true");
  REQUIRE(again.status() == 200);
  auto lines = until_marker(again);
  REQUIRE(lines.size() == 100'001);
  CHECK(json::parse(lines.back()).at("rows") == 100'000);
}

TEST_CASE("a snapshot of a million rows: each once, then the marker") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE snap_million(id int PRIMARY KEY, amount numeric(10,2), note text, at timestamptz);"
         "INSERT INTO snap_million SELECT g, g / 100.0, 'row ' || g, '2026-01-01'::timestamptz + g * interval '1 s' "
         "FROM generate_series(1, 1000000) g;"
         "CREATE PUBLICATION snap_million_pub FOR TABLE snap_million");
  running_gateway g("snap_million_slot", "snap_million_pub");
  stream_client c(g.port(), "/v1/stream?snapshot=true&format=waltail");
  REQUIRE(c.status() == 200);
  std::vector<bool> seen(1'000'001);
  std::size_t rows = 0, twice = 0;
  std::string marker;
  auto started = std::chrono::steady_clock::now();
  while (true) {
    auto l = c.events(1);
    REQUIRE(l.size() == 1);
    if (l[0].rfind("{\"snapshot\"", 0) == 0) {
      marker = l[0];
      break;
    }
    // {"op":"read","table":"public.snap_million","data":{"id":N,...
    auto p = l[0].find("\"data\":{\"id\":");
    REQUIRE(p != std::string::npos);
    long id = std::strtol(l[0].c_str() + p + 13, nullptr, 10);
    REQUIRE((id >= 1 && id <= 1'000'000));
    if (seen[static_cast<std::size_t>(id)]) ++twice;
    seen[static_cast<std::size_t>(id)] = true;
    ++rows;
  }
  MESSAGE("1,000,000 rows in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s");
  CHECK(rows == 1'000'000);
  CHECK(twice == 0);
  CHECK(json::parse(marker).at("rows") == 1'000'000);
}
