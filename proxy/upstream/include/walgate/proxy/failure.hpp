// The error value of the proxy layer: a code, the text the user sees, and whether retrying the
// connection can help. Returned, never thrown, on every connection path.
#pragma once

#include "walgate/protocol/error.hpp"

#include <boost/system/result.hpp>

#include <string>

namespace walgate::proxy {

struct failure {
  boost::system::error_code code;
  std::string message;     ///< What happened and, where we know it, what to change.
  std::string sqlstate;    ///< Set when the server reported the error.
  bool retryable = true;   ///< false: reconnecting will fail the same way (bad config, auth).
  /// No host was taken, and at least one answered but was passed over for its state (not the
  /// target_session_attrs asked for: a standby, say, or its state could not be read): it may
  /// become the target any moment (a promotion under way), so reconnecting does not back off far.
  bool passed_for_state = false;
};

[[noreturn]] void throw_exception_from_error(const failure& f, const boost::source_location& loc);

template <class T>
using outcome = boost::system::result<T, failure>;

inline failure make_failure(protocol::errc e, std::string message, bool retryable = true) {
  return failure{make_error_code(e), std::move(message), {}, retryable};
}

}  // namespace walgate::proxy
