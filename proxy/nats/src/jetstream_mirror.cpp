// The JetStream mirror (jetstream.hpp): an edge's own event log filled, in order, from the stream.
#include "walgate/proxy/event_log.hpp"
#include "walgate/proxy/jetstream.hpp"
#include "walgate/proxy/metrics.hpp"
#include "walgate/transform/record.hpp"

#include "nats_connection.hpp"
#include "nats_util.hpp"

#include <atomic>

namespace walgate::proxy {

using namespace nats_util;

struct jetstream_mirror::impl {
  impl(event_log& l, std::function<void(std::function<void()>)> p, jetstream_options opts,
       std::function<void(const std::string&)> s)
      : log(l), o(std::move(opts)), nats(std::move(p), std::move(s), connection(o)) {}
  event_log& log;
  jetstream_options o;
  nats_connection nats;   // the connection, the thread, the loop (post, on_loop), state()
  natsSubscription* sub = nullptr;

  std::atomic<std::uint64_t> applied{0}, last_stream_seq{0}, pending{0};
  std::atomic<bool> consuming{false};
  // Clients are served once the stream is mirrored up to where it ended when this edge began
  // consuming, and the log holds an event (sticky: a reconnect later serves from the copy).
  std::atomic<bool> ready{false};
  std::uint64_t catch_up_to = 0;   // (thread) the stream's last sequence when consuming began
  bool logged_any = false;         // (thread) the log holds an event
  protocol::lsn open_commit;       // (loop) the transaction apply() is in

  /// The connection's settings: JetStream requests only (a consumer, direct gets).
  static nats_connection::settings connection(const jetstream_options& o) {
    nats_connection::settings c;
    c.servers = o.servers;
    c.name = "walgate edge";
    c.wait_ms = o.ack_wait.count();
    c.cannot_connect = [](const std::string& error) { return "cannot connect to the NATS servers: " + error + " (trying again)"; };
    return c;
  }

  void disconnect() {
    consuming = false;
    if (sub) natsSubscription_Destroy(sub);
    sub = nullptr;
    nats.disconnect();
  }

  std::optional<transform::event_id> id_at(std::uint64_t seq) {
    msg_ptr msg;
    jsDirectGetMsgOptions d;
    jsDirectGetMsgOptions_Init(&d);
    d.Sequence = seq;
    if (js_DirectGetMsg(&msg.p, nats.js(), o.stream.c_str(), nullptr, &d) != NATS_OK) return std::nullopt;
    const char* v = nullptr;
    if (natsMsgHeader_Get(msg.p, "Walgate-Id", &v) != NATS_OK || !v) return std::nullopt;
    return transform::event_id::parse(v);
  }

  /// The stream sequence to consume from: after the last event the local log holds.
  std::optional<std::uint64_t> start_seq() {
    stream_info_ptr si;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    natsStatus s = js_GetStreamInfo(&si.p, nats.js(), o.stream.c_str(), nullptr, &jerr);
    if (s != NATS_OK) {
      nats.state("cannot read stream " + o.stream + ": " + nats_error(s, jerr) + " (trying again)");
      return std::nullopt;
    }
    const std::uint64_t first = si.p->State.FirstSeq, last = si.p->State.LastSeq;
    // The origin publishes on <prefix>.>: another prefix would consume nothing, silently.
    const std::string want = o.subject_prefix + ".>";
    bool subject_ok = false;
    std::string subjects;
    for (int i = 0; si.p->Config && i < si.p->Config->SubjectsLen; ++i) {
      subject_ok = subject_ok || want == si.p->Config->Subjects[i];
      subjects += std::string(subjects.empty() ? "" : ", ") + si.p->Config->Subjects[i];
    }
    if (!subject_ok) {
      nats.state("stream " + o.stream + " holds subjects " + subjects + ", not " + want +
                     ": give this edge the origin's --nats-subject-prefix",
                 true);
      return std::nullopt;
    }
    catch_up_to = last;
    // (a transaction cut off by the last disconnect is dropped: it comes again whole)
    auto local = nats.on_loop([this] {
      if (log.in_transaction()) log.abort();
      return log.last_visible_id();
    });
    if (!local) return std::nullopt;
    logged_any = logged_any || local->commit_lsn.valid();
    if (!local->commit_lsn.valid()) return si.p->State.Msgs ? first : last + 1;
    if (si.p->State.Msgs == 0) return last + 1;
    auto at = stream_seq_after(*local, first, last, [this](std::uint64_t q) { return id_at(q); });
    if (!at) {
      nats.state("cannot read stream " + o.stream + "'s messages to find where this edge's log ends (trying again)");
      return std::nullopt;
    }
    if (*at == 0) {
      nats.state("this edge's event log ends at " + local->to_string() + ", before stream " + o.stream +
                     "'s first message: what came between is gone; delete the edge's data directory (a cache) to start from the stream",
                 true);
      return std::nullopt;
    }
    return *at;
  }

