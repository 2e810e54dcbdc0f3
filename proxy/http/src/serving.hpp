// What the parts of the HTTP server share (internal to proxy/http; Beast stays out of public
// headers):
//
//   listener.cpp      the server class: binds, the TLS context, accepts (with its connection
//                     limits)
//   route.cpp         what a request gets, without a socket: limits, Host/Origin policy, 4xx/5xx
//                     answers, /healthz /readyz /metrics and the page, and the stream requests
//                     admitted (admit_stream: /v1/stream, /v1/ws and each /v1/mux subscription)
//   http_session.cpp  one connection: the TLS handshake, reads requests, writes route's answers,
//                     waits for a stream's snapshot to begin; hands stream requests to a transport
//   ndjson.cpp        NDJSON over chunked HTTP   } both on chunked_stream.hpp's loop
//   sse.cpp           Server-Sent Events         }
//   websocket.cpp     WebSocket: one stream per connection  } websocket_session.hpp: the
//   websocket_mux.cpp WebSocket: many subscriptions (/v1/mux)  } handshake, framing, closing
//
// A transport only frames what the client's subscription (subscription.hpp) gives it, and
// handles its own keep-alives and close semantics.
#pragma once
#include <chrono>

#include "admission.hpp"
#include "walgate/proxy/auth.hpp"
#include "walgate/proxy/encodings.hpp"
#include "walgate/proxy/metrics.hpp"
#include "walgate/proxy/policy.hpp"
#include "walgate/proxy/server.hpp"
#include "walgate/proxy/subscription.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/message.hpp>

#include <array>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <string>

namespace walgate::proxy {

enum class transport { ndjson, sse, websocket };
const char* transport_name(transport t);

struct server_core;
class socket_sender;

/// Where a stream request starts: its parameters, the first seq, and (resuming from an id past
/// the head) the id up to which events are skipped.
struct stream_start {
  stream_request request;
  std::uint64_t seq = 0;
  std::optional<transform::event_id> skip_through;
  std::shared_ptr<snapshot_job> snapshot;   ///< snapshot=true: started, and seq is its start
  std::shared_ptr<const identity> who;      ///< its verified token (with authentication on)
};

/// A connected stream client, registered with the server while it lives: its subscription and
/// the timers its transport waits on.
struct client {
  client(server_core& core, transport kind, stream_start start);
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  server_core& core;
  transport kind;
  subscription sub;
  boost::asio::steady_timer wake;       // cancelled when events arrive
  /// The timer its transport waits on, cancelled when events arrive: wake, or the connection's
  /// own when one connection serves several clients (a multiplexed WebSocket).
  boost::asio::steady_timer* wake_target = &wake;
  boost::asio::steady_timer watchdog;   // write timeout
  std::function<void()> force_close;    // closes the socket (set by WebSocket; empty on NDJSON and SSE)
  std::shared_ptr<snapshot_job> snapshot;   // while its rows are read: wakes this client
  std::shared_ptr<const identity> who;      // its token's claims (authentication on)
  std::optional<std::pair<std::int64_t, std::uint64_t>> expiry;   // its place in core's expiries
  /// Counts delivered events and bytes, and makes the last one the resume point.
  void delivered(const subscription::item& last, std::size_t events, std::size_t bytes);
  /// The transport is done with it: counts a slow client.
  void finished();
};

struct server_core {
  server_core(boost::asio::any_io_executor ex, server_options o, gateway& g, server_status s);
  ~server_core();

  boost::asio::any_io_executor executor;
  server_options opts;
  gateway& gw;          ///< /readyz (stream_fault), the eager-encoding hook, metrics registration
  log_reader& log;      ///< what subscriptions read, and whose notifications wake them
  server_status status;
  encoding_cache encodings;
  /// Clients whose row grants find their events by equality, by the values they hold.
  row_router router{log, encodings};
  /// The newest definition of each table logged by this process (schema \0 table): what a
  /// request's row grants, where= and column grants are checked against when it starts.
  struct known_table {
    std::uint64_t generation = 0;
    char replica_identity = 'd';
    std::vector<table_rows::column> columns;
  };
  std::unordered_map<std::string, known_table> known_tables;
  metrics_registry metrics;
  snapshot_service snapshots;
  /// The TLS context new connections get (replaced by server::reload_tls; a connection keeps the
  /// one it began with).
  std::shared_ptr<boost::asio::ssl::context> tls;
  /// The threads that write to stream clients over plain TCP (socket_sender.hpp;
  /// opts.send_threads of them; none with TLS); null: the event loop writes. Held by each
  /// connection that uses it as well.
  std::shared_ptr<socket_sender> sender;

