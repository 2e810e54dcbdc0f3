#include "walgate/protocol/snapshot.hpp"

#include <algorithm>
#include <charconv>

namespace walgate::protocol {

namespace {
bool parse_u64(std::string_view s, std::uint64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && p == s.data() + s.size();
}
}  // namespace

std::uint64_t pg_snapshot::widen(std::uint32_t xid) const {
  std::uint64_t full = (xmax & ~std::uint64_t{0xffffffff}) | xid;
  constexpr std::uint64_t half = std::uint64_t{1} << 31;
  if (full > xmax && full - xmax > half && full >= (std::uint64_t{1} << 32)) full -= std::uint64_t{1} << 32;
  else if (full < xmax && xmax - full > half) full += std::uint64_t{1} << 32;
  return full;
}

bool pg_snapshot::sees(std::uint32_t xid) const {
  const std::uint64_t x = widen(xid);
  if (x < xmin) return true;
  if (x >= xmax) return false;
  return !std::binary_search(xip.begin(), xip.end(), x);
}

std::string pg_snapshot::to_string() const {
  std::string out = std::to_string(xmin) + ":" + std::to_string(xmax) + ":";
  for (std::size_t i = 0; i < xip.size(); ++i) out += (i ? "," : "") + std::to_string(xip[i]);
  return out;
}

std::optional<pg_snapshot> parse_pg_snapshot(std::string_view text) {
  auto c1 = text.find(':');
  if (c1 == std::string_view::npos) return std::nullopt;
  auto c2 = text.find(':', c1 + 1);
  if (c2 == std::string_view::npos) return std::nullopt;
  pg_snapshot s;
  if (!parse_u64(text.substr(0, c1), s.xmin) || !parse_u64(text.substr(c1 + 1, c2 - c1 - 1), s.xmax)) return std::nullopt;
  if (s.xmin > s.xmax) return std::nullopt;
  std::string_view rest = text.substr(c2 + 1);
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::uint64_t x = 0;
    if (!parse_u64(rest.substr(0, comma), x)) return std::nullopt;
    if (x < s.xmin || x >= s.xmax || (!s.xip.empty() && x <= s.xip.back()) || s.xip.size() >= (1u << 20))
      return std::nullopt;
    s.xip.push_back(x);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
    if (rest.empty()) return std::nullopt;   // a trailing comma
  }
  return s;
}

bool parse_copy_text_row(std::string_view line, std::string& storage, std::vector<pgoutput::tuple_column>& out,
                         std::string& error) {
  storage.clear();
  out.clear();
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  // Values with escapes unescaped into storage, which never grows past the line (unescaping
  // only shortens): it does not move once reserved, and the views are made as each value ends.
  storage.reserve(line.size());
  const char* const base = storage.data();
  std::size_t i = 0;
  for (;;) {
    if (out.size() >= pgoutput::max_columns) {
      error = "a COPY row with more than " + std::to_string(pgoutput::max_columns) + " columns";
      return false;
    }
    const std::size_t start = storage.size();
    if (line.substr(i, 2) == "\\N" && (i + 2 == line.size() || line[i + 2] == '\t')) {
      out.push_back({pgoutput::column_kind::null, {}});
      i += 2;
    } else {
      // A value without escapes is a view into the line itself.
      std::size_t end = i;
      while (end < line.size() && line[end] != '\t' && line[end] != '\\') ++end;
      if (end == line.size() || line[end] == '\t') {
        out.push_back({pgoutput::column_kind::text, as_bytes(line.substr(i, end - i))});
        i = end;
        if (i == line.size()) break;
        ++i;
        continue;
      }
      while (i < line.size() && line[i] != '\t') {
        // A run without escapes at once.
        std::size_t run = i;
        while (run < line.size() && line[run] != '\t' && line[run] != '\\') ++run;
        storage.append(line.data() + i, run - i);
        i = run;
        if (i == line.size() || line[i] == '\t') break;
        ++i;   // the backslash
        if (i == line.size()) {
          error = "a COPY row ends in a backslash";
          return false;
        }
        char e = line[i++];
        switch (e) {
          case 'b': storage.push_back('\b'); break;
          case 'f': storage.push_back('\f'); break;
          case 'n': storage.push_back('\n'); break;
          case 'r': storage.push_back('\r'); break;
          case 't': storage.push_back('\t'); break;
          case 'v': storage.push_back('\v'); break;
          case 'x': {   // \xH or \xHH
            auto hex = [](char h) { return h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1; };
            int v = i < line.size() ? hex(line[i]) : -1;
            if (v < 0) {
              storage.push_back('x');   // as COPY FROM reads it: a plain x
              break;
            }
            ++i;
            if (i < line.size() && hex(line[i]) >= 0) v = v * 16 + hex(line[i++]);
            storage.push_back(static_cast<char>(v));
            break;
          }
          default:
            if (e >= '0' && e <= '7') {   // \d, \dd, \ddd octal
              int v = e - '0';
              for (int k = 0; k < 2 && i < line.size() && line[i] >= '0' && line[i] <= '7'; ++k) v = v * 8 + (line[i++] - '0');
              storage.push_back(static_cast<char>(v & 0xff));
            } else {
              storage.push_back(e);   // any other character stands for itself
            }
        }
      }
      out.push_back({pgoutput::column_kind::text, as_bytes(std::string_view(base + start, storage.size() - start))});
    }
    if (i == line.size()) break;
    if (line[i] != '\t') {   // (cannot happen: a field ends at a tab or the end)
      error = "a malformed COPY row";
      return false;
    }
    ++i;
  }
  if (storage.data() != base) {   // (cannot happen: see above)
    error = "a COPY row's values moved";
    return false;
  }
  return true;
}

}  // namespace walgate::protocol
