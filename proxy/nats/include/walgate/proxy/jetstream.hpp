// Scale-out, origin side: every committed event of the event log published to a NATS JetStream
// stream, in log order, exactly once, whatever crashes — so that stateless edges can serve
// clients from the stream (docs/api.md, *JetStream*).
//
// The publisher runs on a thread of its own (nats.c's calls block); it reads the log through the
// log's executor (post), so the log stays single-threaded. Where it continues after any restart
// is read from the stream itself (its last message's event id), and every publish carries the
// stream sequence it expects to follow (Nats-Expected-Last-Sequence): a lost or reordered
// publish is refused by the server and the publisher starts again from the stream's end, so
// the stream never has a gap, a duplicate or an event out of order — JetStream's duplicate
// window (Nats-Msg-Id) is a second guard, not the only one. The log keeps (hold_from) every
// event the stream has not confirmed.
#pragma once

#include "walgate/proxy/log_reader.hpp"

#include <optional>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::proxy {

class event_log;
class metrics_registry;

struct jetstream_options {
  std::vector<std::string> servers;                 ///< nats://host:port (a cluster: any of its nodes)
  std::string stream;                               ///< the stream's name
  std::string subject_prefix = "walgate";           ///< subjects <prefix>.<schema>.<table>, <prefix>.~message
  int replicas = 1;                                 ///< 1-5
  std::int64_t max_bytes = -1;                      ///< -1: no limit (discard old past it)
  std::chrono::seconds max_age{0};                  ///< 0: no limit
  std::chrono::seconds duplicate_window{120};       ///< Nats-Msg-Id de-duplication window
  std::size_t batch_events = 1024;                  ///< publishes in flight before their PubAcks are waited for
  std::chrono::milliseconds ack_wait{10'000};       ///< a PubAck not back in this time: a failure
  std::string cursor_file;                          ///< where the last confirmed (stream seq, id) is kept ("": none)
};

/// A name (schema, table) as one subject token: A-Z a-z 0-9 _ - kept, every other byte ~XX (hex,
/// upper case). "order items" -> "order~20items"; "a.b" -> "a~2Eb".
std::string subject_token(std::string_view name);
/// A value as a NATS header holds it: printable ASCII but %, each other byte %XX (a key with a
/// line break or non-ASCII text cannot break the header block).
std::string header_value(std::string_view v);
/// The subject of an event: <prefix>.<schema>.<table>, or <prefix>.~message for a logical message.
std::string event_subject(std::string_view prefix, const logged_event& e);

/// Where a client that processed event id resumes in a stream whose messages' ids increase
/// along it (as the publisher makes them), without scanning it: a binary search over stream
/// sequences [first, last] by id_at(seq) (a direct get of one message's Walgate-Id; nullopt when
/// it cannot be read). Returns the sequence of the first message after id (last + 1: none yet);
/// 0 when id is older than the first message (410: what came between may be gone); nullopt when
/// a message could not be read. *gets counts the lookups.
std::optional<std::uint64_t> stream_seq_after(const transform::event_id& id, std::uint64_t first, std::uint64_t last,
                                              const std::function<std::optional<transform::event_id>(std::uint64_t)>& id_at,
                                              std::size_t* gets = nullptr);

/// "" when the stream's configuration (as JetStream reports it) is what the options ask for,
/// else what differs, one clause per setting.
struct jetstream_stream_config {
  std::vector<std::string> subjects;
  int replicas = 1;
  std::int64_t max_bytes = -1;
  std::int64_t max_age_ns = 0;
  bool limits_retention = true;   ///< retention policy limits (not interest, not work queue)
  bool discard_old = true;
  bool file_storage = true;
  std::int64_t max_msgs = -1, max_msgs_per_subject = -1;
  bool sealed = false;
};
std::string stream_mismatch(const jetstream_stream_config& have, const jetstream_options& want);

class jetstream_publisher {
 public:
  /// post runs a function on the log's executor (the thread that appends to it).
  jetstream_publisher(event_log& log, std::function<void(std::function<void()>)> post, jetstream_options o,
                      std::function<void(const std::string&)> log_line);
  ~jetstream_publisher();
  jetstream_publisher(const jetstream_publisher&) = delete;
  jetstream_publisher& operator=(const jetstream_publisher&) = delete;

  /// Starts the publisher's thread (call on the log's executor, before events can be dropped:
  /// the log is held from its first event until the stream's end is known).
  void start();
  /// Stops it (waits for the thread; what is in flight is confirmed or found again next time).
  void stop();
  /// Publish lag and state for /metrics (read on the log's executor).
  void register_metrics(metrics_registry& r);

  struct impl;

 private:
  std::unique_ptr<impl> p_;
};

/// Scale-out, edge side (`walgate edge`): the stream mirrored, in order, into this process's own
/// event log (a cache in its data directory), which the server serves from as walgate does
/// from the log it fills from PostgreSQL. One ordered consumer per edge; it starts after the
/// last event the local log holds (found in the stream by stream_seq_after), or at the stream's
/// first message for an empty log. Events are appended through log.add (the server's hooks see
/// them as live events), whole transactions visible at once (Walgate-Txn-End).
class jetstream_mirror {
 public:
  jetstream_mirror(event_log& log, std::function<void(std::function<void()>)> post, jetstream_options o,
                   std::function<void(const std::string&)> log_line);
  ~jetstream_mirror();
  jetstream_mirror(const jetstream_mirror&) = delete;
  jetstream_mirror& operator=(const jetstream_mirror&) = delete;
  void start();
  void stop();
  /// Consuming the stream, caught up with it once (for /readyz).
  bool streaming() const;
  /// Why clients are not served yet (the stream not copied up to where it ended when consuming
  /// began, or nothing in it yet); "" once they are.
  std::string not_ready() const;
  void register_metrics(metrics_registry& r);

  struct impl;

 private:
  std::unique_ptr<impl> p_;
};

}  // namespace walgate::proxy
