#include "walgate/protocol/backend.hpp"

#include <cstring>
#include <stdexcept>

namespace walgate::protocol {

void throw_exception_from_error(const decode_error& e, const boost::source_location&) {
  throw std::runtime_error(e.message());
}

namespace {
template <class T>
parse_result<T> fail(const cursor& c) {
  return c.error();
}
}  // namespace

// Byte1 tag | Int32 length (includes itself, not the tag) | Byte(length - 4) body
split_result split_backend_message(bytes_view input, std::size_t max_length) noexcept {
  split_result r;
  if (input.size() < 5) return r;  // need_more
  cursor c(input);
  char tag = static_cast<char>(c.u8("message tag"));
  std::uint32_t len = c.u32("message length");
  if (len < 4 || len - 4 > max_length) {
    r.status = split_status::error;
    r.error = {errc::length_out_of_range, "message length", 1};
    return r;
  }
  std::size_t total = std::size_t{1} + len;
  if (input.size() < total) return r;  // need_more
  r.status = split_status::ready;
  r.message.tag = tag;
  r.message.body = input.subspan(5, len - 4);
  r.message.size = total;
  return r;
}

std::string_view auth_code_name(auth_code code) {
  switch (code) {
    case auth_code::ok: return "ok";
    case auth_code::kerberos_v5: return "Kerberos V5";
    case auth_code::cleartext_password: return "password";
    case auth_code::md5_password: return "md5";
    case auth_code::scm_credential: return "SCM credentials";
    case auth_code::gss: return "GSSAPI";
    case auth_code::gss_continue: return "GSSAPI (continue)";
    case auth_code::sspi: return "SSPI";
    case auth_code::sasl: return "SASL";
    case auth_code::sasl_continue: return "SASL (continue)";
    case auth_code::sasl_final: return "SASL (final)";
  }
  return "unknown";
}

// Int32 code | code-specific payload:
//   5 (md5): Byte4 salt;  10 (SASL): String mechanism* | Byte1 0;  11/12: Byte(n) data
parse_result<authentication> parse_authentication(bytes_view body) {
  cursor c(body);
  authentication a;
  a.code = static_cast<auth_code>(c.i32("Authentication code"));
  switch (a.code) {
    case auth_code::md5_password:
      a.md5_salt = c.bytes(4, "AuthenticationMD5Password salt");
      break;
    case auth_code::sasl:
      for (;;) {
        std::string_view m = c.cstring("AuthenticationSASL mechanism");
        if (!c.ok() || m.empty()) break;
        if (a.mechanisms.size() >= 16) {
          c.fail(errc::limit_exceeded, "AuthenticationSASL mechanism count");
          break;
        }
        a.mechanisms.push_back(m);
      }
      break;
    case auth_code::sasl_continue:
    case auth_code::sasl_final:
      a.sasl_data = c.rest();
      break;
    case auth_code::gss_continue:
      c.rest();
      break;
    default:
      break;
  }
  c.expect_end("Authentication");
  if (!c.ok()) return fail<authentication>(c);
  return a;
}

std::string server_notice::to_string() const {
  std::string out = severity.empty() ? "ERROR" : severity;
  out += ":  ";
  out += message;
  if (!sqlstate.empty()) out += " (SQLSTATE " + sqlstate + ")";
  if (!detail.empty()) out += "\nDETAIL:  " + detail;
  if (!hint.empty()) out += "\nHINT:  " + hint;
  return out;
}

// (Byte1 field type | String value)* | Byte1 0
parse_result<server_notice> parse_error_or_notice(bytes_view body) {
  cursor c(body);
  server_notice n;
  std::string localized_severity;
  for (;;) {
    std::uint8_t type = c.u8("ErrorResponse field type");
    if (!c.ok() || type == 0) break;
    std::string_view v = c.cstring("ErrorResponse field value");
    if (!c.ok()) break;
    switch (type) {
      case 'S': localized_severity = v; break;
      case 'V': n.severity = v; break;
      case 'C': n.sqlstate = v; break;
      case 'M': n.message = v; break;
      case 'D': n.detail = v; break;
      case 'H': n.hint = v; break;
      case 'W': n.context = v; break;
      default: break;  // position, schema, table, file, line, routine: not reported
    }
  }
  c.expect_end("ErrorResponse");
  if (!c.ok()) return fail<server_notice>(c);
  if (n.severity.empty()) n.severity = std::move(localized_severity);
  return n;
}

// String name | String value
parse_result<parameter_status> parse_parameter_status(bytes_view body) {
  cursor c(body);
  parameter_status p;
  p.name = c.cstring("ParameterStatus name");
  p.value = c.cstring("ParameterStatus value");
  c.expect_end("ParameterStatus");
  if (!c.ok()) return fail<parameter_status>(c);
  return p;
}

// Int32 pid | Byte(n) secret key (4 bytes in protocol 3.0)
parse_result<backend_key_data> parse_backend_key_data(bytes_view body) {
  cursor c(body);
  backend_key_data k;
  k.pid = c.i32("BackendKeyData pid");
  if (c.remaining() < 4 || c.remaining() > 256) c.fail(errc::length_out_of_range, "BackendKeyData key");
  k.secret = c.rest();
  if (!c.ok()) return fail<backend_key_data>(c);
  return k;
}

// Byte1 status
parse_result<char> parse_ready_for_query(bytes_view body) {
  cursor c(body);
  char s = static_cast<char>(c.u8("ReadyForQuery status"));
  if (c.ok() && s != 'I' && s != 'T' && s != 'E') c.fail(errc::invalid_value, "ReadyForQuery status");
  c.expect_end("ReadyForQuery");
  if (!c.ok()) return fail<char>(c);
  return s;
}

// Int16 n | n × (String name | Int32 table | Int16 column | Int32 type | Int16 size |
//                Int32 typmod | Int16 format)
parse_result<std::vector<field_description>> parse_row_description(bytes_view body) {
  cursor c(body);
  std::uint16_t n = c.u16("RowDescription field count");
  if (c.ok() && n > max_result_columns) c.fail(errc::length_out_of_range, "RowDescription field count");
  std::vector<field_description> out;
  if (!c.ok()) return fail<std::vector<field_description>>(c);
  out.reserve(n);
  for (std::uint16_t i = 0; i < n && c.ok(); ++i) {
    field_description f;
    f.name = c.cstring("RowDescription name");
    f.table_oid = c.u32("RowDescription table");
    f.column = c.i16("RowDescription column");
    f.type_oid = c.u32("RowDescription type");
    f.type_size = c.i16("RowDescription size");
    f.type_modifier = c.i32("RowDescription typmod");
    f.format = c.i16("RowDescription format");
    out.push_back(f);
  }
  c.expect_end("RowDescription");
  if (!c.ok()) return fail<std::vector<field_description>>(c);
  return out;
}

// Int16 n | n × (Int32 len (-1 = NULL) | Byte(len))
parse_result<std::vector<std::optional<std::string_view>>> parse_data_row(bytes_view body) {
  using row = std::vector<std::optional<std::string_view>>;
  cursor c(body);
  std::uint16_t n = c.u16("DataRow column count");
  if (c.ok() && n > max_result_columns) c.fail(errc::length_out_of_range, "DataRow column count");
  row out;
  if (!c.ok()) return fail<row>(c);
  out.reserve(n);
  for (std::uint16_t i = 0; i < n && c.ok(); ++i) {
    std::int32_t len = c.i32("DataRow value length");
    if (!c.ok()) break;
    if (len == -1) {
      out.emplace_back(std::nullopt);
      continue;
    }
    if (len < 0) {
      c.fail(errc::length_out_of_range, "DataRow value length");
      break;
    }
    out.emplace_back(as_string_view(c.bytes(static_cast<std::size_t>(len), "DataRow value")));
  }
  c.expect_end("DataRow");
  if (!c.ok()) return fail<row>(c);
  return out;
}

// String tag
parse_result<std::string_view> parse_command_complete(bytes_view body) {
  cursor c(body);
  std::string_view tag = c.cstring("CommandComplete tag");
  c.expect_end("CommandComplete");
  if (!c.ok()) return fail<std::string_view>(c);
  return tag;
}

// Int8 format | Int16 n | n × Int16 column format
parse_result<copy_response> parse_copy_response(bytes_view body) {
  cursor c(body);
  copy_response r;
  r.format = c.u8("CopyResponse format");
  r.columns = c.u16("CopyResponse column count");
  if (c.ok() && r.format > 1) c.fail(errc::invalid_value, "CopyResponse format");
  c.bytes(std::size_t{2} * r.columns, "CopyResponse column formats");
  c.expect_end("CopyResponse");
  if (!c.ok()) return fail<copy_response>(c);
  return r;
}

// --- builders -------------------------------------------------------------------------------

std::string build_startup(const std::vector<std::pair<std::string, std::string>>& params) {
  writer w;
  w.begin_message(0).u32(protocol_version_3_0);
  for (const auto& [k, v] : params) {
    if (k.find('\0') != std::string::npos || v.find('\0') != std::string::npos) return {};
    w.cstring(k).cstring(v);
  }
  w.u8(0).finish_message();
  return w.take();
}

std::string build_ssl_request() {
  writer w;
  w.u32(8).u32(ssl_request_code);
  return w.take();
}

std::string build_password(std::string_view password) {
  writer w;
  w.begin_message('p').cstring(password).finish_message();
  return w.take();
}

std::string build_sasl_initial_response(std::string_view mechanism, std::string_view data) {
  writer w;
  w.begin_message('p').cstring(mechanism).i32(static_cast<std::int32_t>(data.size())).raw(data).finish_message();
  return w.take();
}

std::string build_sasl_response(std::string_view data) {
  writer w;
  w.begin_message('p').raw(data).finish_message();
  return w.take();
}

std::string build_query(std::string_view sql) {
  if (sql.find('\0') != std::string_view::npos) return {};
  writer w;
  w.begin_message('Q').cstring(sql).finish_message();
  return w.take();
}

std::string build_copy_data(std::string_view payload) {
  writer w;
  w.begin_message('d').raw(payload).finish_message();
  return w.take();
}

std::string build_copy_done() {
  writer w;
  w.begin_message('c').finish_message();
  return w.take();
}

std::string build_terminate() {
  writer w;
  w.begin_message('X').finish_message();
  return w.take();
}

std::string build_backend_message(char tag, std::string_view body) {
  writer w;
  w.begin_message(tag).raw(body).finish_message();
  return w.take();
}

}  // namespace walgate::protocol
