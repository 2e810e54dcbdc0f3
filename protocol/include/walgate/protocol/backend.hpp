// Messages the server sends (protocol 3.0), split out of a byte stream and parsed into views.
//
// Lifetime: every string_view and bytes_view in these structs points into the buffer handed to
// the parser, and is valid until that buffer is consumed or changed (for a connection: until the
// next read from the socket).
#pragma once

#include "walgate/protocol/cursor.hpp"
#include "walgate/protocol/error.hpp"

#include <boost/system/result.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::protocol {

template <class T>
using parse_result = boost::system::result<T, decode_error>;

/// Throws std::runtime_error; used only by result<T, decode_error>::value(), i.e. never on the
/// data path (which checks has_error() first).
[[noreturn]] void throw_exception_from_error(const decode_error& e,
                                             const boost::source_location& loc);

/// The largest message body we accept from the server. PostgreSQL builds every message in a
/// StringInfo, which cannot grow past MaxAllocSize (src/include/utils/memutils.h: 0x3fffffff),
/// so no legitimate message is larger; the connection may set a smaller limit.
inline constexpr std::size_t max_backend_message_length = 0x3fffffff;

/// A tagged backend message: Byte1 tag | Int32 length (counts itself) | body.
struct backend_message {
  char tag = 0;
  bytes_view body;        ///< length - 4 bytes, a view into the input.
  std::size_t size = 0;   ///< Bytes the message occupies in the input, tag included.
};

enum class split_status { ready, need_more, error };

struct split_result {
  split_status status = split_status::need_more;
  backend_message message;
  decode_error error;
};

/// Splits the first message off the front of input. need_more when the header or body is not
/// complete yet; error when the length field is below 4 or above max_length. Does not copy.
split_result split_backend_message(bytes_view input,
                                   std::size_t max_length = max_backend_message_length) noexcept;

// --- Authentication ('R') ------------------------------------------------------------------

enum class auth_code : std::int32_t {
  ok = 0,
  kerberos_v5 = 2,
  cleartext_password = 3,
  md5_password = 5,
  scm_credential = 6,
  gss = 7,
  gss_continue = 8,
  sspi = 9,
  sasl = 10,
  sasl_continue = 11,
  sasl_final = 12,
};

struct authentication {
  auth_code code = auth_code::ok;
  bytes_view md5_salt;                          ///< 4 bytes for md5_password.
  std::vector<std::string_view> mechanisms;     ///< For sasl: the offered SASL mechanisms.
  bytes_view sasl_data;                         ///< For sasl_continue / sasl_final.
};
parse_result<authentication> parse_authentication(bytes_view body);

/// Name of an authentication method for error messages ("GSSAPI", "SSPI"...).
std::string_view auth_code_name(auth_code code);

// --- ErrorResponse ('E') and NoticeResponse ('N') -----------------------------------------

/// Owned copy: errors outlive the receive buffer (they are reported after the connection closes).
struct server_notice {
  std::string severity;   ///< 'V' (non-localized) if present, else 'S'.
  std::string sqlstate;   ///< 'C'
  std::string message;    ///< 'M'
  std::string detail;     ///< 'D'
  std::string hint;       ///< 'H'
  std::string context;    ///< 'W'

  /// "SEVERITY:  message (SQLSTATE xxxxx)\nDETAIL:  ...\nHINT:  ..." as psql prints it.
  std::string to_string() const;
};
parse_result<server_notice> parse_error_or_notice(bytes_view body);

// --- Simple-query results ------------------------------------------------------------------

struct parameter_status {
  std::string_view name;
  std::string_view value;
};
parse_result<parameter_status> parse_parameter_status(bytes_view body);

struct backend_key_data {
  std::int32_t pid = 0;
  bytes_view secret;   ///< 4 bytes with protocol 3.0.
};
parse_result<backend_key_data> parse_backend_key_data(bytes_view body);

/// ReadyForQuery: transaction status 'I' idle, 'T' in transaction, 'E' failed transaction.
parse_result<char> parse_ready_for_query(bytes_view body);

struct field_description {
  std::string_view name;
  std::uint32_t table_oid = 0;
  std::int16_t column = 0;
  std::uint32_t type_oid = 0;
  std::int16_t type_size = 0;
  std::int32_t type_modifier = 0;
  std::int16_t format = 0;
};
/// A named limit on RowDescription/DataRow columns: MaxTupleAttributeNumber is 1664
/// (src/include/access/htup_details.h); nothing legitimate exceeds it.
inline constexpr std::size_t max_result_columns = 1664;
parse_result<std::vector<field_description>> parse_row_description(bytes_view body);

/// DataRow: each column is a view, or nullopt for SQL NULL.
parse_result<std::vector<std::optional<std::string_view>>> parse_data_row(bytes_view body);

/// CommandComplete: the command tag ("SELECT 1", "CREATE_REPLICATION_SLOT"...).
parse_result<std::string_view> parse_command_complete(bytes_view body);

/// CopyBothResponse / CopyOutResponse: overall format (0 text, 1 binary) and column count.
struct copy_response {
  std::uint8_t format = 0;
  std::uint16_t columns = 0;
};
parse_result<copy_response> parse_copy_response(bytes_view body);

// --- Frontend messages (builders) ----------------------------------------------------------

/// Protocol version 3.0, the one every server since 7.4 speaks.
inline constexpr std::uint32_t protocol_version_3_0 = 196608;
/// SSLRequest code (1234 << 16 | 5679).
inline constexpr std::uint32_t ssl_request_code = 80877103;

/// StartupMessage: Int32 len | Int32 196608 | (String name, String value)* | Byte1 0.
/// Returns an empty string if a name or value contains a NUL byte.
std::string build_startup(const std::vector<std::pair<std::string, std::string>>& params);
/// SSLRequest: Int32 8 | Int32 80877103.
std::string build_ssl_request();
/// PasswordMessage 'p': String password (cleartext or "md5..." hash).
std::string build_password(std::string_view password);
/// SASLInitialResponse 'p': String mechanism | Int32 len | Byte(len) initial response.
std::string build_sasl_initial_response(std::string_view mechanism, std::string_view data);
/// SASLResponse 'p': Byte(n) data.
std::string build_sasl_response(std::string_view data);
/// Query 'Q': String sql. Returns an empty string if sql contains a NUL byte.
std::string build_query(std::string_view sql);
/// CopyData 'd': Byte(n) payload.
std::string build_copy_data(std::string_view payload);
/// CopyDone 'c'.
std::string build_copy_done();
/// Terminate 'X'.
std::string build_terminate();

// --- Builders of backend messages, used by tests and fuzz seeds -----------------------------
std::string build_backend_message(char tag, std::string_view body);

}  // namespace walgate::protocol
