// The Debezium format's encoder (before, after, source, op, ts_ms, transaction), for
// encode_change. Its transaction records and record key are in format_records.cpp.
#include "format_values.hpp"

#include <chrono>
#include <string>

namespace walgate::transform::detail {

// --- debezium --------------------------------------------------------------------------------

void encode_debezium(std::string& out, const change& c, const encoder_options& o) {
  const auto& t = *c.txn;
  const bool snapshot = c.kind == op::read;
  std::int64_t commit_us = protocol::pg_us_to_unix(t.commit_time);
  std::int64_t now_ms = o.processing_time_ms
                            ? o.processing_time_ms
                            : std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  out.push_back('{');
  if (c.kind != op::message) {
    const auto& r = *c.relation;
    out += "\"before\":";
    if (has_before(c)) append_row(out, r, c.before, debezium_value, unchanged_toast_debezium, o, c.before_kind == 'K');
    else out += "null";
    out += ",\"after\":";
    if (c.kind == op::insert || c.kind == op::update || c.kind == op::read)
      append_row(out, r, c.after, debezium_value, unchanged_toast_debezium, o);
    else out += "null";
    out.push_back(',');
  }
  out += "\"source\":{\"version\":\"walgate-0.1.0\",\"connector\":\"postgresql\",\"name\":";
  append_json_string(out, o.server_name);
  out += ",\"ts_ms\":";
  append_int(out, commit_us >= 0 ? commit_us / 1000 : -((-commit_us + 999) / 1000));
  out += ",\"ts_us\":";
  append_int(out, commit_us);
  out += ",\"snapshot\":\"";
  out += snapshot ? (c.snapshot_last ? "last" : "true") : "false";
  out += "\",\"db\":";
  append_json_string(out, o.database);
  out += ",\"schema\":";
  if (c.relation) append_json_string(out, c.relation->nspname);
  else out += "null";
  out += ",\"table\":";
  if (c.relation) append_json_string(out, c.relation->relname);
  else out += "null";
  out += ",\"txId\":";
  if (snapshot) out += "null";
  else append_uint(out, t.xid);
  out += ",\"lsn\":";
  if (snapshot) out += "null";
  else append_uint(out, c.change_lsn.value);
  // Debezium's sequence is [last committed LSN, this LSN] as strings; walgate puts the commit
  // LSN of this event's own transaction first (see docs/api.md).
  out += ",\"sequence\":";
  if (snapshot) out += "null";
  else {
    std::string seq = "[\"" + std::to_string(t.commit_lsn.value) + "\",\"" + std::to_string(c.change_lsn.value) + "\"]";
    append_json_string(out, seq);
  }
  out += "},\"op\":\"";
  out.push_back(static_cast<char>(c.kind));
  out += "\",\"ts_ms\":";
  append_int(out, now_ms);
  if (c.kind == op::message) {
    out += ",\"message\":{\"prefix\":";
    append_json_string(out, c.message->prefix);
    out += ",\"content\":";
    append_json_string(out, protocol::base64_encode(as_string_view(c.message->content)));
    out.push_back('}');
  }
  out += ",\"transaction\":";
  if (o.transaction_metadata && !snapshot) {
    out += "{\"id\":\"";
    append_uint(out, t.xid);
    out.push_back(':');
    append_uint(out, t.commit_lsn.value);
    out += "\",\"total_order\":";
    append_uint(out, std::uint64_t{c.index} + 1);
    out += ",\"data_collection_order\":";
    append_uint(out, c.table_order);
    out.push_back('}');
  } else {
    out += "null";
  }
  out.push_back('}');
}

}  // namespace walgate::transform::detail
