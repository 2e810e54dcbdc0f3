// Routing without sockets (route.hpp): a request and a server's state in, an answer or an
// admitted stream out — every branch of what a connection's request gets, with a real event log
// in a temporary directory, a real gateway (never connected) and real JWTs; no socket, no
// PostgreSQL. The end-to-end tests (server_test, auth_test, mux_test) show the same answers over
// sockets; these show that routing alone decides them, and break route.hpp's assumptions:
// - a refusal holds nothing: after it, --max-clients and the per-subject/per-address counts are
//   where they were;
// - an admitted stream holds its places until its handoff goes;
// - authentication comes before anything about the log (a forged token on a resume from an
//   unknown id is 401, not 400/410), and only the query's own errors come before it;
// - only the answers a page polls keep the connection.
#include "route.hpp"

#include "walgate/proxy/auth.hpp"
#include "walgate/proxy/event_log.hpp"
#include "walgate/proxy/gateway.hpp"

#include "jwt_helpers.hpp"
#include "temp_dir.hpp"

#include <boost/asio/io_context.hpp>

#include <doctest/doctest.h>

#include <fstream>

using namespace walgate;
using namespace walgate::proxy;

namespace {

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}

/// A server's state with no listener: what route() reads.
struct routing {
  test::temp_dir dir{"walgate-route"};
  boost::asio::io_context io;
  std::unique_ptr<event_log> log;
  std::unique_ptr<gateway> gw;
  std::unique_ptr<server_core> core;
  test::test_key key = test::hmac_key("HS256", "route-test-secret-of-32-bytes-at-least");

  /// policy: a policy file's TOML (empty: none); auth: JWT authentication on.
  explicit routing(bool auth, const std::string& policy = "", server_options so = {}) {
    log_options lo;
    lo.dir = dir.path / "log";
    lo.fsync = false;
    std::string error;
    log = event_log::open(lo, error);
    REQUIRE_MESSAGE(log, error);
    gw = std::make_unique<gateway>(io.get_executor(), *log, protocol::assembler_options{});
    if (auth) {
      write_file(dir.path / "jwks.json", "{\"keys\":[" + key.jwk() + "]}");
      auth_options o;
      o.jwks_file = dir.path / "jwks.json";
      if (!policy.empty()) {
        write_file(dir.path / "policy.toml", policy);
        o.policy_file = dir.path / "policy.toml";
      }
      so.auth = std::make_shared<authenticator>(o);
      REQUIRE_MESSAGE(so.auth->reload(error), error);
    }
    so.send_threads = 0;
    core = std::make_unique<server_core>(io.get_executor(), std::move(so), *gw, server_status{});
  }
  ~routing() { core->detach(); }

  static http::request<http::empty_body> get(std::string target, std::vector<std::pair<std::string, std::string>> fields = {}) {
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, "127.0.0.1:8080");
    for (auto& [k, v] : fields) req.set(k, v);
    return req;
  }
  static std::vector<std::pair<std::string, std::string>> upgrade(std::vector<std::pair<std::string, std::string>> more = {}) {
    std::vector<std::pair<std::string, std::string>> f{{"Connection", "Upgrade"},
                                                       {"Upgrade", "websocket"},
                                                       {"Sec-WebSocket-Version", "13"},
                                                       {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}};
    f.insert(f.end(), more.begin(), more.end());
    return f;
  }
  std::string bearer(const std::string& claims = "") const { return "Bearer " + test::token(key, claims); }

  routed go(http::request<http::empty_body> req, const std::string& peer = "10.0.0.1") { return route(*core, req, peer); }
};

/// The answer, checked to be one (not a stream).
const answer& reply_of(const routed& r) {
  REQUIRE(r.reply);
  CHECK_FALSE(r.stream);
  return *r.reply;
}

}  // namespace

