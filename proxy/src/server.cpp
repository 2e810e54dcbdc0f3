#include "walgate/proxy/server.hpp"

#include "corked_stream.hpp"

#include "walgate/transform/json.hpp"
#include "walgate/transform/record.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <boost/url/parse.hpp>

#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <sstream>

namespace walgate::proxy {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using asio::awaitable;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

extern const char* live_page_html;   // live_page.cpp

// --- the server ----------------------------------------------------------------------------

namespace {

std::string json_error(std::string_view parameter, std::string_view message) {
  std::string out = "{\"error\":";
  transform::append_json_string(out, message);
  if (!parameter.empty()) {
    out += ",\"parameter\":";
    transform::append_json_string(out, parameter);
  }
  out += "}\n";
  return out;
}

encoding encoding_for(const stream_request& r) {
  switch (r.fmt) {
    case transform::format::native: return encoding::native;
    case transform::format::debezium: return encoding::debezium;
    case transform::format::pgoutput2json: return r.compact ? encoding::pgoutput2json_compact : encoding::pgoutput2json;
    case transform::format::waltail: return encoding::waltail;
    case transform::format::wal2json: return encoding::wal2json;
  }
  return encoding::native;
}

enum class transport { ndjson, sse, websocket };
const char* transport_name(transport t) { return t == transport::ndjson ? "ndjson" : t == transport::sse ? "sse" : "websocket"; }

}  // namespace

struct client_state {
  explicit client_state(asio::any_io_executor ex) : wake(ex), watchdog(ex) {}
  asio::steady_timer wake;       // cancelled when events arrive
  asio::steady_timer watchdog;   // write timeout
  transport kind = transport::ndjson;
  encoding enc = encoding::native;
  bool unfiltered = false;       // every event goes to it (no table or op filter)
  std::string last_id;           // the last event id delivered: where to resume
  std::uint64_t cursor = 0;      // seq of the next event to look at
  std::uint64_t offset = 0;      // the log's end_offset at the cursor (while live): lag in bytes
  /// Resumed from an id past the head: events up to it are skipped (sent again by the server
  /// after a crash lost them from the log, they were seen already).
  std::optional<transform::event_id> skip_through;
  bool live = false;
  bool closing = false;
  std::string close_reason;
  std::function<void()> force_close;
};

struct server::impl : std::enable_shared_from_this<server::impl> {
  impl(asio::any_io_executor ex, server_options o, gateway& g, server_status s)
      : executor(ex), opts(std::move(o)), gw(g), status(std::move(s)), acceptor(ex) {}

  asio::any_io_executor executor;
  server_options opts;
  gateway& gw;
  server_status status;
  tcp::acceptor acceptor;
  std::unique_ptr<asio::ssl::context> tls;
  std::set<client_state*> clients;
  std::map<transport, std::size_t> by_transport;
  bool stopping = false;
  std::size_t connections = 0;       // open TCP connections
  std::size_t streams = 0;           // stream requests admitted (clients, or upgrading to one)
  std::uint64_t rejected_clients = 0;   // 503: over max_clients
  std::uint64_t rejected_origins = 0;   // 403: an origin not allowed, or a Host a loopback listener refuses
  bool loopback_listener = false;       // Host is checked (DNS rebinding)
  std::uint64_t accept_pauses = 0;      // accepting paused: connections or file descriptors exhausted

  /// Held while a connection is open / a stream request is admitted.
  struct counted {
    std::size_t& n;
    explicit counted(std::size_t& c) : n(c) { ++n; }
    ~counted() { --n; }
    counted(const counted&) = delete;
    counted& operator=(const counted&) = delete;
  };

  /// A connected stream client, counted while it lives.
  struct registration {
    impl& self;
    client_state& c;
    registration(impl& s, client_state& cs, const stream_request& r) : self(s), c(cs) {
      c.enc = encoding_for(r);
      c.unfiltered = r.tables.empty() && r.ops == 0;
      self.clients.insert(&c);
      ++self.by_transport[c.kind];
      if (c.unfiltered) ++self.eager[static_cast<std::size_t>(c.enc)];
    }
    ~registration() {
      self.clients.erase(&c);
      --self.by_transport[c.kind];
      if (c.unfiltered) --self.eager[static_cast<std::size_t>(c.enc)];
    }
  };

  /// Encodings that some client wants every event in: they are made as each event is logged,
  /// from the change in hand (no record to parse again). The rest are made on first demand.
  std::array<int, static_cast<std::size_t>(encoding::count_)> eager{};

  void on_logged(const logged_event& e, const transform::change& c) {
    for (std::size_t i = 0; i < eager.size(); ++i)
      if (eager[i] > 0 && !e.json[i]) encode_into(e, static_cast<encoding>(i), c);
  }

  transform::record_view record_scratch;   // one parse buffer for every record read here

  // Encodes once per event and encoding; every client of that encoding shares the bytes. The
  // bytes count against the log's memory tail while the event is in it.
  /// Null when the event's record cannot be read (error says why): never skipped in silence.
  payload_ptr encoded(const logged_event& e, encoding enc, std::string& error) {
    auto& slot = e.json[static_cast<std::size_t>(enc)];
    if (!slot) {
      auto r = transform::read_record(protocol::as_bytes(e.record), record_scratch);
      if (!r) {
        error = "event #" + std::to_string(e.seq) + " in the event log cannot be read (" + r.error().message() + ")";
        return nullptr;
      }
      encode_into(e, enc, record_scratch.get());
    }
    return slot;
  }

