// The server side of the replication protocol (walsender.hpp): exact bytes of what a server
// answers, and what a client sends split at every byte offset — each assumption written in the
// header broken here.
#include "walgate/protocol/walsender.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace walgate::protocol;
using namespace walgate::protocol::walsender;

namespace {

bytes_view bv(const std::string& s) { return as_bytes(std::string_view(s)); }

std::string be32(std::uint32_t v) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((v >> (24 - 8 * i)) & 0xff);
  return out;
}

/// An untagged packet: its length, then body.
std::string packet(const std::string& body) { return be32(static_cast<std::uint32_t>(body.size() + 4)) + body; }

replication_command parsed(std::string_view text) {
  auto r = parse_replication_command(text);
  INFO(text << ": " << r.error);
  REQUIRE(r.command);
  return *r.command;
}

std::string error_of(std::string_view text) {
  auto r = parse_replication_command(text);
  CHECK_FALSE(r.command);
  return r.error;
}

}  // namespace

TEST_CASE("startup packet: a StartupMessage split at every byte offset, the parameters in order") {
  // What libpq sends for a replication connection (the same bytes build_startup makes).
  const std::string bytes = build_startup({{"user", "postgres"}, {"database", "db"}, {"replication", "database"},
                                           {"application_name", "pg_recvlogical"}});
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    CAPTURE(cut);
    auto r = split_startup_packet(bv(bytes.substr(0, cut)));
    CHECK(r.status == split_status::need_more);
  }
  const std::string two = bytes + "tail";   // (what follows is not taken)
  auto r = split_startup_packet(bv(two));
  REQUIRE(r.status == split_status::ready);
  CHECK(r.packet.what == startup_packet::kind::startup);
  CHECK(r.packet.version == protocol_version_3_0);
  CHECK(r.packet.size == bytes.size());
  REQUIRE(r.packet.params.size() == 4);
  CHECK(r.packet.params[2].first == "replication");
  CHECK(startup_param(r.packet, "replication") == std::string_view("database"));
  CHECK(startup_param(r.packet, "application_name") == std::string_view("pg_recvlogical"));
  CHECK_FALSE(startup_param(r.packet, "options"));
  // An empty value is a value; no parameters at all is a StartupMessage too.
  r = split_startup_packet(bv(packet(be32(protocol_version_3_0) + std::string("user\0\0\0", 7))));
  REQUIRE(r.status == split_status::ready);
  CHECK(r.packet.params.at(0).second.empty());
  r = split_startup_packet(bv(packet(be32(protocol_version_3_0) + std::string(1, '\0'))));
  REQUIRE(r.status == split_status::ready);
  CHECK(r.packet.params.empty());
  // Protocol 3.2 (libpq 18 may ask for it): a StartupMessage; what is served is negotiated.
  r = split_startup_packet(bv(packet(be32((3u << 16) | 2) + std::string("user\0u\0\0", 8))));
  REQUIRE(r.status == split_status::ready);
  CHECK(r.packet.version == ((3u << 16) | 2));
}

