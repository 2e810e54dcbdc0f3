// The five formats' encoders (formats.hpp): each change's JSON, the transaction records (begin,
// commit, Debezium's transaction block) and the keys (keys=, Waltail's ordering key).
// Over 900 lines: the five encoders sit over one set of value mappings (native_value to
// debezium_value, one per format) and the row and array writers they plug into, all in one
// unnamed namespace — which keeps them private, and is why they are one file. It is no reason
// for this length. Seams: the shared part (about 340 lines, append_lsn to append_message_fields)
// could go into an internal header and a file of its own; each format's encoder (50 to 80
// lines) could then be a file; the transaction records and keys (about 170 lines, from
// pg_timestamptz_utc on) need only append_lsn, the row writers and two value mappings.
#include "walgate/transform/formats.hpp"

#include "walgate/transform/temporal.hpp"
#include "walgate/protocol/base64.hpp"
#include "walgate/transform/json.hpp"
#include "walgate/transform/pg_array.hpp"
#include "walgate/transform/pg_types.hpp"

#include "sha1.hpp"

#include <chrono>
#include <cstring>

namespace walgate::transform {

namespace pg = protocol::pgoutput;
using protocol::as_string_view;

// --- small shared pieces -----------------------------------------------------------------------

std::optional<format> parse_format(std::string_view name) {
  if (name == "native") return format::native;
  if (name == "debezium") return format::debezium;
  if (name == "pgoutput2json") return format::pgoutput2json;
  if (name == "waltail") return format::waltail;
  if (name == "wal2json") return format::wal2json;
  return std::nullopt;
}

const char* to_string(format f) {
  switch (f) {
    case format::native: return "native";
    case format::debezium: return "debezium";
    case format::pgoutput2json: return "pgoutput2json";
    case format::waltail: return "waltail";
    case format::wal2json: return "wal2json";
  }
  return "?";
}

std::optional<event_id> event_id::parse(std::string_view text) {
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto l = protocol::lsn::parse(text.substr(0, colon));
  auto idx = text.substr(colon + 1);
  if (l && (idx == "B" || idx == "C"))
    return event_id{*l, 0, idx == "B" ? event_id::mark::begin : event_id::mark::commit};
  if (!l || idx.empty() || idx.size() > 10) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : idx) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (v > 0xffffffffULL) return std::nullopt;
  return event_id{*l, static_cast<std::uint32_t>(v)};
}

std::string uuid_v5(std::string_view name) {
  // walgate's namespace UUID: 3c1f7c3e-5b0a-4f43-9b7e-2f6a1d9e8c41
  static constexpr char ns[16] = {'\x3c', '\x1f', '\x7c', '\x3e', '\x5b', '\x0a', '\x4f', '\x43',
                                  '\x9b', '\x7e', '\x2f', '\x6a', '\x1d', '\x9e', '\x8c', '\x41'};
  auto md = sha1(std::string_view(ns, sizeof ns), name);
  md[6] = static_cast<unsigned char>((md[6] & 0x0f) | 0x50);   // version 5
  md[8] = static_cast<unsigned char>((md[8] & 0x3f) | 0x80);   // RFC 4122 variant
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(hex[md[i] >> 4]);
    out.push_back(hex[md[i] & 15]);
  }
  return out;
}

std::string iso8601_utc(std::int64_t pg_epoch_us) { return temporal::iso8601(protocol::pg_us_to_unix(pg_epoch_us)); }

