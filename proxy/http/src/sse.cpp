// Server-Sent Events (GET /v1/stream with Accept: text/event-stream): a retry: line first, then
// one event per change with its id (what a reconnecting EventSource sends as Last-Event-ID;
// with snapshot=true, the rows without one, then an "snapshot-end" event with the id), a
// comment as the idle keep-alive, and an "error" event that says why the stream ends and where
// to resume.
#include "chunked_stream.hpp"

#include <boost/beast/ssl.hpp>

namespace walgate::proxy {

namespace {
struct sse_framing {
  static constexpr transport kind = transport::sse;
  static constexpr const char* content_type = "text/event-stream";
  static constexpr const char* keepalive = ": keep-alive\n\n";
  static constexpr const char* after = "\n\n";
  std::chrono::milliseconds retry;
  std::string preamble() const { return "retry: " + std::to_string(retry.count()) + "\n\n"; }
  void before(std::string& out, const subscription::item& item) const {
    // Snapshot rows and the changes before the snapshot's end carry no id: an EventSource cut
    // off there reconnects without Last-Event-ID, and its snapshot starts again.
    using kind = subscription::kind;
    if (item.what == kind::snapshot_end) out += "event: snapshot-end\n";
    if (!item.event.empty()) {
      out += "event: ";
      out += item.event;
      out.push_back('\n');
    }
    if (item.what == kind::event || item.what == kind::snapshot_end) {
      out += "id: ";
      out += item.id.to_string();
      out.push_back('\n');
    }
    out += "data: ";
  }
  std::string end(std::string line) const { return "event: error\ndata: " + line + "\n\n"; }
};
}  // namespace

template <class Stream>
boost::asio::awaitable<void> serve_sse(server_core& core, Stream s, std::unique_ptr<chunked_start> start,
                                       connection_hold hold) {
  return chunked::serve(core, std::move(s), std::move(start), std::move(hold), sse_framing{core.opts.sse_retry});   // (no frame of its own)
}

WALGATE_INSTANTIATE_HTTP_TRANSPORT(serve_sse)

}  // namespace walgate::proxy
