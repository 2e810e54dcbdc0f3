// The end-to-end harness of the server tests: the gateway in-process on a real PostgreSQL (the
// test cluster), and clients over real sockets — a chunked-HTTP reader (NDJSON and SSE) and a
// WebSocket one — plus plain requests.
#pragma once

#include "walgate/proxy/gateway.hpp"
#include "walgate/proxy/server.hpp"

#include "http_reading.hpp"
#include "test_cluster.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace walgate::test::harness {

using namespace walgate::proxy;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace json = boost::json;
using tcp = asio::ip::tcp;


struct running_gateway {
  std::filesystem::path dir;
  std::unique_ptr<event_log> log;
  asio::io_context io;
  std::unique_ptr<gateway> gw;
  std::unique_ptr<replication_client> client;
  std::unique_ptr<server> srv;
  std::thread thread;
  bool own_dir = true;
  std::string slot_name;
  std::atomic<bool> ended{false};   // the replication client's run() returned
  std::string end_message;          // with this failure (set before ended)

  running_gateway(const std::string& slot, const std::string& publication, server_options so = {},
                  log_options lo = {}, const std::string& conninfo = {}) {
    slot_name = slot;
    std::string t = (std::filesystem::temp_directory_path() / "walgate-gw-XXXXXX").string();
    own_dir = lo.dir.empty();   // a given directory is the caller's (a restart on the same log)
    dir = own_dir ? std::filesystem::path(mkdtemp(t.data())) : lo.dir;
    std::string error;
    lo.dir = dir;
    lo.fsync = false;
    log = event_log::open(lo, error);
    REQUIRE_MESSAGE(log, error);
    gw = std::make_unique<gateway>(io.get_executor(), *log, protocol::assembler_options{});
    replication_settings rs;
    rs.conn = *parse_conninfo(conninfo.empty() ? test::cluster().conninfo() : conninfo).params;
    rs.slot = slot;
    rs.publications = {publication};
    rs.messages_when_supported = true;
    rs.status_interval = std::chrono::milliseconds(200);
    client = std::make_unique<replication_client>(io.get_executor(), rs, *gw);
    gw->set_reply_request([this] { client->request_reply(); });
    gw->set_backlog_probe([this] { return client->backlog(); });   // (as the walgate executable)
    so.port = 0;
    if (!so.server_wal_end) so.server_wal_end = [this] { return gw->metrics().server_wal_end; };   // (as the executable)
    if (so.snapshot.conninfo.empty()) {   // per-client snapshots from the same database
      so.snapshot.conninfo = conninfo.empty() ? test::cluster().conninfo() : conninfo;
      so.snapshot.publications = {publication};
    }
    server_status st;
    st.streaming = [this] { return client->streaming(); };
    st.reconnects = [this] { return client->reconnects(); };
    srv = std::make_unique<server>(io.get_executor(), so, *gw, st);
    REQUIRE_MESSAGE(srv->start(error), error);
    asio::co_spawn(io, client->run(), [this](std::exception_ptr, outcome<void> r) {
      if (!r) end_message = r.error().message;
      ended = true;
    });
    thread = std::thread([this] { io.run(); });
    REQUIRE(test::wait_until([this] { return client->streaming(); }));
  }
  std::uint16_t port() const { return srv->port(); }
  void stop_server() {
    asio::post(io, [this] { srv->stop(); });
  }
  ~running_gateway() {
    asio::post(io, [this] {
      srv->stop();
      client->stop();
      auto t = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(500));
      t->async_wait([this, t](boost::system::error_code) { io.stop(); });
    });
    thread.join();
    if (own_dir) {
      std::filesystem::remove_all(dir);
      // Its log is gone, so its slot is of no use to anyone: dropped (once its walsender has let
      // go of it), so that the suite's gateways stay within the cluster's max_replication_slots.
      const std::string where = " FROM pg_replication_slots WHERE slot_name = '" + slot_name + "'";
      test::wait_until(
          [&] {
            test::cluster().try_sql("SELECT pg_drop_replication_slot(slot_name)" + where + " AND NOT active");
            return test::cluster().try_sql("SELECT 1 / (1 - count(*))" + where).empty();   // (an error while it is there)
          },
          std::chrono::seconds(10));
    }
  }
};

/// Waits up to ms for the socket to become readable (asio's blocking reads ignore SO_RCVTIMEO).
inline bool wait_readable(tcp::socket& s, int ms) {
  pollfd p{s.native_handle(), POLLIN, 0};
  return ::poll(&p, 1, ms) > 0;
}

