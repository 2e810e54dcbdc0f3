// The server side of the replication protocol (issue 35: walgate answering replication clients —
// pg_recvlogical, PostgreSQL subscribers, Debezium — as a walsender would): what a client sends,
// parsed into views or owned values, and the backend messages a server answers with, built.
// No sockets: the listener (proxy/) feeds bytes in and writes what these build.
//
// Sources of truth: PostgreSQL's src/backend/tcop/backend_startup.c (ProcessStartupPacket),
// src/backend/replication/repl_scanner.l and repl_gram.y (the replication command grammar, 13–18),
// and the protocol chapter of the documentation (message formats).
//
// Assumptions, each broken by a test in tests/protocol/walsender_test.cpp:
// - a startup packet may arrive in any number of pieces, and a client may send anything as its
//   length (a length below 8 or above 10,000 bytes is refused before anything is buffered);
// - a StartupMessage's parameters are (name, value) pairs closed by one NUL, and nothing follows
//   the terminator (PostgreSQL: "invalid startup packet layout");
// - a Query's text is one NUL-terminated string filling its message;
// - a replication command's keywords are case-insensitive, its identifiers are folded to lower
//   case unless double-quoted ("" inside a quoted one is a quote) and cut to 63 bytes either way
//   (with PostgreSQL's NOTICE), its strings
//   are single-quoted ('' inside is a quote), one trailing semicolon is allowed;
// - a Query whose first token is not a replication command's keyword is SQL (kind::sql), as a
//   walsender connected to a database treats it.
#pragma once

#include "walgate/protocol/backend.hpp"
#include "walgate/protocol/cursor.hpp"
#include "walgate/protocol/lsn.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace walgate::protocol::walsender {

/// PostgreSQL's MAX_STARTUP_PACKET_LENGTH (src/include/libpq/pqcomm.h).
inline constexpr std::size_t max_startup_packet = 10000;
/// CancelRequest code (1234 << 16 | 5678); GSSENCRequest (1234 << 16 | 5680).
inline constexpr std::uint32_t cancel_request_code = 80877102;
inline constexpr std::uint32_t gssenc_request_code = 80877104;
/// PostgreSQL's NAMEDATALEN - 1: an unquoted identifier longer than this is cut.
inline constexpr std::size_t max_identifier = 63;

// --- The first packet of a connection ------------------------------------------------------

/// An untagged packet: Int32 length (counting itself) | Int32 code | the rest. Views point into
/// the input handed to split_startup_packet.
struct startup_packet {
  enum class kind { startup, ssl_request, gssenc_request, cancel_request } what = kind::startup;
  std::uint32_t version = 0;   ///< startup: the protocol version asked for (major << 16 | minor)
  std::vector<std::pair<std::string_view, std::string_view>> params;   ///< startup: in order
  std::int32_t cancel_pid = 0;                                         ///< cancel_request
  bytes_view cancel_key;                                               ///< cancel_request (4 bytes; up to 256 from 3.2)
  std::size_t size = 0;                                                ///< bytes of input it took
};
struct startup_split {
  split_status status = split_status::need_more;
  startup_packet packet;
  decode_error error;
};
/// Splits the first packet off input and parses it: need_more until it is whole; error for a
/// length outside [8, max_startup_packet], a protocol major version other than 3, a parameter
/// without a value, a missing terminator or bytes after it, a cancel request of another size.
startup_split split_startup_packet(bytes_view input);

/// The value of a startup parameter, or nullopt.
std::optional<std::string_view> startup_param(const startup_packet& p, std::string_view name);

// --- Tagged messages from the client ---------------------------------------------------------

/// A frontend message (Byte1 tag | Int32 length | body) split off input: the same framing as a
/// backend message (backend.hpp's split_backend_message), with the limit the server chooses.
inline split_result split_frontend_message(bytes_view input, std::size_t max_length) noexcept {
  return split_backend_message(input, max_length);
}

/// Query 'Q': its text (one String filling the body).
parse_result<std::string_view> parse_query(bytes_view body);

/// SASLInitialResponse 'p': the mechanism and the client's first message (nullopt: length -1).
struct sasl_initial_response {
  std::string_view mechanism;
  std::optional<bytes_view> data;
};
parse_result<sasl_initial_response> parse_sasl_initial_response(bytes_view body);

