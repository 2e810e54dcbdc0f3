// Appending JSON to a byte string, fast and always valid: strings are escaped for every byte
// sequence PostgreSQL can send (control characters as \u00XX; bytes that are not valid UTF-8,
// possible in a SQL_ASCII database, become U+FFFD), numbers are copied only after they were
// checked to be JSON numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace walgate::transform {

/// Appends s as a JSON string literal (with the quotes).
void append_json_string(std::string& out, std::string_view s);
/// True when s is valid UTF-8 (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF).
bool is_utf8(std::string_view s);

/// True if s is a JSON number (RFC 8259: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?) whose
/// exponent has at most 4 digits (what any JSON parser reads without overflow).
bool is_json_number(std::string_view s);

/// Nesting a json/jsonb value may have to go out as JSON (beyond: as a string).
inline constexpr std::size_t json_max_depth = 128;

/// Appends the text of a json or jsonb value as JSON, always one line of valid JSON whatever the
/// text holds: checked token by token (RFC 8259; numbers as is_json_number, at most
/// json_max_depth levels of nesting) and copied with its line breaks between tokens dropped (json
/// keeps its input's, raw newlines included: copied verbatim they would end an NDJSON line or an
/// SSE event). Text that breaks a rule goes out as a JSON string of it instead; false then.
bool append_json_value(std::string& out, std::string_view text);

/// Appends s as a number if it is a JSON number, else as a string.
void append_number_or_string(std::string& out, std::string_view s);

inline void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  char* p = buf + sizeof buf;
  do {
    *--p = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  out.append(p, static_cast<std::size_t>(buf + sizeof buf - p));
}

inline void append_int(std::string& out, std::int64_t v) {
  if (v < 0) {
    out.push_back('-');
    append_uint(out, static_cast<std::uint64_t>(0) - static_cast<std::uint64_t>(v));
  } else {
    append_uint(out, static_cast<std::uint64_t>(v));
  }
}

/// Appends a JSON object key: "name":
inline void append_key(std::string& out, std::string_view name) {
  append_json_string(out, name);
  out.push_back(':');
}

}  // namespace walgate::transform
