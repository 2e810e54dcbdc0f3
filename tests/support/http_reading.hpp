// Reading a streamed HTTP response in tests: the bytes left in the buffer after a read.
#pragma once
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

namespace walgate::test {

/// Parses what the buffer holds that can be parsed (eagerly: every chunk in it). What is left
/// needs more bytes, so a reader waits for the socket before it reads again — a blocking read
/// with a chunk's end in the buffer would wait for the next chunk (a keep-alive 15 s later).
/// The parser is left not eager: an eager one makes http::read_some read again after a whole
/// chunk (it asks for the next one) instead of returning.
inline void parse_buffered(boost::beast::http::response_parser<boost::beast::http::string_body>& p,
                           boost::beast::flat_buffer& b) {
  p.eager(true);
  boost::system::error_code ec;
  while (b.size() != 0 && !p.is_done()) {
    const auto used = p.put(b.data(), ec);
    b.consume(used);
    if (ec || used == 0) break;
  }
  p.eager(false);
}

}  // namespace walgate::test
