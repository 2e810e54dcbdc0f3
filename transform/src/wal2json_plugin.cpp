// wal2json 2.5 (wal2json.c) as an output_plugin: its startup option parsing and its callbacks'
// output, function for function (the names in comments are the plugin's). See the header for
// what is assumed and what is refused.
#include "walgate/transform/wal2json_plugin.hpp"

#include "walgate/transform/formats.hpp"
#include "walgate/transform/pg_types.hpp"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <strings.h>
#include <unordered_map>

namespace walgate::transform {

namespace pg = protocol::pgoutput;

void pg_escape_json(std::string& out, std::string_view s) {
  out.push_back('"');
  for (char ch : s) {
    switch (ch) {
      case '\0': out.push_back('"'); return;   // (a C string ends there)
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      default:
        if (static_cast<unsigned char>(ch) < ' ') {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<int>(ch));
          out += buf;
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

namespace {

constexpr std::size_t max_alloc = 0x3fffffff;   // PostgreSQL's MaxAllocSize: a StringInfo's limit
/// Room left in front of a format 1 transaction's body for its header (at most about 150 bytes:
/// xid, nextlsn, timestamp, with pretty-print's tabs and spaces).
constexpr std::size_t header_room = 256;

bool space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// split_string_to_list(): names separated by `separator`, whitespace around them, a backslash
// keeping the next character in the name (the name keeps the backslash too); false on a syntax
// error. An empty string is an empty list.
bool split_list(std::string_view raw, char separator, std::vector<std::string>& out) {
  std::size_t p = 0;
  while (p < raw.size() && space(raw[p])) ++p;
  if (p == raw.size()) return true;
  for (;;) {
    const std::size_t start = p;
    while (p < raw.size() && raw[p] != separator && !space(raw[p])) {
      if (raw[p] == '\\') ++p;   // (the next character is part of the name)
      ++p;
    }
    p = std::min(p, raw.size());   // (a trailing backslash: the plugin reads past its string's end)
    const std::size_t end = p;
    if (start == end) return false;   // (an empty name)
    while (p < raw.size() && space(raw[p])) ++p;
    out.emplace_back(raw.substr(start, end - start));
    if (p == raw.size()) return true;
    if (raw[p] != separator) return false;
    ++p;
    while (p < raw.size() && space(raw[p])) ++p;
  }
}

// parse_table_identifier(): "schema.table", "*.table", "schema.*"; a backslash escapes the next
// character (a '.', a '*', a ',').
bool parse_table(const std::string& item, wal2json_table& t) {
  t.all_schemas = item.size() >= 2 && item[0] == '*' && item[1] == '.';
  std::size_t i = 0;
  while (i < item.size() && item[i] != '.') {
    if (item[i] == '\\') ++i;
    if (i < item.size()) t.schema.push_back(item[i]);
    ++i;
  }
  if (i >= item.size()) return false;   // (no '.': the schema is not given)
  ++i;
  t.all_tables = item.size() == i + 1 && item[i] == '*';
  while (i < item.size()) {
    if (item[i] == '\\') ++i;
    if (i < item.size()) t.table.push_back(item[i]);
    ++i;
  }
  return true;
}

bool parse_tables(std::string_view raw, std::vector<wal2json_table>& out) {
  std::vector<std::string> items;
  if (!split_list(raw, ',', items)) return false;
  for (const auto& item : items) {
    wal2json_table t;
    if (!parse_table(item, t)) return false;
    out.push_back(std::move(t));
  }
  return true;
}

// parse_int() without units (guc.c): strtol with base 0, else strtod, rounded; whitespace around.
bool parse_int(const std::string& v, int& out) {
  const char* s = v.c_str();
  char* end = nullptr;
  errno = 0;
  double value = static_cast<double>(std::strtol(s, &end, 0));
  if (*end == '.' || *end == 'e' || *end == 'E' || errno == ERANGE) {
    errno = 0;
    value = std::strtod(s, &end);
  }
  if (end == s || errno == ERANGE || std::isnan(value)) return false;
  while (space(*end)) ++end;
  if (*end != '\0') return false;
  value = std::rint(value);
  if (value > INT_MAX || value < INT_MIN) return false;
  out = static_cast<int>(value);
  return true;
}

bool matches(const std::vector<wal2json_table>& tables, const std::string& schema, const std::string& table) {
  for (const auto& t : tables)
    if ((t.all_schemas || t.schema == schema) && (t.all_tables || t.table == table)) return true;
  return false;
}

std::string lsn_text(protocol::lsn l) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%X/%X", static_cast<unsigned>(l.value >> 32), static_cast<unsigned>(l.value));
  return buf;
}

/// The type as the plugin prints it: format_type()'s text goes out as it is when it starts with a
/// quote and is not an array (the plugin's shortcut: `"char"` stays `"char"`), else as a string.
void append_type(std::string& out, const std::string& type) {
  if (!type.empty() && type.front() == '"' && type.back() != ']') out += type;
  else pg_escape_json(out, type);
}

class wal2json_plugin final : public output_plugin {
 public:
  wal2json_plugin(const wal2json_options& o, plugin_sink sink) : output_plugin(std::move(sink)), o_(o) {
    if (o_.pretty_whitespace) {
      ht_ = "\t";
      nl_ = "\n";
      sp_ = " ";
    }
  }

  // pg_decode_begin_txn_v1 / _v2
  void begin(const plugin_transaction& t, protocol::lsn first) override {
    if (!failed_.empty()) return;   // (the plugin stops at its error: nothing after it)
    if (o_.format_version == 1) {
      nr_changes_ = 0;
      // (room for the header in front, written at the commit: the body is never copied)
      buf_.assign(header_room, ' ');
      at_ = first;
      // (without chunks the header is written at the commit, when the end is surely known)
      if (o_.write_in_chunks) emit(first, header_v1(t));
      return;
    }
    if (!o_.include_transaction) return;
    std::string s = "{\"action\":\"B\"";
    if (o_.include_xids) s += ",\"xid\":" + std::to_string(t.xid);
    if (o_.include_timestamp) s += ",\"timestamp\":\"" + pg_timestamptz_utc(t.commit_time) + "\"";
    if (o_.include_lsn) s += ",\"lsn\":\"" + lsn_text(t.commit_lsn) + "\",\"nextlsn\":\"" + lsn_text(t.end_lsn) + "\"";
    s += "}";
    emit(first, s);
  }

  // pg_decode_commit_txn_v1 / _v2
  void commit(const plugin_transaction& t) override {
    if (!failed_.empty()) return;
    if (o_.format_version == 1) {
      if (o_.write_in_chunks) {
        piece_ = ht_ + "]" + nl_ + "}";
        emit(t.end_lsn, piece_);
        return;
      }
      // (without chunks, the whole transaction is one message, prepared at its begin; its
      // header goes in the room left in front of the body)
      const std::string h = header_v1(t);
      buf_ += nl_ + ht_ + "]" + nl_ + "}";
      if (h.size() > header_room || buf_.size() < header_room) {   // (never: the header is bounded)
        failed_ = "wal2json: a transaction's header does not fit";
        return;
      }
      buf_.replace(header_room - h.size(), h.size(), h);
      if (!grew(buf_)) return;
      emit(at_, std::string_view(buf_).substr(header_room - h.size()));
      buf_.clear();
      if (buf_.capacity() > (1u << 20)) buf_.shrink_to_fit();   // (a huge transaction's buffer is not kept)
      return;
    }
    if (!o_.include_transaction) return;
    std::string s = "{\"action\":\"C\"";
    if (o_.include_xids) s += ",\"xid\":" + std::to_string(t.xid);
    if (o_.include_timestamp) s += ",\"timestamp\":\"" + pg_timestamptz_utc(t.commit_time) + "\"";
    if (o_.include_lsn) s += ",\"lsn\":\"" + lsn_text(t.commit_lsn) + "\",\"nextlsn\":\"" + lsn_text(t.end_lsn) + "\"";
    s += "}";
    emit(t.end_lsn, s);
  }

  // pg_decode_change_v1 / _v2
  void change(const plugin_transaction& t, const transform::change& c) override {
    if (!failed_.empty()) return;
    if (c.kind == op::message) {
      if (c.message) message_of(&t, c);
      return;
    }
    if (!c.relation) return;
    if ((c.kind == op::insert && !o_.insert) || (c.kind == op::update && !o_.update) || (c.kind == op::delete_ && !o_.delete_))
      return;
    const auto& r = *c.relation;
    if (matches(o_.filter_tables, r.nspname, r.relname) || !matches(o_.add_tables, r.nspname, r.relname)) return;
    bool has_key = false;
    for (const auto& col : r.columns) has_key = has_key || col.key;
    // (no replica identity index and not FULL: the plugin warns and prints nothing of an update
    // or a delete — pgoutput refuses such a change at the source, so this is for completeness)
    const bool no_identity = !has_key && r.replica_identity != 'f';
    if (o_.format_version == 1) change_v1(c, no_identity);
    else change_v2(t, c, no_identity, has_key);
  }

  // pg_decode_truncate_v1 (compiled out in 2.5: nothing) / _v2
  void truncate(const plugin_transaction& t, const std::vector<const pg::cached_relation*>& relations, std::uint8_t,
                protocol::lsn at) override {
    if (o_.format_version == 1 || !o_.truncate || !failed_.empty()) return;
    for (const auto* r : relations) {
      if (matches(o_.filter_tables, r->nspname, r->relname) || !matches(o_.add_tables, r->nspname, r->relname)) continue;
      std::string s = "{\"action\":\"T\"";
      if (o_.include_xids) s += ",\"xid\":" + std::to_string(t.xid);
      if (o_.include_timestamp) s += ",\"timestamp\":\"" + pg_timestamptz_utc(t.commit_time) + "\"";
      if (o_.include_lsn) s += ",\"lsn\":\"" + lsn_text(at) + "\"";
      if (o_.include_schemas) {
        s += ",\"schema\":";
        pg_escape_json(s, r->nspname);
      }
      s += ",\"table\":";
      pg_escape_json(s, r->relname);
      s += "}";
      emit(at, s);
    }
  }

  void message(const transform::change& c) override {
    if (c.message && failed_.empty()) message_of(nullptr, c);
  }
  // (format 1 without chunks writes its header at the commit; format 2 prints its "B" only with
  // include-transaction)
  bool needs_end_at_begin() const override {
    return o_.include_lsn && (o_.format_version == 2 ? o_.include_transaction : o_.write_in_chunks);
  }
  bool needs_catalog() const override { return o_.include_not_null || !named_tables().empty(); }
  void set_catalog(const std::vector<published_table>& tables) override {
    for (const auto& t : tables)
      for (const auto& [column, not_null] : t.columns) not_null_[t.schema + '\0' + t.table + '\0' + column] = not_null;
  }
  std::vector<table_pattern> named_tables() const override {
    // (the default "*.*" names nothing)
    if (o_.add_tables.size() == 1 && o_.add_tables[0].all_schemas && o_.add_tables[0].all_tables) return {};
    return o_.add_tables;
  }

 private:
  void emit(protocol::lsn at, std::string_view bytes) { sink_(at, bytes); }

  // pg_decode_begin_txn_v1's part
  std::string header_v1(const plugin_transaction& t) const {
    std::string h = "{" + nl_;
    if (o_.include_xids) h += ht_ + "\"xid\":" + sp_ + std::to_string(t.xid) + "," + nl_;
    if (o_.include_lsn) h += ht_ + "\"nextlsn\":" + sp_ + "\"" + lsn_text(t.end_lsn) + "\"," + nl_;
    if (o_.include_timestamp) h += ht_ + "\"timestamp\":" + sp_ + "\"" + pg_timestamptz_utc(t.commit_time) + "\"," + nl_;
    h += ht_ + "\"change\":" + sp_ + "[";
    return h;
  }

  /// False (and the stream's error set) once a message passes what a StringInfo may hold.
  bool grew(const std::string& s) {
    if (s.size() <= max_alloc) return true;
    // (PostgreSQL's enlargeStringInfo: ERRCODE_PROGRAM_LIMIT_EXCEEDED's "out of memory")
    failed_ = "out of memory";
    failed_sqlstate_ = "54000";
    failed_detail_ = "Cannot enlarge string buffer containing " + std::to_string(max_alloc) +
                     " bytes: a wal2json format-version 1 transaction is one message (write-in-chunks sends it in pieces).";
    buf_.clear();
    buf_.shrink_to_fit();
    return false;
  }

  // pg_decode_write_value / the value part of tuple_to_stringinfo
  void value(std::string& out, std::uint32_t type, const pg::tuple_column& v) {
    if (v.kind == pg::column_kind::null) {
      out += "null";
      return;
    }
    const std::string_view text = protocol::as_string_view(v.value);
    switch (type) {
      case oid::int2: case oid::int4: case oid::int8: case oid::oid: case oid::float4: case oid::float8: case oid::numeric: {
        auto starts = [&](std::string_view w) { return text.size() >= w.size() && strncasecmp(text.data(), w.data(), w.size()) == 0; };
        if (starts("NaN") || starts("Infinity") || starts("-Infinity")) {
          out += "null";
        } else if (text.find_first_not_of("0123456789+-eE.") == std::string_view::npos) {
          out += text;
        } else {
          failed_ = std::string(text) + " is not a number";
          out += "null";
        }
        return;
      }
      case oid::bool_: out += text == "t" ? "true" : "false"; return;
      case oid::bytea: pg_escape_json(out, text.size() >= 2 ? text.substr(2) : std::string_view()); return;   // (after "\x")
      default: pg_escape_json(out, text); return;
    }
  }

  std::string type_of(const transform::change& c, const pg::cached_column& col, bool with_typmod) const {
    return with_typmod ? plugin_type_name(c, col, true) : plugin_typname(c, col);
  }

  // tuple_to_stringinfo: names, types, type oids and values of a tuple's columns (keys_only: the
  // replica identity's), as arrays; replident prints the "oldkeys" object.
  void tuple_v1(std::string& out, const transform::change& c, pg::tuple_view tv, bool keys_only, bool replident, bool addcomma) {
    const auto& r = *c.relation;
    std::string names, types, oids, optionals, values, comma;
    const bool optional = o_.include_not_null && !replident;
    if (replident) {
      names = ht_ + ht_ + ht_ + "\"oldkeys\":" + sp_ + "{" + nl_ + ht_ + ht_ + ht_ + ht_ + "\"keynames\":" + sp_ + "[";
      types = ht_ + ht_ + ht_ + ht_ + "\"keytypes\":" + sp_ + "[";
      oids = ht_ + ht_ + ht_ + ht_ + "\"keytypeoids\":" + sp_ + "[";
      values = ht_ + ht_ + ht_ + ht_ + "\"keyvalues\":" + sp_ + "[";
    } else {
      names = ht_ + ht_ + ht_ + "\"columnnames\":" + sp_ + "[";
      types = ht_ + ht_ + ht_ + "\"columntypes\":" + sp_ + "[";
      oids = ht_ + ht_ + ht_ + "\"columntypeoids\":" + sp_ + "[";
      values = ht_ + ht_ + ht_ + "\"columnvalues\":" + sp_ + "[";
      optionals = ht_ + ht_ + ht_ + "\"columnoptionals\":" + sp_ + "[";
    }
    const std::size_t n = std::min(tv.size(), r.columns.size());
    for (std::size_t i = 0; i < n; ++i) {
      const auto& col = r.columns[i];
      const auto& v = tv[i];
      if (keys_only && !col.key) continue;
      if (v.kind == pg::column_kind::null && replident) continue;
      if (v.kind == pg::column_kind::unchanged_toast) continue;
      names += comma;
      pg_escape_json(names, col.name);
      if (o_.include_types) {
        types += comma;
        append_type(types, type_of(c, col, o_.include_typmod));
        // (the plugin prints a column's optional inside its types' block: without
        // include-types the array stays empty, "columnoptionals":[])
        if (optional) optionals += comma + (not_null(r, col.name) ? "false" : "true");
      }
      if (o_.include_type_oids) oids += comma + std::to_string(col.type_oid);
      values += comma;
      value(values, col.type_oid, v);
      if (comma.empty()) comma = "," + sp_;
    }
    names += "]," + nl_;
    if (o_.include_types) types += "]," + nl_;
    if (o_.include_type_oids) oids += "]," + nl_;
    if (optional) optionals += "]," + nl_;
    if (replident) values += "]" + nl_ + ht_ + ht_ + ht_ + "}" + nl_;
    else values += (addcomma ? "]," : "]") + nl_;
    out += names;
    if (o_.include_types) out += types;
    if (o_.include_type_oids) out += oids;
    if (optional) out += optionals;
    out += values;
  }

  void change_v1(const transform::change& c, bool no_identity) {
    if (c.kind != op::insert && no_identity) return;
    if (c.kind == op::delete_ && !c.before_kind) return;   // ("no tuple data for DELETE")
    const auto& r = *c.relation;
    std::string& out = o_.write_in_chunks ? (piece_.clear(), piece_) : buf_;
    ++nr_changes_;
    if (!o_.write_in_chunks) out += nl_;
    out += ht_ + ht_;
    if (nr_changes_ > 1) out.push_back(',');
    out += "{" + nl_;
    const char* kind = c.kind == op::insert ? "insert" : c.kind == op::update ? "update" : "delete";
    out += ht_ + ht_ + ht_ + "\"kind\":" + sp_ + "\"" + kind + "\"," + nl_;
    if (o_.include_schemas) {
      out += ht_ + ht_ + ht_ + "\"schema\":" + sp_;
      pg_escape_json(out, r.nspname);
      out += "," + nl_;
    }
    out += ht_ + ht_ + ht_ + "\"table\":" + sp_;
    pg_escape_json(out, r.relname);
    out += "," + nl_;
    switch (c.kind) {
      case op::insert: tuple_v1(out, c, c.after, false, false, false); break;
      case op::update:
        tuple_v1(out, c, c.after, false, false, true);
        // (the old tuple, all of its non-null columns, when the server logged one; else the
        // identity's columns of the new tuple)
        if (c.before_kind) tuple_v1(out, c, c.before, false, true, false);
        else tuple_v1(out, c, c.after, true, true, false);
        break;
      default: tuple_v1(out, c, c.before, true, true, false); break;
    }
    out += ht_ + ht_ + "}";
    if (!failed_.empty() || !grew(out)) return;   // (a column include-not-null cannot tell: not sent)
    if (o_.write_in_chunks) emit(c.change_lsn, out);
  }

  // pg_decode_write_tuple
  void tuple_v2(std::string& out, const transform::change& c, pg::tuple_view tv, bool identity) {
    const auto& r = *c.relation;
    bool sep = false;
    const std::size_t n = std::min(tv.size(), r.columns.size());
    for (std::size_t i = 0; i < n; ++i) {
      const auto& col = r.columns[i];
      const auto& v = tv[i];
      if (identity && !col.key) continue;
      if (v.kind == pg::column_kind::unchanged_toast) continue;
      if (sep) out.push_back(',');
      sep = true;
      out += "{\"name\":";
      pg_escape_json(out, col.name);
      if (o_.include_types) {
        out += ",\"type\":";
        append_type(out, plugin_type_name(c, col, true));
      }
      if (o_.include_type_oids) out += ",\"typeoid\":" + std::to_string(static_cast<std::int32_t>(col.type_oid));
      out += ",\"value\":";
      value(out, col.type_oid, v);
      if (!identity && o_.include_not_null) out += not_null(r, col.name) ? ",\"optional\":false" : ",\"optional\":true";
      out.push_back('}');
    }
  }

  // pg_decode_write_change
  void change_v2(const plugin_transaction& t, const transform::change& c, bool no_identity, bool has_key) {
    if (c.kind != op::insert && !c.before_kind && no_identity) return;   // ("no tuple identifier")
    const auto& r = *c.relation;
    std::string s = "{\"action\":\"";
    s += c.kind == op::insert ? "I" : c.kind == op::update ? "U" : "D";
    s += "\"";
    if (o_.include_xids) s += ",\"xid\":" + std::to_string(t.xid);
    if (o_.include_timestamp) s += ",\"timestamp\":\"" + pg_timestamptz_utc(t.commit_time) + "\"";
    if (o_.include_lsn) s += ",\"lsn\":\"" + lsn_text(c.change_lsn) + "\"";
    if (o_.include_schemas) {
      s += ",\"schema\":";
      pg_escape_json(s, r.nspname);
    }
    s += ",\"table\":";
    pg_escape_json(s, r.relname);
    if (c.kind != op::delete_) {
      s += ",\"columns\":[";
      tuple_v2(s, c, c.after, false);
      s += "]";
    }
    if (c.before_kind) {
      s += ",\"identity\":[";
      tuple_v2(s, c, c.before, true);
      s += "]";
    } else if (c.kind == op::update && has_key) {
      // (no old tuple: the identity did not change, the new tuple's key columns are it)
      s += ",\"identity\":[";
      tuple_v2(s, c, c.after, true);
      s += "]";
    }
    s += "}";
    if (!failed_.empty()) return;   // (a column include-not-null cannot tell: not sent)
    emit(c.change_lsn, s);
  }

  // pg_decode_message (prefix filters) and pg_decode_message_v1 / _v2; t null: non-transactional
  void message_of(const plugin_transaction* t, const transform::change& c) {
    const auto& m = *c.message;
    const std::string prefix(m.prefix);
    for (const auto& p : o_.filter_msg_prefixes)
      if (p == prefix) return;
    if (!o_.add_msg_prefixes.empty()) {
      bool skip = true;
      for (const auto& p : o_.add_msg_prefixes) skip = skip && p != prefix;
      if (skip) return;
    }
    const bool transactional = t != nullptr;
    const std::string_view content = protocol::as_string_view(m.content);
    if (o_.format_version == 2) {
      std::string s = "{\"action\":\"M\"";
      if (o_.include_xids) s += transactional ? ",\"xid\":" + std::to_string(t->xid) : std::string(",\"xid\":null");
      if (o_.include_timestamp)
        s += transactional ? ",\"timestamp\":\"" + pg_timestamptz_utc(t->commit_time) + "\"" : std::string(",\"timestamp\":null");
      if (o_.include_lsn) s += ",\"lsn\":\"" + lsn_text(c.change_lsn) + "\"";
      s += transactional ? ",\"transactional\":true" : ",\"transactional\":false";
      s += ",\"prefix\":";
      pg_escape_json(s, prefix);
      s += ",\"content\":";
      pg_escape_json(s, content);
      s += "}";
      emit(c.change_lsn, s);
      return;
    }
    const bool own = o_.write_in_chunks || !transactional;   // (written as a message of its own)
    std::string& out = own ? (piece_.clear(), piece_) : buf_;
    if (transactional) ++nr_changes_;
    if (!o_.write_in_chunks && transactional) out += nl_;
    if (!transactional) out += "{" + nl_ + ht_ + "\"change\":" + sp_ + "[" + nl_;
    out += ht_ + ht_;
    if (nr_changes_ > 1) out.push_back(',');   // (not reset for a non-transactional one: kept)
    out += "{" + nl_ + ht_ + ht_ + ht_ + "\"kind\":" + sp_ + "\"message\"," + nl_;
    out += ht_ + ht_ + ht_ + "\"transactional\":" + sp_ + (transactional ? "true," : "false,") + nl_;
    out += ht_ + ht_ + ht_ + "\"prefix\":" + sp_;
    pg_escape_json(out, prefix);
    out += "," + nl_ + ht_ + ht_ + ht_ + "\"content\":" + sp_;
    pg_escape_json(out, content);
    out += nl_ + ht_ + ht_ + "}";
    if (!transactional) out += nl_ + ht_ + "]" + nl_ + "}";
    if (!grew(out)) return;
    if (own) emit(c.change_lsn, out);
  }

  /// The catalog's attnotnull of a column; a column it did not have when the stream started
  /// fails the stream (never a guess).
  bool not_null(const pg::cached_relation& r, const std::string& column) {
    auto it = not_null_.find(r.nspname + '\0' + r.relname + '\0' + column);
    if (it != not_null_.end()) return it->second;
    if (failed_.empty()) {
      failed_ = "wal2json include-not-null: walgate does not know whether column \"" + column + "\" of \"" + r.nspname +
                "\".\"" + r.relname + "\" is NOT NULL: it was not in the catalog when this stream started";
      failed_detail_ = "Start the stream again: the catalog is read at each START_REPLICATION.";
    }
    return false;
  }

  wal2json_options o_;
  std::unordered_map<std::string, bool> not_null_;
  std::string ht_, nl_, sp_;
  std::uint64_t nr_changes_ = 0;
  std::string buf_;     ///< format 1 without chunks: the open transaction's message
  std::string piece_;   ///< a message written at once
  protocol::lsn at_;    ///< where buf_'s message was prepared (the transaction's begin)
};

}  // namespace

wal2json_parse parse_wal2json_options(const plugin_options& options) {
  wal2json_parse r;
  auto& o = r.options;
  auto fail = [&](const char* sqlstate, std::string text) {
    r.sqlstate = sqlstate;
    r.error = std::move(text);
    return r;
  };
  auto cannot_parse = [&](const char* sqlstate, const std::string& value, const std::string& name) {
    return fail(sqlstate, "could not parse value \"" + value + "\" for parameter \"" + name + "\"");
  };
  for (const auto& [name, value] : options) {
    bool* flag = nullptr;
    bool refused = false;   ///< an option walgate cannot serve when true
    bool refused_value = false;
    if (name == "include-transaction") flag = &o.include_transaction;
    else if (name == "include-xids") flag = &o.include_xids;
    else if (name == "include-timestamp") flag = &o.include_timestamp;
    else if (name == "include-schemas") flag = &o.include_schemas;
    else if (name == "include-types") flag = &o.include_types;
    else if (name == "include-type-oids") flag = &o.include_type_oids;
    else if (name == "include-typmod") flag = &o.include_typmod;
    else if (name == "pretty-print") flag = &o.pretty_print;
    else if (name == "write-in-chunks") flag = &o.write_in_chunks;
    else if (name == "include-lsn") flag = &o.include_lsn;
    else if (name == "include-not-null") flag = &o.include_not_null;
    else if (name == "include-pk" || name == "include-origin" || name == "include-domain-data-type" ||
             name == "include-column-positions" || name == "include-default") {
      flag = &refused_value;
      refused = true;
    }
    if (flag) {
      if (!value) *flag = true;
      else if (!pg_parse_bool(*value, *flag)) return cannot_parse("22023", *value, name);
      // (the plugin sets its tabs and newlines when pretty-print is on and never clears them:
      // "pretty-print=1, pretty-print=0" still prints pretty)
      if (name == "pretty-print" && o.pretty_print) o.pretty_whitespace = true;
      if (refused && refused_value) {
        const char* why = name == "include-pk" ? "the primary key"
                          : name == "include-origin" ? "the origin's id"
                          : name == "include-domain-data-type" ? "a domain's base type"
                          : name == "include-column-positions" ? "column numbers"
                                                               : "column defaults";
        return fail("0A000", "wal2json option \"" + name + "\" is not served by walgate: the pgoutput stream its log keeps carries no " +
                                 why);
      }
      continue;
    }
    if (name == "include-unchanged-toast") return fail("42602", "parameter \"" + name + "\" was deprecated");
    if (name == "actions") {
      if (!value) continue;   // (the default)
      std::vector<std::string> actions;
      if (!split_list(*value, ',', actions)) return cannot_parse("42602", *value, name);
      o.insert = o.update = o.delete_ = o.truncate = false;
      for (const auto& a : actions) {
        if (a == "insert") o.insert = true;
        else if (a == "update") o.update = true;
        else if (a == "delete") o.delete_ = true;
        else if (a == "truncate") o.truncate = true;
        else return cannot_parse("22023", a, name);
      }
      continue;
    }
    if (name == "filter-origins") {
      std::vector<std::string> ids;
      if (value && !split_list(*value, ',', ids)) return cannot_parse("42602", *value, name);
      if (!ids.empty())
        return fail("0A000", "wal2json option \"filter-origins\" is not served by walgate: its log keeps origins by name, not by id");
      continue;
    }
    if (name == "filter-tables") {   // (given twice: the lists add up, as the plugin appends; no value empties it)
      if (!value) o.filter_tables.clear();
      else if (!parse_tables(*value, o.filter_tables)) return cannot_parse("42602", *value, name);
      continue;
    }
    if (name == "add-tables") {
      o.add_tables.clear();
      if (value && !parse_tables(*value, o.add_tables)) return cannot_parse("42602", *value, name);
      continue;
    }
    if (name == "filter-msg-prefixes" || name == "add-msg-prefixes") {
      auto& list = name == "filter-msg-prefixes" ? o.filter_msg_prefixes : o.add_msg_prefixes;
      if (!value) list.clear();   // (given twice: the lists add up, as the plugin appends)
      else if (!split_list(*value, ',', list)) return cannot_parse("42602", *value, name);
      continue;
    }
    if (name == "format-version") {
      if (!value) o.format_version = 2;
      else if (!parse_int(*value, o.format_version)) return cannot_parse("22023", *value, name);
      if (o.format_version > 2)
        return fail("0A000", "client sent format_version=" + std::to_string(o.format_version) +
                                 " but we only support format 2 or lower");
      if (o.format_version < 1)
        return fail("0A000", "client sent format_version=" + std::to_string(o.format_version) +
                                 " but we only support format 1 or higher");
      continue;
    }
    return fail("22023", "option \"" + name + "\" = \"" + (value ? *value : "(null)") + "\" is unknown");
  }
  return r;
}

std::unique_ptr<output_plugin> make_wal2json_plugin(const wal2json_options& o, plugin_sink sink) {
  return std::make_unique<wal2json_plugin>(o, std::move(sink));
}

}  // namespace walgate::transform
