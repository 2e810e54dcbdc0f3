#include "walgate/transform/test_decoding.hpp"

#include "walgate/transform/output_plugin.hpp"

#include "walgate/transform/formats.hpp"
#include "walgate/transform/pg_types.hpp"

#include <algorithm>
#include <array>
#include <cstring>

namespace walgate::transform {

namespace pg = protocol::pgoutput;

// parse_bool_with_len (src/backend/utils/adt/bool.c): a unique prefix of true/false/yes/no, on/off
// (at least "of" for off), 1/0; case-insensitive.
bool pg_parse_bool(std::string_view v, bool& out) {
  std::string s(v);
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  auto prefix_of = [&](std::string_view word) { return !s.empty() && s.size() <= word.size() && word.substr(0, s.size()) == s; };
  if (s.empty()) return false;
  switch (s[0]) {
    case 't': if (prefix_of("true")) { out = true; return true; } break;
    case 'f': if (prefix_of("false")) { out = false; return true; } break;
    case 'y': if (prefix_of("yes")) { out = true; return true; } break;
    case 'n': if (prefix_of("no")) { out = false; return true; } break;
    case 'o':
      if (s.size() >= 2 && prefix_of("on")) { out = true; return true; }
      if (s.size() >= 2 && prefix_of("off")) { out = false; return true; }
      break;
    case '1': if (s.size() == 1) { out = true; return true; } break;
    case '0': if (s.size() == 1) { out = false; return true; } break;
    default: break;
  }
  return false;
}

namespace {

// pg_get_keywords() WHERE catcode <> 'U' on PostgreSQL 18: the keywords quote_identifier()
// quotes. Sorted (binary search). Earlier versions have a few fewer (the json_* ones before 16,
// merge_action before 17, system_user before 16): an identifier spelled like one of those is
// quoted here and not by those servers.
constexpr std::array<std::string_view, 164> quoted_keywords = {
    "all", "analyse", "analyze", "and", "any", "array", "as", "asc", "asymmetric", "authorization", "between",
    "bigint", "binary", "bit", "boolean", "both", "case", "cast", "char", "character", "check", "coalesce",
    "collate", "collation", "column", "concurrently", "constraint", "create", "cross", "current_catalog",
    "current_date", "current_role", "current_schema", "current_time", "current_timestamp", "current_user", "dec",
    "decimal", "default", "deferrable", "desc", "distinct", "do", "else", "end", "except", "exists", "extract",
    "false", "fetch", "float", "for", "foreign", "freeze", "from", "full", "grant", "greatest", "group", "grouping",
    "having", "ilike", "in", "initially", "inner", "inout", "int", "integer", "intersect", "interval", "into", "is",
    "isnull", "join", "json", "json_array", "json_arrayagg", "json_exists", "json_object", "json_objectagg",
    "json_query", "json_scalar", "json_serialize", "json_table", "json_value", "lateral", "leading", "least", "left",
    "like", "limit", "localtime", "localtimestamp", "merge_action", "national", "natural", "nchar", "none",
    "normalize", "not", "notnull", "null", "nullif", "numeric", "offset", "on", "only", "or", "order", "out", "outer",
    "overlaps", "overlay", "placing", "position", "precision", "primary", "real", "references", "returning", "right",
    "row", "select", "session_user", "setof", "similar", "smallint", "some", "substring", "symmetric", "system_user",
    "table", "tablesample", "then", "time", "timestamp", "to", "trailing", "treat", "trim", "true", "union", "unique",
    "user", "using", "values", "varchar", "variadic", "verbose", "when", "where", "window", "with", "xmlattributes",
    "xmlconcat", "xmlelement", "xmlexists", "xmlforest", "xmlnamespaces", "xmlparse", "xmlpi", "xmlroot",
    "xmlserialize", "xmltable"};

void print_literal(std::string& out, std::uint32_t type, std::string_view text) {
  switch (type) {
    case oid::int2: case oid::int4: case oid::int8: case oid::oid: case oid::float4: case oid::float8: case oid::numeric:
      out += text;
      return;
    case oid::bit: case oid::varbit:
      out += "B'";
      out += text;
      out.push_back('\'');
      return;
    case oid::bool_:
      out += text == "t" ? "true" : "false";
      return;
    default:
      out.push_back('\'');
      for (char ch : text) {
        if (ch == '\0') break;   // (a C string: test_decoding stops at a NUL; text output has none)
        if (ch == '\'') out.push_back('\'');
        out.push_back(ch);
      }
      out.push_back('\'');
  }
}

void tuple(std::string& out, const change& c, pg::tuple_view t, bool skip_nulls) {
  const auto& r = *c.relation;
  const std::size_t n = std::min(t.size(), r.columns.size());
  for (std::size_t i = 0; i < n; ++i) {
    const auto& v = t[i];
    if (v.kind == pg::column_kind::null && skip_nulls) continue;
    const auto& col = r.columns[i];
    out.push_back(' ');
    out += pg_quote_identifier(col.name);
    out.push_back('[');
    out += plugin_type_name(c, col, false);
    out += "]:";
    switch (v.kind) {
      case pg::column_kind::null: out += "null"; break;
      case pg::column_kind::unchanged_toast: out += "unchanged-toast-datum"; break;
      default: print_literal(out, col.type_oid, protocol::as_string_view(v.value)); break;
    }
  }
}

std::string qualified(const pg::cached_relation& r) { return pg_quote_identifier(r.nspname) + "." + pg_quote_identifier(r.relname); }

}  // namespace

std::string pg_quote_identifier(std::string_view name) {
  bool safe = !name.empty() && ((name[0] >= 'a' && name[0] <= 'z') || name[0] == '_');
  std::size_t quotes = 0;
  for (char ch : name) {
    if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_') continue;
    safe = false;
    if (ch == '"') ++quotes;
  }
  if (safe && std::binary_search(quoted_keywords.begin(), quoted_keywords.end(), name)) safe = false;
  if (safe) return std::string(name);
  std::string out;
  out.reserve(name.size() + quotes + 2);
  out.push_back('"');
  for (char ch : name) {
    if (ch == '"') out.push_back('"');
    out.push_back(ch);
  }
  out.push_back('"');
  return out;
}

test_decoding_parse parse_test_decoding_options(const std::vector<std::pair<std::string, std::optional<std::string>>>& options) {
  test_decoding_parse r;
  for (const auto& [name, value] : options) {
    bool* target = nullptr;
    bool ignored = false;
    if (name == "include-xids") target = &r.options.include_xids;
    else if (name == "include-timestamp") target = &r.options.include_timestamp;
    else if (name == "force-binary") target = &ignored;
    else if (name == "skip-empty-xacts") target = &r.options.skip_empty_xacts;
    else if (name == "only-local") target = &r.options.only_local;
    else if (name == "include-rewrites") target = &ignored;   // (the log has no rewrite's changes: nothing to include)
    else if (name == "stream-changes") target = &ignored;     // (whole transactions are sent; streaming is the plugin's option)
    else {
      r.error = "option \"" + name + "\" = \"" + (value ? *value : "(null)") + "\" is unknown";
      return r;
    }
    if (!value) {   // no value: true
      *target = true;
      continue;
    }
    bool b = false;
    if (!pg_parse_bool(*value, b)) {
      r.error = "could not parse value \"" + *value + "\" for parameter \"" + name + "\"";
      return r;
    }
    *target = b;
  }
  return r;
}

std::string test_decoding_begin(const test_decoding_options& o, std::uint32_t xid) {
  return o.include_xids ? "BEGIN " + std::to_string(xid) : std::string("BEGIN");
}

std::string test_decoding_commit(const test_decoding_options& o, std::uint32_t xid, std::int64_t commit_time) {
  std::string s = o.include_xids ? "COMMIT " + std::to_string(xid) : std::string("COMMIT");
  if (o.include_timestamp) s += " (at " + pg_timestamptz_utc(commit_time) + ")";
  return s;
}

void test_decoding_change(std::string& out, const change& c) {
  if (c.kind == op::message) {
    if (!c.message) return;
    const auto& m = *c.message;
    out += "message: transactional: ";
    out += m.transactional ? "1" : "0";
    out += " prefix: ";
    out += m.prefix;
    out += ", sz: ";
    out += std::to_string(m.content.size());
    out += " content:";
    out += protocol::as_string_view(m.content);
    return;
  }
  if (!c.relation) return;
  out += "table ";
  out += qualified(*c.relation);
  out.push_back(':');
  switch (c.kind) {
    case op::insert:
      out += " INSERT:";
      tuple(out, c, c.after, false);
      break;
    case op::update:
      out += " UPDATE:";
      if (c.before_kind) {
        out += " old-key:";
        tuple(out, c, c.before, true);
        out += " new-tuple:";
      }
      tuple(out, c, c.after, false);
      break;
    case op::delete_:
      out += " DELETE:";
      if (!c.before_kind) out += " (no-tuple-data)";
      else tuple(out, c, c.before, true);
      break;
    default:
      break;
  }
}

void test_decoding_truncate(std::string& out, const std::vector<const pg::cached_relation*>& relations, std::uint8_t options) {
  out += "table ";
  for (std::size_t i = 0; i < relations.size(); ++i) {
    if (i) out += ", ";
    out += qualified(*relations[i]);
  }
  out += ": TRUNCATE:";
  if (options & 3) {
    if (options & 2) out += " restart_seqs";
    if (options & 1) out += " cascade";
  } else {
    out += " (no-flags)";
  }
}


// format_type_be() (with_typmod false) or format_type_with_typemod(): types outside pg_catalog
// qualified (every libpq replication client runs with search_path '').
std::string plugin_type_name(const change& c, const pg::cached_column& col, bool with_typmod) {
  const std::int32_t typmod = with_typmod ? col.type_modifier : -1;
  if (!with_typmod) {
    // (bpchar without a typmod: format_type_be says "character"; format_type_extended with the
    // typmod given as -1 says "bpchar")
    if (col.type_oid == oid::bpchar) return "character";
    if (array_element_type(col.type_oid) == oid::bpchar) return "character[]";
  }
  std::string n = builtin_type_name(col.type_oid, typmod);
  if (!n.empty()) return n;
  if (c.types)
    if (const auto* t = c.types->find(col.type_oid)) {
      std::string name = t->name, suffix;
      if (name.size() > 1 && name[0] == '_') {   // an array type: "element[]"
        name = name.substr(1);
        suffix = "[]";
      }
      return (t->nspname == "pg_catalog" ? pg_quote_identifier(name)
                                         : pg_quote_identifier(t->nspname) + "." + pg_quote_identifier(name)) + suffix;
    }
  return std::to_string(col.type_oid);   // (format_type_be's "???" is never reached: pgoutput names every type)
}

std::string plugin_typname(const change& c, const pg::cached_column& col) {
  std::string n = builtin_typname(col.type_oid);
  if (!n.empty()) return n;
  if (c.types)
    if (const auto* t = c.types->find(col.type_oid)) return t->name;
  return std::to_string(col.type_oid);
}

namespace {

/// test_decoding as an output_plugin: BEGIN/COMMIT lines around each transaction's lines (or,
/// with skip-empty-xacts, only around one that printed something), only-local dropping what has
/// an origin.
class test_decoding_plugin final : public output_plugin {
 public:
  test_decoding_plugin(test_decoding_options o, plugin_sink sink) : output_plugin(std::move(sink)), o_(o) {}

