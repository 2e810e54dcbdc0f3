// The wal2json (format-version 2) encoder: action, schema, table, columns (with type names),
// identity; for encode_change. Its begin and commit records are in format_records.cpp.
#include "format_values.hpp"

#include "walgate/transform/pg_types.hpp"

#include <string>

namespace walgate::transform::detail {

// --- wal2json --------------------------------------------------------------------------------

namespace {

std::string type_name(const change& c, const pg::cached_column& col) {
  std::string n = builtin_type_name(col.type_oid, col.type_modifier);
  if (!n.empty()) return n;
  if (c.types)
    if (const auto* t = c.types->find(col.type_oid)) {
      // Array types are named "_element"; format_type() prints "element[]".
      std::string name = t->name;
      std::string suffix;
      if (name.size() > 1 && name[0] == '_') {
        name = name.substr(1);
        suffix = "[]";
      }
      return (t->nspname == "public" || t->nspname == "pg_catalog" ? name : t->nspname + "." + name) + suffix;
    }
  return std::to_string(col.type_oid);
}

void wal2json_columns(std::string& out, const change& c, pg::tuple_view t, bool keys_only, const encoder_options& o) {
  const auto& r = *c.relation;
  out.push_back('[');
  bool first = true;
  for (std::size_t i = 0; i < t.size() && i < r.columns.size(); ++i) {
    if (keys_only && !r.columns[i].key) continue;
    if (t[i].kind == pg::column_kind::unchanged_toast) continue;   // wal2json omits them
    if (!first) out.push_back(',');
    first = false;
    out += "{\"name\":";
    append_json_string(out, r.columns[i].name);
    out += ",\"type\":";
    append_json_string(out, type_name(c, r.columns[i]));
    out += ",\"value\":";
    append_column_value(out, r.columns[i], t[i], wal2json_value, {}, o);
    out.push_back('}');
  }
  out.push_back(']');
}

}  // namespace

void encode_wal2json(std::string& out, const change& c, const encoder_options& o) {
  if (c.kind == op::message) {
    out += "{\"action\":\"M\"";
    append_message_fields(out, *c.message, false);
    return;
  }
  const auto& r = *c.relation;
  char action = c.kind == op::insert || c.kind == op::read ? 'I' : c.kind == op::update ? 'U' : c.kind == op::delete_ ? 'D' : 'T';
  out += "{\"action\":\"";
  out.push_back(action);
  out += "\",\"schema\":";
  append_json_string(out, r.nspname);
  out += ",\"table\":";
  append_json_string(out, r.relname);
  if (action == 'I' || action == 'U') {
    out += ",\"columns\":";
    wal2json_columns(out, c, c.after, false, o);
  }
  if (action == 'U' || action == 'D') {
    out += ",\"identity\":";
    if (has_before(c)) wal2json_columns(out, c, c.before, c.before_kind == 'K', o);
    else wal2json_columns(out, c, c.after, true, o);   // key unchanged: taken from the new row
  }
  out.push_back('}');
}

}  // namespace walgate::transform::detail
