// The streaming-replication sub-protocol carried inside CopyData messages.
//
// Lifetime: xlog_data::data is a view into the CopyData payload, which is a view into the
// connection's receive buffer: valid until the next read from the socket. Nothing is copied.
#pragma once

#include "walgate/protocol/backend.hpp"
#include "walgate/protocol/lsn.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace walgate::protocol {

/// XLogData 'w': Byte1 'w' | Int64 wal_start | Int64 wal_end | Int64 server clock | Byte(n) data
struct xlog_data {
  lsn wal_start;          ///< WAL position of the start of this message's data.
  lsn wal_end;            ///< Current end of WAL on the server.
  std::int64_t server_clock_us = 0;  ///< Server time, PostgreSQL-epoch microseconds.
  bytes_view data;        ///< One pgoutput message.
};

/// Primary keepalive 'k': Byte1 'k' | Int64 wal_end | Int64 server clock | Byte1 reply requested
struct primary_keepalive {
  lsn wal_end;
  std::int64_t server_clock_us = 0;
  bool reply_requested = false;
};

/// Standby status update 'r' (sent by us): Byte1 'r' | Int64 written | Int64 flushed |
/// Int64 applied | Int64 client clock | Byte1 reply requested. Each position is
/// "last WAL byte + 1"; flushed is what advances the slot's confirmed_flush_lsn.
struct standby_status_update {
  lsn written;
  lsn flushed;
  lsn applied;
  std::int64_t client_clock_us = 0;
  bool reply_requested = false;
};

/// The payload of one CopyData message in a replication stream.
struct copy_payload {
  enum class kind { xlog_data, keepalive } type = kind::xlog_data;
  xlog_data xlog;
  primary_keepalive keepalive;
};

/// Parses a CopyData payload sent by a walsender: 'w' or 'k'. Anything else is unknown_message.
parse_result<copy_payload> parse_copy_payload(bytes_view payload) noexcept;

/// Builds the CopyData payload of a status update (without the CopyData framing).
std::string build_standby_status_update(const standby_status_update& s);
/// Builds a whole CopyData message carrying a status update, ready to write to the socket.
std::string build_standby_status_message(const standby_status_update& s);

/// Builders of server payloads, used by tests and fuzz seeds.
std::string build_xlog_data(const xlog_data& x);
/// Appends a whole CopyData message carrying x (build_copy_data(build_xlog_data(x))) to out,
/// with no copy of x.data but the one into out: what walgate's walsender sends, where a 'w'
/// may hold a whole transaction (wal2json's format 1). x.data is at most 1 GiB.
void append_copy_xlog_data(std::string& out, const xlog_data& x);
std::string build_primary_keepalive(const primary_keepalive& k);
/// Parses a status update payload (the reverse of build_standby_status_update), for tests.
parse_result<standby_status_update> parse_standby_status_update(bytes_view payload) noexcept;

}  // namespace walgate::protocol
