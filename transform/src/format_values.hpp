// Internal to walgate_transform (under src/, not installed): what the five encoders
// (format_<name>.cpp) and the transaction records and keys (format_records.cpp) share — the value
// mappings and the row writers they plug into (format_values.cpp) — and the encoders themselves.
#pragma once

#include "walgate/transform/formats.hpp"

#include "walgate/protocol/base64.hpp"
#include "walgate/transform/json.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace walgate::transform {

namespace pg = protocol::pgoutput;
using protocol::as_string_view;

namespace detail {

// --- small shared pieces (inline: called for every event or every value) ----------------------

inline void append_lsn(std::string& out, protocol::lsn l) {
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

inline std::string qualified_table(const pg::cached_relation& r) { return r.nspname + "." + r.relname; }

// A value mapping: how one column value becomes JSON in a format.
using value_fn = void (*)(std::string& out, std::uint32_t type, std::int32_t typmod, std::string_view v,
                          const encoder_options& o);

// --- value mappings (format_values.cpp, where each is described; docs/api.md has the tables) --

/// native (walcast): booleans, small numbers and json/jsonb as JSON; everything else as text.
void native_value(std::string& out, std::uint32_t t, std::int32_t, std::string_view v, const encoder_options&);
/// pgoutput2json: numbers with every digit, booleans, bytea as hex, arrays as JSON arrays.
void p2j_value(std::string& out, std::uint32_t t, std::int32_t typmod, std::string_view v, const encoder_options& o);
/// waltail: numbers, booleans and json/jsonb as JSON; everything else as text.
void waltail_value(std::string& out, std::uint32_t t, std::int32_t, std::string_view v, const encoder_options&);
/// wal2json format-version 2: numbers, booleans, bytea as hex; everything else a string.
void wal2json_value(std::string& out, std::uint32_t t, std::int32_t, std::string_view v, const encoder_options&);
/// Debezium (decimal and time modes from the options).
void debezium_value(std::string& out, std::uint32_t t, std::int32_t typmod, std::string_view v, const encoder_options& o);

// --- row writers (format_values.cpp; append_column_value, called per value, here inline) ------

inline void append_column_value(std::string& out, const pg::cached_column& def, const pg::tuple_column& col, value_fn f,
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
                const encoder_options& o, bool keys_only = false);

/// [value,...] for a tuple (compact modes).
void append_values(std::string& out, const pg::cached_relation& r, pg::tuple_view t, value_fn f,
                   std::string_view unchanged, const encoder_options& o, bool keys_only = false);

/// The "before" image a change carries: the old tuple when sent ('K' holds only key columns),
/// else none.
inline bool has_before(const change& c) { return c.before_kind != 0 && !c.before.empty(); }

/// ,"transactional":..,"prefix":..,"content":..} — a logical message's fields: wal2json's
/// content as text (invalid UTF-8 replaced by U+FFFD, as any string); native's as text when it is
/// valid UTF-8, else base64, and "content_encoding" saying which.
void append_message_fields(std::string& out, const pg::message& m, bool native);

// --- the encoders (format_<name>.cpp), which encode_change (formats.cpp) dispatches to --------

void encode_native(std::string& out, const change& c, const encoder_options& o);
void encode_debezium(std::string& out, const change& c, const encoder_options& o);
/// false (nothing appended) for a truncate or message, which PgOutput2Json has not.
bool encode_pgoutput2json(std::string& out, const change& c, const encoder_options& o);
/// false (nothing appended) for a truncate or message, which Waltail has not.
bool encode_waltail(std::string& out, const change& c, const encoder_options& o);
void encode_wal2json(std::string& out, const change& c, const encoder_options& o);

}  // namespace detail
}  // namespace walgate::transform
