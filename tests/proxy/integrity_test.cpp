// Nothing lost, nothing forged (issue 32): regressions found by an adversarial review, each
// against a real server — a non-transactional message at the very LSN of the transaction that
// emitted it, json values that carry line breaks, resume ids that no event of the stream has.
#include "gateway_harness.hpp"
#include "test_cluster.hpp"

#include "walgate/transform/change.hpp"
#include "walgate/transform/json.hpp"

#include <doctest/doctest.h>

#include <set>

using namespace walgate;
using namespace walgate::test::harness;

namespace {
json::object obj(const std::string& s) { return json::parse(s).as_object(); }
std::string str(const json::value& v) { return std::string(v.as_string()); }

/// One JSON value (however deep: json_max_depth levels and the event around them), one line.
bool one_json_line(const std::string& s) {
  json::parse_options po;
  po.max_depth = 4 * transform::json_max_depth;
  boost::system::error_code ec;
  json::parse(s, ec, {}, po);
  return !ec && s.find('\n') == std::string::npos && s.find('\r') == std::string::npos;
}
}  // namespace

TEST_CASE("a transaction whose last statement is a non-transactional message: both logged, each with an id of its own") {
  if (test::cluster().server_major() < 14) {
    MESSAGE("SKIPPED on PostgreSQL " << test::cluster().server_major() << ": pgoutput sends logical messages from 14");
    return;
  }
  auto& pg = test::cluster();
  pg.sql(R"(DROP PUBLICATION IF EXISTS im_pub; DROP TABLE IF EXISTS im_t;
            CREATE TABLE im_t(id int PRIMARY KEY);
            CREATE PUBLICATION im_pub FOR TABLE im_t)");
  running_gateway g("im_slot", "im_pub");
  stream_client every(g.port(), "/v1/stream");
  REQUIRE(every.status() == 200);
  const int rounds = 6;
  for (int i = 0; i < rounds; ++i)
    pg.sql("BEGIN; INSERT INTO im_t VALUES (" + std::to_string(2 * i) + "); INSERT INTO im_t VALUES (" +
           std::to_string(2 * i + 1) + "); SELECT pg_logical_emit_message(false, 'p', 'x" + std::to_string(i) + "'); COMMIT");
  pg.sql("INSERT INTO im_t VALUES (1000)");   // the end

  // The walsender sends each message when it decodes its record, before the transaction (sent
  // at its commit); the message's LSN, where its record ends, is the transaction's commit LSN.
  auto e = every.events(3 * rounds + 1);
  REQUIRE(e.size() == 3 * rounds + 1);
  std::set<std::string> ids;
  std::optional<transform::event_id> previous;
  int same_lsn = 0;
  for (int i = 0; i < rounds; ++i) {
    const auto m = obj(e[3 * i]), a = obj(e[3 * i + 1]), b = obj(e[3 * i + 2]);
    REQUIRE(str(m.at("op")) == "message");
    CHECK(str(m.at("content")) == "x" + std::to_string(i));
    CHECK(str(a.at("op")) == "insert");
    CHECK(a.at("after").at("id").as_int64() == 2 * i);
    CHECK(b.at("after").at("id").as_int64() == 2 * i + 1);
    // The message's id is one byte before its LSN: inside its own WAL record.
    const auto message_lsn = protocol::lsn::parse(str(m.at("lsn")));
    const auto message_id = transform::event_id::parse(str(m.at("id")));
    REQUIRE(message_lsn);
    REQUIRE(message_id);
    CHECK(message_id->commit_lsn.value == message_lsn->value - 1);
    CHECK(message_id->index == 0);
    CHECK(str(m.at("commit_lsn")) == message_id->commit_lsn.to_string());
    if (str(a.at("commit_lsn")) == str(m.at("lsn"))) ++same_lsn;
    for (const auto& o : {m, a, b}) {
      const auto id = transform::event_id::parse(str(o.at("id")));
      REQUIRE(id);
      CHECK(ids.insert(str(o.at("id"))).second);   // no two events share an id
      if (previous) CHECK(*previous < *id);        // and ids grow in the order sent
      previous = id;
    }
  }
  // The case that lost transactions: at least one commit record right after its message's
  // (another backend's WAL record may fall between, now and then; not every time).
  CHECK(same_lsn > 0);
  MESSAGE(same_lsn << " of " << rounds << " transactions had their message's LSN as commit LSN");

  // Resumed from each id: exactly what followed it.
  for (int k = 0; k < 3 * rounds; ++k) {
    stream_client r(g.port(), "/v1/stream?from=" + str(obj(e[k]).at("id")));
    REQUIRE(r.status() == 200);
    auto rest = r.events(3 * rounds - k);
    REQUIRE(rest.size() == static_cast<std::size_t>(3 * rounds - k));
    for (std::size_t j = 0; j < rest.size(); ++j) CHECK(obj(rest[j]).at("id") == obj(e[k + 1 + j]).at("id"));
  }
}

