#include "walgate/protocol/error.hpp"

#include <string>

namespace walgate::protocol {

namespace {
class category final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "walgate.protocol"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::ok: return "success";
      case errc::need_more: return "need more data";
      case errc::truncated: return "message truncated";
      case errc::length_out_of_range: return "length out of range";
      case errc::unknown_message: return "unknown message";
      case errc::unterminated_string: return "string without terminator";
      case errc::trailing_bytes: return "trailing bytes after message";
      case errc::invalid_value: return "invalid field value";
      case errc::unexpected_message: return "unexpected message";
      case errc::auth_unsupported: return "authentication method not supported";
      case errc::auth_failed: return "authentication failed";
      case errc::server_error: return "server error";
      case errc::tls_unavailable: return "TLS unavailable";
      case errc::connection_closed: return "connection closed";
      case errc::timeout: return "timed out";
      case errc::limit_exceeded: return "limit exceeded";
      case errc::unsupported_by_server: return "not supported by this server version";
    }
    return "unknown protocol error";
  }
};
}  // namespace

const boost::system::error_category& protocol_category() noexcept {
  static const category c;
  return c;
}

std::string decode_error::message() const {
  std::string out = make_error_code(code).message();
  if (what && *what) {
    out += " in ";
    out += what;
  }
  out += " at offset " + std::to_string(offset);
  return out;
}

}  // namespace walgate::protocol