TEST_CASE("startup packet: SSLRequest, GSSENCRequest and CancelRequest, exact; refusals before anything is buffered") {
  auto r = split_startup_packet(bv(build_ssl_request()));
  REQUIRE(r.status == split_status::ready);
  CHECK(r.packet.what == startup_packet::kind::ssl_request);
  CHECK(r.packet.size == 8);
  r = split_startup_packet(bv(packet(be32(gssenc_request_code))));
  REQUIRE(r.status == split_status::ready);
  CHECK(r.packet.what == startup_packet::kind::gssenc_request);
  const std::string cancel = packet(be32(cancel_request_code) + be32(4242) + be32(0xdeadbeef));
  r = split_startup_packet(bv(cancel));  // the key is a view into these bytes
  REQUIRE(r.status == split_status::ready);
  CHECK(r.packet.what == startup_packet::kind::cancel_request);
  CHECK(r.packet.cancel_pid == 4242);
  CHECK(as_string_view(r.packet.cancel_key) == be32(0xdeadbeef));
  // A 3.2 cancel key of 32 bytes.
  r = split_startup_packet(bv(packet(be32(cancel_request_code) + be32(1) + std::string(32, 'k'))));
  REQUIRE(r.status == split_status::ready);
  CHECK(r.packet.cancel_key.size() == 32);

  auto refused = [](const std::string& bytes, errc code) {
    auto x = split_startup_packet(bv(bytes));
    CHECK(x.status == split_status::error);
    CHECK(x.error.code == code);
  };
  // A length the server never accepts: refused from its first four bytes (a 10 MB packet is
  // never waited for).
  refused(be32(7), errc::length_out_of_range);
  refused(be32(0), errc::length_out_of_range);
  refused(be32(10'000'001), errc::length_out_of_range);
  refused(be32(static_cast<std::uint32_t>(max_startup_packet) + 1), errc::length_out_of_range);
  CHECK(split_startup_packet(bv(be32(static_cast<std::uint32_t>(max_startup_packet)))).status == split_status::need_more);
  refused(packet(be32(ssl_request_code) + "x"), errc::length_out_of_range);                       // an SSLRequest of 9
  refused(packet(be32(cancel_request_code) + be32(1)), errc::length_out_of_range);                // a cancel without key
  refused(packet(be32(2u << 16) + std::string(1, '\0')), errc::invalid_value);                   // protocol 2.0
  refused(packet(be32(protocol_version_3_0) + std::string("user\0u", 6)), errc::unterminated_string);   // no terminator
  refused(packet(be32(protocol_version_3_0) + std::string("user\0", 5)), errc::unterminated_string);    // no value
  refused(packet(be32(protocol_version_3_0) + std::string("user\0u\0\0x", 9)), errc::trailing_bytes);  // after it
  refused(packet(be32(protocol_version_3_0)), errc::unterminated_string);                                // nothing
}

TEST_CASE("frontend messages: a Query and a SASLInitialResponse, split at every offset") {
  const std::string q = build_query("IDENTIFY_SYSTEM");
  for (std::size_t cut = 0; cut < q.size(); ++cut)
    CHECK(split_frontend_message(bv(q.substr(0, cut)), 1 << 20).status == split_status::need_more);
  auto m = split_frontend_message(bv(q), 1 << 20);
  REQUIRE(m.status == split_status::ready);
  CHECK(m.message.tag == 'Q');
  auto text = parse_query(m.message.body);
  REQUIRE(text.has_value());
  CHECK(*text == "IDENTIFY_SYSTEM");
  CHECK(split_frontend_message(bv(q), 4).status == split_status::error);   // over the server's limit
  CHECK_FALSE(parse_query(bv(std::string("SELECT 1"))).has_value());                    // no NUL
  CHECK_FALSE(parse_query(bv(std::string("SELECT 1\0x", 10))).has_value());             // bytes after it

  const std::string p = build_sasl_initial_response("SCRAM-SHA-256", "n,,n=,r=abc");
  auto s = split_frontend_message(bv(p), 1 << 20);
  REQUIRE(s.status == split_status::ready);
  CHECK(s.message.tag == 'p');
  auto sasl = parse_sasl_initial_response(s.message.body);
  REQUIRE(sasl.has_value());
  CHECK(sasl->mechanism == "SCRAM-SHA-256");
  REQUIRE(sasl->data);
  CHECK(as_string_view(*sasl->data) == "n,,n=,r=abc");
  auto none = parse_sasl_initial_response(bv(std::string("SCRAM-SHA-256\0", 14) + be32(0xffffffff)));
  REQUIRE(none.has_value());
  CHECK_FALSE(none->data);
  CHECK_FALSE(parse_sasl_initial_response(bv(std::string("M\0", 2) + be32(5) + "abc")).has_value());   // shorter than said
  CHECK_FALSE(parse_sasl_initial_response(bv(std::string("M\0", 2) + be32(0xfffffffe))).has_value());  // -2
}

