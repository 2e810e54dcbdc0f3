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
}  // namespace

std::string builtin_type_name(std::uint32_t t, std::int32_t typmod) {
  if (std::uint32_t e = array_element_type(t)) {
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
    case oid::interval: return typmod < 0 ? "interval" : "interval";   // fields/precision: see docs
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
    default: return {};
  }
}

}  // namespace walgate::transform
