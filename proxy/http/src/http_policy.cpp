// The HTTP server's policy on who may be served (the Host a loopback listener serves, the
// origins whose pages may read the stream) and the WebSocket frame header the transports write:
// no Beast, so the fuzz target checks them on arbitrary input.
#include "walgate/protocol/websocket.hpp"
#include "walgate/proxy/http_policy.hpp"

#include <cctype>

namespace walgate::proxy {

namespace {
// An address literal (a dotted quad, or what was between [ and ]): a DNS-rebinding page always
// has a name, and a page at an address of the gateway's own is the gateway's own.
bool address_literal(const std::string& name, bool bracketed) {
  if (name.empty()) return false;
  if (bracketed) return name.find_first_not_of("0123456789abcdef:.") == std::string::npos;
  int parts = 0, value = -1;
  for (char ch : name) {
    if (ch == '.') {
      if (value < 0) return false;
      ++parts;
      value = -1;
    } else if (ch >= '0' && ch <= '9') {
      value = (value < 0 ? 0 : value * 10) + (ch - '0');
      if (value > 255) return false;
    } else {
      return false;
    }
  }
  return parts == 3 && value >= 0;
}
}  // namespace

bool loopback_host_allowed(std::string_view host, const std::vector<std::string>& allowed, bool any_address) {
  if (host.empty()) return true;
  // The name without its port: "[::1]:8080", "127.0.0.1:8080", "localhost".
  std::string name;
  const bool bracketed = host.front() == '[';
  if (bracketed) {
    auto close = host.find(']');
    if (close == std::string_view::npos) return false;
    name = std::string(host.substr(1, close - 1));
  } else {
    name = std::string(host.substr(0, host.find(':')));
  }
  for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (!name.empty() && name.back() == '.') name.pop_back();   // "localhost." is localhost too
  if (name == "localhost" || (name.size() > 10 && name.ends_with(".localhost"))) return true;
  if (name == "::1" || name == "0:0:0:0:0:0:0:1") return true;
  if (any_address && address_literal(name, bracketed)) return true;
  {  // 127.0.0.0/8 in dotted-quad form
    int parts = 0, value = -1;
    bool ok = name.rfind("127.", 0) == 0;
    for (char ch : name) {
      if (!ok) break;
      if (ch == '.') {
        ok = value >= 0 && value <= 255;
        ++parts;
        value = -1;
      } else if (ch >= '0' && ch <= '9') {
        value = (value < 0 ? 0 : value * 10) + (ch - '0');
        ok = value <= 255;
      } else {
        ok = false;
      }
    }
    if (ok && parts == 3 && value >= 0) return true;
  }
  for (const auto& a : allowed) {
    if (a == "*") return true;
    std::string lower = a;
    for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lower == name) return true;
  }
  return false;
}

bool origin_allowed(std::string_view origin, std::string_view host, const std::vector<std::string>& allowed) {
  if (origin.empty()) return true;
  auto iequal = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
    return true;
  };
  for (const auto& a : allowed)
    if (a == "*" || iequal(a, origin)) return true;
  // The gateway's own pages (the live page): the Origin's authority is the Host it asked for.
  auto scheme_end = origin.find("://");
  if (scheme_end == std::string_view::npos || host.empty()) return false;
  auto scheme = origin.substr(0, scheme_end);
  if (!iequal(scheme, "http") && !iequal(scheme, "https")) return false;
  return iequal(origin.substr(scheme_end + 3), host);
}

std::size_t websocket_text_frame_header(char (&out)[10], std::uint64_t n, bool first, bool fin, bool compressed) {
  // FIN | RSV1 (compressed, on a message's first frame) | text, or continuation
  namespace pws = protocol::websocket;
  return pws::frame_header(out, first ? pws::op_text : pws::op_continuation, n, fin, first && compressed);
}

}  // namespace walgate::proxy