TEST_CASE("replication commands: what pg_recvlogical, subscribers and Debezium send, 13 to 18") {
  auto c = parsed("IDENTIFY_SYSTEM");
  CHECK(c.what == replication_command::kind::identify_system);
  CHECK(parsed("identify_system;").what == replication_command::kind::identify_system);
  c = parsed("SHOW data_directory_mode");
  CHECK(c.what == replication_command::kind::show);
  CHECK(c.name == "data_directory_mode");
  CHECK(parsed("SHOW \"Foo\".bar").name == "Foo.bar");
  // pg_recvlogical 15+: the slot quoted, options parenthesised.
  c = parsed("CREATE_REPLICATION_SLOT \"Slot1\" LOGICAL \"wal2json\" (SNAPSHOT 'nothing', FAILOVER)");
  CHECK(c.what == replication_command::kind::create_slot);
  CHECK(c.name == "Slot1");
  CHECK(c.logical);
  CHECK(c.plugin == "wal2json");
  CHECK(c.options == std::vector<command_option>{{"snapshot", "nothing"}, {"failover", std::nullopt}});
  // Before 15: the legacy keywords.
  c = parsed("CREATE_REPLICATION_SLOT s1 TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT TWO_PHASE");
  CHECK(c.temporary);
  CHECK(c.options == std::vector<command_option>{{"snapshot", "nothing"}, {"two_phase", std::nullopt}});
  CHECK(parsed("CREATE_REPLICATION_SLOT s1 LOGICAL test_decoding EXPORT_SNAPSHOT").options.at(0).value == "export");
  CHECK(parsed("CREATE_REPLICATION_SLOT s1 LOGICAL test_decoding USE_SNAPSHOT").options.at(0).value == "use");
  c = parsed("create_replication_slot s1 logical pgoutput (two_phase true, snapshot 'export', x -1, y 7)");
  CHECK(c.options == std::vector<command_option>{{"two_phase", "true"}, {"snapshot", "export"}, {"x", "-1"}, {"y", "7"}});
  c = parsed("CREATE_REPLICATION_SLOT p PHYSICAL RESERVE_WAL");
  CHECK_FALSE(c.logical);
  CHECK(c.options == std::vector<command_option>{{"reserve_wal", std::nullopt}});
  c = parsed("DROP_REPLICATION_SLOT \"s\" WAIT");
  CHECK(c.what == replication_command::kind::drop_slot);
  CHECK(c.wait);
  CHECK_FALSE(parsed("DROP_REPLICATION_SLOT s").wait);
  c = parsed("ALTER_REPLICATION_SLOT s (FAILOVER false)");
  CHECK(c.what == replication_command::kind::alter_slot);
  CHECK(c.options == std::vector<command_option>{{"failover", "false"}});
  CHECK(parsed("READ_REPLICATION_SLOT s").what == replication_command::kind::read_slot);
  c = parsed("TIMELINE_HISTORY 3");
  CHECK(c.what == replication_command::kind::timeline_history);
  CHECK(c.timeline == 3u);
  // pg_recvlogical: the options quoted as identifiers, their values as strings.
  c = parsed("START_REPLICATION SLOT \"s\" LOGICAL 0/0 (\"format-version\" '2', \"include-xids\" '1')");
  CHECK(c.what == replication_command::kind::start_replication);
  CHECK(c.logical);
  CHECK(c.name == "s");
  CHECK(c.start == lsn{0});
  CHECK(c.options == std::vector<command_option>{{"format-version", "2"}, {"include-xids", "1"}});
  // A subscriber (pgoutput): unquoted names, and a value with a quote in it.
  c = parsed("START_REPLICATION SLOT \"sub\" LOGICAL 16/B374D848 (proto_version '4', streaming 'parallel', origin 'any', "
             "publication_names '\"p1\",\"it''s\"')");
  CHECK(c.start == lsn{(0x16ull << 32) | 0xB374D848ull});
  REQUIRE(c.options.size() == 4);
  CHECK(c.options[3].value == "\"p1\",\"it's\"");
  c = parsed("START_REPLICATION SLOT s LOGICAL 0/16B3748 (skip_empty)");
  CHECK(c.options == std::vector<command_option>{{"skip_empty", std::nullopt}});
  // Physical: no slot needed, a timeline.
  c = parsed("START_REPLICATION PHYSICAL 0/3000000 TIMELINE 2");
  CHECK_FALSE(c.logical);
  CHECK(c.timeline == 2u);
  CHECK(parsed("BASE_BACKUP (LABEL 'x')").what == replication_command::kind::base_backup);
  CHECK(parsed("UPLOAD_MANIFEST").what == replication_command::kind::upload_manifest);
}

