#include "walgate/proxy/stream_request.hpp"

#include "walgate/proxy/predicate.hpp"

#include <boost/json/object.hpp>

#include "walgate/protocol/commands.hpp"

#include <boost/url/parse.hpp>

#include <algorithm>
#include <cctype>
#include <iterator>
#include <utility>

// Stream request parameters: parsed from untrusted query strings, so kept apart from the server
// (no Beast) for the fuzz target.
namespace walgate::proxy {

// --- request parameters --------------------------------------------------------------------

namespace {

bool valid_ident(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '-' ||
          static_cast<unsigned char>(c) >= 0x80))
      return false;
  return true;
}

/// One name at the start of s, plain or quoted: its stored form into out, s advanced past it.
bool take_name(std::string_view& s, std::string& out) {
  out.clear();
  if (!s.empty() && s.front() == '"') {
    std::size_t i = 1;
    while (true) {
      if (i >= s.size()) return false;   // no closing quote
      if (s[i] == '"') {
        if (i + 1 < s.size() && s[i + 1] == '"') {
          out += '"';
          i += 2;
          continue;
        }
        ++i;
        break;
      }
      if (s[i] == '\0') return false;
      out += s[i++];
    }
    s.remove_prefix(i);
    return !out.empty() && out.size() <= 63;
  }
  std::size_t n = 0;
  while (n < s.size() && s[n] != '.' && s[n] != ',' && s[n] != ' ') ++n;
  out = std::string(s.substr(0, n));
  s.remove_prefix(n);
  return out == "*" || valid_ident(out);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    auto p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) break;
    start = p + 1;
  }
  return out;
}

bool bool_param(std::string_view v, bool& out) {
  if (v == "true" || v == "1" || v == "yes") out = true;
  else if (v == "false" || v == "0" || v == "no") out = false;
  else return false;
  return true;
}

}  // namespace

std::optional<std::vector<table_pattern>> parse_table_list(std::string_view list, bool allow_any, bool schema_optional,
                                                           std::string& error) {
  std::vector<table_pattern> out;
  std::string_view rest = list;
  auto skip_spaces = [&rest] {
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  };
  while (true) {
    skip_spaces();
    std::string_view item_start = rest;
    auto item_text = [&] {
      auto comma = item_start.find(',');
      return std::string(item_start.substr(0, std::min<std::size_t>(comma, 200)));
    };
    auto malformed = [&] {
      error = "malformed table name '" + item_text() + "': use " +
              (allow_any ? "schema.table or schema.*" : schema_optional ? "table or schema.table" : "schema.table") +
              " (names may be quoted: \"My Schema\".\"Order Items\", \"a\"\"b\" for a\"b)";
    };
    table_pattern t;
    std::string first, second;
    bool quoted_first = !rest.empty() && rest.front() == '"';
    if (!take_name(rest, first) || (first == "*" && !quoted_first)) {
      malformed();
      return std::nullopt;
    }
    skip_spaces();
    if (!rest.empty() && rest.front() == '.') {
      rest.remove_prefix(1);
      skip_spaces();
      bool quoted = !rest.empty() && rest.front() == '"';
      if (!take_name(rest, second)) {
        malformed();
        return std::nullopt;
      }
      t.schema = std::move(first);
      if (second == "*" && !quoted) {
        if (!allow_any) {
          error = "'" + item_text() + "': a table list here names tables, not schema.*";
          return std::nullopt;
        }
        t.any = true;
      } else {
        t.table = std::move(second);
      }
    } else if (schema_optional) {
      t.table = std::move(first);
    } else {
      malformed();
      return std::nullopt;
    }
    skip_spaces();
    if (!rest.empty() && rest.front() != ',') {
      malformed();
      return std::nullopt;
    }
    out.push_back(std::move(t));
    if (rest.empty()) break;
    rest.remove_prefix(1);   // the comma
  }
  return out;
}

