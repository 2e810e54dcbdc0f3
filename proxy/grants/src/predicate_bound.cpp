// Row predicates (predicate.hpp) bound to a relation's columns and compared by each column's
// type: values read as PostgreSQL orders them (numeric exactly, floats, booleans, instants,
// char(n) without padding, uuid without case, text byte by byte), read as views of the row's
// bytes (nothing allocated per comparison); the SQL a snapshot's SELECT carries. The language
// itself: predicate.cpp.
#include "walgate/proxy/predicate.hpp"

#include "predicate_text.hpp"

#include "walgate/transform/temporal.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>

namespace walgate::proxy::predicate {

namespace {

// --- typed comparison ------------------------------------------------------------------------

enum class vtype { exact, floating, boolean, instant, local_instant, bpchar, uuid, text };

vtype type_of(std::uint32_t oid) {
  switch (oid) {
    case 20: case 21: case 23: case 26: case 1700: return vtype::exact;   // int8, int2, int4, oid, numeric
    case 700: case 701: return vtype::floating;
    case 16: return vtype::boolean;
    case 1082: case 1114: return vtype::local_instant;                     // date, timestamp (no time zone)
    case 1184: return vtype::instant;                                        // timestamptz
    case 1042: return vtype::bpchar;
    case 2950: return vtype::uuid;
    default: return vtype::text;
  }
}

/// A number as PostgreSQL's numeric holds it: -inf, finite (sign, integer digits without leading
/// zeros, fraction digits without trailing zeros), +inf, NaN (greater than everything, equal to
/// itself, as PostgreSQL orders them). The digits are views into the text read (no allocation:
/// a row's value is read at every comparison).
struct exact_number {
  int cls = 0;   // -1 -inf, 0 finite, 1 +inf, 2 NaN
  bool neg = false;
  std::string_view ip, fp;
};

std::optional<exact_number> read_exact(std::string_view s) {
  exact_number n;
  if (iequals(s, "NaN")) return n.cls = 2, n;
  if (iequals(s, "Infinity") || iequals(s, "+Infinity")) return n.cls = 1, n;
  if (iequals(s, "-Infinity")) return n.cls = -1, n;
  std::size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) n.neg = s[i++] == '-';
  const auto digits_from = [&](std::size_t from) {
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(from, i - from);
  };
  n.ip = digits_from(i);
  if (i < s.size() && s[i] == '.') {
    ++i;
    n.fp = digits_from(i);
  }
  if (n.ip.size() + n.fp.size() == 0 || i != s.size()) return std::nullopt;   // (an exponent: not numeric's text)
  n.ip.remove_prefix(std::min(n.ip.find_first_not_of('0'), n.ip.size()));
  while (!n.fp.empty() && n.fp.back() == '0') n.fp.remove_suffix(1);
  if (n.ip.empty() && n.fp.empty()) n.neg = false;   // -0 is 0
  return n;
}

int compare_exact(const exact_number& a, const exact_number& b) {
  if (a.cls != 0 || b.cls != 0) {
    auto rank = [](const exact_number& x) { return x.cls == 0 ? 0 : x.cls == 2 ? 2 : x.cls; };
    int ra = rank(a), rb = rank(b);
    if (ra != rb) return ra < rb ? -1 : 1;
    if (ra != 0) return 0;
  }
  if (a.neg != b.neg) return a.neg ? -1 : 1;
  int mag;
  if (a.ip.size() != b.ip.size()) mag = a.ip.size() < b.ip.size() ? -1 : 1;
  else if (int c = a.ip.compare(b.ip)) mag = c < 0 ? -1 : 1;
  else if (int c = a.fp.compare(b.fp)) mag = c < 0 ? -1 : 1;
  else mag = 0;
  return a.neg ? -mag : mag;
}

std::optional<double> read_float(std::string_view s) {
  if (iequals(s, "NaN")) return std::numeric_limits<double>::quiet_NaN();
  if (iequals(s, "Infinity") || iequals(s, "+Infinity")) return std::numeric_limits<double>::infinity();
  if (iequals(s, "-Infinity")) return -std::numeric_limits<double>::infinity();
  if (s.empty() || s.size() > 64) return std::nullopt;
  char t[65];   // (strtod wants a terminated string; on the stack: no allocation per comparison)
  std::memcpy(t, s.data(), s.size());
  t[s.size()] = '\0';
  char* end = nullptr;
  double d = std::strtod(t, &end);
  if (end != t + s.size() || std::isnan(d)) return std::nullopt;
  return d;
}

int compare_float(double a, double b) {   // NaN above everything, equal to itself
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) return na == nb ? 0 : na ? 1 : -1;
  return a < b ? -1 : a > b ? 1 : 0;
}

