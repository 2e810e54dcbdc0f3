#include "walgate/transform/temporal.hpp"

#include <doctest/doctest.h>

using namespace walgate::transform::temporal;

TEST_CASE("dates, times, timestamps and intervals from PostgreSQL's ISO output") {
  std::int64_t v = 0;
  CHECK(parse_date("1970-01-01", v));
  CHECK(v == 0);
  CHECK(parse_date("2026-11-30", v));
  CHECK(v == 20787);
  CHECK(parse_date("0001-01-01 BC", v));   // year 0
  CHECK(v == -719528);
  CHECK(parse_date("0044-03-15 BC", v));
  CHECK(v == -735160);
  CHECK_FALSE(parse_date("infinity", v));
  CHECK(parse_time("24:00:00", v));
  CHECK(v == 86400000000LL);
  CHECK(parse_time("10:15:30.5", v));
  CHECK(v == 36930500000LL);
  CHECK(parse_timestamp("2025-09-09 06:00:00", v));
  CHECK(v == 1757397600000000LL);
  CHECK(parse_timestamp("2025-09-09 06:00:00.123456+00", v));
  CHECK(v == 1757397600123456LL);
  CHECK(parse_timestamp("2025-09-09 08:00:00+02", v));
  CHECK(v == 1757397600000000LL);
  CHECK(parse_timestamp("1969-12-31 23:59:59.999999", v));
  CHECK(v == -1);
  CHECK(iso8601(1757397600123456LL) == "2025-09-09T06:00:00.123456Z");
  CHECK(iso8601(-1) == "1969-12-31T23:59:59.999999Z");
  CHECK(parse_interval("1 day 02:00:00", v));
  CHECK(v == (24 + 2) * 3600000000LL);
  CHECK(parse_interval("-1 days +00:00:01", v));
  CHECK(v == -86400000000LL + 1000000);
  CHECK(parse_interval("1 mon", v));
  CHECK(v == 2629800000000LL);   // 30.4375 days
  CHECK(parse_interval("1 year 2 mons 3 days -04:05:06.5", v));
  CHECK_FALSE(parse_interval("forever", v));
}

TEST_CASE("values past 64-bit microseconds stay text instead of wrapping around") {
  std::int64_t v = 0;
  // Found by the json_values fuzz target: a nine-digit year overflowed the microsecond count.
  CHECK_FALSE(parse_timestamp("2021025-09-09 10:20:00.1236", v));
  CHECK_FALSE(parse_timestamp("999999999-12-31 23:59:59", v));
  // PostgreSQL's timestamps count from 2000, so its last ones do not fit Unix-epoch microseconds.
  CHECK_FALSE(parse_timestamp("294276-12-31 23:59:59.999999", v));
  CHECK(parse_timestamp("294247-01-10 04:00:54.775807", v));   // the last that does
  CHECK(v == 9223372036854775807LL);
  CHECK_FALSE(parse_timestamp("294247-01-10 04:00:54.775808", v));
  CHECK(parse_timestamp("4714-11-24 00:00:00 BC", v));          // PostgreSQL's first timestamp
  CHECK(v == -210866803200000000LL);   // Julian day 0
  CHECK(parse_date("5874897-12-31", v));                          // and its last date
  CHECK(v == 2145042905LL);
  // 32-bit months at 30.4375 days each go past 64-bit microseconds.
  CHECK_FALSE(parse_interval("178956970 years 7 mons", v));
  CHECK_FALSE(parse_interval("9999999999:00:00", v));
  CHECK(parse_interval("2562047788:00:54.775807", v));           // the largest time part
  CHECK(v == 9223372036854775807LL);
  CHECK(parse_interval("-2562047788:00:54.775807", v));
  CHECK(v == -9223372036854775807LL);
}
