#include "walgate/proxy/gateway.hpp"


#include <boost/asio/post.hpp>

#include <sys/resource.h>
#include <cerrno>
#include <algorithm>
#include <sys/syscall.h>
#include <unistd.h>

namespace walgate::proxy {

namespace asio = boost::asio;

gateway::gateway(asio::any_io_executor ex, event_log& log, protocol::assembler_options assembler_opts,
                 std::chrono::milliseconds sync_interval)
    : executor_(ex),
      log_(log),
      assembler_opts_(std::move(assembler_opts)),
      sync_(ex, log, sync_interval),
      wake_timer_(ex),
      poke_timer_(ex) {
  sync_.on_failure([this] { log_failed(); }, [this] { return log_failed_now(); });
  // Records of megabytes that readers far behind reach are read on a thread of their own.
  reader_ = std::make_unique<asio::thread_pool>(1);
  // Below the event loop (5 more nice than the process): on a busy machine, live clients'
  // latency comes before the reads of clients catching up.
  asio::post(*reader_, [] {
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    errno = 0;
    const int nice = ::getpriority(PRIO_PROCESS, tid);
    if (errno == 0) ::setpriority(PRIO_PROCESS, tid, std::min(nice + 5, 19));
  });
  log_.set_background([pool = reader_.get(), ex = executor_](std::function<void()> work, std::function<void()> done) {
    asio::post(*pool, [work = std::move(work), done = std::move(done), ex]() mutable {
      work();
      asio::post(ex, std::move(done));
    });
  });
  assembler_ = std::make_unique<protocol::assembler>(assembler_opts_, *this);
  keepalive_durable_ = log_.acked_lsn();   // acknowledged before the restart
  log_.set_publish([this](const logged_event& e, const transform::change& c) {
    if (logged_) logged_(e, c);
  });
}

void gateway::wake_clients() {
  // Clients see a transaction at its commit: woken then, once for everything committed in one
  // read of the stream.
  if (wake_posted_) return;
  // Behind the stream (at least one read's worth of it waiting): at most one wake per
  // behind_wake_interval, the timer's (each client then gets more events per wake).
  const auto now = std::chrono::steady_clock::now();
  if (backlog_ && now < last_wake_ + behind_wake_interval && backlog_() >= behind_bytes) {
    ++metrics_.wakes_deferred;
    if (!wake_timer_armed_) {
      wake_timer_armed_ = true;
      wake_timer_.expires_at(last_wake_ + behind_wake_interval);
      wake_timer_.async_wait([this, alive = alive_](boost::system::error_code ec) {
        if (!*alive) return;
        wake_timer_armed_ = false;
        if (!ec) wake_clients();
      });
    }
    return;
  }
  if (wake_timer_armed_) wake_timer_.cancel();   // (woken now)
  wake_posted_ = true;
  asio::post(executor_, [this, alive = alive_] {
    if (!*alive) return;
    wake_posted_ = false;
    last_wake_ = std::chrono::steady_clock::now();
    log_.announce();
  });
}

void gateway::register_metrics(metrics_registry& r) {
  r.add_value("walgate_events_in_total", "counter", "Events logged from PostgreSQL.", [this] { return metrics_.events_in; });
  r.add_value("walgate_transactions_in_total", "counter", "Transactions logged.", [this] { return metrics_.transactions_in; });
  r.add_value("walgate_wakes_deferred_total", "counter",
              "Commits (and logical messages) after which clients were woken 20 ms after their last wake-up, not at once: walgate was behind the stream.",
              [this] { return metrics_.wakes_deferred; });
  r.add_value("walgate_lag_bytes", "gauge", "Server WAL end minus the durable position.", [this] {
    return metrics_.server_wal_end.valid() && metrics_.server_wal_end > durable_lsn()
               ? static_cast<std::int64_t>(metrics_.server_wal_end.value - durable_lsn().value)
               : std::int64_t{0};
  });
  r.add_value("walgate_last_commit_age_seconds", "gauge", "Seconds since the commit time of the last logged transaction.",
              [this] {
                double lag_s = 0;
                if (metrics_.last_commit_time_us)
                  lag_s = std::max<double>(0, (protocol::pg_now_us() - metrics_.last_commit_time_us) / 1e6);
                return lag_s;
              });
  r.add_value("walgate_slot_retained_wal_bytes", "gauge", "WAL the slot retains on the server (pg_replication_slots).",
              [this] { return metrics_.slot_retained_wal; });
  r.add_value("walgate_slot_failover_ready", "gauge",
              "1 when the slot can survive a failover (a failover slot, synchronized_standby_slots set, a synchronised copy "
              "on a standby listed in --pg); 0 when not; -1 not known yet (checked every minute).",
              [this] { return metrics_.slot_failover_ready; });
  r.add_value("walgate_history_cuts", "gauge",
              "Cuts of the event log's history (a failover to a server that never had what it held past the switch "
              "point, and the positions a followed promotion's WAL had reached when walgate started: CUTS in the data directory).",
              [this] { return static_cast<std::int64_t>(log_.history_cuts().size()); });
  r.add_value("walgate_stream_decode_failures_total", "counter",
              "pgoutput messages that could not be decoded (the connection is made again; nothing is skipped).",
              [this] { return metrics_.decode_failures; });
  r.add_value("walgate_stream_fault", "gauge", "1 while the stream is stuck on a message that cannot be decoded.",
              [this] { return stream_fault_.empty() ? 0 : 1; });
  r.add_value("walgate_durable_lsn", "gauge", "Durable position (acknowledged to PostgreSQL) as a number.",
              [this] { return durable_lsn().value; });
}

gateway::~gateway() {
  *alive_ = false;
  poke_timer_.cancel();
  log_.set_publish({});
  log_.set_background({});
  reader_->join();   // a read running finishes; its completion finds the reader gone or the log done
}

void gateway::on_stream_start(const stream_start_info& i) {
  // A new connection starts a new stream: whatever was half-received is sent again.
  if (i.server_wal_end > metrics_.server_wal_end) metrics_.server_wal_end = i.server_wal_end;
  auto opts = assembler_opts_;
  opts.context.proto_version = i.proto_version;
  // Under parallel streaming, Stream Abort carries the abort's LSN and time (proto 4).
  opts.context.stream_abort_info = i.streaming == protocol::streaming_mode::parallel;
  assembler_ = std::make_unique<protocol::assembler>(opts, *this);
  log_.abort();   // a transaction cut off by the reconnect comes again, whole (clients never saw it)
  between_transactions_ = true;
  // An empty log begins where this slot's stream does: ids from before belong to another log
  // (also when this log had events once and lost them: its origin moves up to here).
  if (log_.next_seq() == 0) {
    protocol::lsn origin = i.consistent_point.valid() ? i.consistent_point : std::max(i.confirmed_flush, i.start);
    if (!log_.set_origin(origin)) log_failed();
  }
}

boost::system::error_code gateway::on_xlog_data(const protocol::xlog_data& x) {
  if (x.wal_end > metrics_.server_wal_end) metrics_.server_wal_end = x.wal_end;
  frame_server_clock_us_ = x.server_clock_us;
  // An event log that failed takes nothing more: what it could not store must come again
  // after a restart, so nothing past its durable position may be acknowledged.
  decode_failed_ = false;
  if (log_failed()) return make_error_code(boost::system::errc::io_error);
  auto r = assembler_->feed(x.wal_start, x.data);
  if (!r) {
    // Nothing of it is logged or acknowledged; the connection is dropped and made again, and
    // the server sends it again from the durable position. Damaged on the way, it decodes then;
    // sent so every time, the stream stays here (with a growing backoff), saying why.
    decode_failed_ = true;
    ++metrics_.decode_failures;
    stream_fault_ = "cannot take the pgoutput message at " + x.wal_start.to_string() + ": " + r.error().message;
    stream_fault_lsn_ = x.wal_start;
    return make_error_code(r.error().code);
  }
  if (!stream_fault_.empty() && x.wal_start >= stream_fault_lsn_) stream_fault_.clear();   // it decodes now
  if (log_failed()) return make_error_code(boost::system::errc::io_error);
  // The walsender sends transactions in commit order, each frame marked with the position
  // decoding was at (a Begin its first change, a Commit its end): every commit before it is here.
  read_to(x.wal_end);
  between_transactions_ = !assembler_->in_transaction() && assembler_->open_streams() == 0 &&
                          assembler_->held_prepared() == 0;
  return {};
}

void gateway::on_keepalive(const protocol::primary_keepalive& k) {
  if (k.wal_end > metrics_.server_wal_end) metrics_.server_wal_end = k.wal_end;
  if (!log_failed()) read_to(k.wal_end);   // (what the walsender has read and sent)
  // Idle tables: with nothing outstanding, the keepalive position is durable too (the slot
  // advances and the server can free WAL), once everything logged before it is synced.
  if (log_failed()) return;
  if (between_transactions_ && !log_.dirty() && !log_.in_transaction() && k.wal_end > durable_lsn()) store_ack(k.wal_end);
}

protocol::lsn gateway::durable_lsn() const { return std::max(log_.durable_lsn(), keepalive_durable_); }

boost::system::error_code gateway::on_begin(const protocol::transaction_info& t) {
  between_transactions_ = false;
  log_.begin(t.commit_lsn);   // false: a redelivered transaction, its events are skipped
  return {};
}

boost::system::error_code gateway::on_change(const protocol::transaction_info& t, const protocol::change_event& e) {
  transform::for_each_change(t, e, assembler_->relations(), &assembler_->types(), [&](const transform::change& c) {
    log_.add(c);
    ++metrics_.events_in;
  });
  return {};
}

boost::system::error_code gateway::on_commit(const protocol::transaction_info& t) {
  log_.commit(t.commit_lsn, t.end_lsn);
  ++metrics_.transactions_in;
  metrics_.last_commit_time_us = t.commit_time;
  sync_.schedule();
  wake_clients();
  return {};
}

boost::system::error_code gateway::on_message(protocol::lsn wal_start, const protocol::pgoutput::message& m) {
  // Decoding emits it when it reads its WAL record, between transactions (a transaction's
  // changes are sent together at its commit): its position orders it among them, and a
  // redelivery after a restart (the server resends from the acknowledged position) is
  // recognised by it.
  //
  // Assumption written down (it once lost a transaction): the message's LSN is where its WAL
  // record ENDS, which is where the next record begins — often the commit record of the
  // transaction that emitted it (BEGIN; INSERT …; SELECT pg_logical_emit_message(false, …);
  // COMMIT), whose commit LSN is that same number. So the message is logged one byte before
  // its LSN: a byte inside its own record, which no commit record and no other message can
  // start or end at. It sorts before the transaction committed right after it (as the stream
  // sends them), its id differs from that transaction's first event's, and the transaction is
  // not taken for a redelivery. Acknowledging its end (end_lsn) tells the server that the
  // message is had (decoding skips a message whose record starts before the confirmed
  // position) and that the transaction committed at that LSN is not (it is sent again).
  if (log_.in_transaction()) return make_error_code(protocol::errc::unexpected_message);   // (retried as a stream fault)
  protocol::transaction_info t;
  t.xid = m.xid.value_or(0);
  const protocol::lsn at = m.message_lsn.valid() ? m.message_lsn : wal_start;
  if (!at.valid()) return make_error_code(protocol::errc::unexpected_message);
  t.commit_lsn = protocol::lsn{at.value - 1};
  t.end_lsn = at;
  t.commit_time = frame_server_clock_us_;
  protocol::pgoutput::any_message any = m;
  protocol::change_event e;
  e.change_lsn = wal_start;
  e.message = &any;
  if (log_.begin(t.commit_lsn)) {
    transform::for_each_change(t, e, assembler_->relations(), &assembler_->types(), [&](const transform::change& c) {
      log_.add(c);
      ++metrics_.events_in;
    });
  }
  log_.commit(t.commit_lsn, t.end_lsn);
  sync_.schedule();
  wake_clients();
  return {};
}

void gateway::read_to(protocol::lsn l) {
  if (l > read_through_) read_through_ = l;
  if (read_waiters_.empty()) return;
  std::vector<read_waiter> due;
  std::erase_if(read_waiters_, [&](read_waiter& w) {
    if (w.owner.expired()) return true;
    if (w.w > read_through_) return false;
    due.push_back(std::move(w));
    return true;
  });
  for (auto& w : due) w.f(log_.visible_seq(), log_.last_visible_id());
}

void gateway::when_read_past(protocol::lsn w, std::weak_ptr<const void> owner,
                             std::function<void(std::uint64_t, transform::event_id)> f) {
  if (w <= read_through_) {
    f(log_.visible_seq(), log_.last_visible_id());
    return;
  }
  read_waiters_.push_back({w, std::move(owner), std::move(f)});
  poke();
}

void gateway::poke() {
  std::erase_if(read_waiters_, [](const read_waiter& w) { return w.owner.expired(); });
  if (poking_ || read_waiters_.empty()) return;
  if (request_reply_) request_reply_();
  poking_ = true;
  poke_timer_.expires_after(std::chrono::milliseconds(100));
  poke_timer_.async_wait([this, alive = alive_](boost::system::error_code ec) {
    if (ec || !*alive) return;
    poking_ = false;
    poke();
  });
}

void gateway::flush() {
  if (!log_failed()) log_.sync();
  log_failed();
}

bool gateway::log_failed() {
  if (!log_.error().empty()) fail(log_.error());
  return !log_.error().empty() || ack_failed_;
}

void gateway::fail(std::string why) {
  if (!failure_.empty()) return;
  failure_ = std::move(why);
  if (on_failure_) asio::post(executor_, [f = on_failure_, alive = alive_] {
    if (*alive) f();
  });
}

void gateway::store_ack(protocol::lsn l) {
  sync_.store_ack(l, [this, l](bool ok, const std::string& error) {
    if (!ok) {
      ack_failed_ = true;
      fail(error);
      return;
    }
    if (l > keepalive_durable_) keepalive_durable_ = l;
  });
}

}  // namespace walgate::proxy
