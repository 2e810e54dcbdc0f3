#include "walgate/protocol/lsn.hpp"

#include <charconv>
#include <cstdio>

namespace walgate::protocol {

std::string lsn::to_string() const {
  char buf[32];
  int n = std::snprintf(buf, sizeof buf, "%X/%X", static_cast<unsigned>(value >> 32),
                        static_cast<unsigned>(value & 0xffffffffu));
  return {buf, static_cast<std::size_t>(n)};
}

std::optional<lsn> lsn::parse(std::string_view text) {
  auto slash = text.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  auto hi_s = text.substr(0, slash), lo_s = text.substr(slash + 1);
  if (hi_s.empty() || lo_s.empty() || hi_s.size() > 8 || lo_s.size() > 8) return std::nullopt;
  std::uint32_t hi = 0, lo = 0;
  auto r1 = std::from_chars(hi_s.data(), hi_s.data() + hi_s.size(), hi, 16);
  auto r2 = std::from_chars(lo_s.data(), lo_s.data() + lo_s.size(), lo, 16);
  if (r1.ec != std::errc{} || r1.ptr != hi_s.data() + hi_s.size()) return std::nullopt;
  if (r2.ec != std::errc{} || r2.ptr != lo_s.data() + lo_s.size()) return std::nullopt;
  return lsn{(std::uint64_t{hi} << 32) | lo};
}

}  // namespace walgate::protocol
