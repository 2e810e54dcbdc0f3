#include "walgate/transform/json.hpp"

namespace walgate::transform {

namespace {
constexpr char hex_digits[] = "0123456789abcdef";

// Length of the valid UTF-8 sequence starting at p (1-4), or 0 if invalid (overlong forms,
// surrogates and code points above U+10FFFF are invalid, as in RFC 3629).
std::size_t utf8_sequence(const unsigned char* p, std::size_t left) {
  unsigned char c = p[0];
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return left >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (left < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && p[1] < 0xA0) return 0;   // overlong
    if (c == 0xED && p[1] > 0x9F) return 0;   // surrogates
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (left < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
    if (c == 0xF0 && p[1] < 0x90) return 0;   // overlong
    if (c == 0xF4 && p[1] > 0x8F) return 0;   // above U+10FFFF
    return 4;
  }
  return 0;
}
}  // namespace

bool is_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = utf8_sequence(p + i, s.size() - i);
    if (!len) return false;
    i += len;
  }
  return true;
}

void append_json_string(std::string& out, std::string_view s) {
  out.reserve(out.size() + s.size() + 2);
  out.push_back('"');
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t n = s.size(), i = 0, run = 0;
  auto flush = [&](std::size_t end) {
    if (end > run) out.append(s.data() + run, end - run);
  };
  while (i < n) {
    unsigned char c = p[i];
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      std::size_t len = utf8_sequence(p + i, n - i);
      if (len > 0) {
        i += len;
        continue;
      }
      flush(i);
      out += "\\ufffd";
      run = ++i;
      continue;
    }
    flush(i);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        out += "\\u00";
        out.push_back(hex_digits[c >> 4]);
        out.push_back(hex_digits[c & 15]);
    }
    run = ++i;
  }
  flush(n);
  out.push_back('"');
}

bool is_json_number(std::string_view s) {
  std::size_t i = 0, n = s.size();
  auto digit = [&](std::size_t k) { return k < n && s[k] >= '0' && s[k] <= '9'; };
  if (i < n && s[i] == '-') ++i;
  if (!digit(i)) return false;
  if (s[i] == '0') ++i;
  else while (digit(i)) ++i;
  if (i < n && s[i] == '.') {
    ++i;
    if (!digit(i)) return false;
    while (digit(i)) ++i;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digit(i)) return false;
    std::size_t start = i;
    while (digit(i)) ++i;
    // PostgreSQL prints at most 3 exponent digits (float8: e+308, e-324); a longer exponent is
    // valid JSON grammar but overflows common parsers, so it is not passed on as a number.
    if (i - start > 4) return false;
  }
  return i == n;
}

void append_number_or_string(std::string& out, std::string_view s) {
  if (is_json_number(s)) out.append(s);
  else append_json_string(out, s);
}

}  // namespace walgate::transform
