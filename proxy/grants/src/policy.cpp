// The authorization policy (policy.hpp): the TOML file read (toml++), a token's grants from its
// claims, and a request checked against them.
#include "walgate/proxy/policy.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <sstream>

namespace walgate::proxy {

namespace json = boost::json;

namespace {

/// An op's bit, as stream requests count them (stream_request.cpp).
unsigned op_bit(std::string_view o) {
  char c = o == "insert" ? 'c' : o == "update" ? 'u' : o == "delete" ? 'd' : o == "truncate" ? 't' : o == "message" ? 'm' : 0;
  return c ? 1u << (c - 'a') : 0;
}
constexpr unsigned message_bit = 1u << ('m' - 'a');

bool claim_matches(const json::value& claim, const json::value& want) {
  auto equal = [](const json::value& a, const json::value& b) {
    if (a.is_string() && b.is_string()) return a.get_string() == b.get_string();
    if (a.is_bool() && b.is_bool()) return a.get_bool() == b.get_bool();
    if (a.is_number() && b.is_number()) {
      // Integers exactly (a 64-bit id is not a double); a fraction as a double.
      if (!a.is_double() && !b.is_double()) {
        if (a.is_int64() && b.is_int64()) return a.get_int64() == b.get_int64();
        if (a.is_uint64() && b.is_uint64()) return a.get_uint64() == b.get_uint64();
        const auto& s = a.is_int64() ? a : b;   // one int64, one uint64
        const auto& u = a.is_int64() ? b : a;
        return s.get_int64() >= 0 && static_cast<std::uint64_t>(s.get_int64()) == u.get_uint64();
      }
      boost::system::error_code e1, e2;
      auto x = a.to_number<double>(e1), y = b.to_number<double>(e2);
      return !e1 && !e2 && x == y;
    }
    return false;
  };
  if (claim.is_array()) {
    for (const auto& item : claim.get_array())
      if (equal(item, want)) return true;
    return false;
  }
  return equal(claim, want);
}

/// A TOML value of `when` as JSON (string, integer, boolean).
std::optional<json::value> when_value(const toml::node& n) {
  if (auto s = n.value_exact<std::string>()) return json::value(*s);
  if (auto i = n.value_exact<std::int64_t>()) return json::value(*i);
  if (auto b = n.value_exact<bool>()) return json::value(*b);
  return std::nullopt;
}

}  // namespace

std::optional<policy> policy::parse(std::string_view text, std::string& error) {
  toml::table doc;
  try {
    doc = toml::parse(text);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    error = std::string(e.description()) + " (" + where.str() + ")";
    return std::nullopt;
  }
  policy p;
  for (const auto& [key, node] : doc)
    if (key.str() != "grant") {
      error = "unknown key '" + std::string(key.str()) + "': a policy is a list of [[grant]]";
      return std::nullopt;
    }
  const toml::array* list = doc["grant"].as_array();
  if (!list || list->empty()) {
    error = "no [[grant]]: a policy grants something (without --policy every valid token sees everything)";
    return std::nullopt;
  }
  for (std::size_t i = 0; i < list->size(); ++i) {
    const toml::table* g = (*list)[i].as_table();
    const std::string name = "grant " + std::to_string(i + 1);
    auto fail = [&](const std::string& why) {
      error = name + ": " + why;
      return std::nullopt;
    };
    if (!g) return fail("not a table ([[grant]])");
    rule r;
    for (const auto& [key, node] : *g) {
      const std::string k(key.str());
      if (k == "when") {
        const toml::table* w = node.as_table();
        if (!w) return fail("when is a table of claims: when = { role = \"sales\" }");
        if (w->empty()) return fail("when = {} matches every token: leave when out to say so");
        for (const auto& [claim, value] : *w) {
          std::vector<json::value> any;
          if (const toml::array* a = value.as_array()) {
            for (const auto& item : *a) {
              auto v = when_value(item);
              if (!v) return fail("when." + std::string(claim.str()) + ": a string, an integer or a boolean, or a list of them");
              any.push_back(std::move(*v));
            }
            if (any.empty()) return fail("when." + std::string(claim.str()) + ": an empty list matches nothing");
          } else {
            auto v = when_value(value);
            if (!v) return fail("when." + std::string(claim.str()) + ": a string, an integer or a boolean, or a list of them");
            any.push_back(std::move(*v));
          }
          r.when.emplace_back(std::string(claim.str()), std::move(any));
        }
      } else if (k == "tables") {
        const toml::array* a = node.as_array();
        if (!a || a->empty()) return fail("tables is a non-empty list: tables = [\"public.orders\", \"sales.*\"]");
        for (const auto& item : *a) {
          auto s = item.value_exact<std::string>();
          if (!s) return fail("tables holds strings");
          std::string why;
          auto t = parse_table_list(*s, true, false, why);
          if (!t) return fail("tables: " + why);
          r.tables.insert(r.tables.end(), t->begin(), t->end());
        }
      } else if (k == "ops") {
        const toml::array* a = node.as_array();
        if (!a || a->empty()) return fail("ops is a non-empty list of insert, update, delete, truncate, message");
        for (const auto& item : *a) {
          auto s = item.value_exact<std::string>();
          unsigned bit = s ? op_bit(*s) : 0;
          if (!bit) return fail("ops: use insert, update, delete, truncate, message");
          r.ops |= bit;
        }
        r.ops_given = true;
      } else if (k == "rows") {
        auto s = node.value_exact<std::string>();
        if (!s) return fail("rows is a predicate: rows = \"tenant_id = {claims.tenant}\"");
        std::string why;
        auto n = predicate::parse(*s, why);
        if (!n) return fail("rows: " + why);
        r.rows = std::make_shared<const predicate::node>(std::move(*n));
      } else if (k == "columns") {
        const toml::array* a = node.as_array();
        if (!a || a->empty()) return fail("columns is a non-empty list of column names: columns = [\"id\", \"name\"]");
        auto list = std::make_shared<std::vector<std::string>>();
        for (const auto& item : *a) {
          auto s = item.value_exact<std::string>();
          if (!s || s->empty() || s->size() > 63 || s->find('\0') != std::string::npos)
            return fail("columns holds column names as stored (1 to 63 bytes, case kept)");
          list->push_back(*s);
        }
        r.columns = std::move(list);
      } else {
        return fail("unknown key '" + k + "' (when, tables, ops, rows, columns)");
      }
    }
    if (!r.ops_given) r.ops = grants::table_ops;   // every op of its tables (messages are asked for by name)
    if (r.tables.empty() && !(r.ops & message_bit)) return fail("no tables (and no message op): it grants nothing");
    if (r.rows && r.tables.empty()) return fail("rows without tables: rows limit a grant's tables");
    if (r.columns && r.tables.empty()) return fail("columns without tables: columns limit a grant's tables");
    if (!r.tables.empty() && !(r.ops & grants::table_ops))
      return fail("ops has no op of a table (insert, update, delete, truncate) for its tables: give message a grant of its own");
    p.rules_.push_back(std::move(r));
  }
  return p;
}

std::shared_ptr<const grants> policy::grants_for(const json::object& claims) const {
  auto g = std::make_shared<grants>();
  bool any = false;
  for (const auto& r : rules_) {
    bool match = true;
    for (const auto& [claim, wanted] : r.when) {
      const json::value* v = claims.if_contains(claim);
      bool one = false;
      for (const auto& w : wanted) one = one || (v && claim_matches(*v, w));
      match = match && one;
    }
    if (!match) continue;
    any = true;
    std::shared_ptr<const predicate::node> rows;
    if (r.rows) rows = std::make_shared<const predicate::node>(predicate::instantiate(*r.rows, claims));
    for (const auto& t : r.tables) {
      g->tables.emplace_back(t, r.ops & grants::table_ops);
      g->rows.push_back(rows);
      g->columns.push_back(r.columns);
    }
    if (r.ops & message_bit) g->messages = true;
  }
  if (!any) return nullptr;
  return g;
}

table_rows table_rows::make(const stream_request& r, std::string_view schema, std::string_view table,
                            const std::vector<column>& columns, char replica_identity, bool check_identity) {
  table_rows t;
  const grants* g = r.granted.get();
  if (g)
    for (char op : {'c', 'u', 'd'})
      if (g->row_filtered(schema, table, op)) t.filtered_ops |= op_bit_of(op);
  t.by_grant = t.filtered_ops != 0;
  t.by_where = r.where != nullptr;
  std::vector<predicate::column_info> cols;
  for (const auto& c : columns) cols.push_back({c.name, c.type_oid});
  // A row leaves a client's rows by an update or a delete: its old values must be sent for the
  // predicate's columns — the replica identity's, or every one under FULL.
  auto check = [&](const predicate::node& n, const std::string& what) {
    if (!check_identity || replica_identity == 'f' || !t.failed.empty()) return;
    for (const auto& name : predicate::columns(n)) {
      auto col = std::find_if(columns.begin(), columns.end(), [&](const column& x) { return x.name == name; });
      if (col != columns.end() && !col->key)
        t.failed = what + " on " + std::string(schema) + "." + std::string(table) + ": column " + name +
                   " is not in the replica identity (ALTER TABLE " + std::string(schema) + "." + std::string(table) +
                   " REPLICA IDENTITY FULL)";
    }
  };
  if (t.by_grant)
    for (std::size_t i = 0; i < g->tables.size(); ++i) {
      const auto& [pattern, ops] = g->tables[i];
      if (!g->rows[i] || pattern.schema != schema || !(pattern.any || pattern.table == table)) continue;
      std::string why;
      auto b = predicate::bind_to(*g->rows[i], cols, why);
      if (!b) continue;   // a table without the predicate's column (schema.*): none of its rows by this grant
      if (ops & (op_bit_of('u') | op_bit_of('d'))) check(*g->rows[i], "row grant");
      t.entries.emplace_back(i, std::move(*b));
    }
  // Columns: per op, the union of the column lists of the grants of it (one without a list:
  // every column). When a grant of the op limits rows, every grant of it must show exactly that
  // union — else the columns a row shows would depend on which grant holds it (a grant of names
  // for every row and one of salaries for the token's own row would show every salary).
  if (g && g->column_limited(schema, table)) {
    const char ops[3] = {'c', 'u', 'd'};
    auto covers = [&](std::size_t i, unsigned want) {
      const auto& [pattern, granted] = g->tables[i];
      return (granted & want) && pattern.schema == schema && (pattern.any || pattern.table == table);
    };
    auto mask_of = [&](std::size_t i) {
      std::string m(columns.size(), '1');
      if (g->columns[i])
        for (std::size_t c = 0; c < columns.size(); ++c)
          if (std::find(g->columns[i]->begin(), g->columns[i]->end(), columns[c].name) == g->columns[i]->end()) m[c] = '0';
      return m;
    };
    for (int k = 0; k < 3; ++k) {
      const unsigned want = op_bit_of(ops[k]);
      std::string mask(columns.size(), '0');
      bool any = false, by_rows = false;
      for (std::size_t i = 0; i < g->tables.size(); ++i) {
        if (!covers(i, want)) continue;
        any = true;
        by_rows = by_rows || g->rows[i] != nullptr;
        const auto m = mask_of(i);
        for (std::size_t c = 0; c < columns.size(); ++c)
          if (m[c] == '1') mask[c] = '1';
      }
      if (!any) continue;   // (not granted: no events of it)
      if (mask.find('0') != std::string::npos) t.masks[k] = mask;   // (else every column)
      if (!by_rows) continue;
      for (std::size_t i = 0; i < g->tables.size() && t.failed.empty(); ++i) {
        if (!covers(i, want)) continue;
        const auto m = mask_of(i);
        for (std::size_t c = 0; c < columns.size() && t.failed.empty(); ++c)
          if (m[c] != mask[c])
            t.failed = "grants of " + std::string(schema) + "." + std::string(table) +
                       ": the columns a row shows would depend on which grant holds it (" + columns[c].name +
                       " is shown by some of its grants, one of them limits rows): give every grant of the table the same "
                       "columns";
      }
    }
    // where= on a column this token may not see would tell its values: refused.
    if (t.by_where && t.failed.empty())
      for (const auto& name : predicate::columns(*r.where)) {
        auto col = std::find_if(columns.begin(), columns.end(), [&](const column& x) { return x.name == name; });
        if (col == columns.end()) continue;
        const std::size_t c = static_cast<std::size_t>(col - columns.begin());
        for (const auto& m : t.masks)
          if (!m.empty() && m[c] == '0' && t.failed.empty())
            t.failed = "where= on " + std::string(schema) + "." + std::string(table) + ": column " + name +
                       " is not granted to this token";
      }
  }
  if (t.by_where) {
    std::string why;
    t.where = predicate::bind_to(*r.where, cols, why);
    if (t.where) check(*r.where, "where=");   // (where= applies to updates and deletes too)
  }
  return t;
}

bool table_rows::within(const grants* g, char op, std::span<const predicate::cell> row) const {
  if (by_where && !(where && where->evaluate(row))) return false;
  const unsigned want = op_bit_of(op == 'r' ? 'c' : op);
  if (!(filtered_ops & want)) return true;   // a grant takes every row of this op
  for (const auto& [i, b] : entries)
    if ((g->tables[i].second & want) && b.evaluate(row)) return true;
  return false;
}

std::string table_rows::sql(const grants* g, const std::vector<column>& columns,
                            const std::function<std::string(std::string_view)>& literal) const {
  std::vector<predicate::column_info> cols;
  for (const auto& c : columns) cols.push_back({c.name, c.type_oid});
  std::string out;
  if (by_where) {
    if (!where) return "false";
    if (auto s = where->sql(cols, literal); !s.empty()) out = "(" + s + ")";
  }
  if (filtered_ops & op_bit_of('c')) {
    std::string any;
    bool wide = false;
    for (const auto& [i, b] : entries) {
      if (!(g->tables[i].second & op_bit_of('c'))) continue;
      auto s = b.sql(cols, literal);
      if (s.empty()) wide = true;
      any += (any.empty() ? "(" : " OR (") + s + ")";
    }
    if (any.empty()) any = "false";
    if (!wide) out += (out.empty() ? "(" : " AND (") + any + ")";
  }
  return out;
}

std::optional<std::pair<std::string, std::string>> authorize(std::shared_ptr<const grants> g, stream_request& r) {
  auto covers = [&g](const table_pattern& want, unsigned& ops) {
    bool found = false;
    ops = 0;
    for (const auto& [t, o] : g->tables)
      if (t.schema == want.schema && (t.any || (!want.any && t.table == want.table))) {
        found = true;
        ops |= o;
      }
    return found;
  };
  const unsigned asked = r.ops & ~message_bit;
  if ((r.ops & message_bit) && !g->messages)
    return std::pair<std::string, std::string>{"ops", "logical messages are not granted to this token"};
  for (const auto& t : r.tables) {
    unsigned ops = 0;
    if (!covers(t, ops))
      return std::pair<std::string, std::string>{"tables", "table " + sql_table_name(t) + " is not granted to this token"};
    if (asked && (asked & ~ops))
      return std::pair<std::string, std::string>{"ops", "an op asked for on " + sql_table_name(t) + " is not granted to this token"};
  }
  if (r.tables.empty() && asked) {   // every table it may see: each asked op on at least one of them
    unsigned all = 0;
    for (const auto& [t, o] : g->tables) all |= o;
    if (asked & ~all) return std::pair<std::string, std::string>{"ops", "an op asked for is granted on no table to this token"};
  }
  r.granted = std::move(g);
  return std::nullopt;
}

}  // namespace walgate::proxy
