#include "serving.hpp"
#include "socket_sender.hpp"

#include "walgate/proxy/deflate.hpp"

#include "walgate/transform/json.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>

namespace walgate::proxy {

const char* transport_name(transport t) {
  return t == transport::ndjson ? "ndjson" : t == transport::sse ? "sse" : "websocket";
}

bool peer_closed(int fd) {
  char b;
  auto n = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

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

std::string end_line(std::string_view reason, std::string_view resume_id) {
  std::string last = "{\"error\":";
  transform::append_json_string(last, reason);
  last += ",\"resume_from\":";
  if (resume_id.empty()) last += "null";
  else transform::append_json_string(last, resume_id);
  last += "}";
  return last;
}

client::client(server_core& c, transport k, stream_start start)
    : core(c),
      kind(k),
      sub(c.log, c.encodings, std::move(start.request), start.seq, start.skip_through, c.limits(), start.snapshot,
          &c.router),
      wake(c.executor),
      watchdog(c.executor),
      snapshot(std::move(start.snapshot)) {
  if (snapshot) snapshot->set_wake([this] { wake_target->cancel(); });
  who = std::move(start.who);
  if (who && who->exp)
    expiry = core.at_expiry(*who->exp, [this] {
      expiry.reset();
      if (sub.ended()) return;
      sub.close(subscription::end::expired, "the token expired");
      ++core.expired_streams;
      wake_target->cancel();
    });
  core.clients.insert(this);
  ++core.by_transport[static_cast<std::size_t>(kind)];
}

client::~client() {
  if (expiry) core.cancel_expiry(*expiry);
  if (snapshot) {
    snapshot->set_wake({});
    snapshot->cancel();
  }
  core.clients.erase(this);
  --core.by_transport[static_cast<std::size_t>(kind)];
}

void client::delivered(const subscription::item& last, std::size_t events, std::size_t bytes) {
  sub.delivered(last);
  core.events_out += events;
  core.bytes_out += bytes;
}

void client::finished() {
  if (sub.why() == subscription::end::slow) ++core.disconnected_slow;
}

server_core::server_core(boost::asio::any_io_executor ex, server_options o, gateway& g, server_status s)
    : executor(ex),
      opts(std::move(o)),
      gw(g),
      log(g.log()),
      status(std::move(s)),
      encodings(log, encoding_cache::options{opts.encoder, opts.spill_dir, opts.spill_bytes}),
      snapshots(ex, opts.snapshot, log,
                [&g](protocol::lsn w, std::weak_ptr<const void> owner,
                     std::function<void(std::uint64_t, transform::event_id)> f) {
                  g.when_read_past(w, std::move(owner), std::move(f));
                }),
      admit(admission::options{opts.max_streams_per_subject, opts.max_streams_per_address, opts.auth_failures_per_minute}) {
  admit.set_log(opts.log);
  // (Over TLS the loop writes: no sender threads.)
  if (opts.send_threads > 0 && opts.tls_cert.empty()) {
    try {
      sender = socket_sender::make(ex, opts.send_threads);
    } catch (const std::exception& e) {
      if (opts.log) opts.log(std::string("cannot start the sender threads (the event loop writes instead): ") + e.what());
    }
  }
  if (sender) {
    metrics.add_value("walgate_send_thread_writes_total", "counter",
                      "Writes to stream clients made by the sender threads (--send-threads).",
                      [this] { return sender->writes; });
    metrics.add_value("walgate_send_thread_partial_total", "counter",
                      "Of those, the writes the socket took only in part (the rest went from the event loop).",
                      [this] { return sender->partial; });
  }
  // Each part registers its own figures: the gateway its stream's, the log its own, the
  // server its clients'.
  gw.register_metrics(metrics);
  gw.log().register_metrics(metrics);
  metrics.add_value("walgate_events_out_total", "counter", "Events written to clients.", [this] { return events_out; });
  metrics.add_value("walgate_bytes_out_total", "counter", "Bytes of events written to clients (as sent: compressed ones compressed).",
                    [this] { return bytes_out; });
  metrics.add_value("walgate_ws_deflated_total", "counter",
                    "Messages compressed for WebSocket permessage-deflate (once per event and window, shared by the clients).",
                    [] { return deflated_total.load(); });
  metrics.add("walgate_clients", "gauge", "Connected stream clients by transport.", [this](auto& out) {
    for (auto t : {transport::ndjson, transport::sse, transport::websocket})
      out.push_back({std::string("{transport=\"") + transport_name(t) + "\"}",
                     std::to_string(by_transport[static_cast<std::size_t>(t)])});
  });
  // One sample per client: collected at most once in opts.metrics_cache (N scrapes a second
  // cost one pass over the clients).
  metrics.add(
      "walgate_client_lag_events", "gauge", "Events between a client's position and the head.",
      [this](auto& out) {
        std::size_t i = 0;
        for (auto* c : clients)
          out.push_back({"{client=\"" + std::to_string(i++) + "\",transport=\"" + transport_name(c->kind) + "\"}",
                         std::to_string(c->sub.lag_events())});
      },
      opts.metrics_cache);
  metrics.add("walgate_client_lag_bytes", "gauge", "Bytes of event log between a client's position and the head.",
              [this](auto& out) {
                std::size_t i = 0;
                for (auto* c : clients)
                  out.push_back({"{client=\"" + std::to_string(i++) + "\",transport=\"" + transport_name(c->kind) + "\"}",
                                 std::to_string(c->sub.lag_bytes())});
              },
              opts.metrics_cache);
  metrics.add_value("walgate_clients_disconnected_slow_total", "counter", "Clients disconnected for being too slow.",
                    [this] { return disconnected_slow; });
  metrics.add_value("walgate_clients_rejected_total", "counter", "Stream requests answered 503: over --max-clients.",
                    [this] { return rejected_clients; });
  metrics.add_value("walgate_origins_rejected_total", "counter",
                    "Browser requests refused (403): an origin not allowed, or a Host a loopback listener does not serve.",
                    [this] { return rejected_origins; });
  metrics.add_value("walgate_connections", "gauge", "Open HTTP connections (stream clients included).",
                    [this] { return connections; });
  metrics.add_value("walgate_connections_replaced_total", "counter",
                    "Waiting connections that were not streams (idle keep-alive, a request head not yet whole) "
                    "closed to make room for a new one (--max-connections-per-address, --max-other-connections in all).",
                    [this] { return connections_replaced; });
  metrics.add_value("walgate_connections_refused_total", "counter",
                    "Connections refused at accept (429): the address holds --max-other-connections connections that "
                    "are not streams, none of them waiting (over --max-connections-per-address, none to replace).",
                    [this] { return connections_refused_address; });
  metrics.add_value("walgate_accept_pauses_total", "counter",
                    "Times accepting paused (connection limit reached, or out of file descriptors).",
                    [this] { return accept_pauses; });
  metrics.add_value("walgate_payloads_spilled_total", "counter",
                    "Encodings of large events written to a spill file and sent from it in pieces.",
                    [this] { return encodings.spilled(); });
  metrics.add_value("walgate_spill_read_errors_total", "counter",
                    "Spill files that could not be read back (the client was disconnected in the middle of the event).",
                    [this] { return spill_read_errors; });
  metrics.add_value("walgate_reconnects_total", "counter", "Reconnections to PostgreSQL.",
                    [this] { return status.reconnects ? status.reconnects() : 0; });
  metrics.add_value("walgate_routed_clients", "gauge",
                    "Clients whose row grants find their events by equality (each event goes only to those holding its value).",
                    [this] { return router.targets(); });
  metrics.add_value("walgate_router_events_total", "counter", "Events the row router looked at (once each).",
                    [this] { return router.events_routed(); });
  metrics.add_value("walgate_router_deliveries_total", "counter", "Events the row router queued for a client.",
                    [this] { return router.deliveries_routed(); });
  metrics.add_value("walgate_router_decided_total", "counter",
                    "Events a client took as the row router found them, without deciding them again (row_router::found).",
                    [this] { return router.decided(); });
  snapshots.register_metrics(metrics);
  if (opts.auth) {
    metrics.add_value("walgate_auth_tokens_accepted_total", "counter", "Bearer tokens verified.",
                      [a = opts.auth] { return a->accepted(); });
    metrics.add_value("walgate_auth_tokens_refused_total", "counter",
                      "Bearer tokens refused (bad signature, expired, wrong audience…).", [a = opts.auth] { return a->refused(); });
    metrics.add_value("walgate_auth_unauthorized_total", "counter",
                      "Stream requests (and /metrics) refused for their token: 401, or 400 for one sent in more than one way.",
                      [this] { return unauthorized; });
    metrics.add_value("walgate_auth_forbidden_total", "counter",
                      "Stream requests and /v1/mux subscriptions refused (403): outside their token's grants (--policy).",
                      [this] { return forbidden; });
    metrics.add_value("walgate_auth_expired_streams_total", "counter", "Streams ended because their token expired.",
                      [this] { return expired_streams; });
    metrics.add_value("walgate_auth_key_reloads_total", "counter", "Key files read (at start, SIGHUP, a change).",
                      [a = opts.auth] { return a->reloads(); });
    metrics.add_value("walgate_auth_key_reload_failures_total", "counter",
                      "Key file reads that failed (the keys in use stayed).", [a = opts.auth] { return a->reload_failures(); });
  }
  metrics.add("walgate_refused_total", "counter",
              "Stream requests (and /v1/mux subscriptions, and /metrics with --auth jwt) refused, by reason: no_token, "
              "invalid_token, invalid_request "
              "(401/400), forbidden (403), subject_limit, address_limit, auth_rate_limit (429), too_many_clients (503).",
              [this](std::vector<metrics_registry::sample>& out) {
                for (std::size_t r = 0; r < static_cast<std::size_t>(admission::reason::count_); ++r)
                  out.push_back({std::string("{reason=\"") + admission::name(static_cast<admission::reason>(r)) + "\"}",
                                 std::to_string(admit.refusals(static_cast<admission::reason>(r)))});
              });
  for (const auto& f : opts.extra_metrics) f(metrics);
  listener_ = log.on_visible([this] { notify(); });
  fetched_listener_ = log.on_fetched([this] { notify_fetched(); });
  gw.on_event_logged([this](const logged_event& e, const transform::change& c) {
    encodings.on_logged(e, c);
    if (c.relation && !e.table.empty()) {   // (once per definition: its generation)
      auto& k = known_tables[e.schema + '\0' + e.table];
      if (k.generation != c.relation->generation || c.relation->generation == 0) {
        k.generation = c.relation->generation;
        k.replica_identity = c.relation->replica_identity;
        k.columns.clear();
        for (const auto& col : c.relation->columns) k.columns.push_back({col.name, col.type_oid, col.key});
      }
    }
  });
  log.set_prepare(encodings.preparer());   // encodings of what the log reads in the background, made there
}

server_core::~server_core() { detach(); }

void server_core::detach() {
  if (!attached_) return;
  attached_ = false;
  log.remove_listener(listener_);
  log.remove_listener(fetched_listener_);
  gw.on_event_logged({});
  log.set_prepare({});
  snapshots.stop();
  expiries_.clear();   // (the streams end with the server; nothing waits for their tokens)
  if (expiry_timer_) expiry_timer_->cancel();
}

bool server_core::make_room(const std::string& address) {
  // Assumption written down: a connection that is not a stream costs a place only while it is
  // busy; one that waits (for a handshake, a request's head: an idle keep-alive, a trickler) may
  // be closed for a newcomer, oldest first — so whoever opens connections and leaves them idle
  // never keeps others out, and one address never takes more than its share.
  const auto waited = std::chrono::steady_clock::now() - waiting_grace;
  auto replace = [&](const std::string* of) {
    for (auto& w : waiting)
      if (!w.closing && w.since <= waited && (!of || w.address == *of)) {
        w.closing = true;
        ++connections_replaced;
        if (w.close) w.close();
        return true;
      }
    return false;
  };
  std::size_t closing = 0, closing_here = 0;
  for (const auto& w : waiting)
    if (w.closing) {
      ++closing;
      closing_here += w.address == address;
    }
  if (const std::size_t limit = opts.max_connections_per_address) {
    auto it = non_stream_by_address.find(address);
    const std::size_t mine = it == non_stream_by_address.end() ? 0 : it->second - std::min(it->second, closing_here);
    if (mine >= limit) {
      // None of its own has waited a second (a burst): let it in, up to what all may hold.
      if (replace(&address)) ++closing;
      else if (mine >= opts.max_other_connections) return false;
    }
  }
  if (non_stream - std::min(non_stream, closing) >= opts.max_other_connections) replace(nullptr);
  return true;
}

subscription::limits server_core::limits() const {
  subscription::limits l;
  l.batch_bytes = opts.batch_bytes;
  l.lag_bytes = opts.client_lag_bytes;
  l.group_bytes = opts.group_max_bytes;
  return l;
}

void server_core::notify_fetched() {
  for (auto* c : clients)
    if (c->sub.waiting()) c->wake_target->cancel();
}

void server_core::notify() {
  ++notifications;
  // The router first: a client it found nothing for is not woken.
  router.route();
  for (auto* c : clients)
    if (stopping || !c->sub.idle_routed()) c->wake_target->cancel();
  for (auto* t : waiters) t->cancel();
}

std::optional<refusal> servable_rows(const server_core& core, const stream_request& r) {
  if (!r.granted && !r.where) return std::nullopt;
  for (const auto& [key, t] : core.known_tables) {
    const auto nul = key.find('\0');
    const std::string_view schema(key.data(), nul), table(key.data() + nul + 1, key.size() - nul - 1);
    if (r.granted && !r.granted->allows(schema, table, 'c') && !r.granted->allows(schema, table, 'u') &&
        !r.granted->allows(schema, table, 'd'))
      continue;   // (none of its changes for this token)
    if (!r.tables.empty() && std::none_of(r.tables.begin(), r.tables.end(), [&](const table_pattern& p) {
          return p.schema == schema && (p.any || p.table == table);
        }))
      continue;
    const auto rows = table_rows::make(r, schema, table, t.columns, t.replica_identity, true);
    if (!rows.failed.empty())
      return refusal{409, rows.failed.starts_with("where=") ? "where" : "", rows.failed, {}};
  }
  return std::nullopt;
}

std::optional<refusal> position(server_core& core, stream_request r, std::string_view last_event_id, stream_start& out) {
  // Only a reconnecting EventSource sends Last-Event-ID, and it is always later than the from=
  // its page put in the URL (which the browser sends again unchanged): it wins.
  if (!last_event_id.empty()) {
    auto id = transform::event_id::parse(last_event_id);
    if (!id) return refusal{400, "Last-Event-ID", "malformed event id", {}};
    r.from = id;
  }
  if (core.opts.edge && r.snapshot && !r.from)
    return refusal{501, "snapshot", "an edge (walgate edge) takes no snapshots: ask the origin walgate for snapshot=true, "
                                    "then resume here from its resume_from", {}};
  if (core.opts.unavailable)
    if (auto why = core.opts.unavailable(); !why.empty()) return refusal{503, "", why, "2"};
  if (core.streams >= core.opts.max_clients) {
    ++core.rejected_clients;
    return refusal{503, "", "too many clients (limit " + std::to_string(core.opts.max_clients) + "); try again later", "5"};
  }
  const log_reader& log = core.log;
  out.seq = log.visible_seq();
  if (r.from) {
    // An id of a transaction cut from the log (a failover to a server that never had it): on
    // the server's timeline its LSN names nothing, or another change — never resumed from.
    for (const auto& cut : log.history_cuts())
      if (cut.covers(r.from->commit_lsn))
        return refusal{410, "from",
                       "event " + r.from->to_string() + " was logged from PostgreSQL's timeline " +
                           std::to_string(cut.from_timeline) + ", which the server left at " + cut.at.to_string() +
                           " for timeline " + std::to_string(cut.to_timeline) +
                           " (a failover to a server that never had it): it names no change of the server's history; "
                           "take a new snapshot",
                       {}};
    auto resume = log.resume_after(*r.from);
    if (!resume.error.empty()) {
      // Damage, not age: the log could not be read to find the position.
      std::string why = "cannot find event " + r.from->to_string() + " in the event log: " + resume.error;
      if (core.opts.log) core.opts.log("a resume refused (500): " + why);   // (damage an operator must see)
      return refusal{500, "from", why, {}};
    }
    if (resume.past_head && core.opts.server_wal_end) {
      // An id the log does not hold yet is one a crash took from the log before it was synced
      // (the server sends it again) — so it is at or below the server's WAL end, which the
      // gateway learns at every connection. Past it, the id is not of this stream (made up, or
      // copied from a forged event) and would be waited for forever.
      const protocol::lsn end = core.opts.server_wal_end();
      if (!end.valid())
        return refusal{503, "from",
                       "event " + r.from->to_string() +
                           " is past this event log's head, and walgate has not reached PostgreSQL since it started to "
                           "tell whether it exists; try again",
                       "2"};
      if (r.from->commit_lsn > end)
        return refusal{400, "from",
                       "event " + r.from->to_string() + " is past the end of the server's WAL (" + end.to_string() +
                           "): it is no event of this stream",
                       {}};
    }
    if (resume.past_head) out.skip_through = r.from;
    if (!resume.seq) {
      std::string why = "event " + r.from->to_string();
      if (log.origin().valid() && r.from->commit_lsn < log.origin())
        why += " is from before this event log began (at " + log.origin().to_string() + ")";
      else
        why += " is older than the retained log";
      why += "; take a new snapshot";
      return refusal{410, "from", why, {}};
    }
    out.seq = *resume.seq;
  }
  if (!r.transactions)
    r.transactions = !r.group && (r.fmt == transform::format::wal2json ||
                     (r.fmt == transform::format::debezium && core.opts.debezium_transaction_metadata));
  if (r.empty_transactions && !r.group && !*r.transactions)   // (debezium without --debezium-transaction-metadata)
    return refusal{400, "empty_transactions",
                   "empty_transactions needs transaction records: add transactions=true (debezium's are off by default)", {}};
  resume_in_transaction(log, r, out.seq, out.skip_through);
  out.request = std::move(r);
  return std::nullopt;
}

server_core::expiry_handle server_core::at_expiry(std::int64_t exp, std::function<void()> f) {
  if (opts.auth) exp += opts.auth->options().claims.leeway.count();   // (exp is clamped far below overflow: jwt.cpp)
  expiry_handle h{exp, ++next_expiry_};
  expiries_.emplace(h, std::move(f));
  if (timer_for_ == 0 || exp < timer_for_) arm_expiry();
  return h;
}

void server_core::cancel_expiry(const expiry_handle& h) { expiries_.erase(h); }

void server_core::arm_expiry() {
  if (!expiry_timer_) expiry_timer_ = std::make_unique<boost::asio::steady_timer>(executor);
  if (expiries_.empty()) {
    timer_for_ = 0;
    expiry_timer_->cancel();
    return;
  }
  timer_for_ = expiries_.begin()->first.first;
  // In whole seconds (an exp in the year 3000 is no overflow), at the next second boundary past
  // it; the wall clock may be set meanwhile: looked at again at least every 10 s.
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const auto now_s = std::chrono::duration_cast<std::chrono::seconds>(now);
  std::chrono::milliseconds due(0);
  if (timer_for_ > now_s.count()) {
    const std::int64_t whole = std::min<std::int64_t>(timer_for_ - now_s.count(), 10);
    due = std::chrono::seconds(whole) - std::chrono::duration_cast<std::chrono::milliseconds>(now - now_s);
  }
  expiry_timer_->expires_after(due);
  expiry_timer_->async_wait([this](boost::system::error_code ec) {
    if (ec) return;   // (re-armed, or the server goes)
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
    // Each due one runs once, taken out of the map first (it may cancel or add others).
    while (!expiries_.empty() && expiries_.begin()->first.first <= now.count()) {
      auto f = std::move(expiries_.begin()->second);
      expiries_.erase(expiries_.begin());
      f();
    }
    timer_for_ = 0;
    arm_expiry();
  });
}

void server_core::spill_read_failed(const std::string& error) {
  ++spill_read_errors;
  if (spill_read_logged) return;
  spill_read_logged = true;
  std::fprintf(stderr, "walgate: %s: a client was disconnected in the middle of an event\n", error.c_str());
}

}  // namespace walgate::proxy
