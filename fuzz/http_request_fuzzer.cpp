// Client bytes: an HTTP request head through Beast's parser with walgate's limits, and every
// stream query string through parse_stream_query. Never a crash, never an unbounded allocation.
#include "walgate/proxy/server.hpp"

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/url/src.hpp>   // header-only Boost.URL: the fuzz build links no Boost library

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace http = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  http::request_parser<http::empty_body> parser;
  parser.header_limit(12 * 1024);
  parser.body_limit(0);
  parser.eager(true);
  boost::system::error_code ec;
  std::size_t used = parser.put(boost::asio::buffer(in.data(), in.size()), ec);
  if (used > size) std::abort();
  std::string target = parser.is_header_done() ? std::string(parser.get().target()) : std::string(in);
  walgate::proxy::request_error err;
  auto r = walgate::proxy::parse_stream_query(target, err);
  if (!r && err.parameter.empty()) std::abort();   // every refusal names what was wrong
  if (r)
    for (const auto& [schema, table] : r->tables)
      if (schema.empty() || table.empty()) std::abort();
  return 0;
}
