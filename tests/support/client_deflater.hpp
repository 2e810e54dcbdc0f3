// A WebSocket client's side of permessage-deflate (RFC 7692 7.2.1), for tests: messages
// compressed by one raw-DEFLATE stream that keeps its context from message to message (as a
// client without client_no_context_takeover may), each flushed and without its final
// 00 00 ff ff — whether or not it came out smaller.
#pragma once

#include <doctest/doctest.h>
#include <zlib.h>

#include <string>
#include <string_view>

namespace walgate::test {

class client_deflater {
 public:
  client_deflater() { REQUIRE(deflateInit2(&z_, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK); }
  ~client_deflater() { deflateEnd(&z_); }
  client_deflater(const client_deflater&) = delete;
  client_deflater& operator=(const client_deflater&) = delete;

  std::string compress(std::string_view message) {
    std::string out(message.size() + 64, '\0');
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(message.data()));
    z_.avail_in = static_cast<uInt>(message.size());
    z_.next_out = reinterpret_cast<Bytef*>(out.data());
    z_.avail_out = static_cast<uInt>(out.size());
    REQUIRE(deflate(&z_, Z_SYNC_FLUSH) == Z_OK);
    const std::size_t n = out.size() - z_.avail_out;
    REQUIRE(n >= 4);
    out.resize(n - 4);
    return out;
  }

 private:
  z_stream z_{};
};

/// One message compressed on its own (a fresh context).
inline std::string compressed_alone(std::string_view message) { return client_deflater().compress(message); }

}  // namespace walgate::test
