// Bearer tokens at the edge, end to end on a real PostgreSQL: every stream endpoint refuses a
// request without a valid token (401 with a Bearer challenge, a WebSocket upgrade the same way),
// takes one from each place a client can put it, ends a stream when its token expires with the
// reason and the resume id (NDJSON/SSE end line, WebSocket close 4001, /v1/mux end messages) and
// resumes it with a fresh token with no gap and no duplicate; keys rotated while clients stream.
#include "walgate/proxy/auth.hpp"

#include "gateway_harness.hpp"
#include "jwt_helpers.hpp"
#include "temp_dir.hpp"
#include "test_cluster.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <mutex>

#include <sys/resource.h>

using namespace walgate;
using namespace walgate::test::harness;

namespace {

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}

/// A server option set with JWT authentication from a JWKS file of the given keys.
struct auth_setup {
  test::temp_dir dir{"walgate-auth"};
  std::filesystem::path jwks = dir.path / "jwks.json";
  std::shared_ptr<authenticator> auth;
  server_options so;
  explicit auth_setup(const std::string& keys_json, std::chrono::seconds leeway = std::chrono::seconds(0)) {
    write_file(jwks, "{\"keys\":[" + keys_json + "]}");
    auth_options o;
    o.jwks_file = jwks;
    o.claims.leeway = leeway;
    auth = std::make_shared<authenticator>(o);
    std::string error;
    REQUIRE_MESSAGE(auth->reload(error), error);
    so.auth = auth;
  }
  /// Grants from this policy (TOML), in a file of its own, read now.
  void use_policy(const std::string& toml) {
    const auto file = dir.path / "policy.toml";
    write_file(file, toml);
    auth_options o = auth->options();
    o.policy_file = file;
    so.auth = auth = std::make_shared<authenticator>(o);
    std::string error;
    REQUIRE_MESSAGE(auth->reload(error), error);
  }
};

const char* upgrade_headers = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

/// A socket to the gateway on 127.0.0.1 from the local address from (empty: any). Another
/// loopback address than 127.0.0.1 (Linux routes all of 127.0.0.0/8 to lo) is another client
/// address to the gateway's per-address limits.
void connect_from(tcp::socket& s, std::uint16_t port, const std::string& from) {
  if (!from.empty()) {
    s.open(tcp::v4());
    s.bind({asio::ip::make_address(from), 0});
  }
  s.connect({asio::ip::make_address("127.0.0.1"), port});
}

/// A request's status, WWW-Authenticate and body.
struct answer {
  unsigned status = 0;
  std::string challenge, body, retry_after;
};
answer request(std::uint16_t port, const std::string& target, const std::string& headers = "", const std::string& from = "") {
  asio::io_context io;
  tcp::socket s(io);
  connect_from(s, port, from);
  set_timeout(s, 10000);
  asio::write(s, asio::buffer("GET " + target + " HTTP/1.1\r\nHost: localhost\r\n" + headers + "\r\n"));
  beast::flat_buffer b;
  http::response<http::string_body> res;
  boost::system::error_code ec;
  http::read(s, b, res, ec);
  return {res.result_int(), std::string(res[http::field::www_authenticate]), res.body(), std::string(res[http::field::retry_after])};
}

/// The status of a request from the local address from, its header alone read: a stream's 200
/// is seen without waiting for a body that does not end (the connection closes on return).
unsigned status_from(std::uint16_t port, const std::string& target, const std::string& headers, const std::string& from) {
  asio::io_context io;
  tcp::socket s(io);
  connect_from(s, port, from);
  set_timeout(s, 10000);
  asio::write(s, asio::buffer("GET " + target + " HTTP/1.1\r\nHost: localhost\r\n" + headers + "\r\n"));
  beast::flat_buffer b;
  http::response_parser<http::string_body> p;
  boost::system::error_code ec;
  http::read_header(s, b, p, ec);
  return ec ? 0 : p.get().result_int();
}

/// /metrics as an operator reads it with --auth jwt: with a token that carries the admin claim
/// (the default --metrics-claim, walgate_admin=true); from: as request()'s.
std::string admin_metrics(std::uint16_t port, const std::string& token, const std::string& from = "") {
  auto a = request(port, "/metrics", "Authorization: Bearer " + token + "\r\n", from);
  REQUIRE_MESSAGE(a.status == 200, a.body);
  return a.body;
}
/// The value of an unlabelled metric in admin_metrics() (required to be there).
long long admin_metric(std::uint16_t port, const std::string& token, const std::string& name) {
  const auto m = admin_metrics(port, token);
  auto at = m.find("\n" + name + " ");
  REQUIRE_MESSAGE(at != std::string::npos, name << " not in /metrics");
  return std::atoll(m.c_str() + at + name.size() + 2);
}

/// A WebSocket client that offers subprotocols (and sends headers) of its choice.
struct ws_with {
  asio::io_context io;
  websocket::stream<tcp::socket> ws{io};
  websocket::response_type res;
  boost::system::error_code ec;
  ws_with(std::uint16_t port, const std::string& target, const std::string& protocols, const std::string& bearer = "") {
    ws.next_layer().connect({asio::ip::make_address("127.0.0.1"), port});
    set_timeout(ws.next_layer(), 10000);
    ws.set_option(websocket::stream_base::decorator([protocols, bearer](websocket::request_type& r) {
      if (!protocols.empty()) r.set(http::field::sec_websocket_protocol, protocols);
      if (!bearer.empty()) r.set(http::field::authorization, "Bearer " + bearer);
    }));
    ws.handshake(res, "localhost", target, ec);
  }
  std::string next() {
    beast::flat_buffer b;
    boost::system::error_code e;
    ws.read(b, e);
    return e ? std::string() : beast::buffers_to_string(b.data());
  }
  websocket::close_reason wait_close() {
    beast::flat_buffer b;
    boost::system::error_code e;
    while (!e) ws.read(b, e), b.consume(b.size());
    return ws.reason();
  }
};

}  // namespace

TEST_CASE("bearer tokens on every stream endpoint: none, a bad one, one in two places, one from each place") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE auth_a(id int PRIMARY KEY, v text); CREATE PUBLICATION auth_a_pub FOR TABLE auth_a");
  auto key = test::ec_key("ES256"), other = test::ec_key("ES256");
  auth_setup setup(key.jwk("k1"));
  running_gateway g("auth_a_slot", "auth_a_pub", setup.so);
  const std::string good = test::token(key, "", "k1");

  // No token: 401 with the challenge and no error code (RFC 6750 3.1), on each endpoint.
  for (std::string target : {"/v1/stream", "/v1/stream?format=debezium"}) {
    auto a = request(g.port(), target);
    CHECK(a.status == 401);
    CHECK(a.challenge == "Bearer realm=\"walgate\"");
    CHECK(a.body.find("a bearer token is required") != std::string::npos);
  }
  for (std::string target : {"/v1/ws", "/v1/mux"}) {
    auto a = request(g.port(), target, upgrade_headers);
    CHECK(a.status == 401);
    CHECK(a.challenge == "Bearer realm=\"walgate\"");
  }
  // The same for an SSE client (Accept: text/event-stream) and a browser's WebSocket.
  CHECK(request(g.port(), "/v1/stream", "Accept: text/event-stream\r\n").status == 401);
  {
    ws_with w(g.port(), "/v1/ws", "");
    CHECK(w.ec);   // the upgrade is refused
    CHECK(w.res.result_int() == 401);
  }
  // What needs no token: health, readiness, the page.
  CHECK(get_path(g.port(), "/healthz").first == 200);
  CHECK(get_path(g.port(), "/readyz").first == 200);
  CHECK(get_path(g.port(), "/").first == 200);

  // A bad token: 401 invalid_token with the reason (never anything about the key).
  struct bad_case {
    std::string token, reason;
  };
  for (const auto& [t, reason] : std::vector<bad_case>{
           {test::token(key, "", "k1", -5), "the token has expired"},
           {test::token(other, "", "k1"), "the token's signature is not valid"},
           {test::token(other, "", "k9"), "no key has the token's kid k9"},
           {"not-a-token", "not a JWT: three base64url parts separated by '.' are expected"},
       }) {
    for (std::string how : {"header", "query", "ws"}) {
      INFO(how << ": " << reason);
      answer a;
      if (how == "header") a = request(g.port(), "/v1/stream", "Authorization: Bearer " + t + "\r\n");
      else if (how == "query") a = request(g.port(), "/v1/stream?access_token=" + t);
      else a = request(g.port(), "/v1/ws", std::string(upgrade_headers) + "Sec-WebSocket-Protocol: walgate, bearer." + t + "\r\n");
      CHECK(a.status == 401);
      CHECK(a.challenge == "Bearer realm=\"walgate\", error=\"invalid_token\", error_description=\"" + reason + "\"");
      CHECK(a.body.find(reason) != std::string::npos);
      CHECK(a.body.find(t) == std::string::npos);   // the token is not echoed
    }
  }
  // Two places at once, or a malformed header: 400 invalid_request.
  {
    auto a = request(g.port(), "/v1/stream?access_token=" + good, "Authorization: Bearer " + good + "\r\n");
    CHECK(a.status == 400);
    CHECK(a.challenge.find("error=\"invalid_request\"") != std::string::npos);
    CHECK(request(g.port(), "/v1/stream", "Authorization: Bearer\r\n").status == 400);
    // A subprotocol token without walgate: the answer could not name an offered protocol.
    CHECK(request(g.port(), "/v1/ws", std::string(upgrade_headers) + "Sec-WebSocket-Protocol: bearer." + good + "\r\n").status == 400);
    // Another scheme is no token.
    CHECK(request(g.port(), "/v1/stream", "Authorization: Basic dXNlcjpwYXNz\r\n").status == 401);
    // A subscription message does not carry a token.
    ws_with m(g.port(), "/v1/mux?access_token=" + good, "");
    REQUIRE_FALSE(m.ec);
    m.ws.text(true);
    m.ws.write(asio::buffer(std::string(R"({"type":"subscribe","id":"a","access_token":"x"})")));
    auto reply = json::parse(m.next());
    CHECK(reply.at("status") == 400);
    CHECK(reply.at("parameter") == "access_token");
  }

  // Tokens up to 16 KiB, by every carrier (the request limits leave room for them); past it, the
  // token's own refusal (never 414 or 431 first).
  {
    std::string pad(11'500, 'p');
    const std::string big = test::token(key, R"("pad":")" + pad + "\"", "k1");
    REQUIRE(big.size() > 15'000);
    REQUIRE(big.size() <= 16 * 1024);
    stream_client h(g.port(), "/v1/stream", {{"Authorization", "Bearer " + big}});
    CHECK(h.status() == 200);
    stream_client q(g.port(), "/v1/stream?format=native&access_token=" + big);
    CHECK(q.status() == 200);
    ws_with w(g.port(), "/v1/ws", "walgate, bearer." + big);
    CHECK_FALSE(w.ec);
    const std::string over = test::token(key, R"("pad":")" + std::string(12'600, 'p') + "\"", "k1");
    auto a = request(g.port(), "/v1/stream", "Authorization: Bearer " + over + "\r\n");
    CHECK(a.status == 401);
    CHECK(a.body.find("the token is longer than 16384 bytes") != std::string::npos);
    CHECK(request(g.port(), "/v1/stream?access_token=" + over).status == 401);
  }
  // A good token from each place: the stream.
  stream_client ndjson(g.port(), "/v1/stream", {{"Authorization", "Bearer " + good}});
  REQUIRE(ndjson.status() == 200);
  stream_client sse(g.port(), "/v1/stream?access_token=" + good, {{"Accept", "text/event-stream"}});
  REQUIRE(sse.status() == 200);
  ws_with ws(g.port(), "/v1/ws", "walgate, bearer." + good);
  REQUIRE_FALSE(ws.ec);
  CHECK(ws.res[http::field::sec_websocket_protocol] == "walgate");   // never the token
  ws_with ws_header(g.port(), "/v1/ws", "", good);
  REQUIRE_FALSE(ws_header.ec);
  CHECK(ws_header.res[http::field::sec_websocket_protocol] == "");
  ws_with mux(g.port(), "/v1/mux", "walgate, bearer." + good);
  REQUIRE_FALSE(mux.ec);
  mux.ws.text(true);
  mux.ws.write(asio::buffer(std::string(R"({"type":"subscribe","id":"s"})")));
  CHECK(json::parse(mux.next()).at("type") == "subscribed");
  pg.sql("INSERT INTO auth_a VALUES (1, 'one')");
  auto e = ndjson.events(1);
  REQUIRE(e.size() == 1);
  CHECK(json::parse(e[0]).at("after").at("v") == "one");
  CHECK(sse.sse(1).size() == 1);
  CHECK(json::parse(ws.next()).at("after").at("v") == "one");
  CHECK(json::parse(ws_header.next()).at("after").at("v") == "one");
  CHECK(json::parse(mux.next()).at("data").at("after").at("v") == "one");
  auto m = admin_metrics(g.port(), test::token(key, R"("walgate_admin":true)", "k1"));
  CHECK(m.find("walgate_auth_tokens_accepted_total 10") != std::string::npos);   // (six streams', the three of 16 KiB, and /metrics' own)
  CHECK(m.find("walgate_auth_key_reloads_total 1") != std::string::npos);
}

