#include "walgate/protocol/commands.hpp"

#include "split_helpers.hpp"

#include <doctest/doctest.h>

using namespace walgate::protocol;

TEST_CASE("server major versions") {
  CHECK(server_major_from_version_string("15.18 (Debian 15.18-0+deb12u1)") == 15);
  CHECK(server_major_from_version_string("18.4") == 18);
  CHECK(server_major_from_version_string("16beta2") == 16);
  CHECK(server_major_from_version_string("150018") == 15);
  CHECK(server_major_from_version_string("x") == 0);
  CHECK(max_pgoutput_protocol(13) == 1);
  CHECK(max_pgoutput_protocol(14) == 2);
  CHECK(max_pgoutput_protocol(15) == 3);
  CHECK(max_pgoutput_protocol(18) == 4);
}

TEST_CASE("slot names and quoting") {
  CHECK(valid_slot_name("walgate_1"));
  CHECK_FALSE(valid_slot_name(""));
  CHECK_FALSE(valid_slot_name("Upper"));
  CHECK_FALSE(valid_slot_name("a-b"));
  CHECK_FALSE(valid_slot_name("x; DROP"));
  CHECK_FALSE(valid_slot_name(std::string(64, 'a')));
  CHECK(valid_slot_name(std::string(63, 'a')));
  CHECK(quote_identifier("P 2") == "\"P 2\"");
  CHECK(quote_identifier("a\"b") == "\"a\"\"b\"");
  CHECK(quote_literal("it's") == "'it''s'");
}

TEST_CASE("CREATE_REPLICATION_SLOT in each server's syntax") {
  create_slot_options o;
  o.slot = "s1";
  o.snapshot = snapshot_action::export_snapshot;
  CHECK(build_create_slot(o, 15).text == "CREATE_REPLICATION_SLOT s1 LOGICAL pgoutput (SNAPSHOT 'export')");
  CHECK(build_create_slot(o, 14).text == "CREATE_REPLICATION_SLOT s1 LOGICAL pgoutput EXPORT_SNAPSHOT");
  o.snapshot = snapshot_action::no_export;
  o.temporary = true;
  CHECK(build_create_slot(o, 18).text == "CREATE_REPLICATION_SLOT s1 TEMPORARY LOGICAL pgoutput (SNAPSHOT 'nothing')");
  CHECK(build_create_slot(o, 13).text == "CREATE_REPLICATION_SLOT s1 TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT");
  o.two_phase = true;
  CHECK(build_create_slot(o, 16).text ==
        "CREATE_REPLICATION_SLOT s1 TEMPORARY LOGICAL pgoutput (SNAPSHOT 'nothing', TWO_PHASE)");
  CHECK_FALSE(build_create_slot(o, 14));
  // FAILOVER (17+): after the snapshot option and TWO_PHASE; never with TEMPORARY.
  o.failover = true;
  CHECK(build_create_slot(o, 17).error == "a temporary slot cannot be a failover slot");
  o.temporary = false;
  CHECK(build_create_slot(o, 17).text == "CREATE_REPLICATION_SLOT s1 LOGICAL pgoutput (SNAPSHOT 'nothing', TWO_PHASE, FAILOVER)");
  o.two_phase = false;
  o.snapshot = snapshot_action::export_snapshot;
  CHECK(build_create_slot(o, 18).text == "CREATE_REPLICATION_SLOT s1 LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER)");
  CHECK(build_create_slot(o, 16).error == "failover slots need PostgreSQL 17 or later");
  o.failover = false;
  o.slot = "Bad";
  CHECK(build_create_slot(o, 16).error.find("invalid slot name") != std::string::npos);
  CHECK(build_drop_slot("s1", true).text == "DROP_REPLICATION_SLOT s1 WAIT");
  CHECK(build_drop_slot("s1", false).text == "DROP_REPLICATION_SLOT s1");
}

