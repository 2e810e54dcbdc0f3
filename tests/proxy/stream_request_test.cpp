// The server's pieces that need no socket: request parameters, filters, the frame header walgate
// writes itself for WebSocket clients without permessage-deflate.
#include "walgate/proxy/http_policy.hpp"
#include "walgate/proxy/event_filter.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace walgate::proxy;

namespace {
std::string header(std::uint64_t n, bool first = true, bool fin = true) {
  char out[10];
  return std::string(out, websocket_text_frame_header(out, n, first, fin));
}
}  // namespace

TEST_CASE("WebSocket text frame headers, exact bytes (RFC 6455 5.2: 7-bit, 16-bit, 64-bit lengths)") {
  using namespace std::string_literals;
  CHECK(header(0) == "\x81\x00"s);
  CHECK(header(5) == "\x81\x05"s);
  CHECK(header(125) == "\x81\x7d"s);
  CHECK(header(126) == "\x81\x7e\x00\x7e"s);
  CHECK(header(361) == "\x81\x7e\x01\x69"s);
  CHECK(header(65535) == "\x81\x7e\xff\xff"s);
  CHECK(header(65536) == "\x81\x7f\x00\x00\x00\x00\x00\x01\x00\x00"s);
  CHECK(header(0x0102030405060708ULL) == "\x81\x7f\x01\x02\x03\x04\x05\x06\x07\x08"s);
  // A message in fragments (5.4): text without FIN, continuations, the last with FIN.
  CHECK(header(262144, true, false) == "\x01\x7f\x00\x00\x00\x00\x00\x04\x00\x00"s);
  CHECK(header(300, false, false) == "\x00\x7e\x01\x2c"s);
  CHECK(header(7, false, true) == "\x80\x07"s);
}

TEST_CASE("stream parameters: formats, filters, resume ids; a bad one names itself") {
  request_error err;
  auto r = parse_stream_query("/v1/stream?format=wal2json&tables=public.*,app.orders&ops=insert,delete&from=0/16B3748:3", err);
  REQUIRE(r);
  CHECK(r->fmt == walgate::transform::format::wal2json);
  REQUIRE(r->tables.size() == 2);
  CHECK(r->tables[0] == table_pattern{"public", "", true});
  CHECK(r->tables[1] == table_pattern{"app", "orders", false});
  REQUIRE(r->from);
  CHECK(r->from->to_string() == "0/16B3748:3");
  logged_event e;
  e.schema = "app";
  e.table = "orders";
  e.kind = walgate::transform::op::insert;
  CHECK(matches(*r, e));
  e.kind = walgate::transform::op::update;
  CHECK_FALSE(matches(*r, e));
  // A read (the initial snapshot's rows in the log) is an insert to ops=, as to grants.
  e.kind = walgate::transform::op::read;
  CHECK(matches(*r, e));
  auto changes = parse_stream_query("/v1/stream?ops=insert,update,delete", err);
  REQUIRE(changes);
  CHECK(matches(*changes, e));
  auto no_insert = parse_stream_query("/v1/stream?ops=update,delete", err);
  REQUIRE(no_insert);
  CHECK_FALSE(matches(*no_insert, e));
  e.kind = walgate::transform::op::update;
  CHECK(matches(*no_insert, e));
  e.kind = walgate::transform::op::delete_;
  e.table = "other";
  CHECK_FALSE(matches(*r, e));
  e.schema = "public";
  CHECK(matches(*r, e));
  for (auto [target, parameter] : {std::pair{"/v1/stream?format=xml", "format"}, {"/v1/stream?ops=upsert", "ops"},
                                   {"/v1/stream?tables=nodot", "tables"}, {"/v1/stream?from=12", "from"}}) {
    INFO(target);
    CHECK_FALSE(parse_stream_query(target, err));
    CHECK(err.parameter == parameter);
  }
}

