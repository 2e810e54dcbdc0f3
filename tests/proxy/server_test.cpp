// End to end: a real PostgreSQL, the gateway in-process, and clients over real sockets —
// NDJSON, Server-Sent Events and WebSocket in every format, filters, resume, slow clients, bad
// requests and shutdown.
#include "walgate/protocol/crc32c.hpp"
#include "walgate/protocol/cursor.hpp"
#include "walgate/proxy/gateway.hpp"
#include "walgate/proxy/server.hpp"

#include "gateway_harness.hpp"
#include "temp_dir.hpp"
#include "test_cluster.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <future>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

using namespace walgate;
using namespace walgate::test::harness;   // (walgate::proxy, and the asio, beast, http, websocket, json, tcp names)

namespace {
void setup_tables(const std::string& prefix) {
  test::cluster().sql("CREATE TABLE " + prefix + "_items(id int PRIMARY KEY, name text, price numeric(8,2)); "
                      "CREATE TABLE " + prefix + "_other(id int PRIMARY KEY); "
                      "CREATE PUBLICATION " + prefix + "_pub FOR TABLE " + prefix + "_items, " + prefix + "_other");
}

}  // namespace

TEST_CASE("every transport in every format: changes arrive complete and in order") {
  setup_tables("e2e");
  running_gateway g("e2e_slot", "e2e_pub");
  const char* formats[] = {"native", "debezium", "pgoutput2json", "waltail", "wal2json"};
  std::vector<std::unique_ptr<stream_client>> ndjson, sse;
  std::vector<std::unique_ptr<ws_client>> ws;
  for (const char* f : formats) {
    ndjson.push_back(std::make_unique<stream_client>(g.port(), std::string("/v1/stream?transactions=false&format=") + f));
    CHECK(ndjson.back()->status() == 200);
    CHECK(ndjson.back()->header("Content-Type") == "application/x-ndjson");
    sse.push_back(std::make_unique<stream_client>(g.port(), std::string("/v1/stream?transactions=false&format=") + f,
                                                  std::vector<std::pair<std::string, std::string>>{{"Accept", "text/event-stream"}}));
    CHECK(sse.back()->header("Content-Type") == "text/event-stream");
    ws.push_back(std::make_unique<ws_client>(g.port(), std::string("/v1/ws?transactions=false&format=") + f, f[0] == 'w'));
  }
  auto& pg = test::cluster();
  pg.sql("INSERT INTO e2e_items VALUES (1, 'one', 1.50), (2, 'two \"quoted\"', 2.25)");
  pg.sql("UPDATE e2e_items SET name = 'uno' WHERE id = 1");
  pg.sql("DELETE FROM e2e_items WHERE id = 2");
  for (std::size_t i = 0; i < 5; ++i) {
    INFO("format " << formats[i]);
    auto a = ndjson[i]->events(4);
    auto b = sse[i]->sse(4);
    auto c = ws[i]->messages(4);
    REQUIRE(a.size() == 4);
    REQUIRE(b.size() == 4);
    REQUIRE(c.size() == 4);
    for (std::size_t k = 0; k < 4; ++k) {
      CHECK(a[k] == b[k].second);   // the same bytes on every transport
      CHECK(a[k] == c[k]);
      json::parse(a[k]);            // throws if not JSON
    }
    // SSE ids are event ids, increasing.
    auto first = transform::event_id::parse(b[0].first), last = transform::event_id::parse(b[3].first);
    REQUIRE((first && last));
    CHECK(*first < *last);
    if (std::string(formats[i]) == "native") {
      CHECK(json::parse(a[0]).at("op") == "insert");
      CHECK(json::parse(a[1]).at("after").at("name") == "two \"quoted\"");
      CHECK(json::parse(a[2]).at("op") == "update");
      CHECK(json::parse(a[3]).at("op") == "delete");
      CHECK(json::parse(a[3]).at("before").at("id") == 2);
      CHECK(b[1].first == id_of(a[1]));
    }
  }
  auto [code, metrics] = get_path(g.port(), "/metrics");
  CHECK(code == 200);
  CHECK(metrics.find("walgate_clients{transport=\"websocket\"} 5") != std::string::npos);
  CHECK(metrics.find("walgate_events_in_total 4") != std::string::npos);
  // Every client has taken every event: none is behind by more than the last commit's frame.
  for (std::size_t at = metrics.find("walgate_client_lag_bytes{"); at != std::string::npos;
       at = metrics.find("walgate_client_lag_bytes{", at + 1)) {
    auto line = metrics.substr(at, metrics.find('\n', at) - at);
    INFO(line);
    CHECK(std::stoul(line.substr(line.rfind(' ') + 1)) <= 25);
  }
  CHECK(metrics.find("walgate_client_lag_bytes{client=\"14\"") != std::string::npos);   // 15 clients
  CHECK(get_path(g.port(), "/readyz").first == 200);
  CHECK(get_path(g.port(), "/healthz").first == 200);
  auto page = get_path(g.port(), "/");
  CHECK(page.first == 200);
  CHECK(page.second.find("EventSource('/v1/stream") != std::string::npos);
}

TEST_CASE("tables= in SQL's quoted form: names with spaces, quotes, dots, commas and case, on every format") {
  auto& pg = test::cluster();
  pg.sql(R"(CREATE SCHEMA "My Schema"; CREATE SCHEMA "q""s";
            CREATE TABLE "My Schema"."Order Items"(id int PRIMARY KEY, note text);
            CREATE TABLE "My Schema"."order items"(id int PRIMARY KEY);
            CREATE TABLE "q""s"."*"(id int PRIMARY KEY);
            CREATE TABLE "q""s"."a.b,c"(id int PRIMARY KEY);
            CREATE PUBLICATION quoted_pub FOR TABLE "My Schema"."Order Items", "My Schema"."order items",
                                                    "q""s"."*", "q""s"."a.b,c")");
  running_gateway g("quoted_slot", "quoted_pub");
  // "My Schema"."Order Items" and "q""s"."*" (a table named *), percent-encoded in the URL.
  const std::string filter = "tables=%22My%20Schema%22.%22Order%20Items%22,%22q%22%22s%22.%22*%22";
  const char* formats[] = {"native", "debezium", "pgoutput2json", "waltail", "wal2json"};
  std::vector<std::unique_ptr<stream_client>> clients;
  for (const char* f : formats) {
    clients.push_back(std::make_unique<stream_client>(g.port(), std::string("/v1/stream?transactions=false&format=") + f + "&" + filter));
    REQUIRE(clients.back()->status() == 200);
  }
  stream_client sse(g.port(), "/v1/stream?" + filter, {{"Accept", "text/event-stream"}});
  REQUIRE(sse.status() == 200);
  pg.sql(R"(INSERT INTO "My Schema"."order items" VALUES (1); INSERT INTO "q""s"."a.b,c" VALUES (2);
            INSERT INTO "My Schema"."Order Items" VALUES (3, 'x'); INSERT INTO "q""s"."*" VALUES (4);)");
  for (std::size_t i = 0; i < 5; ++i) {
    INFO("format " << formats[i]);
    auto lines = clients[i]->events(2);
    REQUIRE(lines.size() == 2);
    // Only the two tables asked for, each named as stored.
    CHECK(lines[0].find("Order Items") != std::string::npos);
    CHECK(lines[0].find("\"id\"") != std::string::npos);
    CHECK(lines[1].find("q\\\"s") != std::string::npos);   // q"s, JSON-escaped
    for (const auto& l : lines) {
      CHECK(l.find("order items") == std::string::npos);
      CHECK(l.find("a.b,c") == std::string::npos);
    }
    if (std::string(formats[i]) == "native") {
      auto a = json::parse(lines[0]), b = json::parse(lines[1]);
      CHECK(a.at("schema") == "My Schema");
      CHECK(a.at("table") == "Order Items");
      CHECK(b.at("schema") == "q\"s");
      CHECK(b.at("table") == "*");
    }
  }
  auto events = sse.sse(2);
  REQUIRE(events.size() == 2);
  CHECK(json::parse(events[1].second).at("after").at("id") == 4);
  // Unquoted, such a name is refused with the way to write it.
  auto [code, body] = get_path(g.port(), "/v1/stream?tables=My%20Schema.Order%20Items");
  CHECK(code == 400);
  CHECK(body.find("names may be quoted") != std::string::npos);
}

TEST_CASE("behind the stream, clients are woken at most every 20 ms, not at each commit; every event still arrives") {
  setup_tables("bhd");
  running_gateway g("bhd_slot", "bhd_pub");
  auto& pg = test::cluster();
  auto metric = [&](const std::string& name) { return metric_of(g.port(), name); };
  auto probe = [&](std::size_t backlog) {   // (set on the loop, which reads it)
    std::promise<void> done;
    asio::post(g.io, [&] {
      g.gw->set_backlog_probe([backlog] { return backlog; });
      done.set_value();
    });
    done.get_future().wait();
  };
  stream_client c(g.port(), "/v1/stream?tables=public.bhd_items");
  REQUIRE(c.status() == 200);
  // As if a megabyte of the stream were waiting to be read at every commit.
  probe(std::size_t(1) << 20);
  const auto deferred0 = metric("walgate_wakes_deferred_total");
  std::string sql;
  // 300 one-row transactions back to back (commits well under a millisecond apart, in reads of
  // their own or a few together), then 20 of 2,000 rows (about 600 KB each: each commit in a read
  // of its own, a few milliseconds after the one before).
  for (int i = 1; i <= 300; ++i) sql += "BEGIN; INSERT INTO bhd_items VALUES (" + std::to_string(100000 + i) + ", 'x', 1); COMMIT;";
  for (int t = 0; t < 20; ++t)
    sql += "BEGIN; INSERT INTO bhd_items SELECT g, repeat('x', 200), 1 FROM generate_series(" + std::to_string(t * 2000 + 1) +
           ", " + std::to_string(t * 2000 + 2000) + ") g; COMMIT;";
  pg.sql(sql);
  auto events = c.events(40300);
  REQUIRE(events.size() == 40300);
  CHECK(events.back().find("\"id\":40000") != std::string::npos);
  const auto deferred = metric("walgate_wakes_deferred_total") - deferred0;
  MESSAGE(deferred << " of 320 commits' wake-ups deferred");
  CHECK(deferred > 0);
  // Not behind: a wake-up at each commit again.
  probe(0);
  const auto deferred1 = metric("walgate_wakes_deferred_total");
  pg.sql("BEGIN; INSERT INTO bhd_items VALUES (40001, 'x', 1); COMMIT; BEGIN; INSERT INTO bhd_items VALUES (40002, 'x', 1); COMMIT");
  events = c.events(2);
  REQUIRE(events.size() == 2);
  CHECK(events.back().find("\"id\":40002") != std::string::npos);
  CHECK(metric("walgate_wakes_deferred_total") == deferred1);
}

