// WAL positions (Int64 on the wire, "X/Y" in hex as text) and PostgreSQL timestamps
// (Int64 microseconds since 2000-01-01 00:00:00 UTC).
#pragma once

#include <chrono>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace walgate::protocol {

struct lsn {
  std::uint64_t value = 0;

  constexpr lsn() = default;
  constexpr explicit lsn(std::uint64_t v) : value(v) {}
  constexpr auto operator<=>(const lsn&) const = default;
  constexpr bool valid() const { return value != 0; }  // InvalidXLogRecPtr is 0

  /// "X/Y": upper and lower 32 bits in upper-case hex, as PostgreSQL prints them.
  std::string to_string() const;
  /// Parses "X/Y" (1-8 hex digits each side); nullopt on anything else.
  static std::optional<lsn> parse(std::string_view text);
};

/// Microseconds between the Unix epoch and the PostgreSQL epoch (2000-01-01).
inline constexpr std::int64_t pg_epoch_offset_us = 946'684'800'000'000;

// Saturating: a timestamp from the wire can be any Int64 (PostgreSQL's own stay far inside).
inline std::int64_t unix_us_to_pg(std::int64_t unix_us) {
  std::int64_t r;
  return __builtin_sub_overflow(unix_us, pg_epoch_offset_us, &r) ? INT64_MIN : r;
}
inline std::int64_t pg_us_to_unix(std::int64_t pg_us) {
  std::int64_t r;
  return __builtin_add_overflow(pg_us, pg_epoch_offset_us, &r) ? INT64_MAX : r;
}

/// The current time in PostgreSQL-epoch microseconds, for the client clock of a status update.
inline std::int64_t pg_now_us() {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::system_clock::now().time_since_epoch())
                .count();
  return unix_us_to_pg(us);
}

}  // namespace walgate::protocol
