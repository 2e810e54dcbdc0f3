// Routing (route.hpp): a request and the server's state in, an answer or an admitted stream out.
// No socket, no coroutine: what the connection does with the result is http_session.cpp's.
#include "route.hpp"

#include "walgate/transform/json.hpp"

#include <boost/beast/websocket/rfc6455.hpp>

namespace walgate::proxy {

extern const char* live_page_html;   // live_page.cpp

namespace {

namespace beast = boost::beast;

std::string_view field_of(const http::request<http::empty_body>& req, http::field f) {
  auto v = req[f];
  return {v.data(), v.size()};
}

std::string_view last_event_id(const http::request<http::empty_body>& req) {
  auto v = req["Last-Event-ID"];   // (Beast has no field enum for it)
  return {v.data(), v.size()};
}

answer refuse(http::status st, std::string body, std::string_view cors = {}, std::string retry_after = {}) {
  answer a;
  a.status = st;
  a.body = std::move(body);
  a.cors = std::string(cors);
  a.retry_after = std::move(retry_after);
  return a;
}

answer ok(http::status st, std::string_view type, std::string body, bool keep, std::string_view cors) {
  answer a;
  a.status = st;
  a.content_type = std::string(type);
  a.body = std::move(body);
  a.keep_alive = keep;
  a.cors = std::string(cors);
  return a;
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
  // (bearer.<token> is a WebSocket's way; on a plain request the header means nothing)
  const auto subprotocols =
      beast::websocket::is_upgrade(req) ? field_of(req, http::field::sec_websocket_protocol) : std::string_view{};
  auto b = find_bearer(field_of(req, http::field::authorization), query_token, subprotocols);
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

/// A WebSocket upgrade that offers bearer.<token> must offer walgate too: the answer has to
/// name one of the offered subprotocols, and it names walgate (never the token).
bool bearer_subprotocol_without_walgate(const http::request<http::empty_body>& req) {
  const auto offer = field_of(req, http::field::sec_websocket_protocol);
  return !find_bearer({}, {}, offer).token.empty() && !offers_subprotocol(offer, "walgate");
}

/// One request's routing: the request, the server, the client's address and the Origin its
/// answers may be read by.
struct request_context {
  server_core& core;
  http::request<http::empty_body>& req;
  const std::string& peer;
  std::string_view path;
  std::string_view cors;

  void refused(admission::reason why, unsigned status, const identity* who, std::string_view message) const {
    core.admit.refused(why, status, path, peer, who ? std::string_view(who->subject) : std::string_view{}, message,
                       std::chrono::steady_clock::now());
  }

  /// Before a token is verified: an address that failed too often waits (429).
  std::optional<answer> failing() const {
    if (!core.opts.auth) return std::nullopt;
    auto which = admission::count_kind::invalid_tokens;
    auto wait = core.admit.blocked(peer, std::chrono::steady_clock::now(), &which);
    if (!wait) return std::nullopt;
    const std::string limit =
        "limit " + std::to_string(core.opts.auth_failures_per_minute) + " a minute, --auth-failures-per-minute";
    const std::string message = "too many failed authentications from this address " +
                                (which == admission::count_kind::refused_claims
                                     ? "(genuine tokens refused for their claims: expired, not yet valid, another audience; " +
                                           limit + "); get a fresh token and try again in "
                                     : "(" + limit + "); try again in ") +
                                std::to_string(*wait) + " s";
    refused(admission::reason::auth_rate_limit, 429, nullptr, message);
    return refuse(http::status::too_many_requests, json_error("", message), cors, std::to_string(*wait));
  }

  /// A refused authentication: counted, logged, and a token counts against the address — a
  /// forged one as a failure, a genuine one refused for its claims (expired…) in a count of its
  /// own (each cost a signature verification). No token, or a malformed request, does not count.
  answer unauthenticated(const auth_outcome& a) const {
    refused(a.why, a.status, nullptr, a.message);
    if (a.forged) core.admit.failed(peer, std::chrono::steady_clock::now());
    else if (a.claims) core.admit.claims_refused(peer, std::chrono::steady_clock::now());
    answer out = refuse(static_cast<http::status>(a.status), json_error(a.parameter, a.message), cors);
    out.www_authenticate = a.challenge;
    return out;
  }

  /// Who a stream request is (/v1/ws and /v1/mux: websocket), or the answer that refuses it:
  /// an address failing too often (429), the subprotocol offer checked, then (with --auth jwt)
  /// the token. who stays null without --auth.
  std::optional<answer> identify(std::string_view query_token, bool websocket, std::shared_ptr<const identity>& who) const {
    if (auto wait = failing()) return wait;
    if (websocket && bearer_subprotocol_without_walgate(req)) {
      auth_outcome out;
      out.status = 400;
      out.parameter = "Sec-WebSocket-Protocol";
      out.message = "offer the subprotocol walgate with bearer.<token> (the answer names walgate)";
      return unauthenticated(out);
    }
    if (!core.opts.auth) return std::nullopt;
    auto a = authenticate(core, req, query_token);
    if (a.status) return unauthenticated(a);
    who = std::move(a.who);
    return std::nullopt;
  }

  answer healthz() const { return ok(http::status::ok, "application/json", "{\"status\":\"ok\"}\n", req.keep_alive(), cors); }

  answer readyz() const {
    const std::string& fault = core.gw.stream_fault();
    const bool ready = core.status.streaming && core.status.streaming() && fault.empty();
    std::string body = ready ? "{\"status\":\"streaming\"}\n" : "{\"status\":\"not streaming\"}\n";
    if (!fault.empty()) {   // serving what is logged; the stream itself is stuck, and why
      body = "{\"status\":\"stream fault\",\"reason\":";
      transform::append_json_string(body, fault);
      body += "}\n";
    }
    return ok(ready ? http::status::ok : http::status::service_unavailable, "application/json", std::move(body),
              req.keep_alive(), cors);
  }

  /// With --auth jwt: a token in the Authorization header that carries the claim
  /// --metrics-claim names (the figures tell WAL positions and every client's activity).
  answer metrics() const {
    if (auto refused_here = operator_only("/metrics")) return *refused_here;
    return ok(http::status::ok, "text/plain; version=0.0.4", core.metrics.render(), req.keep_alive(), cors);
  }

  /// /v1/slots: the downstream slots (with --replication-listen), for the same tokens as /metrics.
  answer slots() const {
    if (!core.opts.slots_json)
      return ok(http::status::not_found, "application/json",
                json_error("", "no downstream slots: walgate serves /v1/slots with --replication-listen"), req.keep_alive(),
                cors);
    if (auto refused_here = operator_only("/v1/slots")) return *refused_here;
    return ok(http::status::ok, "application/json", core.opts.slots_json(), req.keep_alive(), cors);
  }

  /// With --auth jwt, what an operator's endpoint (/metrics, /v1/slots) answers a request whose
  /// token does not carry the --metrics-claim claim; nullopt: it may have it.
  std::optional<answer> operator_only(const char* endpoint) const {
    const auto& opts = core.opts;
    if (!opts.auth) return std::nullopt;
    const std::string claim = opts.metrics_claim + "=" + opts.metrics_claim_value;
    if (auto wait = failing()) return *wait;
    auto a = authenticate(core, req, {});
    if (a.why == admission::reason::no_token && a.status == 401)
      a.message = std::string(endpoint) + " needs a bearer token with the claim " + claim + ": Authorization: Bearer <token>";
    if (a.status) return unauthenticated(a);
    if (!claim_equals(*a.who, opts.metrics_claim, opts.metrics_claim_value)) {
      const std::string message =
          "this token does not carry the claim " + claim + " that " + endpoint + " needs (--metrics-claim)";
      refused(admission::reason::forbidden, 403, a.who.get(), message);
      return refuse(http::status::forbidden, json_error("", message), cors);
    }
    return std::nullopt;
  }

  /// /v1/mux: the subscriptions come in the client's messages (each admitted by admit_stream,
  /// websocket_mux.cpp); the URL takes nothing but a token. The connection holds a stream
  /// client's place (an idle one too), and so does each of its subscriptions.
  routed mux() const {
    routed out;
    request_error err;
    auto query_token = parse_mux_query(std::string_view(req.target().data(), req.target().size()), err);
    if (!query_token) {
      out.reply = refuse(http::status::bad_request, json_error(err.parameter, err.message), cors);
      return out;
    }
    std::shared_ptr<const identity> who;
    if (auto no = identify(*query_token, true, who)) {
      out.reply = std::move(no);
      return out;
    }
    if (!beast::websocket::is_upgrade(req)) {
      out.reply = refuse(http::status::upgrade_required, json_error("", "/v1/mux needs a WebSocket upgrade"), cors);
      return out;
    }
    if (core.streams >= core.opts.max_clients) {
      ++core.rejected_clients;
      const std::string message = "too many clients (limit " + std::to_string(core.opts.max_clients) + "); try again later";
      refused(admission::reason::too_many_clients, 503, who.get(), message);
      out.reply = refuse(http::status::service_unavailable, json_error("", message), cors, "5");
      return out;
    }
    admission::reason over{};
    std::string over_message;
    auto slot = core.admit.take(who ? std::string_view(who->subject) : std::string_view{}, peer, over, over_message);
    if (!slot) {
      refused(over, 429, who.get(), over_message);
      out.reply = refuse(http::status::too_many_requests, json_error("", over_message), cors, "5");
      return out;
    }
    stream_handoff& h = out.stream.emplace();
    h.what = stream_handoff::to::mux;
    h.version = req.version();
    h.cors = std::string(cors);
    h.req = std::move(req);
    h.slot = std::move(slot);
    h.peer = peer;
    h.start.who = std::move(who);
    h.admitted.emplace(core.streams);
    return out;
  }

  /// /v1/stream (NDJSON, or SSE by its Accept) and /v1/ws.
  routed stream() const {
    routed out;
    const bool ws = path == "/v1/ws";
    request_error err;
    auto r = parse_stream_query(std::string_view(req.target().data(), req.target().size()), err);
    if (!r) {
      out.reply = refuse(http::status::bad_request, json_error(err.parameter, err.message), cors);
      return out;
    }
    // Who it is, before anything about the log is said to it.
    std::shared_ptr<const identity> who;
    if (auto no = identify(r->access_token, ws, who)) {
      out.reply = std::move(no);
      return out;
    }
    r->access_token.clear();   // (not kept with the stream)
    auto admitted = admit_stream(core, std::move(*r), std::move(who), peer, path, last_event_id(req));
    if (auto* no = std::get_if<refusal>(&admitted)) {
      out.reply = refuse(static_cast<http::status>(no->status), json_error(no->parameter, no->message), cors,
                         std::move(no->retry_after));
      return out;
    }
    auto& a = std::get<admitted_stream>(admitted);
    stream_handoff h;
    h.admitted.emplace(core.streams);
    h.slot = std::move(a.slot);
    if (ws && !beast::websocket::is_upgrade(req)) {
      out.reply = refuse(http::status::upgrade_required, json_error("", "/v1/ws needs a WebSocket upgrade"), cors);
      return out;
    }
    // snapshot=true (and not resuming): the rows first. Its transaction is open and its
    // tables known before the response begins, so that what fails there is an answer (400
    // for a table not published, 503 while PostgreSQL cannot be reached or too many wait).
    if (a.start.request.snapshot && !a.start.request.from) {
      unsigned code = 0;
      std::string why;
      auto job = core.snapshots.admit(a.start.request, core.encodings.encoder(), code, why, peer,
                                      a.start.who ? std::string_view(a.start.who->subject) : std::string_view{});
      if (!job) {
        out.reply = snapshot_refused(code, std::move(why), cors);
        return out;
      }
      out.snapshot = std::move(job);
    }
    h.version = req.version();
    h.cors = std::string(cors);
    h.start = std::move(a.start);
    if (ws) {
      h.what = stream_handoff::to::websocket;
      h.req = std::move(req);
    } else {
      const bool sse = field_of(req, http::field::accept).find("text/event-stream") != std::string_view::npos;
      h.what = sse ? stream_handoff::to::sse : stream_handoff::to::ndjson;
    }
    out.stream.emplace(std::move(h));
    return out;
  }
};

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

std::variant<admitted_stream, refusal> admit_stream(server_core& core, stream_request r,
                                                    std::shared_ptr<const identity> who, std::string_view peer,
                                                    std::string_view path, std::string_view last_event_id) {
  auto refused = [&](admission::reason why, unsigned status, std::string_view message) {
    core.admit.refused(why, status, path, peer, who ? std::string_view(who->subject) : std::string_view{}, message,
                       std::chrono::steady_clock::now());
  };
  // --policy: served within what the token grants, or 403 (never a silent narrowing).
  if (who)
    if (auto no = within_grants(core, *who, r)) {
      refused(admission::reason::forbidden, no->status, no->message);
      return std::move(*no);
    }
  instantiate_where(r, who ? &who->claims : nullptr);
  if (auto no = servable_rows(core, r)) return std::move(*no);   // (what can be told now of its tables)
  admission::reason over{};
  std::string over_message;
  auto slot = core.admit.take(who ? std::string_view(who->subject) : std::string_view{}, peer, over, over_message);
  if (!slot) {
    refused(over, 429, over_message);
    return refusal{429, "", std::move(over_message), "5"};
  }
  stream_start start;
  if (auto no = position(core, std::move(r), last_event_id, start)) {
    if (no->status == 503 && no->parameter.empty()) refused(admission::reason::too_many_clients, 503, no->message);
    return std::move(*no);
  }
  start.who = std::move(who);
  return admitted_stream{std::move(start), std::move(*slot)};
}

void begin_with(stream_handoff& h, std::shared_ptr<snapshot_job> job) {
  h.start.seq = job->start_seq();
  h.start.snapshot = std::move(job);
}

answer snapshot_refused(unsigned code, std::string why, std::string_view cors) {
  return refuse(static_cast<http::status>(code), json_error("snapshot", why), cors,
                code == 503 ? "5" : code == 429 ? "60" : "");
}

routed route(server_core& core, http::request<http::empty_body>& req, const std::string& peer) {
  const auto& opts = core.opts;
  routed out;
  std::size_t header_bytes = 0;
  for (const auto& f : req) header_bytes += f.name_string().size() + f.value().size() + 4;
  if (req.target().size() > opts.url_limit) {
    out.reply = refuse(http::status::uri_too_long, json_error("", "request URL too long"));
    return out;
  }
  if (header_bytes > opts.header_limit) {
    out.reply = refuse(http::status::request_header_fields_too_large, json_error("", "request header fields too large"));
    return out;
  }
  const std::string_view target(req.target().data(), req.target().size());
  const std::string_view path = target.substr(0, target.find('?'));
  const std::string_view host = field_of(req, http::field::host);
  if (core.check_host && !loopback_host_allowed(host, opts.allowed_hosts, !core.loopback_listener)) {
    ++core.rejected_origins;
    const std::string name(host.substr(0, std::min<std::size_t>(host.size(), 200)));
    out.reply = refuse(http::status::forbidden,
                       json_error("", "Host " + name +
                                          (core.loopback_listener ? " is not served on a loopback address"
                                                                  : " is not served without authentication") +
                                          " (a DNS-rebinding page poses as the gateway so): a reverse proxy "
                                          "or a name of this machine that sends it needs --allow-host"));
    return out;
  }
  // Cross-origin browser requests: only from the origins allowed (CORS headers on their
  // responses), never a page of any site reading the stream through its visitor's browser.
  const std::string_view origin = field_of(req, http::field::origin);
  if (!origin_allowed(origin, host, opts.allowed_origins)) {
    ++core.rejected_origins;
    out.reply = refuse(http::status::forbidden,
                       json_error("", "origin " + std::string(origin.substr(0, 200)) +
                                          " is not allowed: start walgate with --allow-origin " +
                                          std::string(origin.substr(0, 200))));
    return out;
  }
  const std::string_view cors = origin;   // set only when the request is allowed and has one
  if (req.method() == http::verb::options && !origin.empty()) {   // a CORS preflight
    answer a = ok(http::status::no_content, {}, {}, req.keep_alive(), cors);
    a.preflight = true;
    out.reply = std::move(a);
    return out;
  }
  if (req.method() != http::verb::get && req.method() != http::verb::head) {
    out.reply = refuse(http::status::method_not_allowed, json_error("", "only GET is supported"), cors);
    return out;
  }
  const request_context ctx{core, req, peer, path, cors};
  if (path == "/healthz") out.reply = ctx.healthz();
  else if (path == "/readyz") out.reply = ctx.readyz();
  else if (path == "/metrics") out.reply = ctx.metrics();
  else if (path == "/v1/slots") out.reply = ctx.slots();
  else if (path == "/") out.reply = ok(http::status::ok, "text/html; charset=utf-8", live_page_html, req.keep_alive(), cors);
  else if (path == "/v1/mux") return ctx.mux();
  else if (path == "/v1/stream" || path == "/v1/ws") return ctx.stream();
  else out.reply = ok(http::status::not_found, "application/json", json_error("", "no such endpoint"), req.keep_alive(), cors);
  return out;
}

}  // namespace walgate::proxy
