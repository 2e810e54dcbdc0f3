// Feeds a byte stream to the backend message splitter the way a socket would: in pieces.
// Every parser test runs its input whole, split at every byte offset, and as two messages in
// one buffer, and must see the same messages each time.
#pragma once

#include "walgate/protocol/backend.hpp"

#include <boost/system/result.hpp>
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

// doctest prints the operands of a failed check; a result prints as "value" or its error.
namespace doctest {
template <class T, class E>
struct StringMaker<boost::system::result<T, E>> {
  static String convert(const boost::system::result<T, E>& r) {
    if (r.has_value()) return "result(value)";
    if constexpr (requires { r.error().message(); }) return ("result(error: " + r.error().message() + ")").c_str();
    else return "result(error)";
  }
};
}  // namespace doctest

namespace walgate::test {

/// (tag, body) of every message, reassembled from input delivered in the given pieces.
/// An error status is reported as a message with tag '!'.
inline std::vector<std::pair<char, std::string>> split_all(const std::vector<std::string>& pieces) {
  std::vector<std::pair<char, std::string>> out;
  std::string buffer;
  for (const auto& piece : pieces) {
    buffer += piece;
    for (;;) {
      auto r = protocol::split_backend_message(protocol::as_bytes(buffer));
      if (r.status == protocol::split_status::need_more) break;
      if (r.status == protocol::split_status::error) {
        out.emplace_back('!', r.error.message());
        return out;
      }
      out.emplace_back(r.message.tag, std::string(protocol::as_string_view(r.message.body)));
      buffer.erase(0, r.message.size);
    }
  }
  return out;
}

/// Runs check(messages) for the input whole, split in two at every offset, and byte by byte.
template <class Check>
void for_every_split(const std::string& input, Check check) {
  check(split_all({input}));
  for (std::size_t i = 0; i <= input.size(); ++i) check(split_all({input.substr(0, i), input.substr(i)}));
  std::vector<std::string> bytes;
  for (char c : input) bytes.emplace_back(1, c);
  check(split_all(bytes));
}

}  // namespace walgate::test