std::string sql_table_name(const table_pattern& t) {
  std::string out;
  if (!t.schema.empty()) out = protocol::quote_identifier(t.schema) + ".";
  return out + (t.any ? std::string("*") : protocol::quote_identifier(t.table));
}

std::optional<stream_request> parse_stream_query(std::string_view target, request_error& error) {
  stream_request r;
  auto u = boost::urls::parse_origin_form(target);
  if (!u) {
    error = {"url", "the request target is not a valid URL"};
    return std::nullopt;
  }
  static constexpr std::pair<const char*, bool stream_request::*> flags[] = {
      {"tombstones", &stream_request::tombstones},
      {"compact", &stream_request::compact},
      {"message_events", &stream_request::message_events},
      {"keys", &stream_request::keys},
      {"empty_transactions", &stream_request::empty_transactions},
      {"snapshot", &stream_request::snapshot}};
  for (auto p : u->params()) {
    std::string key = p.key, value = p.has_value ? std::string(p.value) : std::string();
    // The plain true/false parameters.
    if (auto flag = std::find_if(std::begin(flags), std::end(flags), [&](const auto& f) { return key == f.first; });
        flag != std::end(flags)) {
      if (!bool_param(value, r.*(flag->second))) {
        error = {key, "use true or false"};
        return std::nullopt;
      }
      continue;
    }
    if (key == "format") {
      if (value == "pgoutput2json-compact") {
        r.fmt = transform::format::pgoutput2json;
        r.compact = true;
      } else if (auto f = transform::parse_format(value)) {
        r.fmt = *f;
      } else {
        error = {"format", "unknown format '" + value + "': use native, debezium, pgoutput2json, waltail or wal2json"};
        return std::nullopt;
      }
    } else if (key == "tables") {
      std::string why;
      auto list = parse_table_list(value, true, false, why);
      if (!list) {
        error = {"tables", why};
        return std::nullopt;
      }
      r.tables.insert(r.tables.end(), list->begin(), list->end());
    } else if (key == "ops") {
      for (auto o : split(value, ',')) {
        char bit = o == "insert" ? 'c' : o == "update" ? 'u' : o == "delete" ? 'd' : o == "truncate" ? 't' : o == "message" ? 'm' : 0;
        if (!bit) {
          error = {"ops", "unknown op '" + std::string(o) + "': use insert, update, delete, truncate, message"};
          return std::nullopt;
        }
        r.ops |= 1u << (bit - 'a');
      }
    } else if (key == "from") {
      auto id = transform::event_id::parse(value);
      if (!id) {
        error = {"from", "malformed event id '" + value + "': use <commit_lsn>:<index>, e.g. 0/16B3748:0"};
        return std::nullopt;
      }
      r.from = id;
    } else if (key == "where") {
      if (r.where) {
        error = {"where", "where is given twice: join the conditions with and"};
        return std::nullopt;
      }
      std::string why;
      auto n = predicate::parse(value, why);
      if (!n) {
        error = {"where", why};
        return std::nullopt;
      }
      // Evaluated on every event the client passes over, on the event loop: bounded.
      if (const std::size_t c = predicate::cost(*n); c > predicate::max_where_cost) {
        error = {"where", "where is too complex: " + std::to_string(c) + " comparisons and list items, at most " +
                              std::to_string(predicate::max_where_cost)};
        return std::nullopt;
      }
      r.where = std::make_shared<const predicate::node>(std::move(*n));
    } else if (key == "access_token") {
      if (!r.access_token.empty()) {
        error = {"access_token", "access_token is given twice"};
        return std::nullopt;
      }
      if (value.empty()) {
        error = {"access_token", "an empty access_token"};
        return std::nullopt;
      }
      r.access_token = std::move(value);
    } else if (key == "transactions") {
      bool on = false;
      if (!bool_param(value, on)) {
        error = {"transactions", "use true or false"};
        return std::nullopt;
      }
      r.transactions = on;
    } else if (key == "prefixes") {
      for (auto x : split(value, ',')) {
        if (x.empty() || x.size() > 256) {
          error = {"prefixes", "a prefix is 1 to 256 bytes"};
          return std::nullopt;
        }
        r.prefixes.emplace_back(x);
      }
      if (r.prefixes.size() > 64) {
        error = {"prefixes", "at most 64 prefixes"};
        return std::nullopt;
      }
    } else if (key == "group") {
      if (value != "transaction") {
        error = {"group", "use group=transaction"};
        return std::nullopt;
      }
      r.group = true;
    } else {
      error = {key.empty() ? "query" : key, "unknown parameter '" + key + "'"};
      return std::nullopt;
    }
  }
  if (r.tombstones && r.fmt != transform::format::debezium) {
    error = {"tombstones", "tombstones are a debezium option"};
    return std::nullopt;
  }
  if (r.transactions.value_or(false) && (r.fmt == transform::format::pgoutput2json || r.fmt == transform::format::waltail)) {
    error = {"transactions", std::string(transform::to_string(r.fmt)) +
                                 " has no transaction records: use native, wal2json or debezium"};
    return std::nullopt;
  }
  if (!r.prefixes.empty() && r.ops && !(r.ops & (1u << ('m' - 'a')))) {
    error = {"prefixes", "prefixes selects logical messages: add message to ops"};
    return std::nullopt;
  }
  if (r.group && r.transactions.value_or(false)) {
    error = {"transactions", "group=transaction carries each transaction whole in one message, with its xid and commit: "
                             "leave out transactions=true"};
    return std::nullopt;
  }
  if (r.empty_transactions && !r.group &&
      (r.transactions == false || r.fmt == transform::format::pgoutput2json || r.fmt == transform::format::waltail)) {
    error = {"empty_transactions", "empty_transactions needs transaction records (transactions=true) or group=transaction"};
    return std::nullopt;
  }
  if (r.keys && (r.fmt == transform::format::native || r.fmt == transform::format::wal2json)) {
    error = {"keys", std::string(transform::to_string(r.fmt)) + " has no message key: use debezium, pgoutput2json or waltail"};
    return std::nullopt;
  }
  if (r.compact && r.fmt != transform::format::pgoutput2json) {
    error = {"compact", "compact is a pgoutput2json option"};
    return std::nullopt;
  }
  return r;
}