TEST_CASE("table names: plain or in SQL's quoted form, in tables= and --create-publication") {
  std::string why;
  auto l = parse_table_list(R"("My Schema"."Order Items",public.*,"a""b"."*",s."x,y.z",Sch.Tab)", true, false, why);
  REQUIRE_MESSAGE(l, why);
  REQUIRE(l->size() == 5);
  CHECK((*l)[0] == table_pattern{"My Schema", "Order Items", false});
  CHECK((*l)[1] == table_pattern{"public", "", true});
  CHECK((*l)[2] == table_pattern{"a\"b", "*", false});   // a table named *, not a wildcard
  CHECK((*l)[3] == table_pattern{"s", "x,y.z", false});
  CHECK((*l)[4] == table_pattern{"Sch", "Tab", false});   // as stored: no case folding
  CHECK(sql_table_name((*l)[0]) == R"("My Schema"."Order Items")");
  CHECK(sql_table_name((*l)[2]) == R"("a""b"."*")");
  // Each written back quoted parses to itself.
  for (const auto& t : *l) {
    auto again = parse_table_list(sql_table_name(t), true, false, why);
    REQUIRE(again);
    CHECK((*again)[0] == t);
  }
  // --create-publication: a bare table name is allowed, schema.* is not.
  auto p = parse_table_list(R"(orders, "App" . "Line Items" )", false, true, why);
  REQUIRE(p);
  CHECK((*p)[0] == table_pattern{"", "orders", false});
  CHECK_FALSE(parse_table_list("public.*", false, true, why));
  for (const char* bad : {"", "a", "a.", ".b", "a.b.c", "a b.c", "\"a.b", "\"\".b", "a.\"b\"c", "a.b,", ",a.b", "a.b c", "a b", "a.b, ,c.d",
                          "*.b", "a.b;c"}) {
    INFO(bad);
    CHECK_FALSE(parse_table_list(bad, true, false, why));
    CHECK_FALSE(why.empty());
  }
  CHECK_FALSE(parse_table_list(std::string(64, 'x') + ".t", true, false, why));
  CHECK(parse_table_list(std::string(63, 'x') + ".t", true, false, why));
  // In a URL, percent-encoded.
  request_error err;
  auto r = parse_stream_query("/v1/stream?tables=%22My%20Schema%22.%22Order%20Items%22", err);
  REQUIRE(r);
  CHECK(r->tables == std::vector<table_pattern>{{"My Schema", "Order Items", false}});
}

TEST_CASE("origins: none, the gateway's own, the allowed ones, or any with *") {
  using walgate::proxy::origin_allowed;
  const std::vector<std::string> none, app = {"https://app.example", "http://localhost:3000"}, any = {"*"};
  CHECK(origin_allowed("", "127.0.0.1:8080", none));                        // curl, same-origin GETs
  CHECK(origin_allowed("http://127.0.0.1:8080", "127.0.0.1:8080", none));   // the live page
  CHECK(origin_allowed("HTTP://Gateway.Example", "gateway.example", none));
  CHECK_FALSE(origin_allowed("http://127.0.0.1:8081", "127.0.0.1:8080", none));
  CHECK_FALSE(origin_allowed("http://evil.example", "127.0.0.1:8080", none));
  CHECK_FALSE(origin_allowed("null", "127.0.0.1:8080", none));               // sandboxed frames, file://
  CHECK_FALSE(origin_allowed("ftp://127.0.0.1:8080", "127.0.0.1:8080", none));
  CHECK_FALSE(origin_allowed("http://127.0.0.1:8080", "", none));
  CHECK(origin_allowed("https://APP.example", "127.0.0.1:8080", app));
  CHECK(origin_allowed("http://localhost:3000", "127.0.0.1:8080", app));
  CHECK_FALSE(origin_allowed("http://localhost:3001", "127.0.0.1:8080", app));
  CHECK_FALSE(origin_allowed("https://app.example.evil", "127.0.0.1:8080", app));
  CHECK(origin_allowed("http://anything.example", "127.0.0.1:8080", any));
}

TEST_CASE("tables= by hash: the index finds exactly what the names match, one at a time") {
  request_error err;
  std::string q = "/v1/stream?tables=sales.*,%22Odd%20Schema%22.%22T%22";
  for (int i = 0; i < 1000; ++i) q += ",app.t" + std::to_string(i);
  auto r = parse_stream_query(q, err);
  REQUIRE_MESSAGE(r, err.message);
  REQUIRE(r->tables.size() == 1002);
  const table_index index(r->tables);
  logged_event e;
  e.kind = walgate::transform::op::insert;
  for (const auto& [schema, table] : std::vector<std::pair<std::string, std::string>>{
           {"sales", "anything"}, {"Odd Schema", "T"}, {"Odd Schema", "t"}, {"app", "t0"}, {"app", "t999"},
           {"app", "t1000"}, {"app", "t"}, {"public", "t1"}, {"", ""}, {"sales", ""}}) {
    e.schema = schema;
    e.table = table;
    CAPTURE(schema + "." + table);
    CHECK(matches(*r, e, &index) == matches(*r, e));
  }
  e.schema = "app";
  e.table = "t999";
  CHECK(matches(*r, e, &index));
  e.table = "t1000";
  CHECK_FALSE(matches(*r, e, &index));
}

