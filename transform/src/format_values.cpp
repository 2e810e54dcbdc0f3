// The value mappings, one per format (native_value to debezium_value, with the array writer they
// share), and the row writers they plug into: what format_values.hpp declares for the encoders.
#include "format_values.hpp"

#include "walgate/transform/pg_array.hpp"
#include "walgate/transform/pg_types.hpp"
#include "walgate/transform/temporal.hpp"

#include <string>
#include <vector>

namespace walgate::transform::detail {

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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
namespace {

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

}  // namespace

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

// --- row writers -------------------------------------------------------------------------------
// (append_column_value, called per value, is inline in format_values.hpp; has_before too.)

/// {"col":value,...} for a tuple; keys_only: only the replica-identity columns.
void append_row(std::string& out, const pg::cached_relation& r, pg::tuple_view t, value_fn f, std::string_view unchanged,
                const encoder_options& o, bool keys_only) {
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
                   std::string_view unchanged, const encoder_options& o, bool keys_only) {
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

}  // namespace walgate::transform::detail
