// The pgoutput message decoder. The first input byte chooses the decoding context (protocol
// version 1-4, inside a stream block or not, Stream Abort with LSN and time or not); the rest is
// one message. Whatever decodes must encode back to exactly the same bytes.
#include "walgate/protocol/pgoutput.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

using namespace walgate::protocol;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  pgoutput::decode_context ctx;
  ctx.proto_version = 1 + (data[0] & 3);
  ctx.in_stream = (data[0] & 4) != 0;
  ctx.stream_abort_info = (data[0] & 8) != 0;
  bytes_view in(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  static pgoutput::decoder decoder;   // reused, as on the stream: stale storage must not leak through
  auto r = decoder.decode(in, ctx);
  if (!r) {
    if (r.error().offset > in.size()) std::abort();
    return 0;
  }
  if (pgoutput::encode(*r, ctx) != as_string_view(in)) std::abort();
  return 0;
}