TEST_CASE("a token that expires mid-stream ends the stream with where to resume; a fresh token resumes with no gap") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE auth_exp(id int PRIMARY KEY); CREATE PUBLICATION auth_exp_pub FOR TABLE auth_exp");
  auto key = test::ed25519_key();
  auth_setup setup(key.jwk("e"));
  running_gateway g("auth_exp_slot", "auth_exp_pub", setup.so);
  // Expires in 8 s (checked with no leeway here): time enough to connect and stream a little.
  const std::string brief = test::token(key, "", "e", 8), fresh = test::token(key, "", "e");
  stream_client ndjson(g.port(), "/v1/stream", {{"Authorization", "Bearer " + brief}});
  stream_client sse(g.port(), "/v1/stream?access_token=" + brief, {{"Accept", "text/event-stream"}});
  ws_with ws(g.port(), "/v1/ws?access_token=" + brief, "");
  ws_with mux(g.port(), "/v1/mux?access_token=" + brief, "");
  REQUIRE(ndjson.status() == 200);
  REQUIRE(sse.status() == 200);
  REQUIRE_FALSE(ws.ec);
  REQUIRE_FALSE(mux.ec);
  mux.ws.text(true);
  mux.ws.write(asio::buffer(std::string(R"({"type":"subscribe","id":"s"})")));
  REQUIRE(json::parse(mux.next()).at("type") == "subscribed");
  pg.sql("INSERT INTO auth_exp SELECT g FROM generate_series(1, 5) g");
  auto first = ndjson.events(5);
  REQUIRE(first.size() == 5);
  const std::string last_id = id_of(first.back());
  REQUIRE(sse.sse(5).size() == 5);
  for (int i = 0; i < 5; ++i) REQUIRE(!ws.next().empty());
  for (int i = 0; i < 5; ++i) REQUIRE(!mux.next().empty());

  // At exp: each says why it ends, and where to resume (after the last event it sent).
  const auto t0 = std::chrono::steady_clock::now();
  auto end = ndjson.events(1);
  REQUIRE(end.size() == 1);
  CHECK(end[0] == "{\"error\":\"the token expired\",\"resume_from\":\"" + last_id + "\"}");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  auto sse_end = sse.lines(3);
  std::string joined;
  for (const auto& l : sse_end) joined += l + "\n";
  CHECK(joined.find("the token expired") != std::string::npos);
  CHECK(joined.find(last_id) != std::string::npos);
  auto why = ws.wait_close();
  CHECK(why.code == 4001);
  CHECK(std::string(why.reason.data(), why.reason.size()) == "the token expired; resume from " + last_id);
  auto mux_end = json::parse(mux.next());
  CHECK(mux_end.at("type") == "end");
  CHECK(mux_end.at("reason") == "the token expired");
  CHECK(mux_end.at("resume_from") == json::value(last_id));
  auto mux_why = mux.wait_close();
  CHECK(mux_why.code == 4001);
  // The expired token is refused from now on.
  CHECK(request(g.port(), "/v1/stream", "Authorization: Bearer " + brief + "\r\n").status == 401);

  // Changes while they were away; then each resumes with a fresh token: exactly those.
  pg.sql("INSERT INTO auth_exp SELECT g FROM generate_series(6, 9) g");
  stream_client again(g.port(), "/v1/stream?from=" + last_id, {{"Authorization", "Bearer " + fresh}});
  REQUIRE(again.status() == 200);
  auto rest = again.events(4);
  REQUIRE(rest.size() == 4);
  for (int i = 0; i < 4; ++i) CHECK(json::parse(rest[static_cast<std::size_t>(i)]).at("after").at("id") == 6 + i);
  ws_with ws2(g.port(), "/v1/ws?from=" + last_id, "walgate, bearer." + fresh);
  REQUIRE_FALSE(ws2.ec);
  CHECK(json::parse(ws2.next()).at("after").at("id") == 6);
  auto m = admin_metrics(g.port(), test::token(key, R"("walgate_admin":true)", "e"));
  CHECK(m.find("walgate_auth_expired_streams_total 4") != std::string::npos);
}

TEST_CASE("keys rotated while clients stream: the streams go on, the new key's tokens are accepted, the old one's refused") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE auth_rot(id int PRIMARY KEY); CREATE PUBLICATION auth_rot_pub FOR TABLE auth_rot");
  auto old_key = test::rsa_key("RS256"), new_key = test::rsa_key("PS256");
  auth_setup setup(old_key.jwk("2026-11"));
  running_gateway g("auth_rot_slot", "auth_rot_pub", setup.so);
  stream_client before(g.port(), "/v1/stream", {{"Authorization", "Bearer " + test::token(old_key, "", "2026-11")}});
  REQUIRE(before.status() == 200);
  // The provider publishes the new key next to the old one, then drops the old one.
  auto reload = [&] {
    std::string error;
    std::atomic<bool> ok = false, done = false;
    asio::post(g.io, [&] {
      ok = setup.auth->reload(error);
      done = true;
    });
    REQUIRE(test::wait_until([&] { return done.load(); }));
    REQUIRE_MESSAGE(ok.load(), error);
  };
  write_file(setup.jwks, "{\"keys\":[" + old_key.jwk("2026-11") + "," + new_key.jwk("2026-12") + "]}");
  reload();
  stream_client both(g.port(), "/v1/stream", {{"Authorization", "Bearer " + test::token(new_key, "", "2026-12")}});
  REQUIRE(both.status() == 200);
  write_file(setup.jwks, "{\"keys\":[" + new_key.jwk("2026-12") + "]}");
  reload();
  CHECK(request(g.port(), "/v1/stream", "Authorization: Bearer " + test::token(old_key, "", "2026-11") + "\r\n").status == 401);
  stream_client after(g.port(), "/v1/stream", {{"Authorization", "Bearer " + test::token(new_key, "", "2026-12")}});
  REQUIRE(after.status() == 200);
  pg.sql("INSERT INTO auth_rot VALUES (1)");
  CHECK(before.events(1).size() == 1);   // connected with the old key: goes on until its token's exp
  CHECK(both.events(1).size() == 1);
  CHECK(after.events(1).size() == 1);
}

TEST_CASE("a token that expires in the year 3000 streams, and its expiry costs nothing meanwhile") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE auth_far(id int PRIMARY KEY); CREATE PUBLICATION auth_far_pub FOR TABLE auth_far");
  auto key = test::hmac_key("HS256", std::string(32, 'f'));
  auth_setup setup(key.jwk(), std::chrono::seconds(30));
  running_gateway g("auth_far_slot", "auth_far_pub", setup.so);
  const std::string far = test::sign(key, R"({"alg":"HS256"})", R"({"exp":32503680000})"),
                    farther = test::sign(key, R"({"alg":"HS256"})", R"({"exp":9.9e18})");
  stream_client a(g.port(), "/v1/stream", {{"Authorization", "Bearer " + far}});
  stream_client b(g.port(), "/v1/stream", {{"Authorization", "Bearer " + farther}});
  REQUIRE(a.status() == 200);
  REQUIRE(b.status() == 200);
  // The one timer for expiries sleeps (at most 10 s at a time): the process is idle.
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  getrusage(RUSAGE_SELF, &after);
  auto cpu = [](const rusage& r) { return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6; };
  CHECK(cpu(after) - cpu(before) < 0.5);
  pg.sql("INSERT INTO auth_far VALUES (1)");
  CHECK(a.events(1).size() == 1);
  CHECK(b.events(1).size() == 1);
}

