// The JetStream mirror (jetstream.hpp): an edge's own event log filled, in order, from the stream.
#include "walgate/proxy/event_log.hpp"
#include "walgate/proxy/jetstream.hpp"
#include "walgate/proxy/metrics.hpp"
#include "walgate/transform/record.hpp"

#include "nats_util.hpp"

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

namespace walgate::proxy {

using namespace nats_util;

struct jetstream_mirror::impl {
  impl(event_log& l, std::function<void(std::function<void()>)> p, jetstream_options opts,
       std::function<void(const std::string&)> s)
      : log(l), post(std::move(p)), o(std::move(opts)), say(std::move(s)) {}
  event_log& log;
  std::function<void(std::function<void()>)> post;
  jetstream_options o;
  std::function<void(const std::string&)> say;

  std::thread thread;
  std::mutex m;
  std::condition_variable cv;
  bool stopping = false;
  bool closed = true;
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  natsSubscription* sub = nullptr;

  std::atomic<std::uint64_t> applied{0}, last_stream_seq{0};
  std::atomic<bool> consuming{false};
  std::atomic<int> fault{0};
  std::string last_state;

  template <class F>
  auto on_loop(F f) -> std::optional<decltype(f())> {
    using R = decltype(f());
    auto done = std::make_shared<std::promise<R>>();
    auto fut = done->get_future();
    post([f = std::move(f), done]() mutable { done->set_value(f()); });
    while (fut.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready)
      if (stopped()) return std::nullopt;
    return fut.get();
  }
  bool stopped() {
    std::lock_guard lk(m);
    return stopping;
  }
  void pause(std::chrono::milliseconds d) {
    std::unique_lock lk(m);
    cv.wait_for(lk, d, [&] { return stopping; });
  }
  void state(const std::string& s, bool is_fault = false) {
    fault = is_fault ? 1 : 0;
    if (s == last_state) return;
    last_state = s;
    if (!s.empty()) say("JetStream: " + s);
  }
  static void on_closed(natsConnection*, void* closure) {
    auto* self = static_cast<impl*>(closure);
    {
      std::lock_guard lk(self->m);
      self->closed = true;
    }
    self->cv.notify_all();
  }

  void disconnect() {
    consuming = false;
    if (sub) natsSubscription_Destroy(sub);
    sub = nullptr;
    if (js) jsCtx_Destroy(js);
    js = nullptr;
    if (nc) {
      natsConnection_Close(nc);
      std::unique_lock lk(m);
      cv.wait_for(lk, std::chrono::seconds(5), [&] { return closed; });
      lk.unlock();
      natsConnection_Destroy(nc);
    }
    nc = nullptr;
  }

  bool connect() {
    nats_options_ptr opts;
    natsStatus s = natsOptions_Create(&opts.p);
    std::vector<const char*> servers;
    for (const auto& u : o.servers) servers.push_back(u.c_str());
    if (s == NATS_OK) s = natsOptions_SetServers(opts.p, servers.data(), static_cast<int>(servers.size()));
    if (s == NATS_OK) s = natsOptions_SetName(opts.p, "walgate edge");
    if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts.p, -1);
    if (s == NATS_OK) s = natsOptions_SetReconnectWait(opts.p, 250);
    if (s == NATS_OK) s = natsOptions_SetTimeout(opts.p, 2000);
    if (s == NATS_OK) s = natsOptions_SetClosedCB(opts.p, &impl::on_closed, this);
    {
      std::lock_guard lk(m);
      closed = false;
    }
    if (s == NATS_OK) s = natsConnection_Connect(&nc, opts.p);
    if (s != NATS_OK) {
      nc = nullptr;
      {
        std::lock_guard lk(m);
        closed = true;
      }
      state("cannot connect to the NATS servers: " + nats_error(s) + " (trying again)");
      return false;
    }
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = o.ack_wait.count();
    s = natsConnection_JetStream(&js, nc, &jo);
    if (s != NATS_OK) {
      state("cannot open a JetStream context: " + nats_error(s));
      disconnect();
      return false;
    }
    return true;
  }

  std::optional<transform::event_id> id_at(std::uint64_t seq) {
    msg_ptr msg;
    jsDirectGetMsgOptions d;
    jsDirectGetMsgOptions_Init(&d);
    d.Sequence = seq;
    if (js_DirectGetMsg(&msg.p, js, o.stream.c_str(), nullptr, &d) != NATS_OK) return std::nullopt;
    const char* v = nullptr;
    if (natsMsgHeader_Get(msg.p, "Walgate-Id", &v) != NATS_OK || !v) return std::nullopt;
    return transform::event_id::parse(v);
  }

