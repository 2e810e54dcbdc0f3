// The server side of the replication protocol: startup packets, frontend messages, the
// replication command grammar (a lexer as repl_scanner.l, a recursive-descent parser as
// repl_gram.y) and the backend messages a server answers with. One file: the grammar is most of
// it, and its lexer and parser share the token type and nothing else here would use them.
#include "walgate/protocol/walsender.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace walgate::protocol::walsender {

namespace {

template <class T>
parse_result<T> fail(const cursor& c) {
  return c.error();
}

startup_split refused(errc code, const char* what, std::size_t offset) {
  startup_split r;
  r.status = split_status::error;
  r.error = {code, what, offset};
  return r;
}

}  // namespace

// --- the first packet ------------------------------------------------------------------------

startup_split split_startup_packet(bytes_view input) {
  startup_split r;
  if (input.size() < 4) return r;   // need_more
  cursor head(input);
  const std::uint32_t len = head.u32("startup packet length");
  // (before anything is buffered: a length the server never accepts is refused at once)
  if (len < 8 || len > max_startup_packet) return refused(errc::length_out_of_range, "startup packet length", 0);
  if (input.size() < len) return r;   // need_more
  cursor c(input.subspan(4, len - 4));
  const std::uint32_t code = c.u32("startup packet code");
  startup_packet& p = r.packet;
  p.size = len;
  if (code == ssl_request_code || code == gssenc_request_code) {
    if (len != 8) return refused(errc::length_out_of_range, code == ssl_request_code ? "SSLRequest length" : "GSSENCRequest length", 0);
    p.what = code == ssl_request_code ? startup_packet::kind::ssl_request : startup_packet::kind::gssenc_request;
    r.status = split_status::ready;
    return r;
  }
  if (code == cancel_request_code) {
    // (protocol 3.2, PostgreSQL 18: a key of up to 256 bytes; before, 4)
    if (len < 16 || len > 12 + 256) return refused(errc::length_out_of_range, "CancelRequest length", 0);
    p.what = startup_packet::kind::cancel_request;
    p.cancel_pid = c.i32("CancelRequest process ID");
    p.cancel_key = c.rest();
    r.status = split_status::ready;
    return r;
  }
  if ((code >> 16) != 3) return refused(errc::invalid_value, "startup packet protocol version", 4);
  p.what = startup_packet::kind::startup;
  p.version = code;
  for (;;) {
    const std::size_t at = c.offset();
    const std::string_view name = c.cstring("startup parameter name");
    if (!c.ok()) return refused(errc::unterminated_string, "startup packet terminator", 4 + at);
    if (name.empty()) break;   // the terminator
    const std::string_view value = c.cstring("startup parameter value");
    if (!c.ok()) return refused(errc::unterminated_string, "startup parameter value", 4 + c.offset());
    p.params.emplace_back(name, value);
  }
  if (!c.empty()) return refused(errc::trailing_bytes, "startup packet (bytes after its terminator)", 4 + c.offset());
  r.status = split_status::ready;
  return r;
}

std::optional<std::string_view> startup_param(const startup_packet& p, std::string_view name) {
  for (const auto& [k, v] : p.params)
    if (k == name) return v;
  return std::nullopt;
}

// --- tagged messages -------------------------------------------------------------------------

parse_result<std::string_view> parse_query(bytes_view body) {
  cursor c(body);
  const std::string_view text = c.cstring("Query text");
  c.expect_end("Query");
  if (!c.ok()) return fail<std::string_view>(c);
  return text;
}

parse_result<sasl_initial_response> parse_sasl_initial_response(bytes_view body) {
  cursor c(body);
  sasl_initial_response r;
  r.mechanism = c.cstring("SASLInitialResponse mechanism");
  const std::int32_t n = c.i32("SASLInitialResponse length");
  if (c.ok() && n < -1) c.fail(errc::length_out_of_range, "SASLInitialResponse length");
  if (c.ok() && n >= 0) r.data = c.bytes(static_cast<std::size_t>(n), "SASLInitialResponse data");
  c.expect_end("SASLInitialResponse");
  if (!c.ok()) return fail<sasl_initial_response>(c);
  return r;
}

