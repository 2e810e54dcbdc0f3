// One HTTP connection, one coroutine (serve_connection): the TLS handshake when the listener has
// TLS, then requests (read with the header, URL and time limits) routed (route.cpp: an answer,
// or a stream admitted), the answers written, and a stream's snapshot waited for; a stream comes
// back from serve_http as a stream_handoff and goes to its transport, so that the request loop's
// frame is not kept for the life of the stream.
#include "route.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

namespace walgate::proxy {

namespace asio = boost::asio;
namespace beast = boost::beast;
using asio::awaitable;

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

template <class Stream>
awaitable<void> write_answer(server_core& core, Stream& s, unsigned version, const answer& a) {
  if (a.preflight) {
    http::response<http::empty_body> res{a.status, version};
    res.set(http::field::server, "walgate");
    set_cors(res, a.cors);
    res.set(http::field::access_control_allow_methods, "GET");
    res.set(http::field::access_control_allow_headers, "Accept, Authorization, Last-Event-ID, Cache-Control");
    res.set(http::field::access_control_max_age, "600");
    res.keep_alive(a.keep_alive);
    beast::get_lowest_layer(s).expires_after(core.opts.write_timeout);
    co_await http::async_write(s, res, use_tuple);
    co_return;
  }
  http::response<http::string_body> res{a.status, version};
  res.set(http::field::server, "walgate");
  if (!a.retry_after.empty()) res.set(http::field::retry_after, a.retry_after);
  if (!a.www_authenticate.empty()) res.set(http::field::www_authenticate, a.www_authenticate);
  set_cors(res, a.cors);
  res.set(http::field::content_type, a.content_type);
  res.set(http::field::cache_control, "no-store");
  res.keep_alive(a.keep_alive);
  res.body() = a.body;
  res.prepare_payload();
  beast::get_lowest_layer(s).expires_after(core.opts.write_timeout);
  co_await http::async_write(s, res, use_tuple);
}

template <class Stream>
awaitable<void> write_refusal(server_core& core, Stream& s, http::status st, std::string message) {
  answer a;
  a.status = st;
  a.body = json_error("", message);
  co_await write_answer(core, s, 11, a);
}

/// A stream whose snapshot job was admitted waits for it to begin (its transaction open, its
/// tables known) before the response begins, so that what fails there is an answer. A client
/// that hangs up meanwhile is noticed at once: its job goes (cancelled), and its place in the
/// queue with it. True: begun; false with no answer: the client is gone.
template <class Stream>
awaitable<bool> wait_for_snapshot(server_core& core, Stream& s, const std::shared_ptr<snapshot_job>& job,
                                  std::optional<answer>& refused, std::string_view cors) {
  asio::steady_timer t(core.executor);
  job->set_wake([&t] { t.cancel(); });
  auto gone = std::make_shared<bool>(false), watching = std::make_shared<bool>(true);
  auto& sock = beast::get_lowest_layer(s).socket();
  sock.async_wait(asio::ip::tcp::socket::wait_read, [gone, watching, &t, &sock](boost::system::error_code ec) {
    if (ec || !*watching) return;
    if (peer_closed(sock.native_handle())) {
      *gone = true;
      t.cancel();
    }
  });
  while (!job->started() && job->current() != snapshot_job::state::failed && !core.stopping && !*gone) {
    t.expires_after(std::chrono::seconds(1));
    co_await t.async_wait(use_tuple);
  }
  job->set_wake({});
  *watching = false;
  boost::system::error_code ignored;
  sock.cancel(ignored);   // (the watch ends; the transport watches from here on)
  if (*gone) co_return false;   // (the job is cancelled as it goes)
  if (!job->started()) {
    const unsigned code = job->http_status() ? job->http_status() : 503;
    refused = snapshot_refused(code, core.stopping ? "server shutting down" : job->error(), cors);
    job->cancel();
    co_return false;
  }
  co_return true;
}

}  // namespace