TEST_CASE("START_REPLICATION quotes publication names and offers only supported options") {
  start_replication_options o;
  o.slot = "s1";
  o.start = lsn{0x16B3748};
  o.publications = {"p1", "P 2", "it's"};
  o.proto_version = 1;
  CHECK(build_start_replication(o, 13).text ==
        "START_REPLICATION SLOT s1 LOGICAL 0/16B3748 (proto_version '1', publication_names "
        "'\"p1\",\"P 2\",\"it''s\"')");
  o.proto_version = 4;
  o.messages = true;
  o.binary = true;
  o.streaming = streaming_mode::parallel;
  o.two_phase = true;
  o.origin = "none";
  CHECK(build_start_replication(o, 16).text ==
        "START_REPLICATION SLOT s1 LOGICAL 0/16B3748 (proto_version '4', publication_names "
        "'\"p1\",\"P 2\",\"it''s\"', messages 'true', binary 'true', streaming 'parallel', two_phase 'on', "
        "origin 'none')");
  CHECK(build_start_replication(o, 15).error.find("proto_version 4") != std::string::npos);
  o.proto_version = 3;
  CHECK(build_start_replication(o, 15).error.find("parallel streaming") != std::string::npos);
  o.streaming = streaming_mode::on;
  CHECK(build_start_replication(o, 15).error.find("origin") != std::string::npos);
  o.origin.reset();
  CHECK(build_start_replication(o, 15));
  o.proto_version = 1;
  o.streaming = streaming_mode::off;
  o.two_phase = false;
  CHECK(build_start_replication(o, 13).error.find("messages") != std::string::npos);
  o.messages = false;
  CHECK(build_start_replication(o, 13).error.find("binary") != std::string::npos);
  o.publications.clear();
  CHECK_FALSE(build_start_replication(o, 16));
}

TEST_CASE("TIMELINE_HISTORY and the history file it returns") {
  CHECK(build_timeline_history(3).text == "TIMELINE_HISTORY 3");
  CHECK_FALSE(build_timeline_history(0));
  // As PostgreSQL 17 writes 00000003.history (timeline.c: "%u\t%X/%X\t%s\n").
  const std::string file =
      "1\t0/3000158\tno recovery target specified\n"
      "\n"
      "2\t0/5A0000A0\tno recovery target specified\n";
  auto h = parse_timeline_history(file);
  REQUIRE(h);
  REQUIRE(h->size() == 2);
  CHECK((*h)[0].timeline == 1);
  CHECK((*h)[0].switchpoint == lsn{0x3000158});
  CHECK((*h)[1].timeline == 2);
  CHECK((*h)[1].switchpoint == lsn{0x5A0000A0});
  CHECK(switchpoint_of(*h, 2) == lsn{0x5A0000A0});
  CHECK_FALSE(switchpoint_of(*h, 3));   // (the server's own timeline: not left)
  CHECK_FALSE(switchpoint_of(*h, 7));
  // Every prefix of the file: parsed without reading past it, and what it gives is what the
  // prefix says — a whole line (its LSN whole: the prefix reaches the tab after it) gives its
  // switch point; a prefix that ends inside a line's LSN gives that shorter LSN (the server
  // sends its file whole, in one DataRow whose length the message parser checks).
  const std::size_t first_tab_after_lsn = file.find('\t', 2), second_line = file.find("2\t");
  for (std::size_t n = 0; n <= file.size(); ++n) {
    CAPTURE(n);
    auto p = parse_timeline_history(std::string_view(file).substr(0, n));
    if (n >= first_tab_after_lsn && n <= second_line) {
      REQUIRE(p);
      REQUIRE(p->size() == 1);
      CHECK((*p)[0].switchpoint == lsn{0x3000158});
    }
    if (n >= file.size() - 1) {
      REQUIRE(p);
      CHECK(p->size() == 2);
    }
  }
  CHECK(parse_timeline_history(std::string_view(file).substr(0, 13))->empty() == false);   // "1\t0/3000158\tn"
  // (Cut inside an LSN, a file would read as a valid, different LSN: the server sends its file
  // whole, in one DataRow whose length the backend message parser checks; the prefixes above
  // only show that nothing is read past the input.)
  // Comments, blanks and spaces instead of tabs, as readTimeLineHistory accepts them.
  auto c = parse_timeline_history("# a comment\n   \n  1 0/10 reason\n2\t0/20\n");
  REQUIRE(c);
  CHECK(c->size() == 2);
  CHECK(parse_timeline_history("")->empty());
  // Refused: not a number, no LSN, a timeline 0, timelines not increasing, switch points going back.
  CHECK_FALSE(parse_timeline_history("x\t0/10\tr\n"));
  CHECK_FALSE(parse_timeline_history("1\n"));
  CHECK_FALSE(parse_timeline_history("1\t\n"));
  CHECK_FALSE(parse_timeline_history("1\t0/1G\tr\n"));
  CHECK_FALSE(parse_timeline_history("1x\t0/10\n"));
  CHECK_FALSE(parse_timeline_history("0\t0/10\n"));
  CHECK_FALSE(parse_timeline_history("2\t0/10\n1\t0/20\n"));
  CHECK_FALSE(parse_timeline_history("1\t0/20\n2\t0/10\n"));
  CHECK_FALSE(parse_timeline_history("99999999999\t0/10\n"));
  std::string many;
  for (int i = 1; i <= 70000; ++i) many += std::to_string(i) + "\t0/10\n";
  CHECK_FALSE(parse_timeline_history(many));
}
