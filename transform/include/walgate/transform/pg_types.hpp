// Built-in PostgreSQL types that the encoders treat specially, by OID (src/include/catalog/
// pg_type.dat; OIDs of built-in types never change), and their names as format_type() prints them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace walgate::transform {

namespace oid {
inline constexpr std::uint32_t bool_ = 16, bytea = 17, char_ = 18, name = 19, int8 = 20, int2 = 21, int4 = 23,
                               text = 25, oid = 26, json = 114, xml = 142, point = 600, cidr = 650, float4 = 700,
                               float8 = 701, money = 790, macaddr = 829, inet = 869, bpchar = 1042, varchar = 1043,
                               date = 1082, time = 1083, timestamp = 1114, timestamptz = 1184, interval = 1186,
                               timetz = 1266, bit = 1560, varbit = 1562, numeric = 1700, uuid = 2950, jsonb = 3802;
}

/// The element type of a built-in array type, or 0.
std::uint32_t array_element_type(std::uint32_t array_oid);
/// The delimiter of an array type's text form (';' for box arrays, ',' otherwise).
char array_delimiter(std::uint32_t array_oid);

/// format_type() for a built-in type with its typmod ("integer", "character varying(20)",
/// "numeric(12,2)", "timestamp(3) with time zone", "text[]"...); empty if the OID is not built in.
std::string builtin_type_name(std::uint32_t type_oid, std::int32_t typmod);

/// pg_type.typname of a built-in type ("int4", "bpchar", "_text", "timestamptz"); empty if the OID
/// is not one builtin_type_name knows.
std::string builtin_typname(std::uint32_t type_oid);

/// numeric typmod -> (precision, scale); false when the column has no declared precision.
bool numeric_typmod(std::int32_t typmod, int& precision, int& scale);

}  // namespace walgate::transform
