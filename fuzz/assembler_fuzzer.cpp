// The transaction assembler fed a sequence of messages. Input: Byte1 context flags, then
// records (Int16 length | bytes), each one XLogData payload. The memory limit is tiny, so held
// transactions spill to disk; after every message the memory held stays within the limit.
#include "walgate/protocol/assembler.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

using namespace walgate::protocol;

namespace {
struct counting_handler final : transaction_handler {
  std::uint64_t events = 0;
  boost::system::error_code on_begin(const transaction_info&) override { ++events; return {}; }
  boost::system::error_code on_change(const transaction_info&, const change_event& e) override {
    if (!e.message) std::abort();
    ++events;
    return {};
  }
  boost::system::error_code on_commit(const transaction_info&) override { ++events; return {}; }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  assembler_options o;
  o.context.proto_version = 1 + (data[0] & 3);
  o.context.stream_abort_info = (data[0] & 4) != 0;
  o.memory_limit = 512;
  counting_handler h;
  assembler a(o, h);
  cursor c(bytes_view(reinterpret_cast<const std::byte*>(data + 1), size - 1));
  std::uint64_t lsn_counter = 0;
  while (!c.empty()) {
    std::uint16_t len = c.u16();
    bytes_view msg = c.bytes(len);
    if (!c.ok()) break;
    auto r = a.feed(lsn{++lsn_counter}, msg);
    if (a.memory_bytes() > o.memory_limit) std::abort();
    if (!r) break;   // a protocol violation stops the stream, as it does in walgate
  }
  return 0;
}
