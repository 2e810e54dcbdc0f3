// The replication client: connect (pg_connection), the pre-flight checks and the slot
// (prepare_replication), START_REPLICATION, the stream ('w' and 'k' in, 'r' out by the ticker),
// reconnects with backoff, stop. One file of about 500 lines because its steps share one state
// (impl: positions, the connection, the timers, what the sink was told) that each step reads and
// writes; split, that state would move to a header every part includes, for no wall gained.
#include "walgate/proxy/replication_client.hpp"

#include "walgate/proxy/pg_connection.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <charconv>
#include <cmath>
#include <random>

namespace walgate::proxy {

namespace asio = boost::asio;
using asio::awaitable;
using protocol::errc;
using protocol::lsn;
using clock_type = std::chrono::steady_clock;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

namespace {

failure config_failure(std::string message) {
  return failure{make_error_code(errc::invalid_value), std::move(message), {}, false};
}

std::string join_quoted(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + protocol::quote_literal(n);
  return out;
}

}  // namespace

// Which cluster and timeline the server is on (the sink checks them against what its log
// followed, before any slot is looked at or made), and the timeline's history: where each
// earlier timeline was left. A history the server cannot give (a file missing on a clone) is
// no failure here: what needs it says so (timeline_history_error).
awaitable<outcome<void>> identify(pg_connection& conn, const std::string& slot, stream_start_info& start) {
  auto identity = co_await conn.query("IDENTIFY_SYSTEM");
  if (!identity) co_return identity.error();
  if (identity->rows.size() != 1 || identity->rows[0].size() < 2 || !identity->rows[0][0] || !identity->rows[0][1])
    co_return failure{make_error_code(errc::invalid_value), "IDENTIFY_SYSTEM answered no system identifier and timeline",
                      {}, false};
  start.system_id = *identity->rows[0][0];
  if (identity->rows[0].size() >= 4 && identity->rows[0][3]) start.dbname = *identity->rows[0][3];
  if (identity->rows[0].size() >= 3 && identity->rows[0][2])   // (xlogpos: prepare_replication reads it again)
    if (auto end = lsn::parse(*identity->rows[0][2])) start.server_wal_end = *end;
  {
    const std::string& t = *identity->rows[0][1];
    std::uint32_t tli = 0;
    auto r = std::from_chars(t.data(), t.data() + t.size(), tli, 10);
    if (r.ec != std::errc{} || r.ptr != t.data() + t.size() || tli == 0)
      co_return failure{make_error_code(errc::invalid_value), "IDENTIFY_SYSTEM answered timeline \"" + t + "\"", {}, false};
    start.timeline = tli;
  }
  if (start.timeline > 1) {
    auto history = co_await conn.query(protocol::build_timeline_history(start.timeline).text);
    // (a connection that broke is retried as any; only the server's refusal is "cannot be read")
    if (!history && history.error().code != make_error_code(errc::server_error)) co_return history.error();
    std::optional<std::vector<protocol::timeline_switch>> parsed;
    if (history && history->rows.size() == 1 && history->rows[0].size() >= 2 && history->rows[0][1])
      parsed = protocol::parse_timeline_history(*history->rows[0][1]);
    if (parsed) start.timeline_history = std::move(*parsed);
    else if (!history) start.timeline_history_error = history.error().message;
    else start.timeline_history_error = "TIMELINE_HISTORY " + std::to_string(start.timeline) + " answered no history file walgate can read";
    // Where the slot was acknowledged on this server (read, not touched): past the switch point,
    // only a consumer of this server's new timeline acknowledged it there.
    auto slot_row = co_await conn.query("SELECT confirmed_flush_lsn::text FROM pg_catalog.pg_replication_slots WHERE slot_name = " +
                                        protocol::quote_literal(slot));
    if (!slot_row) co_return slot_row.error();
    if (slot_row->rows.size() == 1 && !slot_row->rows[0].empty() && slot_row->rows[0][0])
      start.slot_confirmed = lsn::parse(*slot_row->rows[0][0]);
  }
  co_return outcome<void>{};
}

// SQL checks run on the replication connection itself (replication=database accepts plain
// SQL through the simple query protocol), so what we check is what we will stream from.
awaitable<outcome<stream_start_info>> prepare_replication(pg_connection& conn, const replication_settings& s,
                                                          lsn stored_up_to, stream_start_info start) {
  start.server_major = conn.info().server_major;
  if (start.server_major < 10)
    co_return config_failure("server version \"" + conn.info().server_version +
                             "\" is not supported: walgate needs PostgreSQL 10 or later with pgoutput");
  if (!protocol::valid_slot_name(s.slot))
    co_return config_failure("invalid slot name \"" + s.slot + "\": use 1-63 characters of a-z, 0-9 and _");
  if (s.publications.empty()) co_return config_failure("no publication given: set --publication");

  auto settings = co_await conn.query(
      "SELECT current_setting('wal_level'), current_setting('max_replication_slots')::int, "
      "(SELECT count(*) FROM pg_replication_slots), current_database(), "
      "current_setting('max_wal_senders')::int, "
      "(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text");
  if (!settings) co_return settings.error();
  const auto& row = settings->rows.at(0);
  std::string wal_level = row[0].value_or("");
  if (wal_level != "logical")
    co_return config_failure("wal_level is '" + wal_level +
                             "', but logical decoding needs wal_level = logical: run ALTER SYSTEM SET wal_level = "
                             "logical; then restart the PostgreSQL server");
  int max_slots = std::stoi(row[1].value_or("0"));
  int used_slots = std::stoi(row[2].value_or("0"));
  std::string database = row[3].value_or("");
  if (auto end = protocol::lsn::parse(row.size() > 5 ? row[5].value_or("") : std::string())) start.server_wal_end = *end;

  auto pubs = co_await conn.query("SELECT pubname FROM pg_catalog.pg_publication WHERE pubname IN (" +
                                  join_quoted(s.publications) + ")");
  if (!pubs) co_return pubs.error();
  for (const auto& p : s.publications) {
    bool found = false;
    for (const auto& r : pubs->rows) found = found || r[0] == p;
    if (!found)
      co_return config_failure("publication \"" + p + "\" does not exist in database \"" + database +
                               "\": create it (CREATE PUBLICATION " + protocol::quote_identifier(p) +
                               " FOR ALL TABLES;) or name an existing one");
  }

  const bool failover_known = start.server_major >= 17;
  // (a standby's slots cannot be failover slots: the server refuses to make or alter one)
  const auto& parameters = conn.info().parameters;
  const bool in_recovery = parameters.count("in_hot_standby") && parameters.at("in_hot_standby") == "on";
  // 17+: a slot the server invalidated for a conflict with recovery (a standby's slot whose
  // catalog rows the primary removed: hot_standby_feedback off) is "conflicting". On 16 the
  // column is true for every invalidated logical slot, WAL removal included (CI saw it), so it
  // cannot tell the causes apart there: it is not read, and "lost" names both on a standby.
  auto slot = co_await conn.query(
      std::string("SELECT plugin, slot_type, database, active, active_pid, confirmed_flush_lsn, ") +
      (start.server_major >= 13 ? "wal_status" : "NULL") + (failover_known ? ", failover" : ", NULL") +
      (start.server_major >= 17 ? ", conflicting" : ", NULL") +
      " FROM pg_catalog.pg_replication_slots WHERE slot_name = " + protocol::quote_literal(s.slot));
  if (!slot) co_return slot.error();
  if (!slot->rows.empty()) {
    const auto& r = slot->rows[0];
    if (r[1].value_or("") != "logical")
      co_return config_failure("replication slot \"" + s.slot + "\" is a " + r[1].value_or("?") +
                               " slot; walgate needs a logical slot: choose another --slot");
    if (r[0].value_or("") != "pgoutput")
      co_return config_failure("replication slot \"" + s.slot + "\" uses the plugin \"" + r[0].value_or("") +
                               "\", not pgoutput: choose another --slot, or drop it with "
                               "SELECT pg_drop_replication_slot('" + s.slot + "');");
    if (r[2].value_or("") != database)
      co_return config_failure("replication slot \"" + s.slot + "\" belongs to database \"" + r[2].value_or("") +
                               "\", not \"" + database + "\": connect to that database or choose another --slot");
    // The slot acknowledged further than what is stored here: someone else consumed from it, or
    // the store is older than the slot (restored from a backup). The server would start at the
    // slot's position and the changes in between would be missing without a trace.
    if (auto confirmed = lsn::parse(r[5].value_or("")); stored_up_to.valid() && confirmed && *confirmed > stored_up_to)
      co_return config_failure("replication slot \"" + s.slot + "\" was acknowledged up to " + confirmed->to_string() +
                               ", past the changes stored here (up to " + stored_up_to.to_string() +
                               "): another client consumed from it, or the event log is older than the slot "
                               "(restored from a backup?). The changes in between are not in the log: restore the "
                               "matching event log, or start over with an empty one (--data-dir) and a new slot; "
                               "clients then need a new snapshot");
    // (before wal_status: an invalidated slot reads "lost" whatever the cause)
    if (r[8].value_or("f") == "t")
      co_return config_failure("replication slot \"" + s.slot +
                               "\" was invalidated by a conflict with recovery on this standby (conflicting): the "
                               "primary removed rows the slot still needed. Set hot_standby_feedback = on and "
                               "primary_slot_name on the standby, drop the slot (SELECT pg_drop_replication_slot('" +
                               s.slot + "');) and start over with an empty event log; clients then need a new snapshot");
    if (r[6].value_or("") == "lost")
      co_return config_failure("replication slot \"" + s.slot +
                               "\" was invalidated (wal_status lost): the server removed WAL it still needed, beyond "
                               "max_slot_wal_keep_size, and the changes in it are gone. Drop the slot "
                               "(SELECT pg_drop_replication_slot('" + s.slot +
                               "');) and start over with an empty event log; clients then need a new snapshot" +
                               (in_recovery && start.server_major < 17
                                    ? std::string(". On a standby before PostgreSQL 17 a conflict with recovery "
                                                  "(hot_standby_feedback off) is reported the same way")
                                    : std::string()));
    if (auto confirmed = lsn::parse(r[5].value_or(""))) start.confirmed_flush = *confirmed;
    if (r[3].value_or("f") == "t")
      co_return failure{make_error_code(errc::server_error),
                        "replication slot \"" + s.slot + "\" is active for PID " + r[4].value_or("?") +
                            " (SQLSTATE 55006): another client is streaming from it; stop that client or "
                            "choose another --slot",
                        "55006", true};
    const bool is_failover_slot = r[7].value_or("f") == "t";
    // --failover-slot as asked, on a slot made before (or by another tool): altered in place
    // (17+; the slot is inactive here). Not on a standby (its slots are the primary's copies).
    if (s.failover_slot && failover_known && !s.temporary_slot && !in_recovery && is_failover_slot != *s.failover_slot) {
      const bool on = *s.failover_slot;
      auto altered = co_await conn.query("ALTER_REPLICATION_SLOT " + protocol::quote_identifier(s.slot) + " (FAILOVER " +
                                         (on ? "true" : "false") + ")");
      if (!altered) co_return altered.error();
      if (s.log)
        s.log("replication slot \"" + s.slot + "\" is " + (on ? "now" : "no longer") + " a failover slot (--failover-slot " +
              (on ? "on" : "off") + ")");
    }
    co_return start;
  }

  if (!s.create_slot)
    co_return config_failure("replication slot \"" + s.slot + "\" does not exist in database \"" + database +
                             "\": create it, or allow walgate to create it");
  // A new slot starts at the server's current position: with changes already stored from an
  // earlier slot, everything between would be skipped without a trace.
  if (stored_up_to.valid() && !s.temporary_slot)
    co_return config_failure("replication slot \"" + s.slot + "\" does not exist, but changes up to " +
                             stored_up_to.to_string() +
                             " from it are already stored: a new slot would start at the server's current position "
                             "and silently skip everything since. If the slot was dropped on purpose, start over "
                             "with an empty event log (--data-dir); clients then need a new snapshot");
  if (used_slots >= max_slots)
    co_return failure{make_error_code(errc::limit_exceeded),
                      "no free replication slot: all " + std::to_string(max_slots) +
                          " of max_replication_slots are in use; raise max_replication_slots (needs a restart) "
                          "or drop an unused slot",
                      "53400", false};
  protocol::create_slot_options co;
  co.slot = s.slot;
  co.temporary = s.temporary_slot;
  co.snapshot = s.export_snapshot ? protocol::snapshot_action::export_snapshot : protocol::snapshot_action::no_export;
  if (s.before_create_slot)
    if (auto e = s.before_create_slot(); !e.empty()) co_return failure{{}, e, {}, false};
  co.two_phase = s.two_phase && start.server_major >= 15;
  co.failover = s.failover_slot.value_or(false) && failover_known && !s.temporary_slot && !in_recovery;
  auto cmd = protocol::build_create_slot(co, start.server_major);
  if (!cmd) co_return config_failure(cmd.error);
  // On a standby (16+) the slot is made once the standby replays a record of the transactions
  // running on the primary: the primary writes one every 15 s while it is busy, none while idle.
  if (in_recovery && s.log) {
    s.log("making replication slot \"" + s.slot + "\" on a standby: it is ready once the standby replays the "
          "primary's next record of running transactions (the primary writes one every 15 s while busy, none "
          "while idle; SELECT pg_log_standby_snapshot() on the primary writes one now)");
    auto feedback = co_await conn.query("SELECT current_setting('hot_standby_feedback'), "
                                        "coalesce(current_setting('primary_slot_name', true), '')");
    if (!feedback) co_return feedback.error();
    const auto& f = feedback->rows.at(0);
    if (f[0].value_or("") != "on" || f[1].value_or("").empty())
      s.log("warning: this standby has " + std::string(f[0].value_or("") != "on" ? "hot_standby_feedback off" : "") +
            (f[0].value_or("") != "on" && f[1].value_or("").empty() ? " and " : "") +
            (f[1].value_or("").empty() ? "no primary_slot_name" : "") +
            ": the primary may remove catalog rows the slot still needs, and the standby then invalidates the slot "
            "(a conflict with recovery; walgate has to start over). Set hot_standby_feedback = on and a physical "
            "slot in primary_slot_name on the standby");
  }
  auto created = co_await conn.query(cmd.text);
  if (!created) co_return created.error();
  if (!created->rows.empty() && created->rows[0].size() >= 3) {
    if (auto cp = lsn::parse(created->rows[0][1].value_or(""))) start.consistent_point = *cp;
    start.exported_snapshot = created->rows[0][2];
  }
  co_return start;
}

struct replication_client::impl : std::enable_shared_from_this<replication_client::impl> {
  impl(asio::any_io_executor ex, replication_settings s, replication_sink& k)
      : executor(ex), settings(std::move(s)), sink(k), backoff_timer(ex) {}

