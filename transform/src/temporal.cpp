#include "walgate/transform/temporal.hpp"

#include <cmath>
#include <cstdio>

namespace walgate::transform::temporal {

namespace {
bool digits(std::string_view s, std::size_t& i, std::size_t min, std::size_t max, std::int64_t& out) {
  std::size_t start = i;
  out = 0;
  while (i < s.size() && i - start < max && s[i] >= '0' && s[i] <= '9') out = out * 10 + (s[i++] - '0');
  return i - start >= min;
}
bool expect(std::string_view s, std::size_t& i, char c) {
  if (i < s.size() && s[i] == c) {
    ++i;
    return true;
  }
  return false;
}
constexpr std::int64_t us_per_day = 86'400'000'000LL;
}  // namespace

// Howard Hinnant's days_from_civil.
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

namespace {
// Y-M-D with 4+ digit year; BC handled by the caller.
bool parse_ymd(std::string_view s, std::size_t& i, std::int64_t& y, std::int64_t& m, std::int64_t& d) {
  return digits(s, i, 4, 9, y) && expect(s, i, '-') && digits(s, i, 2, 2, m) && expect(s, i, '-') &&
         digits(s, i, 2, 2, d) && m >= 1 && m <= 12 && d >= 1 && d <= 31;
}
bool parse_hms(std::string_view s, std::size_t& i, std::int64_t& us) {
  std::int64_t h = 0, mi = 0, se = 0, frac = 0;
  if (!(digits(s, i, 2, 2, h) && expect(s, i, ':') && digits(s, i, 2, 2, mi) && expect(s, i, ':') &&
        digits(s, i, 2, 2, se)))
    return false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    std::size_t start = i;
    if (!digits(s, i, 1, 6, frac)) return false;
    for (std::size_t k = i - start; k < 6; ++k) frac *= 10;
  }
  if (h > 24 || mi > 59 || se > 60) return false;
  us = ((h * 60 + mi) * 60 + se) * 1'000'000 + frac;
  return true;
}
bool bc_suffix(std::string_view s, std::size_t& i, bool& bc) {
  bc = false;
  if (s.substr(i) == " BC") {
    bc = true;
    i = s.size();
  }
  return true;
}
}  // namespace

bool parse_date(std::string_view s, std::int64_t& days) {
  std::size_t i = 0;
  std::int64_t y = 0, m = 0, d = 0;
  bool bc = false;
  if (!parse_ymd(s, i, y, m, d) || !bc_suffix(s, i, bc) || i != s.size()) return false;
  if (bc) y = 1 - y;   // 1 BC is year 0
  days = days_from_civil(y, static_cast<unsigned>(m), static_cast<unsigned>(d));
  return true;
}

bool parse_time(std::string_view s, std::int64_t& us) {
  std::size_t i = 0;
  return parse_hms(s, i, us) && i == s.size();
}

bool parse_timestamp(std::string_view s, std::int64_t& us) {
  std::size_t i = 0;
  std::int64_t y = 0, m = 0, d = 0, t = 0;
  if (!parse_ymd(s, i, y, m, d) || !expect(s, i, ' ') || !parse_hms(s, i, t)) return false;
  std::int64_t offset_s = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    int sign = s[i++] == '-' ? -1 : 1;
    std::int64_t oh = 0, om = 0, os = 0;
    if (!digits(s, i, 2, 2, oh)) return false;
    if (expect(s, i, ':') && !digits(s, i, 2, 2, om)) return false;
    if (expect(s, i, ':') && !digits(s, i, 2, 2, os)) return false;
    offset_s = sign * (oh * 3600 + om * 60 + os);
  }
  bool bc = false;
  bc_suffix(s, i, bc);
  if (i != s.size()) return false;
  if (bc) y = 1 - y;
  // PostgreSQL's timestamps end in year 294276; a year beyond what 64-bit microseconds hold is
  // not a value the server sends, and is left as text rather than wrapped around.
  const std::int64_t days = days_from_civil(y, static_cast<unsigned>(m), static_cast<unsigned>(d));
  std::int64_t day_us = 0;
  if (__builtin_mul_overflow(days, us_per_day, &day_us) || __builtin_add_overflow(day_us, t, &day_us) ||
      __builtin_sub_overflow(day_us, offset_s * 1'000'000, &us))
    return false;
  return true;
}