  /// The stream sequence to consume from: after the last event the local log holds.
  std::optional<std::uint64_t> start_seq() {
    stream_info_ptr si;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    natsStatus s = js_GetStreamInfo(&si.p, js, o.stream.c_str(), nullptr, &jerr);
    if (s != NATS_OK) {
      state("cannot read stream " + o.stream + ": " + nats_error(s, jerr) + " (trying again)");
      return std::nullopt;
    }
    const std::uint64_t first = si.p->State.FirstSeq, last = si.p->State.LastSeq;
    // (a transaction cut off by the last disconnect is dropped: it comes again whole)
    auto local = on_loop([this] {
      if (log.in_transaction()) log.abort();
      return log.last_visible_id();
    });
    if (!local) return std::nullopt;
    if (!local->commit_lsn.valid()) return si.p->State.Msgs ? first : last + 1;
    if (si.p->State.Msgs == 0) return last + 1;
    auto at = stream_seq_after(*local, first, last, [this](std::uint64_t q) { return id_at(q); });
    if (!at) {
      state("cannot read stream " + o.stream + "'s messages to find where this edge's log ends (trying again)");
      return std::nullopt;
    }
    if (*at == 0) {
      state("this edge's event log ends at " + local->to_string() + ", before stream " + o.stream +
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
  };

  /// On the loop: the messages into the log, each transaction visible at its end.
  std::string apply(const std::vector<item>& batch) {
    transform::record_view view;
    for (const auto& it : batch) {
      if (!log.in_transaction()) log.begin(it.id.commit_lsn);   // (false: one it has; skipped to its end)
      auto r = transform::read_record(protocol::as_bytes(it.record), view);
      if (!r) return "stream message " + std::to_string(it.stream_seq) + " (event " + it.id.to_string() + ") cannot be read: " + r.error().message();
      log.add(view.get());
      if (it.txn_end) log.commit(it.id.commit_lsn, it.id.commit_lsn);
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
    natsStatus s = js_SubscribeSync(&sub, js, subject.c_str(), nullptr, &so, &jerr);
    if (s != NATS_OK) {
      sub = nullptr;
      state("cannot consume stream " + o.stream + ": " + nats_error(s, jerr) + " (trying again)");
      return;
    }
    consuming = true;
    state("");
    say("JetStream: mirroring stream " + o.stream + " from its message " + std::to_string(from));
    std::vector<item> batch;
    while (!stopped()) {
      msg_ptr msg;
      s = natsSubscription_NextMsg(&msg.p, sub, batch.empty() ? 200 : 5);
      if (s == NATS_OK) {
        item it;
        it.record.assign(natsMsg_GetData(msg.p), static_cast<std::size_t>(natsMsg_GetDataLength(msg.p)));
        const char* v = nullptr;
        std::optional<transform::event_id> id;
        if (natsMsgHeader_Get(msg.p, "Walgate-Id", &v) == NATS_OK && v) id = transform::event_id::parse(v);
        if (!id) {
          state("stream " + o.stream + " holds a message without a Walgate-Id: not walgate's stream", true);
          break;
        }
        it.id = *id;
        it.txn_end = natsMsgHeader_Get(msg.p, "Walgate-Txn-End", &v) == NATS_OK;
        jsMsgMetaData* md = nullptr;
        if (natsMsg_GetMetaData(&md, msg.p) == NATS_OK) {
          it.stream_seq = md->Sequence.Stream;
          jsMsgMetaData_Destroy(md);
        }
        const bool end = it.txn_end;
        batch.push_back(std::move(it));
        // One batch for what is here already; at a transaction's end with nothing more waiting,
        // now (its clients wait for it: commit -> edge client latency).
        if (batch.size() < 512) {
          int pending = 0;
          if (!end || (natsSubscription_GetPending(sub, &pending, nullptr) == NATS_OK && pending > 0)) continue;
        }
      } else if (s != NATS_TIMEOUT) {
        state("consuming stream " + o.stream + " stopped: " + nats_error(s) + " (starting again)");
        break;
      }
      if (batch.empty()) continue;
      auto err = on_loop([this, &batch] { return apply(batch); });
      if (!err) break;
      if (!err->empty()) {
        state(*err, true);
        break;
      }
      applied += batch.size();
      last_stream_seq = batch.back().stream_seq;
      batch.clear();
    }
    consuming = false;
    if (sub) natsSubscription_Destroy(sub);
    sub = nullptr;
  }

  void run() {
    while (!stopped()) {
      if (!nc && !connect()) {
        pause(std::chrono::seconds(1));
        continue;
      }
      auto from = start_seq();
      if (!from) {
        pause(std::chrono::seconds(fault ? 5 : 1));
        continue;
      }
      consume(*from);
      if (!stopped()) pause(std::chrono::milliseconds(fault ? 5000 : 250));
    }
    disconnect();
  }
};

jetstream_mirror::jetstream_mirror(event_log& log, std::function<void(std::function<void()>)> post, jetstream_options o,
                                   std::function<void(const std::string&)> log_line)
    : p_(std::make_unique<impl>(log, std::move(post), std::move(o), std::move(log_line))) {}

jetstream_mirror::~jetstream_mirror() { stop(); }

void jetstream_mirror::start() {
  p_->thread = std::thread([p = p_.get()] { p->run(); });
}

void jetstream_mirror::stop() {
  if (!p_->thread.joinable()) return;
  {
    std::lock_guard lk(p_->m);
    p_->stopping = true;
  }
  p_->cv.notify_all();
  p_->thread.join();
}

bool jetstream_mirror::streaming() const { return p_->consuming; }

void jetstream_mirror::register_metrics(metrics_registry& r) {
  auto* p = p_.get();
  r.add_value("walgate_edge_events_mirrored_total", "counter", "Stream messages appended to this edge's event log.",
              [p] { return p->applied.load(); });
  r.add_value("walgate_edge_stream_seq", "gauge", "The stream sequence of the last message mirrored.",
              [p] { return p->last_stream_seq.load(); });
  r.add_value("walgate_edge_consuming", "gauge", "1 while the stream is being consumed.", [p] { return p->consuming ? 1 : 0; });
  r.add_value("walgate_edge_fault", "gauge", "1 while mirroring is stopped by what needs an operator.",
              [p] { return p->fault.load(); });
}

}  // namespace walgate::proxy
