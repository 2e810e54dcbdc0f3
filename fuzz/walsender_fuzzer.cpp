// The server side of the replication protocol on arbitrary client bytes: the first packet, then
// tagged messages, each Query through the replication-command grammar and each SASLInitialResponse
// through its parser — as a connection to --replication-listen feeds them.
#include "walgate/protocol/walsender.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

using namespace walgate::protocol;
using namespace walgate::protocol::walsender;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  bytes_view in(reinterpret_cast<const std::byte*>(data), size);
  auto first = split_startup_packet(in);
  if (first.status != split_status::ready) return 0;
  if (first.packet.size < 8 || first.packet.size > in.size() || first.packet.size > max_startup_packet) std::abort();
  (void)startup_param(first.packet, "replication");
  in = in.subspan(first.packet.size);
  while (!in.empty()) {
    auto r = split_frontend_message(in, 1 << 16);
    if (r.status != split_status::ready) break;
    if (r.message.size > in.size() || r.message.body.size() + 5 != r.message.size) std::abort();
    if (r.message.tag == 'Q') {
      auto text = parse_query(r.message.body);
      if (text) {
        auto c = parse_replication_command(*text);
        if (c.command.has_value() == !c.error.empty()) std::abort();   // one or the other
      }
    } else if (r.message.tag == 'p') {
      (void)parse_sasl_initial_response(r.message.body);
    }
    in = in.subspan(r.message.size);
  }
  return 0;
}
