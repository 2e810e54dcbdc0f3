// The JetStream publisher (jetstream.hpp): the event log, in order, into a stream, exactly once.
// Its impl is one class run on the publisher's own thread: connect, the stream created or
// checked, where the stream ends found in the log (sync), then publish_from until a failure, and
// again. Its parts share that thread's state (the connection, the batch's failure, the cursor,
// the confirmed position): one class, in the sections marked below. Over 600 lines; seams if it
// grows: the free functions at the top (subject_token to stream_mismatch, about 90 lines) are
// public in jetstream.hpp, tested on their own, and stream_seq_after is the mirror's alone: they
// could be a file of their own. publish_from (about 100 lines) could hand its loop over one
// batch and its failure handling to two functions.
#include "walgate/proxy/jetstream.hpp"

#include "walgate/proxy/event_log.hpp"
#include "walgate/proxy/metrics.hpp"
#include "walgate/transform/formats.hpp"
#include "walgate/transform/record.hpp"

#include "nats_connection.hpp"
#include "nats_util.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>

namespace walgate::proxy {

using namespace nats_util;

std::string subject_token(std::string_view name) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(name.size());
  for (unsigned char c : name) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-') {
      out += static_cast<char>(c);
    } else {
      out += '~';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string header_value(std::string_view v) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(v.size());
  for (unsigned char c : v) {
    if (c >= 0x20 && c < 0x7f && c != '%') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string event_subject(std::string_view prefix, const logged_event& e) {
  std::string s(prefix);
  if (e.kind == transform::op::message || e.table.empty()) return s + ".~message";
  return s + "." + subject_token(e.schema) + "." + subject_token(e.table);
}

std::optional<std::uint64_t> stream_seq_after(const transform::event_id& id, std::uint64_t first, std::uint64_t last,
                                              const std::function<std::optional<transform::event_id>(std::uint64_t)>& id_at,
                                              std::size_t* gets) {
  if (gets) *gets = 0;
  if (first == 0 || last < first) return first ? first : 1;   // (an empty stream: its next message)
  auto at = [&](std::uint64_t seq) {
    if (gets) ++*gets;
    return id_at(seq);
  };
  auto head = at(first);
  if (!head) return std::nullopt;
  if (id < *head) return 0;
  // The first sequence in (first, last] whose id is after id: ids increase along the stream.
  std::uint64_t lo = first, hi = last + 1;   // id_at(lo) <= id; every seq >= hi is after id
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    auto m = at(mid);
    if (!m) return std::nullopt;
    if (id < *m) hi = mid;
    else lo = mid;
  }
  return hi;
}

std::string stream_mismatch(const jetstream_stream_config& have, const jetstream_options& want) {
  std::string out;
  auto add = [&](const std::string& clause) { out += (out.empty() ? "" : "; ") + clause; };
  const std::string subject = want.subject_prefix + ".>";
  if (have.subjects != std::vector<std::string>{subject}) {
    std::string list;
    for (const auto& s : have.subjects) list += (list.empty() ? "" : ",") + s;
    add("its subjects are [" + list + "], walgate publishes on " + subject + " (--nats-subject-prefix) and nothing else may");
  }
  if (have.replicas != want.replicas)
    add("it has " + std::to_string(have.replicas) + " replica(s), --nats-replicas says " + std::to_string(want.replicas));
  if (have.max_bytes != want.max_bytes)
    add("its max bytes are " + std::to_string(have.max_bytes) + ", --nats-max-mb says " +
        (want.max_bytes < 0 ? std::string("no limit (-1)") : std::to_string(want.max_bytes)));
  const std::int64_t age = std::chrono::duration_cast<std::chrono::nanoseconds>(want.max_age).count();
  if (have.max_age_ns != age)
    add("its max age is " + std::to_string(have.max_age_ns / 1'000'000'000) + " s, --nats-max-age says " +
        std::to_string(want.max_age.count()) + " s");
  if (!have.file_storage) add("its storage is memory (a NATS restart would empty it, and walgate would publish again from its log's start)");
  if (have.max_msgs >= 0) add("it keeps at most " + std::to_string(have.max_msgs) + " messages (walgate limits it by bytes and age only)");
  if (have.max_msgs_per_subject >= 0)
    add("it keeps at most " + std::to_string(have.max_msgs_per_subject) + " messages per subject (older events of a table would vanish)");
  if (have.sealed) add("it is sealed");
  if (!have.limits_retention) add("its retention is not limits (interest or work queue streams lose events no edge read)");
  if (!have.discard_old) add("it discards new messages when full (walgate needs discard old: the newest events must go in)");
  return out;
}


struct jetstream_publisher::impl {
  impl(event_log& l, std::function<void(std::function<void()>)> p, jetstream_options opts,
       std::function<void(const std::string&)> s)
      : log(l), o(std::move(opts)), nats(std::move(p), std::move(s), connection(o, this)) {}
  event_log& log;
  jetstream_options o;
  nats_connection nats;   // the connection, the thread, the loop (post, on_loop), state()
  std::size_t visible_listener = 0, fetched_listener = 0, durable_listener = 0;

  // Publish failures reported by nats.c's threads for the batch in flight.
  std::mutex fail_m;
  bool failed = false;
  std::string fail_text;

  // For /metrics (written by the thread, read on the executor).
  std::atomic<std::uint64_t> confirmed_seq{0};      // the log seq after the last event confirmed (written on the executor)
  std::atomic<std::uint64_t> confirmed_offset{0};   // where in the log what it confirmed ends (written on the executor)
  std::atomic<std::uint64_t> published{0}, resyncs{0}, stream_last{0};
  std::atomic<bool> connected{false}, synced{false};
  // (nats.fault(): a state that needs an operator, a mismatched stream, a gap; nats.link_up())

  // --- on the log's executor ----------------------------------------------------------------

  /// (On the executor.) Every event before next is in the stream: the lag gauges count from
  /// there. end_offset is where the last of them ends in the log (0: not known), txn_end whether
  /// it is its transaction's last (then the transaction's commit frame is not lag either).
  void confirm(std::uint64_t next, std::uint64_t end_offset, bool txn_end) {
    if (next >= log.visible_seq()) {
      end_offset = log.visible_offset();   // (nothing after it: all of the log, its last commit frame too)
    } else if (next > 0) {
      if (!end_offset) {
        if (auto e = log.in_memory(next - 1)) end_offset = e->end_offset;
      }
      if (txn_end) end_offset = std::max(end_offset, log.transaction_end_offset(next - 1));
    }
    if (end_offset) confirmed_offset = end_offset;   // (not known: counted from where it was)
    confirmed_seq = next;
  }

  // --- the connection and the stream ----------------------------------------------------------

  /// Every PubAck (nats.c's thread): a failure, a duplicate, or a message stored at another
  /// sequence than the one after what it expected is a failure of the batch.
  static void on_pub_ack(jsCtx*, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void* closure) {
    auto* self = static_cast<impl*>(closure);
    std::string why;
    if (pae) {
      why = std::string(pae->ErrText ? pae->ErrText : natsStatus_GetText(pae->Err));
      if (pae->ErrCode) why += " (JetStream error " + std::to_string(static_cast<int>(pae->ErrCode)) + ")";
    } else if (pa) {
      const char* expect = nullptr;
      std::uint64_t after = 0;
      if (natsMsgHeader_Get(msg, "Nats-Expected-Last-Sequence", &expect) == NATS_OK && expect) after = std::strtoull(expect, nullptr, 10);
      if (pa->Duplicate) why = "JetStream took event " + header(msg, "Walgate-Id") + " for a duplicate";
      else if (pa->Sequence != after + 1)
        why = "JetStream stored event " + header(msg, "Walgate-Id") + " at sequence " + std::to_string(pa->Sequence) + ", not " +
              std::to_string(after + 1);
    }
    if (why.empty()) return;
    std::lock_guard lk(self->fail_m);
    if (!self->failed) {
      self->failed = true;
      self->fail_text = why;
    }
  }
  static std::string header(natsMsg* msg, const char* name) {
    const char* v = nullptr;
    return natsMsgHeader_Get(msg, name, &v) == NATS_OK && v ? v : "?";
  }
  /// The connection's settings: publishes in flight (async), each PubAck to on_pub_ack.
  static nats_connection::settings connection(const jetstream_options& o, impl* self) {
    nats_connection::settings c;
    c.servers = o.servers;
    c.name = "walgate origin";
    c.watch_link = true;
    c.wait_ms = o.ack_wait.count();
    c.max_pending = static_cast<int64_t>(o.batch_events) * 2;
    c.ack_handler = &impl::on_pub_ack;
    c.ack_closure = self;
    c.cannot_connect = [servers = join(o.servers)](const std::string& error) {
      return "cannot connect to " + servers + ": " + error + " (trying again; the event log keeps what is not published)";
    };
    return c;
  }

  void disconnect() {
    nats.disconnect();
    connected = false;
    synced = false;
  }

  bool connect() {
    if (!nats.connect()) return false;
    connected = true;
    return true;
  }

  static std::string join(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ",") + x;
    return out;
  }

  /// The stream, created when missing, checked when present; its last sequence in *last.
  bool ensure_stream(std::uint64_t* last) {
    stream_info_ptr si;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    natsStatus s = js_GetStreamInfo(&si.p, nats.js(), o.stream.c_str(), nullptr, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
      jsStreamConfig cfg;
      jsStreamConfig_Init(&cfg);
      const std::string subject = o.subject_prefix + ".>";
      const char* subjects[] = {subject.c_str()};
      cfg.Name = o.stream.c_str();
      cfg.Description = "walgate: the event log of a PostgreSQL logical replication slot";
      cfg.Subjects = subjects;
      cfg.SubjectsLen = 1;
      cfg.Retention = js_LimitsPolicy;
      cfg.Discard = js_DiscardOld;
      cfg.Storage = js_FileStorage;
      cfg.Replicas = o.replicas;
      cfg.MaxBytes = o.max_bytes;
      cfg.MaxAge = std::chrono::duration_cast<std::chrono::nanoseconds>(o.max_age).count();
      // (JetStream refuses a duplicate window longer than the max age)
      const auto window = o.max_age.count() > 0 ? std::min(o.duplicate_window, o.max_age) : o.duplicate_window;
      cfg.Duplicates = std::chrono::duration_cast<std::chrono::nanoseconds>(window).count();
      cfg.AllowDirect = true;   // (edges read messages by sequence from any replica)
      stream_info_ptr created;
      jerr = static_cast<jsErrCode>(0);
      s = js_AddStream(&created.p, nats.js(), &cfg, nullptr, &jerr);
      if (s != NATS_OK) {
        nats.state("cannot create stream " + o.stream + ": " + nats_error(s, jerr) + " (trying again)");
        return false;
      }
      nats.say("JetStream: created stream " + o.stream + " (subjects " + subject + ", " + std::to_string(o.replicas) + " replica(s))");
      *last = 0;
      return true;
    }
    if (s != NATS_OK) {
      nats.state("cannot read stream " + o.stream + ": " + nats_error(s, jerr) + " (trying again)");
      return false;
    }
    jetstream_stream_config have;
    for (int i = 0; i < si.p->Config->SubjectsLen; ++i) have.subjects.emplace_back(si.p->Config->Subjects[i]);
    have.replicas = static_cast<int>(si.p->Config->Replicas);
    have.max_bytes = si.p->Config->MaxBytes;
    have.max_age_ns = si.p->Config->MaxAge;
    have.limits_retention = si.p->Config->Retention == js_LimitsPolicy;
    have.discard_old = si.p->Config->Discard == js_DiscardOld;
    have.file_storage = si.p->Config->Storage == js_FileStorage;
    have.max_msgs = si.p->Config->MaxMsgs;
    have.max_msgs_per_subject = si.p->Config->MaxMsgsPerSubject;
    have.sealed = si.p->Config->Sealed;
    if (auto diff = stream_mismatch(have, o); !diff.empty()) {
      nats.state("stream " + o.stream + " does not match: " + diff + "; change the stream or the flags (nothing is published until they agree)", true);
      return false;
    }
    *last = si.p->State.LastSeq;
    return true;
  }

  // --- where to continue ----------------------------------------------------------------------

  struct position {
    std::uint64_t seq = 0;                           // the next log seq to publish
    std::optional<transform::event_id> skip_through;   // the stream has up to this id already
  };

  std::optional<std::pair<std::uint64_t, std::string>> read_cursor() {
    if (o.cursor_file.empty()) return std::nullopt;
    std::ifstream f(o.cursor_file);
    std::uint64_t seq = 0;
    std::string id;
    if (!(f >> seq >> id)) return std::nullopt;
    return std::make_pair(seq, id);
  }
  void write_cursor(std::uint64_t stream_seq, const std::string& id) {
    if (o.cursor_file.empty()) return;
    const std::string tmp = o.cursor_file + ".tmp";
    std::error_code ec;
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << stream_seq << ' ' << id << '\n';
      if (!f) ec = std::make_error_code(std::errc::io_error);
    }
    if (!ec) std::filesystem::rename(tmp, o.cursor_file, ec);
    // (not fatal: it is needed only once the stream's last message has aged out, and then its
    // absence stops publishing, saying so)
    if (ec) nats.say("JetStream: cannot save " + o.cursor_file + ": " + ec.message());
  }

  /// Where the stream ends, as a position in the log.
  std::optional<position> sync(std::uint64_t last) {
    if (last == 0) {   // an empty stream: from the log's first retained event
      auto first = nats.on_loop([this] { return log.first_seq(); });
      if (!first) return std::nullopt;
      return position{*first, std::nullopt};
    }
    std::string id_text;
    msg_ptr msg;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    natsStatus s = js_GetMsg(&msg.p, nats.js(), o.stream.c_str(), last, nullptr, &jerr);
    if (s == NATS_OK) {
      const char* v = nullptr;
      if (natsMsgHeader_Get(msg.p, "Walgate-Id", &v) != NATS_OK || !v) {
        nats.state("stream " + o.stream + " holds a message walgate did not publish (its last, seq " + std::to_string(last) +
                       ", has no Walgate-Id header): give walgate a stream of its own", true);
        return std::nullopt;
      }
      id_text = v;
    } else if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr) {
      // Its last message is gone (max age): the last confirmed event, as kept here, says which it was.
      auto c = confirmed ? confirmed : read_cursor();
      if (!c || c->first != last) {
        nats.state("stream " + o.stream + "'s last message (seq " + std::to_string(last) +
                       ") is gone (max age?) and this data directory does not say which event it was: cannot tell where to "
                       "continue without a gap or a duplicate; give a new stream (or delete this one: walgate creates it again)",
                   true);
        return std::nullopt;
      }
      id_text = c->second;
    } else {
      nats.state("cannot read stream " + o.stream + "'s last message: " + nats_error(s, jerr) + " (trying again)");
      return std::nullopt;
    }
    auto id = transform::event_id::parse(id_text);
    if (!id) {
      nats.state("stream " + o.stream + "'s last message has a Walgate-Id that is not an event id ('" + id_text + "')", true);
      return std::nullopt;
    }
    auto rp = nats.on_loop([this, id = *id] { return log.resume_after(id); });
    if (!rp) return std::nullopt;
    if (!rp->error.empty()) {
      nats.state("cannot find " + id_text + " in the event log: " + rp->error + " (trying again)");
      return std::nullopt;
    }
    if (!rp->seq) {
      nats.state("stream " + o.stream + " ends at event " + id_text +
                     ", which this event log does not hold (dropped, or from another slot's log): publishing would leave a gap; "
                     "give a new stream, or the data directory that published it",
                 true);
      return std::nullopt;
    }
    position p{*rp->seq, std::nullopt};
    if (rp->past_head) p.skip_through = *id;   // (the log lost a tail the stream has: it comes again)
    return p;
  }

  // --- publishing -----------------------------------------------------------------------------

  struct batch_read {
    std::vector<event_ptr> events;   // to publish, each with its transaction-end flag known
    std::uint64_t visible = 0;
    std::uint64_t durable = 0;
    bool fetching = false;
    std::string error;
    bool next_is_other_txn = false;   // the event after the last of events is of another transaction
    protocol::lsn origin;             // where the log began (Walgate-Origin on its first event)
  };

  /// Up to batch_events events from seq (durable ones), read on the loop: whether the last is
  /// its transaction's last is known from the event after it, read with them (never a read of
  /// the file on the loop: what is not in memory is read in the background, then retried).
  batch_read read_batch(std::uint64_t seq) {
    batch_read b;
    b.visible = log.visible_seq();
    b.durable = log.durable_seq();
    b.origin = log.origin();
    const std::uint64_t upto = std::min(b.visible, b.durable);
    if (seq >= upto) return b;
    b.events = log.read(seq, o.batch_events + 1, 4u << 20, &b.error, &b.fetching, 0);
    while (!b.events.empty() && b.events.back()->seq >= upto) b.events.pop_back();   // (durable ones only)
    if (b.events.empty()) return b;
    if (b.events.back()->seq + 1 >= b.visible) {   // the visible end: a transaction's end
      b.next_is_other_txn = true;
      return b;
    }
    if (b.events.size() >= 2) {   // the last one read tells about the one before it, and waits
      const auto& lookahead = b.events.back();
      b.next_is_other_txn = lookahead->id.commit_lsn != b.events[b.events.size() - 2]->id.commit_lsn;
      b.events.pop_back();
      return b;
    }
    // One event (a large one) with more after it: the next one is looked at.
    std::string error;
    bool fetching = false;
    auto next = log.read(b.events.back()->seq + 1, 1, 1, &error, &fetching, 0);
    if (next.empty()) {
      b.events.clear();
      b.fetching = fetching;
      if (!fetching) b.error = error.empty() ? "event #" + std::to_string(seq + 1) + " cannot be read" : error;
      return b;
    }
    b.next_is_other_txn = next.front()->id.commit_lsn != b.events.back()->id.commit_lsn;
    return b;
  }

  // The last event the stream confirmed: (its stream sequence, its id), kept for a stream whose
  // last message is gone (max age) — in memory, and in the cursor file when idle and at the end.
  std::optional<std::pair<std::uint64_t, std::string>> confirmed;
  bool cursor_dirty = false;
  void save_cursor() {
    if (!cursor_dirty || !confirmed) return;
    write_cursor(confirmed->first, confirmed->second);
    cursor_dirty = false;
  }

  // The same event failing again and again (too large for the servers, refused by the stream's
  // limits): after 5 times, a fault (it is still tried, every 5 s).
  std::uint64_t failing_seq = UINT64_MAX;
  int failures = 0;

  /// Publishes from p on until a failure (then false: the caller finds the stream's end again).
  bool publish_from(position p, std::uint64_t expected_last) {
    synced = true;
    if (!nats.fault() || failures == 0) nats.state("");
    // Retention keeps the last event the stream has (where the next start finds its id) and all after.
    auto hold = [this](std::uint64_t next, bool stream_empty) {
      const std::uint64_t from = stream_empty || next == 0 ? next : next - 1;
      nats.post([this, from] { log.hold_from(from); });
    };
    hold(p.seq, expected_last == 0);
    // Everything before p.seq is in the stream (after a restart: all the log holds, when caught up).
    nats.post([this, next = p.seq] { confirm(next, 0, false); });
    const std::size_t max_payload = static_cast<std::size_t>(std::max<int64_t>(natsConnection_GetMaxPayload(nats.nc()), 0));
    while (!nats.stopped()) {
      auto r = nats.on_loop([this, seq = p.seq] { return read_batch(seq); });
      if (!r) return true;
      if (r->fetching) {
        nats.idle(std::chrono::milliseconds(50));
        continue;
      }
      if (r->events.empty()) {
        if (!r->error.empty()) {
          nats.state("cannot read the event log at #" + std::to_string(p.seq) + ": " + r->error + " (trying again)", true);
          nats.idle(std::chrono::seconds(1));
        } else if (p.seq < r->visible) {
          nats.idle(std::chrono::milliseconds(50));   // (committed, its sync on its way: woken when durable)
        } else {
          save_cursor();
          nats.idle(std::chrono::milliseconds(200));   // (woken when more is visible)
        }
        continue;
      }
      {
        std::lock_guard lk(fail_m);
        failed = false;
        fail_text.clear();
      }
      const std::size_t n = r->events.size();
      std::uint64_t sent = 0, last_seq = p.seq;
      std::string last_id;
      std::uint64_t last_offset = 0;
      bool last_txn_end = false;
      std::string stop_reason;
      for (std::size_t i = 0; i < n; ++i) {
        const auto& e = r->events[i];
        const bool txn_end = i + 1 < n ? r->events[i + 1]->id.commit_lsn != e->id.commit_lsn : r->next_is_other_txn;
        if (p.skip_through && !(*p.skip_through < e->id)) {   // in the stream already
          last_seq = e->seq;
          last_offset = e->end_offset;
          last_txn_end = txn_end;
          continue;
        }
        p.skip_through.reset();
        natsStatus s = publish_one(*e, txn_end, r->origin, expected_last + sent, max_payload, stop_reason);
        if (s != NATS_OK) {
          if (stop_reason.empty()) stop_reason = nats_error(s);
          break;
        }
        last_seq = e->seq;
        last_offset = e->end_offset;
        last_txn_end = txn_end;
        ++sent;
        last_id = e->id.to_string();
      }
      jsPubOptions po;
      jsPubOptions_Init(&po);
      po.MaxWait = o.ack_wait.count();
      natsStatus s = sent ? js_PublishAsyncComplete(nats.js(), &po) : NATS_OK;
      std::string why;
      {
        std::lock_guard lk(fail_m);
        why = failed ? fail_text : s != NATS_OK ? nats_error(s) : stop_reason;
      }
      // The events go back to the loop to be let go of there (their encodings are the loop's).
      const std::uint64_t first_seq = r->events.front()->seq;
      nats.post([events = std::move(r->events)] {});
      if (!why.empty()) {
        ++resyncs;
        synced = false;
        failures = failing_seq == first_seq ? failures + 1 : 1;
        failing_seq = first_seq;
        if (failures >= 5)
          nats.state("publishing is stuck at event #" + std::to_string(first_seq) + ": " + why + " (" + std::to_string(failures) +
                         " times; trying again every 5 s)",
                     true);
        else
          nats.state("publishing stopped: " + why + "; finding the stream's end again");
        return false;
      }
      failures = 0;
      if (nats.fault()) nats.state("");
      expected_last += sent;
      published += sent;
      stream_last = expected_last;
      p.seq = last_seq + 1;
      nats.post([this, next = p.seq, last_offset, last_txn_end] { confirm(next, last_offset, last_txn_end); });
      if (sent) {
        confirmed = std::make_pair(expected_last, last_id);
        cursor_dirty = true;
      }
      hold(p.seq, expected_last == 0);
    }
    return true;
  }

  natsStatus publish_one(const logged_event& e, bool txn_end, protocol::lsn origin, std::uint64_t expect_last,
                         std::size_t max_payload, std::string& why) {
    const std::string subject = event_subject(o.subject_prefix, e);
    const std::string id = e.id.to_string();
    std::string key;
    if (e.kind != transform::op::message && e.kind != transform::op::truncate) {
      // The ordering key (Waltail's schema.table:pk), from the self-contained record.
      if (auto v = transform::read_record(protocol::bytes_view(reinterpret_cast<const std::byte*>(e.record.data()), e.record.size())))
        key = header_value(transform::waltail_ordering_key((*v)->get()));
    }
    // What the servers take at most (headers and body): a larger event stops publishing, saying so.
    const std::size_t size = e.record.size() + key.size() + 2 * id.size() + 256;
    if (max_payload && size > max_payload) {
      why = "event " + id + " is " + std::to_string(e.record.size()) + " bytes, more than the NATS servers take (max_payload " +
            std::to_string(max_payload) + "): raise max_payload (up to 64 MiB) on every server";
      return NATS_ERR;
    }
    msg_ptr msg;
    natsStatus s = natsMsg_Create(&msg.p, subject.c_str(), nullptr, e.record.data(), static_cast<int>(e.record.size()));
    if (s == NATS_OK) s = natsMsgHeader_Set(msg.p, "Walgate-Id", id.c_str());
    if (s == NATS_OK) s = natsMsgHeader_Set(msg.p, "Walgate-Seq", std::to_string(e.seq).c_str());
    if (s == NATS_OK) s = natsMsgHeader_Set(msg.p, "Walgate-Xid", std::to_string(e.xid).c_str());
    const char op[2] = {static_cast<char>(e.kind), 0};
    if (s == NATS_OK) s = natsMsgHeader_Set(msg.p, "Walgate-Op", op);
    if (s == NATS_OK && txn_end) s = natsMsgHeader_Set(msg.p, "Walgate-Txn-End", "true");
    // (the log's first event: where it began, so that an edge starting there answers as it does)
    if (s == NATS_OK && e.seq == 0 && origin.valid()) s = natsMsgHeader_Set(msg.p, "Walgate-Origin", origin.to_string().c_str());
    if (s == NATS_OK && !key.empty()) s = natsMsgHeader_Set(msg.p, "Walgate-Key", key.c_str());
    if (s != NATS_OK) return s;
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = id.c_str();
    po.ExpectLastSeq = expect_last;   // (0, an empty stream: not sent — its PubAck must then say sequence 1)
    po.MaxWait = o.ack_wait.count();
    s = js_PublishMsgAsync(nats.js(), &msg.p, &po);   // (takes the message when it succeeds)
    return s;
  }

  void run() {
    while (!nats.stopped()) {
      if (!nats.nc() && !connect()) {
        nats.pause(std::chrono::seconds(1));
        continue;
      }
      std::uint64_t last = 0;
      if (!ensure_stream(&last)) {
        // (a connection that nats.c cannot restore is started again)
        if (natsConnection_Status(nats.nc()) == NATS_CONN_STATUS_CLOSED) disconnect();
        nats.pause(std::chrono::seconds(nats.fault() ? 5 : 1));
        continue;
      }
      stream_last = last;
      auto p = sync(last);
      if (!p) {
        nats.pause(std::chrono::seconds(nats.fault() ? 5 : 1));
        continue;
      }
      if (publish_from(*p, last)) break;   // (stopping)
      nats.pause(nats.fault() ? std::chrono::milliseconds(5000) : std::chrono::milliseconds(250));
    }
    save_cursor();
    disconnect();
  }
};

