// A client's WebSocket frames (the reader, split where the first byte says), close payloads and
// UTF-8 on arbitrary bytes: never a crash or a read past the input; a split never changes what
// is read.
#include "walgate/protocol/websocket.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

using namespace walgate::protocol::websocket;

namespace {

/// Everything the reader reports, as one string (data pieces joined per message).
std::string read_all(std::string input, std::size_t step, bool compression) {
  frame_reader r(compression);
  std::string log;
  for (std::size_t at = 0; at < input.size(); at += step) {
    std::span<char> in(input.data() + at, std::min(step, input.size() - at));
    for (;;) {
      const std::size_t before = in.size();
      piece p = r.next(in);
      if (in.size() > before) std::abort();
      if (p.what == piece::kind::more) {
        if (!in.empty()) std::abort();
        break;
      }
      if (p.what == piece::kind::failed) {
        if (p.code != close_protocol_error) std::abort();
        return log + "!" + p.reason;
      }
      if (p.what == piece::kind::control) {
        if (p.bytes.size() > 125) std::abort();
        if (p.opcode == op_close) (void)parse_close(p.bytes);
        log += "c" + std::to_string(p.opcode) + ":" + std::string(p.bytes) + ";";
      } else {
        if (p.begins) log += p.compressed ? "Z" : "M";
        log += p.bytes;
        if (p.ends) log += ";";
      }
    }
  }
  return log;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t step = (data[0] & 0x3F) + 1;
  const bool compression = data[0] & 0x40;
  std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (read_all(input, input.size() + 1, compression) != read_all(input, step, compression)) std::abort();
  utf8_checker u;
  (void)u.feed(input);
  (void)parse_close(input);
  return 0;
}