TEST_CASE("--policy: each client gets only the tables and ops its claims grant, on every transport and format") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE gr_orders(id int PRIMARY KEY, v text); CREATE TABLE gr_secret(id int PRIMARY KEY, v text);"
         "CREATE TABLE gr_prod(id int PRIMARY KEY, v text);"
         "INSERT INTO gr_orders VALUES (1, 'o1'); INSERT INTO gr_secret VALUES (1, 'classified');"
         "INSERT INTO gr_prod VALUES (1, 'p1');"
         "CREATE PUBLICATION gr_pub FOR TABLE gr_orders, gr_secret, gr_prod");
  auto key = test::hmac_key("HS256", std::string(32, 'g'));
  auth_setup setup(key.jwk());
  setup.use_policy(R"(
[[grant]]
when = { role = "sales" }
tables = ["public.gr_orders"]
ops = ["insert", "update"]

[[grant]]
tables = ["public.gr_prod"]

[[grant]]
when = { role = "ops" }
tables = ["public.gr_secret"]
ops = ["insert", "update", "delete", "message"]
)");
  running_gateway g("gr_slot", "gr_pub", setup.so);
  const std::string sales = test::token(key, R"("role":"sales")"), ops = test::token(key, R"("role":"ops")"),
                    nobody = test::token(key);

  // Outside the grants: 403 naming why, never a narrowed stream.
  auto refused = [&](const std::string& query, const std::string& token) {
    return request(g.port(), "/v1/stream?" + query, "Authorization: Bearer " + token + "\r\n");
  };
  auto a = refused("tables=public.gr_secret", sales);
  CHECK(a.status == 403);
  CHECK(a.body == "{\"error\":\"table \\\"public\\\".\\\"gr_secret\\\" is not granted to this token\",\"parameter\":\"tables\"}\n");
  CHECK(refused("tables=public.gr_orders&ops=delete", sales).status == 403);
  CHECK(refused("tables=public.*", sales).status == 403);
  CHECK(refused("ops=message", sales).status == 403);
  CHECK(refused("tables=public.gr_orders", nobody).status == 403);
  CHECK(request(g.port(), "/v1/ws?tables=public.gr_secret", std::string(upgrade_headers) + "Authorization: Bearer " + sales + "\r\n").status == 403);

  // The sales token's streams: every format over NDJSON, SSE, WebSocket, a /v1/mux subscription,
  // and a snapshot.
  std::vector<std::unique_ptr<stream_client>> lines;
  for (const char* f : {"native", "debezium", "pgoutput2json", "waltail", "wal2json", "pgoutput2json-compact"})
    lines.push_back(std::make_unique<stream_client>(g.port(), std::string("/v1/stream?transactions=false&format=") + f,
                                                    std::vector<std::pair<std::string, std::string>>{{"Authorization", "Bearer " + sales}}));
  stream_client tombstones(g.port(), "/v1/stream?format=debezium&tombstones=true", {{"Authorization", "Bearer " + sales}});
  stream_client ops_messages(g.port(), "/v1/stream?ops=message", {{"Authorization", "Bearer " + ops}});
  stream_client sse(g.port(), "/v1/stream?access_token=" + sales, {{"Accept", "text/event-stream"}});
  stream_client snap(g.port(), "/v1/stream?snapshot=true", {{"Authorization", "Bearer " + sales}});
  ws_with ws(g.port(), "/v1/ws?format=debezium", "walgate, bearer." + sales);
  ws_with mux(g.port(), "/v1/mux", "walgate, bearer." + sales);
  stream_client ops_client(g.port(), "/v1/stream?tables=public.gr_secret&ops=insert,update,delete", {{"Authorization", "Bearer " + ops}});
  for (auto& c : lines) REQUIRE(c->status() == 200);
  REQUIRE(sse.status() == 200);
  REQUIRE(snap.status() == 200);
  REQUIRE(ops_client.status() == 200);
  REQUIRE(tombstones.status() == 200);
  REQUIRE(ops_messages.status() == 200);
  REQUIRE_FALSE(ws.ec);
  REQUIRE_FALSE(mux.ec);
  mux.ws.text(true);
  mux.ws.write(asio::buffer(std::string(R"({"type":"subscribe","id":"outside","tables":"public.gr_secret"})")));
  auto no = json::parse(mux.next());
  CHECK(no.at("status") == 403);
  CHECK(no.at("parameter") == "tables");
  mux.ws.write(asio::buffer(std::string(R"({"type":"subscribe","id":"in","format":"wal2json","transactions":false})")));
  REQUIRE(json::parse(mux.next()).at("type") == "subscribed");

  // The snapshot: the granted tables' rows only.
  std::vector<std::string> rows;
  while (true) {
    auto l = snap.events(1);
    REQUIRE(l.size() == 1);
    auto v = json::parse(l[0]);
    if (v.as_object().contains("snapshot")) break;
    rows.push_back(std::string(v.at("table").as_string()));
  }
  std::sort(rows.begin(), rows.end());
  CHECK(rows == std::vector<std::string>{"gr_orders", "gr_prod"});

  // Changes of every kind to every table, a logical message, then a last row every token sees.
  pg.sql("INSERT INTO gr_orders VALUES (2, 'o2'); UPDATE gr_orders SET v = 'o1b' WHERE id = 1;"
         "DELETE FROM gr_orders WHERE id = 2; INSERT INTO gr_secret VALUES (2, 'classified2');"
         "UPDATE gr_secret SET v = 'classified3' WHERE id = 1; DELETE FROM gr_secret WHERE id = 2;"
         "SELECT pg_logical_emit_message(true, 'classified-prefix', 'classified message');"
         "INSERT INTO gr_prod VALUES (2, 'p2'); UPDATE gr_prod SET v = 'p2b' WHERE id = 2;"
         "TRUNCATE gr_secret; DELETE FROM gr_prod WHERE id = 1;"
         "INSERT INTO gr_prod VALUES (999, 'last')");
  // What the sales token may see: 2 changes of gr_orders (the insert, the update; not the
  // delete), 4 of gr_prod — and not a byte of gr_secret, its truncate or the message.
  const std::size_t want = 6;
  auto no_secret = [](const std::string& s) {
    return s.find("secret") == std::string::npos && s.find("classified") == std::string::npos;
  };
  std::vector<std::string> native;
  for (auto& c : lines) {
    auto got = c->events(want);
    REQUIRE(got.size() == want);
    for (const auto& l : got) CHECK_MESSAGE(no_secret(l), l);
    CHECK(got.back().find("last") != std::string::npos);
    if (native.empty()) native = got;
  }
  auto with_tombstone = tombstones.events(want + 1);   // the delete of gr_prod's row 1, then its tombstone
  REQUIRE(with_tombstone.size() == want + 1);
  for (const auto& l : with_tombstone) CHECK_MESSAGE(no_secret(l), l);
  CHECK(with_tombstone[want - 1].find("\"value\":null") != std::string::npos);
  if (pg.server_major() >= 14) {   // pgoutput sends logical messages from PostgreSQL 14
    auto message = ops_messages.events(1);
    REQUIRE(message.size() == 1);
    CHECK(message[0].find("classified-prefix") != std::string::npos);
  } else {
    MESSAGE("the ops token's logical message is not checked on PostgreSQL " << pg.server_major() << " (pgoutput sends messages from 14)");
  }
  // Resuming within the grants: from the third event, the other three.
  stream_client resumed(g.port(), "/v1/stream?from=" + id_of(native[2]), {{"Authorization", "Bearer " + sales}});
  auto rest = resumed.events(3);
  REQUIRE(rest.size() == 3);
  CHECK(rest[0] == native[3]);
  CHECK(rest[2] == native[5]);
  auto se = sse.sse(want);
  REQUIRE(se.size() == want);
  for (const auto& [id, data] : se) CHECK_MESSAGE(no_secret(data), data);
  std::string last_ws;
  for (std::size_t i = 0; i < want; ++i) {
    last_ws = ws.next();
    CHECK_MESSAGE(no_secret(last_ws), last_ws);
  }
  CHECK(last_ws.find("last") != std::string::npos);
  for (std::size_t i = 0; i < want; ++i) {
    auto m = mux.next();
    CHECK_MESSAGE(no_secret(m), m);
  }
  for (std::size_t i = 0; i < want; ++i) {
    auto l = snap.events(1);
    REQUIRE(l.size() == 1);
    CHECK_MESSAGE(no_secret(l[0]), l[0]);
  }
  // The ops token asked for gr_secret: its three changes.
  auto secret = ops_client.events(3);
  REQUIRE(secret.size() == 3);
  for (const auto& l : secret) CHECK(json::parse(l).at("table") == "gr_secret");
  auto m = admin_metrics(g.port(), test::token(key, R"("walgate_admin":true)"));
  CHECK(m.find("walgate_auth_forbidden_total 7") != std::string::npos);

  // The policy changes (gr_orders no longer granted to sales): a connected stream keeps the
  // grants it was admitted with; a new request gets the new ones.
  write_file(setup.dir.path / "policy.toml", "[[grant]]\nwhen = { role = \"sales\" }\ntables = [\"public.gr_prod\"]\n");
  std::string error;
  std::atomic<bool> ok = false, done = false;
  asio::post(g.io, [&] {
    ok = setup.auth->reload(error);
    done = true;
  });
  REQUIRE(test::wait_until([&] { return done.load(); }));
  REQUIRE_MESSAGE(ok.load(), error);
  CHECK(refused("tables=public.gr_orders", sales).status == 403);
  pg.sql("INSERT INTO gr_orders VALUES (3, 'after the change')");
  auto kept = lines[0]->events(1);
  REQUIRE(kept.size() == 1);
  CHECK(kept[0].find("after the change") != std::string::npos);
}

namespace {
/// A client's model of the rows it may see, from native events: key -> the row's JSON.
struct tenant_model {
  std::map<std::string, std::map<std::string, std::string>> tables;   // table -> key -> row
  std::string key_of(const json::object& row, const std::string& table) {
    return table == "rt_keyed" ? json::serialize(row.at("tenant")) + "/" + json::serialize(row.at("id"))
                               : json::serialize(row.at("id"));
  }
  void apply(const std::string& line) {
    auto v = json::parse(line).as_object();
    const std::string table(v.at("table").as_string()), op(v.at("op").as_string());
    auto& t = tables[table];
    if (op == "insert" || op == "read") t[key_of(v.at("after").as_object(), table)] = json::serialize(v.at("after"));
    if (op == "update") {
      if (v.at("before").is_object()) t.erase(key_of(v.at("before").as_object(), table));
      t[key_of(v.at("after").as_object(), table)] = json::serialize(v.at("after"));
    }
    if (op == "delete") t.erase(key_of(v.at("before").as_object(), table));
  }
};
}  // namespace

