#include "walgate/protocol/backend.hpp"

#include "split_helpers.hpp"

#include <doctest/doctest.h>

#include <deque>

using namespace walgate::protocol;
using walgate::test::for_every_split;
using namespace std::string_literals;

namespace {
// Parsed views point into the body, so bodies are kept alive for the whole test run.
template <class F>
auto parse(F f, std::string body) {
  static std::deque<std::string> bodies;
  return f(as_bytes(bodies.emplace_back(std::move(body))));
}
}  // namespace

TEST_CASE("split: one message, at every offset, and two in one buffer") {
  std::string z = "Z\x00\x00\x00\x05I"s;
  std::string c = "C\x00\x00\x00\x0dSELECT 1\0"s;
  for_every_split(z + c, [&](const auto& msgs) {
    REQUIRE(msgs.size() == 2);
    CHECK(msgs[0].first == 'Z');
    CHECK(msgs[0].second == "I");
    CHECK(msgs[1].first == 'C');
    CHECK(msgs[1].second == "SELECT 1\0"s);
  });
}

TEST_CASE("split: an empty body and need-more at every prefix") {
  std::string m = "c\x00\x00\x00\x04"s;
  for (std::size_t i = 0; i < m.size(); ++i)
    CHECK(split_backend_message(as_bytes(m.substr(0, i))).status == split_status::need_more);
  auto r = split_backend_message(as_bytes(m));
  REQUIRE(r.status == split_status::ready);
  CHECK(r.message.tag == 'c');
  CHECK(r.message.body.empty());
  CHECK(r.message.size == 5);
}

TEST_CASE("split: a length below 4 or over the limit is an error before any allocation") {
  CHECK(split_backend_message(as_bytes("d\x00\x00\x00\x03"s)).status == split_status::error);
  CHECK(split_backend_message(as_bytes("d\xff\xff\xff\xff"s)).status == split_status::error);
  auto r = split_backend_message(as_bytes("d\x00\x01\x00\x05"s), 65536);
  CHECK(r.status == split_status::error);
  CHECK(r.error.code == errc::length_out_of_range);
  // Exactly at the limit is fine (and needs more data).
  CHECK(split_backend_message(as_bytes("d\x00\x01\x00\x04"s), 65536).status == split_status::need_more);
}

TEST_CASE("authentication requests") {
  auto ok = parse(parse_authentication, "\x00\x00\x00\x00"s);
  REQUIRE(ok);
  CHECK(ok->code == auth_code::ok);

  auto md5 = parse(parse_authentication, "\x00\x00\x00\x05\x01\x02\x03\x04"s);
  REQUIRE(md5);
  CHECK(md5->code == auth_code::md5_password);
  CHECK(as_string_view(md5->md5_salt) == "\x01\x02\x03\x04");
  CHECK_FALSE(parse(parse_authentication, "\x00\x00\x00\x05\x01\x02\x03"s));

  auto sasl = parse(parse_authentication, "\x00\x00\x00\x0aSCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0"s);
  REQUIRE(sasl);
  REQUIRE(sasl->mechanisms.size() == 2);
  CHECK(sasl->mechanisms[0] == "SCRAM-SHA-256-PLUS");
  CHECK(sasl->mechanisms[1] == "SCRAM-SHA-256");
  CHECK_FALSE(parse(parse_authentication, "\x00\x00\x00\x0aSCRAM-SHA-256\0"s));   // list not terminated

  auto cont = parse(parse_authentication, "\x00\x00\x00\x0br=abc,s=xyz,i=4096"s);
  REQUIRE(cont);
  CHECK(cont->code == auth_code::sasl_continue);
  CHECK(as_string_view(cont->sasl_data) == "r=abc,s=xyz,i=4096");

  auto clear = parse(parse_authentication, "\x00\x00\x00\x03"s);
  REQUIRE(clear);
  CHECK(clear->code == auth_code::cleartext_password);
  CHECK_FALSE(parse(parse_authentication, "\x00\x00\x00\x03x"s));   // trailing byte
  CHECK_FALSE(parse(parse_authentication, "\x00\x00"s));
  CHECK(auth_code_name(auth_code::gss) == "GSSAPI");
}

TEST_CASE("ErrorResponse fields and the text shown to the user") {
  std::string body = "SERROR\0VERROR\0C42501\0Mmust be superuser or replication role to start walsender\0"
                     "Ddetail here\0Hhint here\0Fpostinit.c\0L900\0\0"s;
  auto n = parse(parse_error_or_notice, body);
  REQUIRE(n);
  CHECK(n->severity == "ERROR");
  CHECK(n->sqlstate == "42501");
  CHECK(n->message == "must be superuser or replication role to start walsender");
  CHECK(n->to_string() ==
        "ERROR:  must be superuser or replication role to start walsender (SQLSTATE 42501)\n"
        "DETAIL:  detail here\nHINT:  hint here");
  // localized severity only (pre-9.6 servers)
  auto old = parse(parse_error_or_notice, "SFATAL\0Mbye\0\0"s);
  REQUIRE(old);
  CHECK(old->severity == "FATAL");
  CHECK_FALSE(parse(parse_error_or_notice, "SERROR\0Mno terminator\0"s));
  CHECK_FALSE(parse(parse_error_or_notice, "SERROR"s));
  CHECK_FALSE(parse(parse_error_or_notice, "\0extra"s));
}