jetstream_publisher::jetstream_publisher(event_log& log, std::function<void(std::function<void()>)> post,
                                         jetstream_options o, std::function<void(const std::string&)> log_line)
    : p_(std::make_unique<impl>(log, std::move(post), std::move(o), std::move(log_line))) {}

jetstream_publisher::~jetstream_publisher() { stop(); }

void jetstream_publisher::start() {
  p_->log.hold_from(p_->log.first_seq());   // (nothing is dropped until the stream's end is known)
  p_->confirmed_seq = p_->log.first_seq();
  p_->visible_listener = p_->log.on_visible([p = p_.get()] { p->nats.wake(); });
  p_->fetched_listener = p_->log.on_fetched([p = p_.get()] { p->nats.wake(); });
  p_->durable_listener = p_->log.on_durable([p = p_.get()] { p->nats.wake(); });
  p_->nats.start([p = p_.get()] { p->run(); });
}

void jetstream_publisher::stop() {
  if (!p_->nats.stop()) return;
  p_->log.remove_listener(p_->visible_listener);
  p_->log.remove_listener(p_->fetched_listener);
  p_->log.remove_listener(p_->durable_listener);
}

void jetstream_publisher::register_metrics(metrics_registry& r) {
  auto* p = p_.get();
  r.add_value("walgate_nats_published_total", "counter", "Events published to JetStream and confirmed by their PubAck.",
              [p] { return p->published.load(); });
  r.add_value("walgate_nats_publish_lag_events", "gauge",
              "Events of the log (committed) not yet confirmed by JetStream.", [p] {
                const auto v = p->log.visible_seq(), c = p->confirmed_seq.load();
                return v > c ? v - c : 0;
              });
  r.add_value("walgate_nats_publish_lag_bytes", "gauge",
              "Event log bytes of the committed events JetStream has not confirmed (with their commit frames); 0 when it has them all.",
              [p] {
                // (nothing to publish is no lag, whatever the log holds after the last event: its
                // commit frame, empty transactions)
                if (p->log.visible_seq() <= p->confirmed_seq.load()) return std::uint64_t{0};
                const auto v = p->log.visible_offset(), c = p->confirmed_offset.load();
                return v > c ? v - c : std::uint64_t{0};
              });
  r.add_value("walgate_nats_stream_last_seq", "gauge", "The stream sequence of the last event confirmed.",
              [p] { return p->stream_last.load(); });
  r.add_value("walgate_nats_connected", "gauge", "1 while connected to NATS and publishing.",
              [p] { return p->connected && p->nats.link_up() && p->synced ? 1 : 0; });
  r.add_value("walgate_nats_fault", "gauge",
              "1 while publishing is stopped by what needs an operator (a stream that does not match, a gap).",
              [p] { return p->nats.fault(); });
  r.add_value("walgate_nats_resyncs_total", "counter",
              "Publishing restarted from the stream's end after a failed or refused publish.", [p] { return p->resyncs.load(); });
}

}  // namespace walgate::proxy