std::optional<bool> read_bool(std::string_view s) {
  for (std::string_view t : {"t", "true", "yes", "on", "1"})
    if (iequals(s, t)) return true;
  for (std::string_view f : {"f", "false", "no", "off", "0"})
    if (iequals(s, f)) return false;
  return std::nullopt;
}

/// An instant: seconds since the epoch and microseconds (ordered as a pair, so that PostgreSQL's
/// whole date range, to year 5874897, is no overflow).
struct instant_t {
  std::int64_t seconds = 0;
  std::int64_t micros = 0;
  auto operator<=>(const instant_t&) const = default;
};

bool leap(std::int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

/// "YYYY-MM-DD", with " HH:MM[:SS[.fraction]]" (or 'T'), with "Z" or "+HH[:MM[:SS]]"/"-HH…"
/// (none: UTC; ignored when local: a timestamp without time zone, as PostgreSQL casts such a
/// literal); "infinity", "-infinity". Fractions rounded to microseconds.
std::optional<instant_t> read_instant(std::string_view s, bool local) {
  if (iequals(s, "infinity")) return instant_t{std::numeric_limits<std::int64_t>::max(), 0};
  if (iequals(s, "-infinity")) return instant_t{std::numeric_limits<std::int64_t>::min(), 0};
  std::size_t i = 0;
  auto num = [&](std::size_t min_digits, std::size_t max_digits, std::int64_t& out) {
    std::size_t start = i;
    out = 0;
    while (i < s.size() && i - start < max_digits && std::isdigit(static_cast<unsigned char>(s[i]))) out = out * 10 + (s[i++] - '0');
    return i - start >= min_digits;
  };
  auto expect = [&](char c) {
    if (i < s.size() && s[i] == c) return ++i, true;
    return false;
  };
  std::int64_t y, mo, d, h = 0, mi = 0, sec = 0, us = 0;
  if (!num(4, 7, y) || !expect('-') || !num(2, 2, mo) || !expect('-') || !num(2, 2, d)) return std::nullopt;
  static constexpr int month_days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (mo < 1 || mo > 12 || d < 1 || d > month_days[mo - 1] + (mo == 2 && leap(y))) return std::nullopt;
  if (i < s.size() && (s[i] == ' ' || s[i] == 'T' || s[i] == 't')) {
    ++i;
    if (!num(2, 2, h) || !expect(':') || !num(2, 2, mi)) return std::nullopt;
    if (expect(':')) {
      if (!num(2, 2, sec)) return std::nullopt;
      if (expect('.')) {
        std::size_t start = i;
        std::int64_t frac = 0;
        if (!num(1, 9, frac)) return std::nullopt;
        std::size_t n = i - start;
        for (; n < 7; ++n) frac *= 10;   // 7 digits: one past microseconds, to round
        for (; n > 7; --n) frac /= 10;
        us = (frac + 5) / 10;
      }
    }
    if (h > 24 || mi > 59 || sec > 60 || (h == 24 && (mi || sec || us))) return std::nullopt;
  }
  std::int64_t offset = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) {
    ++i;
  } else if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    const bool neg = s[i++] == '-';
    std::int64_t oh = 0, om = 0, os = 0;
    if (!num(2, 2, oh)) return std::nullopt;
    if (expect(':') ? !num(2, 2, om) : (i < s.size() && !num(2, 2, om))) return std::nullopt;
    if (expect(':') && !num(2, 2, os)) return std::nullopt;
    offset = (oh * 3600 + om * 60 + os) * (neg ? -1 : 1);
  }
  if (i != s.size()) return std::nullopt;
  if (local) offset = 0;
  std::int64_t seconds = transform::temporal::days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d)) * 86400 + h * 3600 +
                         mi * 60 + sec - offset;
  if (us >= 1'000'000) ++seconds, us -= 1'000'000;   // (rounded up to the next second)
  return instant_t{seconds, us};
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
std::string_view rtrim_spaces(std::string_view s) {
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

/// A value read as its column's type, ready to compare. Its text and digits are views: into the
/// row's value while a row is compared (nothing allocated per comparison), into the bound
/// predicate's own copy of a literal otherwise (`literal_text`).
struct typed {
  vtype t = vtype::text;
  exact_number exact;
  double f = 0;
  bool b = false;
  instant_t instant;
  std::string_view text;   // bpchar (trimmed), uuid (as written: compared without case), text
};

std::optional<typed> read_as(vtype t, std::string_view s) {
  typed v;
  v.t = t;
  switch (t) {
    case vtype::exact:
      if (auto n = read_exact(s)) return v.exact = *n, v;
      return std::nullopt;
    case vtype::floating:
      if (auto d = read_float(s)) return v.f = *d, v;
      return std::nullopt;
    case vtype::boolean:
      if (auto b = read_bool(s)) return v.b = *b, v;
      return std::nullopt;
    case vtype::instant:
    case vtype::local_instant:
      if (auto u = read_instant(s, t == vtype::local_instant)) return v.instant = *u, v;
      return std::nullopt;
    case vtype::bpchar: v.text = rtrim_spaces(s); return v;
    case vtype::uuid:
    case vtype::text: v.text = s; return v;
  }
  return std::nullopt;
}

int compare_folded(std::string_view a, std::string_view b) {   // ASCII case folded (uuid's hex digits)
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const int x = std::tolower(static_cast<unsigned char>(a[i])), y = std::tolower(static_cast<unsigned char>(b[i]));
    if (x != y) return x < y ? -1 : 1;
  }
  return a.size() == b.size() ? 0 : a.size() < b.size() ? -1 : 1;
}

