// Client bytes: an HTTP request head through Beast's parser with walgate's limits, and every
// stream query string through parse_stream_query, and its Origin and Host through the checks. Never a crash, never an unbounded allocation.
#include "walgate/proxy/http_policy.hpp"
#include "walgate/proxy/stream_request.hpp"

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/json/src.hpp>   // header-only Boost.JSON and Boost.URL: the fuzz build links no Boost library
#include <boost/url/src.hpp>

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
    for (const auto& t : r->tables) {
      if (t.schema.empty() || t.schema.size() > 63 || t.table.size() > 63 || t.table.empty() != t.any) std::abort();
      // Written back in SQL's quoted form, a name parses to itself.
      std::string why;
      auto again = walgate::proxy::parse_table_list(walgate::proxy::sql_table_name(t), true, false, why);
      if (!again || again->size() != 1 || !((*again)[0] == t)) std::abort();
    }
  // The Origin and Host checks on whatever the head carried (or on the raw bytes): an origin that
  // passes without "*" allowed is none or the Host's own.
  std::string origin, host;
  if (parser.is_header_done()) {
    origin = std::string(parser.get()[http::field::origin]);
    host = std::string(parser.get()[http::field::host]);
  } else {
    origin = std::string(in.substr(0, in.size() / 2));
    host = std::string(in.substr(in.size() / 2));
  }
  static const std::vector<std::string> none;
  if (walgate::proxy::origin_allowed(origin, host, none) && !origin.empty() &&
      origin.find("://") == std::string::npos)
    std::abort();
  walgate::proxy::loopback_host_allowed(host, none);
  walgate::proxy::loopback_host_allowed(host, none, true);
  return 0;
}
