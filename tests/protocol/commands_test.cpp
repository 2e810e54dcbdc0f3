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
