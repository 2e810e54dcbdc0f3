// One HTTP connection, one coroutine (serve_connection): the TLS handshake when the listener has
// TLS, then requests (with the header, URL and time limits), the Host (DNS rebinding) and Origin
// (CORS) policy, /healthz, /readyz, /metrics, the live page and errors (serve_http); a stream
// request — parsed, admitted under --max-clients and positioned in the log — comes back from
// serve_http as a stream_handoff and goes to its transport, so that the request loop's frame is
// not kept for the life of the stream.
// Over 500 lines mostly because of serve_http (about 350): the request loop, one branch per
// endpoint, each ending in an answer written (co_await) or a handoff. The branches share the
// loop's locals (the stream, the request, cors, the peer, the refusal and authentication
// lambdas), which is why they are inline. The seams are clear if it grows: /metrics with its
// token check, the /v1/mux admission, and the /v1/stream and /v1/ws admission with its wait for
// a snapshot to begin (about 125 lines) could each be a coroutine that takes the request and
// returns the answer or the handoff; authentication (auth_outcome, authenticate, identify: about
// 100 lines) could be a file of its own.
#include "serving.hpp"

#include "walgate/transform/json.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket/rfc6455.hpp>

namespace walgate::proxy {

namespace asio = boost::asio;
namespace beast = boost::beast;
using asio::awaitable;

extern const char* live_page_html;   // live_page.cpp

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

template <class Stream>
awaitable<void> write_simple(server_core& core, Stream& s, unsigned version, http::status st, std::string_view type,
                             std::string body, bool keep_alive, std::string_view retry_after = {},
                             std::string_view cors = {}, std::string_view www_authenticate = {}) {
  http::response<http::string_body> res{st, version};
  res.set(http::field::server, "walgate");
  if (!retry_after.empty()) res.set(http::field::retry_after, retry_after);
  if (!www_authenticate.empty()) res.set(http::field::www_authenticate, www_authenticate);
  set_cors(res, cors);
  res.set(http::field::content_type, type);
  res.set(http::field::cache_control, "no-store");
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  beast::get_lowest_layer(s).expires_after(core.opts.write_timeout);
  co_await http::async_write(s, res, use_tuple);
}

/// A stream request's token, with authentication on: who it is, or the answer that refuses it
/// (RFC 6750 3: 401 with a Bearer challenge; 400 invalid_request for a malformed one).
struct auth_outcome {
  std::shared_ptr<const identity> who;
  unsigned status = 0;   // 0: served
  std::string parameter, message, challenge;
  admission::reason why = admission::reason::invalid_request;
  bool forged = false;   // refused before its signature held (malformed, unknown kid, bad signature)
  bool claims = false;   // genuine (its signature held), refused for its claims: expired, not yet valid, aud…
};

/// A reason as an auth-param's quoted-string: no quote, backslash or control character.
std::string auth_param(std::string_view s) {
  std::string out = "\"";
  for (char c : s.substr(0, 200)) out.push_back(c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20 ? '\'' : c);
  return out + "\"";
}

auth_outcome authenticate(server_core& core, const http::request<http::empty_body>& req, std::string_view query_token) {
  auth_outcome out;
  auto field = [&req](http::field f) {
    auto v = req[f];
    return std::string_view(v.data(), v.size());
  };
  // (bearer.<token> is a WebSocket's way; on a plain request the header means nothing)
  const auto subprotocols = beast::websocket::is_upgrade(req) ? field(http::field::sec_websocket_protocol) : std::string_view{};
  auto b = find_bearer(field(http::field::authorization), query_token, subprotocols);
  if (!b.error.empty()) {
    out.why = admission::reason::invalid_request;
    out.status = 400;
    out.message = b.error;
    out.challenge = "Bearer realm=\"walgate\", error=\"invalid_request\", error_description=" + auth_param(b.error);
  } else if (b.token.empty()) {
    out.why = admission::reason::no_token;
    out.status = 401;
    out.message = "a bearer token is required: Authorization: Bearer <token>, the access_token parameter, or (WebSocket) "
                  "the subprotocols walgate and bearer.<token>";
    out.challenge = "Bearer realm=\"walgate\"";
  } else {
    std::string why;
    bool signed_ok = false;
    auto v = core.opts.auth->verify(b.token, why, &signed_ok);
    if (!v) {
      out.why = admission::reason::invalid_token;
      out.forged = !signed_ok;
      out.claims = signed_ok;
      out.status = 401;
      out.message = "invalid token: " + why;
      out.challenge = "Bearer realm=\"walgate\", error=\"invalid_token\", error_description=" + auth_param(why);
    } else {
      out.who = std::make_shared<const identity>(std::move(*v));
    }
  }
  if (out.status) ++core.unauthorized;
  return out;
}

}  // namespace