  /// Encodes e (made from the change c) in enc, and keeps the bytes with the event.
  void encode_into(const logged_event& e, encoding enc, const transform::change& from) {
    transform::change c = from;
    c.seq = e.seq;
    auto o = opts.encoder;
    const bool compact = enc == encoding::pgoutput2json_compact || enc == encoding::pgoutput2json_schema;
    o.compact = compact;
    o.include_schema = enc == encoding::pgoutput2json_schema;
    transform::format f = compact ? transform::format::pgoutput2json : static_cast<transform::format>(enc);
    auto& slot = e.json[static_cast<std::size_t>(enc)];
    if (e.record.size() < (1u << 20)) {
      // Small: made in a buffer kept for the next one, and kept at its exact size.
      encode_scratch.clear();
      transform::encode_change(encode_scratch, c, f, o);
      slot = payload::in_memory(encode_scratch);
      if (encode_scratch.capacity() > (1u << 20)) encode_scratch = std::string();
    } else {
      // Large: about its record's size (more where values are escaped), room for that at once
      // rather than growth by doubling; sent from a spill file in pieces (where the file cannot
      // be made — a full disk — from memory).
      std::string bytes;
      bytes.reserve(e.record.size() + e.record.size() / 8 + 4096);
      transform::encode_change(bytes, c, f, o);
      if (bytes.size() >= opts.spill_bytes && !opts.spill_dir.empty()) {
        std::string error;
        slot = payload::spill(opts.spill_dir, bytes, error);
        if (slot) ++spilled_payloads;
        else log_once(spill_write_logged, error + ": an encoding of " + std::to_string(bytes.size()) +
                                               " bytes is kept in memory instead");
      }
      if (!slot) {
        bytes.shrink_to_fit();
        slot = payload::in_memory(std::move(bytes));
      }
    }
    gw.log().account_encoding(e, slot->memory());
  }
  std::string encode_scratch;
  std::uint64_t spilled_payloads = 0;   // encodings sent from spill files
  bool spill_write_logged = false, spill_read_logged = false;
  /// A line on stderr, the first time only (the metrics count every time).
  static void log_once(bool& done, const std::string& line) {
    if (done) return;
    done = true;
    std::fprintf(stderr, "walgate: %s\n", line.c_str());
  }

  /// The signature of e's table definition (column names, types, typmods, key flags) that
  /// says when pgoutput2json compact's "s" must be sent again.
  std::string schema_signature(const logged_event& e) {
    std::string out;
    if (transform::read_record(protocol::as_bytes(e.record), record_scratch)) {
      const auto& c = record_scratch.get();
      if (c.relation)
        for (const auto& col : c.relation->columns)
          out += col.name + '\x1f' + std::to_string(col.type_oid) + '\x1f' + std::to_string(col.type_modifier) +
                 (col.key ? "k" : "") + '\x1e';
    }
    return out;
  }

  void notify() {
    for (auto* c : clients) c->wake.cancel();
  }

  struct item {
    payload_ptr bytes;
    transform::event_id id;
  };

  /// Next batch of encoded payloads for a client; empty if nothing new. Sets c.closing when the
  /// client is too far behind.
  void next_batch(client_state& c, const stream_request& r, std::map<std::string, std::string>& schemas_sent,
                  std::vector<item>& out) {
    out.clear();
    auto& log = gw.log();
    if (c.cursor < log.first_seq()) {
      c.closing = true;
      c.close_reason = "the resume position is no longer retained; take a new snapshot";
      return;
    }
    std::size_t bytes = 0;
    std::string read_error;
    auto batch = log.read(c.cursor, 512, &read_error);
    if (batch.empty() && !read_error.empty()) {
      // Never a silent wait: the client is closed with the reason and where to resume.
      c.closing = true;
      c.close_reason = read_error;
      return;
    }
    // Lag is measured against what clients can see (the last commit: it never moves back, not
    // even when a reconnect drops a transaction half received), from the end of the next event
    // this client is to get: one large event is not lag, a client reading it at full speed is
    // not slow.
    // Nor is one large transaction: what counts is committed after the one the client is in.
    const std::uint64_t reading_to =
        batch.empty() ? 0 : std::max(batch.front()->end_offset, log.transaction_end_offset(batch.front()->seq));
    if (c.live && !batch.empty() && log.visible_offset() > reading_to &&
        log.visible_offset() - reading_to > opts.client_lag_bytes) {
      c.closing = true;
      c.close_reason = "slow client: more than " + std::to_string(opts.client_lag_bytes) +
                       " bytes behind the stream";
      ++gw.metrics().clients_disconnected_slow;
      return;
    }
    encoding enc = encoding_for(r);
    for (const auto& e : batch) {
      c.cursor = e->seq + 1;
      c.offset = e->end_offset;
      if (c.skip_through) {
        if (!(*c.skip_through < e->id)) continue;
        c.skip_through.reset();
      }
      if (!matches(r, *e)) continue;
      // pgoutput2json compact: the schema goes with the first row of a table for this client,
      // and again when the table's definition is not the one last sent — as the encoding of
      // e's row with its schema, made once and shared like the others.
      encoding want = enc;
      std::string* sent = nullptr;
      std::string signature;
      if (enc == encoding::pgoutput2json_compact) {
        sent = &schemas_sent[e->schema + "." + e->table];
        signature = schema_signature(*e);
        if (*sent != signature) want = encoding::pgoutput2json_schema;
      }
      std::string error;
      auto p = encoded(*e, want, error);
      if (!p) {
        // A damaged record: the batch ends before it; with nothing before it, the client is
        // closed with the reason and the id to resume from.
        c.cursor = e->seq;
        if (out.empty()) {
          c.closing = true;
          c.close_reason = error;
        }
        break;
      }
      if (p->empty()) continue;   // the format has no such event
      if (want == encoding::pgoutput2json_schema) *sent = std::move(signature);
      bytes += p->size();
      out.push_back({std::move(p), e->id});
      if (r.tombstones && e->kind == transform::op::delete_) {
        if (auto v = transform::read_record(protocol::as_bytes(e->record))) {
          out.push_back({payload::in_memory("{\"key\":" + transform::debezium_key((*v)->get(), opts.encoder) +
                                            ",\"value\":null}"),
                         e->id});
        }
      }
      if (bytes >= opts.batch_bytes) break;
    }
    if (c.cursor >= log.visible_seq()) {
      c.live = true;
      c.offset = log.visible_offset();
    }
  }