int compare(const typed& a, const typed& b) {
  switch (a.t) {
    case vtype::exact: return compare_exact(a.exact, b.exact);
    case vtype::floating: return compare_float(a.f, b.f);
    case vtype::boolean: return a.b == b.b ? 0 : a.b ? 1 : -1;
    case vtype::instant:
    case vtype::local_instant: return a.instant < b.instant ? -1 : a.instant > b.instant ? 1 : 0;
    case vtype::uuid: return compare_folded(a.text, b.text);
    default: {
      int c = a.text.compare(b.text);
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
  }
}
}  // namespace

std::optional<std::string> equality_key(std::uint32_t type_oid, std::string_view text, bool& supported) {
  supported = true;
  const vtype t = type_of(type_oid);
  switch (t) {
    case vtype::exact: {
      auto n = read_exact(text);
      if (!n) return std::nullopt;
      if (n->cls != 0) return std::string(n->cls == 2 ? "NaN" : n->cls > 0 ? "+inf" : "-inf");
      return std::string(n->neg ? "-" : "") + std::string(n->ip) + "." + std::string(n->fp);
    }
    case vtype::boolean: {
      auto b = read_bool(text);
      if (!b) return std::nullopt;
      return std::string(*b ? "t" : "f");
    }
    case vtype::bpchar: return std::string(rtrim_spaces(text));
    case vtype::uuid: return lower(text);
    case vtype::text: return std::string(text);
    default: supported = false; return std::nullopt;
  }
}

struct bound::impl {
  struct item {
    enum class kind { all, any, compare, constant } k = kind::constant;
    std::vector<item> children;
    std::size_t column = 0;
    vtype type = vtype::text;
    cmp op = cmp::eq;
    std::vector<typed> values;   // the literals read as the column's type: views into `literal_text`
    // Each literal's text, one heap string each: a move of the item leaves them where they are
    // (the views stay true); the item is move-only.
    std::vector<std::unique_ptr<const std::string>> literal_text;
    bool value = false;          // constant
  };
  item root;
};