std::optional<refusal> within_grants(server_core& core, const identity& who, stream_request& r) {
  if (!core.opts.auth || !core.opts.auth->has_policy()) return std::nullopt;
  auto g = core.opts.auth->grants_for(who);
  std::optional<std::pair<std::string, std::string>> no;
  if (!g) no = std::pair<std::string, std::string>{"", "this token is granted nothing: no grant of the policy matches its claims"};
  else no = authorize(std::move(g), r);
  if (no) {
    ++core.forbidden;
    return refusal{403, no->first, no->second, {}};
  }
  return std::nullopt;
}

namespace {

/// A WebSocket upgrade that offers bearer.<token> must offer walgate too: the answer has to
/// name one of the offered subprotocols, and it names walgate (never the token).
bool bearer_subprotocol_without_walgate(const http::request<http::empty_body>& req) {
  auto v = req[http::field::sec_websocket_protocol];
  std::string_view offer(v.data(), v.size());
  return !find_bearer({}, {}, offer).token.empty() && !offers_subprotocol(offer, "walgate");
}

/// Who a stream request is (/v1/ws and /v1/mux: websocket), or the answer that refuses it: the
/// subprotocol offer checked, then (with --auth jwt) the token. who is null without --auth.
auth_outcome identify(server_core& core, const http::request<http::empty_body>& req, std::string_view query_token,
                      bool websocket) {
  if (websocket && bearer_subprotocol_without_walgate(req)) {
    auth_outcome out;
    out.status = 400;
    out.parameter = "Sec-WebSocket-Protocol";
    out.message = "offer the subprotocol walgate with bearer.<token> (the answer names walgate)";
    return out;
  }
  if (!core.opts.auth) return {};
  return authenticate(core, req, query_token);
}

}  // namespace

/// The client's address for the limits (admission.hpp).
template <class Stream>
std::string peer_of(Stream& s) {
  return address_of(beast::get_lowest_layer(s).socket());
}

