#include "walgate/protocol/base64.hpp"

#include <array>
#include <cstdint>

namespace walgate::protocol {

namespace {
constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<std::int8_t, 256> make_reverse() {
  std::array<std::int8_t, 256> t{};
  for (auto& v : t) v = -1;
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(alphabet[i])] = static_cast<std::int8_t>(i);
  return t;
}
constexpr auto reverse = make_reverse();
constexpr char url_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

constexpr std::array<std::int8_t, 256> make_url_reverse() {
  std::array<std::int8_t, 256> t{};
  for (auto& v : t) v = -1;
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(url_alphabet[i])] = static_cast<std::int8_t>(i);
  return t;
}
constexpr auto url_reverse = make_url_reverse();
}  // namespace

std::optional<std::string> base64url_decode(std::string_view in) {
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3 + 2);
  std::uint32_t v = 0;
  int bits = 0;
  for (char ch : in) {
    auto d = url_reverse[static_cast<unsigned char>(ch)];
    if (d < 0) return std::nullopt;
    v = (v << 6) | static_cast<std::uint32_t>(d);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((v >> bits) & 0xff));
      v &= (1u << bits) - 1;
    }
  }
  if (v != 0) return std::nullopt;   // non-zero unused bits: not the canonical encoding of anything
  return out;
}

std::string base64url_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::uint32_t v = 0;
  int bits = 0;
  for (unsigned char ch : in) {
    v = (v << 8) | ch;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(url_alphabet[(v >> bits) & 63]);
    }
    v &= (1u << bits) - 1;
  }
  if (bits > 0) out.push_back(url_alphabet[(v << (6 - bits)) & 63]);
  return out;
}

void base64_encode_append(std::string& out, std::string_view in) {
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  std::size_t n = in.size(), i = 0;
  out.reserve(out.size() + (n + 2) / 3 * 4);
  for (; i + 3 <= n; i += 3) {
    std::uint32_t v = (std::uint32_t{p[i]} << 16) | (std::uint32_t{p[i + 1]} << 8) | p[i + 2];
    out.push_back(alphabet[(v >> 18) & 63]);
    out.push_back(alphabet[(v >> 12) & 63]);
    out.push_back(alphabet[(v >> 6) & 63]);
    out.push_back(alphabet[v & 63]);
  }
  if (n - i == 1) {
    std::uint32_t v = std::uint32_t{p[i]} << 16;
    out.push_back(alphabet[(v >> 18) & 63]);
    out.push_back(alphabet[(v >> 12) & 63]);
    out += "==";
  } else if (n - i == 2) {
    std::uint32_t v = (std::uint32_t{p[i]} << 16) | (std::uint32_t{p[i + 1]} << 8);
    out.push_back(alphabet[(v >> 18) & 63]);
    out.push_back(alphabet[(v >> 12) & 63]);
    out.push_back(alphabet[(v >> 6) & 63]);
    out.push_back('=');
  }
}

std::string base64_encode(std::string_view in) {
  std::string out;
  base64_encode_append(out, in);
  return out;
}

std::optional<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (std::size_t i = 0; i < in.size(); i += 4) {
    int pad = 0;
    std::uint32_t v = 0;
    for (int j = 0; j < 4; ++j) {
      char ch = in[i + static_cast<std::size_t>(j)];
      if (ch == '=') {
        // Padding only in the last quantum, only in its last two places, and only at the end.
        if (i + 4 != in.size() || j < 2) return std::nullopt;
        ++pad;
        v <<= 6;
        continue;
      }
      if (pad > 0) return std::nullopt;
      auto d = reverse[static_cast<unsigned char>(ch)];
      if (d < 0) return std::nullopt;
      v = (v << 6) | static_cast<std::uint32_t>(d);
    }
    out.push_back(static_cast<char>((v >> 16) & 0xff));
    if (pad < 2) out.push_back(static_cast<char>((v >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(v & 0xff));
  }
  return out;
}

}  // namespace walgate::protocol