TEST_CASE("route: the plain endpoints, and which answers keep the connection") {
  routing t(false);
  auto h = t.go(routing::get("/healthz"));
  CHECK(reply_of(h).status == http::status::ok);
  CHECK(h.reply->body == "{\"status\":\"ok\"}\n");
  CHECK(h.reply->keep_alive);

  auto r = t.go(routing::get("/readyz"));   // no stream: not ready
  CHECK(reply_of(r).status == http::status::service_unavailable);
  CHECK(r.reply->body == "{\"status\":\"not streaming\"}\n");
  CHECK(r.reply->keep_alive);

  auto m = t.go(routing::get("/metrics"));   // open without --auth
  CHECK(reply_of(m).status == http::status::ok);
  CHECK(m.reply->content_type == "text/plain; version=0.0.4");
  CHECK(m.reply->body.find("walgate_events_out_total") != std::string::npos);

  auto page = t.go(routing::get("/"));
  CHECK(reply_of(page).content_type == "text/html; charset=utf-8");

  auto none = t.go(routing::get("/nothing?x=1"));
  CHECK(reply_of(none).status == http::status::not_found);
  CHECK(none.reply->keep_alive);   // (a 404 is no reason to drop the connection)

  auto close = routing::get("/healthz");
  close.keep_alive(false);
  CHECK_FALSE(reply_of(t.go(std::move(close))).keep_alive);

  auto post = routing::get("/healthz");
  post.method(http::verb::post);
  auto p = t.go(std::move(post));
  CHECK(reply_of(p).status == http::status::method_not_allowed);
  CHECK_FALSE(p.reply->keep_alive);
}

TEST_CASE("route: request size limits, Host and Origin, the CORS preflight") {
  server_options so;
  so.url_limit = 64;
  so.header_limit = 256;
  so.allowed_origins = {"https://app.example"};
  routing t(false, "", so);
  CHECK(reply_of(t.go(routing::get("/v1/stream?tables=" + std::string(80, 'a')))).status == http::status::uri_too_long);
  auto big = t.go(routing::get("/healthz", {{"X-Padding", std::string(300, 'p')}}));
  CHECK(reply_of(big).status == http::status::request_header_fields_too_large);
  CHECK_FALSE(big.reply->keep_alive);

  // A loopback listener answers only its own names (DNS rebinding).
  t.core->check_host = t.core->loopback_listener = true;
  auto rebinding = t.go(routing::get("/healthz", {{"Host", "evil.example"}}));
  CHECK(reply_of(rebinding).status == http::status::forbidden);
  CHECK(rebinding.reply->body.find("--allow-host") != std::string::npos);
  CHECK(reply_of(t.go(routing::get("/healthz", {{"Host", "localhost:8080"}}))).status == http::status::ok);

  const auto before = t.core->rejected_origins;
  auto foreign = t.go(routing::get("/healthz", {{"Origin", "https://other.example"}}));
  CHECK(reply_of(foreign).status == http::status::forbidden);
  CHECK(foreign.reply->body.find("--allow-origin https://other.example") != std::string::npos);
  CHECK(t.core->rejected_origins == before + 1);

  auto allowed = t.go(routing::get("/healthz", {{"Origin", "https://app.example"}}));
  CHECK(reply_of(allowed).cors == "https://app.example");

  auto pre = routing::get("/v1/stream", {{"Origin", "https://app.example"}});
  pre.method(http::verb::options);
  auto preflight = t.go(std::move(pre));
  CHECK(reply_of(preflight).preflight);
  CHECK(preflight.reply->status == http::status::no_content);
  CHECK(preflight.reply->cors == "https://app.example");
  CHECK(preflight.reply->keep_alive);
}

