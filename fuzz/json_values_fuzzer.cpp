// The value encoders of every format on arbitrary text, for every type they treat specially:
// the output must always parse as JSON (checked with Boost.JSON).
#include "walgate/transform/formats.hpp"

#include <boost/json/src.hpp>   // header-only Boost.JSON: the fuzz build links no Boost library

#include <cstddef>
#include <cstdint>
#include <cstdlib>

using namespace walgate;
namespace pg = walgate::protocol::pgoutput;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static constexpr std::uint32_t types[] = {16,   17,   18,   20,   21,   23,   25,   26,   114,  700,  701,  790,
                                            1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266, 1700, 2950, 3802,
                                            1000, 1001, 1005, 1007, 1009, 1016, 1021, 1022, 1231, 1182, 1185,
                                            1020, 199,  3807, 16400};
  if (size < 3) return 0;
  std::uint32_t type = types[data[0] % (sizeof types / sizeof types[0])];
  std::int32_t typmod = (data[1] & 1) ? ((12 << 16 | 2) + 4) : (data[1] & 2) ? 3 : -1;
  transform::encoder_options o;
  o.decimal = static_cast<transform::encoder_options::decimal_mode>(data[2] % 3);
  o.time = data[2] & 4 ? transform::encoder_options::time_precision::connect
                       : transform::encoder_options::time_precision::adaptive_time_microseconds;
  o.compact = (data[2] & 8) != 0;
  o.include_schema = (data[2] & 16) != 0;
  o.processing_time_ms = 1;
  std::string_view text(reinterpret_cast<const char*>(data + 3), size - 3);
  // json/jsonb values are taken as arbitrary text too: PostgreSQL's json keeps its input's line
  // breaks, and whatever a row holds must come out as one line of valid JSON.

  pg::cached_relation rel;
  rel.nspname = "public";
  rel.relname = "t";
  rel.columns = {{"k", 23, -1, true}, {"v", type, typmod, false}};
  protocol::transaction_info txn;
  std::vector<pg::tuple_column> row = {{pg::column_kind::text, protocol::as_bytes(std::string_view("1"))},
                                       {pg::column_kind::text, protocol::as_bytes(text)}};
  for (auto kind : {transform::op::insert, transform::op::update, transform::op::delete_}) {
    transform::change c;
    c.kind = kind;
    c.txn = &txn;
    c.relation = &rel;
    if (kind != transform::op::delete_) c.after = row;
    if (kind != transform::op::insert) {
      c.before_kind = 'O';
      c.before = row;
    }
    for (auto f : transform::all_formats) {
      std::string out;
      if (!transform::encode_change(out, c, f, o)) continue;
      // One line (an NDJSON line, an SSE event's data) of valid JSON, however deep the value.
      if (out.find('\n') != std::string::npos || out.find('\r') != std::string::npos) std::abort();
      boost::json::parse_options po;
      po.max_depth = 1024;
      boost::system::error_code ec;
      boost::json::parse(out, ec, {}, po);
      if (ec) std::abort();
    }
  }
  return 0;
}
