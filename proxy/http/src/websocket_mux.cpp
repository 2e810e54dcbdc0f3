// A multiplexed WebSocket (GET /v1/mux): many subscriptions over one connection, each opened by
// a client message {"type":"subscribe","id":…, <the parameters of /v1/ws>} and closed by
// {"type":"unsubscribe","id":…}. Every event goes out as {"sub":<id>,"id":<event id>,"data":<the
// format's event>}: the envelope around the shared encoding — and, on a compressing connection,
// DEFLATE stored blocks around the shared compressed form (deflate.hpp) — so encode-once and
// compress-once hold as on /v1/ws. Each subscription is a client of the server of its own
// (counted against --max-clients, resumable on its own); one writer serves them in turn, a
// batch each, one write per round. docs/api.md, "Multiplexed subscriptions", is the contract.
// Over 500 lines for a reason: serve_websocket_mux (about 240 lines) is the connection's one
// writer, a coroutine whose every round (subscriptions begun or ended, the client's messages, a
// batch of each subscription, the drain) runs in that order, so that answers and events go out
// in the order of the client's messages; its locals (the round, the batch, the idle timers) last
// across rounds. The rest (about 290 lines: mux_sub, mux_session, the message
// builders and on_client_message, the subscribe path) is separate already; with mux_session in an
// internal header it could be a file of its own.
#include "route.hpp"
#include "websocket_session.hpp"

#include "walgate/transform/json.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <boost/url/url.hpp>

#include <array>
#include <deque>
#include <optional>

namespace walgate::proxy {

using namespace ws;

namespace {

/// Longest subscription id, in bytes.
constexpr std::size_t max_sub_id = 128;
/// Client messages read and not yet handled: at this many (or this many bytes) the reader stops
/// reading until the writer has taken them (a client that only sends is not answered into
/// unbounded memory).
constexpr std::size_t max_inbox = 16;
constexpr std::size_t max_inbox_bytes = 64u << 10;

struct mux_sub {
  mux_sub(server_core& core, std::string n) : name(std::move(n)), admitted(core.streams) {
    transform::append_json_string(name_json, name);
  }
  ~mux_sub() {
    if (job) {   // admitted and never started: its worker must not wake a connection that is gone
      job->set_wake({});
      job->cancel();
    }
  }
  mux_sub(const mux_sub&) = delete;
  mux_sub& operator=(const mux_sub&) = delete;
  std::string name;        // the client's id for it
  std::string name_json;   // the same as a JSON string
  counted admitted;        // in core.streams (--max-clients) while it lives
  std::optional<admission::slot> slot;   // its place under the per-subject and per-address limits
  std::shared_ptr<snapshot_job> job;   // snapshot=true, admitted and not started yet
  stream_start start;                  // where it starts (while the job is not started)
  std::optional<client> c;             // started
};

/// The connection: its subscriptions and the client's messages not yet handled. Everything
/// but the inbox is the writer's alone (the reader only fills the inbox and wakes it), so the
/// answers and events go out in the order of the client's messages.
template <class Stream>
struct mux_session : session<Stream> {
  mux_session(Stream&& s, server_core& c)
      : session<Stream>(std::move(s)), core(c), wake(c.executor), watchdog(c.executor), room(c.executor) {}
  server_core& core;
  std::vector<std::unique_ptr<mux_sub>> subs;
  struct client_message {
    bool text;
    std::string bytes;
  };
  std::deque<client_message> inbox;   // the client's messages, in order
  std::size_t inbox_bytes = 0;
  asio::steady_timer wake;         // the writer waits on it: events, messages, snapshots
  asio::steady_timer watchdog;     // write timeout
  asio::steady_timer room;         // the reader waits on it while the inbox is full
  bool writer_done = false;