  void begin(const plugin_transaction& t, protocol::lsn first) override {
    wrote_ = false;
    skipped_ = o_.only_local && t.has_origin;
    if (!skipped_ && !o_.skip_empty_xacts) sink_(first, test_decoding_begin(o_, t.xid));
  }
  void change(const plugin_transaction& t, const transform::change& c) override {
    if (skipped_) return;
    // (test_decoding before 17: no BEGIN for a message, and it is no change)
    if (c.kind != op::message || o_.message_is_change) begin_if_needed(t, c.change_lsn);
    line_.clear();
    test_decoding_change(line_, c);
    sink_(c.change_lsn, line_);
  }
  void truncate(const plugin_transaction& t, const std::vector<const pg::cached_relation*>& relations, std::uint8_t options,
                protocol::lsn at) override {
    if (skipped_) return;
    begin_if_needed(t, at);
    line_.clear();
    test_decoding_truncate(line_, relations, options);
    sink_(at, line_);
  }
  void commit(const plugin_transaction& t) override {
    if (!skipped_ && (!o_.skip_empty_xacts || wrote_)) sink_(t.end_lsn, test_decoding_commit(o_, t.xid, t.commit_time));
    wrote_ = skipped_ = false;
  }
  void message(const transform::change& c) override {
    if (o_.only_local && c.txn && c.txn->origin) return;
    line_.clear();
    test_decoding_change(line_, c);
    sink_(c.change_lsn, line_);
  }

 private:
  void begin_if_needed(const plugin_transaction& t, protocol::lsn at) {
    if (!wrote_ && o_.skip_empty_xacts) sink_(at, test_decoding_begin(o_, t.xid));
    wrote_ = true;
  }
  test_decoding_options o_;
  bool wrote_ = false, skipped_ = false;
  std::string line_;
};

}  // namespace

std::unique_ptr<output_plugin> make_test_decoding_plugin(const test_decoding_options& o, plugin_sink sink) {
  return std::make_unique<test_decoding_plugin>(o, std::move(sink));
}

}  // namespace walgate::transform
