#include "walgate/transform/pg_types.hpp"

namespace walgate::transform {

std::uint32_t array_element_type(std::uint32_t a) {
  switch (a) {
    case 1000: return oid::bool_;
    case 1001: return oid::bytea;
    case 1002: return oid::char_;
    case 1003: return oid::name;
    case 1005: return oid::int2;
    case 1007: return oid::int4;
    case 1009: return oid::text;
    case 1014: return oid::bpchar;
    case 1015: return oid::varchar;
    case 1016: return oid::int8;
    case 1021: return oid::float4;
    case 1022: return oid::float8;
    case 1028: return oid::oid;
    case 1115: return oid::timestamp;
    case 1182: return oid::date;
    case 1183: return oid::time;
    case 1185: return oid::timestamptz;
    case 1187: return oid::interval;
    case 1231: return oid::numeric;
    case 1270: return oid::timetz;
    case 199: return oid::json;
    case 3807: return oid::jsonb;
    case 2951: return oid::uuid;
    case 1041: return oid::inet;
    case 651: return oid::cidr;
    case 1040: return oid::macaddr;
    case 791: return oid::money;
    case 143: return oid::xml;
    case 1561: return oid::bit;
    case 1563: return oid::varbit;
    case 1017: return oid::point;
    case 1020: return 603;   // box
    default: return 0;
  }
}

char array_delimiter(std::uint32_t a) { return a == 1020 ? ';' : ','; }

bool numeric_typmod(std::int32_t typmod, int& precision, int& scale) {
  if (typmod < 4) return false;   // VARHDRSZ: no declared precision
  std::int32_t t = typmod - 4;
  precision = (t >> 16) & 0xffff;
  scale = static_cast<std::int16_t>(t & 0xffff);   // PG15+ allows negative scales
  return true;
}

namespace {
std::string with_length(const char* base, std::int32_t typmod) {
  if (typmod < 4) return base;
  return std::string(base) + "(" + std::to_string(typmod - 4) + ")";
}
std::string with_precision(const char* before, const char* after, std::int32_t typmod) {
  if (typmod < 0) return std::string(before) + after;
  return std::string(before) + "(" + std::to_string(typmod) + ")" + after;
}
/// intervaltypmodout(): " day to second(3)", "(2)", "" (src/backend/utils/adt/timestamp.c).
std::string interval_typmod(std::int32_t typmod) {
  if (typmod < 0) return {};
  const int range = (typmod >> 16) & 0x7FFF, precision = typmod & 0xFFFF;
  constexpr int month = 1 << 1, year = 1 << 2, day = 1 << 3, hour = 1 << 10, minute = 1 << 11, second = 1 << 12;
  const char* fields = "";
  switch (range) {
    case year: fields = " year"; break;
    case month: fields = " month"; break;
    case day: fields = " day"; break;
    case hour: fields = " hour"; break;
    case minute: fields = " minute"; break;
    case second: fields = " second"; break;
    case year | month: fields = " year to month"; break;
    case day | hour: fields = " day to hour"; break;
    case day | hour | minute: fields = " day to minute"; break;
    case day | hour | minute | second: fields = " day to second"; break;
    case hour | minute: fields = " hour to minute"; break;
    case hour | minute | second: fields = " hour to second"; break;
    case minute | second: fields = " minute to second"; break;
    default: break;   // (0x7FFF: every field)
  }
  if (precision != 0xFFFF) return std::string(fields) + "(" + std::to_string(precision) + ")";
  return fields;
}
}  // namespace

namespace {
/// Built-in array types whose values the encoders do not parse as arrays (their element is not
/// one array_element_type knows): their element, for their names alone.
std::uint32_t named_array_element(std::uint32_t a) {
  switch (a) {
    case 271: return 5069;
    case 629: return 628;
    case 719: return 718;
    case 775: return 774;
    case 1006: return 22;
    case 1008: return 24;
    case 1010: return 27;
    case 1011: return 28;
    case 1012: return 29;
    case 1013: return 30;
    case 1018: return 601;
    case 1019: return 602;
    case 1027: return 604;
    case 2207: return 2202;
    case 2208: return 2203;
    case 2209: return 2204;
    case 2210: return 2205;
    case 2211: return 2206;
    case 2949: return 2970;
    case 3221: return 3220;
    case 3643: return 3614;
    case 3645: return 3615;
    case 3735: return 3734;
    case 3770: return 3769;
    case 3905: return 3904;
    case 3907: return 3906;
    case 3909: return 3908;
    case 3911: return 3910;
    case 3913: return 3912;
    case 3927: return 3926;
    case 4073: return 4072;
    case 4090: return 4089;
    case 4097: return 4096;
    case 4192: return 4191;
    case 5039: return 5038;
    case 6150: return 4451;
    case 6151: return 4532;
    case 6152: return 4533;
    case 6153: return 4534;
    case 6155: return 4535;
    case 6157: return 4536;
    default: return 0;
  }
}
}  // namespace

std::string builtin_type_name(std::uint32_t t, std::int32_t typmod) {
  if (std::uint32_t e = array_element_type(t) ? array_element_type(t) : named_array_element(t)) {
    std::string inner = builtin_type_name(e, typmod);
    return inner.empty() ? inner : inner + "[]";
  }
  switch (t) {
    case oid::bool_: return "boolean";
    case oid::bytea: return "bytea";
    case oid::char_: return "\"char\"";
    case oid::name: return "name";
    case oid::int8: return "bigint";
    case oid::int2: return "smallint";
    case oid::int4: return "integer";
    case oid::text: return "text";
    case oid::oid: return "oid";
    case oid::json: return "json";
    case oid::xml: return "xml";
    case oid::point: return "point";
    case 603: return "box";
    case oid::cidr: return "cidr";
    case oid::float4: return "real";
    case oid::float8: return "double precision";
    case oid::money: return "money";
    case oid::macaddr: return "macaddr";
    case oid::inet: return "inet";
    case oid::bpchar: return typmod < 4 ? "bpchar" : with_length("character", typmod);
    case oid::varchar: return with_length("character varying", typmod);
    case oid::date: return "date";
    case oid::time: return with_precision("time", " without time zone", typmod);
    case oid::timestamp: return with_precision("timestamp", " without time zone", typmod);
    case oid::timestamptz: return with_precision("timestamp", " with time zone", typmod);
    case oid::interval: return "interval" + interval_typmod(typmod);
    case oid::timetz: return with_precision("time", " with time zone", typmod);
    case oid::bit: return typmod < 0 ? "bit" : "bit(" + std::to_string(typmod) + ")";
    case oid::varbit: return typmod < 0 ? "bit varying" : "bit varying(" + std::to_string(typmod) + ")";
    case oid::numeric: {
      int p = 0, s = 0;
      if (!numeric_typmod(typmod, p, s)) return "numeric";
      return "numeric(" + std::to_string(p) + "," + std::to_string(s) + ")";
    }
    case oid::uuid: return "uuid";
    case oid::jsonb: return "jsonb";
    case 3614: return "tsvector";
    case 3615: return "tsquery";
    case 3904: return "int4range";
    case 3926: return "int8range";
    case 3906: return "numrange";
    case 3908: return "tsrange";
    case 3910: return "tstzrange";
    case 3912: return "daterange";
    case 774: return "macaddr8";
    case 2249: return "record";
    case 22: return "int2vector";
    case 24: return "regproc";
    case 27: return "tid";
    case 28: return "xid";
    case 29: return "cid";
    case 30: return "oidvector";
    case 601: return "lseg";
    case 602: return "path";
    case 604: return "polygon";
    case 628: return "line";
    case 718: return "circle";
    case 2202: return "regprocedure";
    case 2203: return "regoper";
    case 2204: return "regoperator";
    case 2205: return "regclass";
    case 2206: return "regtype";
    case 3734: return "regconfig";
    case 3769: return "regdictionary";
    case 4089: return "regnamespace";
    case 4096: return "regrole";
    case 4191: return "regcollation";
    case 3220: return "pg_lsn";
    case 5069: return "xid8";
    case 4072: return "jsonpath";
    case 2970: return "txid_snapshot";
    case 5038: return "pg_snapshot";
    case 4451: return "int4multirange";
    case 4532: return "nummultirange";
    case 4533: return "tsmultirange";
    case 4534: return "tstzmultirange";
    case 4535: return "datemultirange";
    case 4536: return "int8multirange";
    default: return {};
  }
}

std::string builtin_typname(std::uint32_t t) {
  if (std::uint32_t e = array_element_type(t) ? array_element_type(t) : named_array_element(t)) {
    std::string inner = builtin_typname(e);
    return inner.empty() ? inner : "_" + inner;
  }
  switch (t) {
    case oid::bool_: return "bool";
    case oid::char_: return "char";
    case oid::int8: return "int8";
    case oid::int2: return "int2";
    case oid::int4: return "int4";
    case oid::float4: return "float4";
    case oid::float8: return "float8";
    case oid::bpchar: return "bpchar";
    case oid::varchar: return "varchar";
    case oid::time: return "time";
    case oid::timestamp: return "timestamp";
    case oid::timestamptz: return "timestamptz";
    case oid::timetz: return "timetz";
    case oid::varbit: return "varbit";
    default: break;
  }
  // (every other built-in type's format_type() name is its typname)
  std::string n = builtin_type_name(t, -1);
  return n.find_first_of(" (\"") == std::string::npos ? n : std::string();
}

}  // namespace walgate::transform
