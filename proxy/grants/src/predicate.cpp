// Row predicates (predicate.hpp), the language: a bounded recursive-descent parser, claims
// substituted per token, the text written back, the equalities the row router indexes. A
// predicate bound to a relation and compared by the column's type: predicate_bound.cpp.
// About 520 lines, one file: the lexer, the parser and the text written back share the token,
// the limits and the quoting rules, and what is written back must read the same (a test checks).
#include "walgate/proxy/predicate.hpp"

#include "predicate_text.hpp"

#include <boost/json/value.hpp>

#include <algorithm>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

namespace walgate::proxy::predicate {

namespace json = boost::json;

namespace {

// --- lexing ----------------------------------------------------------------------------------

struct token {
  enum class kind { end, name, quoted_name, text, number, punct } k = kind::end;
  std::string text;   // name (as written), quoted name or string (unescaped), number, punctuation
  std::size_t at = 0;
};

bool name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || static_cast<unsigned char>(c) >= 0x80;
}


class lexer {
 public:
  explicit lexer(std::string_view s) : s_(s) {}
  bool next(token& t, std::string& error) {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    t = token{};
    t.at = pos_;
    if (pos_ >= s_.size()) return true;
    const char c = s_[pos_];
    if (c == '\'' || c == '"') {
      t.k = c == '\'' ? token::kind::text : token::kind::quoted_name;
      ++pos_;
      while (true) {
        if (pos_ >= s_.size()) {
          error = "at " + std::to_string(t.at) + ": an unterminated " + (c == '\'' ? "string" : "quoted name");
          return false;
        }
        if (s_[pos_] == c) {
          if (pos_ + 1 < s_.size() && s_[pos_ + 1] == c) {
            t.text += c;
            pos_ += 2;
            continue;
          }
          ++pos_;
          break;
        }
        t.text += s_[pos_++];
      }
      if (t.k == token::kind::quoted_name && t.text.empty()) {
        error = "at " + std::to_string(t.at) + ": an empty quoted name";
        return false;
      }
      return true;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) ||
        ((c == '-' || c == '+' || c == '.') && pos_ + 1 < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_ + 1])) || s_[pos_ + 1] == '.'))) {
      t.k = token::kind::number;
      std::size_t start = pos_, mantissa_digits = 0;
      if (s_[pos_] == '-' || s_[pos_] == '+') ++pos_;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_, ++mantissa_digits;
      if (pos_ < s_.size() && s_[pos_] == '.') {
        ++pos_;
        while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_, ++mantissa_digits;
      }
      if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
        std::size_t save = pos_++;
        if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
        if (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_])))
          while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
        else
          pos_ = save;
      }
      t.text = std::string(s_.substr(start, pos_ - start));
      if (mantissa_digits == 0) {
        error = "at " + std::to_string(t.at) + ": a number without digits";
        return false;
      }
      return true;
    }
    if (name_char(c)) {
      t.k = token::kind::name;
      std::size_t start = pos_;
      while (pos_ < s_.size() && name_char(s_[pos_])) ++pos_;
      t.text = std::string(s_.substr(start, pos_ - start));
      return true;
    }
    t.k = token::kind::punct;
    for (std::string_view p : {"!=", "<>", "<=", ">="})
      if (s_.substr(pos_, 2) == p) {
        t.text = std::string(p);
        pos_ += 2;
        return true;
      }
    if (std::string_view("=<>(),{}.").find(c) != std::string_view::npos) {
      t.text = std::string(1, c);
      ++pos_;
      return true;
    }
    error = "at " + std::to_string(t.at) + ": unexpected character '" +
            (static_cast<unsigned char>(c) < 0x20 ? std::string("?") : std::string(1, c)) + "'";
    return false;
  }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;
};

// --- parsing ---------------------------------------------------------------------------------

class parser {
 public:
  parser(std::string_view s, std::string& error) : lex_(s), error_(error) {}

  std::optional<node> run() {
    if (!advance()) return std::nullopt;
    auto n = expr(0);
    if (!n) return std::nullopt;
    if (cur_.k != token::kind::end) return fail("and, or or the end");
    return n;
  }

 private:
  lexer lex_;
  std::string& error_;
  token cur_;
  std::size_t comparisons_ = 0;

