// Golden captures: the frames a real server sent for the golden workload (every pgoutput message
// type and tuple kind), stored as records "Int64 WAL start | Int32 length | bytes", and the
// summary that decoding them must give. The live test (proxy_tests) captures and checks; the
// unit test (protocol_tests) decodes the checked-in captures of PostgreSQL 15 and 18.
#pragma once

#include "walgate/protocol/assembler.hpp"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace walgate::test {

struct frame_record {
  protocol::lsn wal_start;
  std::string data;
};

inline std::string encode_frames(const std::vector<frame_record>& frames) {
  std::string out;
  for (const auto& f : frames)
    protocol::writer(out).u64(f.wal_start.value).u32(static_cast<std::uint32_t>(f.data.size())).raw(f.data);
  return out;
}

inline std::vector<frame_record> decode_frames(const std::string& bytes) {
  std::vector<frame_record> out;
  protocol::cursor c(bytes);
  while (!c.empty() && c.ok()) {
    frame_record f;
    f.wal_start = protocol::lsn{c.u64()};
    std::uint32_t len = c.u32();
    f.data = std::string(protocol::as_string_view(c.bytes(len)));
    if (c.ok()) out.push_back(std::move(f));
  }
  return out;
}

/// A summary of what the assembler delivers that does not depend on LSNs, xids or clocks:
/// one line per transaction event; runs of single-row inserts into the same table collapse.
class golden_summary final : public protocol::transaction_handler {
 public:
  std::string text;

  boost::system::error_code on_begin(const protocol::transaction_info& t) override {
    flush_run();
    text += "BEGIN";
    if (t.streamed) text += " streamed";
    if (!t.gid.empty()) text += " gid=" + t.gid;
    if (t.origin) text += " origin=" + *t.origin;
    if (!t.commit_lsn.valid() || t.commit_time == 0) text += " (missing commit info)";
    text += "\n";
    expected_index_ = 0;
    return {};
  }

  boost::system::error_code on_change(const protocol::transaction_info&, const protocol::change_event& e) override {
    namespace pg = protocol::pgoutput;
    if (e.index != expected_index_) text += "  (index " + std::to_string(e.index) + ", expected " + std::to_string(expected_index_) + ")\n";
    const auto& m = *e.message;
    std::string line;
    std::string table = e.relation ? e.relation->nspname + "." + e.relation->relname : "";
    if (auto* i = std::get_if<pg::insert>(&m)) {
      if (table == "public.g_big") {
        if (run_table_ == table) ++run_count_;
        else {
          flush_run();
          run_table_ = table;
          run_count_ = 1;
        }
        expected_index_ = e.index + 1;
        return {};
      }
      line = "INSERT " + table + " " + tuple(*e.relation, i->new_tuple);
    } else if (auto* u = std::get_if<pg::update>(&m)) {
      line = "UPDATE " + table;
      if (u->old_kind) line += std::string(" old(") + u->old_kind + ")=" + tuple(*e.relation, u->old_tuple);
      line += " new=" + tuple(*e.relation, u->new_tuple);
    } else if (auto* d = std::get_if<pg::delete_>(&m)) {
      line = "DELETE " + table + std::string(" old(") + d->old_kind + ")=" + tuple(*e.relation, d->old_tuple);
    } else if (auto* t = std::get_if<pg::truncate>(&m)) {
      line = "TRUNCATE";
      if (t->cascade()) line += " CASCADE";
      if (t->restart_identity()) line += " RESTART IDENTITY";
      line += " " + std::to_string(t->relation_oids.size()) + " relations";
      expected_index_ = e.index + static_cast<std::uint32_t>(t->relation_oids.size());
    } else if (auto* msg = std::get_if<pg::message>(&m)) {
      line = "MESSAGE transactional " + std::string(msg->prefix) + "=" + std::string(protocol::as_string_view(msg->content));
    }
    if (!std::holds_alternative<pg::truncate>(m)) expected_index_ = e.index + 1;
    flush_run();
    text += "  " + line + "\n";
    return {};
  }

  boost::system::error_code on_commit(const protocol::transaction_info& t) override {
    flush_run();
    text += "COMMIT\n";
    return {};
  }

  boost::system::error_code on_message(protocol::lsn, const protocol::pgoutput::message& m) override {
    flush_run();
    text += "MESSAGE " + std::string(m.prefix) + "=" + std::string(protocol::as_string_view(m.content)) + "\n";
    return {};
  }

 private:
  static std::string tuple(const protocol::pgoutput::cached_relation& r, protocol::pgoutput::tuple_view t) {
    namespace pg = protocol::pgoutput;
    std::string out = "{";
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (i) out += ",";
      out += i < r.columns.size() ? r.columns[i].name : "?";
      out += ":";
      auto v = protocol::as_string_view(t[i].value);
      switch (t[i].kind) {
        case pg::column_kind::null: out += "null"; break;
        case pg::column_kind::unchanged_toast: out += "unchanged-toast"; break;
        case pg::column_kind::text:
          out += v.size() > 40 ? "text(" + std::to_string(v.size()) + " bytes)" : "'" + std::string(v) + "'";
          break;
        case pg::column_kind::binary: out += "binary(" + std::to_string(v.size()) + " bytes)"; break;
      }
    }
    return out + "}";
  }
  void flush_run() {
    if (run_count_ > 0) text += "  INSERT " + run_table_ + " x" + std::to_string(run_count_) + "\n";
    run_count_ = 0;
    run_table_.clear();
  }
  std::string run_table_;
  std::size_t run_count_ = 0;
  std::uint32_t expected_index_ = 0;
};

/// Decodes frames through the assembler and returns the summary (or the error).
inline std::string summarize(const std::vector<frame_record>& frames, std::uint32_t proto_version) {
  golden_summary s;
  protocol::assembler_options o;
  o.context.proto_version = proto_version;
  o.memory_limit = 32 * 1024;   // small, so that the streamed transactions also go through spill files
  protocol::assembler a(o, s);
  for (const auto& f : frames) {
    auto r = a.feed(f.wal_start, protocol::as_bytes(f.data));
    if (!r) return s.text + "ERROR: " + r.error().message + "\n";
  }
  return s.text;
}

}  // namespace walgate::test