  asio::any_io_executor executor;
  replication_settings settings;
  replication_sink& sink;
  std::shared_ptr<pg_connection> conn;
  asio::steady_timer backoff_timer;
  replication_positions pos;
  int reconnect_count = 0;
  bool stopping = false;
  bool is_streaming = false;
  std::shared_ptr<pg_connection> streaming_conn;   // while read_loop reads it
  clock_type::time_point last_received{}, last_status{};
  std::function<void(const failure&, std::chrono::milliseconds)> on_retry;
  std::string capture_path;
  std::mt19937_64 rng{std::random_device{}()};

  void send_status(bool reply_requested) {
    if (!conn || !conn->is_open()) return;
    protocol::standby_status_update u;
    pos.durable = sink.durable_lsn();
    // Never report a flush position beyond what the sink made durable.
    u.flushed = pos.durable;
    u.applied = pos.durable;
    u.written = std::max(pos.received, pos.durable);
    u.client_clock_us = protocol::pg_now_us();
    u.reply_requested = reply_requested;
    conn->send(protocol::build_standby_status_message(u));
    pos.acknowledged = u.flushed;
    last_status = clock_type::now();
  }

  // Runs beside the reader: reports progress, keeps the walsender from timing us out, and
  // detects a server that went silent.
  awaitable<void> ticker(std::shared_ptr<pg_connection> c, std::shared_ptr<bool> done) {
    asio::steady_timer t(executor);
    // stop() cancels this wait: a tick of tens of seconds must not hold a shutdown that long.
    ticker_timer = &t;
    auto tick = std::min<std::chrono::milliseconds>(settings.ack_delay, settings.status_interval);
    while (!*done && c->is_open() && !stopping) {
      t.expires_after(tick);
      co_await t.async_wait(use_tuple);
      if (*done || !c->is_open() || stopping) break;
      auto now = clock_type::now();
      if (now - last_received > settings.server_timeout) {
        silent = true;
        c->close();
        break;
      }
      bool durable_moved = sink.durable_lsn() != pos.acknowledged;
      bool interval_due = now - last_status >= settings.status_interval;
      if (durable_moved || interval_due) {
        // While nothing arrives, ask for a reply so that a dead server is noticed.
        bool ask = now - last_received >= settings.status_interval;
        send_status(ask);
      }
    }
    if (ticker_timer == &t) ticker_timer = nullptr;   // (a newer connection's ticker may have taken over)
  }
  asio::steady_timer* ticker_timer = nullptr;
  bool silent = false;