  // The reader's (websocket_session.hpp): each client message into the inbox, for the writer.
  static constexpr bool keeps_messages = true;
  void reader_end(const char*) { wake.cancel(); }
  bool inbox_full() const { return inbox.size() >= max_inbox || inbox_bytes >= max_inbox_bytes; }
  /// While the inbox is full the reader waits (the writer cancels room when it has taken the
  /// messages, or when the connection ends).
  delivered deliver(const std::shared_ptr<mux_session>& sp, bool text, std::string&& message) {
    if (writer_done || !this->is_open()) return delivered::stop;
    inbox_bytes += message.size();
    inbox.push_back({text, std::move(message)});
    wake.cancel();
    if (!inbox_full()) return delivered::go_on;
    wait_for_room(sp);
    return delivered::paused;
  }
  static void wait_for_room(const std::shared_ptr<mux_session>& sp) {
    sp->room.expires_after(std::chrono::seconds(1));
    sp->room.async_wait([sp](boost::system::error_code) {
      auto& m = *sp;
      if (m.writer_done || !m.is_open()) {   // the connection ends: what follows is read, its data skipped
        m.closing = true;
        m.reader_end("");
      } else if (m.inbox_full()) {
        return wait_for_room(sp);
      }
      take_pieces(sp);
    });
  }
  std::size_t next = 0;            // whose batch comes first in the next round
  std::shared_ptr<const identity> who;   // the connection's token (authentication on): its subscriptions'
  std::string peer;                // the client's address (the per-address limit)
  std::deque<std::chrono::steady_clock::time_point> snapshots_begun;   // in the last minute (the per-connection limit)
  bool expired = false;            // the token expired: every subscription ends, then the connection (4001)

