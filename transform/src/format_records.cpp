// The transaction records (encode_begin, encode_commit, Debezium's transaction block) and the
// record keys (debezium_key, waltail_ordering_key, pgoutput2json_key) of formats.hpp.
#include "format_values.hpp"

#include "walgate/transform/formats.hpp"
#include "walgate/transform/json.hpp"
#include "walgate/transform/temporal.hpp"

#include <string>
#include <vector>

namespace walgate::transform {

using namespace detail;   // append_lsn, qualified_table, the row writers, debezium_value, p2j_value

std::string pg_timestamptz_utc(std::int64_t pg_epoch_us) {
  std::string s = iso8601_utc(pg_epoch_us);   // YYYY-MM-DDTHH:MM:SS.ffffffZ
  const auto t = s.find('T');
  if (t != std::string::npos) s[t] = ' ';
  if (!s.empty() && s.back() == 'Z') s.pop_back();
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s + "+00";
}

namespace {
void append_debezium_transaction_id(std::string& out, const protocol::transaction_info& t) {
  out.push_back('"');
  append_uint(out, t.xid);
  out.push_back(':');
  append_uint(out, t.commit_lsn.value);
  out.push_back('"');
}
std::int64_t unix_ms(std::int64_t pg_epoch_us) {
  const std::int64_t us = protocol::pg_us_to_unix(pg_epoch_us);
  return us >= 0 ? us / 1000 : -((-us + 999) / 1000);
}
void append_native_boundary(std::string& out, const protocol::transaction_info& t, const char* mark, const char* op) {
  out += "{\"id\":\"";
  append_lsn(out, t.commit_lsn);
  out += mark;
  out += "\",\"op\":\"";
  out += op;
  out += "\",\"xid\":";
  append_uint(out, t.xid);
  out += ",\"commit_lsn\":\"";
  append_lsn(out, t.commit_lsn);
  out += "\",\"commit_time\":\"";
  temporal::append_iso8601(out, protocol::pg_us_to_unix(t.commit_time));
  out.push_back('"');
  if (t.origin) {
    out += ",\"origin\":";
    append_json_string(out, *t.origin);
  }
}
void append_wal2json_boundary(std::string& out, const protocol::transaction_info& t, char action) {
  out += "{\"action\":\"";
  out.push_back(action);
  out += "\",\"xid\":";
  append_uint(out, t.xid);
  out += ",\"timestamp\":";
  append_json_string(out, pg_timestamptz_utc(t.commit_time));
  out.push_back('}');
}
}  // namespace

bool encode_begin(std::string& out, format f, const protocol::transaction_info& t) {
  switch (f) {
    case format::native:
      append_native_boundary(out, t, ":B", "begin");
      out.push_back('}');
      return true;
    case format::wal2json: append_wal2json_boundary(out, t, 'B'); return true;
    case format::debezium:
      out += "{\"status\":\"BEGIN\",\"id\":";
      append_debezium_transaction_id(out, t);
      out += ",\"ts_ms\":";
      append_int(out, unix_ms(t.commit_time));
      out += ",\"event_count\":null,\"data_collections\":null}";
      return true;
    default: return false;
  }
}

bool encode_commit(std::string& out, format f, const protocol::transaction_info& t, std::uint64_t events,
                   const std::vector<table_count>& tables) {
  switch (f) {
    case format::native: {
      append_native_boundary(out, t, ":C", "commit");
      out += ",\"events\":";
      append_uint(out, events);
      out += ",\"tables\":[";
      bool first = true;
      for (const auto& x : tables) {
        if (!first) out.push_back(',');
        first = false;
        out += "{\"schema\":";
        append_json_string(out, x.schema);
        out += ",\"table\":";
        append_json_string(out, x.table);
        out += ",\"events\":";
        append_uint(out, x.events);
        out.push_back('}');
      }
      out += "]}";
      return true;
    }
    case format::wal2json: append_wal2json_boundary(out, t, 'C'); return true;
    case format::debezium: {
      out += "{\"status\":\"END\",\"id\":";
      append_debezium_transaction_id(out, t);
      out += ",\"ts_ms\":";
      append_int(out, unix_ms(t.commit_time));
      out += ",\"event_count\":";
      append_uint(out, events);
      out += ",\"data_collections\":[";
      bool first = true;
      for (const auto& x : tables) {
        if (!first) out.push_back(',');
        first = false;
        out += "{\"data_collection\":";
        append_json_string(out, x.schema + "." + x.table);
        out += ",\"event_count\":";
        append_uint(out, x.events);
        out.push_back('}');
      }
      out += "]}";
      return true;
    }
    default: return false;
  }
}

void append_debezium_transaction(std::string& out, const protocol::transaction_info& t, std::uint64_t total_order,
                                 std::uint64_t data_collection_order) {
  out += "{\"id\":";
  append_debezium_transaction_id(out, t);
  out += ",\"total_order\":";
  append_uint(out, total_order);
  out += ",\"data_collection_order\":";
  append_uint(out, data_collection_order);
  out.push_back('}');
}

namespace {
pg::tuple_view key_source(const change& c) {
  if (c.kind == op::insert || c.kind == op::read || (c.kind == op::update && c.before_kind != 'O' && c.before.empty()))
    return c.after;
  if (c.before_kind == 'K' || c.before_kind == 'O') return c.before;
  return c.after;
}
}  // namespace

std::string debezium_key(const change& c, const encoder_options& o) {
  if (!c.relation) return "null";
  bool any = false;
  for (const auto& col : c.relation->columns) any = any || col.key;
  if (!any) return "null";
  std::string out;
  append_row(out, *c.relation, key_source(c), debezium_value, unchanged_toast_debezium, o, true);
  return out;
}

std::string waltail_ordering_key(const change& c) {
  if (!c.relation) return {};
  std::string out = qualified_table(*c.relation) + ":";
  auto t = key_source(c);
  bool first = true;
  for (std::size_t i = 0; i < t.size() && i < c.relation->columns.size(); ++i) {
    if (!c.relation->columns[i].key) continue;
    if (!first) out.push_back(',');
    first = false;
    if (t[i].kind == pg::column_kind::text || t[i].kind == pg::column_kind::binary) out += as_string_view(t[i].value);
  }
  return out;
}

std::string pgoutput2json_key(const change& c) {
  if (!c.relation) return "[]";
  std::string out;
  append_values(out, *c.relation, key_source(c), p2j_value, unchanged_toast_pgoutput2json, encoder_options{}, true);
  return out;
}

}  // namespace walgate::transform