TEST_CASE("--policy rows: each tenant's client holds exactly its rows; updates that move a row in or out arrive as inserts and deletes") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE rt_items(id int PRIMARY KEY, tenant text, v text); ALTER TABLE rt_items REPLICA IDENTITY FULL;"
         "CREATE TABLE rt_keyed(tenant text, id int, v text, PRIMARY KEY (tenant, id));"
         "CREATE TABLE rt_loose(id int PRIMARY KEY, tenant text);"
         "CREATE TABLE rt_toast(id int PRIMARY KEY, n int, note text); ALTER TABLE rt_toast REPLICA IDENTITY FULL;"
         "ALTER TABLE rt_toast ALTER COLUMN note SET STORAGE EXTERNAL;"
         "CREATE PUBLICATION rt_pub FOR TABLE rt_items, rt_keyed, rt_loose, rt_toast");
  auto key = test::hmac_key("HS256", std::string(32, 'r'));
  auth_setup setup(key.jwk());
  setup.use_policy(R"(
[[grant]]
tables = ["public.rt_items", "public.rt_keyed"]
rows = "tenant = {claims.tenant}"

[[grant]]
when = { loose = true }
tables = ["public.rt_loose"]
rows = "tenant = {claims.tenant}"

[[grant]]
tables = ["public.rt_toast"]
rows = "note >= 'z'"
)");
  running_gateway g("rt_slot", "rt_pub", setup.so);
  const std::string a = test::token(key, R"("tenant":"a")"), b = test::token(key, R"("tenant":"b")"),
                    loose = test::token(key, R"("tenant":"a","loose":true)");
  auto bearer = [](const std::string& t) { return std::vector<std::pair<std::string, std::string>>{{"Authorization", "Bearer " + t}}; };
  stream_client native_a(g.port(), "/v1/stream?tables=public.rt_items,public.rt_keyed", bearer(a));
  stream_client native_b(g.port(), "/v1/stream?tables=public.rt_items,public.rt_keyed", bearer(b));
  std::vector<std::unique_ptr<stream_client>> formats_a;
  for (const char* f : {"debezium", "pgoutput2json", "waltail", "wal2json"})
    formats_a.push_back(std::make_unique<stream_client>(g.port(), std::string("/v1/stream?transactions=false&tables=public.rt_items,public.rt_keyed&format=") + f, bearer(a)));
  ws_with ws_a(g.port(), "/v1/ws?tables=public.rt_items,public.rt_keyed&format=debezium&tombstones=true", "walgate, bearer." + a);
  stream_client loose_a(g.port(), "/v1/stream?tables=public.rt_loose", bearer(loose));
  ws_with loose_ws(g.port(), "/v1/ws?tables=public.rt_loose", "walgate, bearer." + loose);
  stream_client toast_a(g.port(), "/v1/stream?tables=public.rt_toast", bearer(a));
  REQUIRE_FALSE(loose_ws.ec);
  REQUIRE(toast_a.status() == 200);
  REQUIRE(native_a.status() == 200);
  REQUIRE(native_b.status() == 200);
  for (auto& c : formats_a) REQUIRE(c->status() == 200);
  REQUIRE_FALSE(ws_a.ec);
  REQUIRE(loose_a.status() == 200);

  // Rows of both tenants, updates within a tenant, rows moved between tenants (FULL identity; a
  // key change on the keyed table), deletes; then a last row of each tenant.
  pg.sql("INSERT INTO rt_items SELECT g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, 'secret-' || "
         "CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END || g FROM generate_series(1, 20) g");
  pg.sql("INSERT INTO rt_keyed SELECT CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, g, 'k' || g FROM generate_series(1, 10) g");
  pg.sql("UPDATE rt_items SET v = v || '-changed' WHERE id IN (2, 3, 4)");
  pg.sql("UPDATE rt_items SET tenant = 'a', v = 'moved-in-6' WHERE id = 5");    // b -> a: a gets an insert
  pg.sql("UPDATE rt_items SET tenant = 'b', v = 'moved-out-8' WHERE id = 8");   // a -> b: a gets a delete
  pg.sql("UPDATE rt_keyed SET tenant = 'a' WHERE tenant = 'b' AND id = 3");     // a key change: into a
  pg.sql("UPDATE rt_keyed SET tenant = 'b' WHERE tenant = 'a' AND id = 4");     // out of a
  pg.sql("UPDATE rt_keyed SET v = v || '-x' WHERE tenant = 'a' AND id = 2");    // the key unchanged: no old row sent
  pg.sql("DELETE FROM rt_items WHERE id IN (10, 11)");
  pg.sql("DELETE FROM rt_keyed WHERE id IN (6, 7)");
  pg.sql("INSERT INTO rt_items VALUES (100, 'a', 'last-a'), (101, 'b', 'last-b')");

  std::string native_lines;
  auto replay = [&](stream_client& c, const std::string& last) {
    tenant_model m;
    for (int n = 0; n < 1000; ++n) {
      auto l = c.events(1);
      REQUIRE(l.size() == 1);
      m.apply(l[0]);
      native_lines += l[0] + "\n";
      if (l[0].find(last) != std::string::npos) break;
    }
    return m;
  };
  auto select = [&](const std::string& tenant) {
    tenant_model m;
    for (auto& r : pg.sql("SELECT 'rt_items', row_to_json(t)::text FROM rt_items t WHERE tenant = '" + tenant +
                          "' UNION ALL SELECT 'rt_keyed', row_to_json(t)::text FROM rt_keyed t WHERE tenant = '" + tenant + "'")) {
      auto row = json::parse(*r[1]).as_object();
      m.tables[*r[0]][m.key_of(row, *r[0])] = json::serialize(row);
    }
    return m;
  };
  auto ma = replay(native_a, "last-a");
  const std::string a_lines = native_lines;
  auto mb = replay(native_b, "last-b");
  CHECK(ma.tables == select("a").tables);
  // Not a value of tenant b's rows in a's stream (rt_keyed's b rows are k1, k5, k7, k9; k3 moved in).
  for (const char* other : {"secret-b", "moved-out-8", "\"k1\"", "\"k5\"", "\"k7\"", "\"k9\"", "\"tenant\":\"b\""})
    CHECK_MESSAGE(a_lines.find(other) == std::string::npos, other);
  CHECK(a_lines.find("\"k2-x\"") != std::string::npos);
  CHECK(mb.tables == select("b").tables);
  // A snapshot taken now: the rows the same grant holds, in every format (its SELECT carries
  // tenant = 'a'; the gateway checks each row too).
  auto snapshot_of = [&](const std::string& token, const char* format) {
    stream_client snap(g.port(), std::string("/v1/stream?snapshot=true&transactions=false&tables=public.rt_items,public.rt_keyed&format=") + format,
                       bearer(token));
    REQUIRE(snap.status() == 200);
    std::vector<std::string> rows;
    for (int n = 0; n < 1000; ++n) {
      auto l = snap.events(1);
      REQUIRE(l.size() == 1);
      if (l[0].starts_with("{\"snapshot\":\"end\"")) break;
      rows.push_back(l[0]);
    }
    return rows;
  };
  tenant_model snap_a;
  for (const auto& l : snapshot_of(a, "native")) snap_a.apply(l);
  CHECK(snap_a.tables == select("a").tables);
  tenant_model snap_b;
  for (const auto& l : snapshot_of(b, "native")) snap_b.apply(l);
  CHECK(snap_b.tables == select("b").tables);
  const auto a_rows = *pg.sql("SELECT (SELECT count(*) FROM rt_items WHERE tenant = 'a') + (SELECT count(*) FROM rt_keyed WHERE tenant = 'a')")[0][0];
  for (const char* f : {"debezium", "pgoutput2json", "waltail", "wal2json"}) {
    auto rows = snapshot_of(a, f);
    CHECK(std::to_string(rows.size()) == a_rows);
    for (const auto& l : rows) CHECK_MESSAGE(l.find("\"b\"") == std::string::npos, l);
  }
  // Not a byte of the other tenant's rows, in any format or transport.
  for (auto& c : formats_a) {
    std::string all;
    for (int n = 0; n < 1000; ++n) {
      auto l = c->events(1);
      REQUIRE(l.size() == 1);
      all += l[0] + "\n";
      if (l[0].find("last-a") != std::string::npos) break;
    }
    CHECK_MESSAGE(all.find("secret-b") == std::string::npos, all);
    CHECK_MESSAGE(all.find("moved-out-8") == std::string::npos, all);   // the new values of a row that left
    CHECK(all.find("moved-in-6") != std::string::npos);
  }
  std::string ws_all;
  for (int n = 0; n < 1000; ++n) {
    auto m = ws_a.next();
    REQUIRE(!m.empty());
    ws_all += m + "\n";
    if (m.find("last-a") != std::string::npos) break;
  }
  CHECK(ws_all.find("secret-b") == std::string::npos);
  CHECK(ws_all.find("moved-out-8") == std::string::npos);
  // The moved-out row's tombstone (its key: under REPLICA IDENTITY FULL pgoutput flags every column).
  const auto tomb = ws_all.find("{\"key\":{\"id\":8,");
  REQUIRE(tomb != std::string::npos);
  CHECK(ws_all.substr(tomb, ws_all.find('\n', tomb) - tomb).ends_with("},\"value\":null}"));
  // A row grant on a column outside the table's replica identity cannot see rows leave: the
  // stream ends, saying what to change.
  pg.sql("INSERT INTO rt_loose VALUES (1, 'a')");
  auto end = loose_a.events(1);
  REQUIRE(end.size() == 1);
  CHECK(loose_ws.wait_close().code == 1008);
  CHECK(end[0].find("row grant on public.rt_loose: column tenant is not in the replica identity (ALTER TABLE public.rt_loose REPLICA IDENTITY FULL)") != std::string::npos);
  // Now that the gateway has seen the table, a new request is refused at its start (409), on
  // every endpoint.
  auto again = request(g.port(), "/v1/stream?tables=public.rt_loose", "Authorization: Bearer " + loose + "\r\n");
  CHECK(again.status == 409);
  CHECK(again.body.find("row grant on public.rt_loose: column tenant is not in the replica identity") != std::string::npos);
  CHECK(request(g.port(), "/v1/ws?tables=public.rt_loose", std::string(upgrade_headers) + "Authorization: Bearer " + loose + "\r\n").status == 409);
  ws_with loose_mux(g.port(), "/v1/mux", "walgate, bearer." + loose);
  REQUIRE_FALSE(loose_mux.ec);
  loose_mux.ws.text(true);
  loose_mux.ws.write(asio::buffer(std::string(R"({"type":"subscribe","id":"l","tables":"public.rt_loose"})")));
  CHECK(json::parse(loose_mux.next()).at("status") == 409);
  // A predicate column stored out of line (TOAST) that an update leaves alone is not in the new
  // row: its old value decides — the row stays, the update is an update.
  pg.sql("INSERT INTO rt_toast SELECT 1, 1, 'z' || string_agg(md5(g::text), '') FROM generate_series(1, 400) g");
  pg.sql("UPDATE rt_toast SET n = 2 WHERE id = 1");
  auto toast = toast_a.events(2);
  REQUIRE(toast.size() == 2);
  CHECK(json::parse(toast[0]).at("op") == "insert");
  CHECK(json::parse(toast[1]).at("op") == "update");
  CHECK(json::parse(toast[1]).at("after").at("note") == "__unchanged_toast__");
  // A snapshot with a predicate PostgreSQL is not given (text order: the gateway's, not the
  // collation's): each row decided here.
  pg.sql("INSERT INTO rt_toast VALUES (2, 1, 'a-note'), (3, 1, 'zz')");
  stream_client toast_snap(g.port(), "/v1/stream?snapshot=true&tables=public.rt_toast", bearer(a));
  std::vector<std::string> ids;
  for (int n = 0; n < 10; ++n) {
    auto l = toast_snap.events(1);
    REQUIRE(l.size() == 1);
    if (l[0].starts_with("{\"snapshot\":\"end\"")) break;
    ids.push_back(json::serialize(json::parse(l[0]).at("after").at("id")));
  }
  std::sort(ids.begin(), ids.end());
  CHECK(ids == std::vector<std::string>{"1", "3"});
}