  // ------------------------------------------------------------------------------------------

  template <class Stream>
  awaitable<void> write_simple(Stream& s, unsigned version, http::status st, std::string_view type, std::string body,
                               bool keep_alive, std::string_view retry_after = {}, std::string_view cors = {}) {
    http::response<http::string_body> res{st, version};
    res.set(http::field::server, "walgate");
    if (!retry_after.empty()) res.set(http::field::retry_after, retry_after);
    set_cors(res, cors);
    res.set(http::field::content_type, type);
    res.set(http::field::cache_control, "no-store");
    res.keep_alive(keep_alive);
    res.body() = std::move(body);
    res.prepare_payload();
    beast::get_lowest_layer(s).expires_after(opts.write_timeout);
    co_await http::async_write(s, res, use_tuple);
  }

  /// An allowed cross-origin request's response may be read by its page.
  template <class Response>
  static void set_cors(Response& res, std::string_view origin) {
    if (origin.empty()) return;
    res.set(http::field::access_control_allow_origin, origin);
    res.set(http::field::vary, "Origin");
  }

  std::string metrics_text() {
    auto& m = gw.metrics();
    auto& log = gw.log();
    std::ostringstream o;
    auto metric = [&](const char* name, const char* type, const char* help, auto value, const std::string& labels = "") {
      o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
        << name << labels << " " << value << "\n";
    };
    metric("walgate_events_in_total", "counter", "Events logged from PostgreSQL.", m.events_in);
    metric("walgate_transactions_in_total", "counter", "Transactions logged.", m.transactions_in);
    metric("walgate_events_out_total", "counter", "Events written to clients.", m.events_out);
    metric("walgate_bytes_out_total", "counter", "Bytes of events written to clients.", m.bytes_out);
    o << "# HELP walgate_clients Connected stream clients by transport.\n# TYPE walgate_clients gauge\n";
    for (auto t : {transport::ndjson, transport::sse, transport::websocket})
      o << "walgate_clients{transport=\"" << transport_name(t) << "\"} " << by_transport[t] << "\n";
    o << "# HELP walgate_client_lag_events Events between a client's position and the head.\n"
         "# TYPE walgate_client_lag_events gauge\n";
    std::size_t i = 0;
    for (auto* c : clients)
      o << "walgate_client_lag_events{client=\"" << i++ << "\",transport=\"" << transport_name(c->kind) << "\"} "
        << (log.visible_seq() > c->cursor ? log.visible_seq() - c->cursor : 0) << "\n";
    o << "# HELP walgate_client_lag_bytes Bytes of event log between a client's position and the head.\n"
         "# TYPE walgate_client_lag_bytes gauge\n";
    i = 0;
    for (auto* c : clients)
      o << "walgate_client_lag_bytes{client=\"" << i++ << "\",transport=\"" << transport_name(c->kind) << "\"} "
        << (c->offset && log.visible_offset() > c->offset ? log.visible_offset() - c->offset : 0) << "\n";
    metric("walgate_clients_disconnected_slow_total", "counter", "Clients disconnected for being too slow.",
           m.clients_disconnected_slow);
    metric("walgate_clients_rejected_total", "counter", "Stream requests answered 503: over --max-clients.",
           rejected_clients);
    metric("walgate_origins_rejected_total", "counter",
           "Browser requests refused (403): an origin not allowed, or a Host a loopback listener does not serve.",
           rejected_origins);
    metric("walgate_connections", "gauge", "Open HTTP connections (stream clients included).", connections);
    metric("walgate_accept_pauses_total", "counter",
           "Times accepting paused (connection limit reached, or out of file descriptors).", accept_pauses);
    std::int64_t lag_bytes = m.server_wal_end.valid() && m.server_wal_end > gw.durable_lsn()
                                 ? static_cast<std::int64_t>(m.server_wal_end.value - gw.durable_lsn().value)
                                 : 0;
    metric("walgate_lag_bytes", "gauge", "Server WAL end minus the durable position.", lag_bytes);
    double lag_s = 0;
    if (m.last_commit_time_us)
      lag_s = std::max<double>(0, (protocol::pg_now_us() - m.last_commit_time_us) / 1e6);
    metric("walgate_last_commit_age_seconds", "gauge", "Seconds since the commit time of the last logged transaction.", lag_s);
    metric("walgate_slot_retained_wal_bytes", "gauge", "WAL the slot retains on the server (pg_replication_slots).",
           m.slot_retained_wal);
    metric("walgate_stream_decode_failures_total", "counter",
           "pgoutput messages that could not be decoded (the connection is made again; nothing is skipped).",
           m.decode_failures);
    metric("walgate_stream_fault", "gauge", "1 while the stream is stuck on a message that cannot be decoded.",
           gw.stream_fault().empty() ? 0 : 1);
    metric("walgate_payloads_spilled_total", "counter",
           "Encodings of large events written to a spill file and sent from it in pieces.", spilled_payloads);
    metric("walgate_spill_read_errors_total", "counter",
           "Spill files that could not be read back (the client was disconnected in the middle of the event).",
           spill_read_errors);
    metric("walgate_reconnects_total", "counter", "Reconnections to PostgreSQL.", status.reconnects ? status.reconnects() : 0);
    metric("walgate_log_disk_bytes", "gauge", "Bytes of event log on disk.", log.disk_bytes());
    metric("walgate_log_next_seq", "gauge", "Sequence number of the next event clients will see.", log.visible_seq());
    metric("walgate_durable_lsn", "gauge", "Durable position (acknowledged to PostgreSQL) as a number.", gw.durable_lsn().value);
    return o.str();
  }

