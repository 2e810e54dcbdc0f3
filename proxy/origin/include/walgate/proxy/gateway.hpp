// The gateway: one replication stream in, many clients out.
//
//   replication_client --XLogData--> gateway (assembler) --events--> event_log --> clients
//            ^                                                          |
//            +------------- durable position (after fdatasync) ---------+
//
// Everything runs on one executor (one thread): no locks. Clients are served by the HTTP
// server (server.hpp), whose subscriptions read events from the log by sequence number and are
// woken by the log's notification (log_reader::on_visible), which the gateway raises once for
// everything committed in one read of the stream.
#pragma once

#include "walgate/proxy/event_log.hpp"
#include "walgate/proxy/metrics.hpp"
#include "walgate/proxy/replication_client.hpp"
#include "walgate/proxy/sync_scheduler.hpp"
#include "walgate/transform/formats.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

namespace walgate::proxy {

struct gateway_metrics {
  std::uint64_t events_in = 0;         ///< events logged
  std::uint64_t transactions_in = 0;
  /// The highest WAL end the server has told: at each connection (pg_current_wal_lsn()), then
  /// from each XLogData and keepalive. Invalid until walgate first reached the server.
  protocol::lsn server_wal_end;
  std::int64_t last_commit_time_us = 0;   ///< PostgreSQL-epoch µs of the last logged transaction
  std::int64_t slot_retained_wal = -1;    ///< bytes, from pg_replication_slots (-1: unknown)
  /// 1: the slot can survive a failover (check_failover, failover.hpp); 0: not; -1: not known yet.
  std::int64_t slot_failover_ready = -1;
  std::uint64_t decode_failures = 0;      ///< pgoutput messages that could not be decoded
  std::uint64_t wakes_deferred = 0;       ///< commits whose wake-up waited: walgate behind the stream
};

class gateway final : public replication_sink, public protocol::transaction_handler {
 public:
  gateway(boost::asio::any_io_executor ex, event_log& log, protocol::assembler_options assembler_opts,
          std::chrono::milliseconds sync_interval = std::chrono::milliseconds(5));
  ~gateway() override;

  // replication_sink
  void on_stream_start(const stream_start_info& i) override;
  boost::system::error_code on_xlog_data(const protocol::xlog_data& x) override;
  void on_keepalive(const protocol::primary_keepalive& k) override;
  protocol::lsn durable_lsn() const override;
  /// A message that cannot be decoded is retried on a new connection (it may have been damaged
  /// on the way); a failed event log is not.
  bool retry_after_failure() const override { return decode_failed_ && !log_failed_now(); }

  // transaction_handler
  boost::system::error_code on_begin(const protocol::transaction_info& t) override;
  boost::system::error_code on_change(const protocol::transaction_info& t, const protocol::change_event& e) override;
  boost::system::error_code on_commit(const protocol::transaction_info& t) override;
  /// A non-transactional logical message: logged as a transaction of its own whose commit LSN
  /// is one less than the message's LSN (event id "<message LSN - 1>:0": the message's LSN may
  /// be the commit LSN of the transaction after it) and whose commit time is the server's send
  /// time of the frame that carried it (the message has no commit).
  boost::system::error_code on_message(protocol::lsn wal_start, const protocol::pgoutput::message& m) override;