  mux_sub* find(std::string_view name) {
    for (auto& s : subs)
      if (s->name == name) return s.get();
    return nullptr;
  }
  /// Its client: woken with the writer, compressed as the connection negotiated, closed with it.
  void start(mux_sub& s, stream_start start) {
    auto& c = s.c.emplace(core, transport::websocket, std::move(start));
    c.wake_target = &wake;
    if (this->deflate_bits) c.sub.set_deflate(this->deflate_bits);
    c.force_close = [this] { this->close_socket(); };
  }
};

std::string error_message(const std::string* sub_json, unsigned status, std::string_view parameter, std::string_view error) {
  std::string m = "{\"sub\":" + (sub_json ? *sub_json : std::string("null")) + ",\"type\":\"error\",\"status\":" +
                  std::to_string(status) + ",\"error\":";
  transform::append_json_string(m, error);
  if (!parameter.empty()) {
    m += ",\"parameter\":";
    transform::append_json_string(m, parameter);
  }
  return m + "}";
}

std::string end_message(const mux_sub& s, std::string_view reason, std::string_view resume_id) {
  std::string m = "{\"sub\":" + s.name_json + ",\"type\":\"end\",\"reason\":";
  transform::append_json_string(m, reason);
  m += ",\"resume_from\":";
  if (resume_id.empty()) m += "null";
  else transform::append_json_string(m, resume_id);
  return m + "}";
}

std::string subscribed_message(const mux_sub& s) { return "{\"sub\":" + s.name_json + ",\"type\":\"subscribed\"}"; }

/// A subscribe message's parameters as the query string /v1/ws takes, so that they mean
/// exactly what they mean there: strings as they are, booleans as true/false, arrays of
/// strings joined with commas. False with error for anything else.
bool to_query(const boost::json::object& o, boost::urls::url& u, std::string& parameter, std::string& error) {
  for (const auto& [k, v] : o) {
    if (k == "type" || k == "id") continue;
    if (k == "access_token") {
      parameter = "access_token";
      error = "the token goes with the connection (its upgrade request), not with a subscription";
      return false;
    }
    std::string value;
    if (v.is_string()) {
      value = std::string(v.get_string());
    } else if (v.is_bool()) {
      value = v.get_bool() ? "true" : "false";
    } else if (v.is_array()) {
      for (const auto& item : v.get_array()) {
        if (!item.is_string()) {
          parameter = std::string(k);
          error = "a list holds strings";
          return false;
        }
        if (!value.empty()) value += ',';
        value += std::string(item.get_string());
      }
    } else {
      parameter = std::string(k);
      error = "use a string, a boolean or a list of strings";
      return false;
    }
    u.params().append(boost::urls::param_view(boost::urls::string_view(k.data(), k.size()),
                                              boost::urls::string_view(value.data(), value.size())));
  }
  return true;
}

/// One message from the client, taken by the writer between rounds: subscribe (checked and
/// positioned as a /v1/ws request is; snapshot=true admits its snapshot, started by the writer
/// once it has begun) or unsubscribe. Answers go out through send, before any later event.
template <class Stream, class Send>
void on_client_message(mux_session<Stream>& m, std::string_view text, Send&& send) {
  server_core& core = m.core;
  boost::system::error_code ec;
  auto v = boost::json::parse(text, ec);
  if (ec || !v.is_object()) {
    send(error_message(nullptr, 400, "", "a message is a JSON object: {\"type\":\"subscribe\",\"id\":\"…\",…}"));
    return;
  }
  const auto& o = v.get_object();
  const auto* type = o.if_contains("type");
  const auto* id = o.if_contains("id");
  if (!id || !id->is_string() || id->get_string().empty() || id->get_string().size() > max_sub_id) {
    send(error_message(nullptr, 400, "id", "id is a string of 1 to 128 bytes"));
    return;
  }
  const std::string name(id->get_string());
  std::string name_json;
  transform::append_json_string(name_json, name);
  if (!type || !type->is_string() || (type->get_string() != "subscribe" && type->get_string() != "unsubscribe")) {
    send(error_message(&name_json, 400, "type", "type is subscribe or unsubscribe"));
    return;
  }
  auto* open = m.find(name);
  if (type->get_string() == "unsubscribe") {
    if (!open) {
      send(error_message(&name_json, 404, "id", "no subscription " + name + " on this connection"));
      return;
    }
    std::string reason = "unsubscribed", resume;
    if (open->c) {
      if (open->c->sub.ended()) {   // it ended by itself meanwhile: that is what it is told
        open->c->finished();
        reason = open->c->sub.reason();
      }
      open->c->sub.close(subscription::end::client_gone, "unsubscribed");
      resume = open->c->sub.resume_id();
    }
    send(end_message(*open, reason, resume));
    std::erase_if(m.subs, [open](const auto& p) { return p.get() == open; });
    return;
  }
  if (open) {
    send(error_message(&name_json, 409, "id", "subscription " + name + " is open on this connection"));
    return;
  }
  if (m.expired) {
    send(error_message(&name_json, 401, "", "the token expired"));
    return;
  }
  if (m.subs.size() >= core.opts.ws_max_subscriptions) {
    send(error_message(&name_json, 429, "",
                       "at most " + std::to_string(core.opts.ws_max_subscriptions) +
                           " subscriptions on one connection (--ws-max-subscriptions)"));
    return;
  }
  boost::urls::url u("/v1/mux");
  std::string parameter, error;
  if (!to_query(o, u, parameter, error)) {
    send(error_message(&name_json, 400, parameter, error));
    return;
  }
  request_error err;
  auto r = parse_stream_query(u.buffer(), err);
  if (!r) {
    send(error_message(&name_json, 400, err.parameter, err.message));
    return;
  }
  // (the same admission as /v1/stream's: route.cpp)
  auto admitted = admit_stream(core, std::move(*r), m.who, m.peer, "/v1/mux");
  if (auto* no = std::get_if<refusal>(&admitted)) {
    send(error_message(&name_json, no->status, no->parameter, no->message));
    return;
  }
  auto& [start, slot] = std::get<admitted_stream>(admitted);
  auto s = std::make_unique<mux_sub>(core, name);
  s->slot = std::move(slot);
  if (start.request.snapshot && !start.request.from) {
    // subscribe/unsubscribe churn on one connection: at most per_connection_minute snapshots
    // begun a minute (each a PostgreSQL session), besides the address's and the subject's.
    const auto now = std::chrono::steady_clock::now();
    while (!m.snapshots_begun.empty() && m.snapshots_begun.front() <= now - std::chrono::minutes(1))
      m.snapshots_begun.pop_front();
    if (const std::size_t per = core.snapshots.options().per_connection_minute; per && m.snapshots_begun.size() >= per) {
      core.snapshots.count_rate_limited();
      send(error_message(&name_json, 429, "snapshot",
                         snapshot_service::rate_refusal("connection", per,
                                                        m.snapshots_begun.front() - (now - std::chrono::minutes(1)))));
      return;
    }
    unsigned code = 0;
    std::string why;
    auto job = core.snapshots.admit(start.request, core.encodings.encoder(), code, why, m.peer,
                                    m.who ? std::string_view(m.who->subject) : std::string_view{});
    if (!job) {
      send(error_message(&name_json, code, "snapshot", why));
      return;
    }
    m.snapshots_begun.push_back(now);
    job->set_wake([w = &m.wake] { w->cancel(); });
    s->job = std::move(job);
    s->start = std::move(start);
  } else {
    m.start(*s, std::move(start));
    send(subscribed_message(*s));
  }
  m.subs.push_back(std::move(s));
}

}  // namespace

template <class Stream>
awaitable<void> serve_websocket_mux(server_core& core, Stream s, http::request<http::empty_body> req,
                                    std::shared_ptr<const identity> who, std::string peer, connection_hold hold) {
  auto m = std::make_shared<mux_session<Stream>>(std::move(s), core);
  auto& out = m->out;
  const auto& opts = core.opts;
  if (!co_await handshake(core, *m, req)) co_return;
  req = http::request<http::empty_body>{};   // (its fields are not kept for the connection's life)
  out.send_with(core.sender);   // (its frames written by a sender thread from here; socket_sender.hpp)

  m->who = std::move(who);
  m->peer = std::move(peer);
  std::optional<server_core::expiry_handle> expiry;
  if (m->who && m->who->exp)
    expiry = core.at_expiry(*m->who->exp, [ms = m.get(), &expiry] {
      expiry.reset();
      ms->expired = true;
      for (auto& sub : ms->subs)
        if (sub->c && !sub->c->sub.ended()) {
          sub->c->sub.close(subscription::end::expired, "the token expired");
          ++ms->core.expired_streams;
        }
      ms->wake.cancel();
    });
  core.waiters.insert(&m->wake);
  struct release {   // the writer's end, however it ends: its clients leave the server
    mux_session<Stream>& m;
    std::optional<server_core::expiry_handle>& expiry;
    ~release() {
      if (expiry) m.core.cancel_expiry(*expiry);
      m.writer_done = true;
      m.core.waiters.erase(&m.wake);
      m.subs.clear();
      m.room.cancel();
    }
  } released{*m, expiry};

  // The reader: the client's messages into the inbox, for the writer (it answers pings, and
  // enforces the message limit, 1009, and UTF-8, 1007). A piece at a time into the message: an
  // idle connection holds no read buffer, and no coroutine for its reader.
  m->message_limit = opts.ws_message_limit;
  start_reading(m);

  bool failed = false, appended = false, expired_close = false;
  std::vector<subscription::item> batch;
  struct sent {
    mux_sub* s;
    subscription::item last;
    std::size_t events, bytes;
  };
  std::vector<sent> round;
  // A round that takes longer than write_timeout to go out: the client does not read; close it.
  auto rearm = [&m, &opts] {
    arm_watchdog(m->watchdog, opts.write_timeout, m, [](mux_session<Stream>& ms) {
      if (ms.writer_done) return;
      for (auto& s : ms.subs)
        if (s->c) s->c->sub.close(subscription::end::slow, "slow client: a write took too long");
      ms.close_socket();
    });
  };
  auto send = [&m, &appended](const std::string& text) {
    if (!m->is_open()) return;   // closing: no data frame after a close frame
    m->out.append_text_frame(text);   // small, uncompressed (RSV1 clear)
    appended = true;
  };
  std::uint64_t seen = core.notifications;
  bool trimmed = true, idle = false;   // (no buffers yet)
  std::chrono::steady_clock::time_point idle_since{};
  while (!core.stopping && m->reading && m->is_open() && !failed) {
    // A connection with a subscription catching up lets the live clients a notification woke go
    // first (once per notification), as a /v1/ws client catching up does.
    bool catching_up = false;
    for (const auto& s : m->subs) catching_up = catching_up || (s->c && !s->c->sub.live());
    if (catching_up && seen != core.notifications) {
      seen = core.notifications;
      co_await asio::post(core.executor, asio::use_awaitable);
      if (core.stopping || !m->reading || !m->is_open() || failed) break;
    }
    seen = core.notifications;
    out.cork();
    rearm();
    appended = false;
    bool more = false;
    // Subscriptions whose snapshot has begun (or failed to), and ended ones: said, the ended
    // ones removed (before the client's messages: an id that ended is free for them).
    for (std::size_t i = 0; i < m->subs.size();) {
      mux_sub& s = *m->subs[i];
      bool remove = false;
      if (s.job) {
        if (m->expired) {
          // (its token is over: not started now; said below, with the others)
        } else if (s.job->started()) {
          s.start.seq = s.job->start_seq();
          s.job->set_wake({});
          s.start.snapshot = std::move(s.job);
          m->start(s, std::move(s.start));
          send(subscribed_message(s));
        } else if (s.job->current() == snapshot_job::state::failed) {
          const unsigned code = s.job->http_status() ? s.job->http_status() : 503;
          send(error_message(&s.name_json, code, "snapshot", s.job->error()));
          remove = true;
        }
      } else if (s.c && s.c->sub.ended()) {
        s.c->finished();
        send(end_message(s, s.c->sub.reason(), s.c->sub.resume_id()));
        remove = true;
      }
      if (remove) m->subs.erase(m->subs.begin() + static_cast<std::ptrdiff_t>(i));
      else ++i;
    }
    // The client's messages, in order.
    for (; !m->inbox.empty(); m->inbox.pop_front()) {
      if (!m->inbox.front().text) send(error_message(nullptr, 400, "", "messages are JSON text"));
      else on_client_message(*m, m->inbox.front().bytes, send);
    }
    m->inbox_bytes = 0;
    m->room.cancel();
    if (m->expired) {
      // Subscriptions whose snapshot has not begun end too; the ended ones were said above.
      for (auto& sub : m->subs)
        if (!sub->c) send(end_message(*sub, "the token expired", ""));
      std::erase_if(m->subs, [](const auto& sub) { return !sub->c; });
      if (m->subs.empty()) {   // every subscription told where to resume: the connection ends (4001)
        auto [dec] = co_await out.async_drain(use_tuple);
        m->watchdog.cancel();
        if (dec) failed = true;
        else expired_close = true;
        break;
      }
    }
    // The events: a batch of each subscription in turn, up to one batch's bytes a round.
    round.clear();
    std::size_t round_bytes = 0;
    const std::size_t n = m->subs.size();
    const std::size_t first = m->next;
    if (n) m->next = (first + 1) % n;   // the next round begins with the next one
    for (std::size_t k = 0; k < n && !failed; ++k) {
      const std::size_t i = (first + k) % n;
      mux_sub* s = m->subs[i].get();   // (stable while the writer waits: only the writer removes)
      if (!s->c) continue;
      auto& sub = s->c->sub;
      sub.next_batch(batch);
      if (sub.ended()) more = true;   // said next round
      if (batch.empty()) {
        more = more || sub.pending();
        continue;
      }
      std::size_t bytes = 0;
      std::string head;
      for (const auto& item : batch) {
        head = "{\"sub\":" + s->name_json + ",\"id\":";
        if (item.what == subscription::kind::event || item.what == subscription::kind::snapshot_end)
          head += "\"" + item.id.to_string() + "\"";
        else
          head += "null";   // a snapshot's row, or a change it did not see: no place to resume from
        head += ",\"data\":";
        if (!co_await append_message(core, *m, item.bytes, head, "}", bytes, rearm)) {
          failed = true;
          break;
        }
      }
      if (failed) break;
      appended = true;
      round.push_back({s, batch.back(), batch.size(), bytes});
      round_bytes += bytes;
      if (round_bytes >= opts.batch_bytes) {
        m->next = i + 1;
        more = true;
        break;
      }
    }
    if (failed) break;
    if (!appended) {
      // Nothing of walgate's to send: uncorked while it waits, so that pings, pongs and close
      // answers go out as they come.
      out.uncork();
      m->watchdog.cancel();
      if (more) {   // passed over events their filters do not take, or one ended: go on after the others
        co_await asio::post(core.executor, asio::use_awaitable);
      } else {
        // Idle: it keeps its buffers for keep_buffers_for (a connection of a steady stream has a
        // round again by then), then gives them back while it waits (the next burst makes them
        // again, once).
        const auto now = std::chrono::steady_clock::now();
        if (!idle) idle_since = now;
        idle = true;
        if (!trimmed && now >= idle_since + keep_buffers_for) {
          std::vector<subscription::item>().swap(batch);
          std::vector<sent>().swap(round);
          out.trim();
          trimmed = true;
        }
        auto check_at = now + opts.keepalive;
        if (!m->keep_alive(opts.keepalive, now, check_at)) {   // a ping unanswered: the client is gone
          failed = true;
          break;
        }
        m->wake.expires_at(std::min(trimmed ? now + opts.keepalive : idle_since + keep_buffers_for, check_at));
        co_await m->wake.async_wait(use_tuple);
      }
      continue;
    }
    idle = trimmed = false;
    auto [dec] = co_await out.async_drain(use_tuple);
    m->watchdog.cancel();
    if (dec) {
      failed = true;
      break;
    }
    for (const auto& r : round) r.s->c->delivered(r.last, r.events, r.bytes);
  }
  for (auto& s : m->subs)
    if (s->c) s->c->finished();
  if (core.stopping && !failed && m->is_open()) {
    // Each subscription is told where to resume, then the connection closes (1001).
    out.cork();
    rearm();
    for (auto& s : m->subs) {
      const bool own_end = s->c && s->c->sub.ended() && s->c->sub.why() != subscription::end::shutdown;
      send(end_message(*s, own_end ? s->c->sub.reason() : "server shutting down", s->c ? s->c->sub.resume_id() : ""));
    }
    auto [dec] = co_await out.async_drain(use_tuple);
    m->watchdog.cancel();
    m->room.cancel();   // (a reader waiting for room in the inbox stops waiting: the connection closes)
    if (!dec) co_await send_close(*m, m->wake, subscription::end::shutdown, {}, {});
    else failed = true;
  } else if (expired_close && !core.stopping) {
    m->room.cancel();
    co_await send_close(*m, m->wake, subscription::end::expired, "the token expired", {});
  } else if (!failed || m->closing) {
    // The client closed (its close frame answered) or broke the protocol (walgate's close frame
    // sent), or its stream ended: its answer, or the end of its stream; what is queued goes out,
    // then the socket closes.
    m->room.cancel();
    co_await finish_close(*m, m->wake, pws::close_going_away, {});
  }
  // The reader ends (if it has not) when the socket closes; it holds the session till then.
  m->close_socket();
}

template awaitable<void> serve_websocket_mux<asio::ip::tcp::socket>(server_core&, asio::ip::tcp::socket,
                                                                    http::request<http::empty_body>,
                                                                    std::shared_ptr<const identity>, std::string,
                                                                    connection_hold);
template awaitable<void> serve_websocket_mux<beast::ssl_stream<beast::tcp_stream>>(
    server_core&, beast::ssl_stream<beast::tcp_stream>, http::request<http::empty_body>, std::shared_ptr<const identity>,
    std::string, connection_hold);

}  // namespace walgate::proxy