  struct item {
    std::string record;
    transform::event_id id;
    bool txn_end = false;
    std::uint64_t stream_seq = 0;
    std::optional<std::uint64_t> walgate_seq;   // the event's place in the origin's log
    protocol::lsn origin;                       // where the origin's log began (on its first event)
  };

  /// On the loop: the messages into the log, each transaction visible at its end; an error, or
  /// "" (committed: whether a transaction became visible).
  std::string apply(const std::vector<item>& batch, bool& committed) {
    transform::record_view view;
    auto where = [](const item& it) { return "stream message " + std::to_string(it.stream_seq) + " (event " + it.id.to_string() + ")"; };
    for (const auto& it : batch) {
      if (!log.in_transaction()) {
        if (log.next_seq() == 0) {
          // An empty log starts here. The rest of a transaction whose start is gone from the
          // stream (its limits) is not a transaction: skipped to the next one's start.
          if (it.id.index != 0) continue;
          // Where it starts says which ids are gone (410): none before the origin's own start
          // when this is the origin's first event, else every id before this transaction.
          const protocol::lsn origin = it.walgate_seq == std::optional<std::uint64_t>(0) ? it.origin : it.id.commit_lsn;
          if (origin.valid() && !log.set_origin(origin)) return "cannot store where this edge's log begins: " + log.error();
        }
        // (false: a transaction the log has — skipped to its end — or a log that cannot go on)
        if (!log.begin(it.id.commit_lsn) && log.last_commit_lsn() < it.id.commit_lsn)
          return "cannot append " + where(it) + " to the event log: " + (log.error().empty() ? "a new segment cannot be started" : log.error());
        open_commit = it.id.commit_lsn;
      } else if (it.id.commit_lsn != open_commit) {
        log.abort();
        return where(it) + " is not of the transaction before it, which has no Walgate-Txn-End: not walgate's stream";
      }
      auto r = transform::read_record(protocol::as_bytes(it.record), view);
      if (!r) {
        log.abort();
        return where(it) + " cannot be read: " + r.error().message();
      }
      log.add(view.get());
      if (it.txn_end) {
        log.commit(it.id.commit_lsn, it.id.commit_lsn);
        committed = true;
      }
      if (!log.error().empty()) return "cannot append " + where(it) + " to the event log: " + log.error();
    }
    if (!log.sync()) return log.error();
    log.announce();
    return {};
  }

