// NDJSON over chunked HTTP (GET /v1/stream without Accept: text/event-stream): one event per
// line, a blank line as the idle keep-alive, and a last {"error":…,"resume_from":…} line.
#include "chunked_stream.hpp"

#include <boost/beast/ssl.hpp>

namespace walgate::proxy {

namespace {
struct ndjson_framing {
  static constexpr transport kind = transport::ndjson;
  static constexpr const char* content_type = "application/x-ndjson";
  static constexpr const char* keepalive = "\n";
  static constexpr const char* after = "\n";
  std::string preamble() const { return {}; }
  void before(std::string&, const subscription::item&) const {}
  std::string end(std::string line) const { return line + "\n"; }
};
}  // namespace

template <class Stream>
boost::asio::awaitable<void> serve_ndjson(server_core& core, Stream s, std::unique_ptr<chunked_start> start,
                                       connection_hold hold) {
  return chunked::serve(core, std::move(s), std::move(start), std::move(hold), ndjson_framing{});   // (no frame of its own)
}

WALGATE_INSTANTIATE_HTTP_TRANSPORT(serve_ndjson)

}  // namespace walgate::proxy