TEST_CASE("route: stream requests handed off by transport, holding their places until the handoff goes") {
  server_options so;
  so.max_clients = 2;
  so.max_streams_per_address = 8;   // (counted only under a limit)
  routing t(false, "", so);
  auto nd = t.go(routing::get("/v1/stream?format=native"));
  REQUIRE(nd.stream);
  CHECK_FALSE(nd.reply);
  CHECK(nd.stream->what == stream_handoff::to::ndjson);
  CHECK(nd.stream->start.request.fmt == transform::format::native);
  CHECK(t.core->streams == 1);
  CHECK(t.core->admit.streams_of_address("10.0.0.1") == 1);

  auto sse = t.go(routing::get("/v1/stream", {{"Accept", "text/event-stream"}}));
  REQUIRE(sse.stream);
  CHECK(sse.stream->what == stream_handoff::to::sse);
  CHECK(t.core->streams == 2);

  // Over --max-clients: 503 with Retry-After, and nothing more held.
  auto full = t.go(routing::get("/v1/stream"));
  CHECK(reply_of(full).status == http::status::service_unavailable);
  CHECK(full.reply->retry_after == "5");
  CHECK(t.core->streams == 2);
  CHECK(t.core->admit.streams_of_address("10.0.0.1") == 2);

  nd.stream.reset();
  sse.stream.reset();
  CHECK(t.core->streams == 0);
  CHECK(t.core->admit.streams_of_address("10.0.0.1") == 0);

  // /v1/ws and /v1/mux need the upgrade; a refused one holds nothing.
  auto ws_plain = t.go(routing::get("/v1/ws"));
  CHECK(reply_of(ws_plain).status == http::status::upgrade_required);
  CHECK(t.core->streams == 0);
  CHECK(t.core->admit.streams_of_address("10.0.0.1") == 0);
  auto ws = t.go(routing::get("/v1/ws?format=wal2json", routing::upgrade()));
  REQUIRE(ws.stream);
  CHECK(ws.stream->what == stream_handoff::to::websocket);
  CHECK(ws.stream->req[http::field::sec_websocket_key] == "dGhlIHNhbXBsZSBub25jZQ==");   // (its handshake answers it)
  CHECK(reply_of(t.go(routing::get("/v1/mux"))).status == http::status::upgrade_required);
  auto mux = t.go(routing::get("/v1/mux", routing::upgrade()));
  REQUIRE(mux.stream);
  CHECK(mux.stream->what == stream_handoff::to::mux);
  CHECK(t.core->streams == 2);

  // The query's own errors; snapshot=true with no database to read (501: not configured).
  auto bad = t.go(routing::get("/v1/stream?format=nope"));
  CHECK(reply_of(bad).status == http::status::bad_request);
  CHECK(bad.reply->body.find("\"parameter\":\"format\"") != std::string::npos);
  ws.stream.reset();
  auto snap = t.go(routing::get("/v1/stream?snapshot=true"));
  CHECK(reply_of(snap).status == http::status::not_implemented);
  CHECK(snap.reply->body.find("\"parameter\":\"snapshot\"") != std::string::npos);
  CHECK(t.core->streams == 1);   // (the mux's alone)
}

TEST_CASE("route: resume positions decided from the log and the server's WAL end") {
  protocol::lsn wal_end;   // (invalid: this process has not reached PostgreSQL)
  server_options so;
  so.server_wal_end = [&wal_end] { return wal_end; };
  routing t(false, "", so);
  // An empty log: an id past its head waits for the server's WAL end to be known (503), then is
  // refused when it is past it (no event of this stream), served when it is not (skipped to).
  auto unknown = t.go(routing::get("/v1/stream?from=0/1000:0"));
  CHECK(reply_of(unknown).status == http::status::service_unavailable);
  CHECK(unknown.reply->retry_after == "2");
  wal_end = protocol::lsn(0x500);
  auto forged = t.go(routing::get("/v1/stream?from=0/1000:0"));
  CHECK(reply_of(forged).status == http::status::bad_request);
  CHECK(forged.reply->body.find("past the end of the server's WAL") != std::string::npos);
  // Within the server's WAL, but this log holds nothing yet (it has no origin): nothing of it
  // is retained to resume after (410: take a snapshot).
  wal_end = protocol::lsn(0x2000);
  auto empty = t.go(routing::get("/v1/stream?from=0/1000:0"));
  CHECK(reply_of(empty).status == http::status::gone);
  CHECK(empty.reply->body.find("take a new snapshot") != std::string::npos);
  // Last-Event-ID wins over from=, and a malformed one is the request's fault.
  auto malformed = t.go(routing::get("/v1/stream?from=0/1000:0", {{"Last-Event-ID", "not-an-id"}}));
  CHECK(reply_of(malformed).status == http::status::bad_request);
  CHECK(malformed.reply->body.find("Last-Event-ID") != std::string::npos);
  CHECK(t.core->streams == 0);
}

