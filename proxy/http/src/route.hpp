// What a request gets, decided without a socket (route.cpp): the request's size limits, the Host
// (DNS rebinding) and Origin (CORS) policy, the CORS preflight, /healthz, /readyz, /metrics with
// its token, the live page, 404 — an answer — and the stream endpoints, admitted: /v1/stream and
// /v1/ws (authenticated, within their grants, their tables servable, a place under the limits,
// positioned in the log, their snapshot job admitted) and /v1/mux — a stream hand-off. The
// connection (http_session.cpp) reads the request, writes the answer or waits for the snapshot to
// begin and hands the stream to its transport.
//
// Assumptions, each broken by a test in tests/proxy/route_test.cpp:
// - routing reads only the request and server_core: the same request on the same state gets the
//   same answer, and nothing about a socket decides it (the peer's address comes as a string);
// - an answer that is not keep_alive ends the connection (every refusal); the ones that keep it
//   are the ones a page polls (/healthz, /readyz, /metrics, /, a preflight, 404);
// - a refusal takes nothing: no place under --max-clients or the per-subject/per-address limits is
//   held by a request that is answered (the handoff owns them, and is dropped with the answer);
// - a request is authenticated before anything about the log is said to it (400 for its query
//   parameters is the only thing said first: they are the request's, not the log's).
#pragma once

#include "serving.hpp"

#include <optional>
#include <string>
#include <variant>

namespace walgate::proxy {

/// An answer routing decided, written by the connection: nothing in it is a socket's.
struct answer {
  http::status status = http::status::ok;
  std::string content_type = "application/json";
  std::string body;
  bool keep_alive = false;        ///< the connection reads its next request after it
  std::string retry_after;        ///< Retry-After (empty: none)
  std::string www_authenticate;   ///< WWW-Authenticate (a Bearer challenge)
  std::string cors;               ///< the allowed Origin it is read by (empty: none)
  bool preflight = false;         ///< a CORS preflight's 204: no body, the Access-Control-Allow-* fields
};

/// A request routed: an answer, or a stream admitted and handed off. With snapshot set, the
/// stream's snapshot job is admitted but has not begun: the connection waits for it (and for a
/// hang-up), then begin_with() or snapshot_refused().
struct routed {
  std::optional<answer> reply;
  std::optional<stream_handoff> stream;
  std::shared_ptr<snapshot_job> snapshot;
};

routed route(server_core& core, http::request<http::empty_body>& req, const std::string& peer);

/// A subscription admitted (admit_stream): where it starts, and its place under the per-subject
/// and per-address limits.
struct admitted_stream {
  stream_start start;
  admission::slot slot;
};
/// What admits a subscription, for /v1/stream, /v1/ws and each subscribe of a /v1/mux
/// connection alike: within its token's grants (--policy; 403), its where= given the token's
/// claims, its tables servable (409), a place under the per-subject and per-address limits (429),
/// and its position in the log (position(): 400, 410, 500, 501, 503 — 503 under --max-clients).
/// Each refusal that admission counts is counted and logged under path. who: null without
/// authentication. The returned start's who is set.
std::variant<admitted_stream, refusal> admit_stream(server_core& core, stream_request r,
                                                    std::shared_ptr<const identity> who, std::string_view peer,
                                                    std::string_view path, std::string_view last_event_id = {});

/// A stream's snapshot job has begun: the stream starts at its first seq, with its rows.
void begin_with(stream_handoff& h, std::shared_ptr<snapshot_job> job);
/// The answer to a stream whose snapshot could not begin: code (503: Retry-After 5; 429: 60).
answer snapshot_refused(unsigned code, std::string why, std::string_view cors);

}  // namespace walgate::proxy