TEST_CASE("a filtered client resuming behind thousands of events it does not take gets its event without waiting") {
  setup_tables("pas");
  running_gateway g("pas_slot", "pas_pub");
  auto& pg = test::cluster();
  pg.sql("INSERT INTO pas_items SELECT g, 'n', 1 FROM generate_series(1, 3000) g");
  pg.sql("INSERT INTO pas_other VALUES (1)");
  REQUIRE(test::wait_until([&] {
    return get_path(g.port(), "/metrics").second.find("walgate_events_in_total 3001\n") != std::string::npos;
  }));
  // Nothing else happens: no notification comes to wake it. Before, each read of 512 events
  // without a match was an empty batch, and the client waited for the 15 s keep-alive.
  for (const char* transport : {"ndjson", "sse"}) {
    INFO(transport);
    std::vector<std::pair<std::string, std::string>> headers;
    if (std::string(transport) == "sse") headers.emplace_back("Accept", "text/event-stream");
    stream_client c(g.port(), "/v1/stream?tables=public.pas_other&from=0/0:0", headers);
    // The first line after the stream's start is the event, not a keep-alive.
    const bool sse = std::string(transport) == "sse";
    auto lines = c.lines(sse ? 4 : 1);   // (SSE: "retry: …", "", "id: …", "data: …")
    REQUIRE(lines.size() == (sse ? 4u : 1u));
    CHECK(lines[sse ? 2 : 0].rfind(sse ? "id: " : "{", 0) == 0);
    CHECK(lines.back().find("pas_other") != std::string::npos);
  }
  ws_client w(g.port(), "/v1/ws?tables=public.pas_other&from=0/0:0", false);
  auto m = w.messages(1);
  REQUIRE(m.size() == 1);
  CHECK(m[0].find("pas_other") != std::string::npos);
}

TEST_CASE("a client far behind reaches values of megabytes on disk: read off the event loop, delivered whole") {
  setup_tables("bgr");
  log_options lo;
  // The first large values leave memory before the client comes (8 MiB: none is larger than
  // half of it, so none lingers).
  lo.memory_bytes = 8u << 20;
  running_gateway g("bgr_slot", "bgr_pub", {}, lo);
  auto& pg = test::cluster();
  for (int i = 1; i <= 6; ++i)
    pg.sql("INSERT INTO bgr_items VALUES (" + std::to_string(i) + ", repeat('v', 3000000), 1)");
  pg.sql("INSERT INTO bgr_other VALUES (1)");
  REQUIRE(test::wait_until([&] {
    return get_path(g.port(), "/metrics").second.find("walgate_events_in_total 7\n") != std::string::npos;
  }));
  // NDJSON and WebSocket from the start: every value whole, in order, then the last row.
  stream_client c(g.port(), "/v1/stream?from=0/0:0");
  auto lines = c.events(7);
  REQUIRE(lines.size() == 7);
  for (int i = 0; i < 6; ++i) {
    auto v = json::parse(lines[i]);
    CHECK(v.at("after").at("id") == i + 1);
    CHECK(v.at("after").at("name").as_string().size() == 3000000);
  }
  CHECK(json::parse(lines[6]).at("table") == "bgr_other");
  ws_client w(g.port(), "/v1/ws?format=wal2json&transactions=false&from=0/0:0", false);
  auto m = w.messages(7);
  REQUIRE(m.size() == 7);
  CHECK(m[5].size() > 3000000);
  CHECK(m[6].find("bgr_other") != std::string::npos);
  // They were read on the log's reader thread, not on the event loop.
  auto metrics = get_path(g.port(), "/metrics").second;
  const std::string name = "\nwalgate_log_background_reads_total ";
  auto at = metrics.find(name);
  REQUIRE(at != std::string::npos);
  CHECK(std::stoul(metrics.substr(at + name.size())) >= 2);
  // That thread runs below the event loop's priority (5 more nice than the process, unless
  // that is past 19); the others as the process.
  // (A thread that ended meanwhile has no stat to read: not counted.)
  auto nice_of = [](const std::filesystem::path& task) -> std::optional<int> {
    std::ifstream in(task / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = stat.rfind(')');
    if (close == std::string::npos || close + 2 > stat.size()) return std::nullopt;
    std::istringstream fields(stat.substr(close + 2));   // from field 3 (state) on
    std::string v;
    int i = 3;
    for (; i <= 19 && fields >> v; ++i) {
    }
    if (i != 20) return std::nullopt;
    return std::atoi(v.c_str());
  };
  const auto self = nice_of("/proc/self");
  REQUIRE(self);
  const int base = *self;
  int lower = 0, threads = 0;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    const auto n = nice_of(t.path());
    threads += n.has_value();
    lower += n == std::min(base + 5, 19);
  }
  CHECK(threads > 2);
  CHECK(lower == (base >= 19 ? threads : 1));   // (at 19 already, every thread is)
}

TEST_CASE("table and op filters; resume by from and Last-Event-ID with no gap and no duplicate") {
  setup_tables("flt");
  running_gateway g("flt_slot", "flt_pub");
  stream_client other(g.port(), "/v1/stream?tables=public.flt_other");
  stream_client deletes(g.port(), "/v1/stream?ops=delete&tables=public.*");
  stream_client all(g.port(), "/v1/stream");
  auto& pg = test::cluster();
  for (int i = 1; i <= 10; ++i) pg.sql("INSERT INTO flt_items VALUES (" + std::to_string(i) + ", 'x', 1)");
  pg.sql("INSERT INTO flt_other VALUES (1), (2)");
  pg.sql("DELETE FROM flt_items WHERE id <= 3");
  auto o = other.events(2);
  REQUIRE(o.size() == 2);
  for (const auto& e : o) CHECK(json::parse(e).at("table") == "flt_other");
  auto d = deletes.events(3);
  REQUIRE(d.size() == 3);
  for (const auto& e : d) CHECK(json::parse(e).at("op") == "delete");
  auto every = all.events(15);
  REQUIRE(every.size() == 15);

  // Resume after the 6th event: exactly events 7..15.
  std::string from = id_of(every[5]);
  stream_client resumed(g.port(), "/v1/stream?from=" + from);
  auto rest = resumed.events(9);
  REQUIRE(rest.size() == 9);
  for (std::size_t k = 0; k < 9; ++k) CHECK(rest[k] == every[6 + k]);
  // (more events may arrive later; none is required)

  // EventSource's reconnect: Last-Event-ID.
  stream_client sse(g.port(), "/v1/stream", {{"Accept", "text/event-stream"}, {"Last-Event-ID", id_of(every[11])}});
  auto tail = sse.sse(3);
  REQUIRE(tail.size() == 3);
  CHECK(tail[0].second == every[12]);
  CHECK(tail[2].second == every[14]);

  // 0/0:0 of a log that never dropped anything: the whole log.
  stream_client whole(g.port(), "/v1/stream?from=0/0:0");
  auto everything = whole.events(15);
  REQUIRE(everything.size() == 15);
  CHECK(everything[0] == every[0]);
  // An id from before where this log began (its slot's consistent point) is another log's: the
  // changes between are not here.
  auto [st, body] = get_path(g.port(), "/v1/stream?from=0/1:0");
  CHECK(st == 410);
  CHECK(body.find("is from before this event log began") != std::string::npos);

  // Both from= (an EventSource's URL, sent again unchanged) and Last-Event-ID (its reconnect):
  // the later one, Last-Event-ID, wins.
  stream_client both(g.port(), "/v1/stream?from=" + id_of(every[2]),
                     {{"Accept", "text/event-stream"}, {"Last-Event-ID", id_of(every[12])}});
  auto after = both.sse(2);
  REQUIRE(after.size() == 2);
  CHECK(after[0].second == every[13]);
  CHECK(after[1].second == every[14]);
}

TEST_CASE("non-transactional logical messages are logged and served in WAL order, and resumable") {
  if (test::cluster().server_major() < 14) {
    MESSAGE("SKIPPED on PostgreSQL " << test::cluster().server_major() << ": pgoutput sends logical messages from 14");
    return;
  }
  setup_tables("ntm");
  running_gateway g("ntm_slot", "ntm_pub");
  stream_client all(g.port(), "/v1/stream");
  stream_client messages(g.port(), "/v1/stream?ops=message");
  auto& pg = test::cluster();
  pg.sql("INSERT INTO ntm_items VALUES (1, 'a', 1)");
  std::string lsn = *pg.sql("SELECT pg_logical_emit_message(false, 'walgate-test', 'hello')")[0][0];
  pg.sql("INSERT INTO ntm_items VALUES (2, 'b', 2)");
  auto every = all.events(3);
  REQUIRE(every.size() == 3);
  auto m = json::parse(every[1]).as_object();
  CHECK(m.at("op") == "message");
  CHECK(m.at("transactional") == false);
  CHECK(m.at("prefix") == "walgate-test");
  CHECK(m.at("content") == "hello");
  // Its id is one less than its own LSN (the LSN is where its record ends, which may be the
  // next transaction's commit LSN), index 0, between the transactions around it; native's lsn
  // is the LSN pg_logical_emit_message returned.
  CHECK(std::string(m.at("lsn").as_string()) == lsn);
  CHECK(std::string(m.at("id").as_string()) == protocol::lsn{protocol::lsn::parse(lsn)->value - 1}.to_string() + ":0");
  auto id = [](const std::string& e) { return *transform::event_id::parse(id_of(e)); };
  CHECK(id(every[0]) < id(every[1]));
  CHECK(id(every[1]) < id(every[2]));
  auto only = messages.events(1);
  REQUIRE(only.size() == 1);
  CHECK(only[0] == every[1]);
  // Resume after it: the next transaction, nothing twice.
  stream_client resumed(g.port(), "/v1/stream?from=" + id_of(every[1]));
  auto rest = resumed.events(1);
  REQUIRE(rest.size() == 1);
  CHECK(rest[0] == every[2]);
  // Resume before it: it comes again, with the same bytes.
  stream_client again(g.port(), "/v1/stream?from=" + id_of(every[0]));
  auto two = again.events(2);
  REQUIRE(two.size() == 2);
  CHECK(two[0] == every[1]);
}

