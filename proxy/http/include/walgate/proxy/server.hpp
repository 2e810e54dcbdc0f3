// The HTTP server (Boost.Beast): NDJSON over chunked HTTP and Server-Sent Events on
// GET /v1/stream, WebSocket on GET /v1/ws, /healthz, /readyz, /metrics and the live page on /.
// docs/api.md is the contract. No Beast in this header: it is included by main.cpp and tests.
#pragma once

#include "walgate/proxy/gateway.hpp"
#include "walgate/proxy/snapshot.hpp"
#include "walgate/proxy/http_policy.hpp"
#include "walgate/proxy/stream_request.hpp"
#include "walgate/transform/formats.hpp"

#include <boost/asio/any_io_executor.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace walgate::proxy {

class metrics_registry;
class authenticator;

struct server_options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8080;                       ///< 0: any free port (see server::port()).
  std::string tls_cert, tls_key;                   ///< PEM files; both set: HTTPS/WSS.
  // A token of jwt::max_token_bytes (16 KiB) fits each of its carriers: the Authorization
  // header and Sec-WebSocket-Protocol (with the other headers) and access_token (with the rest of
  // the query). One contract: tokens up to 16 KiB, however sent.
  std::size_t header_limit = 24 * 1024;            ///< Request line and headers; over it: 431.
  std::size_t url_limit = 20 * 1024;               ///< Request target; over it: 414.
  std::size_t ws_message_limit = 64 * 1024;        ///< Client WebSocket messages; over it: close 1009.
  std::size_t ws_max_subscriptions = 64;           ///< Subscriptions on one /v1/mux WebSocket.
  /// --debezium-transaction-metadata: debezium streams have transaction records and blocks
  /// unless a request says transactions=false.
  bool debezium_transaction_metadata = false;
  /// --group-max-mb: a group=transaction message past this many bytes of events is split.
  std::size_t group_max_bytes = 16u << 20;
  std::chrono::milliseconds header_timeout{10'000};   ///< The whole request head must arrive in this time.
  std::chrono::milliseconds keepalive{15'000};     ///< Idle keep-alive: NDJSON blank line, SSE comment, WS ping.
  std::chrono::milliseconds write_timeout{30'000};  ///< A write that takes longer: the client is too slow.
  std::size_t client_lag_bytes = 64u << 20;        ///< A live client further behind than this is disconnected.
  std::size_t batch_bytes = 256 * 1024;            ///< Per-client write batch (memory per client is bounded by it).
  std::chrono::milliseconds sse_retry{2'000};
  /// Stream clients (NDJSON, SSE, WebSocket) at once; one more is answered 503 with Retry-After.
  std::size_t max_clients = 10'000;
  /// Connections beyond the stream clients (requests in progress, /metrics, the page). With
  /// max_clients + this many open, accepting pauses until one closes: the process never runs
  /// out of file descriptors because of its clients.
  std::size_t max_other_connections = 256;
  /// Connections of one address that are not (yet) streams: waiting for a request, reading one,
  /// answering one. At the limit a new one from that address takes the place of its oldest one
  /// that has waited a second or more (waiting_grace), or, with none, comes in anyway unless the
  /// address holds max_other_connections (then 429); at max_other_connections in all, a new one
  /// takes the place of the oldest such waiting one of any address. Idle keep-alive connections
  /// so never fill the server, whoever opens them.
  std::size_t max_connections_per_address = 32;
  /// Threads that write walgate's batches to stream clients over plain TCP (the system calls of
  /// the fan-out), beside the event loop that makes them; 0: the event loop writes them itself.
  unsigned send_threads = 1;
  /// Origins (scheme://host[:port], or "*") whose pages may read the stream across origins:
  /// they get CORS headers, and their WebSockets are accepted. Other cross-origin requests
  /// get 403: a page from any site cannot read the stream through a visitor's browser.
  std::vector<std::string> allowed_origins;
  /// Host names (besides localhost and loopback addresses) accepted when listening on a
  /// loopback address; others get 403 (DNS rebinding). Not checked on other addresses.
  std::vector<std::string> allowed_hosts;
  transform::encoder_options encoder;              ///< Debezium name, db, decimal/time modes.
  /// Encodings of at least spill_bytes are written once to an unlinked file in spill_dir and
  /// sent from it in pieces (none when spill_dir is empty: they stay in memory).
  std::filesystem::path spill_dir;
  std::size_t spill_bytes = 4u << 20;
  /// Per-client snapshots (snapshot=true): where from, and their limits.
  snapshot_options snapshot;
  /// Bearer tokens (JWTs) required of stream clients (/v1/stream, /v1/ws, /v1/mux); null: none
  /// (only on loopback, or with --allow-unauthenticated). Reloaded by its owner.
  std::shared_ptr<authenticator> auth;
  /// With auth, /metrics too needs a bearer token (Authorization header), and one whose claim
  /// metrics_claim equals metrics_claim_value (claim_equals, auth.hpp): 401 without a valid
  /// token, 403 without the claim (--metrics-claim NAME=VALUE). Without auth it is open.
  std::string metrics_claim = "walgate_admin", metrics_claim_value = "true";
  /// /metrics' series of one sample per stream client (walgate_client_lag_*) are collected at
  /// most once in this time and reused meanwhile: N scrapes a second cost one pass over the
  /// clients (the other figures are read at each request). 0: at each request.
  std::chrono::milliseconds metrics_cache{1'000};
  /// Concurrent streams of one subject (a verified token's `sub`) and of one peer address (IPv4,
  /// or IPv6 /64): a stream request, a /v1/mux connection and each of its subscriptions count;
  /// one more is answered 429 with Retry-After. 0: no limit.
  std::size_t max_streams_per_subject = 0;
  std::size_t max_streams_per_address = 0;
  /// Failed authentications (an invalid token) of one address in a minute: past it, that
  /// address's stream requests are answered 429 with Retry-After until the minute ends, before
  /// any token is verified. 0: no limit.
  std::size_t auth_failures_per_minute = 0;
  /// Where refused requests are logged, one line each (never the token); none: not logged.
  std::function<void(const std::string&)> log;
  /// Registers further figures for /metrics (the initial snapshot's).
  std::vector<std::function<void(metrics_registry&)>> extra_metrics;
  /// walgate edge: served from a JetStream stream's mirror (no PostgreSQL: snapshot=true is 501).
  bool edge = false;
  /// When set and saying why, stream requests are 503 with that reason (an edge still copying
  /// the stream).
  std::function<std::string()> unavailable;
  /// The highest WAL end the server has told walgate (invalid: not reached since the start).
  /// When set, a resume id past the log's head and past that end is refused (400): no event
  /// of this stream has it, and a client would wait for it forever.
  std::function<protocol::lsn()> server_wal_end;
  /// GET /v1/slots: walgate's downstream slots as JSON (walgate's walsender, --replication-listen);
  /// unset: 404.
  std::function<std::string()> slots_json;
};

/// What /readyz and /metrics need from the replication side.
struct server_status {
  std::function<bool()> streaming;          ///< connected and streaming from PostgreSQL
  std::function<int()> reconnects;
};

class server {
 public:
  server(boost::asio::any_io_executor ex, server_options opts, gateway& gw, server_status status);
  ~server();
  /// Binds and starts accepting; false with error on failure.
  bool start(std::string& error);
  std::uint16_t port() const;
  /// Reads --tls-cert and --tls-key again (a renewed certificate) for the connections accepted
  /// from now on; open connections are not touched. False with error (the ones in use stay).
  bool reload_tls(std::string& error);
  /// Stops accepting and closes every client with a going-away reason carrying its resume id.
  void stop();
  /// Wakes clients waiting for events (the server does so itself on the log's notification,
  /// log_reader::on_visible).
  void notify();
  std::size_t clients() const;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

}  // namespace walgate::proxy