  void consume(std::uint64_t from) {
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = o.stream.c_str();
    so.Ordered = true;
    so.Config.DeliverPolicy = js_DeliverByStartSequence;
    so.Config.OptStartSeq = from;
    const std::string subject = o.subject_prefix + ".>";
    jsErrCode jerr = static_cast<jsErrCode>(0);
    natsStatus s = js_SubscribeSync(&sub, nats.js(), subject.c_str(), nullptr, &so, &jerr);
    if (s != NATS_OK) {
      sub = nullptr;
      nats.state("cannot consume stream " + o.stream + ": " + nats_error(s, jerr) + " (trying again)");
      return;
    }
    consuming = true;
    nats.say("JetStream: mirroring stream " + o.stream + " from its message " + std::to_string(from));
    std::vector<item> batch;
    std::size_t batch_bytes = 0;
    if (catch_up_to < from && logged_any) ready = true;   // (nothing to catch up with)
    while (!nats.stopped()) {
      msg_ptr msg;
      s = natsSubscription_NextMsg(&msg.p, sub, batch.empty() ? 200 : 5);
      if (s == NATS_OK) {
        item it;
        it.record.assign(natsMsg_GetData(msg.p), static_cast<std::size_t>(natsMsg_GetDataLength(msg.p)));
        const char* v = nullptr;
        std::optional<transform::event_id> id;
        if (natsMsgHeader_Get(msg.p, "Walgate-Id", &v) == NATS_OK && v) id = transform::event_id::parse(v);
        if (!id) {
          nats.state("stream " + o.stream + " holds a message without a Walgate-Id: not walgate's stream", true);
          break;
        }
        it.id = *id;
        it.txn_end = natsMsgHeader_Get(msg.p, "Walgate-Txn-End", &v) == NATS_OK;
        if (natsMsgHeader_Get(msg.p, "Walgate-Seq", &v) == NATS_OK && v) it.walgate_seq = std::strtoull(v, nullptr, 10);
        if (natsMsgHeader_Get(msg.p, "Walgate-Origin", &v) == NATS_OK && v)
          if (auto l = protocol::lsn::parse(v)) it.origin = *l;
        jsMsgMetaData* md = nullptr;
        if (natsMsg_GetMetaData(&md, msg.p) == NATS_OK) {
          it.stream_seq = md->Sequence.Stream;
          pending = md->NumPending;
          jsMsgMetaData_Destroy(md);
        }
        const bool end = it.txn_end;
        batch_bytes += it.record.size();
        batch.push_back(std::move(it));
        // One batch for what is here already; at a transaction's end with nothing more waiting,
        // now (its clients wait for it: commit -> edge client latency).
        if (batch.size() < 512 && batch_bytes < (4u << 20)) {
          int pending = 0;
          if (!end || (natsSubscription_GetPending(sub, &pending, nullptr) == NATS_OK && pending > 0)) continue;
        }
      } else if (s != NATS_TIMEOUT) {
        nats.state("consuming stream " + o.stream + " stopped: " + nats_error(s) + " (starting again)");
        break;
      }
      if (batch.empty()) continue;
      bool committed = false;
      auto err = nats.on_loop([this, &batch, &committed] { return apply(batch, committed); });
      if (!err) break;
      if (!err->empty()) {
        nats.state(*err, true);
        break;
      }
      nats.state("");
      logged_any = logged_any || committed;
      applied += batch.size();
      last_stream_seq = batch.back().stream_seq;
      if (!ready && logged_any && last_stream_seq >= catch_up_to) {
        ready = true;
        nats.say("JetStream: mirrored stream " + o.stream + " up to its message " + std::to_string(last_stream_seq) + ": serving");
      }
      batch.clear();
      batch_bytes = 0;
    }
    consuming = false;
    if (sub) natsSubscription_Destroy(sub);
    sub = nullptr;
  }

  void run() {
    while (!nats.stopped()) {
      if (!nats.nc() && !nats.connect()) {
        nats.pause(std::chrono::seconds(1));
        continue;
      }
      auto from = start_seq();
      if (!from) {
        nats.pause(std::chrono::seconds(nats.fault() ? 5 : 1));
        continue;
      }
      consume(*from);
      if (!nats.stopped()) nats.pause(std::chrono::milliseconds(nats.fault() ? 5000 : 250));
    }
    disconnect();
  }
};

jetstream_mirror::jetstream_mirror(event_log& log, std::function<void(std::function<void()>)> post, jetstream_options o,
                                   std::function<void(const std::string&)> log_line)
    : p_(std::make_unique<impl>(log, std::move(post), std::move(o), std::move(log_line))) {}

jetstream_mirror::~jetstream_mirror() { stop(); }

void jetstream_mirror::start() {
  p_->nats.start([p = p_.get()] { p->run(); });
}

void jetstream_mirror::stop() { p_->nats.stop(); }

bool jetstream_mirror::streaming() const { return p_->consuming && p_->ready; }

std::string jetstream_mirror::not_ready() const {
  if (p_->ready) return {};
  return "this edge is copying stream " + p_->o.stream + " (at its message " + std::to_string(p_->last_stream_seq.load()) +
         "): it serves once it has caught up; try again shortly, or another edge";
}

void jetstream_mirror::register_metrics(metrics_registry& r) {
  auto* p = p_.get();
  r.add_value("walgate_edge_events_mirrored_total", "counter", "Stream messages appended to this edge's event log.",
              [p] { return p->applied.load(); });
  r.add_value("walgate_edge_stream_seq", "gauge", "The stream sequence of the last message mirrored.",
              [p] { return p->last_stream_seq.load(); });
  r.add_value("walgate_edge_consuming", "gauge", "1 while the stream is being consumed.", [p] { return p->consuming ? 1 : 0; });
  r.add_value("walgate_edge_pending_messages", "gauge",
              "Stream messages after the last one received (JetStream's count, as of that message): the edge's lag.",
              [p] { return p->pending.load(); });
  r.add_value("walgate_edge_ready", "gauge", "1 once the stream is copied up to where it ended at the start: clients are served.",
              [p] { return p->ready ? 1 : 0; });
  r.add_value("walgate_edge_fault", "gauge", "1 while mirroring is stopped by what needs an operator.",
              [p] { return p->nats.fault(); });
}

}  // namespace walgate::proxy
