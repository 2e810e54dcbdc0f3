// The values every type test inserts: each built-in type the type issue lists (and an enum, a
// domain, a composite and arrays), as SQL, with its exact JSON in each format. The enum,
// domain and composite types are made by case_types_sql.
#pragma once

#include <boost/json/stream_parser.hpp>

#include <string>

namespace walgate::test {

struct column_case {
  const char* name;
  const char* type;
  const char* value;   // SQL expression
  // Expected raw JSON of the value in: native, debezium, pgoutput2json, waltail, wal2json.
  const char* native;
  const char* debezium;
  const char* p2j;
  const char* waltail;
  const char* wal2json;
};

// clang-format off
inline const column_case cases[] = {
  {"i2min", "smallint", "-32768", "-32768", "-32768", "-32768", "-32768", "-32768"},
  {"i4max", "integer", "2147483647", "2147483647", "2147483647", "2147483647", "2147483647", "2147483647"},
  {"i8max", "bigint", "9223372036854775807", "\"9223372036854775807\"", "9223372036854775807", "9223372036854775807", "9223372036854775807", "9223372036854775807"},
  {"i8min", "bigint", "-9223372036854775808", "\"-9223372036854775808\"", "-9223372036854775808", "-9223372036854775808", "-9223372036854775808", "-9223372036854775808"},
  {"num_huge", "numeric", "123456789012345678901234567890.123456789012345678901234567890", "\"123456789012345678901234567890.123456789012345678901234567890\"", "\"123456789012345678901234567890.123456789012345678901234567890\"", "123456789012345678901234567890.123456789012345678901234567890", "123456789012345678901234567890.123456789012345678901234567890", "123456789012345678901234567890.123456789012345678901234567890"},
  {"num_scale", "numeric(12,2)", "-149.5", "\"-149.50\"", "\"-149.50\"", "-149.50", "-149.50", "-149.50"},
  {"num_nan", "numeric", "'NaN'", "\"NaN\"", "\"NaN\"", "null", "\"NaN\"", "null"},
  {"num_inf", "numeric", "'-Infinity'", "\"-Infinity\"", "\"-Infinity\"", "null", "\"-Infinity\"", "null"},
  {"f4", "real", "3.4028235e38", "3.4028235e+38", "3.4028235e+38", "3.4028235e+38", "3.4028235e+38", "3.4028235e+38"},
  {"f8", "double precision", "0.1", "0.1", "0.1", "0.1", "0.1", "0.1"},
  {"f8_nan", "double precision", "'NaN'", "\"NaN\"", "\"NaN\"", "null", "\"NaN\"", "null"},
  {"f8_inf", "double precision", "'Infinity'", "\"Infinity\"", "\"Infinity\"", "null", "\"Infinity\"", "null"},
  {"b", "boolean", "true", "true", "true", "true", "true", "true"},
  {"txt", "text", "E'q\"uote \\\\ back\\nnl\\ttab\\x01 \U0001F600'", "\"q\\\"uote \\\\ back\\nnl\\ttab\\u0001 \U0001F600\"", "\"q\\\"uote \\\\ back\\nnl\\ttab\\u0001 \U0001F600\"", "\"q\\\"uote \\\\ back\\nnl\\ttab\\u0001 \U0001F600\"", "\"q\\\"uote \\\\ back\\nnl\\ttab\\u0001 \U0001F600\"", "\"q\\\"uote \\\\ back\\nnl\\ttab\\u0001 \U0001F600\""},
  {"vc", "varchar(20)", "'abc'", "\"abc\"", "\"abc\"", "\"abc\"", "\"abc\"", "\"abc\""},
  {"bin", "bytea", "'\\xdeadbeef'", "\"\\\\xdeadbeef\"", "\"3q2+7w==\"", "\"deadbeef\"", "\"\\\\xdeadbeef\"", "\"deadbeef\""},
  {"js", "json", "'{\"a\": [1, {\"b\": null}], \"c\": \"\\u00e9\"}'", "{\"a\": [1, {\"b\": null}], \"c\": \"\\u00e9\"}", "\"{\\\"a\\\": [1, {\\\"b\\\": null}], \\\"c\\\": \\\"\\\\u00e9\\\"}\"", "\"{\\\"a\\\": [1, {\\\"b\\\": null}], \\\"c\\\": \\\"\\\\u00e9\\\"}\"", "{\"a\": [1, {\"b\": null}], \"c\": \"\\u00e9\"}", "\"{\\\"a\\\": [1, {\\\"b\\\": null}], \\\"c\\\": \\\"\\\\u00e9\\\"}\""},
  {"jsb", "jsonb", "'{\"z\": {\"y\": [true, 1.50]}}'", "{\"z\": {\"y\": [true, 1.50]}}", "\"{\\\"z\\\": {\\\"y\\\": [true, 1.50]}}\"", "\"{\\\"z\\\": {\\\"y\\\": [true, 1.50]}}\"", "{\"z\": {\"y\": [true, 1.50]}}", "\"{\\\"z\\\": {\\\"y\\\": [true, 1.50]}}\""},
  {"u", "uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "\"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\"", "\"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\"", "\"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\"", "\"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\"", "\"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\""},
  {"d", "date", "'2026-11-30'", "\"2026-11-30\"", "20787", "\"2026-11-30\"", "\"2026-11-30\"", "\"2026-11-30\""},
  {"d_bc", "date", "'0044-03-15 BC'", "\"0044-03-15 BC\"", "-735160", "\"0044-03-15 BC\"", "\"0044-03-15 BC\"", "\"0044-03-15 BC\""},
  {"d_inf", "date", "'infinity'", "\"infinity\"", "\"infinity\"", "\"infinity\"", "\"infinity\"", "\"infinity\""},
  {"tm", "time", "'10:15:30.123456'", "\"10:15:30.123456\"", "36930123456", "\"10:15:30.123456\"", "\"10:15:30.123456\"", "\"10:15:30.123456\""},
  {"ttz", "timetz", "'10:15:30+02'", "\"10:15:30+02\"", "\"10:15:30+02\"", "\"10:15:30+02\"", "\"10:15:30+02\"", "\"10:15:30+02\""},
  {"ts", "timestamp", "'2025-09-09 10:20:00.123456'", "\"2025-09-09 10:20:00.123456\"", "1757413200123456", "\"2025-09-09 10:20:00.123456\"", "\"2025-09-09 10:20:00.123456\"", "\"2025-09-09 10:20:00.123456\""},
  {"ts3", "timestamp(3)", "'2025-09-09 10:20:00.123'", "\"2025-09-09 10:20:00.123\"", "1757413200123", "\"2025-09-09 10:20:00.123\"", "\"2025-09-09 10:20:00.123\"", "\"2025-09-09 10:20:00.123\""},
  {"tstz", "timestamptz", "'2025-09-09 12:20:00.5+02'", "\"2025-09-09 10:20:00.5+00\"", "\"2025-09-09T10:20:00.500000Z\"", "\"2025-09-09 10:20:00.5+00\"", "\"2025-09-09 10:20:00.5+00\"", "\"2025-09-09 10:20:00.5+00\""},
  {"tstz_inf", "timestamptz", "'-infinity'", "\"-infinity\"", "\"-infinity\"", "\"-infinity\"", "\"-infinity\"", "\"-infinity\""},
  {"ts_bc", "timestamp", "'0001-01-01 00:00:00 BC'", "\"0001-01-01 00:00:00 BC\"", "-62167219200000000", "\"0001-01-01 00:00:00 BC\"", "\"0001-01-01 00:00:00 BC\"", "\"0001-01-01 00:00:00 BC\""},
  {"iv", "interval", "'1 year 2 months -3 days 04:05:06.5'", "\"1 year 2 mons -3 days +04:05:06.5\"", "36572706500000", "\"1 year 2 mons -3 days +04:05:06.5\"", "\"1 year 2 mons -3 days +04:05:06.5\"", "\"1 year 2 mons -3 days +04:05:06.5\""},
  {"ip", "inet", "'192.168.0.1/24'", "\"192.168.0.1/24\"", "\"192.168.0.1/24\"", "\"192.168.0.1/24\"", "\"192.168.0.1/24\"", "\"192.168.0.1/24\""},
  {"net", "cidr", "'10.0.0.0/8'", "\"10.0.0.0/8\"", "\"10.0.0.0/8\"", "\"10.0.0.0/8\"", "\"10.0.0.0/8\"", "\"10.0.0.0/8\""},
  {"mac", "macaddr", "'08:00:2b:01:02:03'", "\"08:00:2b:01:02:03\"", "\"08:00:2b:01:02:03\"", "\"08:00:2b:01:02:03\"", "\"08:00:2b:01:02:03\"", "\"08:00:2b:01:02:03\""},
  {"m", "money", "1234.56", "\"$1,234.56\"", "\"$1,234.56\"", "\"$1,234.56\"", "\"$1,234.56\"", "\"$1,234.56\""},
  {"bt", "bit(4)", "B'1010'", "\"1010\"", "\"1010\"", "\"1010\"", "\"1010\"", "\"1010\""},
  {"vb", "varbit", "B'101'", "\"101\"", "\"101\"", "\"101\"", "\"101\"", "\"101\""},
  {"a1", "text[]", "ARRAY['a b', NULL, 'c\"d', 'NULL']", "\"{\\\"a b\\\",NULL,\\\"c\\\\\\\"d\\\",\\\"NULL\\\"}\"", "[\"a b\",null,\"c\\\"d\",\"NULL\"]", "[\"a b\",null,\"c\\\"d\",\"NULL\"]", "\"{\\\"a b\\\",NULL,\\\"c\\\\\\\"d\\\",\\\"NULL\\\"}\"", "\"{\\\"a b\\\",NULL,\\\"c\\\\\\\"d\\\",\\\"NULL\\\"}\""},
  {"a2", "integer[]", "'{{1,2},{3,NULL}}'", "\"{{1,2},{3,NULL}}\"", "[[1,2],[3,null]]", "[[1,2],[3,null]]", "\"{{1,2},{3,NULL}}\"", "\"{{1,2},{3,NULL}}\""},
  {"mood", "t_mood", "'happy'", "\"happy\"", "\"happy\"", "\"happy\"", "\"happy\"", "\"happy\""},
  {"moods", "t_mood[]", "'{sad,happy}'", "\"{sad,happy}\"", "\"{sad,happy}\"", "\"{sad,happy}\"", "\"{sad,happy}\"", "\"{sad,happy}\""},
  {"dom", "t_positive", "5", "\"5\"", "\"5\"", "\"5\"", "\"5\"", "\"5\""},
  {"comp", "t_pair", "ROW(1, 'x y')", "\"(1,\\\"x y\\\")\"", "\"(1,\\\"x y\\\")\"", "\"(1,\\\"x y\\\")\"", "\"(1,\\\"x y\\\")\"", "\"(1,\\\"x y\\\")\""},
  {"rng", "int4range", "'[1,10)'", "\"[1,10)\"", "\"[1,10)\"", "\"[1,10)\"", "\"[1,10)\"", "\"[1,10)\""},
  {"tsv", "tsvector", "'a fat cat'", "\"'a' 'cat' 'fat'\"", "\"'a' 'cat' 'fat'\"", "\"'a' 'cat' 'fat'\"", "\"'a' 'cat' 'fat'\"", "\"'a' 'cat' 'fat'\""},
  {"x", "xml", "'<a>b</a>'", "\"<a>b</a>\"", "\"<a>b</a>\"", "\"<a>b</a>\"", "\"<a>b</a>\"", "\"<a>b</a>\""},
  {"pt", "point", "'(1.5,2)'", "\"(1.5,2)\"", "\"(1.5,2)\"", "\"(1.5,2)\"", "\"(1.5,2)\"", "\"(1.5,2)\""},
  {"nul", "text", "NULL", "null", "null", "null", "null", "null"},
};
// clang-format on

/// CREATE TYPE/DOMAIN statements for the cases' own types (t_mood, t_positive, t_pair); each
/// test that uses them runs it, so each is made unless it exists.
inline const char* case_types_sql =
    "DO $$ BEGIN CREATE TYPE t_mood AS ENUM ('sad', 'happy'); EXCEPTION WHEN duplicate_object THEN NULL; END $$;"
    "DO $$ BEGIN CREATE DOMAIN t_positive AS int CHECK (VALUE > 0); EXCEPTION WHEN duplicate_object THEN NULL; END $$;"
    "DO $$ BEGIN CREATE TYPE t_pair AS (n int, s text); EXCEPTION WHEN duplicate_object THEN NULL; END $$;";

/// The raw JSON text of member `name` in an encoded event (found as "name":<value>); with
/// wal2json, of the "value" of the column object named so. "<missing>" when there is none.
inline std::string raw_member(const std::string& doc, const std::string& name, bool wal2json = false) {
  std::string key = wal2json ? "{\"name\":\"" + name + "\",\"type\":" : "\"" + name + "\":";
  auto p = doc.find(key);
  if (p == std::string::npos) return "<missing>";
  if (wal2json) {
    p = doc.find(",\"value\":", p);
    if (p == std::string::npos) return "<missing>";
    p += 9;
  } else {
    p += key.size();
  }
  boost::json::stream_parser sp;
  boost::system::error_code ec;
  std::size_t n = sp.write_some(doc.data() + p, doc.size() - p, ec);
  return doc.substr(p, n);
}

}  // namespace walgate::test
