// A PostgreSQL client connection over our own implementation of the wire protocol
// (Boost.Asio sockets, OpenSSL for TLS; libpq is used only to parse the connection string).
//
// One instance per connection, used from one strand (its executor). Every wait has a timeout.
// Views returned by read_message() point into the receive buffer and are valid until the next
// read.
#pragma once

#include "walgate/protocol/backend.hpp"
#include "walgate/proxy/conninfo.hpp"
#include "walgate/proxy/failure.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace walgate::proxy {

struct query_result {
  std::vector<std::string> columns;
  std::vector<std::vector<std::optional<std::string>>> rows;
  std::string command_tag;
};

struct connection_info {
  std::string host;
  std::uint16_t port = 0;
  std::string address;              ///< The IP connected to over TCP (empty for a Unix socket).
  bool tls = false;
  std::string auth_method;          ///< "trust", "password", "md5", "SCRAM-SHA-256", "SCRAM-SHA-256-PLUS".
  int server_major = 0;
  std::string server_version;
  std::map<std::string, std::string> parameters;   ///< ParameterStatus values.
};

class pg_connection {
 public:
  explicit pg_connection(boost::asio::any_io_executor ex);
  ~pg_connection();
  pg_connection(const pg_connection&) = delete;
  pg_connection& operator=(const pg_connection&) = delete;

  /// Connects to the first endpoint that answers and is what params.target_session_attrs asks
  /// for (unset: any), negotiates TLS per sslmode, starts up (with replication=database when
  /// replication is true) and authenticates. log, when set, is told of each host passed over
  /// and why.
  boost::asio::awaitable<outcome<void>> connect(const conn_params& params, bool replication,
                                                std::function<void(const std::string&)> log = {});

  /// Runs one statement (SQL, or a replication command) with the simple query protocol.
  boost::asio::awaitable<outcome<query_result>> query(std::string sql);

  /// Sends START_REPLICATION (or any command answered by CopyBothResponse) and waits for the
  /// CopyBothResponse.
  boost::asio::awaitable<outcome<void>> start_copy_both(std::string command);

  /// Reads the next message of the copy stream. Returns the CopyData payload as a view valid
  /// until the next read; an empty optional when the server ended the copy (CopyDone).
  /// NoticeResponse and ParameterStatus are handled in passing. No timeout: the caller watches
  /// for silence (see replication_stream).
  boost::asio::awaitable<outcome<std::optional<protocol::bytes_view>>> read_copy_data();

  /// Queues bytes for writing; one write is in flight at a time, in order. Safe to call while
  /// a read is pending.
  void send(std::string bytes);
  /// Waits until everything queued has been written (with the I/O timeout).
  boost::asio::awaitable<outcome<void>> flush();

  /// Closes the socket; pending operations complete with an error.
  void close();
  bool is_open() const;
  /// Bytes received and not yet read as messages: in its buffer, and waiting in the socket.
  std::size_t backlog() const;

  const connection_info& info() const;
  /// Timeout for each handshake and query step (default 30 s, or connect_timeout).
  void set_io_timeout(std::chrono::milliseconds t);
  /// Receives NoticeResponse text ("WARNING:  ..."); default: ignored.
  void set_notice_handler(std::function<void(const protocol::server_notice&)> h);
  /// Largest message body accepted from the server (default: MaxAllocSize).
  void set_max_message_length(std::size_t n);
  /// When set, every byte read from the server is appended to this file (fuzz seed capture).
  void set_capture_file(std::string path);

 private:
  boost::asio::awaitable<outcome<session_state>> find_session_state();
  struct impl;
  std::shared_ptr<impl> impl_;   // shared with its own timer and write handlers
};

}  // namespace walgate::proxy
