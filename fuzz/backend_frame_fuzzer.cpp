// The backend message splitter and every message parser, on arbitrary bytes.
#include "walgate/protocol/backend.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

using namespace walgate::protocol;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  bytes_view in(reinterpret_cast<const std::byte*>(data), size);
  while (!in.empty()) {
    auto r = split_backend_message(in, 1 << 20);
    if (r.status != split_status::ready) break;
    if (r.message.size > in.size() || r.message.body.size() + 5 != r.message.size) std::abort();
    bytes_view body = r.message.body;
    switch (r.message.tag) {
      case 'R': (void)parse_authentication(body); break;
      case 'E': case 'N': (void)parse_error_or_notice(body); break;
      case 'S': (void)parse_parameter_status(body); break;
      case 'K': (void)parse_backend_key_data(body); break;
      case 'Z': (void)parse_ready_for_query(body); break;
      case 'T': (void)parse_row_description(body); break;
      case 'D': (void)parse_data_row(body); break;
      case 'C': (void)parse_command_complete(body); break;
      case 'W': case 'H': (void)parse_copy_response(body); break;
      default: break;
    }
    in = in.subspan(r.message.size);
  }
  return 0;
}