namespace {

void append_lsn(std::string& out, protocol::lsn l) {
  static constexpr char hex[] = "0123456789ABCDEF";
  auto half = [&](std::uint32_t v) {
    char buf[8];
    int n = 0;
    do {
      buf[n++] = hex[v & 15];
      v >>= 4;
    } while (v);
    while (n) out.push_back(buf[--n]);
  };
  half(static_cast<std::uint32_t>(l.value >> 32));
  out.push_back('/');
  half(static_cast<std::uint32_t>(l.value));
}

bool is_special_float(std::string_view v) { return v == "NaN" || v == "Infinity" || v == "-Infinity"; }

bool is_integer_type(std::uint32_t t) { return t == oid::int2 || t == oid::int4 || t == oid::int8 || t == oid::oid; }
bool is_float_type(std::uint32_t t) { return t == oid::float4 || t == oid::float8; }

/// "\x0a0b" (bytea_output=hex) -> raw bytes; false if not in that form.
bool bytea_from_hex(std::string_view v, std::string& out) {
  if (v.size() < 2 || v[0] != '\\' || v[1] != 'x' || v.size() % 2 != 0) return false;
  out.clear();
  out.reserve((v.size() - 2) / 2);
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 2; i < v.size(); i += 2) {
    int hi = nib(v[i]), lo = nib(v[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

std::string qualified_table(const pg::cached_relation& r) { return r.nspname + "." + r.relname; }

// A value mapping: how one column value becomes JSON in a format.
using value_fn = void (*)(std::string& out, std::uint32_t type, std::int32_t typmod, std::string_view v,
                          const encoder_options& o);

/// Arrays: parsed and re-emitted element by element with the same value mapping. A literal that
/// does not parse is emitted as a string.
struct array_emitter final : array_visitor {
  std::string& out;
  value_fn element_fn;
  std::uint32_t element_type;
  const encoder_options& opts;
  std::vector<bool> first{};
  array_emitter(std::string& o, value_fn f, std::uint32_t t, const encoder_options& op)
      : out(o), element_fn(f), element_type(t), opts(op) {}
  void sep() {
    if (first.empty()) return;
    if (!first.back()) out.push_back(',');
    first.back() = false;
  }
  void begin_array() override {
    sep();
    out.push_back('[');
    first.push_back(true);
  }
  void end_array() override {
    out.push_back(']');
    first.pop_back();
  }
  void element(std::string_view v) override {
    sep();
    element_fn(out, element_type, -1, v, opts);
  }
  void null() override {
    sep();
    out += "null";
  }
};

struct array_validator final : array_visitor {
  void begin_array() override {}
  void end_array() override {}
  void element(std::string_view) override {}
  void null() override {}
};

bool append_array(std::string& out, std::uint32_t array_type, std::string_view v, value_fn f, const encoder_options& o) {
  std::uint32_t elem = array_element_type(array_type);
  if (elem == 0) return false;
  array_validator check;
  if (!parse_pg_array(v, array_delimiter(array_type), check)) return false;
  array_emitter e(out, f, elem, o);
  parse_pg_array(v, array_delimiter(array_type), e);
  return true;
}

// --- value mappings --------------------------------------------------------------------------

// native (walcast): bool -> boolean; int2/int4/oid, float4/float8 -> number; json/jsonb -> the
// value itself; int8/numeric -> string; everything else -> text form. Float NaN/±Infinity ->
// strings "NaN", "Infinity", "-Infinity".
void native_value(std::string& out, std::uint32_t t, std::int32_t, std::string_view v, const encoder_options&) {
  switch (t) {
    case oid::bool_: out += v == "t" ? "true" : "false"; return;
    case oid::int2: case oid::int4: case oid::oid: case oid::float4: case oid::float8:
      append_number_or_string(out, v);
      return;
    case oid::json: case oid::jsonb:
      // Not copied as it is: json keeps its input's line breaks (one would end an NDJSON line and
      // forge the next), and its numbers and nesting may be beyond what clients parse.
      append_json_value(out, v);
      return;
    default: append_json_string(out, v);
  }
}

// Shared by pgoutput2json and wal2json (which agree on scalars): numbers with every digit
// (NaN/±Infinity -> null), booleans, bytea as hex digits; false for anything else.
bool numeric_bool_bytea(std::string& out, std::uint32_t t, std::string_view v) {
  if (is_integer_type(t) || is_float_type(t) || t == oid::numeric) {
    if (is_json_number(v)) out.append(v);
    else out += "null";
    return true;
  }
  if (t == oid::bool_) {
    out += v == "t" ? "true" : "false";
    return true;
  }
  if (t == oid::bytea) {
    append_json_string(out, v.size() >= 2 && v[0] == '\\' && v[1] == 'x' ? v.substr(2) : v);
    return true;
  }
  return false;
}

// pgoutput2json: the scalars above; arrays of built-in types as JSON arrays; everything else text.
void p2j_value(std::string& out, std::uint32_t t, std::int32_t typmod, std::string_view v, const encoder_options& o) {
  if (numeric_bool_bytea(out, t, v)) return;
  if (array_element_type(t) && append_array(out, t, v, p2j_value, o)) return;
  append_json_string(out, v);
}

// waltail: JSON-native numbers (NaN/±Infinity as strings), booleans, json/jsonb nested; other
// types (timestamps, arrays...) in their text form.
void waltail_value(std::string& out, std::uint32_t t, std::int32_t, std::string_view v, const encoder_options&) {
  if (is_integer_type(t) || is_float_type(t) || t == oid::numeric) {
    append_number_or_string(out, v);
    return;
  }
  if (t == oid::bool_) {
    out += v == "t" ? "true" : "false";
    return;
  }
  if (t == oid::json || t == oid::jsonb) {
    append_json_value(out, v);   // (as native's: never copied as it is)
    return;
  }
  append_json_string(out, v);
}

// wal2json format-version 2 (checked against the real plugin): numbers unquoted, NaN/±Infinity
// null, booleans, bytea as hex digits, everything else (json included) as strings.
void wal2json_value(std::string& out, std::uint32_t t, std::int32_t, std::string_view v, const encoder_options&) {
  if (numeric_bool_bytea(out, t, v)) return;
  append_json_string(out, v);
}

// Debezium: see docs/api.md for the table.
void numeric_precise(std::string& out, std::int32_t typmod, std::string_view v) {
  // unscaled big-endian two's complement of the decimal digits
  bool neg = !v.empty() && v[0] == '-';
  std::string_view digits_part = neg ? v.substr(1) : v;
  auto dot = digits_part.find('.');
  std::string digits(digits_part.substr(0, dot));
  int scale = 0;
  if (dot != std::string_view::npos) {
    digits += digits_part.substr(dot + 1);
    scale = static_cast<int>(digits_part.size() - dot - 1);
  }
  // decimal string -> big-endian magnitude bytes (repeated division by 256)
  std::vector<unsigned char> mag;
  std::string num = digits;
  while (!num.empty() && !(num.size() == 1 && num[0] == '0')) {
    std::string q;
    int rem = 0;
    for (char c : num) {
      int cur = rem * 10 + (c - '0');
      if (!q.empty() || cur / 256) q.push_back(static_cast<char>('0' + cur / 256));
      rem = cur % 256;
    }
    mag.insert(mag.begin(), static_cast<unsigned char>(rem));
    num = q.empty() ? "0" : q;
  }
  if (mag.empty()) mag.push_back(0);
  if (mag[0] & 0x80) mag.insert(mag.begin(), 0);
  if (neg) {   // two's complement
    for (auto& b : mag) b = static_cast<unsigned char>(~b);
    for (std::size_t i = mag.size(); i-- > 0;)
      if (++mag[i] != 0) break;
    if (!(mag[0] & 0x80)) mag.insert(mag.begin(), 0xff);
  }
  std::string b64 = protocol::base64_encode({reinterpret_cast<const char*>(mag.data()), mag.size()});
  int p = 0, s = 0;
  if (numeric_typmod(typmod, p, s)) {
    // Fixed scale (in the schema): pad the unscaled value is not needed, PostgreSQL prints
    // exactly `s` decimals for numeric(p,s).
    append_json_string(out, b64);
  } else {
    out += "{\"scale\":";
    append_int(out, scale);
    out += ",\"value\":";
    append_json_string(out, b64);
    out += "}";
  }
}

void debezium_value(std::string& out, std::uint32_t t, std::int32_t typmod, std::string_view v, const encoder_options& o) {
  using tp = encoder_options::time_precision;
  const bool micros = o.time == tp::adaptive_time_microseconds;
  switch (t) {
    case oid::bool_: out += v == "t" ? "true" : "false"; return;
    case oid::int2: case oid::int4: case oid::int8: case oid::oid: case oid::float4: case oid::float8:
      append_number_or_string(out, v);
      return;
    case oid::numeric:
      if (is_special_float(v) || v == "-Infinity") {
        if (o.decimal == encoder_options::decimal_mode::precise) out += "null";
        else append_json_string(out, v);
        return;
      }
      if (o.decimal == encoder_options::decimal_mode::double_) append_number_or_string(out, v);
      else if (o.decimal == encoder_options::decimal_mode::precise) numeric_precise(out, typmod, v);
      else append_json_string(out, v);
      return;
    case oid::bytea: {
      std::string raw;
      if (bytea_from_hex(v, raw)) append_json_string(out, protocol::base64_encode(raw));
      else append_json_string(out, v);
      return;
    }
    case oid::date: {
      std::int64_t days = 0;
      if (temporal::parse_date(v, days)) append_int(out, days);
      else append_json_string(out, v);
      return;
    }
    case oid::time: {
      std::int64_t us = 0;
      if (temporal::parse_time(v, us)) append_int(out, micros ? us : us / 1000);
      else append_json_string(out, v);
      return;
    }
    case oid::timestamp: {
      std::int64_t us = 0;
      if (!temporal::parse_timestamp(v, us)) {
        append_json_string(out, v);
        return;
      }
      // adaptive: precision 0-3 -> milliseconds (Timestamp), 4-6 or unspecified -> microseconds
      bool as_micros = micros && (typmod < 0 || typmod > 3);
      append_int(out, as_micros ? us : (us >= 0 ? us / 1000 : -((-us + 999) / 1000)));
      return;
    }
    case oid::timestamptz: {
      std::int64_t us = 0;
      if (temporal::parse_timestamp(v, us)) append_json_string(out, temporal::iso8601(us));
      else append_json_string(out, v);
      return;
    }
    case oid::interval: {
      std::int64_t us = 0;
      if (temporal::parse_interval(v, us)) append_int(out, micros ? us : us / 1000);
      else append_json_string(out, v);
      return;
    }
    default:
      if (array_element_type(t) && append_array(out, t, v, debezium_value, o)) return;
      append_json_string(out, v);   // json/jsonb as a string, uuid, text, timetz, money, ...
  }
}

void append_column_value(std::string& out, const pg::cached_column& def, const pg::tuple_column& col, value_fn f,
                         std::string_view unchanged, const encoder_options& o) {
  switch (col.kind) {
    case pg::column_kind::null: out += "null"; return;
    case pg::column_kind::unchanged_toast: append_json_string(out, unchanged); return;
    case pg::column_kind::binary:
      // Binary tuples (binary = true) carry the server's internal representation; encoders need
      // text, so walgate streams in text mode. Emit base64 rather than guess.
      append_json_string(out, protocol::base64_encode(as_string_view(col.value)));
      return;
    case pg::column_kind::text: f(out, def.type_oid, def.type_modifier, as_string_view(col.value), o); return;
  }
}

/// {"col":value,...} for a tuple; keys_only: only the replica-identity columns.
void append_row(std::string& out, const pg::cached_relation& r, pg::tuple_view t, value_fn f, std::string_view unchanged,
                const encoder_options& o, bool keys_only = false) {
  out.push_back('{');
  bool first = true;
  for (std::size_t i = 0; i < t.size() && i < r.columns.size(); ++i) {
    if (keys_only && !r.columns[i].key) continue;
    if (!first) out.push_back(',');
    first = false;
    append_key(out, r.columns[i].name);
    append_column_value(out, r.columns[i], t[i], f, unchanged, o);
  }
  out.push_back('}');
}

/// [value,...] for a tuple (compact modes).
void append_values(std::string& out, const pg::cached_relation& r, pg::tuple_view t, value_fn f,
                   std::string_view unchanged, const encoder_options& o, bool keys_only = false) {
  out.push_back('[');
  bool first = true;
  for (std::size_t i = 0; i < t.size() && i < r.columns.size(); ++i) {
    if (keys_only && !r.columns[i].key) continue;
    if (!first) out.push_back(',');
    first = false;
    append_column_value(out, r.columns[i], t[i], f, unchanged, o);
  }
  out.push_back(']');
}

/// The "before" image a change carries: the old tuple when sent ('K' holds only key columns),
/// else none.
bool has_before(const change& c) { return c.before_kind != 0 && !c.before.empty(); }

/// ,"transactional":..,"prefix":..,"content":..} — a logical message's fields: wal2json's
/// content as text (invalid UTF-8 replaced by U+FFFD, as any string); native's as text when it is
/// valid UTF-8, else base64, and "content_encoding" saying which.
void append_message_fields(std::string& out, const pg::message& m, bool native) {
  out += ",\"transactional\":";
  out += m.transactional ? "true" : "false";
  out += ",\"prefix\":";
  append_json_string(out, m.prefix);
  out += ",\"content\":";
  const auto content = as_string_view(m.content);
  const bool text = !native || is_utf8(content);
  append_json_string(out, text ? std::string(content) : protocol::base64_encode(content));
  if (native) out += text ? ",\"content_encoding\":\"text\"" : ",\"content_encoding\":\"base64\"";
  out.push_back('}');
}

// --- native ----------------------------------------------------------------------------------

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

// --- wal2json --------------------------------------------------------------------------------

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

}  // namespace

bool encode_change(std::string& out, const change& c, format f, const encoder_options& o) {
  switch (f) {
    case format::native: encode_native(out, c, o); return true;
    case format::debezium: encode_debezium(out, c, o); return true;
    case format::pgoutput2json: return encode_pgoutput2json(out, c, o);
    case format::waltail: return encode_waltail(out, c, o);
    case format::wal2json: encode_wal2json(out, c, o); return true;
  }
  return false;
}

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
