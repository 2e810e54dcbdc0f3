#include "../../transform/src/temporal.hpp"

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