  bool advance() { return lex_.next(cur_, error_); }
  std::optional<node> fail(const std::string& expected) {
    std::string got = cur_.k == token::kind::end ? "the end" : "'" + cur_.text.substr(0, 40) + "'";
    error_ = "at " + std::to_string(cur_.at) + ": expected " + expected + ", found " + got;
    return std::nullopt;
  }
  bool is_keyword(std::string_view w) const { return cur_.k == token::kind::name && iequals(cur_.text, w); }
  bool is_punct(std::string_view p) const { return cur_.k == token::kind::punct && cur_.text == p; }

  std::optional<node> expr(int depth) {
    if (depth > max_depth) {
      error_ = "at " + std::to_string(cur_.at) + ": more than " + std::to_string(max_depth) + " levels of parentheses";
      return std::nullopt;
    }
    node any;
    any.k = node::kind::any;
    while (true) {
      node all;
      all.k = node::kind::all;
      while (true) {
        auto f = factor(depth);
        if (!f) return std::nullopt;
        all.children.push_back(std::move(*f));
        if (!is_keyword("and")) break;
        if (!advance()) return std::nullopt;
      }
      any.children.push_back(all.children.size() == 1 ? std::move(all.children[0]) : std::move(all));
      if (!is_keyword("or")) break;
      if (!advance()) return std::nullopt;
    }
    if (any.children.size() == 1) return std::move(any.children[0]);
    return any;
  }

  std::optional<node> factor(int depth) {
    if (is_punct("(")) {
      if (!advance()) return std::nullopt;
      auto n = expr(depth + 1);
      if (!n) return std::nullopt;
      if (!is_punct(")")) return fail("')'");
      if (!advance()) return std::nullopt;
      return n;
    }
    node n;
    n.k = node::kind::compare;
    if (cur_.k == token::kind::quoted_name) {
      n.c.column = cur_.text;
    } else if (cur_.k == token::kind::name && !is_keyword("and") && !is_keyword("or") && !is_keyword("in") &&
               !is_keyword("is") && !is_keyword("null") && !is_keyword("not") && !is_keyword("true") &&
               !is_keyword("false")) {
      n.c.column = cur_.text;
    } else {
      return fail("a column name or '('");
    }
    if (n.c.column.size() > 63) {
      error_ = "at " + std::to_string(cur_.at) + ": a column name is at most 63 bytes";
      return std::nullopt;
    }
    if (++comparisons_ > max_comparisons) {
      error_ = "at " + std::to_string(cur_.at) + ": more than " + std::to_string(max_comparisons) + " comparisons";
      return std::nullopt;
    }
    if (!advance()) return std::nullopt;
    if (is_keyword("is")) {
      if (!advance()) return std::nullopt;
      n.c.op = cmp::is_null;
      if (is_keyword("not")) {
        n.c.op = cmp::is_not_null;
        if (!advance()) return std::nullopt;
      }
      if (!is_keyword("null")) return fail("null");
      if (!advance()) return std::nullopt;
      return n;
    }
    if (is_keyword("in")) {
      n.c.op = cmp::in;
      if (!advance()) return std::nullopt;
      if (is_punct("{")) {   // a claim that is a list
        auto o = claim();
        if (!o) return std::nullopt;
        n.c.rhs.push_back(std::move(*o));
        return n;
      }
      if (!is_punct("(")) return fail("'(' or a claim");
      if (!advance()) return std::nullopt;
      while (true) {
        auto o = value();
        if (!o) return std::nullopt;
        if (n.c.rhs.size() >= max_list) {
          error_ = "at " + std::to_string(cur_.at) + ": a list of more than " + std::to_string(max_list) + " items";
          return std::nullopt;
        }
        n.c.rhs.push_back(std::move(*o));
        if (is_punct(")")) break;
        if (!is_punct(",")) return fail("',' or ')'");
        if (!advance()) return std::nullopt;
      }
      if (!advance()) return std::nullopt;
      return n;
    }
    if (cur_.k != token::kind::punct) return fail("=, !=, <, <=, >, >=, in or is");
    const std::string& p = cur_.text;
    if (p == "=") n.c.op = cmp::eq;
    else if (p == "!=" || p == "<>") n.c.op = cmp::ne;
    else if (p == "<") n.c.op = cmp::lt;
    else if (p == "<=") n.c.op = cmp::le;
    else if (p == ">") n.c.op = cmp::gt;
    else if (p == ">=") n.c.op = cmp::ge;
    else return fail("=, !=, <, <=, >, >=, in or is");
    if (!advance()) return std::nullopt;
    auto o = value();
    if (!o) return std::nullopt;
    n.c.rhs.push_back(std::move(*o));
    return n;
  }

