// Error codes of the protocol layer. Every failure on the data path is a value of this enum,
// carried in a boost::system::error_code; nothing here throws on untrusted input.
#pragma once

#include <boost/system/error_code.hpp>
#include <boost/system/result.hpp>

#include <cstddef>
#include <string>
#include <type_traits>

namespace walgate::protocol {

enum class errc : int {
  ok = 0,
  need_more = 1,            ///< Not an error of the input: the buffer ends before the item does.
  truncated,                ///< A field runs past the end of its enclosing message.
  length_out_of_range,      ///< A length field is negative, below its minimum or over a named limit.
  unknown_message,          ///< A message tag that is not valid in this context.
  unterminated_string,      ///< A String field has no NUL terminator inside its message.
  trailing_bytes,           ///< A message has bytes left after its last field.
  invalid_value,            ///< A field holds a value outside its domain (a flag, a kind byte...).
  unexpected_message,       ///< A well-formed message that the protocol state does not allow here.
  auth_unsupported,         ///< The server asks for an authentication method we do not implement.
  auth_failed,              ///< Authentication exchange failed (bad server proof, missing password).
  server_error,             ///< The server sent an ErrorResponse; details are in the message text.
  tls_unavailable,          ///< TLS was required but the server refused it.
  connection_closed,        ///< The peer closed the connection.
  timeout,                  ///< A wait ran out of time.
  limit_exceeded,           ///< A resource limit (count, size) was exceeded.
  unsupported_by_server,    ///< An option was requested that this server version does not support.
};

const boost::system::error_category& protocol_category() noexcept;

inline boost::system::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), protocol_category()};
}

/// A decoding error: what went wrong, in which message, and at which byte offset of the input.
struct decode_error {
  errc code = errc::ok;
  const char* what = "";    ///< Static string naming the message or field being decoded.
  std::size_t offset = 0;   ///< Offset of the failing read from the start of the decoded item.

  std::string message() const;
};

}  // namespace walgate::protocol

template <>
struct boost::system::is_error_code_enum<walgate::protocol::errc> : std::true_type {};