TEST_CASE("where=: a client's own row filter, with rows moving in and out as inserts and deletes; claims in it with a token") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE wq(id int PRIMARY KEY, n int, v text); ALTER TABLE wq REPLICA IDENTITY FULL;"
         "CREATE TABLE wq_keyed(id int PRIMARY KEY, n int); CREATE PUBLICATION wq_pub FOR TABLE wq, wq_keyed");
  running_gateway g("wq_slot", "wq_pub");
  // Malformed: 400 naming where=.
  auto bad = request(g.port(), "/v1/stream?where=n%20%3E");
  CHECK(bad.status == 400);
  CHECK(bad.body.find("\"parameter\":\"where\"") != std::string::npos);
  stream_client c(g.port(), "/v1/stream?tables=public.wq&where=n%20%3E%3D%2010%20or%20v%20%3D%20%27pinned%27");
  stream_client keyed(g.port(), "/v1/stream?tables=public.wq_keyed&where=n%20%3E%3D%2010");
  REQUIRE(c.status() == 200);
  REQUIRE(keyed.status() == 200);
  pg.sql("INSERT INTO wq VALUES (1, 5, 'x'), (2, 15, 'x'), (3, 1, 'pinned'), (4, 20, 'x')");
  pg.sql("UPDATE wq SET n = 3 WHERE id = 2");     // out: a delete
  pg.sql("UPDATE wq SET n = 30 WHERE id = 1");    // in: an insert
  pg.sql("UPDATE wq SET n = 21 WHERE id = 4");    // stays: an update
  pg.sql("UPDATE wq SET n = 2 WHERE id = 3");     // stays (pinned)
  pg.sql("DELETE FROM wq WHERE id = 2");          // was out: nothing
  pg.sql("INSERT INTO wq VALUES (99, 99, 'last')");
  std::vector<std::string> ops;
  tenant_model m;
  for (int n = 0; n < 100; ++n) {
    auto l = c.events(1);
    REQUIRE(l.size() == 1);
    auto v = json::parse(l[0]);
    ops.push_back(std::string(v.at("op").as_string()) + " " + json::serialize(v.at(v.at("op") == "delete" ? "before" : "after").at("id")));
    if (l[0].find("last") != std::string::npos) break;
  }
  CHECK(ops == std::vector<std::string>{"insert 2", "insert 3", "insert 4", "delete 2", "insert 1", "update 4", "update 3",
                                        "insert 99"});
  // A snapshot with where=: the rows it holds now.
  stream_client snap(g.port(), "/v1/stream?snapshot=true&tables=public.wq&where=n%20%3E%3D%2010%20or%20v%20%3D%20%27pinned%27");
  std::vector<std::string> ids;
  for (int n = 0; n < 10; ++n) {
    auto l = snap.events(1);
    REQUIRE(l.size() == 1);
    if (l[0].starts_with("{\"snapshot\":\"end\"")) break;
    ids.push_back(json::serialize(json::parse(l[0]).at("after").at("id")));
  }
  std::sort(ids.begin(), ids.end());
  CHECK(ids == std::vector<std::string>{"1", "3", "4", "99"});
  // A table that is not FULL: its where= columns must be in the key.
  pg.sql("INSERT INTO wq_keyed VALUES (1, 50)");
  auto end = keyed.events(1);
  REQUIRE(end.size() == 1);
  CHECK(end[0].find("where= on public.wq_keyed: column n is not in the replica identity") != std::string::npos);
  auto refused = request(g.port(), "/v1/stream?tables=public.wq_keyed&where=n%20%3E%3D%2010");
  CHECK(refused.status == 409);
  CHECK(refused.body.find("\"parameter\":\"where\"") != std::string::npos);
  // With a token, claims in where= are the token's.
  auto key = test::hmac_key("HS256", std::string(32, 'w'));
  auth_setup setup(key.jwk());
  running_gateway ga("wq_auth_slot", "wq_pub", setup.so);
  stream_client mine(ga.port(), "/v1/stream?tables=public.wq&where=n%20%3D%20%7Bclaims.n%7D",
                     {{"Authorization", "Bearer " + test::token(key, R"("n":7)")}});
  REQUIRE(mine.status() == 200);
  pg.sql("INSERT INTO wq VALUES (7, 7, 'seven'), (8, 8, 'eight'), (100, 100, 'last2')");
  auto got = mine.events(1);
  REQUIRE(got.size() == 1);
  CHECK(json::parse(got[0]).at("after").at("v") == "seven");
  pg.sql("INSERT INTO wq VALUES (9, 7, 'seven again')");
  got = mine.events(1);
  REQUIRE(got.size() == 1);
  CHECK(json::parse(got[0]).at("after").at("v") == "seven again");
}

TEST_CASE("limits: streams per subject and per address, failed authentications per address; each refusal counted and logged, never with the token") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE adm_a(id int PRIMARY KEY); CREATE PUBLICATION adm_pub FOR TABLE adm_a");
  auto key = test::hmac_key("HS256", std::string(32, 'l'));
  auth_setup setup(key.jwk());
  auto lines = std::make_shared<std::vector<std::string>>();
  auto m = std::make_shared<std::mutex>();
  setup.so.log = [lines, m](const std::string& l) {
    std::lock_guard lock(*m);
    lines->push_back(l);
  };
  setup.so.max_streams_per_subject = 2;
  setup.so.max_streams_per_address = 4;
  setup.so.auth_failures_per_minute = 3;
  running_gateway g("adm_slot", "adm_pub", setup.so);
  const std::string alice = test::token(key, R"("sub":"alice")"), bob = test::token(key, R"("sub":"bob")"),
                    carol = test::token(key, R"("sub":"carol")");
  auto bearer = [](const std::string& t) { return std::vector<std::pair<std::string, std::string>>{{"Authorization", "Bearer " + t}}; };

  auto a1 = std::make_unique<stream_client>(g.port(), "/v1/stream", bearer(alice));
  stream_client a2(g.port(), "/v1/stream?format=debezium", bearer(alice));
  REQUIRE(a1->status() == 200);
  REQUIRE(a2.status() == 200);
  // A third stream of alice's: 429, on every endpoint (a /v1/mux connection holds a place too).
  auto third = request(g.port(), "/v1/stream", "Authorization: Bearer " + alice + "\r\n");
  CHECK(third.status == 429);
  CHECK(third.retry_after == "5");
  CHECK(third.body.find("too many streams for this subject (limit 2") != std::string::npos);
  CHECK(request(g.port(), "/v1/ws", std::string(upgrade_headers) + "Authorization: Bearer " + alice + "\r\n").status == 429);
  CHECK(request(g.port(), "/v1/mux", std::string(upgrade_headers) + "Authorization: Bearer " + alice + "\r\n").status == 429);
  // bob's stream, then carol's /v1/mux connection (the address's fourth place): its subscription
  // is the fifth from this address.
  stream_client b1(g.port(), "/v1/stream", bearer(bob));
  REQUIRE(b1.status() == 200);
  ws_with mux(g.port(), "/v1/mux", "walgate, bearer." + carol);
  REQUIRE_FALSE(mux.ec);
  mux.ws.text(true);
  mux.ws.write(asio::buffer(std::string(R"({"type":"subscribe","id":"s1"})")));
  auto refused = json::parse(mux.next());
  CHECK(refused.at("status") == 429);
  CHECK(std::string(refused.at("error").as_string()).find("too many streams from this address (limit 4") != std::string::npos);
  // A stream that ends gives its place back.
  a1.reset();
  REQUIRE(test::wait_until([&] {
    stream_client again(g.port(), "/v1/stream", bearer(alice));
    return again.status() == 200;
  }));
  pg.sql("INSERT INTO adm_a VALUES (1)");
  CHECK(a2.events(1).size() == 1);   // the streams admitted go on

  // Invalid tokens: three are answered 401; then the address waits, whatever it sends.
  const std::string forged = test::token(test::hmac_key("HS256", std::string(32, 'x')), R"("sub":"alice")");
  for (int i = 0; i < 3; ++i) CHECK(request(g.port(), "/v1/stream", "Authorization: Bearer " + forged + "\r\n").status == 401);
  auto waiting = request(g.port(), "/v1/stream", "Authorization: Bearer " + bob + "\r\n");
  CHECK(waiting.status == 429);
  CHECK(waiting.body.find("too many failed authentications from this address") != std::string::npos);
  const int retry = std::atoi(waiting.retry_after.c_str());
  CHECK(retry >= 1);
  CHECK(retry <= 60);
  CHECK(request(g.port(), "/v1/mux", std::string(upgrade_headers) + "Authorization: Bearer " + bob + "\r\n").status == 429);
  CHECK(request(g.port(), "/healthz").status == 200);   // (only requests with a token to verify wait)
  // /metrics verifies a token too: it waits as well; read from another address.
  const std::string admin = test::token(key, R"("sub":"ops","walgate_admin":true)");
  CHECK(request(g.port(), "/metrics", "Authorization: Bearer " + admin + "\r\n").status == 429);

  auto metrics = admin_metrics(g.port(), admin, "127.0.0.2");
  auto metric = [&](const std::string& name) {
    auto at = metrics.find(name + " ");
    REQUIRE(at != std::string::npos);
    return std::atoll(metrics.c_str() + at + name.size() + 1);
  };
  CHECK(metric("walgate_refused_total{reason=\"subject_limit\"}") >= 3);   // (and while the stream that ended was let go)
  CHECK(metrics.find("walgate_refused_total{reason=\"address_limit\"} 1") != std::string::npos);
  CHECK(metrics.find("walgate_refused_total{reason=\"invalid_token\"} 3") != std::string::npos);
  CHECK(metrics.find("walgate_refused_total{reason=\"auth_rate_limit\"} 3") != std::string::npos);   // (/metrics' too)
  std::vector<std::string> logged;
  {
    std::lock_guard lock(*m);
    logged = *lines;
  }
  auto has = [&](const std::string& text) {
    return std::any_of(logged.begin(), logged.end(), [&](const std::string& l) { return l.find(text) != std::string::npos; });
  };
  CHECK(has("refused 429 /v1/stream from 127.0.0.1 (subject alice): too many streams for this subject"));
  CHECK(has("refused 429 /v1/mux from 127.0.0.1 (subject alice): too many streams for this subject"));
  CHECK(has("refused 429 /v1/mux from 127.0.0.1 (subject carol): too many streams from this address"));
  CHECK(has("refused 401 /v1/stream from 127.0.0.1: invalid token: "));
  CHECK(has("refused 429 /v1/stream from 127.0.0.1: too many failed authentications from this address"));
  for (const auto& l : logged) {
    CHECK_MESSAGE(l.find(forged.substr(forged.rfind('.') + 1)) == std::string::npos, l);
    CHECK_MESSAGE(l.find(alice.substr(alice.rfind('.') + 1)) == std::string::npos, l);
  }
}