namespace {

bool eval(const bound::impl::item& it, std::span<const cell> row) {
  using kind = bound::impl::item::kind;
  switch (it.k) {
    case kind::constant: return it.value;
    case kind::all:
      for (const auto& c : it.children)
        if (!eval(c, row)) return false;
      return true;
    case kind::any:
      for (const auto& c : it.children)
        if (eval(c, row)) return true;
      return false;
    case kind::compare: break;
  }
  if (it.column >= row.size()) return false;
  const cell& v = row[it.column];
  if (it.op == cmp::is_null) return v.s == cell::state::null;
  if (it.op == cmp::is_not_null) return v.s != cell::state::null;   // (unchanged TOAST is a value, not null)
  if (v.s != cell::state::text) return false;
  auto x = read_as(it.type, v.text);
  if (!x) return false;
  if (it.op == cmp::in) {
    for (const auto& l : it.values)
      if (compare(*x, l) == 0) return true;
    return false;
  }
  const int c = compare(*x, it.values.at(0));
  switch (it.op) {
    case cmp::eq: return c == 0;
    case cmp::ne: return c != 0;
    case cmp::lt: return c < 0;
    case cmp::le: return c <= 0;
    case cmp::gt: return c > 0;
    case cmp::ge: return c >= 0;
    default: return false;
  }
}

std::optional<bound::impl::item> bind_item(const node& n, std::span<const column_info> cols, std::string& error) {
  using item = bound::impl::item;
  item it;
  switch (n.k) {
    case node::kind::constant:
      it.k = item::kind::constant;
      it.value = n.value;
      return it;
    case node::kind::all:
    case node::kind::any:
      it.k = n.k == node::kind::all ? item::kind::all : item::kind::any;
      for (const auto& c : n.children) {
        auto b = bind_item(c, cols, error);
        if (!b) return std::nullopt;
        it.children.push_back(std::move(*b));
      }
      return it;
    case node::kind::compare: break;
  }
  auto col = std::find_if(cols.begin(), cols.end(), [&](const column_info& c) { return c.name == n.c.column; });
  if (col == cols.end()) {
    error = "no column \"" + n.c.column + "\"";
    return std::nullopt;
  }
  it.k = item::kind::compare;
  it.column = static_cast<std::size_t>(col - cols.begin());
  it.type = type_of(col->type_oid);
  it.op = n.c.op;
  for (const auto& o : n.c.rhs) {
    if (!o.claim.empty() || !o.value) {
      error = "a claim left in a predicate being bound (instantiate it first)";
      return std::nullopt;
    }
    // A literal of another kind than the column's: a number compared with a text column is
    // compared as its text; a string with a number column is read as a number. What cannot be
    // read as the column's type never matches.
    auto text = std::make_unique<const std::string>(it.type == vtype::uuid ? lower(o.value->text) : o.value->text);
    auto v = read_as(it.type, *text);
    if (v) {
      it.values.push_back(*v);
      it.literal_text.push_back(std::move(text));
    }
  }
  if (it.op != cmp::is_null && it.op != cmp::is_not_null && it.values.empty()) {
    item f;
    f.k = item::kind::constant;
    f.value = false;
    return f;
  }
  if (it.op != cmp::in && it.op != cmp::is_null && it.op != cmp::is_not_null && it.values.size() != 1) {
    item f;   // (the one literal could not be read as the column's type)
    f.k = item::kind::constant;
    f.value = false;
    return f;
  }
  return it;
}

bool uuid_text(std::string_view s) {   // 8-4-4-4-12 hex digits, or 32 without hyphens
  const bool hyphens = s.size() == 36;
  if (!hyphens && s.size() != 32) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const bool dash = hyphens && (i == 8 || i == 13 || i == 18 || i == 23);
    if (dash ? s[i] != '-' : !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

/// One literal as SQL of the comparison's type, or "" when its SQL meaning is not the gateway's.
std::string sql_value(const typed& v, std::uint32_t oid, const std::function<std::string(std::string_view)>& literal) {
  switch (v.t) {
    case vtype::exact: {
      if (v.exact.cls != 0 || oid == 26) return {};   // (oid has no comparison with numeric)
      std::string n = (v.exact.neg ? "-" : "") + (v.exact.ip.empty() ? std::string("0") : std::string(v.exact.ip));
      // An integer column with a whole number: an integer constant (int = int8 has a btree
      // operator, so an index on the column serves; = numeric would cast the column).
      if ((oid == 20 || oid == 21 || oid == 23) && v.exact.fp.empty() && v.exact.ip.size() <= 18) return n;
      if (!v.exact.fp.empty()) n += "." + std::string(v.exact.fp);
      return literal(n) + "::numeric";
    }
    case vtype::boolean: return v.b ? "true" : "false";
    case vtype::bpchar: return literal(std::string(v.text));
    case vtype::text:   // text, varchar, name (other types read as text have SQL meanings of their own)
      return oid == 25 || oid == 1043 || oid == 19 ? literal(std::string(v.text)) : std::string();
    case vtype::uuid: return uuid_text(v.text) ? literal(std::string(v.text)) + "::uuid" : std::string();
    default: return {};   // floats, instants: the gateway alone decides
  }
}

std::string sql_item(const bound::impl::item& it, std::span<const column_info> cols,
                     const std::function<std::string(std::string_view)>& literal) {
  using kind = bound::impl::item::kind;
  switch (it.k) {
    case kind::constant: return it.value ? std::string() : "false";
    case kind::all: {
      std::string out;
      for (const auto& c : it.children) {
        auto s = sql_item(c, cols, literal);
        if (s.empty()) continue;   // (true, or not pushed down: a wider condition)
        out += (out.empty() ? "(" : " AND (") + s + ")";
      }
      return out;
    }
    case kind::any: {
      std::string out;
      for (const auto& c : it.children) {
        auto s = sql_item(c, cols, literal);
        if (s.empty()) return {};   // one side not pushed down: the whole or is not
        out += (out.empty() ? "(" : " OR (") + s + ")";
      }
      return out;
    }
    case kind::compare: break;
  }
  if (it.column >= cols.size()) return {};
  std::string col;   // the name as SQL writes it, quoted
  col += '"';
  for (char ch : cols[it.column].name) {
    if (ch == '"') col += '"';
    col += ch;
  }
  col += '"';
  if (it.op == cmp::is_null) return col + " IS NULL";
  if (it.op == cmp::is_not_null) return col + " IS NOT NULL";
  const bool ordered = it.type == vtype::exact;   // <, != … mean the same in SQL for numbers only
  if (!ordered && it.op != cmp::eq && it.op != cmp::in) return {};
  std::vector<std::string> values;
  for (const auto& v : it.values) {
    auto s = sql_value(v, cols[it.column].type_oid, literal);
    if (s.empty()) return {};
    values.push_back(std::move(s));
  }
  if (values.empty()) return {};
  if (it.op == cmp::in) {
    std::string out = col + " IN (";
    for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + values[i];
    return out + ")";
  }
  const char* op = it.op == cmp::eq ? " = " : it.op == cmp::ne ? " <> " : it.op == cmp::lt ? " < " : it.op == cmp::le ? " <= "
                   : it.op == cmp::gt ? " > " : " >= ";
  return col + op + values[0];
}

}  // namespace

bool bound::evaluate(std::span<const cell> row) const { return p && eval(p->root, row); }

std::string bound::sql(std::span<const column_info> columns, const std::function<std::string(std::string_view)>& literal) const {
  return p ? sql_item(p->root, columns, literal) : "false";
}

std::optional<bound> bind_to(const node& n, std::span<const column_info> cols, std::string& error) {
  auto root = bind_item(n, cols, error);
  if (!root) return std::nullopt;
  auto i = std::make_shared<bound::impl>();
  i->root = std::move(*root);
  bound b;
  b.p = std::move(i);
  return b;
}
}  // namespace walgate::proxy::predicate