  awaitable<outcome<void>> stream_once() {
    conn = std::make_shared<pg_connection>(executor);
    if (!capture_path.empty()) conn->set_capture_file(capture_path);
    auto c = conn;
    if (auto r = co_await c->connect(settings.conn, true, settings.log); !r) co_return r.error();
    stream_start_info known;
    known.server = {c->info().host, c->info().port, c->info().address};
    known.server_major = c->info().server_major;
    known.server_parameters = c->info().parameters;
    if (auto hot = c->info().parameters.find("in_hot_standby"); hot != c->info().parameters.end())
      known.in_recovery = hot->second == "on";
    if (auto id = co_await identify(*c, settings.slot, known); !id) co_return id.error();
    // Before the slot is looked at or made: a server whose history is not the log's gets nothing.
    if (auto checked = co_await sink.on_connected(known); !checked) co_return checked.error();
    auto prepared = co_await prepare_replication(*c, settings, sink.durable_lsn(), std::move(known));
    if (!prepared) co_return prepared.error();
    stream_start_info info = *prepared;
    if (settings.export_snapshot && info.exported_snapshot) {
      // The replication connection stays idle (its exported snapshot lives while it runs
      // nothing) until the sink has what the snapshot holds.
      auto copied = co_await sink.on_slot_created(info);
      if (!copied) {
        auto dropped = co_await c->query("DROP_REPLICATION_SLOT " + protocol::quote_identifier(settings.slot));
        failure f = copied.error();
        if (!dropped) f.message += " (and the slot could not be dropped: " + dropped.error().message + ")";
        co_return f;
      }
    }

    protocol::start_replication_options o;
    o.slot = settings.slot;
    o.publications = settings.publications;
    o.proto_version = settings.proto_version ? settings.proto_version : protocol::max_pgoutput_protocol(info.server_major);
    o.messages = settings.messages || (settings.messages_when_supported && info.server_major >= 14);
    o.binary = settings.binary;
    o.two_phase = settings.two_phase;
    o.streaming = settings.streaming;
    if (settings.streaming_when_supported)
      o.streaming = info.server_major >= 16 && o.proto_version >= 4   ? protocol::streaming_mode::parallel
                    : info.server_major >= 14 && o.proto_version >= 2 ? protocol::streaming_mode::on
                                                                      : protocol::streaming_mode::off;
    o.origin = settings.origin;
    // Resume from what is durable downstream; the server starts at the later of this and the
    // slot's confirmed_flush_lsn.
    o.start = sink.durable_lsn();
    auto cmd = protocol::build_start_replication(o, info.server_major);
    if (!cmd) co_return config_failure(cmd.error);
    if (stopping) co_return outcome<void>{};
    if (auto r = co_await c->start_copy_both(cmd.text); !r) {
      failure f = r.error();
      if (f.sqlstate == "55006")
        f.message += "\nwalgate: another client is streaming from slot \"" + settings.slot +
                     "\"; stop it or choose another --slot";
      co_return f;
    }
    info.proto_version = o.proto_version;
    info.start = o.start;
    info.streaming = o.streaming;
    is_streaming = true;
    started_stream = true;
    sink.on_stream_start(info);
    last_received = last_status = clock_type::now();
    silent = false;
    auto done = std::make_shared<bool>(false);
    asio::co_spawn(executor, ticker(c, done), asio::detached);
    streaming_conn = c;
    auto result = co_await read_loop(*c);
    streaming_conn.reset();
    *done = true;
    is_streaming = false;
    c->close();
    co_return result;
  }