TEST_CASE("ParameterStatus, BackendKeyData, ReadyForQuery") {
  auto p = parse(parse_parameter_status, "server_version\00015.18\0"s);
  REQUIRE(p);
  CHECK(p->name == "server_version");
  CHECK(p->value == "15.18");
  CHECK_FALSE(parse(parse_parameter_status, "server_version\0"s));

  auto k = parse(parse_backend_key_data, "\x00\x00\x30\x39\xde\xad\xbe\xef"s);
  REQUIRE(k);
  CHECK(k->pid == 12345);
  CHECK(k->secret.size() == 4);
  CHECK_FALSE(parse(parse_backend_key_data, "\x00\x00\x30\x39\xde"s));

  CHECK(*parse(parse_ready_for_query, "I"s) == 'I');
  CHECK(*parse(parse_ready_for_query, "T"s) == 'T');
  CHECK_FALSE(parse(parse_ready_for_query, "X"s));
  CHECK_FALSE(parse(parse_ready_for_query, "II"s));
  CHECK_FALSE(parse(parse_ready_for_query, ""s));
}

TEST_CASE("RowDescription and DataRow") {
  std::string rd = "\x00\x02"s + "systemid\0"s + "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x19\xff\xff\xff\xff\xff\xff\x00\x00"s +
                   "timeline\0"s + "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x14\x00\x08\xff\xff\xff\xff\x00\x00"s;
  auto cols = parse(parse_row_description, rd);
  REQUIRE(cols);
  REQUIRE(cols->size() == 2);
  CHECK((*cols)[0].name == "systemid");
  CHECK((*cols)[0].type_oid == 25);
  CHECK((*cols)[1].name == "timeline");
  CHECK((*cols)[1].type_oid == 20);
  CHECK((*cols)[1].type_size == 8);
  CHECK_FALSE(parse(parse_row_description, rd.substr(0, rd.size() - 1)));
  CHECK_FALSE(parse(parse_row_description, "\x07\x00"s));   // over MaxTupleAttributeNumber

  auto row = parse(parse_data_row, "\x00\x03\x00\x00\x00\x02hi\xff\xff\xff\xff\x00\x00\x00\x00"s);
  REQUIRE(row);
  REQUIRE(row->size() == 3);
  CHECK(*(*row)[0] == "hi");
  CHECK_FALSE((*row)[1]);
  CHECK((*row)[2]->empty());
  CHECK_FALSE(parse(parse_data_row, "\x00\x01\x00\x00\x00\x05hi"s));          // length past the end
  CHECK_FALSE(parse(parse_data_row, "\x00\x01\xff\xff\xff\xfehi"s));          // -2
  CHECK_FALSE(parse(parse_data_row, "\x00\x01\x7f\xff\xff\xff"s));            // huge, no allocation
}

TEST_CASE("CommandComplete and CopyBothResponse") {
  CHECK(*parse(parse_command_complete, "SELECT 3\0"s) == "SELECT 3");
  CHECK_FALSE(parse(parse_command_complete, "SELECT 3"s));
  auto c = parse(parse_copy_response, "\x00\x00\x00"s);
  REQUIRE(c);
  CHECK(c->format == 0);
  CHECK(c->columns == 0);
  CHECK(parse(parse_copy_response, "\x01\x00\x01\x00\x01"s));
  CHECK_FALSE(parse(parse_copy_response, "\x00\x00\x02\x00\x00"s));   // second format missing
  CHECK_FALSE(parse(parse_copy_response, "\x02\x00\x00"s));
}

TEST_CASE("frontend builders produce exact bytes") {
  CHECK(build_ssl_request() == "\x00\x00\x00\x08\x04\xd2\x16\x2f"s);
  CHECK(build_startup({{"user", "u"}, {"replication", "database"}}) ==
        "\x00\x00\x00\x25\x00\x03\x00\x00user\0u\0replication\0database\0\0"s);
  CHECK(build_startup({{"user", "a\0b"s}}).empty());
  CHECK(build_password("md5abc") == "p\x00\x00\x00\x0bmd5abc\0"s);
  CHECK(build_sasl_initial_response("SCRAM-SHA-256", "n,,n=,r=x") ==
        "p\x00\x00\x00\x1fSCRAM-SHA-256\0\x00\x00\x00\x09n,,n=,r=x"s);
  CHECK(build_sasl_response("c=biws") == "p\x00\x00\x00\x0a" "c=biws"s);
  CHECK(build_query("IDENTIFY_SYSTEM") == "Q\x00\x00\x00\x14IDENTIFY_SYSTEM\0"s);
  CHECK(build_query("a\0b"s).empty());
  CHECK(build_copy_data("xy") == "d\x00\x00\x00\x06xy"s);
  CHECK(build_copy_done() == "c\x00\x00\x00\x04"s);
  CHECK(build_terminate() == "X\x00\x00\x00\x04"s);
  CHECK(build_backend_message('Z', "I") == "Z\x00\x00\x00\x05I"s);
}