  // The streaming loop shared by NDJSON and SSE.
  /// Events this large are not copied into a client's batch: they are sent from the shared
  /// encoding (in memory) or read from its spill file a piece at a time.
  static constexpr std::size_t large_payload = 64u << 10;
  static constexpr std::size_t piece_bytes = 256u << 10;

  /// One HTTP chunk (nothing for no bytes), within the write timeout.
  template <class Stream>
  awaitable<boost::system::error_code> write_chunk(Stream& s, std::string_view bytes) {
    if (bytes.empty()) co_return boost::system::error_code{};
    beast::get_lowest_layer(s).expires_after(opts.write_timeout);
    auto [ec, n] = co_await asio::async_write(s, http::make_chunk(asio::buffer(bytes.data(), bytes.size())), use_tuple);
    co_return ec;
  }

  /// A large encoding as chunks: from memory at once, from a spill file a piece at a time (each
  /// piece within the write timeout; memory for this client: one piece).
  template <class Stream>
  awaitable<boost::system::error_code> write_payload_chunks(Stream& s, const payload& p) {
    std::string piece;
    for (std::size_t off = 0; off < p.size(); off += piece_bytes) {
      std::size_t n = std::min(piece_bytes, p.size() - off);
      std::string_view view;
      if (p.spilled()) {
        piece.resize(n);
        std::string error;
        if (!p.read(off, piece, error)) {
          log_spill_error(error);
          co_return make_error_code(boost::system::errc::io_error);
        }
        view = piece;
      } else {
        view = p.bytes().substr(off, n);   // (in memory: from the shared bytes, no copy)
      }
      auto ec = co_await write_chunk(s, view);
      if (ec) co_return ec;
    }
    co_return boost::system::error_code{};
  }

  void log_spill_error(const std::string& error) {
    ++spill_read_errors;
    log_once(spill_read_logged, error + ": a client was disconnected in the middle of an event");
  }
  std::uint64_t spill_read_errors = 0;