  awaitable<outcome<void>> read_loop(pg_connection& c) {
    for (;;) {
      auto r = co_await c.read_copy_data();
      if (!r) {
        if (stopping) co_return outcome<void>{};
        if (silent)
          co_return make_failure(errc::timeout, "the server sent nothing for " +
                                                    std::to_string(settings.server_timeout.count()) +
                                                    " ms despite reply requests; reconnecting");
        co_return r.error();
      }
      if (!*r) {  // CopyDone from the server
        if (stopping) co_return outcome<void>{};
        co_return make_failure(errc::connection_closed, "the server ended the replication stream");
      }
      last_received = clock_type::now();
      auto payload = protocol::parse_copy_payload(**r);
      if (!payload) {
        c.close();
        co_return failure{make_error_code(payload.error().code),
                          "malformed replication message from the server: " + payload.error().message() +
                              "; connection closed",
                          {}, true};
      }
      if (payload->type == protocol::copy_payload::kind::xlog_data) {
        const auto& x = payload->xlog;
        if (x.wal_start > pos.received) pos.received = x.wal_start;
        if (auto ec = sink.on_xlog_data(x)) {
          // Report what is durable so far, then end without acknowledging the failed data.
          send_status(false);
          c.close();
          sink_failed = true;
          co_return failure{ec, "stream consumer failed at " + x.wal_start.to_string() + ": " + ec.message(), {},
                            sink.retry_after_failure()};
        }
      } else {
        sink.on_keepalive(payload->keepalive);
        // "reply requested": the walsender is about to time us out; answer at once.
        if (payload->keepalive.reply_requested) send_status(false);
      }
    }
  }

