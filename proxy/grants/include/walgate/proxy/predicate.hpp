// Row predicates of the authorization policy (rows = … in a grant): comparisons
// of a column with a literal or a token claim, joined with and/or, evaluated in the gateway on the
// values of a decoded change — no SQL is run.
//
//   tenant_id = {claims.tenant} and (status in ('open', 'paid') or total >= 100)
//   org_id in {claims.orgs}        deleted_at is null        "Created At" < '2026-01-01T00:00:00Z'
//
// Grammar: expr := term ('or' term)* ; term := factor ('and' factor)* ;
// factor := '(' expr ')' | column op operand | column 'in' '(' operand (',' operand)* ')' |
// column 'in' claim | column 'is' ['not'] 'null' ; op := = != <> < <= > >= ; operand := 'text'
// ('' for a quote) | number | true | false | claim ; claim := '{' 'claims' ('.' name)+ '}' ;
// column := name | "quoted name" ("" for a quote). Keywords in any case.
//
// Comparison follows the column's type: integers, numeric and floats as numbers (numeric exactly,
// digit by digit), bool as a truth value, date/timestamp/timestamptz as instants (a date or a
// timestamp without time zone as UTC, an offset in its literal ignored as PostgreSQL's cast
// does; literals in ISO 8601, to year 5874897, fractions rounded to microseconds), char(n)
// without its trailing spaces, uuid in
// any case; everything else as text, byte by byte (not the database's collation). A null, a
// TOASTed value that did not change (not sent: `is not null` holds, nothing else), a value or
// literal that cannot be read as the column's type, or a claim the token does not have: the
// comparison is false (and so `!=` of a null is false too, as in SQL). Parsing is bounded (the text at most 4 KiB, 32 levels of
// parentheses, 256 comparisons, 1,024 items in a list); an error names where and what.
// No Asio: the fuzz target compiles it alone.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::proxy::predicate {

constexpr std::size_t max_text = 4096;
constexpr int max_depth = 32;
constexpr std::size_t max_comparisons = 256;
constexpr std::size_t max_list = 1024;

enum class cmp { eq, ne, lt, le, gt, ge, in, is_null, is_not_null };

/// A literal: text, a number (its decimal text as written), a truth value.
struct literal {
  enum class kind { text, number, boolean } k = kind::text;
  std::string text;   ///< text, or a number's digits; "true"/"false" for a boolean
  bool operator==(const literal&) const = default;
};

/// One side of a comparison: a literal, or a claim's path (claims.a.b → {"a","b"}).
struct operand {
  std::optional<literal> value;
  std::vector<std::string> claim;   ///< non-empty: a claim, substituted per token
};

struct comparison {
  std::string column;
  cmp op = cmp::eq;
  std::vector<operand> rhs;   ///< one for = != < <= > >=; the list for in (or one claim); none for is [not] null
};

/// A parsed predicate: a tree of and/or over comparisons. Constants (true/false) appear where
/// instantiate() found a claim missing.
struct node {
  enum class kind { all, any, compare, constant } k = kind::constant;
  std::vector<node> children;   ///< all (and), any (or)
  comparison c;                 ///< compare
  bool value = true;            ///< constant
};

/// Parses text (nullopt with error: the offset and what was expected).
std::optional<node> parse(std::string_view text, std::string& error);
/// The predicate with each claim replaced by the token's value: a string, number or boolean
/// claim is that literal; for `in`, an array claim is its items (strings, numbers, booleans). A
/// claim the token lacks, or of another kind (an object, null, an array where one value is
/// compared), makes its comparison false.
node instantiate(const node& n, const boost::json::object& claims);
/// What evaluating it on one row may cost: its comparisons and the items of its lists (a claim
/// counted as one).
std::size_t cost(const node& n);
/// The most a client's where= may cost (a grant's predicate, the operator's, is not bounded so).
constexpr std::size_t max_where_cost = 512;
/// The columns a predicate names, each once, in order of appearance.
std::vector<std::string> columns(const node& n);
/// The predicate as text; a parsed one's (no constants: not instantiated) parse() reads back to
/// the same text, with at most as many levels of parentheses (for messages and tests).
std::string to_string(const node& n);

/// An instantiated predicate that holds only for rows whose `column` equals one of `values`
/// (a top-level `column = literal` or `column in (…)`, alone or in an `and`): what a client's
/// events can be found by, in an index of that column's values. nullopt when it has no such
/// comparison (an `or` at the top, only ranges…).
struct equality {
  std::string column;
  std::vector<std::string> values;   ///< the literals' text
};
std::optional<equality> equality_of(const node& n);
/// A key of a value of a column of type_oid such that values the predicates find equal have the
/// same key (integers and numeric as numbers, char(n) without padding, uuid in lower case, bool
/// as t/f, text as it is); nullopt for a type without one (floats, instants, others) — with
/// supported false — or a value that is not of the type.
std::optional<std::string> equality_key(std::uint32_t type_oid, std::string_view text, bool& supported);

/// A relation's column, as pgoutput describes it.
struct column_info {
  std::string name;
  std::uint32_t type_oid = 0;
};
/// A column's value in a row: null, unchanged TOAST (not sent), or its text.
struct cell {
  enum class state : std::uint8_t { null, unchanged, text } s = state::null;
  std::string_view text;
};

/// A predicate bound to a relation: column names resolved to positions and each literal read
/// as its column's type, once. Evaluating it is then a few comparisons per row.
class bound {
 public:
  bool evaluate(std::span<const cell> row) const;
  /// A SQL condition that holds for every row evaluate() accepts (and may hold for more): the
  /// comparisons whose SQL meaning is the gateway's — =, in, is [not] null on text, char(n),
  /// uuid and bool columns, and every comparison of an integer or numeric column with a finite
  /// number — with literal() quoting each value (libpq's PQescapeLiteral); the others are left
  /// out (an `or` holding one: the whole `or`). Empty: no condition. For a snapshot's SELECT, so
  /// that PostgreSQL reads only the rows of a grant where it can; the gateway still decides.
  std::string sql(std::span<const column_info> columns, const std::function<std::string(std::string_view)>& literal) const;
  struct impl;
  std::shared_ptr<const impl> p;
};
/// Binds an instantiated predicate (no claims left) to a relation's columns; nullopt with error
/// naming a column the relation does not have.
std::optional<bound> bind_to(const node& n, std::span<const column_info> columns, std::string& error);

}  // namespace walgate::proxy::predicate