  template <class Stream>
  awaitable<void> serve_http_stream(Stream& s, const http::request<http::empty_body>& req, stream_request r,
                                    transport kind, std::uint64_t start, std::optional<transform::event_id> skip,
                                    std::string_view cors = {}) {
    client_state c(executor);
    c.kind = kind;
    c.cursor = start;
    c.skip_through = skip;
    if (skip) c.last_id = skip->to_string();   // where it resumes, should it end before an event
    c.force_close = [&s] { beast::get_lowest_layer(s).close(); };
    registration guard(*this, c, r);

    http::response<http::empty_body> res{http::status::ok, req.version()};
    res.set(http::field::server, "walgate");
    res.set(http::field::content_type, kind == transport::sse ? "text/event-stream" : "application/x-ndjson");
    res.set(http::field::cache_control, "no-cache");
    res.set("X-Accel-Buffering", "no");
    set_cors(res, cors);
    res.chunked(true);
    http::response_serializer<http::empty_body> sr{res};
    beast::get_lowest_layer(s).expires_after(opts.write_timeout);
    auto [hec, hn] = co_await http::async_write_header(s, sr, use_tuple);
    if (hec) co_return;
    if (kind == transport::sse) {
      std::string retry = "retry: " + std::to_string(opts.sse_retry.count()) + "\n\n";
      auto [ec, n] = co_await asio::async_write(s, http::make_chunk(asio::buffer(retry)), use_tuple);
      if (ec) co_return;
    }
    // A client that hangs up while idle is noticed at once (not at the next keep-alive write),
    // so its slot is free for the next one. The client sends nothing after its request: the
    // socket turning readable with nothing to read is its end; bytes to read (a pipelined
    // request, a TLS alert) end the watch, and the next write finds out.
    auto alive = std::make_shared<bool>(true);
    struct watch_guard {
      std::shared_ptr<bool> alive;
      ~watch_guard() { *alive = false; }
    } watching{alive};
    auto& sock = beast::get_lowest_layer(s).socket();
    sock.async_wait(tcp::socket::wait_read, [alive, &c, &sock](boost::system::error_code ec) {
      if (!*alive || ec) return;
      char b;
      auto n = ::recv(sock.native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        c.close_reason = "the client closed the connection";
        c.closing = true;
        c.wake.cancel();
      }
    });
    std::map<std::string, std::string> schemas;
    std::vector<item> batch;
    std::string out;
    while (!stopping && !c.closing) {
      next_batch(c, r, schemas, batch);
      if (c.closing) break;
      out.clear();
      if (batch.empty()) {
        c.wake.expires_after(opts.keepalive);
        auto [ec] = co_await c.wake.async_wait(use_tuple);
        if (!ec && !stopping) out = kind == transport::sse ? ": keep-alive\n\n" : "\n";   // idle keep-alive
        if (out.empty()) continue;
      }
      // Small events are copied into one chunk; a large one goes from where it is: from
      // memory as a chunk of its own, from its spill file in pieces.
      std::size_t sent = 0;
      boost::system::error_code ec;
      for (const auto& [p, id] : batch) {
        if (kind == transport::sse) {
          out += "id: ";
          out += id.to_string();
          out += "\ndata: ";
        }
        if (p->spilled() || p->size() >= large_payload) {
          sent += out.size() + p->size();
          ec = co_await write_chunk(s, out);
          if (ec) break;
          out.clear();
          ec = co_await write_payload_chunks(s, *p);
          if (ec) break;
        } else {
          out += p->bytes();
        }
        out += kind == transport::sse ? "\n\n" : "\n";
      }
      if (!ec) {
        sent += out.size();
        ec = co_await write_chunk(s, out);
      }
      if (ec) {
        if (ec == beast::error::timeout) ++gw.metrics().clients_disconnected_slow;
        co_return;
      }
      if (!batch.empty()) c.last_id = batch.back().id.to_string();
      gw.metrics().events_out += batch.size();
      gw.metrics().bytes_out += sent;
      if (out.capacity() > (64u << 10)) out = std::string();   // idle clients keep no burst-sized buffer
    }
    // A last line that says why, and where to resume.
    std::string reason = stopping ? "server shutting down" : c.close_reason;
    std::string last = "{\"error\":";
    transform::append_json_string(last, reason);
    last += ",\"resume_from\":";
    if (c.last_id.empty()) last += "null";
    else transform::append_json_string(last, c.last_id);
    last += "}";
    std::string tail = kind == transport::sse ? "event: error\ndata: " + last + "\n\n" : last + "\n";
    beast::get_lowest_layer(s).expires_after(std::chrono::seconds(5));
    co_await asio::async_write(s, http::make_chunk(asio::buffer(tail)), use_tuple);
    co_await asio::async_write(s, http::make_chunk_last(), use_tuple);
  }

  /// A WebSocket client: the stream and its state, shared by the writer (serve_websocket) and
  /// the reader coroutine, so whichever ends last frees them.
  template <class Stream>
  struct ws_session {
    ws_session(Stream&& s, asio::any_io_executor ex) : ws(std::move(s)), c(ex) {}
    websocket::stream<corked_stream<Stream>> ws;
    client_state c;
    bool reading = true;
  };

