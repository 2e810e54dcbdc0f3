// Tuple columns as pgoutput sends them, for tests that build changes by hand.
#pragma once

#include "walgate/protocol/pgoutput.hpp"

#include <string_view>

namespace walgate::test {
namespace pg = protocol::pgoutput;
/// A text value (a view into v, which must outlive it).
inline pg::tuple_column text_column(std::string_view v) { return {pg::column_kind::text, protocol::as_bytes(v)}; }
inline pg::tuple_column null_column() { return {pg::column_kind::null, {}}; }
inline pg::tuple_column unchanged_toast_column() { return {pg::column_kind::unchanged_toast, {}}; }
}  // namespace walgate::test
