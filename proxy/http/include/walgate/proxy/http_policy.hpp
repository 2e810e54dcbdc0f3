// The HTTP server's policy on who may be served (the Host a loopback listener serves, the
// origins whose pages may read the stream) and the WebSocket frame header the transports write:
// standard headers only, so that the fuzz target and the transports include them without the
// server (http_policy.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::proxy {

/// Whether a browser request from `origin` (its Origin header; empty: none, as curl and
/// same-origin page loads send) may be served: no Origin, the gateway's own origin (the Origin's
/// host[:port] equals the Host header, any case), an origin in `allowed` (exact
/// "scheme://host[:port]", any case), or anything when `allowed` holds "*".
bool origin_allowed(std::string_view origin, std::string_view host, const std::vector<std::string>& allowed);
/// Whether a request's Host header may be served by a gateway listening on a loopback address:
/// "localhost" (and *.localhost), a loopback IP (127.0.0.0/8, ::1), a name in `allowed` (any
/// case; "*": any), or no Host at all. Anything else is a DNS-rebinding page posing as the
/// gateway's own origin — or a reverse proxy passing its public name, which `allowed` lists.
bool loopback_host_allowed(std::string_view host, const std::vector<std::string>& allowed, bool any_address = false);
/// Writes the header of a server's WebSocket text frame (FIN, opcode 1, unmasked, RFC 6455 5.2)
/// for a payload of n bytes into out; returns its length (2, 4 or 10). A message in fragments
/// (5.4): the first frame is opcode 1 without FIN, the others continuation frames (opcode 0),
/// the last with FIN. compressed: the message is permessage-deflate's (RFC 7692 6: RSV1 on its
/// first frame).
std::size_t websocket_text_frame_header(char (&out)[10], std::uint64_t n, bool first = true, bool fin = true,
                                        bool compressed = false);

}  // namespace walgate::proxy