TEST_CASE("an event log that cannot be read ends the stream with the reason and where to resume") {
  setup_tables("dmg");
  log_options lo;
  lo.memory_bytes = 1;   // clients read these events from the file
  running_gateway g("dmg_slot", "dmg_pub", {}, lo);
  stream_client live(g.port(), "/v1/stream");
  auto& pg = test::cluster();
  pg.sql("INSERT INTO dmg_items VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3), (4, 'd', 4)");
  pg.sql("INSERT INTO dmg_other VALUES (1)");
  auto every = live.events(5);
  REQUIRE(every.size() == 5);

  // The segment's frames (Byte1 type | Int32 length | payload | Int32 CRC-32C), once all are written.
  auto segment = g.dir / "segment-00000000000000000000.log";
  struct frame_at {
    char type;
    std::size_t offset;
    std::uint32_t len;
  };
  auto read_file = [&] {
    std::ifstream in(segment, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  std::vector<frame_at> events;
  for (int i = 0; i < 500 && events.size() < 5; ++i) {
    events.clear();
    std::string data = read_file();
    protocol::cursor c(data);
    while (!c.empty()) {
      std::size_t at = c.offset();
      char type = static_cast<char>(c.u8());
      std::uint32_t len = c.u32();
      c.bytes(len);
      c.u32();
      if (!c.ok()) break;
      if (type == 'E') events.push_back({type, at, len});
    }
    if (events.size() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(events.size() == 5);
  auto rewrite = [&](std::size_t at, char value, bool fix_checksum, const frame_at& f) {
    std::string data = read_file();
    data[at] = value;
    if (fix_checksum) {
      std::string sum;
      protocol::writer(sum).u32(protocol::crc32c(std::string_view(data).substr(f.offset, 5 + f.len)));
      data.replace(f.offset + 5 + f.len, 4, sum);
    }
    std::ofstream(segment, std::ios::binary | std::ios::trunc) << data;
  };
  // Event 1: a record of an unknown version under a checksum that matches (it passes the
  // file's check, not the record reader). Event 3: a byte flipped (the checksum fails).
  rewrite(events[1].offset + 5 + 8, 99, true, events[1]);
  rewrite(events[3].offset + 5 + 12, static_cast<char>(read_file()[events[3].offset + 5 + 12] ^ 1), false, events[3]);

  auto last_line = [](const std::string& line) { return json::parse(line).as_object(); };
  stream_client a(g.port(), "/v1/stream?from=0/0:0");
  auto la = a.lines(2);
  REQUIRE(la.size() == 2);
  CHECK(la[0] == every[0]);
  auto ea = last_line(la[1]);
  CHECK(std::string(ea.at("error").as_string()).find("event #1 in the event log cannot be read") == 0);
  CHECK(ea.at("resume_from") == id_of(every[0]).c_str());

  stream_client b(g.port(), "/v1/stream?from=" + id_of(every[1]));
  auto lb = b.lines(2);
  REQUIRE(lb.size() == 2);
  CHECK(lb[0] == every[2]);
  auto eb = last_line(lb[1]);
  CHECK(eb.at("error") == ("event log segment-00000000000000000000.log damaged at offset " +
                           std::to_string(events[3].offset) + " (checksum)")
                              .c_str());
  CHECK(eb.at("resume_from") == id_of(every[2]).c_str());

  ws_client w(g.port(), "/v1/ws?from=" + id_of(every[1]));
  auto wm = w.messages(1);
  REQUIRE(wm.size() == 1);
  CHECK(wm[0] == every[2]);
  auto why = w.wait_close();
  CHECK(std::string(why.reason.data(), why.reason.size()).find("damaged at offset") != std::string::npos);
  CHECK(std::string(why.reason.data(), why.reason.size()).find("resume from " + id_of(every[2])) != std::string::npos);
}

TEST_CASE("an event log that cannot be written stops the stream; a restart delivers every change once") {
  setup_tables("full");
  std::string t = (std::filesystem::temp_directory_path() / "walgate-full-XXXXXX").string();
  std::filesystem::path dir = mkdtemp(t.data());
  log_options lo;
  lo.dir = dir;
  {
    running_gateway g("full_slot", "full_pub", {}, lo);
    // This process's files may grow to 48 KiB, as if the disk filled up: a write of the
    // segment fails part-way (EFBIG), leaving a torn frame at its end.
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit old{};
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
    rlimit small = old;
    small.rlim_cur = 48 * 1024;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
    for (int k = 0; k < 40; ++k)
      test::cluster().sql("INSERT INTO full_items SELECT g, repeat('x', 100), 1 FROM generate_series(" +
                          std::to_string(k * 25 + 1) + ", " + std::to_string(k * 25 + 25) + ") g");
    bool ended = test::wait_until([&] { return g.ended.load(); });
    REQUIRE(setrlimit(RLIMIT_FSIZE, &old) == 0);
    REQUIRE(ended);
    INFO(g.end_message << " / " << g.gw->failure());
    CHECK(g.end_message.find("stream consumer failed") != std::string::npos);
    CHECK(g.gw->failure().find("cannot write the event log: File too large") != std::string::npos);
  }
  {  // Restarted on the same log and slot: nothing was acknowledged past what the log held.
    running_gateway g("full_slot", "full_pub", {}, lo);
    stream_client c(g.port(), "/v1/stream?from=0/0:0");
    auto events = c.events(1000);
    CHECK(events.size() == 1000);
    std::set<std::string> ids;
    std::set<std::int64_t> keys;
    for (const auto& e : events) {
      ids.insert(id_of(e));
      keys.insert(json::parse(e).at("after").at("id").as_int64());
    }
    CHECK(ids.size() == events.size());
    CHECK(keys.size() == events.size());
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("only unpublished tables change, once, in bulk: the slot still moves on within seconds") {
  setup_tables("idle");
  test::cluster().sql("CREATE TABLE idle_unpublished(id int, pad text)");
  running_gateway g("idle_slot", "idle_pub");
  stream_client c(g.port(), "/v1/stream");
  test::cluster().sql("INSERT INTO idle_items VALUES (1, 'one', 1)");
  REQUIRE(c.events(1).size() == 1);
  // 100,000 rows outside the publication in one statement, then nothing at all.
  test::cluster().sql("INSERT INTO idle_unpublished SELECT g, repeat('x', 100) FROM generate_series(1, 100000) g");
  auto after = *protocol::lsn::parse(*test::cluster().sql("SELECT pg_current_wal_lsn()")[0][0]);
  auto slot_confirmed = [] {
    auto rows = test::cluster().sql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'idle_slot'");
    return *protocol::lsn::parse(*rows[0][0]);
  };
  // (The status interval here is 200 ms, the ACKED store at most once a second.)
  auto t0 = std::chrono::steady_clock::now();
  bool moved = test::wait_until([&] { return slot_confirmed() >= after; }, std::chrono::seconds(15));
  auto took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  CHECK_MESSAGE(moved, "confirmed_flush_lsn " << slot_confirmed().to_string() << ", WAL after the bulk insert "
                                              << after.to_string());
  // And the WAL the slot keeps (restart_lsn) follows: once the server has logged where decoding
  // may restart (a checkpoint logs it; otherwise the background writer does, every 15 s), the
  // slot no longer holds the bulk insert's WAL.
  test::cluster().sql("CHECKPOINT");
  auto restart_lsn = [] {
    auto rows = test::cluster().sql("SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 'idle_slot'");
    return *protocol::lsn::parse(*rows[0][0]);
  };
  auto t1 = std::chrono::steady_clock::now();
  bool released = test::wait_until([&] { return restart_lsn() >= after; }, std::chrono::seconds(15));
  auto release_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t1).count();
  CHECK_MESSAGE(released, "restart_lsn " << restart_lsn().to_string() << ", WAL after the bulk insert " << after.to_string());
  MESSAGE("PostgreSQL " << test::cluster().server_major() << ": the slot passed " << after.to_string() << " in " << took_ms
                        << " ms; restart_lsn passed it " << release_ms << " ms after a checkpoint");
  // WAL of another database of the same server (decoded, and skipped, by this slot's walsender):
  // the server reports that position too, no heartbeat is needed for it.
  test::cluster().try_sql("CREATE DATABASE idle_other");
  test::cluster().sql("CREATE TABLE IF NOT EXISTS busy(id int, pad text)", "idle_other");
  test::cluster().sql("INSERT INTO busy SELECT g, repeat('o', 100) FROM generate_series(1, 100000) g", "idle_other");
  after = *protocol::lsn::parse(*test::cluster().sql("SELECT pg_current_wal_lsn()")[0][0]);
  moved = test::wait_until([&] { return slot_confirmed() >= after; }, std::chrono::seconds(15));
  CHECK_MESSAGE(moved, "another database: confirmed_flush_lsn " << slot_confirmed().to_string() << ", WAL after its insert "
                                                                << after.to_string());
  // Again, twice in quick succession (the second keepalive comes while the first position is
  // being stored, or within the second after: it must not be dropped for good).
  for (int round = 0; round < 3; ++round) {
    test::cluster().sql("INSERT INTO idle_unpublished SELECT g, 'y' FROM generate_series(1, 2000) g");
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    test::cluster().sql("INSERT INTO idle_unpublished SELECT g, 'z' FROM generate_series(1, 2000) g");
    after = *protocol::lsn::parse(*test::cluster().sql("SELECT pg_current_wal_lsn()")[0][0]);
    moved = test::wait_until([&] { return slot_confirmed() >= after; }, std::chrono::seconds(15));
    CHECK_MESSAGE(moved, "round " << round << ": confirmed_flush_lsn " << slot_confirmed().to_string()
                                  << ", WAL after the inserts " << after.to_string());
  }
}

TEST_CASE("an idle stream's acknowledged position is stored: a restart is not taken for a slot moved on") {
  setup_tables("ack");
  test::cluster().sql("CREATE TABLE ack_unpublished(id int)");
  std::string t = (std::filesystem::temp_directory_path() / "walgate-ack-XXXXXX").string();
  std::filesystem::path dir = mkdtemp(t.data());
  log_options lo;
  lo.dir = dir;
  protocol::lsn durable;
  {
    running_gateway g("ack_slot", "ack_pub", {}, lo);
    stream_client c(g.port(), "/v1/stream");
    test::cluster().sql("INSERT INTO ack_items VALUES (1, 'one', 1)");
    REQUIRE(c.events(1).size() == 1);
    REQUIRE(test::wait_until([&] { return g.gw->durable_lsn().valid(); }));
    // WAL that is not published moves the server on: the idle stream's keepalives carry it,
    // and walgate acknowledges it — after storing it.
    auto slot_confirmed = [] {
      auto rows = test::cluster().sql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'ack_slot'");
      return *protocol::lsn::parse(*rows[0][0]);
    };
    auto logged = g.log->durable_lsn();
    bool moved = test::wait_until([&] {
      test::cluster().sql("INSERT INTO ack_unpublished VALUES (1)");
      return slot_confirmed() > logged;
    });
    REQUIRE(moved);
    durable = slot_confirmed();
  }
  // The restart finds the slot where it left it (not "acknowledged past the changes stored").
  running_gateway g("ack_slot", "ack_pub", {}, lo);
  // (Stored as the ACKED position — or, before PostgreSQL 15, which sends empty transactions
  // for unpublished changes, as logged commits.)
  CHECK(std::max(g.log->acked_lsn(), g.log->durable_lsn()) >= durable);
  stream_client c(g.port(), "/v1/stream");
  test::cluster().sql("INSERT INTO ack_items VALUES (2, 'two', 2)");
  auto e = c.events(1);
  REQUIRE(e.size() == 1);
  CHECK(json::parse(e[0]).at("after").at("id") == 2);
  std::filesystem::remove_all(dir);
}

namespace {
/// A man in the middle between walgate and PostgreSQL: passes everything through, except that
/// while `damage` is on it breaks the first pgoutput Insert of each connection from the server
/// (its column count made 65535: a message that cannot be decoded, inside an intact frame).
struct damaging_proxy {
  asio::io_context io;
  tcp::acceptor acceptor{io, {asio::ip::make_address("127.0.0.1"), 0}};
  std::uint16_t target;
  std::atomic<bool> damage{true}, stopping{false};
  std::atomic<int> damaged{0};
  std::thread accept_thread;
  std::vector<std::thread> pipes;
  std::mutex m;
  std::vector<std::shared_ptr<tcp::socket>> sockets;

  explicit damaging_proxy(std::uint16_t to) : target(to) {
    accept_thread = std::thread([this] {
      while (!stopping) {
        auto client = std::make_shared<tcp::socket>(io);
        boost::system::error_code ec;
        acceptor.accept(*client, ec);
        if (ec || stopping) break;
        auto server = std::make_shared<tcp::socket>(io);
        server->connect({asio::ip::make_address("127.0.0.1"), target}, ec);
        if (ec) continue;
        std::lock_guard<std::mutex> g(m);
        sockets.push_back(client);
        sockets.push_back(server);
        pipes.emplace_back([client, server] { copy(*client, *server); });
        pipes.emplace_back([this, client, server] { copy_damaging(*server, *client); });
      }
    });
  }
  std::uint16_t listen_port = acceptor.local_endpoint().port();
  std::uint16_t port() const { return listen_port; }
  static void copy(tcp::socket& from, tcp::socket& to) {
    char buf[16384];
    boost::system::error_code ec;
    while (true) {
      auto n = from.read_some(asio::buffer(buf), ec);
      if (ec || asio::write(to, asio::buffer(buf, n), ec) != n || ec) break;
    }
    to.shutdown(tcp::socket::shutdown_both, ec);
    from.shutdown(tcp::socket::shutdown_both, ec);
  }
  // Backend messages: Byte1 type | Int32 length | payload. A CopyData 'd' whose payload is
  // XLogData 'w' (Byte1 + 3 Int64) carrying pgoutput 'I' | Int32 relid | 'N' | Int16 columns.
  void copy_damaging(tcp::socket& from, tcp::socket& to) {
    std::string pending;
    bool done = false;   // one message per connection
    char buf[16384];
    boost::system::error_code ec;
    while (true) {
      auto n = from.read_some(asio::buffer(buf), ec);
      if (ec) break;
      pending.append(buf, n);
      std::size_t at = 0;
      while (pending.size() - at >= 5) {
        std::uint32_t len = (std::uint32_t(std::uint8_t(pending[at + 1])) << 24) | (std::uint32_t(std::uint8_t(pending[at + 2])) << 16) |
                            (std::uint32_t(std::uint8_t(pending[at + 3])) << 8) | std::uint32_t(std::uint8_t(pending[at + 4]));
        if (pending.size() - at < 1 + len) break;
        char* p = pending.data() + at + 5;   // the payload
        if (!done && damage && pending[at] == 'd' && len >= 4 + 33 && p[0] == 'w' && p[25] == 'I' && p[30] == 'N') {
          p[31] = p[32] = static_cast<char>(0xff);
          done = true;
          ++damaged;
        }
        at += 1 + len;
      }
      if (asio::write(to, asio::buffer(pending.data(), at), ec) != at || ec) break;
      pending.erase(0, at);
    }
    to.shutdown(tcp::socket::shutdown_both, ec);
    from.shutdown(tcp::socket::shutdown_both, ec);
  }
  ~damaging_proxy() {
    stopping = true;
    boost::system::error_code ec;
    acceptor.close(ec);
    {
      asio::io_context wake;
      tcp::socket s(wake);
      s.connect({asio::ip::make_address("127.0.0.1"), port()}, ec);
    }
    accept_thread.join();
    {
      std::lock_guard<std::mutex> g(m);
      for (auto& s : sockets) s->shutdown(tcp::socket::shutdown_both, ec);
    }
    for (auto& t : pipes) t.join();
  }
};

std::uint64_t metric_value(std::uint16_t port, const std::string& name) {
  auto [st, body] = get_path(port, "/metrics");
  auto at = body.find("\n" + name + " ");
  if (st != 200 || at == std::string::npos) return ~0ull;
  return std::stoull(body.substr(at + name.size() + 2));
}
}  // namespace

TEST_CASE("a pgoutput message that cannot be decoded: nothing skipped, /readyz says why, retried with backoff, no exit") {
  setup_tables("mitm");
  damaging_proxy mitm(test::cluster().port());
  running_gateway g("mitm_slot", "mitm_pub", {}, {},
                    "host=127.0.0.1 port=" + std::to_string(mitm.port()) + " user=postgres dbname=postgres sslmode=disable");
  stream_client c(g.port(), "/v1/stream?from=0/0:0");
  for (int i = 1; i <= 5; ++i) test::cluster().sql("INSERT INTO mitm_items VALUES (" + std::to_string(i) + ", 'r', 1)");
  // Every connection damaged: the stream is stuck on that message, and says so; the retries back off.
  REQUIRE(test::wait_until([&] { return mitm.damaged >= 1; }));
  REQUIRE(test::wait_until([&] { return get_path(g.port(), "/readyz").first == 503; }));
  auto [st, body] = get_path(g.port(), "/readyz");
  CHECK(st == 503);
  CHECK(body.find("\"status\":\"stream fault\"") != std::string::npos);
  CHECK(body.find("cannot take the pgoutput message at") != std::string::npos);
  std::this_thread::sleep_for(std::chrono::seconds(5));
  const auto failures = metric_value(g.port(), "walgate_stream_decode_failures_total");
  CHECK(failures >= 2);
  CHECK(failures <= 8);   // 5 s with a backoff that keeps growing: never a hot loop
  CHECK(metric_value(g.port(), "walgate_stream_fault") == 1);
  CHECK_FALSE(g.ended);   // still serving
  CHECK(get_path(g.port(), "/healthz").first == 200);
  CHECK(g.log->visible_seq() == 0);   // nothing past the damaged message logged, nothing skipped
  // The damage stops (the next connection is clean): every row arrives, once, in order.
  mitm.damage = false;
  auto rows = c.events(5);
  REQUIRE(rows.size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(json::parse(rows[static_cast<std::size_t>(i)]).at("after").at("id") == i + 1);
  CHECK(test::wait_until([&] { return get_path(g.port(), "/readyz").first == 200; }));
  CHECK(metric_value(g.port(), "walgate_stream_fault") == 0);
  CHECK_FALSE(g.ended);
}

TEST_CASE("a new event log does not take ids from an old one: the data directory replaced, the slot made again") {
  setup_tables("lost");
  auto& pg = test::cluster();
  std::string last;
  {
    running_gateway g("lost_slot", "lost_pub");
    stream_client c(g.port(), "/v1/stream");
    for (int i = 1; i <= 10; ++i) pg.sql("INSERT INTO lost_items VALUES (" + std::to_string(i) + ", 'a', 1)");
    auto got = c.events(10);
    REQUIRE(got.size() == 10);
    last = id_of(got.back());
  }
  // The disk is lost: the old log is gone (running_gateway removed its directory, and dropped
  // the slot with it); changes happen meanwhile, and walgate starts over with an empty log and a
  // new slot.
  CHECK(pg.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'lost_slot'")[0][0] == "0");
  for (int i = 11; i <= 20; ++i) pg.sql("INSERT INTO lost_items VALUES (" + std::to_string(i) + ", 'gap', 1)");
  running_gateway g("lost_slot", "lost_pub");
  for (int i = 21; i <= 30; ++i) pg.sql("INSERT INTO lost_items VALUES (" + std::to_string(i) + ", 'b', 1)");
  REQUIRE(test::wait_until([&] { return g.log->visible_seq() == 10; }));
  auto [st, body] = get_path(g.port(), "/v1/stream?from=" + last);
  CHECK(st == 410);   // not the 10 later rows with the 10 in between silently missing
  CHECK(body.find("is from before this event log began") != std::string::npos);
  CHECK(body.find("take a new snapshot") != std::string::npos);
  // This log's own ids and 0/0:0 still resume.
  stream_client whole(g.port(), "/v1/stream?from=0/0:0");
  auto rows = whole.events(10);
  REQUIRE(rows.size() == 10);
  CHECK(json::parse(rows[0]).at("after").at("id") == 21);
  stream_client after_first(g.port(), "/v1/stream?from=" + id_of(rows[0]));
  auto rest = after_first.events(9);
  REQUIRE(rest.size() == 9);
  CHECK(rest[0] == rows[1]);
}

TEST_CASE("a resume position older than the retained log is 410 Gone") {
  setup_tables("ret");
  log_options lo;
  lo.segment_bytes = 4096;
  lo.retention_bytes = 16384;
  lo.memory_bytes = 8192;
  running_gateway g("ret_slot", "ret_pub", {}, lo);
  stream_client c(g.port(), "/v1/stream");
  std::vector<std::string> all;
  for (int t = 0; t < 20; ++t) {
    test::cluster().sql("INSERT INTO ret_items SELECT g, repeat('x', 200), 1 FROM generate_series(" +
                        std::to_string(t * 10 + 1) + ", " + std::to_string(t * 10 + 10) + ") g");
    auto batch = c.events(10);   // a client that keeps up is never cut off by retention
    all.insert(all.end(), batch.begin(), batch.end());
  }
  REQUIRE(all.size() == 200);
  auto gone = get_path(g.port(), "/v1/stream?from=" + id_of(all[0]));
  CHECK(gone.first == 410);
  CHECK(gone.second.find("take a new snapshot") != std::string::npos);
  stream_client recent(g.port(), "/v1/stream?from=" + id_of(all[197]));
  auto rest = recent.events(2);
  REQUIRE(rest.size() == 2);
  CHECK(rest[1] == all[199]);
}

namespace {
/// A TCP connection to the gateway from a loopback address of choice (127.0.0.x).
int socket_from(std::uint16_t port, const char* from) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  REQUIRE(::inet_pton(AF_INET, from, &local.sin_addr) == 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) == 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}
/// True once the peer has closed fd (within ms).
bool closed_by_peer(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, ms) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}
}  // namespace

TEST_CASE("idle connections never keep others out: an address's waiting connections give way to its new one, and all to anyone's") {
  setup_tables("idlc");
  server_options so;
  so.max_clients = 100;
  so.max_other_connections = 10;
  so.max_connections_per_address = 3;
  so.header_timeout = std::chrono::milliseconds(60'000);   // (idle ones would otherwise go by themselves)
  running_gateway g("idlc_slot", "idlc_pub", so);
  // One address opens connections and sends nothing (idle keep-alives, tricklers): a burst of 8,
  // past its 3. A burst is let in (none of its own has waited a second yet). (Before, such
  // connections held their places until --max-clients + 256 were open and accepting stopped.)
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(socket_from(g.port(), "127.0.0.2"));
  for (int fd : idle) CHECK_FALSE(closed_by_peer(fd, 20));
  // Once they have waited a second, each newcomer of that address takes its oldest one's place.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  idle.push_back(socket_from(g.port(), "127.0.0.2"));
  CHECK(closed_by_peer(idle[0], 5000));
  CHECK_FALSE(closed_by_peer(idle[1], 50));
  idle.push_back(socket_from(g.port(), "127.0.0.2"));
  CHECK(closed_by_peer(idle[1], 5000));
  CHECK_FALSE(closed_by_peer(idle[2], 50));
  // Others come in beside them; at 10 in all, a newcomer takes the oldest waiting place of any.
  std::vector<int> others;
  for (const char* a : {"127.0.0.3", "127.0.0.4"}) others.push_back(socket_from(g.port(), a));
  CHECK_FALSE(closed_by_peer(idle[2], 50));
  others.push_back(socket_from(g.port(), "127.0.0.5"));
  CHECK(closed_by_peer(idle[2], 5000));
  // Requests still get answers, streams too, however many idle connections were opened.
  CHECK(get_path(g.port(), "/healthz").first == 200);
  stream_client c(g.port(), "/v1/stream");
  CHECK(c.status() == 200);
  const auto metrics = get_path(g.port(), "/metrics").second;
  const auto at = metrics.find("\nwalgate_connections_replaced_total ");
  REQUIRE(at != std::string::npos);
  CHECK(std::stoll(metrics.substr(at + 36)) >= 3);
  // An address whose own are all new (none has waited a second) and as many as all may hold: 429.
  std::vector<int> burst;
  for (int i = 0; i < 10; ++i) burst.push_back(socket_from(g.port(), "127.0.0.7"));
  const int refused = socket_from(g.port(), "127.0.0.7");
  pollfd p{refused, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  char buf[512];
  const ssize_t n = ::recv(refused, buf, sizeof buf, 0);
  REQUIRE(n > 0);
  const std::string answer(buf, static_cast<std::size_t>(n));
  CHECK_MESSAGE(answer.rfind("HTTP/1.1 429 Too Many Requests\r\n", 0) == 0, answer);
  CHECK_MESSAGE(answer.find("for one address, --max-other-connections") != std::string::npos, answer);
  ::close(refused);
  for (int fd : burst) ::close(fd);
  for (int fd : idle) ::close(fd);
  for (int fd : others) ::close(fd);
}

TEST_CASE("snapshot churn is rate-limited: per /v1/mux connection, per address, over /v1/stream and /v1/mux") {
  setup_tables("churn");
  server_options so;
  so.snapshot.per_connection_minute = 2;
  so.snapshot.per_address_minute = 4;
  running_gateway g("churn_slot", "churn_pub", so);
  auto refusal_of = [](ws_client& mux, const std::string& sub) {
    for (int i = 0; i < 50; ++i) {
      auto next = mux.messages(1);
      if (next.empty()) break;
      if (next[0].find(R"({"sub":")" + sub + R"(","type":)") != std::string::npos &&
          next[0].find(R"("type":"end")") == std::string::npos)
        return next[0];
    }
    return std::string();
  };
  {  // subscribe/unsubscribe churn on one connection: its third snapshot in a minute is refused
    ws_client mux(g.port(), "/v1/mux");
    mux.ws.text(true);
    for (const char* id : {"a", "b"}) {
      mux.ws.write(asio::buffer(R"({"type":"subscribe","id":")" + std::string(id) +
                                R"(","snapshot":true,"tables":"public.churn_items"})"));
      CHECK(refusal_of(mux, id) == R"({"sub":")" + std::string(id) + R"(","type":"subscribed"})");
      mux.ws.write(asio::buffer(R"({"type":"unsubscribe","id":")" + std::string(id) + "\"}"));
    }
    mux.ws.write(asio::buffer(std::string(R"({"type":"subscribe","id":"c","snapshot":true,"tables":"public.churn_items"})")));
    const auto refused = refusal_of(mux, "c");
    CHECK_MESSAGE(refused.find(R"("status":429)") != std::string::npos, refused);
    CHECK_MESSAGE(refused.find("too many snapshots begun by this connection (limit 2 a minute, --snapshots-per-minute-per-mux)") != std::string::npos, refused);
  }
  // The address began 2 (the connection's); 2 more, then 429.
  for (int i = 0; i < 2; ++i) {
    stream_client c(g.port(), "/v1/stream?snapshot=true&tables=public.churn_items");
    CHECK(c.status() == 200);
  }
  auto [code, body] = get_path(g.port(), "/v1/stream?snapshot=true&tables=public.churn_items");
  CHECK(code == 429);
  CHECK_MESSAGE(body.find("too many snapshots begun by this address (limit 4 a minute, --snapshots-per-minute-per-address)") != std::string::npos, body);
  stream_client plain(g.port(), "/v1/stream?tables=public.churn_items");   // (streams without a snapshot: not limited)
  CHECK(plain.status() == 200);
  const auto metrics = get_path(g.port(), "/metrics").second;
  CHECK(metrics.find("walgate_snapshots_rate_limited_total 2") != std::string::npos);
}

TEST_CASE("bad requests: 400 naming the parameter, 404, 414, 431, trickled headers, WebSocket 1007 and 1009") {
  setup_tables("bad");
  server_options so;
  so.header_timeout = std::chrono::milliseconds(1000);
  so.ws_message_limit = 1024;
  running_gateway g("bad_slot", "bad_pub", so);
  struct {
    const char* target;
    const char* parameter;
  } cases[] = {{"/v1/stream?format=xml", "format"},   {"/v1/stream?tables=nodot", "tables"},
               {"/v1/stream?tables=a.b;c", "tables"}, {"/v1/stream?ops=upsert", "ops"},
               {"/v1/stream?from=12", "from"},        {"/v1/stream?tombstones=true", "tombstones"},
               {"/v1/stream?bogus=1", "bogus"},       {"/v1/ws?format=nope", "format"}};
  for (const auto& c : cases) {
    auto [code, body] = get_path(g.port(), c.target);
    INFO(c.target << " -> " << body);
    CHECK(code == 400);
    CHECK(json::parse(body).at("parameter") == c.parameter);
  }
  CHECK(get_path(g.port(), "/nope").first == 404);
  CHECK(get_path(g.port(), "/v1/ws").first == 426);   // no upgrade
  CHECK(get_path(g.port(), "/v1/stream?from=" + std::string(21000, '0')).first == 414);
  CHECK(get(g.port(), "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(25000, 'a') + "\r\n\r\n").first == 431);
  CHECK(get(g.port(), "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(60000, 'a') + "\r\n\r\n").first == 431);

  {  // headers trickled byte by byte: the connection is closed at the header deadline
    asio::io_context io;
    tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), g.port()});
    set_timeout(s, 5000);
    std::string req = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
    auto start = std::chrono::steady_clock::now();
    boost::system::error_code ec;
    for (char ch : req) {
      asio::write(s, asio::buffer(&ch, 1), ec);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (ec) break;
    }
    char b[64];
    s.read_some(asio::buffer(b), ec);   // never completed: the server closes
    CHECK(ec == asio::error::eof);
    bool quick = std::chrono::steady_clock::now() - start < std::chrono::seconds(5);
    CHECK(quick);
  }
  {
    ws_client w(g.port(), "/v1/ws");
    w.ws.text(true);
    std::string bad = "\xff\xfe";
    boost::system::error_code ec;
    w.ws.write(asio::buffer(bad), ec);
    CHECK(w.wait_close().code == websocket::close_code::bad_payload);   // 1007
  }
  {
    ws_client w(g.port(), "/v1/ws");
    w.ws.write(asio::buffer(std::string(2048, 'x')));
    CHECK(w.wait_close().code == websocket::close_code::too_big);   // 1009
  }
  // Nothing crashed; other clients are served.
  CHECK(get_path(g.port(), "/healthz").first == 200);
  stream_client c(g.port(), "/v1/stream");
  test::cluster().sql("INSERT INTO bad_items VALUES (1, 'still', 1)");
  CHECK(c.events(1).size() == 1);
}

TEST_CASE("client limits: a stream over --max-clients gets 503, accepting pauses at the connection limit") {
  setup_tables("lim");
  server_options so;
  so.max_clients = 2;
  so.max_other_connections = 2;
  so.header_timeout = std::chrono::milliseconds(1500);
  running_gateway g("lim_slot", "lim_pub", so);
  auto a = std::make_unique<stream_client>(g.port(), "/v1/stream");
  ws_client b(g.port(), "/v1/ws");
  REQUIRE(a->status() == 200);
  {  // a third stream client, by either transport: 503 with the limit and Retry-After
    stream_client c(g.port(), "/v1/stream");
    CHECK(c.status() == 503);
    CHECK(c.header("Retry-After") == "5");
    auto body = c.lines(1);
    REQUIRE(body.size() == 1);
    CHECK(body[0].find("too many clients (limit 2)") != std::string::npos);
    boost::system::error_code ec;
    websocket::stream<tcp::socket> w(c.io);
    w.next_layer().connect({asio::ip::make_address("127.0.0.1"), g.port()});
    w.handshake("localhost", "/v1/ws", ec);
    CHECK(ec == websocket::error::upgrade_declined);
  }
  // Other requests are still served while the stream clients are at their limit.
  CHECK(get_path(g.port(), "/healthz").first == 200);
  auto metrics = get_path(g.port(), "/metrics").second;
  CHECK(metrics.find("walgate_clients_rejected_total 2") != std::string::npos);
  {  // two idle connections fill the other slots: the next connection waits in the backlog...
    asio::io_context io;
    tcp::socket idle1(io), idle2(io);
    idle1.connect({asio::ip::make_address("127.0.0.1"), g.port()});
    idle2.connect({asio::ip::make_address("127.0.0.1"), g.port()});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto start = std::chrono::steady_clock::now();
    auto [code, body] = get_path(g.port(), "/healthz");   // ...until the idle ones time out
    CHECK(code == 200);
    auto waited = std::chrono::steady_clock::now() - start;
    CHECK(waited > std::chrono::milliseconds(800));
    CHECK(waited < std::chrono::milliseconds(5000));
  }
  // A slot freed is a slot for the next client.
  a.reset();
  REQUIRE(test::wait_until([&] { return g.srv->clients() == 1; }));
  stream_client d(g.port(), "/v1/stream");
  CHECK(d.status() == 200);
  test::cluster().sql("INSERT INTO lim_items VALUES (1, 'one', 1)");
  CHECK(d.events(1).size() == 1);
  CHECK(b.messages(1).size() == 1);
  CHECK(get_path(g.port(), "/metrics").second.find("walgate_accept_pauses_total 0") == std::string::npos);
}

TEST_CASE("DNS rebinding without authentication on any address: a name not served is 403, addresses and --allow-host names pass") {
  setup_tables("rebind");
  server_options so;
  so.host = "0.0.0.0";   // the usual container set-up, published on 127.0.0.1; no --auth
  so.allowed_hosts = {"gateway.internal"};
  running_gateway g("rebind_slot", "rebind_pub", so);
  auto status = [&](const std::string& host) {
    return get(g.port(), "GET /v1/stream?from=0/0:0 HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n").first;
  };
  auto head = [&](const std::string& host) {
    return get(g.port(), "GET /healthz HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n");
  };
  // A page of evil.example re-pointed at this machine: refused, saying why.
  auto [code, body] = head("evil.example");
  CHECK(code == 403);
  CHECK_MESSAGE(body.find("is not served without authentication") != std::string::npos, body);
  CHECK(head("evil.example:" + std::to_string(g.port())).first == 403);
  CHECK(head("localhost.evil.example").first == 403);
  // The machine's addresses (no rebinding page has one as its name), localhost, --allow-host.
  for (const std::string& h : std::vector<std::string>{"127.0.0.1:" + std::to_string(g.port()), "10.1.2.3", "[::1]:80", "[fd00::5]", "localhost",
                              "Gateway.Internal:8080"})
    CHECK_MESSAGE(head(h).first == 200, h);
  CHECK(status("evil.example") == 403);
}

TEST_CASE("cross-origin pages: the allowed ones get CORS headers, the others 403 (WebSocket too); DNS rebinding refused") {
  setup_tables("cors");
  server_options so;
  so.allowed_origins = {"http://app.example:3000"};
  so.allowed_hosts = {"gateway.example"};
  running_gateway g("cors_slot", "cors_pub", so);
  // A reverse proxy's public name, allowed: and the same-origin check then uses that Host.
  CHECK(get(g.port(), "GET /healthz HTTP/1.1\r\nHost: Gateway.Example\r\nOrigin: https://gateway.example\r\n"
                      "Connection: close\r\n\r\n").first == 200);
  const std::string own = "http://127.0.0.1:" + std::to_string(g.port());
  {
    stream_client c(g.port(), "/v1/stream", {{"Origin", "http://app.example:3000"}, {"Accept", "text/event-stream"}});
    CHECK(c.status() == 200);
    CHECK(c.header("Access-Control-Allow-Origin") == "http://app.example:3000");
    CHECK(c.header("Vary") == "Origin");
  }
  {
    stream_client c(g.port(), "/v1/stream", {{"Origin", "http://evil.example"}});
    CHECK(c.status() == 403);
    CHECK(c.header("Access-Control-Allow-Origin").empty());
    auto body = c.lines(1);
    REQUIRE(body.size() == 1);
    CHECK(body[0].find("--allow-origin http://evil.example") != std::string::npos);
  }
  {  // the gateway's own page, and clients that send no Origin (curl)
    stream_client own_page(g.port(), "/v1/stream", {{"Origin", "http://localhost"}});   // it sends Host: localhost
    CHECK(own_page.status() == 200);
    CHECK(get_path(g.port(), "/healthz").first == 200);
  }
  {  // a preflight from an allowed origin
    auto [code, body] = get(g.port(), "OPTIONS /v1/stream HTTP/1.1\r\nHost: localhost\r\nOrigin: http://app.example:3000\r\n"
                                      "Access-Control-Request-Headers: last-event-id\r\nConnection: close\r\n\r\n");
    CHECK(code == 204);
  }
  auto ws_from = [&](const std::string& origin) {
    asio::io_context io;
    websocket::stream<tcp::socket> ws(io);
    ws.next_layer().connect({asio::ip::make_address("127.0.0.1"), g.port()});
    ws.set_option(websocket::stream_base::decorator([origin](websocket::request_type& req) {
      req.set(http::field::origin, origin);
    }));
    boost::system::error_code ec;
    ws.handshake("127.0.0.1:" + std::to_string(g.port()), "/v1/ws", ec);
    return ec;
  };
  CHECK(ws_from("http://evil.example") == websocket::error::upgrade_declined);
  CHECK_FALSE(ws_from("http://app.example:3000"));
  CHECK_FALSE(ws_from(own));
  // DNS rebinding: a page of evil.example whose name now points at 127.0.0.1 is same-origin for
  // the browser (no Origin on its GETs); the gateway listening on loopback refuses its Host.
  auto rebound = get(g.port(), "GET /v1/stream HTTP/1.1\r\nHost: evil.example:" + std::to_string(g.port()) +
                                   "\r\nConnection: close\r\n\r\n");
  CHECK(rebound.first == 403);
  CHECK(rebound.second.find("--allow-host") != std::string::npos);
  CHECK(get(g.port(), "GET /healthz HTTP/1.1\r\nHost: [::1]:1\r\nConnection: close\r\n\r\n").first == 200);
  CHECK(get_path(g.port(), "/metrics").second.find("walgate_origins_rejected_total 3") != std::string::npos);
}

TEST_CASE("a slow client is disconnected with where to resume; the others are not slowed") {
  setup_tables("slow");
  server_options so;
  so.client_lag_bytes = 4u << 20;
  so.write_timeout = std::chrono::milliseconds(2000);
  running_gateway g("slow_slot", "slow_pub", so);
  stream_client slow(g.port(), "/v1/stream?format=native");   // never reads until the end
  stream_client fast(g.port(), "/v1/stream?format=native");
  // 2,000 small transactions, 20 MB of events at about 10 MB/s: far more than the slow client's
  // socket buffers and its 4 MB bound hold; a client that reads stays well within the bound.
  std::thread load([] {
    test::cluster().sql("DO $$ BEGIN FOR t IN 0..1999 LOOP INSERT INTO slow_items SELECT t * 10 + g, "
                        "repeat('x', 1000), 1 FROM generate_series(1, 10) g; COMMIT; PERFORM pg_sleep(0.001); END LOOP; END $$");
  });
  std::size_t received = 0;
  while (received < 20000) {
    auto batch = fast.events(500);
    if (batch.empty()) break;
    received += batch.size();
  }
  load.join();
  CHECK(received == 20000);
  // The slow client's stream ended: with a last line saying why and where to resume, unless
  // its socket was too full to take even that (then the write timeout closed it).
  std::string last;
  while (true) {
    auto l = slow.lines(1);
    if (l.empty()) break;
    if (!l[0].empty()) last = l[0];
  }
  CHECK(slow.ended);
  auto metrics = get_path(g.port(), "/metrics").second;
  CHECK(metrics.find("walgate_clients_disconnected_slow_total 0") == std::string::npos);
  if (last.rfind("{\"error\"", 0) == 0) {
    CHECK(last.find("slow client") != std::string::npos);
    CHECK(last.find("\"resume_from\":") != std::string::npos);
  }
}

TEST_CASE("a row larger than --client-lag-mb reaches every transport; the stream goes on after it") {
  test::cluster().sql("CREATE TABLE huge_items(id int PRIMARY KEY, v text); CREATE PUBLICATION huge_pub FOR TABLE huge_items");
  server_options so;
  so.client_lag_bytes = 64u << 20;   // the default
  running_gateway g("huge_slot", "huge_pub", so);
  stream_client nd(g.port(), "/v1/stream?format=native");
  stream_client sse(g.port(), "/v1/stream?format=native", {{"Accept", "text/event-stream"}});
  ws_client ws(g.port(), "/v1/ws?format=native");
  ws.ws.read_message_max(0);
  const std::size_t size = 100u << 20;   // 100 MiB of text in one value
  test::cluster().sql("INSERT INTO huge_items VALUES (1, repeat('x', " + std::to_string(size) + "))");
  test::cluster().sql("INSERT INTO huge_items VALUES (2, 'small')");
  auto value_size = [](const std::string& event) { return json::parse(event).at("after").at("v").as_string().size(); };
  // (PostgreSQL itself takes a while to decode and send it)
  REQUIRE_MESSAGE(test::wait_until([&] { return g.log->visible_seq() >= 2; }, std::chrono::seconds(120)),
                  "logged " << g.log->visible_seq() << "; " << g.gw->failure() << g.end_message);
  auto a = nd.events(2);
  REQUIRE(a.size() == 2);
  CHECK(value_size(a[0]) == size);
  CHECK(json::parse(a[1]).at("after").at("v") == "small");
  auto b = sse.sse(2);
  REQUIRE(b.size() == 2);
  CHECK(value_size(b[0].second) == size);
  CHECK(b[1].first == id_of(a[1]));
  auto c = ws.messages(2);
  REQUIRE(c.size() == 2);
  CHECK(value_size(c[0]) == size);
  CHECK(c[1] == a[1]);
  CHECK(get_path(g.port(), "/metrics").second.find("walgate_clients_disconnected_slow_total 0") != std::string::npos);
}

TEST_CASE("a transaction larger than --client-lag-mb: live clients read it through, and what follows") {
  test::cluster().sql("CREATE TABLE bulk_items(id int PRIMARY KEY, v text); CREATE PUBLICATION bulk_pub FOR TABLE bulk_items");
  server_options so;
  so.client_lag_bytes = 1u << 20;   // 1 MiB; the transaction is about 8 MiB of log
  running_gateway g("bulk_slot", "bulk_pub", so);
  stream_client nd(g.port(), "/v1/stream?format=native");
  ws_client ws(g.port(), "/v1/ws?format=native");
  test::cluster().sql("INSERT INTO bulk_items SELECT g, repeat('b', 100) FROM generate_series(1, 30000) g");
  test::cluster().sql("INSERT INTO bulk_items VALUES (0, 'after')");
  auto a = nd.events(30001);
  REQUIRE(a.size() == 30001);
  CHECK(json::parse(a.back()).at("after").at("v") == "after");
  auto b = ws.messages(30001);
  REQUIRE(b.size() == 30001);
  CHECK(b.back() == a.back());
  CHECK(get_path(g.port(), "/metrics").second.find("walgate_clients_disconnected_slow_total 0") != std::string::npos);
}

TEST_CASE("shutdown: NDJSON gets a last line and WebSocket a going-away close, both with the resume id") {
  setup_tables("down");
  running_gateway g("down_slot", "down_pub");
  stream_client s(g.port(), "/v1/stream");
  ws_client w(g.port(), "/v1/ws");
  test::cluster().sql("INSERT INTO down_items VALUES (1, 'a', 1)");
  auto e = s.events(1);
  REQUIRE(e.size() == 1);
  REQUIRE(w.messages(1).size() == 1);
  g.stop_server();
  auto last = s.events(1);
  REQUIRE(last.size() == 1);
  CHECK(last[0].find("server shutting down") != std::string::npos);
  CHECK(last[0].find("\"resume_from\":\"" + id_of(e[0]) + "\"") != std::string::npos);
  auto why = w.wait_close();
  CHECK(why.code == websocket::close_code::going_away);
  std::string reason(why.reason.data(), why.reason.size());
  CHECK(reason.find("resume from " + id_of(e[0])) != std::string::npos);
}

#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>

namespace {
/// A TLS client of the gateway on 127.0.0.1 (the test cluster's CA, host name localhost), its
/// handshake done.
std::unique_ptr<beast::ssl_stream<tcp::socket>> tls_connect(asio::io_context& io, asio::ssl::context& ctx,
                                                            std::uint16_t port) {
  auto ts = std::make_unique<beast::ssl_stream<tcp::socket>>(io, ctx);
  SSL_set1_host(ts->native_handle(), "localhost");
  ts->next_layer().connect({asio::ip::make_address("127.0.0.1"), port});
  set_timeout(ts->next_layer(), 10000);
  ts->handshake(asio::ssl::stream_base::client);
  return ts;
}
}  // namespace

TEST_CASE("TLS on the listening side") {
  setup_tables("tls_srv");
  server_options so;
  so.tls_cert = (test::cluster().dir() / "server.crt").string();
  so.tls_key = (test::cluster().dir() / "server.key").string();
  running_gateway g("tls_srv_slot", "tls_srv_pub", so);
  asio::io_context io;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  ctx.load_verify_file(test::cluster().ca_file().string());
  ctx.set_verify_mode(asio::ssl::verify_peer);
  auto tc = tls_connect(io, ctx, g.port());
  auto& s = *tc;
  http::request<http::empty_body> req{http::verb::get, "/healthz", 11};
  req.set(http::field::host, "localhost");
  http::write(s, req);
  beast::flat_buffer b;
  http::response<http::string_body> res;
  http::read(s, b, res);
  CHECK(res.result_int() == 200);
  CHECK(res.body() == "{\"status\":\"ok\"}\n");
  // Plain HTTP to the TLS port gets nothing.
  auto plain = get_path(g.port(), "/healthz");
  CHECK(plain.first != 200);
  // WSS: events through the frame-batching layer and then TLS, with and without deflate; a
  // clean close.
  for (bool deflate : {false, true}) {
    beast::ssl_stream<tcp::socket> ts(io, ctx);
    SSL_set1_host(ts.native_handle(), "localhost");
    ts.next_layer().connect({asio::ip::make_address("127.0.0.1"), g.port()});
    set_timeout(ts.next_layer(), 10000);
    ts.handshake(asio::ssl::stream_base::client);
    websocket::stream<beast::ssl_stream<tcp::socket>&> ws(ts);
    if (deflate) {
      websocket::permessage_deflate pmd;
      pmd.client_enable = true;
      ws.set_option(pmd);
    }
    ws.handshake("localhost", "/v1/ws");
    int id = deflate ? 2 : 1;
    test::cluster().sql("INSERT INTO tls_srv_items VALUES (" + std::to_string(id) + ", 'secure', 1)");
    std::string got;
    while (got.find("\"secure\"") == std::string::npos) {
      beast::flat_buffer fb;
      boost::system::error_code ec;
      ws.read(fb, ec);
      REQUIRE_MESSAGE(!ec, ec.message());
      got = beast::buffers_to_string(fb.data());
    }
    CHECK(got.find("\"id\":" + std::to_string(id)) != std::string::npos);
    // The client's close answered, then walgate's close_notify: over at once, not at walgate's
    // 5 s limit.
    const auto t0 = std::chrono::steady_clock::now();
    ws.close(websocket::close_code::normal);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  }
}

TEST_CASE("NDJSON and SSE clients that stop reading are closed at the write timeout, over TCP and over TLS") {
  setup_tables("stall");
  server_options so;
  so.client_lag_bytes = 512u << 20;   // (the lag bound far away: the write timeout ends them)
  so.write_timeout = std::chrono::milliseconds(1500);
  running_gateway plain("stall_slot", "stall_pub", so);
  server_options tso = so;
  tso.tls_cert = (test::cluster().dir() / "server.crt").string();
  tso.tls_key = (test::cluster().dir() / "server.key").string();
  running_gateway tls("stall_tls_slot", "stall_pub", tso);
  const std::string ndjson = "GET /v1/stream?format=native HTTP/1.1\r\nHost: localhost\r\n\r\n";
  const std::string sse = "GET /v1/stream?format=native HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n";
  // Plain: two raw sockets that send their request and never read.
  std::vector<int> fds;
  for (const auto* req : {&ndjson, &sse}) {
    int fd = loopback_socket(plain.port());
    REQUIRE(::send(fd, req->data(), req->size(), 0) == static_cast<ssize_t>(req->size()));
    fds.push_back(fd);
  }
  // TLS: two clients that do the handshake, send their request and never read.
  asio::io_context io;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  ctx.load_verify_file(test::cluster().ca_file().string());
  ctx.set_verify_mode(asio::ssl::verify_peer);
  std::vector<std::unique_ptr<beast::ssl_stream<tcp::socket>>> tcs;
  for (const auto* req : {&ndjson, &sse}) {
    auto ts = tls_connect(io, ctx, tls.port());
    asio::write(*ts, asio::buffer(*req));
    tcs.push_back(std::move(ts));
  }
  // The TLS gateway's /metrics, over TLS.
  auto tls_metric = [&](const std::string& name) {
    auto mc = tls_connect(io, ctx, tls.port());
    auto& ms = *mc;
    http::request<http::empty_body> req{http::verb::get, "/metrics", 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::connection, "close");
    http::write(ms, req);
    beast::flat_buffer b;
    http::response<http::string_body> res;
    http::read(ms, b, res);
    const auto& m = res.body();
    auto at = m.find("\n" + name + " ");
    REQUIRE_MESSAGE(at != std::string::npos, name << " not in /metrics");
    return std::atoll(m.c_str() + at + name.size() + 2);
  };
  // (walgate_connections counts the /metrics request's own connection too)
  REQUIRE(test::wait_until([&] { return metric_of(plain.port(), "walgate_connections") == 3; }, std::chrono::seconds(10)));
  REQUIRE(test::wait_until([&] { return tls_metric("walgate_connections") == 3; }, std::chrono::seconds(10)));
  // 40 MB of events: far more than the sockets' buffers hold.
  test::cluster().sql("INSERT INTO stall_items SELECT g, repeat(md5(g::text), 320), 1 FROM generate_series(1, 4000) g");
  const auto t0 = std::chrono::steady_clock::now();
  long long plain_slow = 0, tls_slow = 0;
  test::wait_until([&] { return (plain_slow = metric_of(plain.port(), "walgate_clients_disconnected_slow_total")) == 2; },
                   std::chrono::seconds(60));
  CHECK(plain_slow == 2);
  // Over plain TCP their writes were made by the sender thread; the write that filled each
  // socket went on from the loop.
  CHECK(metric_of(plain.port(), "walgate_send_thread_writes_total") >= 2);
  CHECK(metric_of(plain.port(), "walgate_send_thread_partial_total") >= 2);
  test::wait_until([&] { return (tls_slow = tls_metric("walgate_clients_disconnected_slow_total")) == 2; },
                   std::chrono::seconds(60));
  CHECK(tls_slow == 2);
  MESSAGE("all four closed as slow after " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                                           << " s");
  // Their connections are gone: what the plain sockets still hold is read to their end.
  for (int fd : fds) {
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::vector<char> buf(1 << 16);
    ssize_t n;
    while ((n = ::recv(fd, buf.data(), buf.size(), 0)) > 0) {
    }
    CHECK_MESSAGE((n == 0 || errno == ECONNRESET), "recv: " << n << " " << std::strerror(errno));
    ::close(fd);
  }
  CHECK(test::wait_until([&] { return metric_of(plain.port(), "walgate_connections") == 1; }, std::chrono::seconds(10)));
  CHECK(test::wait_until([&] { return tls_metric("walgate_connections") == 1; }, std::chrono::seconds(10)));
}

namespace {
/// A TLS client's handshake with the given protocol range and TLS 1.2 cipher list: "" on success,
/// else OpenSSL's reason.
std::string tls_handshake(std::uint16_t port, int min_version, int max_version, const char* ciphers, std::string* serial = nullptr) {
  asio::io_context io;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  ctx.load_verify_file(test::cluster().ca_file().string());
  ctx.set_verify_mode(asio::ssl::verify_peer);
  SSL_CTX_set_security_level(ctx.native_handle(), 0);   // the client would send anything: the server decides
  SSL_CTX_set_min_proto_version(ctx.native_handle(), min_version);
  SSL_CTX_set_max_proto_version(ctx.native_handle(), max_version);
  if (ciphers) SSL_CTX_set_cipher_list(ctx.native_handle(), ciphers);
  beast::ssl_stream<tcp::socket> s(io, ctx);
  SSL_set1_host(s.native_handle(), "localhost");
  s.next_layer().connect({asio::ip::make_address("127.0.0.1"), port});
  set_timeout(s.next_layer(), 10000);
  boost::system::error_code ec;
  s.handshake(asio::ssl::stream_base::client, ec);
  if (!ec && serial) {
    X509* cert = SSL_get1_peer_certificate(s.native_handle());
    BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get_serialNumber(cert), nullptr);
    char* hex = BN_bn2hex(bn);
    *serial = hex;
    OPENSSL_free(hex);
    BN_free(bn);
    X509_free(cert);
  }
  return ec ? ec.message() : std::string();
}
}  // namespace

TEST_CASE("TLS: 1.2 at least, forward-secret AEAD suites only; a renewed certificate read again without dropping connections") {
  setup_tables("tls_rl");
  test::temp_dir dir;
  const auto cd = test::cluster().dir();
  std::filesystem::copy_file(cd / "server.crt", dir.path / "server.crt");
  std::filesystem::copy_file(cd / "server.key", dir.path / "server.key");
  server_options so;
  so.tls_cert = (dir.path / "server.crt").string();
  so.tls_key = (dir.path / "server.key").string();
  running_gateway g("tls_rl_slot", "tls_rl_pub", so);
  std::string first_serial;
  CHECK(tls_handshake(g.port(), TLS1_2_VERSION, TLS1_2_VERSION, "ECDHE-RSA-AES128-GCM-SHA256", &first_serial) == "");
  CHECK(tls_handshake(g.port(), TLS1_3_VERSION, TLS1_3_VERSION, nullptr) == "");
  CHECK(tls_handshake(g.port(), TLS1_2_VERSION, TLS1_2_VERSION, "AES128-SHA") != "");       // no forward secrecy, CBC
  CHECK(tls_handshake(g.port(), TLS1_2_VERSION, TLS1_2_VERSION, "AES256-GCM-SHA384") != "");   // RSA key exchange
  CHECK(tls_handshake(g.port(), TLS1_2_VERSION, TLS1_2_VERSION, "ECDHE-RSA-AES128-SHA") != "");   // CBC
  // A client streaming over TLS while the certificate is renewed.
  asio::io_context io;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  ctx.load_verify_file(test::cluster().ca_file().string());
  ctx.set_verify_mode(asio::ssl::verify_peer);
  beast::ssl_stream<tcp::socket> ts(io, ctx);
  SSL_set1_host(ts.native_handle(), "localhost");
  ts.next_layer().connect({asio::ip::make_address("127.0.0.1"), g.port()});
  set_timeout(ts.next_layer(), 10000);
  ts.handshake(asio::ssl::stream_base::client);
  websocket::stream<beast::ssl_stream<tcp::socket>&> ws(ts);
  ws.handshake("localhost", "/v1/ws");
  // The renewal: a new certificate for localhost from the same CA, written over the old one.
  const std::string cmd = "cd '" + dir.path.string() + "' && openssl req -newkey rsa:2048 -nodes -subj '/CN=localhost' "
                          "-keyout new.key -out new.csr >/dev/null 2>&1 && openssl x509 -req -in new.csr -CA '" +
                          (cd / "ca.crt").string() + "' -CAkey '" + (cd / "ca.key").string() +
                          "' -CAcreateserial -CAserial ca.srl -days 2 -extfile '" + (cd / "san.ext").string() +
                          "' -out new.crt >/dev/null 2>&1 && mv new.crt server.crt && mv new.key server.key";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::string error;
  std::atomic<bool> ok = false, done = false;
  asio::post(g.io, [&] {
    ok = g.srv->reload_tls(error);
    done = true;
  });
  REQUIRE(test::wait_until([&] { return done.load(); }));
  REQUIRE_MESSAGE(ok.load(), error);
  std::string second_serial;
  CHECK(tls_handshake(g.port(), TLS1_2_VERSION, TLS1_3_VERSION, nullptr, &second_serial) == "");
  CHECK(!second_serial.empty());
  CHECK(second_serial != first_serial);
  // The connection made before goes on.
  test::cluster().sql("INSERT INTO tls_rl_items VALUES (1, 'renewed', 1)");
  beast::flat_buffer fb;
  boost::system::error_code ec;
  ws.read(fb, ec);
  REQUIRE_MESSAGE(!ec, ec.message());
  CHECK(beast::buffers_to_string(fb.data()).find("renewed") != std::string::npos);
  // A key that does not go with the certificate: refused, the certificate in use stays.
  std::filesystem::copy_file(cd / "server.key", dir.path / "server.key", std::filesystem::copy_options::overwrite_existing);
  done = false;
  asio::post(g.io, [&] {
    ok = g.srv->reload_tls(error);
    done = true;
  });
  REQUIRE(test::wait_until([&] { return done.load(); }));
  CHECK_FALSE(ok.load());
  INFO(error);
  CHECK(error.find("--tls-key " + so.tls_key) != std::string::npos);
  CHECK(error.find("mismatch") != std::string::npos);
  std::string third_serial;
  CHECK(tls_handshake(g.port(), TLS1_2_VERSION, TLS1_3_VERSION, nullptr, &third_serial) == "");
  CHECK(third_serial == second_serial);
}

TEST_CASE("pgoutput2json compact mode: s with a table's first row per client, and again after the table changes") {
  setup_tables("cmp");
  running_gateway g("cmp_slot", "cmp_pub");
  stream_client c(g.port(), "/v1/stream?format=pgoutput2json&compact=true");
  auto& pg = test::cluster();
  pg.sql("INSERT INTO cmp_items VALUES (1, 'a', 1.5)");
  pg.sql("INSERT INTO cmp_items VALUES (2, 'b', 2.5)");
  pg.sql("ALTER TABLE cmp_items ADD COLUMN note text DEFAULT 'n'");
  pg.sql("INSERT INTO cmp_items(id, name, price) VALUES (3, 'c', 3.5)");
  auto e = c.events(3);
  REQUIRE(e.size() == 3);
  CHECK(e[0].find(R"j("s":["public.cmp_items",["id",1,23],["name",0,25],["price",0,1700,524294]])j") != std::string::npos);
  CHECK(e[0].find(R"j("r":[1,"a",1.50])j") != std::string::npos);
  CHECK(e[1].find("\"s\"") == std::string::npos);
  CHECK(e[2].find(R"j(["note",0,25]])j") != std::string::npos);
  CHECK(e[2].find(R"j("r":[3,"c",3.50,"n"])j") != std::string::npos);
  // Another client gets its own first "s".
  stream_client d(g.port(), "/v1/stream?format=pgoutput2json&compact=true&from=" +
                                std::string("0/0:0"));
  auto again = d.events(1);
  REQUIRE(again.size() == 1);
  CHECK(again[0].find("\"s\"") != std::string::npos);
}