  std::set<client*> clients;
  /// Timers of connections that wait with no client of their own (a multiplexed WebSocket
  /// with no subscription), cancelled with the clients' when events arrive or the server stops.
  std::set<boost::asio::steady_timer*> waiters;
  std::array<std::size_t, 3> by_transport{};
  bool stopping = false;
  bool loopback_listener = false;       // listening on a loopback address
  bool check_host = false;              // Host is checked (DNS rebinding): loopback, or no authentication
  std::size_t connections = 0;          // open TCP connections
  /// Connections not handed to a stream (yet), in all and by address, and those of them waiting
  /// to read (a TLS handshake, a request's head): the ones another connection may take the
  /// place of, oldest first (make_room).
  struct waiting_connection {
    std::string address;
    std::function<void()> close;
    bool closing = false;   // closed to make room; it leaves the list when its coroutine sees it
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  };
  /// A connection waits this long before it may be closed for another: a burst of new ones (a
  /// page's, a proxy's) is not mistaken for idle ones.
  static constexpr std::chrono::seconds waiting_grace{1};
  std::size_t non_stream = 0;
  std::unordered_map<std::string, std::size_t> non_stream_by_address;
  std::list<waiting_connection> waiting;
  std::uint64_t connections_replaced = 0;        // waiting connections closed for a new one
  std::uint64_t connections_refused_address = 0; // 429 at accept: an address's connections all busy
  /// Room for a new connection from address (see server_options::max_connections_per_address):
  /// false when it must be refused.
  bool make_room(const std::string& address);
  /// A waiting connection make_room may close (past waiting_grace, not closing already).
  bool any_replaceable() const {
    const auto waited = std::chrono::steady_clock::now() - waiting_grace;
    for (const auto& w : waiting)
      if (!w.closing && w.since <= waited) return true;
    return false;
  }
  std::size_t streams = 0;              // stream requests admitted (clients, or upgrading to one)
  std::uint64_t rejected_clients = 0;   // 503: over max_clients
  std::uint64_t rejected_origins = 0;   // 403: an origin not allowed, or a Host a loopback listener refuses
  std::uint64_t accept_pauses = 0;      // accepting paused: connections or file descriptors exhausted
  std::uint64_t events_out = 0, bytes_out = 0;
  std::uint64_t disconnected_slow = 0;
  std::uint64_t spill_read_errors = 0;
  bool spill_read_logged = false;

  subscription::limits limits() const;
  /// Wakes every client waiting for events.
  void notify();
  /// Wakes the clients waiting for a background read of the log (not the others).
  void notify_fetched();
  std::uint64_t notifications = 0;   ///< notify() calls so far
  /// A client catching up (not live: reading what committed long ago) goes after the live
  /// clients a notification woke: true once per notification, before its next batch — then it
  /// yields (posts itself behind them), so that a live client waits for at most the batch being
  /// made, not for a batch of every client catching up. seen: the client's own count.
  bool behind_live(const subscription& sub, std::uint64_t& seen) const {
    const bool yield = !sub.live() && seen != notifications;
    seen = notifications;
    return yield;
  }
  /// Runs f when a token's time is up: at exp plus the leeway the tokens are checked with
  /// (seconds since the epoch), on the event loop. One timer for all of them. The handle
  /// cancels it (cancel_expiry), as a stream that ends first does.
  using expiry_handle = std::pair<std::int64_t, std::uint64_t>;
  expiry_handle at_expiry(std::int64_t exp, std::function<void()> f);
  void cancel_expiry(const expiry_handle& h);
  std::uint64_t expired_streams = 0;   ///< ended because their token expired
  std::uint64_t unauthorized = 0;      ///< stream requests answered 401 (or 400 for a malformed token request)
  std::uint64_t forbidden = 0;         ///< stream requests (and mux subscriptions) refused for their grants (403)
  /// Streams per subject and per address, failed authentications per address, and the refusals'
  /// counts and log lines.
  admission admit;
  /// A spill file could not be read back (the client is disconnected mid-event).
  void spill_read_failed(const std::string& error);
  /// No more notifications or eager encodings from the gateway (the server stops).
  void detach();