inline void set_timeout(tcp::socket& s, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/// An HTTP client that reads a streaming (chunked) response as it arrives.
struct stream_client {
  asio::io_context io;
  tcp::socket sock{io};
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  std::size_t consumed = 0, scanned = 0;
  bool ended = false;

  stream_client(std::uint16_t port, const std::string& target, const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    sock.connect({asio::ip::make_address("127.0.0.1"), port});
    set_timeout(sock, 10000);
    std::string req = "GET " + target + " HTTP/1.1\r\nHost: localhost\r\n";
    for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
    req += "\r\n";
    asio::write(sock, asio::buffer(req));
    parser.body_limit(boost::none);
    boost::system::error_code ec;
    http::read_header(sock, buf, parser, ec);
    test::parse_buffered(parser, buf);
    ended = static_cast<bool>(ec) || parser.is_done();   // (a whole answer: nothing more to read)
  }
  unsigned status() { return parser.get().result_int(); }
  std::string header(const char* name) { return std::string(parser.get()[name]); }
  /// Reads until the body holds `count` more complete lines (or EOF/timeout); returns them.
  std::vector<std::string> lines(std::size_t count) {
    std::vector<std::string> out;
    while (true) {
      auto& body = parser.get().body();
      std::size_t nl;
      // (searched from where the last search ended: a 100 MB line is not scanned once per read)
      while (out.size() < count) {
        nl = body.find('\n', std::max(consumed, scanned));
        if (nl == std::string::npos) {
          scanned = body.size();
          break;
        }
        out.push_back(body.substr(consumed, nl - consumed));
        consumed = nl + 1;
      }
      if (out.size() >= count || ended) return out;
      boost::system::error_code ec;
      // (bytes left after a read need more to parse: each read but a first one of what came
      // with the header waits for the socket)
      if (!wait_readable(sock, 10000)) {
        ended = true;   // nothing for 10 s
        return out;
      }
      http::read_some(sock, buf, parser, ec);
      test::parse_buffered(parser, buf);
      if (ec || parser.is_done()) ended = true;
    }
  }
  /// Non-blank NDJSON lines (at most 20 s: keep-alive blank lines do not extend the wait).
  std::vector<std::string> events(std::size_t count) {
    std::vector<std::string> out;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (out.size() < count && std::chrono::steady_clock::now() < deadline) {
      auto l = lines(1);
      if (l.empty()) break;
      if (!l[0].empty()) out.push_back(l[0]);
    }
    return out;
  }
  /// SSE events as (id, data).
  std::vector<std::pair<std::string, std::string>> sse(std::size_t count) {
    std::vector<std::pair<std::string, std::string>> out;
    std::string id, data;
    while (out.size() < count) {
      auto l = lines(1);
      if (l.empty()) break;
      const std::string& line = l[0];
      if (line.empty()) {
        if (!data.empty()) out.emplace_back(id, data);
        id.clear();
        data.clear();
      } else if (line.rfind("id: ", 0) == 0) {
        id = line.substr(4);
      } else if (line.rfind("data: ", 0) == 0) {
        data = line.substr(6);
      }
    }
    return out;
  }
};

struct ws_client {
  asio::io_context io;
  websocket::stream<tcp::socket> ws{io};
  explicit ws_client(std::uint16_t port, const std::string& target, bool deflate = false) {
    ws.next_layer().connect({asio::ip::make_address("127.0.0.1"), port});
    set_timeout(ws.next_layer(), 10000);
    if (deflate) {
      websocket::permessage_deflate pmd;
      pmd.client_enable = true;
      ws.set_option(pmd);
    }
    ws.handshake("localhost", target);
  }
  std::vector<std::string> messages(std::size_t count) {
    std::vector<std::string> out;
    while (out.size() < count) {
      beast::flat_buffer b;
      boost::system::error_code ec;
      ws.read(b, ec);
      if (ec) break;
      out.push_back(beast::buffers_to_string(b.data()));
    }
    return out;
  }
  /// Reads until the server closes; returns the close reason.
  websocket::close_reason wait_close() {
    beast::flat_buffer b;
    boost::system::error_code ec;
    while (!ec) ws.read(b, ec), b.consume(b.size());
    return ws.reason();
  }
};

/// A plain request; returns (status, body).
inline std::pair<unsigned, std::string> get(std::uint16_t port, const std::string& raw_request) {
  asio::io_context io;
  tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  set_timeout(s, 10000);
  asio::write(s, asio::buffer(raw_request));
  beast::flat_buffer b;
  http::response<http::string_body> res;
  boost::system::error_code ec;
  http::read(s, b, res, ec);
  if (ec) return {0, ec.message()};   // includes a connection closed before any response
  return {res.result_int(), res.body()};
}
inline std::pair<unsigned, std::string> get_path(std::uint16_t port, const std::string& target) {
  return get(port, "GET " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
}

/// A blocking POSIX socket connected to the gateway on 127.0.0.1 (raw clients that check bytes).
/// A TCP connection to port on 127.0.0.1; with rcvbuf, its receive buffer set to that before it
/// connects (a client whose socket holds little).
inline int loopback_socket(std::uint16_t port, int rcvbuf = 0) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  if (rcvbuf) REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) == 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

/// The value of an unlabelled metric in walgate's /metrics (required to be there).
inline long long metric_of(std::uint16_t port, const std::string& name) {
  const auto m = get_path(port, "/metrics").second;
  auto at = m.find("\n" + name + " ");
  REQUIRE_MESSAGE(at != std::string::npos, name << " not in /metrics");
  return std::atoll(m.c_str() + at + name.size() + 2);
}

inline std::string id_of(const std::string& native_json) { return std::string(json::parse(native_json).at("id").as_string()); }


}  // namespace walgate::test::harness
