// The formats' names, event ids, Waltail's UUIDv5, and encode_change, which hands each change to
// its format's encoder (format_<name>.cpp, over the value mappings and row writers of
// format_values.cpp). The transaction records and keys are in format_records.cpp.
#include "walgate/transform/formats.hpp"

#include "walgate/transform/temporal.hpp"

#include "format_values.hpp"
#include "sha1.hpp"

#include <optional>
#include <string>

namespace walgate::transform {

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

bool encode_change(std::string& out, const change& c, format f, const encoder_options& o) {
  switch (f) {
    case format::native: detail::encode_native(out, c, o); return true;
    case format::debezium: detail::encode_debezium(out, c, o); return true;
    case format::pgoutput2json: return detail::encode_pgoutput2json(out, c, o);
    case format::waltail: return detail::encode_waltail(out, c, o);
    case format::wal2json: detail::encode_wal2json(out, c, o); return true;
  }
  return false;
}

}  // namespace walgate::transform