TEST_CASE("Host names a loopback listener serves: localhost, loopback addresses, the allowed ones") {
  using walgate::proxy::loopback_host_allowed;
  const std::vector<std::string> none, proxy = {"Gateway.Example"}, any = {"*"};
  for (const char* h : {"", "localhost", "localhost:8080", "LOCALHOST.", "app.localhost:1", "127.0.0.1:8080",
                        "127.1.2.3", "[::1]:8080", "[::1]"})
    CHECK_MESSAGE(loopback_host_allowed(h, none), h);
  for (const char* h : {"evil.example", "evil.example:8080", "127.0.0.1.evil.example", "127.0.0.256", "127.0.0",
                        "10.0.0.1:8080", "[::2]:80", "[::1", "localhost.evil", "xlocalhost"})
    CHECK_FALSE_MESSAGE(loopback_host_allowed(h, none), h);
  CHECK(loopback_host_allowed("gateway.example:443", proxy));
  CHECK_FALSE(loopback_host_allowed("other.example", proxy));
  CHECK(loopback_host_allowed("anything.example", any));
  // Without authentication on another address: the machine's address literals pass too, names not.
  for (const char* h : {"10.1.2.3", "10.1.2.3:8080", "[fd00::1]:80", "[2001:db8::1]", "192.168.0.255"})
    CHECK_MESSAGE(loopback_host_allowed(h, none, true), h);
  for (const char* h : {"10.1.2.3.evil.example", "10.1.2", "10.1.2.256", "1.2.3.4.5", "[fd00::1", "[evil]:80", "evil.example"})
    CHECK_FALSE_MESSAGE(loopback_host_allowed(h, none, true), h);
  CHECK_FALSE(loopback_host_allowed("10.1.2.3", none));   // (a loopback listener: loopback addresses only)
}

TEST_CASE("transactions=: true or false, unset by default; refused for formats without transaction records") {
  request_error err;
  auto r = parse_stream_query("/v1/stream?format=wal2json", err);
  REQUIRE(r);
  CHECK_FALSE(r->transactions);   // (the server decides: on for wal2json)
  r = parse_stream_query("/v1/stream?format=wal2json&transactions=false", err);
  REQUIRE(r);
  CHECK(r->transactions == false);
  r = parse_stream_query("/v1/stream?transactions=true&from=0/16B3748:B", err);
  REQUIRE(r);
  CHECK(r->transactions == true);
  CHECK(r->from->to_string() == "0/16B3748:B");
  for (const char* f : {"waltail", "pgoutput2json", "pgoutput2json-compact"}) {
    CHECK_FALSE(parse_stream_query(std::string("/v1/stream?transactions=true&format=") + f, err));
    CHECK(err.parameter == "transactions");
    CHECK(err.message.find("has no transaction records") != std::string::npos);
    CHECK(parse_stream_query(std::string("/v1/stream?transactions=false&format=") + f, err));
  }
  CHECK_FALSE(parse_stream_query("/v1/stream?transactions=maybe", err));
  CHECK(err.parameter == "transactions");
}

TEST_CASE("prefixes= and message_events=: globs over logical message prefixes") {
  CHECK(glob_match("audit", "audit"));
  CHECK_FALSE(glob_match("audit", "audits"));
  CHECK(glob_match("audit.*", "audit.login"));
  CHECK(glob_match("audit.*", "audit."));
  CHECK_FALSE(glob_match("audit.*", "audit"));
  CHECK(glob_match("*", ""));
  CHECK(glob_match("a?c", "abc"));
  CHECK_FALSE(glob_match("a?c", "ac"));
  CHECK(glob_match("*.login.*", "x.login.y"));
  CHECK(glob_match("a*b*c", "aXXbYYbZc"));
  CHECK_FALSE(glob_match("a*b*c", "aXXbYYbZ"));
  CHECK(glob_match(std::string(50, '*') + "x", std::string(5000, 'a') + "x"));   // (no blow-up)
  request_error err;
  auto r = parse_stream_query("/v1/stream?prefixes=audit.*,jobs&tables=public.orders&message_events=true", err);
  REQUIRE(r);
  CHECK(r->prefixes == std::vector<std::string>{"audit.*", "jobs"});
  CHECK(r->message_events);
  CHECK_FALSE(parse_stream_query("/v1/stream?prefixes=a,,b", err));
  CHECK(err.parameter == "prefixes");
  CHECK_FALSE(parse_stream_query("/v1/stream?prefixes=a&ops=insert", err));
  CHECK(err.message == "prefixes selects logical messages: add message to ops");
  CHECK(parse_stream_query("/v1/stream?prefixes=a&ops=insert,message", err));
}