TEST_CASE("limits: genuine tokens refused for their claims (expired) count per address apart from forged ones; past the limit, 429 before any verification") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE adm_exp(id int PRIMARY KEY); CREATE PUBLICATION adm_exp_pub FOR TABLE adm_exp");
  auto key = test::rsa_key("RS256");   // (an RSA key: each verification is the dear kind)
  auth_setup setup(key.jwk("r"));
  setup.so.auth_failures_per_minute = 3;
  running_gateway g("adm_exp_slot", "adm_exp_pub", setup.so);
  // Genuine but expired two minutes ago (no leeway here); fresh; forged (an HMAC with the RSA
  // key's kid: refused before any signature holds).
  auto bearer = [](const std::string& t) { return "Authorization: Bearer " + t + "\r\n"; };
  const std::string expired = bearer(test::token(key, "", "r", -120)), fresh = bearer(test::token(key, "", "r")),
                    forged = bearer(test::token(test::hmac_key("HS256", std::string(32, 'x')), "", "r"));

  // 127.0.0.1: two forged tokens and three expired ones, each 401 — neither count is past 3.
  for (int i = 0; i < 2; ++i) CHECK(request(g.port(), "/v1/stream", forged).status == 401);
  for (int i = 0; i < 3; ++i) {
    auto a = request(g.port(), "/v1/stream", expired);
    CHECK(a.status == 401);
    CHECK(a.body.find("the token has expired") != std::string::npos);
  }
  // The fourth expired token: 429 with Retry-After, not verified; so is a fresh token from there,
  // on every stream endpoint, until the minute ends.
  auto waiting = request(g.port(), "/v1/stream", expired);
  CHECK(waiting.status == 429);
  CHECK(waiting.body.find("too many failed authentications from this address (genuine tokens refused for their claims") !=
        std::string::npos);
  CHECK(waiting.body.find("--auth-failures-per-minute") != std::string::npos);
  const int retry = std::atoi(waiting.retry_after.c_str());
  CHECK(retry >= 1);
  CHECK(retry <= 60);
  CHECK(request(g.port(), "/v1/stream", fresh).status == 429);
  CHECK(request(g.port(), "/v1/mux", std::string(upgrade_headers) + fresh).status == 429);

  // Another address is not held by it: a fresh token streams, an expired one is its own 401.
  CHECK(status_from(g.port(), "/v1/stream", fresh, "127.0.0.2") == 200);
  CHECK(request(g.port(), "/v1/stream", expired, "127.0.0.2").status == 401);
  // The two counts do not add up: two forged and two expired tokens (4 refusals, the limit 3)
  // leave an address served.
  for (int i = 0; i < 2; ++i) {
    CHECK(request(g.port(), "/v1/stream", forged, "127.0.0.3").status == 401);
    CHECK(request(g.port(), "/v1/stream", expired, "127.0.0.3").status == 401);
  }
  CHECK(status_from(g.port(), "/v1/stream", fresh, "127.0.0.3") == 200);

  // Verified: the 10 tokens answered 401 and the 2 fresh ones served (and /metrics' own, read
  // from an address that does not wait); the 3 answered 429 never.
  auto metrics = admin_metrics(g.port(), test::token(key, R"("walgate_admin":true)", "r"), "127.0.0.4");
  CHECK(metrics.find("walgate_auth_tokens_refused_total 10\n") != std::string::npos);
  CHECK(metrics.find("walgate_auth_tokens_accepted_total 3\n") != std::string::npos);
  CHECK(metrics.find("walgate_refused_total{reason=\"invalid_token\"} 10\n") != std::string::npos);
  CHECK(metrics.find("walgate_refused_total{reason=\"auth_rate_limit\"} 3\n") != std::string::npos);
}

TEST_CASE("--policy columns: columns outside a grant are in no field of any format, transport or snapshot") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE col_emp(id int PRIMARY KEY, name text, salary numeric, ssn text);"
         "CREATE TABLE col_full(id int PRIMARY KEY, name text, ssn text); ALTER TABLE col_full REPLICA IDENTITY FULL;"
         "INSERT INTO col_emp VALUES (1, 'ann', 918273, 'SSN-AAA-1');"
         "CREATE PUBLICATION col_pub FOR TABLE col_emp, col_full");
  auto key = test::hmac_key("HS256", std::string(32, 'c'));
  auth_setup setup(key.jwk());
  setup.use_policy(R"(
[[grant]]
tables = ["public.col_emp", "public.col_full"]
columns = ["id", "name"]

[[grant]]
when = { role = "hr" }
tables = ["public.col_emp"]
)");
  running_gateway g("col_slot", "col_pub", setup.so);
  const std::string staff = test::token(key), hr = test::token(key, R"("role":"hr")");
  auto bearer = [](const std::string& t) { return std::vector<std::pair<std::string, std::string>>{{"Authorization", "Bearer " + t}}; };

  std::vector<std::unique_ptr<stream_client>> lines;
  for (const char* q : {"format=native", "format=debezium&tombstones=true", "format=pgoutput2json", "format=pgoutput2json&compact=true",
                        "format=waltail", "format=wal2json&transactions=false", "snapshot=true", "snapshot=true&format=debezium",
                        "snapshot=true&format=pgoutput2json&compact=true"})
    lines.push_back(std::make_unique<stream_client>(g.port(), std::string("/v1/stream?") + q, bearer(staff)));
  stream_client sse(g.port(), "/v1/stream?access_token=" + staff + "&format=waltail", {{"Accept", "text/event-stream"}});
  ws_with ws(g.port(), "/v1/ws?format=wal2json&transactions=false", "walgate, bearer." + staff);
  ws_with mux(g.port(), "/v1/mux", "walgate, bearer." + staff);
  stream_client hr_client(g.port(), "/v1/stream?tables=public.col_emp", bearer(hr));
  stream_client peek(g.port(), "/v1/stream?where=ssn%20%3D%20'SSN-BBB-2'", bearer(staff));
  for (auto& c : lines) REQUIRE(c->status() == 200);
  REQUIRE(sse.status() == 200);
  REQUIRE(hr_client.status() == 200);
  REQUIRE(peek.status() == 200);
  REQUIRE_FALSE(ws.ec);
  REQUIRE_FALSE(mux.ec);
  mux.ws.text(true);
  mux.ws.write(asio::buffer(std::string(R"({"type":"subscribe","id":"m","format":"debezium"})")));
  REQUIRE(json::parse(mux.next()).at("type") == "subscribed");

  pg.sql("INSERT INTO col_emp VALUES (2, 'bob', 827364, 'SSN-BBB-2')");
  pg.sql("UPDATE col_emp SET salary = 736455, ssn = 'SSN-BBB-3' WHERE id = 2");
  pg.sql("UPDATE col_emp SET name = 'bobby' WHERE id = 2");
  pg.sql("DELETE FROM col_emp WHERE id = 1");
  pg.sql("INSERT INTO col_full VALUES (1, 'cat', 'SSN-CCC-1'); UPDATE col_full SET ssn = 'SSN-CCC-2' WHERE id = 1;"
         "DELETE FROM col_full WHERE id = 1");
  pg.sql("INSERT INTO col_emp VALUES (3, 'final-row', 645546, 'SSN-LLL-3')");
  auto hidden = [](const std::string& s) {
    for (const char* v : {"salary", "ssn", "SSN-", "918273", "827364", "736455", "645546"})
      if (s.find(v) != std::string::npos) return false;
    return true;
  };
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::string all;
    for (int n = 0; n < 100; ++n) {
      auto l = lines[i]->events(1);
      REQUIRE(l.size() == 1);
      all += l[0] + "\n";
      if (l[0].find("final-row") != std::string::npos) break;
    }
    INFO("client " << i << ": " << all);
    CHECK(hidden(all));
    CHECK(all.find("bobby") != std::string::npos);
    CHECK(all.find("cat") != std::string::npos);
  }
  // Every format's own fields, on the native client's lines and a Debezium one.
  std::string sse_all, ws_all, mux_all;   // (8 events: 4 of col_emp's row 2 and 1, 3 of col_full, the last)
  auto se = sse.sse(8);
  CHECK(se.size() == 8);
  for (const auto& [id, data] : se) sse_all += data + "\n";
  for (int k = 0; k < 8; ++k) ws_all += ws.next() + "\n";
  for (int k = 0; k < 8; ++k) mux_all += mux.next() + "\n";
  CHECK(ws_all.find("final-row") != std::string::npos);
  CHECK(mux_all.find("final-row") != std::string::npos);
  CHECK_MESSAGE(hidden(sse_all), sse_all);
  CHECK_MESSAGE(hidden(ws_all), ws_all);
  CHECK_MESSAGE(hidden(mux_all), mux_all);
  CHECK(ws_all.find("\"columns\":[{\"name\":\"id\",\"type\":\"integer\",\"value\":2},{\"name\":\"name\",\"type\":\"text\",\"value\":\"bob\"}]") !=
        std::string::npos);
  // The hr token sees every column.
  auto h = hr_client.events(4);
  REQUIRE(h.size() == 4);
  CHECK(h[0].find("SSN-BBB-2") != std::string::npos);
  CHECK(h[0].find("827364") != std::string::npos);
  // where= on a column the token does not see: the stream ends, saying so (not a row filtered by it).
  auto end = peek.events(1);
  REQUIRE(end.size() == 1);
  CHECK(end[0].find("where= on public.col_emp: column ssn is not granted to this token") != std::string::npos);
}