std::optional<std::string> parse_mux_query(std::string_view target, request_error& error) {
  auto u = boost::urls::parse_origin_form(target);
  if (!u) {
    error = {"query", "malformed request target"};
    return std::nullopt;
  }
  std::string token;
  for (auto p : u->params()) {
    if (p.key != "access_token") {
      error = {"query", "/v1/mux takes no parameters but access_token: send them in subscribe messages"};
      return std::nullopt;
    }
    if (!token.empty() || !p.has_value || p.value.empty()) {
      error = {"access_token", "access_token is given twice, or empty"};
      return std::nullopt;
    }
    token = std::string(p.value);
  }
  return token;
}

void instantiate_where(stream_request& r, const boost::json::object* claims) {
  if (!r.where) return;
  static const boost::json::object none;
  r.where = std::make_shared<const predicate::node>(predicate::instantiate(*r.where, claims ? *claims : none));
}

bool glob_match(std::string_view g, std::string_view t) {
  // Iterative, with one backtrack point: linear in practice, never exponential.
  std::size_t gi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (gi < g.size() && (g[gi] == '?' || g[gi] == t[ti])) {
      ++gi;
      ++ti;
    } else if (gi < g.size() && g[gi] == '*') {
      star = gi++;
      mark = ti;
    } else if (star != std::string_view::npos) {
      gi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (gi < g.size() && g[gi] == '*') ++gi;
  return gi == g.size();
}

}  // namespace walgate::proxy