template <class Stream>
awaitable<std::optional<stream_handoff>> serve_http(server_core& core, Stream& s, const std::string& address) {
  const auto& opts = core.opts;
  beast::flat_buffer buffer;
  const std::string peer = peer_of(s);
  auto refused = [&](admission::reason why, unsigned status, std::string_view path, const identity* who, std::string_view message) {
    core.admit.refused(why, status, path, peer, who ? std::string_view(who->subject) : std::string_view{}, message,
                       std::chrono::steady_clock::now());
  };
  // Before a token is verified: an address that failed too often waits (429).
  auto failing = [&](std::string& message) -> std::string {
    if (!core.opts.auth) return {};
    auto which = admission::count_kind::invalid_tokens;
    auto wait = core.admit.blocked(peer, std::chrono::steady_clock::now(), &which);
    if (!wait) return {};
    const std::string limit = "limit " + std::to_string(opts.auth_failures_per_minute) + " a minute, --auth-failures-per-minute";
    message = "too many failed authentications from this address " +
              (which == admission::count_kind::refused_claims
                   ? "(genuine tokens refused for their claims: expired, not yet valid, another audience; " + limit +
                         "); get a fresh token and try again in "
                   : "(" + limit + "); try again in ") +
              std::to_string(*wait) + " s";
    return std::to_string(*wait);
  };
  // A refused authentication: counted, logged, and a token counts against the address — a
  // forged one as a failure, a genuine one refused for its claims (expired…) in a count of its
  // own (each cost a signature verification). No token, or a malformed request, does not count.
  auto unauthenticated = [&](const auth_outcome& a, std::string_view path) {
    refused(a.why, a.status, path, nullptr, a.message);
    if (a.forged) core.admit.failed(peer, std::chrono::steady_clock::now());
    else if (a.claims) core.admit.claims_refused(peer, std::chrono::steady_clock::now());
  };
  while (!core.stopping) {
    http::request_parser<http::empty_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(opts.header_limit + opts.url_limit));
    parser.body_limit(0);
    beast::get_lowest_layer(s).expires_after(opts.header_timeout);
    // Waiting for a request's head (an idle keep-alive too): another connection may take this
    // one's place meanwhile (server_core::make_room closes it).
    std::optional<waiting_mark> waiting;
    waiting.emplace(core, address, [&s] { beast::get_lowest_layer(s).close(); });
    auto [ec, n] = co_await http::async_read(s, buffer, parser, use_tuple);
    waiting.reset();
    if (ec == http::error::header_limit) {
      co_await write_simple(core, s, 11, http::status::request_header_fields_too_large, "application/json",
                            json_error("", "request header fields too large"), false);
      co_return std::nullopt;
    }
    if (ec == http::error::body_limit) {
      co_await write_simple(core, s, 11, http::status::payload_too_large, "application/json",
                            json_error("", "request bodies are not accepted"), false);
      co_return std::nullopt;
    }
    if (ec) co_return std::nullopt;   // closed, timed out (trickled headers) or malformed
    auto req = parser.release();
    std::size_t header_bytes = 0;
    for (const auto& f : req) header_bytes += f.name_string().size() + f.value().size() + 4;
    if (req.target().size() > opts.url_limit) {
      co_await write_simple(core, s, req.version(), http::status::uri_too_long, "application/json",
                            json_error("", "request URL too long"), false);
      co_return std::nullopt;
    }
    if (header_bytes > opts.header_limit) {
      co_await write_simple(core, s, req.version(), http::status::request_header_fields_too_large, "application/json",
                            json_error("", "request header fields too large"), false);
      co_return std::nullopt;
    }
    std::string_view target(req.target().data(), req.target().size());
    std::string_view path = target.substr(0, target.find('?'));
    bool keep = req.keep_alive();
    auto host_field = req[http::field::host];
    std::string_view host(host_field.data(), host_field.size());
    if (core.check_host && !loopback_host_allowed(host, opts.allowed_hosts, !core.loopback_listener)) {
      ++core.rejected_origins;
      std::string name(host.substr(0, std::min<std::size_t>(host.size(), 200)));
      co_await write_simple(core, s, req.version(), http::status::forbidden, "application/json",
                            json_error("", "Host " + name +
                                               (core.loopback_listener ? " is not served on a loopback address"
                                                                       : " is not served without authentication") +
                                               " (a DNS-rebinding page poses as the gateway so): a reverse proxy "
                                               "or a name of this machine that sends it needs --allow-host"),
                            false);
      co_return std::nullopt;
    }
    // Cross-origin browser requests: only from the origins allowed (CORS headers on their
    // responses), never a page of any site reading the stream through its visitor's browser.
    auto origin_field = req[http::field::origin];
    std::string_view origin(origin_field.data(), origin_field.size());
    if (!origin_allowed(origin, host, opts.allowed_origins)) {
      ++core.rejected_origins;
      co_await write_simple(core, s, req.version(), http::status::forbidden, "application/json",
                            json_error("", "origin " + std::string(origin.substr(0, 200)) +
                                               " is not allowed: start walgate with --allow-origin " +
                                               std::string(origin.substr(0, 200))),
                            false);
      co_return std::nullopt;
    }
    std::string_view cors = origin;   // set only when the request is allowed and has one
    if (req.method() == http::verb::options && !origin.empty()) {   // a CORS preflight
      http::response<http::empty_body> res{http::status::no_content, req.version()};
      res.set(http::field::server, "walgate");
      set_cors(res, cors);
      res.set(http::field::access_control_allow_methods, "GET");
      res.set(http::field::access_control_allow_headers, "Accept, Authorization, Last-Event-ID, Cache-Control");
      res.set(http::field::access_control_max_age, "600");
      res.keep_alive(keep);
      beast::get_lowest_layer(s).expires_after(opts.write_timeout);
      co_await http::async_write(s, res, use_tuple);
      if (!keep) co_return std::nullopt;
      continue;
    }
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      co_await write_simple(core, s, req.version(), http::status::method_not_allowed, "application/json",
                            json_error("", "only GET is supported"), false, {}, cors);
      co_return std::nullopt;
    }
    if (path == "/healthz") {
      co_await write_simple(core, s, req.version(), http::status::ok, "application/json", "{\"status\":\"ok\"}\n", keep,
                            {}, cors);
    } else if (path == "/readyz") {
      const std::string& fault = core.gw.stream_fault();
      bool ready = core.status.streaming && core.status.streaming() && fault.empty();
      std::string body = ready ? "{\"status\":\"streaming\"}\n" : "{\"status\":\"not streaming\"}\n";
      if (!fault.empty()) {   // serving what is logged; the stream itself is stuck, and why
        body = "{\"status\":\"stream fault\",\"reason\":";
        transform::append_json_string(body, fault);
        body += "}\n";
      }
      co_await write_simple(core, s, req.version(), ready ? http::status::ok : http::status::service_unavailable,
                            "application/json", std::move(body), keep, {}, cors);
    } else if (path == "/metrics") {
      // With --auth jwt: a token in the Authorization header that carries the claim
      // --metrics-claim names (the figures tell WAL positions and every client's activity).
      if (opts.auth) {
        const std::string claim = opts.metrics_claim + "=" + opts.metrics_claim_value;
        std::string wait_message;
        if (auto wait = failing(wait_message); !wait.empty()) {
          refused(admission::reason::auth_rate_limit, 429, path, nullptr, wait_message);
          co_await write_simple(core, s, req.version(), http::status::too_many_requests, "application/json",
                                json_error("", wait_message), false, wait, cors);
          co_return std::nullopt;
        }
        auto a = authenticate(core, req, {});
        if (a.why == admission::reason::no_token && a.status == 401)
          a.message = "/metrics needs a bearer token with the claim " + claim + ": Authorization: Bearer <token>";
        if (a.status) {
          unauthenticated(a, path);
          co_await write_simple(core, s, req.version(), static_cast<http::status>(a.status), "application/json",
                                json_error(a.parameter, a.message), false, {}, cors, a.challenge);
          co_return std::nullopt;
        }
        if (!claim_equals(*a.who, opts.metrics_claim, opts.metrics_claim_value)) {
          const std::string message = "this token does not carry the claim " + claim + " that /metrics needs (--metrics-claim)";
          refused(admission::reason::forbidden, 403, path, a.who.get(), message);
          co_await write_simple(core, s, req.version(), http::status::forbidden, "application/json",
                                json_error("", message), false, {}, cors);
          co_return std::nullopt;
        }
      }
      co_await write_simple(core, s, req.version(), http::status::ok, "text/plain; version=0.0.4", core.metrics.render(),
                            keep, {}, cors);
    } else if (path == "/") {
      co_await write_simple(core, s, req.version(), http::status::ok, "text/html; charset=utf-8", live_page_html, keep,
                            {}, cors);
    } else if (path == "/v1/mux") {
      // The subscriptions come in the client's messages: the URL takes nothing but a token.
      request_error err;
      auto query_token = parse_mux_query(target, err);
      if (!query_token) {
        co_await write_simple(core, s, req.version(), http::status::bad_request, "application/json",
                              json_error(err.parameter, err.message), false, {}, cors);
        co_return std::nullopt;
      }
      std::string wait_message;
      if (auto wait = failing(wait_message); !wait.empty()) {
        refused(admission::reason::auth_rate_limit, 429, path, nullptr, wait_message);
        co_await write_simple(core, s, req.version(), http::status::too_many_requests, "application/json",
                              json_error("", wait_message), false, wait, cors);
        co_return std::nullopt;
      }
      auto a = identify(core, req, *query_token, true);
      if (a.status) {
        unauthenticated(a, path);
        co_await write_simple(core, s, req.version(), static_cast<http::status>(a.status), "application/json",
                              json_error(a.parameter, a.message), false, {}, cors, a.challenge);
        co_return std::nullopt;
      }
      std::shared_ptr<const identity> who = std::move(a.who);
      if (!beast::websocket::is_upgrade(req)) {
        co_await write_simple(core, s, req.version(), http::status::upgrade_required, "application/json",
                              json_error("", "/v1/mux needs a WebSocket upgrade"), false, {}, cors);
        co_return std::nullopt;
      }
      // The connection holds a stream client's place (an idle one too), and so does each of
      // its subscriptions.
      if (core.streams >= opts.max_clients) {
        ++core.rejected_clients;
        const std::string message = "too many clients (limit " + std::to_string(opts.max_clients) + "); try again later";
        refused(admission::reason::too_many_clients, 503, path, who.get(), message);
        co_await write_simple(core, s, req.version(), http::status::service_unavailable, "application/json",
                              json_error("", message), false, "5", cors);
        co_return std::nullopt;
      }
      admission::reason over{};
      std::string over_message;
      auto slot = core.admit.take(who ? std::string_view(who->subject) : std::string_view{}, peer, over, over_message);
      if (!slot) {
        refused(over, 429, path, who.get(), over_message);
        co_await write_simple(core, s, req.version(), http::status::too_many_requests, "application/json",
                              json_error("", over_message), false, "5", cors);
        co_return std::nullopt;
      }
      stream_handoff h{stream_handoff::to::mux, req.version(), std::string(cors), std::move(req), {}, std::nullopt, std::nullopt, {}};
      h.slot = std::move(slot);
      h.peer = peer;
      h.start.who = std::move(who);
      h.admitted.emplace(core.streams);
      co_return h;
    } else if (path == "/v1/stream" || path == "/v1/ws") {
      stream_start start;
      request_error err;
      auto r = parse_stream_query(target, err);
      if (!r) {
        co_await write_simple(core, s, req.version(), http::status::bad_request, "application/json",
                              json_error(err.parameter, err.message), false, {}, cors);
        co_return std::nullopt;
      }
      // Who it is, before anything about the log is said to it.
      std::string wait_message;
      if (auto wait = failing(wait_message); !wait.empty()) {
        refused(admission::reason::auth_rate_limit, 429, path, nullptr, wait_message);
        co_await write_simple(core, s, req.version(), http::status::too_many_requests, "application/json",
                              json_error("", wait_message), false, wait, cors);
        co_return std::nullopt;
      }
      auto a = identify(core, req, r->access_token, path == "/v1/ws");
      if (a.status) {
        unauthenticated(a, path);
        co_await write_simple(core, s, req.version(), static_cast<http::status>(a.status), "application/json",
                              json_error(a.parameter, a.message), false, {}, cors, a.challenge);
        co_return std::nullopt;
      }
      std::shared_ptr<const identity> who = std::move(a.who);
      if (who) {
        // --policy: served within what the token grants, or 403 (never a silent narrowing).
        if (auto no = within_grants(core, *who, *r)) {
          refused(admission::reason::forbidden, no->status, path, who.get(), no->message);
          co_await write_simple(core, s, req.version(), static_cast<http::status>(no->status), "application/json",
                                json_error(no->parameter, no->message), false, {}, cors);
          co_return std::nullopt;
        }
      }
      r->access_token.clear();   // (not kept with the stream)
      instantiate_where(*r, who ? &who->claims : nullptr);
      if (auto no = servable_rows(core, *r)) {   // (what can be told now of its tables)
        co_await write_simple(core, s, req.version(), static_cast<http::status>(no->status), "application/json",
                              json_error(no->parameter, no->message), false, {}, cors);
        co_return std::nullopt;
      }
      auto last_event_id = req["Last-Event-ID"];
      admission::reason over{};
      std::string over_message;
      auto slot = core.admit.take(who ? std::string_view(who->subject) : std::string_view{}, peer, over, over_message);
      if (!slot) {
        refused(over, 429, path, who.get(), over_message);
        co_await write_simple(core, s, req.version(), http::status::too_many_requests, "application/json",
                              json_error("", over_message), false, "5", cors);
        co_return std::nullopt;
      }
      if (auto no = position(core, std::move(*r), std::string_view(last_event_id.data(), last_event_id.size()), start)) {
        if (no->status == 503 && no->parameter.empty()) refused(admission::reason::too_many_clients, 503, path, who.get(), no->message);
        co_await write_simple(core, s, req.version(), static_cast<http::status>(no->status), "application/json",
                              json_error(no->parameter, no->message), false, no->retry_after, cors);
        co_return std::nullopt;
      }
      start.who = std::move(who);
      stream_handoff h;
      h.admitted.emplace(core.streams);
      h.slot = std::move(slot);
      if (path == "/v1/ws" && !beast::websocket::is_upgrade(req)) {
        co_await write_simple(core, s, req.version(), http::status::upgrade_required, "application/json",
                              json_error("", "/v1/ws needs a WebSocket upgrade"), false, {}, cors);
        co_return std::nullopt;
      }
      // snapshot=true (and not resuming): the rows first. Its transaction is open and its
      // tables known before the response begins, so that what fails there is an answer (400
      // for a table not published, 503 while PostgreSQL cannot be reached or too many wait).
      if (start.request.snapshot && !start.request.from) {
        unsigned code = 0;
        std::string why;
        auto job = core.snapshots.admit(start.request, core.encodings.encoder(), code, why, peer,
                                        start.who ? std::string_view(start.who->subject) : std::string_view{});
        if (job) {
          asio::steady_timer t(core.executor);
          job->set_wake([&t] { t.cancel(); });
          // A client that hangs up while its snapshot waits or is being taken is noticed at
          // once: its job goes (cancelled), and its place in the queue with it.
          auto gone = std::make_shared<bool>(false), watching = std::make_shared<bool>(true);
          auto& sock = beast::get_lowest_layer(s).socket();
          sock.async_wait(asio::ip::tcp::socket::wait_read, [gone, watching, &t, &sock](boost::system::error_code ec) {
            if (ec || !*watching) return;
            if (peer_closed(sock.native_handle())) {
              *gone = true;
              t.cancel();
            }
          });
          while (!job->started() && job->current() != snapshot_job::state::failed && !core.stopping && !*gone) {
            t.expires_after(std::chrono::seconds(1));
            co_await t.async_wait(use_tuple);
          }
          job->set_wake({});
          *watching = false;
          boost::system::error_code ignored;
          sock.cancel(ignored);   // (the watch ends; the transport watches from here on)
          if (*gone) co_return std::nullopt;   // (the job is cancelled as it goes)
          if (!job->started()) {
            code = job->http_status() ? job->http_status() : 503;
            why = core.stopping ? "server shutting down" : job->error();
            job->cancel();
            job.reset();
          }
        }
        if (!job) {
          co_await write_simple(core, s, req.version(), static_cast<http::status>(code), "application/json",
                                json_error("snapshot", why), false, code == 503 ? "5" : code == 429 ? "60" : "", cors);
          co_return std::nullopt;
        }
        start.seq = job->start_seq();
        start.snapshot = std::move(job);
      }
      h.version = req.version();
      h.cors = std::string(cors);
      h.start = std::move(start);
      if (path == "/v1/ws") {
        h.what = stream_handoff::to::websocket;
        h.req = std::move(req);
      } else {
        auto accept = req[http::field::accept];
        const bool sse = std::string_view(accept.data(), accept.size()).find("text/event-stream") != std::string_view::npos;
        h.what = sse ? stream_handoff::to::sse : stream_handoff::to::ndjson;
      }
      co_return h;
    } else {
      co_await write_simple(core, s, req.version(), http::status::not_found, "application/json",
                            json_error("", "no such endpoint"), keep, {}, cors);
    }
    if (!keep) co_return std::nullopt;
  }
  co_return std::nullopt;
}