  std::chrono::milliseconds next_delay(int attempt) {
    double base = static_cast<double>(settings.backoff_initial.count());
    double cap = static_cast<double>(settings.backoff_max.count());
    double d = std::min(cap, base * std::pow(2.0, std::min(attempt, 30)));
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    return std::chrono::milliseconds(static_cast<long long>(d * jitter(rng)));
  }

  awaitable<outcome<void>> run() {
    auto self = shared_from_this();
    int attempt = 0;
    while (!stopping) {
      started_stream = false;
      sink_failed = false;
      auto r = co_await stream_once();
      if (stopping) break;
      // A connection that got as far as streaming resets the backoff — unless the sink refused
      // what came (the same bytes may come back each time: the backoff keeps growing).
      if (started_stream && !sink_failed) attempt = 0;
      if (r) {  // CopyDone on stop
        break;
      }
      if (!r.error().retryable) co_return r.error();
      ++attempt;
      if (settings.max_attempts > 0 && attempt >= settings.max_attempts) co_return r.error();
      auto delay = next_delay(attempt - 1);
      if (started_stream) passed_since.reset();
      // A host that is a standby now may be promoted any moment: tried again within a second
      // for the first minute of it (the stream follows a promotion within about a second), then
      // with the usual backoff (a standby that is never promoted is not asked twice a second).
      if (r.error().passed_for_state) {
        if (!passed_since) passed_since = clock_type::now();
        if (clock_type::now() - *passed_since < std::chrono::minutes(1))
          delay = std::min<std::chrono::milliseconds>(delay, std::chrono::seconds(1));
      } else {
        passed_since.reset();
      }
      if (on_retry) on_retry(r.error(), delay);
      ++reconnect_count;
      backoff_timer.expires_after(delay);
      co_await backoff_timer.async_wait(use_tuple);
    }
    co_return outcome<void>{};
  }
  bool started_stream = false;
  bool sink_failed = false;
  std::optional<clock_type::time_point> passed_since;   // hosts passed over for their state since