TEST_CASE("route: authentication before anything about the log, counted per address") {
  server_options so;
  so.auth_failures_per_minute = 3;
  routing t(true, "", so);
  auto none = t.go(routing::get("/v1/stream?from=0/1000:0"));
  CHECK(reply_of(none).status == http::status::unauthorized);
  CHECK(none.reply->www_authenticate == "Bearer realm=\"walgate\"");
  // The query's errors come first (they are the request's own).
  CHECK(reply_of(t.go(routing::get("/v1/stream?format=nope"))).status == http::status::bad_request);

  // A forged token on a resume from an unknown id: 401, not what the log would say.
  auto other = test::hmac_key("HS256", "another-secret-of-32-bytes-at-least!!");
  auto forged = t.go(routing::get("/v1/stream?from=0/1000:0", {{"Authorization", "Bearer " + test::token(other)}}));
  CHECK(reply_of(forged).status == http::status::unauthorized);
  CHECK(forged.reply->www_authenticate.find("error=\"invalid_token\"") != std::string::npos);

  // A genuine one is served.
  auto ok = t.go(routing::get("/v1/stream", {{"Authorization", t.bearer()}}));
  REQUIRE(ok.stream);
  REQUIRE(ok.stream->start.who);
  CHECK(ok.stream->start.who->subject == "user-1");
  CHECK(ok.stream->start.request.access_token.empty());   // (not kept with the stream)

  // The token in the query and as a WebSocket subprotocol; bearer.<token> without walgate: 400.
  CHECK(t.go(routing::get("/v1/stream?access_token=" + test::token(t.key))).stream);
  CHECK(t.go(routing::get("/v1/ws", routing::upgrade({{"Sec-WebSocket-Protocol", "walgate, bearer." + test::token(t.key)}})))
            .stream);
  auto bare = t.go(routing::get("/v1/ws", routing::upgrade({{"Sec-WebSocket-Protocol", "bearer." + test::token(t.key)}})));
  CHECK(reply_of(bare).status == http::status::bad_request);
  CHECK(bare.reply->body.find("Sec-WebSocket-Protocol") != std::string::npos);

  // Forged tokens count against their address: past --auth-failures-per-minute, 429 before
  // any token is looked at (a genuine one too), with Retry-After; another address is served.
  for (int i = 0; i < 2; ++i)
    CHECK(reply_of(t.go(routing::get("/v1/mux", routing::upgrade({{"Authorization", "Bearer " + test::token(other)}}))))
              .status == http::status::unauthorized);
  auto waiting = t.go(routing::get("/v1/stream", {{"Authorization", t.bearer()}}));
  CHECK(reply_of(waiting).status == http::status::too_many_requests);
  CHECK_FALSE(waiting.reply->retry_after.empty());
  CHECK(waiting.reply->body.find("--auth-failures-per-minute") != std::string::npos);
  CHECK(reply_of(t.go(routing::get("/metrics", {{"Authorization", t.bearer()}}))).status == http::status::too_many_requests);
  CHECK(t.go(routing::get("/v1/stream", {{"Authorization", t.bearer()}}), "10.0.0.2").stream);
}

TEST_CASE("route: /v1/slots: 404 without a walsender; with one, its JSON for the tokens /metrics takes") {
  {
    routing t(false);
    auto none = t.go(routing::get("/v1/slots"));
    CHECK(reply_of(none).status == http::status::not_found);
    CHECK(none.reply->body.find("walgate serves /v1/slots with --replication-listen") != std::string::npos);
  }
  server_options so;
  so.slots_json = [] { return std::string("{\"slots\":[]}"); };
  routing t(true, "", so);
  CHECK(reply_of(t.go(routing::get("/v1/slots"))).status == http::status::unauthorized);
  auto plain = t.go(routing::get("/v1/slots", {{"Authorization", t.bearer()}}));
  CHECK(reply_of(plain).status == http::status::forbidden);
  CHECK(plain.reply->body.find("that /v1/slots needs (--metrics-claim)") != std::string::npos);
  auto admin = t.go(routing::get("/v1/slots", {{"Authorization", t.bearer("\"walgate_admin\":true")}}));
  CHECK(reply_of(admin).status == http::status::ok);
  CHECK(admin.reply->content_type == "application/json");
  CHECK(admin.reply->body == "{\"slots\":[]}");
}