template <class Stream>
awaitable<std::optional<stream_handoff>> serve_http(server_core& core, Stream& s, const std::string& address) {
  const auto& opts = core.opts;
  beast::flat_buffer buffer;
  const std::string peer = address_of(beast::get_lowest_layer(s).socket());
  while (!core.stopping) {
    http::request_parser<http::empty_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(opts.header_limit + opts.url_limit));
    parser.body_limit(0);
    beast::get_lowest_layer(s).expires_after(opts.header_timeout);
    // Waiting for a request's head (an idle keep-alive too): another connection may take this
    // one's place meanwhile (server_core::make_room closes it).
    std::optional<waiting_mark> waiting;
    waiting.emplace(core, address, [&s] { beast::get_lowest_layer(s).close(); });
    auto [ec, n] = co_await http::async_read(s, buffer, parser, use_tuple);
    waiting.reset();
    if (ec == http::error::header_limit) {
      co_await write_refusal(core, s, http::status::request_header_fields_too_large, "request header fields too large");
      co_return std::nullopt;
    }
    if (ec == http::error::body_limit) {
      co_await write_refusal(core, s, http::status::payload_too_large, "request bodies are not accepted");
      co_return std::nullopt;
    }
    if (ec) co_return std::nullopt;   // closed, timed out (trickled headers) or malformed
    auto req = parser.release();
    const unsigned version = req.version();
    auto r = route(core, req, peer);
    if (r.reply) {
      co_await write_answer(core, s, version, *r.reply);
      if (!r.reply->keep_alive) co_return std::nullopt;
      continue;
    }
    if (r.snapshot && !r.snapshot->started()) {
      std::optional<answer> refused;
      if (!co_await wait_for_snapshot(core, s, r.snapshot, refused, r.stream->cors)) {
        if (refused) co_await write_answer(core, s, version, *refused);
        co_return std::nullopt;
      }
    }
    if (r.snapshot) begin_with(*r.stream, std::move(r.snapshot));
    co_return std::move(r.stream);
  }
  co_return std::nullopt;
}

template <class Stream>
awaitable<void> serve_connection(server_core& core, asio::ip::tcp::socket socket, std::shared_ptr<void> keep,
                                 std::string address) {
  // Counted, the server kept, and the TLS context it began with (a reload replaces core.tls),
  // while the connection lives; and its place among those that are not streams until it is one.
  connection_hold hold{counted(core.connections), std::move(keep), {}, std::nullopt, std::nullopt};
  non_stream_place place(core, std::move(address));
  constexpr bool tls = !std::is_same_v<Stream, beast::tcp_stream>;
  auto make = [&] {
    if constexpr (tls) {
      hold.tls_context = core.tls;
      return Stream(beast::tcp_stream(std::move(socket)), *core.tls);
    } else {
      return Stream(std::move(socket));
    }
  };
  std::optional<Stream> held(make());
  Stream& s = *held;
  if constexpr (tls) {
    beast::get_lowest_layer(s).expires_after(core.opts.header_timeout);
    waiting_mark waiting(core, place.address(), [&s] { beast::get_lowest_layer(s).close(); });
    auto [ec] = co_await s.async_handshake(asio::ssl::stream_base::server, use_tuple);
    if (ec) co_return;
  }
  auto h = co_await serve_http(core, s, place.address());
  if (!h) co_return;
  place.release();   // a stream now: --max-clients and the stream limits count it
  // Every stream is served by a coroutine of its own, which takes the connection over (this
  // one, its frame and the request's state, ends here). It takes, over TLS, its stream, else
  // the bare socket — the Beast stream (its body and timers) is freed here, not kept idle for
  // the connection's life — and its places under the limits.
  auto handed = [&] {
    if (h->admitted) hold.admitted.emplace(std::move(*h->admitted));
    if (h->slot) hold.slot.emplace(std::move(*h->slot));
    if constexpr (tls) {
      return std::move(s);
    } else {
      auto socket = s.release_socket();
      held.reset();
      return socket;
    }
  };
  switch (h->what) {
    // (handed() first: it moves the limits' places into hold.)
    case stream_handoff::to::ndjson:
    case stream_handoff::to::sse: {
      auto taken = handed();
      auto start = std::make_unique<chunked_start>(chunked_start{std::move(h->start), h->version, std::move(h->cors)});
      if (h->what == stream_handoff::to::sse)
        asio::co_spawn(core.executor, serve_sse(core, std::move(taken), std::move(start), std::move(hold)), asio::detached);
      else
        asio::co_spawn(core.executor, serve_ndjson(core, std::move(taken), std::move(start), std::move(hold)),
                       asio::detached);
      break;
    }
    case stream_handoff::to::websocket: {
      auto taken = handed();
      asio::co_spawn(core.executor,
                     serve_websocket(core, std::move(taken), std::move(h->req), std::move(h->start), std::move(hold)),
                     asio::detached);
      break;
    }
    case stream_handoff::to::mux: {
      auto taken = handed();
      asio::co_spawn(core.executor,
                     serve_websocket_mux(core, std::move(taken), std::move(h->req), std::move(h->start.who),
                                         std::move(h->peer), std::move(hold)),
                     asio::detached);
      break;
    }
  }
}

template awaitable<void> serve_connection<beast::tcp_stream>(server_core&, asio::ip::tcp::socket, std::shared_ptr<void>,
                                                             std::string);
template awaitable<void> serve_connection<beast::ssl_stream<beast::tcp_stream>>(server_core&, asio::ip::tcp::socket,
                                                                                std::shared_ptr<void>, std::string);

}  // namespace walgate::proxy
