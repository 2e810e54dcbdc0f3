#include "walgate/protocol/crc32c.hpp"

#include <array>
#include <cstring>

namespace walgate::protocol {

namespace {

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;   // reflected Castagnoli
    t[i] = c;
  }
  return t;
}
constexpr auto table = make_table();

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(std::string_view data, std::uint32_t crc) {
  std::uint64_t c = ~crc;
  const char* p = data.data();
  std::size_t n = data.size();
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; ++p, --n) c32 = __builtin_ia32_crc32qi(c32, static_cast<unsigned char>(*p));
  return ~c32;
}
const bool have_sse42 = __builtin_cpu_supports("sse4.2");
#endif

}  // namespace

std::uint32_t crc32c_portable(std::string_view data, std::uint32_t crc) {
  std::uint32_t c = ~crc;
  for (unsigned char b : data) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return ~c;
}

std::uint32_t crc32c(std::string_view data, std::uint32_t crc) {
#if defined(__x86_64__)
  if (have_sse42) return crc32c_sse42(data, crc);
#endif
  return crc32c_portable(data, crc);
}

}  // namespace walgate::protocol