  template <class Stream>
  awaitable<void> serve_websocket(Stream s, http::request<http::empty_body> req, stream_request r, std::uint64_t start,
                                  std::optional<transform::event_id> skip) {
    auto session = std::make_shared<ws_session<Stream>>(std::move(s), executor);
    auto& ws = session->ws;
    auto& c = session->c;
    beast::get_lowest_layer(ws).expires_never();
    websocket::stream_base::timeout t{};
    t.handshake_timeout = std::chrono::seconds(10);
    t.idle_timeout = opts.keepalive * 2;   // a ping goes out at half of it; no pong: closed
    t.keep_alive_pings = true;
    ws.set_option(t);
    websocket::permessage_deflate pmd;
    pmd.server_enable = true;   // used when the client offers it
    ws.set_option(pmd);
    ws.read_message_max(opts.ws_message_limit);
    ws.set_option(websocket::stream_base::decorator([](websocket::response_type& res) { res.set(http::field::server, "walgate"); }));
    // Without permessage-deflate a frame is a header and the bytes: the batch's frames are
    // made here. With it, Beast compresses each message.
    auto ext = req[http::field::sec_websocket_extensions];
    bool raw_frames = std::string_view(ext.data(), ext.size()).find("permessage-deflate") == std::string_view::npos;
    auto [aec] = co_await ws.async_accept(req, use_tuple);
    if (aec) co_return;

    c.kind = transport::websocket;
    c.cursor = start;
    c.skip_through = skip;
    if (skip) c.last_id = skip->to_string();
    c.force_close = [&ws] {
      boost::system::error_code ec;
      beast::get_lowest_layer(ws).socket().close(ec);
    };
    registration guard(*this, c, r);

    // The reader answers pings, enforces the message limit (1009) and UTF-8 (1007); walgate
    // expects nothing from clients, so a message is read and dropped.
    asio::co_spawn(
        executor,
        [session]() -> awaitable<void> {
          beast::flat_buffer b;
          while (true) {
            auto [ec, n] = co_await session->ws.async_read(b, use_tuple);
            if (ec) break;
            b.consume(b.size());
          }
          session->reading = false;
          session->c.closing = true;
          session->c.wake.cancel();
        },
        asio::detached);

    std::map<std::string, std::string> schemas;
    std::vector<item> batch;
    ws.text(true);
    bool failed = false;
    while (!stopping && !c.closing) {
      next_batch(c, r, schemas, batch);
      if (c.closing) break;
      if (batch.empty()) {
        c.wake.expires_after(opts.keepalive);
        co_await c.wake.async_wait(use_tuple);
        continue;
      }
      // The batch's frames are collected and sent in one write. A batch that takes longer
      // than write_timeout to go out: the client does not read; close it.
      auto arm_watchdog = [&c, this] {
        c.watchdog.expires_after(opts.write_timeout);
        c.watchdog.async_wait([&c](boost::system::error_code ec) {
          if (!ec) {
            c.closing = true;
            c.close_reason = "slow client: a write took too long";
            c.force_close();
          }
        });
      };
      arm_watchdog();
      ws.next_layer().cork();
      std::size_t bytes = 0;
      for (const auto& [p, id] : batch) {
        if (raw_frames && !ws.is_open()) {   // Beast has begun closing (a protocol error from the client)
          failed = true;
          break;
        }
        if (raw_frames && !p->spilled() && p->size() < large_payload) {
          ws.next_layer().append_text_frame(p->bytes());
        } else if (raw_frames && !p->spilled() && p->size() < opts.spill_bytes) {
          ws.next_layer().append_text_frame(p, p->bytes());   // sent from the shared encoding
        } else if (!raw_frames && !p->spilled() && p->size() < large_payload) {
          auto [ec, n] = co_await ws.async_write(asio::buffer(p->bytes().data(), p->size()), use_tuple);
          if (ec) failed = true;
        } else {
          // In pieces, each sent before the next is made (read from the spill file, or, when
          // Beast compresses, deflated): a message in fragments, pings and pongs between them.
          auto piece = std::make_shared<std::string>();
          for (std::size_t off = 0; off < p->size() && !failed; off += piece_bytes) {
            if (raw_frames && !ws.is_open()) {   // Beast closed meanwhile: no data frame after its close
              failed = true;
              break;
            }
            std::size_t n = std::min(piece_bytes, p->size() - off);
            std::string_view view;
            if (p->spilled()) {
              piece->resize(n);
              std::string error;
              if (!p->read(off, *piece, error)) {
                log_spill_error(error);
                failed = true;
                break;
              }
              view = *piece;
            } else {
              view = p->bytes().substr(off, n);
            }
            if (raw_frames) {
              std::shared_ptr<const void> keep = p;
              if (p->spilled()) keep = piece;
              ws.next_layer().append_text_fragment(std::move(keep), view, off == 0, off + n == p->size());
            } else {
              auto [ec, w] = co_await ws.async_write_some(off + n == p->size(), asio::buffer(view.data(), view.size()), use_tuple);
              if (ec) failed = true;
            }
            auto [pec] = co_await ws.next_layer().async_drain(use_tuple);
            if (pec) failed = true;
            ws.next_layer().cork();
            arm_watchdog();   // each piece within the write timeout
          }
        }
        if (failed) break;
        bytes += p->size();
      }
      auto [dec] = co_await ws.next_layer().async_drain(use_tuple);
      c.watchdog.cancel();
      if (failed || dec) {
        failed = true;
        break;
      }
      c.last_id = batch.back().id.to_string();
      gw.metrics().events_out += batch.size();
      gw.metrics().bytes_out += bytes;
    }
    if (failed) {
      if (c.close_reason.rfind("slow", 0) == 0) ++gw.metrics().clients_disconnected_slow;
    } else if (session->reading) {
      // Still open: say why it ends, and where to resume.
      websocket::close_reason why;
      if (stopping) {
        why.code = websocket::close_code::going_away;
        why.reason = "server shutting down";
      } else {
        why.code = websocket::close_code::try_again_later;
        why.reason = c.close_reason.substr(0, 85);   // ASCII: cut anywhere
      }
      if (!c.last_id.empty()) why.reason += "; resume from " + c.last_id;
      if (why.reason.size() > 123) why.reason.resize(123);
      co_await ws.async_close(why, use_tuple);
    }
    // The reader ends (if it has not) when the socket closes; it holds the session till then.
    if (session->reading) c.force_close();
  }

