// The Waltail format's encoder (op, table, data, old, seq, idempotency_key, commit_lsn), for
// encode_change. Its ordering key is in format_records.cpp.
#include "format_values.hpp"

#include <string>

namespace walgate::transform::detail {

// --- waltail ---------------------------------------------------------------------------------

bool encode_waltail(std::string& out, const change& c, const encoder_options& o) {
  const char* name = nullptr;
  switch (c.kind) {
    case op::insert: name = "insert"; break;
    case op::update: name = "update"; break;
    case op::delete_: name = "delete"; break;
    case op::read: name = "read"; break;
    default: return false;
  }
  const auto& r = *c.relation;
  out += "{\"op\":\"";
  out += name;
  out += "\",\"table\":";
  append_json_string(out, qualified_table(r));
  out += ",\"data\":";
  if (c.kind == op::delete_) out += "null";
  else append_row(out, r, c.after, waltail_value, unchanged_toast_native, o);
  out += ",\"old\":";
  if (c.kind == op::insert || c.kind == op::read) {
    out += "null";
  } else if (has_before(c)) {
    append_row(out, r, c.before, waltail_value, unchanged_toast_native, o, c.before_kind == 'K');
  } else {
    // An update that did not change the key: the key columns, from the new row.
    append_row(out, r, c.after, waltail_value, unchanged_toast_native, o, true);
  }
  std::string id;
  id.reserve(32);
  if (c.kind == op::read) {
    id = "0/0:";
    if (!c.snapshot.empty()) {   // unique to this row of this snapshot
      id += c.snapshot;
      id.push_back(':');
    }
    append_uint(id, c.seq);
  } else {
    append_lsn(id, c.txn->commit_lsn);
    id.push_back(':');
    append_uint(id, c.index);
  }
  out += ",\"seq\":";
  append_uint(out, c.seq);
  out += ",\"idempotency_key\":\"";
  out += uuid_v5(id);
  out += "\",\"commit_lsn\":\"";
  if (c.kind == op::read) out += "0/0";
  else append_lsn(out, c.txn->commit_lsn);
  out += "\"}";
  return true;
}

}  // namespace walgate::transform::detail