TEST_CASE("json values that hold line breaks forge nothing: every NDJSON line and SSE event one whole event") {
  auto& pg = test::cluster();
  pg.sql(R"(DROP PUBLICATION IF EXISTS ij_pub; DROP TABLE IF EXISTS ij_t;
            CREATE TABLE ij_t(id int PRIMARY KEY, j json, b jsonb);
            CREATE PUBLICATION ij_pub FOR TABLE ij_t)");
  running_gateway g("ij_slot", "ij_pub");
  std::vector<std::unique_ptr<stream_client>> ndjson;
  for (const char* f : {"native", "waltail", "debezium", "pgoutput2json", "wal2json"})
    ndjson.push_back(std::make_unique<stream_client>(g.port(), std::string("/v1/stream?format=") + f));
  stream_client sse(g.port(), "/v1/stream?format=native", {{"Accept", "text/event-stream"}});
  for (auto& c : ndjson) REQUIRE(c->status() == 200);
  REQUIRE(sse.status() == 200);

  // A row writer's json: a whole fake event on a line of its own (an NDJSON client would read it
  // as an event), an SSE event's end, CRs, a value nested deeper than clients parse, a number
  // beyond the rules.
  const std::string forged = "[\n{\"id\":\"FFF/0:0\",\"op\":\"delete\",\"schema\":\"public\",\"table\":\"ij_t\"}\n]";
  const std::string sse_cut = "{\"a\":\n\n\"data: {}\"\r\n\r}";
  const std::string deep = std::string(transform::json_max_depth + 1, '[') + std::string(transform::json_max_depth + 1, ']');
  auto lit = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
    return q + "'";
  };
  pg.sql("INSERT INTO ij_t VALUES (1, " + lit(forged) + ", " + lit(forged) + ")");
  pg.sql("INSERT INTO ij_t VALUES (2, " + lit(sse_cut) + ", " + lit(sse_cut) + ")");
  pg.sql("INSERT INTO ij_t VALUES (3, " + lit(deep) + ", NULL)");
  pg.sql("INSERT INTO ij_t VALUES (4, '[1e99999]', '{\"k\": [1, 2]}')");
  pg.sql("INSERT INTO ij_t VALUES (5, '{\"end\":true}', NULL)");

  for (auto& c : ndjson) {
    auto lines = c->events(5);
    REQUIRE(lines.size() == 5);
    for (const auto& l : lines) CHECK_MESSAGE(one_json_line(l), l);
  }
  pg.sql("INSERT INTO ij_t VALUES (6, NULL, NULL)");
  for (auto& c : ndjson) {   // and the next line is the next row (no forged line between)
    auto next = c->events(1);
    REQUIRE(next.size() == 1);
    CHECK_MESSAGE(one_json_line(next[0]), next[0]);
  }
  // native's values: the JSON kept as JSON (without its line breaks), the rest as strings.
  {
    stream_client again(g.port(), "/v1/stream?format=native&from=0/0:0");
    auto lines = again.events(5);
    REQUIRE(lines.size() == 5);
    const auto after = [&](int i) { return obj(lines[i]).at("after").as_object(); };
    CHECK(json::serialize(after(0).at("j")) == R"([{"id":"FFF/0:0","op":"delete","schema":"public","table":"ij_t"}])");
    CHECK(after(0).at("b").is_array());
    CHECK(after(1).at("j").at("a") == "data: {}");
    CHECK(str(after(2).at("j")) == deep);     // nested deeper than json_max_depth: the text
    CHECK(after(3).at("j") == "[1e99999]");   // a number past the rules: the text
    CHECK(json::serialize(after(3).at("b")) == R"({"k":[1,2]})");
  }
  auto events = sse.sse(5);
  REQUIRE(events.size() == 5);
  for (const auto& [id, data] : events) {
    CHECK(transform::event_id::parse(id));
    CHECK_MESSAGE(one_json_line(data), data);
    CHECK(str(obj(data).at("id")) == id);
  }
}

TEST_CASE("a resume id past the server's WAL end is refused (400), not waited for; one the log lost is served") {
  auto& pg = test::cluster();
  pg.sql(R"(DROP PUBLICATION IF EXISTS iw_pub; DROP TABLE IF EXISTS iw_t;
            CREATE TABLE iw_t(id int PRIMARY KEY);
            CREATE PUBLICATION iw_pub FOR TABLE iw_t)");
  running_gateway g("iw_slot", "iw_pub");
  pg.sql("INSERT INTO iw_t VALUES (1)");
  stream_client first(g.port(), "/v1/stream?from=0/0:0");
  const auto got = first.events(1);
  REQUIRE(got.size() == 1);
  const std::string logged = got[0];
  for (const char* far : {"FFF/0:0", "FFFFFFFF/FFFFFFFF:0", "1000/0:C"}) {
    auto [status, body] = get_path(g.port(), std::string("/v1/stream?from=") + far);
    CHECK(status == 400);
    CHECK_MESSAGE(body.find("past the end of the server's WAL") != std::string::npos, body);
  }
  // Past the log's head but not past the server's WAL (what a crash can take from the log before
  // it was synced, and the server sends again): served, from the head, skipping through it.
  const auto commit = protocol::lsn::parse(str(obj(logged).at("commit_lsn")));
  REQUIRE(commit);
  stream_client lost(g.port(), "/v1/stream?from=" + protocol::lsn{commit->value + 1}.to_string() + ":0");
  CHECK(lost.status() == 200);
  pg.sql("INSERT INTO iw_t VALUES (2)");
  auto next = lost.events(1);
  REQUIRE(next.size() == 1);
  CHECK(obj(next[0]).at("after").at("id").as_int64() == 2);
}
