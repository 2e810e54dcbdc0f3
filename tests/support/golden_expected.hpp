// The golden workload (SQL) and what decoding its capture must give.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace walgate::test {

inline const char* golden_schema = R"SQL(
CREATE TYPE g_mood AS ENUM ('sad', 'happy');
CREATE TABLE g_default(id int PRIMARY KEY, name text, big text, mood g_mood);
ALTER TABLE g_default ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE g_full(id int PRIMARY KEY, v text);
ALTER TABLE g_full REPLICA IDENTITY FULL;
CREATE TABLE g_index(id int NOT NULL, code text NOT NULL, v text);
CREATE UNIQUE INDEX g_index_code ON g_index(code);
ALTER TABLE g_index REPLICA IDENTITY USING INDEX g_index_code;
CREATE TABLE g_nothing(id int, v text);
ALTER TABLE g_nothing REPLICA IDENTITY NOTHING;
CREATE TABLE g_parent(id serial PRIMARY KEY);
CREATE TABLE g_child(id int PRIMARY KEY, parent_id int REFERENCES g_parent);
CREATE TABLE g_part(id int, region text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE g_part_eu PARTITION OF g_part FOR VALUES IN ('eu');
CREATE TABLE g_big(id int PRIMARY KEY, payload text);
CREATE PUBLICATION g_pub FOR TABLE g_default, g_full, g_index, g_parent, g_child, g_big;
CREATE PUBLICATION g_pub_root FOR TABLE g_part, g_nothing WITH (publish_via_partition_root = true, publish = 'insert');
SELECT pg_replication_origin_create('g_origin');
)SQL";

/// One transaction per entry (each runs in its own session).
inline std::vector<std::string> golden_workload(int major) {
  std::vector<std::string> w = {
      "INSERT INTO g_default VALUES (1, 'one', repeat('x', 10000), 'happy')",
      "UPDATE g_default SET name = 'uno' WHERE id = 1",                 // big: unchanged TOAST
      "UPDATE g_default SET id = 2 WHERE id = 1",                       // key change: 'K'
      "BEGIN; INSERT INTO g_full VALUES (1, 'a'); UPDATE g_full SET v = 'b'; DELETE FROM g_full; COMMIT",
      "BEGIN; INSERT INTO g_index VALUES (1, 'c1', 'v'); UPDATE g_index SET code = 'c2'; "
      "UPDATE g_index SET v = 'w'; DELETE FROM g_index; COMMIT",
      "INSERT INTO g_nothing VALUES (1, 'n')",
      "BEGIN; INSERT INTO g_parent DEFAULT VALUES; INSERT INTO g_child VALUES (1, 1); COMMIT",
      "TRUNCATE g_parent, g_child RESTART IDENTITY CASCADE",
      "BEGIN; INSERT INTO g_default VALUES (3, NULL, 'small', NULL); "
      "SELECT pg_logical_emit_message(true, 'g_tx', 'transactional'); COMMIT",
      "SELECT pg_logical_emit_message(false, 'g_nontx', 'hello')",
      "INSERT INTO g_part VALUES (1, 'eu')",
      "ALTER TABLE g_default ADD COLUMN extra int DEFAULT 7",
      "INSERT INTO g_default(id, name) VALUES (4, 'four')",
      // A transaction larger than logical_decoding_work_mem: streamed, with a rolled back savepoint.
      "BEGIN; INSERT INTO g_big SELECT g, repeat('p', 100) FROM generate_series(1, 1000) g; SAVEPOINT s; "
      "INSERT INTO g_big SELECT g, repeat('q', 100) FROM generate_series(1001, 2000) g; ROLLBACK TO s; "
      "INSERT INTO g_big VALUES (5000, 'after'); COMMIT",
      // One that is streamed and then aborted as a whole.
      "BEGIN; INSERT INTO g_big SELECT g, repeat('r', 100) FROM generate_series(10001, 11000) g; ROLLBACK",
      "SELECT pg_replication_origin_session_setup('g_origin'); BEGIN; "
      "SELECT pg_replication_origin_xact_setup('0/ABCDEF', now()); INSERT INTO g_default(id, name) VALUES (20, 'from origin'); "
      "COMMIT; SELECT pg_replication_origin_session_reset()",
  };
  if (major >= 15) {
    w.push_back("BEGIN; INSERT INTO g_default(id, name) VALUES (10, 'prepared'); PREPARE TRANSACTION 'g_commit'");
    w.push_back("COMMIT PREPARED 'g_commit'");
    w.push_back("BEGIN; INSERT INTO g_default(id, name) VALUES (11, 'rolled back'); PREPARE TRANSACTION 'g_rollback'");
    w.push_back("ROLLBACK PREPARED 'g_rollback'");
    w.push_back("BEGIN; INSERT INTO g_big SELECT g, repeat('s', 100) FROM generate_series(20001, 21000) g; "
                "PREPARE TRANSACTION 'g_stream_prep'");
    w.push_back("COMMIT PREPARED 'g_stream_prep'");
  }
  w.push_back("SELECT pg_logical_emit_message(false, 'g_end', '')");
  return w;
}

/// The reviewed summary (tests/golden/expected-*.summary). The same for every server version:
/// what differs between versions is only LSNs, xids, clocks and the protocol version.
inline std::string golden_expected(bool binary) {
  std::ifstream in(std::string(WALGATE_GOLDEN_DIR) + (binary ? "/expected-binary.summary" : "/expected-text.summary"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace walgate::test