 private:
  std::size_t listener_ = 0, fetched_listener_ = 0;
  bool attached_ = true;
  std::map<expiry_handle, std::function<void()>> expiries_;
  std::uint64_t next_expiry_ = 0;
  std::unique_ptr<boost::asio::steady_timer> expiry_timer_;
  std::int64_t timer_for_ = 0;   // the exp the timer is armed for (0: not armed)
  void arm_expiry();
};

/// Why a stream request is not served: its HTTP status, the parameter at fault (or none), the
/// message, and Retry-After when there is one.
struct refusal {
  unsigned status;
  std::string parameter, message;
  std::string retry_after;
};
/// With --policy: the request checked against its token's grants (and given them: r.granted);
/// nullopt when it is within them, else why (403).
std::optional<refusal> within_grants(server_core& core, const identity& who, stream_request& r);
/// A request with row grants, column grants or where= checked at its start against the tables
/// it would get whose definition this process has logged (table_rows::make: a predicate
/// column outside the replica identity, columns that would depend on rows, where= on a hidden
/// column): 409 naming the table and column (parameter where when its where= is at fault).
/// Tables not seen yet are checked at their first change.
std::optional<refusal> servable_rows(const server_core& core, const stream_request& r);
/// Admits a parsed stream request under --max-clients and finds where it starts in the log (a
/// resume id, or Last-Event-ID when given, which wins over from): out set, or why not (410,
/// 500, 503).
std::optional<refusal> position(server_core& core, stream_request r, std::string_view last_event_id, stream_start& out);

/// Held while a connection is open / a stream request is admitted.
class counted {
 public:
  explicit counted(std::size_t& c) : n_(&c) { ++*n_; }
  counted(counted&& o) noexcept : n_(o.n_) { o.n_ = nullptr; }
  ~counted() {
    if (n_) --*n_;
  }
  counted(const counted&) = delete;
  counted& operator=(const counted&) = delete;
  counted& operator=(counted&&) = delete;

 private:
  std::size_t* n_;
};

/// Whether the peer of a socket that just turned readable has closed it (nothing to read: its
/// end, or an error), rather than sent bytes. The client sends nothing after its request, so
/// that is how a hang-up is noticed while it waits.
bool peer_closed(int fd);

/// The body of a JSON error answer or line: {"error":…,"parameter":…}.
std::string json_error(std::string_view parameter, std::string_view message);
/// The last line of a stream that ends: {"error":reason,"resume_from":id or null}.
std::string end_line(std::string_view reason, std::string_view resume_id);

/// Events this large are not copied into a client's batch: they are sent from the shared
/// encoding (in memory) or read from its spill file a piece at a time.
constexpr std::size_t large_payload = 64u << 10;
constexpr std::size_t piece_bytes = 256u << 10;
/// A client with nothing to send keeps its batch and write buffers this long (a client of a
/// steady stream is woken again within it, and makes none again), then gives them back while it
/// waits (an idle client holds none).
constexpr std::chrono::milliseconds keep_buffers_for{200};

namespace http = boost::beast::http;

/// A stream request that serve_http admitted and positioned, handed to its transport once
/// serve_http has returned: the request loop's coroutine frame (several KiB) is not kept for
/// the life of the stream.
struct stream_handoff {
  enum class to { ndjson, sse, websocket, mux };
  to what = to::ndjson;
  unsigned version = 11;
  std::string cors;                        ///< the allowed Origin (empty: none)
  http::request<http::empty_body> req;     ///< a WebSocket's upgrade request (its handshake answers it)
  stream_start start;                      ///< (not for mux: its subscriptions start themselves)
  std::optional<counted> admitted;         ///< its place under --max-clients, held while it streams
  std::optional<admission::slot> slot;     ///< its place under the per-subject and per-address limits
  std::string peer;                        ///< the client's address (admission.hpp's peer_key)
};

// One connection (http_session.cpp): its TLS handshake (Stream an ssl_stream), its requests,
// then the stream it turns into, if one, counted in core.connections while it lives, with keep
// (the server's state) held; and the transports. Each is instantiated for beast::tcp_stream and
// beast::ssl_stream<beast::tcp_stream>.
template <class Stream>
boost::asio::awaitable<void> serve_connection(server_core& core, boost::asio::ip::tcp::socket socket,
                                              std::shared_ptr<void> keep, std::string address);
template <class Stream>
boost::asio::awaitable<std::optional<stream_handoff>> serve_http(server_core& core, Stream& s, const std::string& address);
/// What a connection holds while it is served: its place in core.connections, the server's
/// state (kept alive), over TLS the context it began with, and its stream's places under the
/// limits. The coroutine of the stream it turns into (WebSocket, multiplexed, NDJSON or SSE)
/// takes it over, so that the connection's own coroutine (and its frame: the request's state)
/// ends at the hand-off.
/// The peer's address as the admission limits key it (admission.hpp's peer_key): "unknown" when
/// the socket has none (listener.cpp).
std::string address_of(const boost::asio::ip::tcp::socket& socket);

/// A connection's place among those not handed to a stream: taken at accept, given back when
/// it becomes a stream or closes.
class non_stream_place {
 public:
  non_stream_place(server_core& core, std::string address) : core_(&core), address_(std::move(address)) {
    ++core_->non_stream;
    ++core_->non_stream_by_address[address_];
  }
  non_stream_place(const non_stream_place&) = delete;
  non_stream_place& operator=(const non_stream_place&) = delete;
  ~non_stream_place() { release(); }
  void release() {
    if (!core_) return;
    --core_->non_stream;
    auto it = core_->non_stream_by_address.find(address_);
    if (it != core_->non_stream_by_address.end() && --it->second == 0) core_->non_stream_by_address.erase(it);
    core_ = nullptr;
  }
  const std::string& address() const { return address_; }