// --- replication commands --------------------------------------------------------------------

namespace {

// The tokens of repl_scanner.l.
struct token {
  enum class kind { end, ident, quoted_ident, string, number, lsn, punct, bad } what = kind::end;
  std::string text;   // ident: folded; quoted_ident, string: unescaped; number, lsn: as written; punct: the char
  std::string_view raw;   // as written (for error messages)
};

bool ident_start(unsigned char ch) { return std::isalpha(ch) || ch == '_' || ch >= 0x80; }
bool ident_char(unsigned char ch) { return ident_start(ch) || std::isdigit(ch) || ch == '$'; }
bool space(unsigned char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }
bool hex(unsigned char ch) { return std::isxdigit(ch) != 0; }

class lexer {
 public:
  explicit lexer(std::string_view s) : s_(s) {}
  /// The NOTICEs the lexer raised (identifiers cut), in order.
  std::vector<std::string> notices;
  /// PostgreSQL's truncate_identifier: an identifier (quoted or not) cut to NAMEDATALEN - 1
  /// bytes, never inside a character, with its NOTICE.
  void cut(std::string& text) {
    if (text.size() <= max_identifier) return;
    std::size_t at = max_identifier;
    while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) --at;
    notices.push_back("identifier \"" + text + "\" will be truncated to \"" + text.substr(0, at) + "\"");
    text.resize(at);
  }
  /// The next token; kind::bad with text saying why.
  token next() {
    while (pos_ < s_.size() && space(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    token t;
    if (pos_ >= s_.size()) return t;
    const std::size_t start = pos_;
    const auto ch = static_cast<unsigned char>(s_[pos_]);
    if (ch == '"' || ch == '\'') {
      const char q = static_cast<char>(ch);
      ++pos_;
      for (;;) {
        if (pos_ >= s_.size()) {
          t.what = token::kind::bad;
          t.text = "unterminated quoted string";   // (PostgreSQL's text for both quotes)
          t.raw = s_.substr(start);
          return t;
        }
        if (s_[pos_] == q) {
          if (pos_ + 1 < s_.size() && s_[pos_ + 1] == q) {
            t.text.push_back(q);
            pos_ += 2;
            continue;
          }
          ++pos_;
          break;
        }
        t.text.push_back(s_[pos_++]);
      }
      t.raw = s_.substr(start, pos_ - start);
      if (q == '"') {
        // (Cut as an unquoted one is, and "" is an empty name: the replication lexer has no
        // zero-length error of its own — what is named by it is refused where it is used.)
        cut(t.text);
        t.what = token::kind::quoted_ident;
      } else {
        t.what = token::kind::string;
      }
      return t;
    }
    if (hex(ch)) {   // a number, an LSN (hex/hex), or an identifier starting with a letter a-f
      std::size_t e = pos_;
      while (e < s_.size() && hex(static_cast<unsigned char>(s_[e]))) ++e;
      if (e < s_.size() && s_[e] == '/') {
        std::size_t f = e + 1;
        while (f < s_.size() && hex(static_cast<unsigned char>(s_[f]))) ++f;
        if (f > e + 1 && (f >= s_.size() || !ident_char(static_cast<unsigned char>(s_[f])))) {
          t.what = token::kind::lsn;
          t.raw = s_.substr(pos_, f - pos_);
          t.text = std::string(t.raw);
          pos_ = f;
          return t;
        }
      }
      std::size_t d = pos_;
      while (d < s_.size() && std::isdigit(static_cast<unsigned char>(s_[d]))) ++d;
      if (d > pos_ && (d >= s_.size() || !ident_char(static_cast<unsigned char>(s_[d])))) {
        t.what = token::kind::number;
        t.raw = s_.substr(pos_, d - pos_);
        t.text = std::string(t.raw);
        pos_ = d;
        return t;
      }
    }
    if (ident_start(ch)) {
      std::size_t e = pos_;
      while (e < s_.size() && ident_char(static_cast<unsigned char>(s_[e]))) ++e;
      t.what = token::kind::ident;
      t.raw = s_.substr(pos_, e - pos_);
      for (char c : t.raw) t.text.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
      cut(t.text);
      pos_ = e;
      return t;
    }
    if (ch == '(' || ch == ')' || ch == ',' || ch == ';' || ch == '.' || ch == '-') {
      t.what = token::kind::punct;
      t.raw = s_.substr(pos_, 1);
      t.text = std::string(t.raw);
      ++pos_;
      return t;
    }
    t.what = token::kind::bad;
    t.raw = s_.substr(pos_, 1);
    t.text = "syntax error at or near \"" + std::string(t.raw) + "\"";
    return t;
  }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;
};

using command = replication_command;
using ck = replication_command::kind;

// The replication grammar (repl_gram.y) over the tokens, one token of lookahead.
class parser {
 public:
  explicit parser(std::string_view text) : lex_(text) { advance(); }

  command_result run() {
    command_result r;
    command c;
    // The first token decides whether this is a replication command at all.
    if (tok_.what != token::kind::ident) {
      c.what = ck::sql;
      r.command = std::move(c);
      return r;
    }
    const std::string first = tok_.text;
    if (first == "identify_system") {
      c.what = ck::identify_system;
      advance();
    } else if (first == "show") {
      c.what = ck::show;
      advance();
      if (!name_part(c.name)) return failed();
      while (is_punct('.')) {
        advance();
        std::string part;
        if (!name_part(part)) return failed();
        c.name += "." + part;
      }
    } else if (first == "create_replication_slot") {
      c.what = ck::create_slot;
      advance();
      if (!identifier(c.name)) return failed();
      if (is_keyword("temporary")) {
        c.temporary = true;
        advance();
      }
      if (is_keyword("logical")) {
        c.logical = true;
        advance();
        if (!identifier(c.plugin)) return failed();
      } else if (is_keyword("physical")) {
        advance();
      } else {
        return failed();
      }
      if (is_punct('(')) {
        if (!generic_options(c.options)) return failed();
      } else {
        // The legacy keywords, any number, in any order.
        for (;;) {
          if (is_keyword("export_snapshot")) c.options.push_back({"snapshot", "export"});
          else if (is_keyword("noexport_snapshot")) c.options.push_back({"snapshot", "nothing"});
          else if (is_keyword("use_snapshot")) c.options.push_back({"snapshot", "use"});
          else if (is_keyword("reserve_wal")) c.options.push_back({"reserve_wal", std::nullopt});
          else if (is_keyword("two_phase")) c.options.push_back({"two_phase", std::nullopt});
          else break;
          advance();
        }
      }
    } else if (first == "drop_replication_slot") {
      c.what = ck::drop_slot;
      advance();
      if (!identifier(c.name)) return failed();
      if (is_keyword("wait")) {
        c.wait = true;
        advance();
      }
    } else if (first == "alter_replication_slot") {
      c.what = ck::alter_slot;
      advance();
      if (!identifier(c.name)) return failed();
      if (!is_punct('(') || !generic_options(c.options)) return failed();
    } else if (first == "read_replication_slot") {
      c.what = ck::read_slot;
      advance();
      if (!identifier(c.name)) return failed();
    } else if (first == "timeline_history") {
      c.what = ck::timeline_history;
      advance();
      std::uint32_t tli = 0;
      if (!unsigned_number(tli)) return failed();
      c.timeline = tli;
    } else if (first == "start_replication") {
      c.what = ck::start_replication;
      advance();
      bool has_slot = false;
      if (is_keyword("slot")) {
        advance();
        if (!identifier(c.name)) return failed();
        has_slot = true;
      }
      if (is_keyword("logical")) {
        if (!has_slot) return failed();   // (START_REPLICATION SLOT name LOGICAL …: the slot is required)
        c.logical = true;
        advance();
      } else if (is_keyword("physical")) {
        advance();
      }
      if (tok_.what != token::kind::lsn) return failed();
      auto at = lsn::parse(tok_.text);
      if (!at) return failed("invalid streaming start location");
      c.start = *at;
      advance();
      if (c.logical) {
        if (is_punct('(')) {
          advance();
          for (;;) {
            command_option o;
            if (!identifier(o.name)) return failed();
            if (tok_.what == token::kind::string) {
              o.value = tok_.text;
              advance();
            }
            c.options.push_back(std::move(o));
            if (is_punct(',')) {
              advance();
              continue;
            }
            if (!is_punct(')')) return failed();
            advance();
            break;
          }
        }
      } else if (is_keyword("timeline")) {
        advance();
        std::uint32_t tli = 0;
        if (!unsigned_number(tli)) return failed();
        c.timeline = tli;
      }
    } else if (first == "base_backup" || first == "upload_manifest") {
      c.what = first == "base_backup" ? ck::base_backup : ck::upload_manifest;
      r.command = std::move(c);   // (the rest is not looked at: refused whatever it holds)
      return r;
    } else {
      c.what = ck::sql;
      r.command = std::move(c);
      return r;
    }
    if (is_punct(';')) advance();
    if (tok_.what != token::kind::end) return failed();
    r.command = std::move(c);
    return r;
  }

 private:
  void advance() { tok_ = lex_.next(); }
  bool is_keyword(std::string_view k) const { return tok_.what == token::kind::ident && tok_.text == k; }
  bool is_punct(char p) const { return tok_.what == token::kind::punct && tok_.text[0] == p; }

  command_result failed(std::string why = {}) const {
    command_result r;
    if (!why.empty()) r.error = std::move(why);
    else if (tok_.what == token::kind::bad) r.error = tok_.text;
    else if (tok_.what == token::kind::end) r.error = "syntax error at end of input";
    else r.error = "syntax error at or near \"" + std::string(tok_.raw) + "\"";
    return r;
  }
  /// An IDENT (folded or quoted), keywords included: the grammar's var_name and slot names
  /// accept any word the lexer gives as IDENT (keywords are not identifiers there; the
  /// clients that matter never name a slot after one).
  bool identifier(std::string& out) {
    if (tok_.what != token::kind::ident && tok_.what != token::kind::quoted_ident) return false;
    out = tok_.text;
    advance();
    return true;
  }
  bool name_part(std::string& out) { return identifier(out); }
  bool unsigned_number(std::uint32_t& out) {
    if (tok_.what != token::kind::number) return false;
    auto [p, ec] = std::from_chars(tok_.text.data(), tok_.text.data() + tok_.text.size(), out, 10);
    if (ec != std::errc{} || p != tok_.text.data() + tok_.text.size()) return false;
    advance();
    return true;
  }
  /// '(' name [value] (',' name [value])* ')': a value is a string, a number (optionally
  /// negative), or a word (true, false, a keyword).
  bool generic_options(std::vector<command_option>& out) {
    advance();   // '('
    for (;;) {
      command_option o;
      if (!identifier(o.name)) return false;
      if (tok_.what == token::kind::string || tok_.what == token::kind::number || tok_.what == token::kind::ident ||
          tok_.what == token::kind::quoted_ident) {
        o.value = tok_.text;
        advance();
      } else if (is_punct('-')) {
        advance();
        if (tok_.what != token::kind::number) return false;
        o.value = "-" + tok_.text;
        advance();
      }
      out.push_back(std::move(o));
      if (is_punct(',')) {
        advance();
        continue;
      }
      if (!is_punct(')')) return false;
      advance();
      return true;
    }
  }

  lexer lex_;
  token tok_;

 public:
  std::vector<std::string>& notices() { return lex_.notices; }
};

}  // namespace

command_result parse_replication_command(std::string_view text) {
  parser p(text);
  auto r = p.run();
  r.notices = std::move(p.notices());
  return r;
}

// --- builders --------------------------------------------------------------------------------

namespace {
std::string auth(std::int32_t code, std::string_view data) {
  writer w;
  w.begin_message('R').i32(code).raw(data).finish_message();
  return w.take();
}
std::string_view before_nul(std::string_view s) { return s.substr(0, s.find('\0')); }
}  // namespace

std::string build_authentication_ok() { return auth(0, {}); }

std::string build_authentication_sasl(const std::vector<std::string>& mechanisms) {
  writer w;
  w.begin_message('R').i32(10);
  for (const auto& m : mechanisms) w.cstring(before_nul(m));
  w.u8(0).finish_message();
  return w.take();
}

std::string build_authentication_sasl_continue(std::string_view data) { return auth(11, data); }
std::string build_authentication_sasl_final(std::string_view data) { return auth(12, data); }

std::string build_parameter_status(std::string_view name, std::string_view value) {
  if (name.find('\0') != std::string_view::npos || value.find('\0') != std::string_view::npos) return {};
  writer w;
  w.begin_message('S').cstring(name).cstring(value).finish_message();
  return w.take();
}

std::string build_backend_key_data(std::int32_t pid, std::int32_t key) {
  writer w;
  w.begin_message('K').i32(pid).i32(key).finish_message();
  return w.take();
}

std::string build_ready_for_query(char status) {
  writer w;
  w.begin_message('Z').u8(static_cast<std::uint8_t>(status)).finish_message();
  return w.take();
}

std::string build_error_response(const server_notice& n, bool error) {
  writer w;
  w.begin_message(error ? 'E' : 'N');
  auto field = [&w](char code, std::string_view v) {
    w.u8(static_cast<std::uint8_t>(code)).cstring(before_nul(v));
  };
  field('S', n.severity);
  field('V', n.severity);
  field('C', n.sqlstate);
  field('M', n.message);
  if (!n.detail.empty()) field('D', n.detail);
  if (!n.hint.empty()) field('H', n.hint);
  if (!n.context.empty()) field('W', n.context);
  w.u8(0).finish_message();
  return w.take();
}

std::string build_row_description(const std::vector<field_description>& fields) {
  writer w;
  w.begin_message('T').i16(static_cast<std::int16_t>(fields.size()));
  for (const auto& f : fields)
    w.cstring(before_nul(f.name)).u32(f.table_oid).i16(f.column).u32(f.type_oid).i16(f.type_size).i32(f.type_modifier).i16(f.format);
  w.finish_message();
  return w.take();
}

std::string build_data_row(const std::vector<std::optional<std::string_view>>& values) {
  writer w;
  w.begin_message('D').i16(static_cast<std::int16_t>(values.size()));
  for (const auto& v : values) {
    if (!v) {
      w.i32(-1);
      continue;
    }
    w.i32(static_cast<std::int32_t>(v->size())).raw(*v);
  }
  w.finish_message();
  return w.take();
}

std::string build_command_complete(std::string_view tag) {
  writer w;
  w.begin_message('C').cstring(before_nul(tag)).finish_message();
  return w.take();
}

std::string build_empty_query_response() {
  writer w;
  w.begin_message('I').finish_message();
  return w.take();
}

std::string build_copy_both_response() {
  writer w;
  w.begin_message('W').u8(0).u16(0).finish_message();
  return w.take();
}

std::string build_negotiate_protocol_version(std::uint32_t newest_minor, const std::vector<std::string_view>& unknown_options) {
  writer w;
  w.begin_message('v').u32((3u << 16) | newest_minor).i32(static_cast<std::int32_t>(unknown_options.size()));
  for (auto o : unknown_options) w.cstring(before_nul(o));
  w.finish_message();
  return w.take();
}

}  // namespace walgate::protocol::walsender