TEST_CASE("replication commands: SQL is SQL, and what breaks the grammar is an error saying where") {
  // The first token decides (a walsender connected to a database runs the rest as SQL).
  for (const char* sql : {"SELECT pg_catalog.set_config('search_path', '', false);", "select 1", "  \n SELECT 1",
                          "BEGIN READ ONLY", "", "   ", "(SELECT 1)", "'str'", "42", "\"quoted\" stuff", "SHOWX"}) {
    CAPTURE(sql);
    CHECK(parsed(sql).what == replication_command::kind::sql);
  }
  CHECK(error_of("IDENTIFY_SYSTEM extra") == "syntax error at or near \"extra\"");
  CHECK(error_of("IDENTIFY_SYSTEM;;") == "syntax error at or near \";\"");
  CHECK(error_of("START_REPLICATION SLOT s LOGICAL") == "syntax error at end of input");
  CHECK(error_of("START_REPLICATION SLOT s LOGICAL 0/0 (a '1'") == "syntax error at end of input");
  CHECK(error_of("START_REPLICATION SLOT s LOGICAL 0/0 (a 1)") == "syntax error at or near \"1\"");   // (values are strings)
  CHECK(error_of("START_REPLICATION LOGICAL 0/0") == "syntax error at or near \"LOGICAL\"");               // a slot is needed
  CHECK(error_of("START_REPLICATION SLOT s LOGICAL 123456789/0") == "invalid streaming start location");
  CHECK(error_of("CREATE_REPLICATION_SLOT s LOGICAL") == "syntax error at end of input");
  CHECK(error_of("CREATE_REPLICATION_SLOT s") == "syntax error at end of input");
  CHECK(parsed("CREATE_REPLICATION_SLOT \"\" LOGICAL x").name.empty());   // (refused by the server, as a name too short)
  CHECK(error_of("DROP_REPLICATION_SLOT 'x'") == "syntax error at or near \"'x'\"");
  CHECK(error_of("CREATE_REPLICATION_SLOT s LOGICAL p (snapshot 'nothing") == "unterminated quoted string");
  CHECK(error_of("SHOW \"a") == "unterminated quoted string");   // (PostgreSQL's text for both quotes)
  CHECK(error_of("TIMELINE_HISTORY 99999999999") == "syntax error at or near \"99999999999\"");
  CHECK(error_of("SHOW a..b") == "syntax error at or near \".\"");
  CHECK(error_of("IDENTIFY_SYSTEM @") == "syntax error at or near \"@\"");
  // Identifiers fold to lower case (quoted ones keep their case) and are cut at 63 bytes, never
  // inside a UTF-8 character, quoted or not, each cut with PostgreSQL's NOTICE.
  CHECK(parsed("DROP_REPLICATION_SLOT MiXeD").name == "mixed");
  CHECK(parsed("DROP_REPLICATION_SLOT " + std::string(70, 'a')).name == std::string(63, 'a'));
  const std::string utf8 = std::string(62, 'a') + "\xc3\xa9" + "z";   // é across the 63rd byte
  CHECK(parsed("DROP_REPLICATION_SLOT " + utf8).name == std::string(62, 'a'));
  CHECK(parsed("DROP_REPLICATION_SLOT \"" + std::string(70, 'A') + "\"").name == std::string(63, 'A'));
  {
    auto r = parse_replication_command("DROP_REPLICATION_SLOT \"" + std::string(64, 'A') + "\"");
    REQUIRE(r.notices.size() == 1);
    CHECK(r.notices[0] == "identifier \"" + std::string(64, 'A') + "\" will be truncated to \"" + std::string(63, 'A') + "\"");
    CHECK(parse_replication_command("DROP_REPLICATION_SLOT " + std::string(63, 'a')).notices.empty());
    CHECK(parse_replication_command("IDENTIFY_SYSTEM").notices.empty());
  }
  CHECK(parsed("DROP_REPLICATION_SLOT \"a\"\"b\"").name == "a\"b");
  // A word that starts like a number or an LSN is a word.
  CHECK(parsed("DROP_REPLICATION_SLOT abc1").name == "abc1");
  CHECK(parsed("DROP_REPLICATION_SLOT a_1$").name == "a_1$");
}