 private:
  server_core* core_;
  std::string address_;
};

/// While it lives, the connection waits to read (a TLS handshake, a request's head) and may be
/// closed to make room for another (server_core::make_room).
class waiting_mark {
 public:
  waiting_mark(server_core& core, const std::string& address, std::function<void()> close) : core_(core) {
    it_ = core_.waiting.insert(core_.waiting.end(), {address, std::move(close), false, std::chrono::steady_clock::now()});
  }
  waiting_mark(const waiting_mark&) = delete;
  waiting_mark& operator=(const waiting_mark&) = delete;
  ~waiting_mark() { core_.waiting.erase(it_); }

 private:
  server_core& core_;
  std::list<server_core::waiting_connection>::iterator it_;
};

struct connection_hold {
  counted open;
  std::shared_ptr<void> keep;
  std::shared_ptr<void> tls_context;
  std::optional<counted> admitted;       ///< the stream's place under --max-clients (stream_handoff's)
  std::optional<admission::slot> slot;   ///< and under the per-subject and per-address limits
};

/// What an NDJSON or SSE stream starts from, freed once its client is made and its response
/// head written (not kept in the stream's frame for its life).
struct chunked_start {
  stream_start start;
  unsigned version = 11;
  std::string cors;   ///< the allowed Origin (empty: none)
};

/// NDJSON and SSE (ndjson.cpp, sse.cpp): each owns its connection — Stream a bare socket
/// (plain TCP) or a TLS stream — and what it holds.
template <class Stream>
boost::asio::awaitable<void> serve_ndjson(server_core& core, Stream s, std::unique_ptr<chunked_start> start,
                                          connection_hold hold);
template <class Stream>
boost::asio::awaitable<void> serve_sse(server_core& core, Stream s, std::unique_ptr<chunked_start> start,
                                       connection_hold hold);

template <class Stream>
boost::asio::awaitable<void> serve_websocket(server_core& core, Stream s, http::request<http::empty_body> req,
                                             stream_start start, connection_hold hold);

/// GET /v1/mux: many subscriptions over one WebSocket (websocket_mux.cpp).
template <class Stream>
boost::asio::awaitable<void> serve_websocket_mux(server_core& core, Stream s, http::request<http::empty_body> req,
                                                 std::shared_ptr<const identity> who, std::string peer,
                                                 connection_hold hold);

/// An allowed cross-origin request's response may be read by its page.
template <class Response>
void set_cors(Response& res, std::string_view origin) {
  if (origin.empty()) return;
  res.set(http::field::access_control_allow_origin, origin);
  res.set(http::field::vary, "Origin");
}

}  // namespace walgate::proxy
