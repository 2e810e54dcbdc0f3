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

namespace walgate::transform {

namespace {
bool is_hex(unsigned char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Copies the JSON text s to out token by token, checking it against RFC 8259 and walgate's rules
// (is_json_number's numbers, at most json_max_depth levels of nesting): whitespace between
// tokens is kept except line breaks (CR, LF), which are dropped. False as soon as s breaks a rule
// (out then holds part of it: the caller cuts it back). No recursion, no allocation.
bool copy_json_text(std::string& out, std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  // What each open level is: bit set = object. At most json_max_depth levels.
  std::uint64_t kinds[(json_max_depth + 63) / 64] = {};
  std::size_t depth = 0;
  auto in_object = [&] { return depth > 0 && (kinds[(depth - 1) / 64] >> ((depth - 1) % 64) & 1) != 0; };
  enum class want { value, value_or_close, key, key_or_close, colon, comma_or_close, end } state = want::value;
  auto hex4 = [&](std::size_t at) -> int {   // the 4 hex digits at p[at], or -1
    if (at + 4 > n) return -1;
    int v = 0;
    for (std::size_t k = at; k < at + 4; ++k) {
      const unsigned char h = p[k];
      if (!is_hex(h)) return -1;
      v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return v;
  };
  auto string_token = [&]() -> bool {   // p[i] == '"'
    std::size_t run = i++;
    while (i < n) {
      const unsigned char c = p[i];
      if (c == '"') {
        ++i;
        out.append(s.data() + run, i - run);
        return true;
      }
      if (c == '\\') {
        if (i + 1 >= n) return false;
        const unsigned char e = p[i + 1];
        if (e == 'u') {
          // A surrogate only as a pair (high, then low), as PostgreSQL's json input and I-JSON
          // (RFC 7493) require: a lone one is refused by many parsers.
          const int u = hex4(i + 2);
          if (u < 0) return false;
          i += 6;
          if (u >= 0xDC00 && u <= 0xDFFF) return false;
          if (u >= 0xD800 && u <= 0xDBFF) {
            if (i + 1 >= n || p[i] != '\\' || p[i + 1] != 'u') return false;
            const int low = hex4(i + 2);
            if (low < 0xDC00 || low > 0xDFFF) return false;
            i += 6;
          }
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
          i += 2;
        } else {
          return false;
        }
        continue;
      }
      if (c < 0x20) return false;   // a raw control character (a line break too) inside a string
      if (c >= 0x80) {
        const std::size_t len = utf8_sequence(p + i, n - i);
        if (!len) return false;
        i += len;
        continue;
      }
      ++i;
    }
    return false;   // unterminated
  };
  auto after_value = [&] { state = depth == 0 ? want::end : want::comma_or_close; };
  while (i < n) {
    const unsigned char c = p[i];
    if (c == ' ' || c == '\t') {
      std::size_t run = i;
      while (i < n && (p[i] == ' ' || p[i] == '\t')) ++i;
      out.append(s.data() + run, i - run);
      continue;
    }
    if (c == '\n' || c == '\r') {
      ++i;
      continue;
    }
    switch (state) {
      case want::end:
        return false;   // a second value
      case want::colon:
        if (c != ':') return false;
        out.push_back(':');
        ++i;
        state = want::value;
        continue;
      case want::comma_or_close:
        if (c == ',') {
          out.push_back(',');
          ++i;
          state = in_object() ? want::key : want::value;
          continue;
        }
        if (c == (in_object() ? '}' : ']')) {
          out.push_back(static_cast<char>(c));
          ++i;
          --depth;
          after_value();
          continue;
        }
        return false;
      case want::key_or_close:
        if (c == '}') {
          out.push_back('}');
          ++i;
          --depth;
          after_value();
          continue;
        }
        [[fallthrough]];
      case want::key:
        if (c != '"' || !string_token()) return false;
        state = want::colon;
        continue;
      case want::value_or_close:
        if (c == ']') {
          out.push_back(']');
          ++i;
          --depth;
          after_value();
          continue;
        }
        [[fallthrough]];
      case want::value:
        if (c == '{' || c == '[') {
          if (depth >= json_max_depth) return false;
          const std::uint64_t bit = std::uint64_t{1} << (depth % 64);
          if (c == '{') kinds[depth / 64] |= bit;
          else kinds[depth / 64] &= ~bit;
          ++depth;
          out.push_back(static_cast<char>(c));
          ++i;
          state = c == '{' ? want::key_or_close : want::value_or_close;
          continue;
        }
        if (c == '"') {
          if (!string_token()) return false;
          after_value();
          continue;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
          std::size_t start = i;
          while (i < n && ((p[i] >= '0' && p[i] <= '9') || p[i] == '-' || p[i] == '+' || p[i] == '.' || p[i] == 'e' ||
                           p[i] == 'E'))
            ++i;
          const std::string_view number = s.substr(start, i - start);
          if (!is_json_number(number)) return false;
          out.append(number);
          after_value();
          continue;
        }
        for (std::string_view word : {std::string_view("true"), std::string_view("false"), std::string_view("null")}) {
          if (s.substr(i, word.size()) == word) {
            out.append(word);
            i += word.size();
            after_value();
            break;
          }
        }
        if (state == want::value || state == want::value_or_close) return false;   // no literal matched
        continue;
    }
  }
  return state == want::end;
}
}  // namespace

bool append_json_value(std::string& out, std::string_view text) {
  const std::size_t mark = out.size();
  if (copy_json_text(out, text)) return true;
  out.resize(mark);
  append_json_string(out, text);
  return false;
}

}  // namespace walgate::transform