  std::optional<operand> value() {
    operand o;
    if (cur_.k == token::kind::text) {
      o.value = literal{literal::kind::text, cur_.text};
    } else if (cur_.k == token::kind::number) {
      o.value = literal{literal::kind::number, cur_.text};
    } else if (is_keyword("true") || is_keyword("false")) {
      o.value = literal{literal::kind::boolean, is_keyword("true") ? "true" : "false"};
    } else if (is_punct("{")) {
      return claim();
    } else {
      fail("a string ('…'), a number, true, false or a claim ({claims.name})");
      return std::nullopt;
    }
    if (!advance()) return std::nullopt;
    return o;
  }

  std::optional<operand> claim() {
    if (!advance()) return std::nullopt;   // past '{'
    if (!is_keyword("claims")) {
      fail("claims");
      return std::nullopt;
    }
    if (!advance()) return std::nullopt;
    operand o;
    while (is_punct(".")) {
      if (!advance()) return std::nullopt;
      if (cur_.k != token::kind::name && cur_.k != token::kind::quoted_name) {
        fail("a claim's name");
        return std::nullopt;
      }
      if (o.claim.size() >= 8) {
        error_ = "at " + std::to_string(cur_.at) + ": a claim path of more than 8 names";
        return std::nullopt;
      }
      o.claim.push_back(cur_.text);
      if (!advance()) return std::nullopt;
    }
    if (o.claim.empty()) {
      fail("'.' and a claim's name");
      return std::nullopt;
    }
    if (!is_punct("}")) {
      fail("'}'");
      return std::nullopt;
    }
    if (!advance()) return std::nullopt;
    return o;
  }
};

// --- claims ----------------------------------------------------------------------------------

const json::value* find_claim(const json::object& claims, const std::vector<std::string>& path) {
  const json::object* o = &claims;
  const json::value* v = nullptr;
  for (const auto& name : path) {
    if (!o) return nullptr;
    v = o->if_contains(name);
    if (!v) return nullptr;
    o = v->if_object();
  }
  return v;
}

std::optional<literal> to_literal(const json::value& v) {
  if (v.is_string()) return literal{literal::kind::text, std::string(v.get_string())};
  if (v.is_bool()) return literal{literal::kind::boolean, v.get_bool() ? "true" : "false"};
  if (v.is_int64()) return literal{literal::kind::number, std::to_string(v.get_int64())};
  if (v.is_uint64()) return literal{literal::kind::number, std::to_string(v.get_uint64())};
  if (v.is_double()) {   // the shortest digits that are this double, without an exponent (numeric reads them)
    char buf[400];
    auto r = std::to_chars(buf, buf + sizeof buf, v.get_double(), std::chars_format::fixed);
    if (r.ec != std::errc()) return std::nullopt;
    return literal{literal::kind::number, std::string(buf, r.ptr)};
  }
  return std::nullopt;
}

node constant(bool v) {
  node n;
  n.k = node::kind::constant;
  n.value = v;
  return n;
}

// --- text ------------------------------------------------------------------------------------

bool plain_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!name_char(c)) return false;
  for (std::string_view k : {"and", "or", "in", "is", "not", "null", "true", "false", "claims"})
    if (iequals(s, k)) return false;
  return !std::isdigit(static_cast<unsigned char>(s[0]));
}

std::string quote(std::string_view s, char q) {
  std::string out(1, q);
  for (char c : s) {
    out += c;
    if (c == q) out += q;
  }
  return out + q;
}

std::string operand_text(const operand& o) {
  if (!o.claim.empty()) {
    std::string out = "{claims";
    for (const auto& n : o.claim) out += "." + (plain_name(n) ? n : quote(n, '"'));
    return out + "}";
  }
  if (o.value->k == literal::kind::text) return quote(o.value->text, '\'');
  return o.value->text;
}

}  // namespace

// --- public ----------------------------------------------------------------------------------

std::optional<node> parse(std::string_view text, std::string& error) {
  if (text.size() > max_text) {
    error = "a predicate is at most " + std::to_string(max_text) + " bytes";
    return std::nullopt;
  }
  if (text.find('\0') != std::string_view::npos) {
    error = "a predicate holds no NUL byte";
    return std::nullopt;
  }
  parser p(text, error);
  return p.run();
}

