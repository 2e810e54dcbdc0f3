// Parsing PostgreSQL's ISO text output of dates and times (DateStyle=ISO, TimeZone=UTC, which
// walgate's connection sets) into numbers, for formats that want epoch-based values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace walgate::transform::temporal {

/// Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (y may be <= 0).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d);

/// "2026-11-30" or "0044-03-15 BC" -> days since 1970-01-01. False on anything else
/// (including "infinity").
bool parse_date(std::string_view s, std::int64_t& days);
/// "HH:MM:SS[.ffffff]" -> microseconds since midnight (24:00:00 allowed).
bool parse_time(std::string_view s, std::int64_t& us);
/// "YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]][ BC]" -> microseconds since the Unix epoch (UTC).
bool parse_timestamp(std::string_view s, std::int64_t& us);
/// IntervalStyle=postgres ("1 year 2 mons -3 days +04:05:06.5") -> microseconds, counting a
/// month as 30.4375 days as Debezium's MicroDuration does.
bool parse_interval(std::string_view s, std::int64_t& us);

/// "YYYY-MM-DDTHH:MM:SS.ffffffZ" for microseconds since the Unix epoch.
std::string iso8601(std::int64_t unix_us);
void append_iso8601(std::string& out, std::int64_t unix_us);

}  // namespace walgate::transform::temporal
