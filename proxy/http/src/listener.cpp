// The server: binds the listening socket, accepts connections within the connection limits
// (pausing when they, or the process's file descriptors, run out), and gives each connection to
// a coroutine of its own (serve_connection, http_session.cpp: the TLS handshake, its requests,
// its stream).
#include "serving.hpp"

#include "walgate/proxy/tls_server.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <cerrno>

namespace walgate::proxy {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using asio::awaitable;

namespace {
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);


}  // namespace

std::string address_of(const tcp::socket& socket) {
  boost::system::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  if (ec) return "unknown";
  std::array<unsigned char, 16> b{};
  const auto a = ep.address();
  if (a.is_v4()) {
    auto v4 = a.to_v4().to_bytes();
    std::copy(v4.begin(), v4.end(), b.begin());
    return peer_key(false, b);
  }
  auto v6 = a.to_v6().to_bytes();
  std::copy(v6.begin(), v6.end(), b.begin());
  return peer_key(true, b);
}

struct server::impl : std::enable_shared_from_this<server::impl> {
  impl(asio::any_io_executor ex, server_options o, gateway& g, server_status s)
      : core(ex, std::move(o), g, std::move(s)), acceptor(ex) {}

  server_core core;
  tcp::acceptor acceptor;

  awaitable<void> accept_loop() {
    auto self = shared_from_this();
    asio::steady_timer pause(core.executor);
    auto wait = [&](std::chrono::milliseconds d) -> awaitable<void> {
      ++core.accept_pauses;
      pause.expires_after(d);
      co_await pause.async_wait(use_tuple);
    };
    while (!core.stopping) {
      // At the connection limit, new connections wait in the listen backlog until one closes.
      // (Unless a waiting connection may give its place: the newcomer takes it, make_room.)
      if (core.connections >= core.opts.max_clients + core.opts.max_other_connections && !core.any_replaceable()) {
        co_await wait(std::chrono::milliseconds(50));
        continue;
      }
      auto [ec, socket] = co_await acceptor.async_accept(use_tuple);
      if (ec) {
        if (core.stopping) break;
        // Out of file descriptors or memory: the connection stays queued and accept would fail
        // again at once; wait instead of spinning.
        if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space || ec == asio::error::no_memory ||
            ec.value() == ENFILE)
          co_await wait(std::chrono::milliseconds(100));
        continue;
      }
      // Its place among the connections that are not streams: another of its address (or, at
      // 256 in all, of any) that waits may be closed for it; with none waiting, 429.
      std::string address = address_of(socket);
      if (!core.make_room(address)) {
        ++core.connections_refused_address;
        const std::string body = "{\"error\":\"too many connections from this address, each busy with a request (limit " +
                                 std::to_string(core.opts.max_other_connections) +
                                 " for one address, --max-other-connections); try again\"}\n";
        const std::string refused = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                                    "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
        boost::system::error_code wec;
        socket.non_blocking(true, wec);
        socket.write_some(asio::buffer(refused.data(), refused.size()), wec);   // (best effort: a fresh socket takes it)
        socket.shutdown(tcp::socket::shutdown_send, wec);
        socket.close(wec);
        continue;
      }
      // Events are written as they come, in small batches: no Nagle delay behind an
      // unacknowledged segment (it meets the client's delayed ACK: 40 ms stalls).
      boost::system::error_code nec;
      socket.set_option(tcp::no_delay(true), nec);
      // The connection's one coroutine (its frame is what an idle client costs, with its
      // stream and subscription): the server's state is kept alive while it runs.
      asio::co_spawn(core.executor,
                     core.tls ? serve_connection<beast::ssl_stream<beast::tcp_stream>>(core, std::move(socket), self,
                                                                                       std::move(address))
                              : serve_connection<beast::tcp_stream>(core, std::move(socket), self, std::move(address)),
                     asio::detached);
    }
  }
};

server::server(asio::any_io_executor ex, server_options opts, gateway& gw, server_status status)
    : impl_(std::make_shared<impl>(ex, std::move(opts), gw, std::move(status))) {}

server::~server() { stop(); }

bool server::start(std::string& error) {
  auto& core = impl_->core;
  auto& acceptor = impl_->acceptor;
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(core.opts.host, ec);
  if (ec) {
    error = "--listen: invalid address '" + core.opts.host + "'";
    return false;
  }
  if (!core.opts.tls_cert.empty()) {
    core.tls = make_server_tls(core.opts.tls_cert, core.opts.tls_key, error);
    if (!core.tls) return false;
  }
  core.loopback_listener = addr.is_loopback();
  // Without authentication, whatever the address (0.0.0.0 in a container, published on
  // 127.0.0.1): a page re-pointed at it by DNS rebinding would read every change through its
  // visitor's browser. Host is checked then.
  core.check_host = core.loopback_listener || !core.opts.auth;
  tcp::endpoint ep(addr, core.opts.port);
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    error = "cannot listen on " + core.opts.host + ":" + std::to_string(core.opts.port) + ": " + ec.message();
    return false;
  }
  asio::co_spawn(core.executor, impl_->accept_loop(), asio::detached);
  return true;
}

std::uint16_t server::port() const {
  boost::system::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void server::stop() {
  auto& core = impl_->core;
  if (core.stopping) return;
  core.stopping = true;
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
  core.notify();
  core.detach();
}

bool server::reload_tls(std::string& error) {
  auto& core = impl_->core;
  if (!core.tls) {
    error = "no TLS is configured";
    return false;
  }
  auto next = make_server_tls(core.opts.tls_cert, core.opts.tls_key, error);
  if (!next) return false;
  core.tls = std::move(next);   // for the connections accepted from now on; the others keep theirs
  return true;
}

void server::notify() { impl_->core.notify(); }
std::size_t server::clients() const { return impl_->core.clients.size(); }

}  // namespace walgate::proxy