TEST_CASE("what the server answers: exact bytes, read back by the client's own parsers") {
  CHECK(build_authentication_ok() == std::string("R\0\0\0\x08\0\0\0\0", 9));
  CHECK(build_authentication_sasl({"SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"}) ==
        std::string("R\0\0\0\x2a\0\0\0\x0a", 9) + std::string("SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0", 34));
  {
    const std::string m = build_authentication_sasl_continue("r=abc,s=c2FsdA==,i=4096");
    auto s = split_backend_message(bv(m));
    REQUIRE(s.status == split_status::ready);
    auto a = parse_authentication(s.message.body);
    REQUIRE(a.has_value());
    CHECK(a->code == auth_code::sasl_continue);
    CHECK(as_string_view(a->sasl_data) == "r=abc,s=c2FsdA==,i=4096");
  }
  CHECK(build_parameter_status("server_version", "18.1") == std::string("S\0\0\0\x18server_version\0" "18.1\0", 25));
  CHECK(build_parameter_status(std::string_view("a\0b", 3), "x").empty());
  CHECK(build_backend_key_data(7, -1) == std::string("K\0\0\0\x0c\0\0\0\x07\xff\xff\xff\xff", 13));
  CHECK(build_ready_for_query('I') == std::string("Z\0\0\0\x05I", 6));
  CHECK(build_empty_query_response() == std::string("I\0\0\0\x04", 5));
  CHECK(build_copy_both_response() == std::string("W\0\0\0\x07\0\0\0", 8));
  CHECK(build_command_complete("IDENTIFY_SYSTEM") == std::string("C\0\0\0\x14IDENTIFY_SYSTEM\0", 21));
  CHECK(build_negotiate_protocol_version(0, {"_pq_.x"}) == std::string("v\0\0\0\x13\0\x03\0\0\0\0\0\x01_pq_.x\0", 20));
  {
    server_notice n;
    n.severity = "FATAL";
    n.sqlstate = "28P01";
    n.message = "password authentication failed for user \"u\"";
    const std::string m = build_error_response(n);
    CHECK(m == std::string("E\0\0\0\x47", 5) + std::string("SFATAL\0VFATAL\0C28P01\0M", 22) + n.message + std::string("\0\0", 2));
    auto s = split_backend_message(bv(m));
    REQUIRE(s.status == split_status::ready);
    auto back = parse_error_or_notice(s.message.body);
    REQUIRE(back.has_value());
    CHECK(back->severity == "FATAL");
    CHECK(back->sqlstate == "28P01");
    CHECK(back->message == n.message);
    n.severity = "ERROR";
    n.detail = "d";
    n.hint = "h";
    auto again = parse_error_or_notice(split_backend_message(bv(build_error_response(n))).message.body);
    REQUIRE(again.has_value());
    CHECK(again->detail == "d");
    CHECK(again->hint == "h");
    CHECK(build_error_response(n, false)[0] == 'N');
  }
  {
    // IDENTIFY_SYSTEM's answer: four text columns, one row.
    std::vector<field_description> f(4);
    const char* names[] = {"systemid", "timeline", "xlogpos", "dbname"};
    const std::uint32_t types[] = {25, 23, 25, 25};
    for (int i = 0; i < 4; ++i) {
      f[static_cast<std::size_t>(i)].name = names[i];
      f[static_cast<std::size_t>(i)].type_oid = types[i];
      f[static_cast<std::size_t>(i)].type_size = static_cast<std::int16_t>(types[i] == 23 ? 4 : -1);
    }
    const std::string t = build_row_description(f);
    auto back = parse_row_description(split_backend_message(bv(t)).message.body);
    REQUIRE(back.has_value());
    REQUIRE(back->size() == 4);
    CHECK((*back)[2].name == "xlogpos");
    CHECK((*back)[1].type_oid == 23u);
    CHECK((*back)[1].type_size == 4);
    const std::string d = build_data_row({std::string_view("7412345678901234567"), std::string_view("1"), std::string_view("0/16B3748"),
                                          std::nullopt});
    auto row = parse_data_row(split_backend_message(bv(d)).message.body);
    REQUIRE(row.has_value());
    REQUIRE(row->size() == 4);
    CHECK((*row)[0] == std::string_view("7412345678901234567"));
    CHECK_FALSE((*row)[3]);
    CHECK(d == std::string("D\0\0\0\x33\0\x04", 7) + be32(19) + "7412345678901234567" + be32(1) + "1" + be32(9) + "0/16B3748" +
                   be32(0xffffffff));
  }
}