TEST_CASE("--policy rows by equality: each event goes only to the clients holding its value (the row router), and each client's rows stay exact") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE rr(id int PRIMARY KEY, tenant int, v text); ALTER TABLE rr REPLICA IDENTITY FULL;"
         "CREATE TABLE rr_f(id int PRIMARY KEY, score float8); ALTER TABLE rr_f REPLICA IDENTITY FULL;"
         "CREATE TABLE rr_k(id int PRIMARY KEY, tenant int);"   // (tenant: not in the replica identity)
         "CREATE PUBLICATION rr_pub FOR TABLE rr, rr_f, rr_k");
  auto key = test::hmac_key("HS256", std::string(32, 'q'));
  auth_setup setup(key.jwk());
  setup.use_policy(R"(
[[grant]]
tables = ["public.rr"]
rows = "tenant = {claims.tenant} and v is not null"

[[grant]]
when = { scored = true }
tables = ["public.rr_f"]
rows = "score = {claims.score}"

[[grant]]
when = { keyed = true }
tables = ["public.rr_k"]
rows = "tenant = {claims.tenant}"
)");
  running_gateway g("rr_slot", "rr_pub", setup.so);
  auto bearer = [](const std::string& t) { return std::vector<std::pair<std::string, std::string>>{{"Authorization", "Bearer " + t}}; };
  constexpr int tenants = 20;
  std::vector<std::unique_ptr<stream_client>> clients;
  for (int t = 0; t < tenants; ++t)
    clients.push_back(std::make_unique<stream_client>(g.port(), "/v1/stream?tables=public.rr",
                                                      bearer(test::token(key, "\"tenant\":" + std::to_string(t)))));
  // The tenant as a string claim: compared as the column's type (an integer), found the same.
  stream_client as_text(g.port(), "/v1/stream?tables=public.rr", bearer(test::token(key, R"("tenant":"007")")));
  stream_client scored(g.port(), "/v1/stream?tables=public.rr_f", bearer(test::token(key, R"("scored":true,"score":1.5)")));
  stream_client keyed(g.port(), "/v1/stream?tables=public.rr_k", bearer(test::token(key, R"("keyed":true,"tenant":1)")));
  REQUIRE(keyed.status() == 200);
  for (auto& c : clients) REQUIRE(c->status() == 200);
  REQUIRE(as_text.status() == 200);
  REQUIRE(scored.status() == 200);
  const std::string admin = test::token(key, R"("walgate_admin":true)");
  auto metric = [&](const std::string& name) { return admin_metric(g.port(), admin, name); };
  // Caught up (nothing to read), each registers with the router at its first look at the log.
  pg.sql("INSERT INTO rr VALUES (0, 999, 'nobody''s')");
  REQUIRE_MESSAGE(test::wait_until([&] { return metric("walgate_routed_clients") == tenants + 3; }),
                  metric("walgate_routed_clients"));
  const auto events0 = metric("walgate_router_events_total"), queued0 = metric("walgate_router_deliveries_total");
  pg.sql("INSERT INTO rr SELECT g, g % 30, 'row-' || g FROM generate_series(1, 300) g");
  pg.sql("UPDATE rr SET v = v || '-changed' WHERE id % 7 = 0");
  pg.sql("UPDATE rr SET tenant = 4 WHERE tenant = 3 AND id < 100");   // moved from 3 to 4
  pg.sql("UPDATE rr SET v = NULL WHERE id = 45");                     // out of tenant 15's grant by its other comparison
  pg.sql("DELETE FROM rr WHERE id % 11 = 0");
  pg.sql("INSERT INTO rr SELECT 1000 + g, g, 'last-' || g FROM generate_series(0, 29) g");
  // Each client's replayed rows equal SELECT … WHERE its grant.
  auto replay = [&](stream_client& c, int t) {
    std::map<std::string, std::string> rows;
    for (int n = 0; n < 1000; ++n) {
      auto l = c.events(1);
      REQUIRE(l.size() == 1);
      auto v = json::parse(l[0]).as_object();
      const std::string op(v.at("op").as_string());
      if (op == "delete" || op == "update") rows.erase(json::serialize(v.at("before").at("id")));
      if (op != "delete") rows[json::serialize(v.at("after").at("id"))] = json::serialize(v.at("after"));
      if (l[0].find("\"last-" + std::to_string(t) + "\"") != std::string::npos) break;
    }
    std::map<std::string, std::string> want;
    for (auto& r : pg.sql("SELECT id::text, row_to_json(t)::text FROM rr t WHERE tenant = " + std::to_string(t) + " AND v IS NOT NULL"))
      want[*r[0]] = json::serialize(json::parse(*r[1]));
    CHECK_MESSAGE(rows == want, "tenant " << t);
  };
  for (int t = 0; t < tenants; ++t) replay(*clients[t], t);
  replay(as_text, 7);
  // The router looked at each event once and queued about a tenant's share of them for each
  // client (a moved row goes to both tenants), not every event to every client.
  const auto events = metric("walgate_router_events_total") - events0, queued = metric("walgate_router_deliveries_total") - queued0;
  MESSAGE("router: " << events << " events looked at, " << queued << " queued for " << tenants + 1 << " clients");
  CHECK(events >= 300 + 30 + 43);
  CHECK(queued < events);
  CHECK(queued > events / 2);   // (two thirds of the rows are of a tenant with a client)
  // A column of a type without equality keys (float8): its client reads every event again, and
  // gets exactly its rows.
  pg.sql("INSERT INTO rr_f VALUES (1, 1.5), (2, 2.5), (3, 1.50)");
  auto f = scored.events(2);
  REQUIRE(f.size() == 2);
  CHECK(json::parse(f[0]).at("after").at("id") == 1);
  CHECK(json::parse(f[1]).at("after").at("id") == 3);
  CHECK(metric("walgate_routed_clients") == tenants + 2);
  // A grant's column outside the table's replica identity: a delete's old row has no value of
  // it, so the router cannot find a row leaving — every event of the table goes to the client,
  // whose stream ends saying what to change (as without the router), even for another tenant's row.
  pg.sql("INSERT INTO rr_k VALUES (1, 2)");
  auto end = keyed.events(1);
  REQUIRE(end.size() == 1);
  CHECK(end[0].find("row grant on public.rr_k: column tenant is not in the replica identity") != std::string::npos);
  CHECK(test::wait_until([&] { return metric("walgate_routed_clients") == tenants + 1; }));
}