bool parse_interval(std::string_view s, std::int64_t& us) {
  // Sequence of "N unit" items (year(s), mon(s), day(s)) and at most one [+-]HH:MM:SS[.f] part.
  std::size_t i = 0;
  long double months = 0, days = 0, time_us = 0;
  bool any = false;
  while (i < s.size()) {
    if (s[i] == ' ') {
      ++i;
      continue;
    }
    int sign = 1;
    std::size_t start = i;
    if (s[i] == '+' || s[i] == '-') sign = s[i++] == '-' ? -1 : 1;
    std::size_t after_sign = i;
    std::int64_t n = 0;
    if (!digits(s, i, 1, 18, n)) return false;
    if (i < s.size() && s[i] == ':') {
      i = after_sign;
      std::int64_t t = 0;
      // hours may exceed two digits in intervals
      std::int64_t h = 0, mi = 0, se = 0, frac = 0;
      // (at most 2,562,047,788 hours fit in the server's 64-bit microseconds: 10 digits)
      if (!(digits(s, i, 1, 10, h) && expect(s, i, ':') && digits(s, i, 2, 2, mi) && expect(s, i, ':') &&
            digits(s, i, 2, 2, se) && h <= 2'562'047'788))
        return false;
      if (i < s.size() && s[i] == '.') {
        ++i;
        std::size_t fs = i;
        if (!digits(s, i, 1, 6, frac)) return false;
        for (std::size_t k = i - fs; k < 6; ++k) frac *= 10;
      }
      t = ((h * 60 + mi) * 60 + se) * 1'000'000 + frac;
      time_us += sign * static_cast<long double>(t);
      any = true;
      (void)start;
      continue;
    }
    if (!expect(s, i, ' ')) return false;
    std::size_t unit_start = i;
    while (i < s.size() && s[i] >= 'a' && s[i] <= 'z') ++i;
    std::string_view unit = s.substr(unit_start, i - unit_start);
    if (unit == "year" || unit == "years") months += sign * 12.0L * n;
    else if (unit == "mon" || unit == "mons") months += sign * static_cast<long double>(n);
    else if (unit == "day" || unit == "days") days += sign * static_cast<long double>(n);
    else return false;
    any = true;
  }
  if (!any) return false;
  long double total = (months * 30.4375L + days) * 86'400'000'000.0L + time_us;
  // Months and days are 32-bit on the server, so an interval can exceed 64-bit microseconds once
  // a month counts 30.4375 days: such a value stays text rather than wrapping around.
  if (!(total >= -9223372036854775807.0L && total <= 9223372036854775807.0L)) return false;
  us = static_cast<std::int64_t>(std::llround(total));
  return true;
}

std::string iso8601(std::int64_t unix_us) {
  std::string out;
  append_iso8601(out, unix_us);
  return out;
}

void append_iso8601(std::string& out, std::int64_t unix_us) {
  std::int64_t days = unix_us / us_per_day, rem = unix_us % us_per_day;
  if (rem < 0) {
    rem += us_per_day;
    --days;
  }
  // civil_from_days
  std::int64_t z = days + 719468;
  const std::int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const auto doe = static_cast<unsigned>(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  std::int64_t y = static_cast<std::int64_t>(yoe) + era * 400;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  const unsigned d = doy - (153 * mp + 2) / 5 + 1;
  const unsigned m = mp < 10 ? mp + 3 : mp - 9;
  y += m <= 2;
  std::int64_t secs = rem / 1'000'000, frac = rem % 1'000'000;
  auto put = [&](std::int64_t v, int width) {
    char buf[24];
    int n = 0;
    bool neg = v < 0;
    std::uint64_t u = neg ? static_cast<std::uint64_t>(-v) : static_cast<std::uint64_t>(v);
    do {
      buf[n++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u);
    while (n < width) buf[n++] = '0';
    if (neg) out.push_back('-');
    while (n) out.push_back(buf[--n]);
  };
  put(y, 4);
  out.push_back('-');
  put(m, 2);
  out.push_back('-');
  put(d, 2);
  out.push_back('T');
  put(secs / 3600, 2);
  out.push_back(':');
  put(secs / 60 % 60, 2);
  out.push_back(':');
  put(secs % 60, 2);
  out.push_back('.');
  put(frac, 6);
  out.push_back('Z');
}

}  // namespace walgate::transform::temporal
