#include "walgate/proxy/failure_window.hpp"

#include <algorithm>
#include <cstdio>

namespace walgate::proxy {

std::string peer_key(bool v6, const std::array<unsigned char, 16>& b) {
  char buf[64];
  const bool mapped = v6 && std::all_of(b.begin(), b.begin() + 10, [](unsigned char c) { return c == 0; }) && b[10] == 0xff &&
                      b[11] == 0xff;
  if (!v6 || mapped) {
    const std::size_t o = v6 ? 12 : 0;
    std::snprintf(buf, sizeof buf, "%u.%u.%u.%u", b[o], b[o + 1], b[o + 2], b[o + 3]);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%x:%x:%x:%x::/64", b[0] << 8 | b[1], b[2] << 8 | b[3], b[4] << 8 | b[5], b[6] << 8 | b[7]);
  return buf;
}

std::optional<std::int64_t> failure_window::wait(std::string_view address, std::chrono::steady_clock::time_point now) const {
  if (!opts_.limit) return std::nullopt;
  auto it = by_address_.find(std::string(address));
  if (it == by_address_.end() || it->second.n < opts_.limit) return std::nullopt;
  const auto end = it->second.since + opts_.window;
  if (now >= end) return std::nullopt;
  return std::chrono::ceil<std::chrono::seconds>(end - now).count();
}

void failure_window::count(std::string_view address, std::chrono::steady_clock::time_point now) {
  if (!opts_.limit) return;
  std::string k(address);
  auto it = by_address_.find(k);
  if (it == by_address_.end()) {
    if (by_address_.size() >= opts_.max_tracked && now - swept_ >= std::chrono::seconds(1)) {
      swept_ = now;
      std::erase_if(by_address_, [&](const auto& f) { return now >= f.second.since + opts_.window; });
    }
    if (by_address_.size() >= opts_.max_tracked) return;
    it = by_address_.emplace(std::move(k), failures{now, 0}).first;
  }
  if (now >= it->second.since + opts_.window) it->second = {now, 0};   // a new window
  ++it->second.n;
}

}  // namespace walgate::proxy