  event_log& log() { return log_; }
  gateway_metrics& metrics() { return metrics_; }
  /// Registers the stream's figures (events in, lag, the slot, decode failures, the durable
  /// position) for /metrics.
  void register_metrics(metrics_registry& r);
  /// Called with each event as it is logged, with the change it was made from (valid during
  /// the call only): the server encodes events here that its clients will want.
  void on_event_logged(std::function<void(const logged_event&, const transform::change&)> f) { logged_ = std::move(f); }
  /// Calls f (on the executor) once the stream has been read past WAL position w: every
  /// transaction whose commit record ends at or before w is then in the log and committed. f
  /// gets the log's visible seq and last visible id at that moment. While someone waits, the
  /// walsender is asked for a reply (set_reply_request) every 100 ms, so an idle stream gets
  /// there too: its keepalive carries the position it has read up to.
  /// A waiter whose owner has gone is dropped uncalled (a snapshot whose client left while the
  /// stream was down).
  void when_read_past(protocol::lsn w, std::weak_ptr<const void> owner,
                      std::function<void(std::uint64_t seq, transform::event_id last)> f);
  /// How the gateway asks the walsender for a keepalive now (the replication client's 'r'
  /// with reply requested).
  void set_reply_request(std::function<void()> f) { request_reply_ = std::move(f); }
  /// The highest WAL position the stream has been read to (XLogData and keepalive positions).
  protocol::lsn read_through() const { return read_through_; }
  /// Writes and syncs what is pending now (shutdown).
  void flush();
  const std::string& failure() const { return failure_; }
  /// Why the stream is not healthy although connected or reconnecting: a pgoutput message that
  /// could not be decoded (with its position). Empty once that position decodes.
  const std::string& stream_fault() const { return stream_fault_; }
  /// Called once (on the executor) when the event log fails: a write, sync or new segment
  /// that did not work. The gateway then refuses the stream (nothing after the last durable
  /// position is acknowledged) and the process should stop: a restart resumes from there.
  void on_failure(std::function<void()> f) { on_failure_ = std::move(f); }
  /// How many bytes of the replication stream are waiting to be read (replication_client::backlog).
  /// With more than behind_bytes waiting at a commit, walgate is behind the stream: clients are
  /// woken at most every behind_wake_interval then (each gets more events per wake, and the
  /// stream is read sooner); otherwise at each commit, as when unset.
  void set_backlog_probe(std::function<std::size_t()> f) { backlog_ = std::move(f); }
  static constexpr std::size_t behind_bytes = 256u << 10;
  static constexpr std::chrono::milliseconds behind_wake_interval{20};

 private:
  void wake_clients();
  /// Records the event log's failure (once) and tells on_failure.
  bool log_failed();
  bool log_failed_now() const { return !log_.error().empty() || ack_failed_; }
  void fail(std::string why);
  /// Stores an idle stream's keepalive position (ACKED file, on the sync thread); it counts as
  /// durable — and is acknowledged — once stored.
  void store_ack(protocol::lsn l);

  boost::asio::any_io_executor executor_;
  event_log& log_;
  protocol::assembler_options assembler_opts_;
  std::unique_ptr<protocol::assembler> assembler_;
  sync_scheduler sync_;   // group commit and the ACKED file, on the sync thread
  std::unique_ptr<boost::asio::thread_pool> reader_;   // the log's background reads (blocks of events, large records)
  bool between_transactions_ = true;
  protocol::lsn keepalive_durable_;           // stored in the ACKED file
  bool ack_failed_ = false;
  std::int64_t frame_server_clock_us_ = 0;   // of the XLogData frame being fed
  gateway_metrics metrics_;
  std::function<void(const logged_event&, const transform::change&)> logged_;
  bool wake_posted_ = false;
  std::function<std::size_t()> backlog_;
  std::chrono::steady_clock::time_point last_wake_{};
  boost::asio::steady_timer wake_timer_;
  bool wake_timer_armed_ = false;
  std::string failure_;
  std::string stream_fault_;
  protocol::lsn stream_fault_lsn_;
  bool decode_failed_ = false;   // the last on_xlog_data failure was a decode error
  std::function<void()> on_failure_;
  void read_to(protocol::lsn l);
  void poke();
  protocol::lsn read_through_;
  struct read_waiter {
    protocol::lsn w;
    std::weak_ptr<const void> owner;
    std::function<void(std::uint64_t, transform::event_id)> f;
  };
  std::vector<read_waiter> read_waiters_;
  std::function<void()> request_reply_;
  boost::asio::steady_timer poke_timer_;
  bool poking_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace walgate::proxy