// --- Replication commands --------------------------------------------------------------------

/// An option of CREATE_REPLICATION_SLOT, ALTER_REPLICATION_SLOT or START_REPLICATION: its name
/// (folded as an identifier), and its value as written (a string's content, a number's or a
/// keyword's text), nullopt when none was given.
struct command_option {
  std::string name;
  std::optional<std::string> value;
  bool operator==(const command_option&) const = default;
};

struct replication_command {
  enum class kind {
    identify_system,
    show,                    ///< SHOW name (name: dotted, folded)
    create_slot,             ///< CREATE_REPLICATION_SLOT
    drop_slot,               ///< DROP_REPLICATION_SLOT name [WAIT]
    alter_slot,              ///< ALTER_REPLICATION_SLOT name ( options )
    read_slot,               ///< READ_REPLICATION_SLOT name
    start_replication,       ///< START_REPLICATION
    timeline_history,        ///< TIMELINE_HISTORY tli
    base_backup,             ///< BASE_BACKUP … (not parsed further: refused by a logical-only server)
    upload_manifest,         ///< UPLOAD_MANIFEST (likewise)
    sql,                     ///< not a replication command: SQL
  } what = kind::sql;
  std::string name;          ///< the slot (create, drop, alter, read; start when given) or SHOW's variable
  bool temporary = false;    ///< create
  bool logical = false;      ///< create, start: LOGICAL (else physical)
  std::string plugin;        ///< create logical
  /// create: the parenthesised options, or the legacy keywords as the server maps them
  /// (EXPORT_SNAPSHOT → snapshot 'export', NOEXPORT_SNAPSHOT → 'nothing', USE_SNAPSHOT → 'use',
  /// RESERVE_WAL → reserve_wal, TWO_PHASE → two_phase); alter: its options; start logical: the
  /// plugin's options, in order.
  std::vector<command_option> options;
  bool wait = false;         ///< drop
  lsn start;                 ///< start
  std::optional<std::uint32_t> timeline;   ///< start physical TIMELINE n; timeline_history
};

/// Parses a Query's text. kind::sql when its first token is not a replication command's keyword
/// (then nothing else is looked at); an error ("syntax error at or near …", or what the lexer
/// found wrong) when it is one but the rest does not follow the grammar.
struct command_result {
  std::optional<replication_command> command;
  std::string error;
  /// NOTICEs to send first, with SQLSTATE 42622: each identifier cut to 63 bytes, as
  /// PostgreSQL's lexer says it ("identifier "…" will be truncated to "…"").
  std::vector<std::string> notices;
};
command_result parse_replication_command(std::string_view text);

// --- What the server answers -----------------------------------------------------------------

std::string build_authentication_ok();
/// AuthenticationSASL: the mechanisms offered, in order.
std::string build_authentication_sasl(const std::vector<std::string>& mechanisms);
std::string build_authentication_sasl_continue(std::string_view data);
std::string build_authentication_sasl_final(std::string_view data);
/// Returns an empty string when name or value holds a NUL byte.
std::string build_parameter_status(std::string_view name, std::string_view value);
std::string build_backend_key_data(std::int32_t pid, std::int32_t key);
/// status: 'I' idle, 'T' in a transaction, 'E' in a failed one.
std::string build_ready_for_query(char status);
/// ErrorResponse 'E' (error = true) or NoticeResponse 'N': S and V the severity, C, M, and D, H,
/// W when not empty. Fields holding a NUL byte are cut there.
std::string build_error_response(const server_notice& n, bool error = true);
std::string build_row_description(const std::vector<field_description>& fields);
/// DataRow: each value, nullopt for NULL.
std::string build_data_row(const std::vector<std::optional<std::string_view>>& values);
std::string build_command_complete(std::string_view tag);
std::string build_empty_query_response();
/// CopyBothResponse 'W': text format, no columns (what a walsender sends before streaming).
std::string build_copy_both_response();
/// NegotiateProtocolVersion 'v': the newest minor version served, and the protocol options
/// (_pq_.*) of the startup packet it does not know.
std::string build_negotiate_protocol_version(std::uint32_t newest_minor, const std::vector<std::string_view>& unknown_options);

}  // namespace walgate::protocol::walsender