TEST_CASE("--policy rows by equality alone: the router's finding decides (a row moved in is an insert, moved out a delete), and each client's rows stay exact") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE rx(id int PRIMARY KEY, tenant int, v text); ALTER TABLE rx REPLICA IDENTITY FULL;"
         // (the tenant in the key, REPLICA IDENTITY DEFAULT: an update that keeps the key sends no old row)
         "CREATE TABLE ry(tenant int, id int, v text, PRIMARY KEY (tenant, id));"
         "CREATE PUBLICATION rx_pub FOR TABLE rx, ry");
  auto key = test::hmac_key("HS256", std::string(32, 'x'));
  auth_setup setup(key.jwk());
  setup.use_policy(R"(
[[grant]]
tables = ["public.rx"]
rows = "tenant = {claims.tenant}"

[[grant]]
tables = ["public.ry"]
rows = "tenant in {claims.tenants}"
)");
  running_gateway g("rx_slot", "rx_pub", setup.so);
  auto bearer = [](const std::string& t) { return std::vector<std::pair<std::string, std::string>>{{"Authorization", "Bearer " + t}}; };
  constexpr int tenants = 10;
  std::vector<std::unique_ptr<stream_client>> clients;   // two a tenant
  for (int t = 0; t < 2 * tenants; ++t)
    clients.push_back(std::make_unique<stream_client>(g.port(), "/v1/stream?tables=public.rx",
                                                      bearer(test::token(key, "\"tenant\":" + std::to_string(t % tenants)))));
  std::vector<std::unique_ptr<stream_client>> keyed;   // ry: tenants {t, t + 1}
  for (int t = 0; t < 4; ++t)
    keyed.push_back(std::make_unique<stream_client>(
        g.port(), "/v1/stream?tables=public.ry",
        bearer(test::token(key, "\"tenants\":[" + std::to_string(t) + "," + std::to_string(t + 1) + "]"))));
  for (auto& c : clients) REQUIRE(c->status() == 200);
  for (auto& c : keyed) REQUIRE(c->status() == 200);
  const std::string admin = test::token(key, R"("walgate_admin":true)");
  auto metric = [&](const std::string& name) { return admin_metric(g.port(), admin, name); };
  pg.sql("INSERT INTO rx VALUES (0, 999, 'nobody''s')");
  pg.sql("INSERT INTO ry VALUES (999, 0, 'nobody''s')");
  REQUIRE_MESSAGE(test::wait_until([&] { return metric("walgate_routed_clients") == 2 * tenants + 4; }),
                  metric("walgate_routed_clients"));
  const auto decided0 = metric("walgate_router_decided_total");
  pg.sql("INSERT INTO rx SELECT g, g % 12, 'gone-' || g FROM generate_series(1, 40) g");
  pg.sql("TRUNCATE rx");   // (to every client: each one's rows are none)
  pg.sql("INSERT INTO rx SELECT g, g % 12, 'row-' || g FROM generate_series(1, 300) g");
  pg.sql("UPDATE rx SET v = v || '-changed' WHERE id % 7 = 0");                   // stays
  pg.sql("UPDATE rx SET tenant = 4 WHERE tenant = 3 AND id < 150");               // moved from 3 to 4
  pg.sql("UPDATE rx SET tenant = 5 WHERE tenant = 11");                           // moved in, from no client's tenant
  pg.sql("UPDATE rx SET tenant = 10 WHERE tenant = 6 AND id < 100");              // moved out, to no client's
  pg.sql("UPDATE rx SET tenant = NULL WHERE tenant = 7 AND id < 120");            // out, to null
  pg.sql("UPDATE rx SET tenant = 8 WHERE tenant IS NULL AND id < 60");            // in, from null
  pg.sql("UPDATE rx SET id = id + 10000, tenant = 2 WHERE tenant = 1 AND id < 200");   // the key and the tenant
  pg.sql("UPDATE rx SET id = id + 20000 WHERE tenant = 9 AND id < 200");          // the key alone
  pg.sql("DELETE FROM rx WHERE id % 11 = 0");
  pg.sql("INSERT INTO rx SELECT 1000 + g, g, 'last-' || g FROM generate_series(0, 11) g");
  std::size_t deletes = 0;
  auto replay = [&](stream_client& c, int t) {
    std::map<std::string, std::string> rows;
    for (int n = 0; n < 2000; ++n) {
      auto l = c.events(1);
      REQUIRE(l.size() == 1);
      auto v = json::parse(l[0]).as_object();
      const std::string op(v.at("op").as_string());
      if (op == "truncate") {
        rows.clear();
        continue;
      }
      if (op == "delete" || op == "update") {
        REQUIRE(rows.erase(json::serialize(v.at("before").at("id"))) == 1);   // (only rows it holds leave)
        deletes += op == "delete";
      }
      if (op != "delete") {
        CHECK(v.at("after").at("tenant") == t);   // never a row of another tenant
        rows[json::serialize(v.at("after").at("id"))] = json::serialize(v.at("after"));
      }
      if (l[0].find("\"last-" + std::to_string(t) + "\"") != std::string::npos) break;
    }
    std::map<std::string, std::string> want;
    for (auto& r : pg.sql("SELECT id::text, row_to_json(t)::text FROM rx t WHERE tenant = " + std::to_string(t)))
      want[*r[0]] = json::serialize(json::parse(*r[1]));
    CHECK_MESSAGE(rows == want, "tenant " << t);
  };
  for (int c = 0; c < 2 * tenants; ++c) replay(*clients[c], c % tenants);
  CHECK(deletes > 0);
  // Taken as the router found them: every client's changes but the truncate.
  const auto decided = metric("walgate_router_decided_total") - decided0;
  MESSAGE("router decided " << decided << " events for their clients");
  CHECK(decided > 2 * 300 * tenants / 12);
  // REPLICA IDENTITY DEFAULT with the tenant in the key: an update that keeps the key has no old
  // row (the same tenant: as it is); one that changes the tenant has the old key (moved).
  pg.sql("INSERT INTO ry SELECT g % 6, g, 'row-' || g FROM generate_series(1, 120) g");
  pg.sql("UPDATE ry SET v = v || '-changed' WHERE id % 5 = 0");      // no old row
  pg.sql("UPDATE ry SET tenant = 2 WHERE tenant = 0 AND id < 60");   // out of {0, 1}, into {1, 2} and {2, 3}
  pg.sql("UPDATE ry SET tenant = 5 WHERE tenant = 3 AND id < 60");   // out of {2, 3} and {3, 4}, into none
  pg.sql("DELETE FROM ry WHERE id % 7 = 0");
  pg.sql("INSERT INTO ry SELECT g, 1000 + g, 'last' FROM generate_series(0, 4) g");
  for (int t = 0; t < 4; ++t) {
    std::map<std::string, std::string> rows;
    int lasts = 0;
    for (int n = 0; n < 1000 && lasts < 2; ++n) {
      auto l = keyed[t]->events(1);
      REQUIRE(l.size() == 1);
      auto v = json::parse(l[0]).as_object();
      const std::string op(v.at("op").as_string());
      auto id_of = [](const json::value& row) { return json::serialize(row.at("tenant")) + "/" + json::serialize(row.at("id")); };
      if (op == "delete" || (op == "update" && v.contains("before") && !v.at("before").is_null()))
        REQUIRE(rows.erase(id_of(v.at("before"))) == 1);
      if (op != "delete") {
        const auto tenant = v.at("after").at("tenant").as_int64();
        CHECK((tenant == t || tenant == t + 1));
        rows[id_of(v.at("after"))] = json::serialize(v.at("after"));
        if (v.at("after").at("v") == "last") ++lasts;
      }
    }
    std::map<std::string, std::string> want;
    for (auto& r : pg.sql("SELECT tenant || '/' || id, row_to_json(t)::text FROM ry t WHERE tenant IN (" + std::to_string(t) + ", " +
                          std::to_string(t + 1) + ")"))
      want[*r[0]] = json::serialize(json::parse(*r[1]));
    CHECK_MESSAGE(rows == want, "tenants " << t << ", " << t + 1);
  }
  CHECK(metric("walgate_router_decided_total") - decided0 - decided > 100);
}

TEST_CASE("/metrics with --auth jwt: 401 without a token, 403 without the admin claim (--metrics-claim), 200 with it") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE auth_met(id int PRIMARY KEY); CREATE PUBLICATION auth_met_pub FOR TABLE auth_met");
  auto key = test::ec_key("ES256");
  auth_setup setup(key.jwk("m"));
  setup.so.metrics_cache = std::chrono::hours(1);   // (the clients' series kept for the whole test: see the end)
  running_gateway g("auth_met_slot", "auth_met_pub", setup.so);
  auto bearer = [](const std::string& t) { return "Authorization: Bearer " + t + "\r\n"; };

  // No token: 401 with the Bearer challenge, as a stream request; it says which claim it takes.
  auto none = request(g.port(), "/metrics");
  CHECK(none.status == 401);
  CHECK(none.challenge == "Bearer realm=\"walgate\"");
  CHECK(none.body.find("walgate_admin=true") != std::string::npos);
  CHECK(none.body.find("# HELP") == std::string::npos);
  // In the header only: a URL's token (access logs keep URLs) is none here.
  CHECK(request(g.port(), "/metrics?access_token=" + test::token(key, R"("walgate_admin":true)", "m")).status == 401);
  // A token another key signed: 401 invalid_token.
  auto forged = request(g.port(), "/metrics", bearer(test::token(test::ec_key("ES256"), R"("walgate_admin":true)", "m")));
  CHECK(forged.status == 401);
  CHECK(forged.challenge.find("error=\"invalid_token\"") != std::string::npos);
  CHECK(forged.body.find("# HELP") == std::string::npos);

  // A valid token: the figures with the claim (a JSON true, or the string "true"), else 403.
  const std::string admin = test::token(key, R"("walgate_admin":true)", "m");
  auto first = request(g.port(), "/metrics", bearer(admin));
  CHECK(first.status == 200);
  CHECK(first.body.find("\nwalgate_log_next_seq ") != std::string::npos);
  CHECK(request(g.port(), "/metrics", bearer(test::token(key, R"("walgate_admin":"true")", "m"))).status == 200);
  for (std::string claims : {"", R"("walgate_admin":false)", R"("walgate_admin":"yes")", R"("walgate_admin":1)", R"("admin":true)"}) {
    INFO(claims);
    auto a = request(g.port(), "/metrics", bearer(test::token(key, claims, "m")));
    CHECK(a.status == 403);
    CHECK(a.body.find("does not carry the claim walgate_admin=true") != std::string::npos);
    CHECK(a.body.find("# HELP") == std::string::npos);
  }
  // The claim is for /metrics alone: a token without it streams.
  stream_client c(g.port(), "/v1/stream", {{"Authorization", "Bearer " + test::token(key, "", "m")}});
  REQUIRE(c.status() == 200);

  // The other figures are read at each request; the clients' series (one sample per client) are
  // kept (--metrics-cache here an hour): the new client is counted, its lag series not yet there.
  auto again = request(g.port(), "/metrics", bearer(admin));
  CHECK(again.status == 200);
  CHECK(again.body.find("walgate_clients{transport=\"ndjson\"} 1\n") != std::string::npos);
  CHECK(again.body.find("walgate_refused_total{reason=\"forbidden\"} 5\n") != std::string::npos);
  CHECK(again.body.find("walgate_refused_total{reason=\"no_token\"} 2\n") != std::string::npos);
  CHECK(first.body.find("walgate_client_lag_events{") == std::string::npos);
  CHECK(again.body.find("walgate_client_lag_events{") == std::string::npos);
  CHECK(again.body.find("walgate_client_lag_bytes{") == std::string::npos);
}

TEST_CASE("--metrics-claim: the claim equals the value — a string, a boolean or an integer as its JSON text, or an array holding one") {
  auto who = [](const std::string& claims) {
    walgate::proxy::identity i;
    i.claims = json::parse(claims).as_object();
    return i;
  };
  CHECK(proxy::claim_equals(who(R"({"walgate_admin":true})"), "walgate_admin", "true"));
  CHECK(proxy::claim_equals(who(R"({"walgate_admin":"true"})"), "walgate_admin", "true"));
  CHECK(proxy::claim_equals(who(R"({"walgate_admin":false})"), "walgate_admin", "false"));
  CHECK_FALSE(proxy::claim_equals(who(R"({"walgate_admin":false})"), "walgate_admin", "true"));
  CHECK_FALSE(proxy::claim_equals(who(R"({"walgate_admin":"True"})"), "walgate_admin", "true"));
  CHECK_FALSE(proxy::claim_equals(who(R"({"walgate_admin":null})"), "walgate_admin", "true"));
  CHECK_FALSE(proxy::claim_equals(who(R"({})"), "walgate_admin", "true"));
  CHECK(proxy::claim_equals(who(R"({"roles":["reader","walgate-ops"]})"), "roles", "walgate-ops"));
  CHECK_FALSE(proxy::claim_equals(who(R"({"roles":["reader"]})"), "roles", "walgate-ops"));
  CHECK(proxy::claim_equals(who(R"({"level":7})"), "level", "7"));
  CHECK_FALSE(proxy::claim_equals(who(R"({"level":7.0})"), "level", "7"));
  CHECK_FALSE(proxy::claim_equals(who(R"({"ops":{"walgate":true}})"), "ops", "true"));
}