TEST_CASE("route: /metrics with authentication needs the claim --metrics-claim names") {
  routing t(true);
  auto none = t.go(routing::get("/metrics"));
  CHECK(reply_of(none).status == http::status::unauthorized);
  CHECK(none.reply->body.find("walgate_admin=true") != std::string::npos);
  auto plain = t.go(routing::get("/metrics", {{"Authorization", t.bearer()}}));
  CHECK(reply_of(plain).status == http::status::forbidden);
  CHECK(plain.reply->body.find("--metrics-claim") != std::string::npos);
  auto admin = t.go(routing::get("/metrics", {{"Authorization", t.bearer("\"walgate_admin\":true")}}));
  CHECK(reply_of(admin).status == http::status::ok);
  CHECK(admin.reply->keep_alive);
  // (the token in the query is not one /metrics reads)
  CHECK(reply_of(t.go(routing::get("/metrics?access_token=" + test::token(t.key, "\"walgate_admin\":true")))).status ==
        http::status::unauthorized);
}

TEST_CASE("route: grants decide before a place is taken; /v1/stream and a /v1/mux subscription are admitted alike") {
  server_options so;
  so.max_streams_per_subject = 1;
  routing t(true, R"(
[[grant]]
when = { role = "sales" }
tables = ["public.orders"]
)",
            so);
  auto none = t.go(routing::get("/v1/stream", {{"Authorization", t.bearer()}}));
  CHECK(reply_of(none).status == http::status::forbidden);
  CHECK(none.reply->body.find("granted nothing") != std::string::npos);
  auto outside = t.go(routing::get("/v1/stream?tables=public.people", {{"Authorization", t.bearer("\"role\":\"sales\"")}}));
  CHECK(reply_of(outside).status == http::status::forbidden);
  CHECK(t.core->streams == 0);
  CHECK(t.core->admit.streams_of_subject("user-1") == 0);

  auto in = t.go(routing::get("/v1/stream?tables=public.orders", {{"Authorization", t.bearer("\"role\":\"sales\"")}}));
  REQUIRE(in.stream);
  REQUIRE(in.stream->start.request.granted);
  CHECK(t.core->admit.streams_of_subject("user-1") == 1);
  // The subject's second stream: 429 (--max-streams-per-subject), and nothing held for it.
  auto second = t.go(routing::get("/v1/stream?tables=public.orders", {{"Authorization", t.bearer("\"role\":\"sales\"")}}));
  CHECK(reply_of(second).status == http::status::too_many_requests);
  CHECK(second.reply->retry_after == "5");
  CHECK(t.core->streams == 1);

  // admit_stream, as a /v1/mux subscription calls it: the same decisions.
  std::string err;
  auto who = std::make_shared<const identity>(*t.core->opts.auth->verify(test::token(t.key, "\"role\":\"sales\""), err));
  request_error rerr;
  auto outside_r = parse_stream_query("/v1/mux?tables=public.people", rerr);
  REQUIRE(outside_r);
  auto a = admit_stream(*t.core, std::move(*outside_r), who, "10.0.0.1", "/v1/mux");
  REQUIRE(std::holds_alternative<refusal>(a));
  CHECK(std::get<refusal>(a).status == 403);
  auto full_r = parse_stream_query("/v1/mux?tables=public.orders", rerr);
  REQUIRE(full_r);
  auto b = admit_stream(*t.core, std::move(*full_r), who, "10.0.0.1", "/v1/mux");
  REQUIRE(std::holds_alternative<refusal>(b));
  CHECK(std::get<refusal>(b).status == 429);
  in.stream.reset();
  auto again_r = parse_stream_query("/v1/mux?tables=public.orders", rerr);
  REQUIRE(again_r);
  auto c = admit_stream(*t.core, std::move(*again_r), who, "10.0.0.1", "/v1/mux");
  REQUIRE(std::holds_alternative<admitted_stream>(c));
  CHECK(std::get<admitted_stream>(c).start.who == who);
  CHECK(t.core->admit.streams_of_subject("user-1") == 1);
  // The refusals were counted by reason and path for /metrics and the log.
  CHECK(t.core->admit.refusals(admission::reason::forbidden) >= 3);
}
