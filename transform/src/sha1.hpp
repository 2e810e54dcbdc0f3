// SHA-1 (FIPS 180-4) of short inputs, for UUIDv5 idempotency keys: computed per event, where
// OpenSSL's EVP interface costs an allocation and a provider look-up each time.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace walgate::transform {

inline std::array<unsigned char, 20> sha1(std::string_view a, std::string_view b) {
  std::uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
  auto rol = [](std::uint32_t x, int n) { return (x << n) | (x >> (32 - n)); };
  auto block = [&](const unsigned char* p) {
    std::uint32_t w[80];
    for (int i = 0; i < 16; ++i)
      w[i] = (std::uint32_t{p[4 * i]} << 24) | (std::uint32_t{p[4 * i + 1]} << 16) | (std::uint32_t{p[4 * i + 2]} << 8) |
             p[4 * i + 3];
    for (int i = 16; i < 80; ++i) w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    std::uint32_t A = h[0], B = h[1], C = h[2], D = h[3], E = h[4];
    for (int i = 0; i < 80; ++i) {
      std::uint32_t f, k;
      if (i < 20) f = (B & C) | (~B & D), k = 0x5A827999;
      else if (i < 40) f = B ^ C ^ D, k = 0x6ED9EBA1;
      else if (i < 60) f = (B & C) | (B & D) | (C & D), k = 0x8F1BBCDC;
      else f = B ^ C ^ D, k = 0xCA62C1D6;
      std::uint32_t t = rol(A, 5) + f + E + k + w[i];
      E = D;
      D = C;
      C = rol(B, 30);
      B = A;
      A = t;
    }
    h[0] += A, h[1] += B, h[2] += C, h[3] += D, h[4] += E;
  };
  unsigned char buf[64];
  std::size_t fill = 0;
  std::uint64_t total = 0;
  auto feed = [&](std::string_view s) {
    for (char ch : s) {
      buf[fill++] = static_cast<unsigned char>(ch);
      if (fill == 64) {
        block(buf);
        fill = 0;
      }
    }
    total += s.size();
  };
  feed(a);
  feed(b);
  std::uint64_t bits = total * 8;
  buf[fill++] = 0x80;
  if (fill > 56) {
    std::memset(buf + fill, 0, 64 - fill);
    block(buf);
    fill = 0;
  }
  std::memset(buf + fill, 0, 56 - fill);
  for (int i = 0; i < 8; ++i) buf[56 + i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
  block(buf);
  std::array<unsigned char, 20> out{};
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<unsigned char>(h[i] >> (24 - 8 * j));
  return out;
}

}  // namespace walgate::transform
