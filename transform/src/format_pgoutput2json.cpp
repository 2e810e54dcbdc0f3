// The PgOutput2Json format's encoder (c, w, n, t, k, r, and compact mode's s), for encode_change.
// Its message key is in format_records.cpp.
#include "format_values.hpp"

namespace walgate::transform::detail {

// --- pgoutput2json ---------------------------------------------------------------------------

bool encode_pgoutput2json(std::string& out, const change& c, const encoder_options& o) {
  char kind = 0;
  switch (c.kind) {
    case op::insert: kind = 'I'; break;
    case op::update: kind = 'U'; break;
    case op::delete_: kind = 'D'; break;
    case op::read: kind = 'C'; break;
    default: return false;
  }
  const auto& r = *c.relation;
  out += "{\"c\":\"";
  out.push_back(kind);
  out += "\",\"w\":";
  append_uint(out, c.kind == op::read ? 0 : c.txn->commit_lsn.value);
  out += ",\"n\":";
  append_uint(out, std::uint64_t{c.index} + 1);
  if (o.compact && o.include_schema) {
    out += ",\"s\":[";
    append_json_string(out, qualified_table(r));
    for (const auto& col : r.columns) {
      out += ",[";
      append_json_string(out, col.name);
      out += col.key ? ",1," : ",0,";
      append_uint(out, col.type_oid);
      if (col.type_modifier != -1) {
        out.push_back(',');
        append_int(out, col.type_modifier);
      }
      out.push_back(']');
    }
    out.push_back(']');
  }
  out += ",\"t\":";
  append_json_string(out, qualified_table(r));
  // k: key values on deletes, and on updates when the key changed; the old row under FULL.
  if (has_before(c)) {
    out += ",\"k\":";
    bool keys_only = c.before_kind == 'K';
    if (o.compact) append_values(out, r, c.before, p2j_value, unchanged_toast_pgoutput2json, o, keys_only);
    else append_row(out, r, c.before, p2j_value, unchanged_toast_pgoutput2json, o, keys_only);
  }
  if (c.kind != op::delete_) {
    out += ",\"r\":";
    if (o.compact) append_values(out, r, c.after, p2j_value, unchanged_toast_pgoutput2json, o);
    else append_row(out, r, c.after, p2j_value, unchanged_toast_pgoutput2json, o);
  }
  out.push_back('}');
  return true;
}

}  // namespace walgate::transform::detail
