// The replication client: connects (pg_connection), checks the server and the slot before
// streaming, starts pgoutput, hands every XLogData frame to a sink without copying, answers
// keepalives, reports the sink's durable position in 'r' status updates, and reconnects with
// exponential backoff and jitter, resuming from the durable position.
//
// Three positions, never confused:
//   received      the highest WAL start of an XLogData frame read from the socket;
//   durable       what the sink says is safely stored (it alone decides);
//   acknowledged  the flush position of the last status update sent; never ahead of durable.
#pragma once

#include "walgate/protocol/commands.hpp"
#include "walgate/protocol/replication.hpp"
#include "walgate/proxy/conninfo.hpp"
#include "walgate/proxy/failure.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace walgate::proxy {

struct replication_settings {
  conn_params conn;
  std::string slot;
  std::vector<std::string> publications;
  bool create_slot = true;           ///< Create the slot when it does not exist.
  /// Create it with an exported snapshot (EXPORT_SNAPSHOT), handed to the sink's
  /// on_slot_created before streaming starts (the initial snapshot).
  bool export_snapshot = false;
  /// Called right before the slot is created (with export_snapshot); an error stops it.
  std::function<std::string()> before_create_slot;
  bool temporary_slot = false;       ///< Dropped by the server when the connection ends.
  /// PostgreSQL 17+: the slot is a failover slot (created with FAILOVER; an existing one altered
  /// to it with ALTER_REPLICATION_SLOT), synchronised to standbys that ask for it, so that the
  /// stream goes on from a promoted standby. false: created without, an existing one altered
  /// back. Before 17, on a standby, and for a temporary slot, nothing. Unset: a new slot is made
  /// without, an existing one is left as it is (walgate stream). (walgate serve: --failover-slot,
  /// on by default.)
  std::optional<bool> failover_slot;
  std::uint32_t proto_version = 0;   ///< 0: the highest the server supports.
  bool messages = false;              ///< Logical decoding messages; PostgreSQL 14+ (an error before).
  /// Logical decoding messages where the server has them (14+), without them before: the
  /// gateway's choice, so that it streams from PostgreSQL 13 too.
  bool messages_when_supported = false;
  bool binary = false;
  bool two_phase = false;
  protocol::streaming_mode streaming = protocol::streaming_mode::off;
  /// Streaming of in-progress transactions where the server has it: on (proto 2) on 14 and 15,
  /// parallel (proto 4, with Stream Abort's LSN and time) on 16+; off before. Overrides streaming.
  bool streaming_when_supported = false;
  std::optional<std::string> origin;
  /// A status update goes out at least this often while idle; PostgreSQL's walsender drops a
  /// client silent for wal_sender_timeout (default 60 s), so this stays well inside it.
  std::chrono::milliseconds status_interval{10'000};
  /// When the durable position moves, it is reported no later than this.
  std::chrono::milliseconds ack_delay{200};
  /// Silence from the server for this long (despite our reply requests) means a dead peer.
  std::chrono::milliseconds server_timeout{60'000};
  std::chrono::milliseconds backoff_initial{500};
  std::chrono::milliseconds backoff_max{30'000};
  int max_attempts = 0;              ///< Consecutive failed attempts before giving up; 0 = never.
  /// Told of each host of conn passed over, and why (target_session_attrs; a host down).
  std::function<void(const std::string&)> log;
};

/// What the client knows about the stream it just started.
struct stream_start_info {
  int server_major = 0;
  std::uint32_t proto_version = 0;
  protocol::lsn start;               ///< The position requested in START_REPLICATION.
  std::optional<std::string> exported_snapshot;   ///< When the slot was created here.
  protocol::lsn consistent_point;    ///< When the slot was created here.
  protocol::lsn confirmed_flush;     ///< An existing slot's confirmed_flush_lsn (where the server resumes).
  protocol::streaming_mode streaming = protocol::streaming_mode::off;   ///< As asked for in START_REPLICATION.
  /// Where the server's WAL ended when the stream was prepared (pg_current_wal_lsn(), on a
  /// standby its replay position): every transaction committed before is at or below it.
  protocol::lsn server_wal_end;
  /// The host of conn the stream is on (the one target_session_attrs kept): libpq connections
  /// that must reach the same server (the exported snapshot's) are pinned to it (pinned_conninfo).
  /// Its address is the one connected to (a host name's IP; empty for a Unix socket): libpq's
  /// connections are pinned to it, not to the name (which may resolve elsewhere).
  conn_endpoint server;
  /// IDENTIFY_SYSTEM's: the cluster (systemid) and the timeline the server is on.
  std::string system_id;
  std::uint32_t timeline = 0;
  /// The timeline's history (TIMELINE_HISTORY; empty on timeline 1): where each earlier one was left.
  std::vector<protocol::timeline_switch> timeline_history;
  std::string timeline_history_error;   ///< why the history could not be read (it is then empty)
  /// On a timeline after the first: the slot's confirmed_flush_lsn on this server (nullopt: no
  /// such slot, or none confirmed), read before anything touches it.
  std::optional<protocol::lsn> slot_confirmed;
  /// The server is a standby (in_hot_standby on: logical decoding on a standby, 16+).
  bool in_recovery = false;
  /// IDENTIFY_SYSTEM's database, and the ParameterStatus values the server reported: what
  /// walgate's own walsender (--replication-listen) reports to its clients as the server's.
  std::string dbname;
  std::map<std::string, std::string> server_parameters;
};

class replication_sink {
 public:
  virtual ~replication_sink() = default;
  virtual void on_stream_start(const stream_start_info&) {}
  /// One XLogData frame; x.data is valid only during the call. An error ends this connection
  /// without acknowledging anything further (see retry_after_failure).
  virtual boost::system::error_code on_xlog_data(const protocol::xlog_data& x) = 0;
  /// Whether the failure on_xlog_data just returned may pass with a new connection (bytes
  /// damaged on the way, say): then the client reconnects, with a backoff that a stream ending
  /// this way does not reset. Default: no, streaming stops.
  virtual bool retry_after_failure() const { return false; }
  virtual void on_keepalive(const protocol::primary_keepalive&) {}
  /// The slot was just created with an exported snapshot (settings.export_snapshot): called on
  /// the idle replication connection, before START_REPLICATION. A failure drops the slot (so
  /// the next attempt makes it, and its snapshot, again) and ends this connection.
  virtual boost::asio::awaitable<outcome<void>> on_slot_created(const stream_start_info&);
  /// Every connection, once the server's identity is known (info: server, server_major,
  /// system_id, timeline and its history; nothing else yet) and before the slot is looked at or
  /// made: a failure ends this connection (retried as its retryable flag says). Walgate serve
  /// checks the server's cluster and timeline against its log's here.
  virtual boost::asio::awaitable<outcome<void>> on_connected(const stream_start_info&);
  /// The position that is durable downstream; reported as flush and apply.
  virtual protocol::lsn durable_lsn() const = 0;
};

struct replication_positions {
  protocol::lsn received;
  protocol::lsn durable;
  protocol::lsn acknowledged;
};

class replication_client {
 public:
  replication_client(boost::asio::any_io_executor ex, replication_settings settings, replication_sink& sink);
  ~replication_client();

  /// Streams until stop() or a failure that reconnecting cannot fix (returned), reconnecting
  /// after any other failure.
  boost::asio::awaitable<outcome<void>> run();
  /// Graceful stop: a final status update with the durable position, CopyDone, close.
  void stop();

  /// Sends a status update asking the server for a keepalive at once (while streaming).
  void request_reply();
  replication_positions positions() const;
  int reconnects() const;
  bool streaming() const;
  /// Bytes of the stream received and not yet read (pg_connection::backlog); 0 when not streaming.
  std::size_t backlog() const;
  /// Called with each failure that leads to a reconnect (for logging); default: none.
  void set_retry_handler(std::function<void(const failure&, std::chrono::milliseconds delay)> h);
  /// Fuzz-seed capture: every byte read from the server is appended to this file.
  void set_capture_file(std::string path);

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

/// Pre-flight checks on an open replication=database connection, before START_REPLICATION.
/// Creates the slot if allowed — but not when the consumer already stored changes (up to
/// stored_up_to, valid) from a slot of that name: a new slot would skip what happened since.
/// A slot the server invalidated (wal_status lost) is refused too. Each failure says what to do.
/// known: what is already known of the server (identify(): its cluster and timeline), kept.
class pg_connection;
boost::asio::awaitable<outcome<stream_start_info>> prepare_replication(pg_connection& conn,
                                                                     const replication_settings& s,
                                                                     protocol::lsn stored_up_to = {},
                                                                     stream_start_info known = {});

}  // namespace walgate::proxy