  void stop() {
    if (stopping) return;
    stopping = true;
    backoff_timer.cancel();
    if (ticker_timer) ticker_timer->cancel();
    if (conn && conn->is_open()) {
      if (is_streaming) {
        send_status(false);
        conn->send(protocol::build_copy_done());
        // Give the server a moment to answer CopyDone; then close regardless.
        auto c = conn;
        auto t = std::make_shared<asio::steady_timer>(executor, std::chrono::seconds(5));
        t->async_wait([c, t](boost::system::error_code) { c->close(); });
      } else {
        conn->close();
      }
    }
  }
};

awaitable<outcome<void>> replication_sink::on_slot_created(const stream_start_info&) { co_return outcome<void>{}; }
awaitable<outcome<void>> replication_sink::on_connected(const stream_start_info&) { co_return outcome<void>{}; }

replication_client::replication_client(asio::any_io_executor ex, replication_settings settings, replication_sink& sink)
    : impl_(std::make_shared<impl>(ex, std::move(settings), sink)) {}
replication_client::~replication_client() = default;

awaitable<outcome<void>> replication_client::run() {
  auto keep = impl_;
  co_return co_await keep->run();
}
void replication_client::stop() { impl_->stop(); }
void replication_client::request_reply() {
  if (impl_->is_streaming) impl_->send_status(true);
}
replication_positions replication_client::positions() const {
  auto p = impl_->pos;
  p.durable = impl_->sink.durable_lsn();
  return p;
}
int replication_client::reconnects() const { return impl_->reconnect_count; }
bool replication_client::streaming() const { return impl_->is_streaming; }
std::size_t replication_client::backlog() const {
  return impl_->streaming_conn && impl_->streaming_conn->is_open() ? impl_->streaming_conn->backlog() : 0;
}
void replication_client::set_retry_handler(std::function<void(const failure&, std::chrono::milliseconds)> h) {
  impl_->on_retry = std::move(h);
}
void replication_client::set_capture_file(std::string path) { impl_->capture_path = std::move(path); }

}  // namespace walgate::proxy