node instantiate(const node& n, const json::object& claims) {
  switch (n.k) {
    case node::kind::constant: return n;
    case node::kind::all:
    case node::kind::any: {
      node out;
      out.k = n.k;
      for (const auto& c : n.children) out.children.push_back(instantiate(c, claims));
      return out;
    }
    case node::kind::compare: break;
  }
  node out = n;
  out.c.rhs.clear();
  for (const auto& o : n.c.rhs) {
    if (o.claim.empty()) {
      out.c.rhs.push_back(o);
      continue;
    }
    const json::value* v = find_claim(claims, o.claim);
    if (!v) return constant(false);
    if (n.c.op == cmp::in && v->is_array()) {
      if (v->get_array().size() > max_list) return constant(false);
      for (const auto& item : v->get_array()) {
        auto l = to_literal(item);
        if (!l) return constant(false);
        out.c.rhs.push_back(operand{std::move(l), {}});
      }
      continue;
    }
    auto l = to_literal(*v);
    if (!l) return constant(false);
    out.c.rhs.push_back(operand{std::move(l), {}});
  }
  if (n.c.op == cmp::in && out.c.rhs.empty()) return constant(false);   // in an empty list
  return out;
}

std::optional<equality> equality_of(const node& n) {
  auto one = [](const node& x) -> std::optional<equality> {
    if (x.k != node::kind::compare || (x.c.op != cmp::eq && x.c.op != cmp::in)) return std::nullopt;
    equality e;
    e.column = x.c.column;
    for (const auto& o : x.c.rhs) {
      if (!o.value || !o.claim.empty()) return std::nullopt;
      e.values.push_back(o.value->text);
    }
    if (e.values.empty()) return std::nullopt;
    return e;
  };
  if (n.k == node::kind::all) {
    for (const auto& c : n.children)
      if (auto e = one(c)) return e;
    return std::nullopt;
  }
  return one(n);
}


std::size_t cost(const node& n) {
  switch (n.k) {
    case node::kind::all:
    case node::kind::any: {
      std::size_t c = 0;
      for (const auto& child : n.children) c += cost(child);
      return c;
    }
    case node::kind::compare: {
      std::size_t c = 1;
      c += n.c.rhs.size();   // (a claim counts as one: what it holds is the token's, bounded by its size)
      return c;
    }
    case node::kind::constant: return 0;
  }
  return 0;
}

std::vector<std::string> columns(const node& n) {
  std::vector<std::string> out;
  auto walk = [&out](const node& x, auto&& self) -> void {
    if (x.k == node::kind::compare) {
      if (std::find(out.begin(), out.end(), x.c.column) == out.end()) out.push_back(x.c.column);
    } else {
      for (const auto& c : x.children) self(c, self);
    }
  };
  walk(n, walk);
  return out;
}

std::string to_string(const node& n) {
  switch (n.k) {
    case node::kind::constant: return n.value ? "(true)" : "(false)";   // (an instantiated one's: for messages, not parse())
    case node::kind::all:
    case node::kind::any: {
      std::string out;
      for (std::size_t i = 0; i < n.children.size(); ++i) {
        if (i) out += n.k == node::kind::all ? " and " : " or ";
        // Parentheses only where they are needed (an or inside an and): never deeper than
        // what was parsed.
        const bool wrap = n.k == node::kind::all && n.children[i].k == node::kind::any;
        out += wrap ? "(" + to_string(n.children[i]) + ")" : to_string(n.children[i]);
      }
      return out;
    }
    case node::kind::compare: break;
  }
  std::string out = quote(n.c.column, '"');
  switch (n.c.op) {
    case cmp::is_null: return out + " is null";
    case cmp::is_not_null: return out + " is not null";
    case cmp::in: {
      if (n.c.rhs.size() == 1 && !n.c.rhs[0].claim.empty()) return out + " in " + operand_text(n.c.rhs[0]);
      out += " in (";
      for (std::size_t i = 0; i < n.c.rhs.size(); ++i) out += (i ? ", " : "") + operand_text(n.c.rhs[i]);
      return out + ")";
    }
    case cmp::eq: out += " = "; break;
    case cmp::ne: out += " != "; break;
    case cmp::lt: out += " < "; break;
    case cmp::le: out += " <= "; break;
    case cmp::gt: out += " > "; break;
    case cmp::ge: out += " >= "; break;
  }
  return out + operand_text(n.c.rhs.at(0));
}

}  // namespace walgate::proxy::predicate
