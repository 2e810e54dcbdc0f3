// The native format's encoder (walcast's ChangeEvent: id, lsn, commit_lsn, commit_time, schema,
// table, op, before, after), for encode_change. Its begin and commit records: format_records.cpp.
#include "format_values.hpp"

#include "walgate/transform/temporal.hpp"

namespace walgate::transform::detail {

// --- native ----------------------------------------------------------------------------------

namespace {

const char* native_op(op k) {
  switch (k) {
    case op::insert: return "insert";
    case op::update: return "update";
    case op::delete_: return "delete";
    case op::truncate: return "truncate";
    case op::read: return "read";
    case op::message: return "message";
  }
  return "?";
}

}  // namespace

void encode_native(std::string& out, const change& c, const encoder_options& o) {
  const auto& t = *c.txn;
  out += "{\"id\":\"";
  append_lsn(out, t.commit_lsn);
  out.push_back(':');
  append_uint(out, c.index);
  out += "\",\"lsn\":\"";
  append_lsn(out, c.change_lsn);
  out += "\",\"commit_lsn\":\"";
  append_lsn(out, t.commit_lsn);
  out += "\",\"commit_time\":\"";
  temporal::append_iso8601(out, protocol::pg_us_to_unix(t.commit_time));
  out.push_back('"');
  if (t.origin) {   // the transaction was replayed from elsewhere (pg_replication_origin_session_setup)
    out += ",\"origin\":";
    append_json_string(out, *t.origin);
  }
  if (c.kind == op::message) {
    out += ",\"op\":\"message\"";
    append_message_fields(out, *c.message, true);
    return;
  }
  const auto& r = *c.relation;
  out += ",\"schema\":";
  append_json_string(out, r.nspname);
  out += ",\"table\":";
  append_json_string(out, r.relname);
  out += ",\"op\":\"";
  out += native_op(c.kind);
  out += "\",\"before\":";
  if (has_before(c)) append_row(out, r, c.before, native_value, unchanged_toast_native, o, c.before_kind == 'K');
  else out += "null";
  out += ",\"after\":";
  if (c.kind == op::insert || c.kind == op::update || c.kind == op::read)
    append_row(out, r, c.after, native_value, unchanged_toast_native, o);
  else out += "null";
  out.push_back('}');
}

}  // namespace walgate::transform::detail