  template <class Stream>
  awaitable<void> serve(Stream s) {
    beast::flat_buffer buffer;
    while (!stopping) {
      http::request_parser<http::empty_body> parser;
      parser.header_limit(static_cast<std::uint32_t>(opts.header_limit + opts.url_limit));
      parser.body_limit(0);
      beast::get_lowest_layer(s).expires_after(opts.header_timeout);
      auto [ec, n] = co_await http::async_read(s, buffer, parser, use_tuple);
      if (ec == http::error::header_limit) {
        co_await write_simple(s, 11, http::status::request_header_fields_too_large, "application/json",
                              json_error("", "request header fields too large"), false);
        co_return;
      }
      if (ec == http::error::body_limit) {
        co_await write_simple(s, 11, http::status::payload_too_large, "application/json",
                              json_error("", "request bodies are not accepted"), false);
        co_return;
      }
      if (ec) co_return;   // closed, timed out (trickled headers) or malformed
      auto req = parser.release();
      std::size_t header_bytes = 0;
      for (const auto& f : req) header_bytes += f.name_string().size() + f.value().size() + 4;
      if (req.target().size() > opts.url_limit) {
        co_await write_simple(s, req.version(), http::status::uri_too_long, "application/json",
                              json_error("", "request URL too long"), false);
        co_return;
      }
      if (header_bytes > opts.header_limit) {
        co_await write_simple(s, req.version(), http::status::request_header_fields_too_large, "application/json",
                              json_error("", "request header fields too large"), false);
        co_return;
      }
      std::string_view target(req.target().data(), req.target().size());
      std::string_view path = target.substr(0, target.find('?'));
      bool keep = req.keep_alive();
      auto host_field = req[http::field::host];
      std::string_view host(host_field.data(), host_field.size());
      if (loopback_listener && !loopback_host_allowed(host, opts.allowed_hosts)) {
        ++rejected_origins;
        std::string name(host.substr(0, std::min<std::size_t>(host.size(), 200)));
        co_await write_simple(s, req.version(), http::status::forbidden, "application/json",
                              json_error("", "Host " + name +
                                                 " is not served on a loopback address (a DNS-rebinding page poses as "
                                                 "the gateway so): a reverse proxy that sends it needs --allow-host"),
                              false);
        co_return;
      }
      // Cross-origin browser requests: only from the origins allowed (CORS headers on their
      // responses), never a page of any site reading the stream through its visitor's browser.
      auto origin_field = req[http::field::origin];
      std::string_view origin(origin_field.data(), origin_field.size());
      if (!origin_allowed(origin, host, opts.allowed_origins)) {
        ++rejected_origins;
        co_await write_simple(s, req.version(), http::status::forbidden, "application/json",
                              json_error("", "origin " + std::string(origin.substr(0, 200)) +
                                                 " is not allowed: start walgate with --allow-origin " +
                                                 std::string(origin.substr(0, 200))),
                              false);
        co_return;
      }
      std::string_view cors = origin;   // set only when the request is allowed and has one
      if (req.method() == http::verb::options && !origin.empty()) {   // a CORS preflight
        http::response<http::empty_body> res{http::status::no_content, req.version()};
        res.set(http::field::server, "walgate");
        set_cors(res, cors);
        res.set(http::field::access_control_allow_methods, "GET");
        res.set(http::field::access_control_allow_headers, "Accept, Last-Event-ID, Cache-Control");
        res.set(http::field::access_control_max_age, "600");
        res.keep_alive(keep);
        beast::get_lowest_layer(s).expires_after(opts.write_timeout);
        co_await http::async_write(s, res, use_tuple);
        if (!keep) co_return;
        continue;
      }
      if (req.method() != http::verb::get && req.method() != http::verb::head) {
        co_await write_simple(s, req.version(), http::status::method_not_allowed, "application/json",
                              json_error("", "only GET is supported"), false, {}, cors);
        co_return;
      }
      if (path == "/healthz") {
        co_await write_simple(s, req.version(), http::status::ok, "application/json", "{\"status\":\"ok\"}\n", keep, {}, cors);
      } else if (path == "/readyz") {
        const std::string& fault = gw.stream_fault();
        bool ready = status.streaming && status.streaming() && fault.empty();
        std::string body = ready ? "{\"status\":\"streaming\"}\n" : "{\"status\":\"not streaming\"}\n";
        if (!fault.empty()) {   // serving what is logged; the stream itself is stuck, and why
          body = "{\"status\":\"stream fault\",\"reason\":";
          transform::append_json_string(body, fault);
          body += "}\n";
        }
        co_await write_simple(s, req.version(), ready ? http::status::ok : http::status::service_unavailable,
                              "application/json", std::move(body), keep, {}, cors);
      } else if (path == "/metrics") {
        co_await write_simple(s, req.version(), http::status::ok, "text/plain; version=0.0.4", metrics_text(), keep, {}, cors);
      } else if (path == "/") {
        co_await write_simple(s, req.version(), http::status::ok, "text/html; charset=utf-8", live_page_html, keep, {}, cors);
      } else if (path == "/v1/stream" || path == "/v1/ws") {
        request_error err;
        auto r = parse_stream_query(target, err);
        if (!r) {
          co_await write_simple(s, req.version(), http::status::bad_request, "application/json",
                                json_error(err.parameter, err.message), false, {}, cors);
          co_return;
        }
        // Only a reconnecting EventSource sends Last-Event-ID, and it is always later than the
        // from= its page put in the URL (which the browser sends again unchanged): it wins.
        auto last_event_id = req["Last-Event-ID"];
        if (!last_event_id.empty()) {
          auto id = transform::event_id::parse(std::string_view(last_event_id.data(), last_event_id.size()));
          if (!id) {
            co_await write_simple(s, req.version(), http::status::bad_request, "application/json",
                                  json_error("Last-Event-ID", "malformed event id"), false, {}, cors);
            co_return;
          }
          r->from = id;
        }
        if (streams >= opts.max_clients) {
          ++rejected_clients;
          co_await write_simple(s, req.version(), http::status::service_unavailable, "application/json",
                                json_error("", "too many clients (limit " + std::to_string(opts.max_clients) +
                                                   "); try again later"),
                                false, "5", cors);
          co_return;
        }
        counted admitted(streams);
        std::uint64_t start = gw.log().visible_seq();
        std::optional<transform::event_id> skip_through;
        if (r->from) {
          auto resume = gw.log().resume_after(*r->from);
          if (!resume.error.empty()) {
            // Damage, not age: the log could not be read to find the position.
            co_await write_simple(s, req.version(), http::status::internal_server_error, "application/json",
                                  json_error("from", "cannot find event " + r->from->to_string() +
                                                         " in the event log: " + resume.error),
                                  false, {}, cors);
            co_return;
          }
          auto seq = resume.seq;
          if (resume.past_head) skip_through = r->from;
          if (!seq) {
            // (Built before the co_await: gcc 12 destroys a conditional's temporaries twice there.)
            std::string why = "event " + r->from->to_string();
            if (gw.log().origin().valid() && r->from->commit_lsn < gw.log().origin())
              why += " is from before this event log began (at " + gw.log().origin().to_string() + ")";
            else
              why += " is older than the retained log";
            why += "; take a new snapshot";
            std::string body = json_error("from", why);
            co_await write_simple(s, req.version(), http::status::gone, "application/json", std::move(body), false, {},
                                  cors);
            co_return;
          }
          start = *seq;
        }
        if (path == "/v1/ws") {
          if (!websocket::is_upgrade(req)) {
            co_await write_simple(s, req.version(), http::status::upgrade_required, "application/json",
                                  json_error("", "/v1/ws needs a WebSocket upgrade"), false, {}, cors);
            co_return;
          }
          co_await serve_websocket(std::move(s), std::move(req), std::move(*r), start, skip_through);
          co_return;
        }
        auto accept = req[http::field::accept];
        bool sse = std::string_view(accept.data(), accept.size()).find("text/event-stream") != std::string_view::npos;
        co_await serve_http_stream(s, req, std::move(*r), sse ? transport::sse : transport::ndjson, start, skip_through,
                                   cors);
        co_return;
      } else {
        co_await write_simple(s, req.version(), http::status::not_found, "application/json",
                              json_error("", "no such endpoint"), keep, {}, cors);
      }
      if (!keep) co_return;
    }
  }