template <class Stream>
awaitable<void> serve_connection(server_core& core, asio::ip::tcp::socket socket, std::shared_ptr<void> keep,
                                 std::string address) {
  // Counted, the server kept, and the TLS context it began with (a reload replaces core.tls),
  // while the connection lives; and its place among those that are not streams until it is one.
  connection_hold hold{counted(core.connections), std::move(keep), {}, std::nullopt, std::nullopt};
  non_stream_place place(core, std::move(address));
  constexpr bool tls = !std::is_same_v<Stream, beast::tcp_stream>;
  auto make = [&] {
    if constexpr (tls) {
      hold.tls_context = core.tls;
      return Stream(beast::tcp_stream(std::move(socket)), *core.tls);
    } else {
      return Stream(std::move(socket));
    }
  };
  std::optional<Stream> held(make());
  Stream& s = *held;
  if constexpr (tls) {
    beast::get_lowest_layer(s).expires_after(core.opts.header_timeout);
    waiting_mark waiting(core, place.address(), [&s] { beast::get_lowest_layer(s).close(); });
    auto [ec] = co_await s.async_handshake(asio::ssl::stream_base::server, use_tuple);
    if (ec) co_return;
  }
  auto h = co_await serve_http(core, s, place.address());
  if (!h) co_return;
  place.release();   // a stream now: --max-clients and the stream limits count it
  // Every stream is served by a coroutine of its own, which takes the connection over (this
  // one, its frame and the request's state, ends here). It takes, over TLS, its stream, else
  // the bare socket — the Beast stream (its body and timers) is freed here, not kept idle for
  // the connection's life — and its places under the limits.
  auto handed = [&] {
    if (h->admitted) hold.admitted.emplace(std::move(*h->admitted));
    if (h->slot) hold.slot.emplace(std::move(*h->slot));
    if constexpr (tls) {
      return std::move(s);
    } else {
      auto socket = s.release_socket();
      held.reset();
      return socket;
    }
  };
  switch (h->what) {
    // (handed() first: it moves the limits' places into hold.)
    case stream_handoff::to::ndjson:
    case stream_handoff::to::sse: {
      auto taken = handed();
      auto start = std::make_unique<chunked_start>(chunked_start{std::move(h->start), h->version, std::move(h->cors)});
      if (h->what == stream_handoff::to::sse)
        asio::co_spawn(core.executor, serve_sse(core, std::move(taken), std::move(start), std::move(hold)), asio::detached);
      else
        asio::co_spawn(core.executor, serve_ndjson(core, std::move(taken), std::move(start), std::move(hold)),
                       asio::detached);
      break;
    }
    case stream_handoff::to::websocket: {
      auto taken = handed();
      asio::co_spawn(core.executor,
                     serve_websocket(core, std::move(taken), std::move(h->req), std::move(h->start), std::move(hold)),
                     asio::detached);
      break;
    }
    case stream_handoff::to::mux: {
      auto taken = handed();
      asio::co_spawn(core.executor,
                     serve_websocket_mux(core, std::move(taken), std::move(h->req), std::move(h->start.who),
                                         std::move(h->peer), std::move(hold)),
                     asio::detached);
      break;
    }
  }
}

template awaitable<void> serve_connection<beast::tcp_stream>(server_core&, asio::ip::tcp::socket, std::shared_ptr<void>,
                                                             std::string);
template awaitable<void> serve_connection<beast::ssl_stream<beast::tcp_stream>>(server_core&, asio::ip::tcp::socket,
                                                                                std::shared_ptr<void>, std::string);

}  // namespace walgate::proxy
