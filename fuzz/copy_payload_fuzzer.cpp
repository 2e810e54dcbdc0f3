// The CopyData payload of a replication stream ('w' / 'k'), and its round trip.
#include "walgate/protocol/replication.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

using namespace walgate::protocol;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  bytes_view in(reinterpret_cast<const std::byte*>(data), size);
  auto r = parse_copy_payload(in);
  if (!r) return 0;
  // A parsed payload rebuilt must give back the same bytes.
  std::string again = r->type == copy_payload::kind::xlog_data ? build_xlog_data(r->xlog)
                                                                 : build_primary_keepalive(r->keepalive);
  if (again != as_string_view(in)) std::abort();
  return 0;
}