  awaitable<void> session(tcp::socket socket) {
    auto self = shared_from_this();
    counted open(connections);
    // Events are written as they come, in small batches: no Nagle delay behind an unacknowledged
    // segment (it meets the client's delayed ACK: 40 ms stalls).
    boost::system::error_code nec;
    socket.set_option(tcp::no_delay(true), nec);
    beast::tcp_stream stream(std::move(socket));
    if (tls) {
      beast::ssl_stream<beast::tcp_stream> ss(std::move(stream), *tls);
      beast::get_lowest_layer(ss).expires_after(opts.header_timeout);
      auto [ec] = co_await ss.async_handshake(asio::ssl::stream_base::server, use_tuple);
      if (ec) co_return;
      co_await serve(std::move(ss));
    } else {
      co_await serve(std::move(stream));
    }
  }

  awaitable<void> accept_loop() {
    auto self = shared_from_this();
    asio::steady_timer pause(executor);
    auto wait = [&](std::chrono::milliseconds d) -> awaitable<void> {
      ++accept_pauses;
      pause.expires_after(d);
      co_await pause.async_wait(use_tuple);
    };
    while (!stopping) {
      // At the connection limit, new connections wait in the listen backlog until one closes.
      if (connections >= opts.max_clients + opts.max_other_connections) {
        co_await wait(std::chrono::milliseconds(50));
        continue;
      }
      auto [ec, socket] = co_await acceptor.async_accept(use_tuple);
      if (ec) {
        if (stopping) break;
        // Out of file descriptors or memory: the connection stays queued and accept would fail
        // again at once; wait instead of spinning.
        if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space || ec == asio::error::no_memory ||
            ec.value() == ENFILE)
          co_await wait(std::chrono::milliseconds(100));
        continue;
      }
      asio::co_spawn(executor, session(std::move(socket)), asio::detached);
    }
  }
};

server::server(asio::any_io_executor ex, server_options opts, gateway& gw, server_status status)
    : impl_(std::make_shared<impl>(ex, std::move(opts), gw, std::move(status))) {}

server::~server() { stop(); }

bool server::start(std::string& error) {
  auto& i = *impl_;
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(i.opts.host, ec);
  if (ec) {
    error = "--listen: invalid address '" + i.opts.host + "'";
    return false;
  }
  if (!i.opts.tls_cert.empty()) {
    i.tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    i.tls->use_certificate_chain_file(i.opts.tls_cert, ec);
    if (!ec) i.tls->use_private_key_file(i.opts.tls_key, asio::ssl::context::pem, ec);
    if (ec) {
      error = "--tls-cert/--tls-key: " + ec.message();
      return false;
    }
  }
  i.loopback_listener = addr.is_loopback();
  tcp::endpoint ep(addr, i.opts.port);
  i.acceptor.open(ep.protocol(), ec);
  if (!ec) i.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) i.acceptor.bind(ep, ec);
  if (!ec) i.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    error = "cannot listen on " + i.opts.host + ":" + std::to_string(i.opts.port) + ": " + ec.message();
    return false;
  }
  asio::co_spawn(i.executor, impl_->accept_loop(), asio::detached);
  i.gw.on_event_logged([w = std::weak_ptr<impl>(impl_)](const logged_event& e, const transform::change& c) {
    if (auto self = w.lock()) self->on_logged(e, c);
  });
  return true;
}

std::uint16_t server::port() const {
  boost::system::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void server::stop() {
  auto& i = *impl_;
  if (i.stopping) return;
  i.stopping = true;
  boost::system::error_code ec;
  i.acceptor.close(ec);
  i.gw.on_event_logged({});
  i.notify();
}

void server::notify() { impl_->notify(); }
std::size_t server::clients() const { return impl_->clients.size(); }

}  // namespace walgate::proxy
