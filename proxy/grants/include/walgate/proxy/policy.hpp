// Who may see which tables: the authorization policy (--policy FILE, TOML). Each [[grant]] gives
// tables and operations to every token whose claims match its `when`:
//
//   [[grant]]
//   when = { role = "sales" }                  # every listed claim equal (an array claim: holding it)
//   tables = ["public.orders", "public.order_lines"]
//   ops = ["insert", "update", "delete"]       # optional: every op
//
//   [[grant]]                                  # no when: every token
//   tables = ["public.products"]
//
// A token's grants are the union of the grants it matches; a stream request is served only
// within them (403 otherwise), and events outside them never reach it — decided on the event's
// table and op in the gateway, no database query. Logical messages (no table) need a grant with
// ops including "message" (a grant without ops gives its tables every op, not messages); the
// rows a snapshot reads need insert. `rows = "<predicate>"` (predicate.hpp) limits a grant to the
// rows it holds, decided on each event's values; `columns = [...]` to the columns it lists (the
// others are in no field of any format). No Asio.
#pragma once

#include "walgate/proxy/predicate.hpp"
#include "walgate/proxy/stream_request.hpp"

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace walgate::proxy {

/// What one token may see: table patterns with their ops (bits of transform::op chars, never 0).
/// The rows that exist — a snapshot's, and the log's initial snapshot (op read) — go with
/// insert: a token that may see a table's inserts may see its rows.
constexpr unsigned op_bit_of(char op) { return 1u << (op - 'a'); }

struct grants {
  static constexpr unsigned table_ops = op_bit_of('c') | op_bit_of('u') | op_bit_of('d') | op_bit_of('t');
  std::vector<std::pair<table_pattern, unsigned>> tables;
  /// Per entry of tables: its grant's row predicate, its claims substituted (null: every row).
  std::vector<std::shared_ptr<const predicate::node>> rows;
  /// Per entry of tables: its grant's column list (null: every column).
  std::vector<std::shared_ptr<const std::vector<std::string>>> columns;
  bool messages = false;   ///< logical messages (a grant with ops "message")

  /// Some entry that grants op on the table limits its rows: the event's values decide.
  bool row_filtered(std::string_view schema, std::string_view table, char op) const {
    const unsigned want = op_bit_of(op == 'r' ? 'c' : op);
    bool limited = false;
    for (std::size_t i = 0; i < tables.size(); ++i) {
      const auto& [t, ops] = tables[i];
      if (t.schema == schema && (t.any || t.table == table) && (ops & want)) {
        if (!rows[i]) return false;   // one grant of every row is enough
        limited = true;
      }
    }
    return limited;
  }

  /// Some entry that grants the table limits its columns.
  bool column_limited(std::string_view schema, std::string_view table) const {
    for (std::size_t i = 0; i < tables.size(); ++i) {
      const auto& t = tables[i].first;
      if (columns[i] && t.schema == schema && (t.any || t.table == table)) return true;
    }
    return false;
  }

  /// The event's table and op are granted.
  bool allows(std::string_view schema, std::string_view table, char op) const {
    if (table.empty()) return messages;
    const unsigned want = op_bit_of(op == 'r' ? 'c' : op);
    for (const auto& [t, ops] : tables)
      if (t.schema == schema && (t.any || t.table == table) && (ops & want)) return true;
    return false;
  }
  /// A snapshot may read the table's rows: its inserts are granted.
  bool allows_table(std::string_view schema, std::string_view table) const { return allows(schema, table, 'r'); }
};

/// The row conditions of one request on one table definition: its grants' row predicates and
/// its where=, bound to the table's columns once. Shared by a subscription's changes and a
/// snapshot's rows, so that both decide alike.
struct table_rows {
  struct column {
    std::string name;
    std::uint32_t type_oid = 0;
    bool key = false;   ///< in the replica identity
  };
  bool by_grant = false;   ///< some grant limits the table's rows of some op (none takes every row)
  unsigned filtered_ops = 0;   ///< the ops (op_bit_of) whose rows the grants limit
  bool by_where = false;   ///< the request has where=
  std::vector<std::pair<std::size_t, predicate::bound>> entries;   ///< per entry of grants::tables
  std::optional<predicate::bound> where;   ///< nullopt with by_where: a column it names is not in the table
  std::string failed;   ///< why the table's changes cannot be served (the replica identity, the columns)
  /// The columns shown of an insert (and a snapshot's row), an update, a delete: '1' or '0' per
  /// column of the definition; empty: every one. The union of the column lists of the grants of
  /// that op (a grant without one: every column).
  std::array<std::string, 3> masks;
  const std::string& mask(char op) const { return masks[op == 'u' ? 1 : op == 'd' ? 2 : 0]; }

  /// For the request r on schema.table with these columns. With check_identity (changes: an
  /// update or a delete must carry the predicates' columns in its old row), failed names a
  /// predicate column outside the replica identity (replica_identity 'f': every column is in it).
  static table_rows make(const stream_request& r, std::string_view schema, std::string_view table,
                         const std::vector<column>& columns, char replica_identity, bool check_identity);
  /// The row's values are within the request's grants of op ('c' insert and read, 'u', 'd')
  /// and its where=.
  bool within(const grants* g, char op, std::span<const predicate::cell> row) const;
  /// Limits rows at all.
  bool limits() const { return by_grant || by_where; }
  /// Limits the columns of some op.
  bool limits_columns() const { return !masks[0].empty() || !masks[1].empty() || !masks[2].empty(); }
  /// A SQL condition holding for every row within(…, 'c', …) accepts (predicate::bound::sql);
  /// empty: none.
  std::string sql(const grants* g, const std::vector<column>& columns,
                  const std::function<std::string(std::string_view)>& literal) const;
};

/// Narrows nothing, refuses what is outside: every table the request names must be granted
/// (schema.* only by a grant of schema.*), with every op it asks for (none named: it gets the
/// granted ones). nullopt when the request is within its grants (r.granted set), else why, for a
/// 403, and the parameter at fault.
std::optional<std::pair<std::string, std::string>> authorize(std::shared_ptr<const grants> g, stream_request& r);

class policy {
 public:
  /// Reads a policy file's text; nullopt with error naming the grant and what is wrong.
  static std::optional<policy> parse(std::string_view toml, std::string& error);
  /// The grants of a token with these claims; null when it matches none.
  std::shared_ptr<const grants> grants_for(const boost::json::object& claims) const;
  std::size_t size() const { return rules_.size(); }

 private:
  struct rule {
    std::vector<std::pair<std::string, std::vector<boost::json::value>>> when;   // claim -> any of these
    std::vector<table_pattern> tables;
    unsigned ops = 0;
    bool ops_given = false;
    std::shared_ptr<const predicate::node> rows;   // null: every row
    std::shared_ptr<const std::vector<std::string>> columns;   // null: every column
  };
  std::vector<rule> rules_;
};

}  // namespace walgate::proxy
