// The rows side of a subscription (subscription.hpp): rows_verdict, how the token's row grants
// and where= decide an event (a row within them or not, an update moving in or out of them, and
// the columns it shows), with what it keeps per table definition (row_state, made by rows_of;
// check, for the row router, makes it ahead of the first read); and three questions of the request: what the row
// router finds its events by and whether that finding is the whole decision (interests_of,
// router_decides, for the constructor), and whether an event makes its transaction one the
// client may know of (known_to, for take() with empty_transactions=true). The rest of the
// subscription is subscription.cpp; what both use is declared in subscription_internal.hpp.
#include "subscription_internal.hpp"

#include "walgate/proxy/policy.hpp"
#include "walgate/proxy/predicate.hpp"
#include "walgate/proxy/subscription.hpp"

#include <algorithm>
#include <string>

namespace walgate::proxy {

bool subscription::check(const logged_event& e, const protocol::pgoutput::cached_relation& r) {
  return rows_of(e, r).failed.empty();
}

const table_rows& subscription::rows_of(const logged_event& e, const protocol::pgoutput::cached_relation& rel) {
  if (!row_state_) row_state_ = std::make_unique<row_state>();
  std::string key = e.schema + '\0' + e.table + '\0';   // (no name holds a NUL)
  for (const auto& col : rel.columns) key += col.name + '\x1f' + std::to_string(col.type_oid) + (col.key ? "k" : "") + '\x1e';
  key += rel.replica_identity;
  auto it = row_state_->tables.find(key);
  if (it == row_state_->tables.end()) {
    std::vector<table_rows::column> cols;
    for (const auto& col : rel.columns) cols.push_back({col.name, col.type_oid, col.key});
    it = row_state_->tables.emplace(key, table_rows::make(request_, e.schema, e.table, cols, rel.replica_identity, true)).first;
  }
  return it->second;
}

subscription::row_verdict subscription::rows_verdict(const logged_event& e, std::string& error) {
  mask_ = nullptr;
  const grants* g = request_.granted.get();
  const char op = static_cast<char>(e.kind);
  if (e.table.empty() || e.kind == transform::op::truncate) return row_verdict::pass;
  const bool by_grant = g && g->row_filtered(e.schema, e.table, op);
  const bool by_where = request_.where != nullptr;
  const bool by_columns = g && g->column_limited(e.schema, e.table);
  if (!by_grant && !by_where && !by_columns) return row_verdict::pass;
  const transform::change* c = encodings_.decode(e, error);
  if (!c || !c->relation) {
    if (error.empty()) error = "event #" + std::to_string(e.seq) + " in the event log has no table definition";
    return row_verdict::damaged;
  }
  const auto& t = rows_of(e, *c->relation);
  if (!t.failed.empty()) {
    error = t.failed;
    return row_verdict::failed;
  }
  // The columns shown: those of the op's grants (an update moved in or out: the update's).
  if (const auto& m = t.mask(op == 'r' ? 'c' : op); !m.empty()) mask_ = &m;
  if (!by_grant && !by_where) return row_verdict::pass;
  // Whether a row's values are within the grants of this op and the request's where=.
  // (A TOASTed value an update did not change is not in the new row: the old row's is the same.)
  auto within = [&](protocol::pgoutput::tuple_view row, protocol::pgoutput::tuple_view old = {}) {
    auto& cells = row_state_->cells;
    cells.clear();
    for (std::size_t k = 0; k < row.size(); ++k) {
      const auto* col = &row[k];
      if (col->kind == protocol::pgoutput::column_kind::unchanged_toast && k < old.size() &&
          old[k].kind != protocol::pgoutput::column_kind::unchanged_toast && old[k].kind != protocol::pgoutput::column_kind::null)
        col = &old[k];
      predicate::cell x;
      if (col->kind == protocol::pgoutput::column_kind::null) x.s = predicate::cell::state::null;
      else if (col->kind == protocol::pgoutput::column_kind::unchanged_toast) x.s = predicate::cell::state::unchanged;
      else x = {predicate::cell::state::text, protocol::as_string_view(col->value)};
      cells.push_back(x);
    }
    return t.within(g, op, cells);
  };
  switch (c->kind) {
    case transform::op::insert:
    case transform::op::read: return within(c->after) ? row_verdict::pass : row_verdict::skip;
    case transform::op::delete_: return within(c->before) ? row_verdict::pass : row_verdict::skip;
    case transform::op::update: {
      const bool now = within(c->after, c->before);
      // No old row sent: the key did not change, and the predicate's columns are key columns.
      const bool before = c->before.empty() ? now : within(c->before);
      if (before && now) return row_verdict::pass;
      if (now) return row_verdict::as_insert;
      if (before) return row_verdict::as_delete;
      return row_verdict::skip;
    }
    default: return row_verdict::pass;
  }
}

namespace subscription_rows {

/// What a request's events can be found by in the row router: for each table it may see, the
/// column and values every grant of it limits rows to by equality; nullopt when some table's
/// rows are not all so limited (a grant of every row, or of schema.*, an `or`, where=,
/// messages).
std::optional<std::vector<row_router::interest>> interests_of(const stream_request& r) {
  const grants* g = r.granted.get();
  if (!g || r.where) return std::nullopt;
  if (g->messages && (r.ops == 0 || (r.ops & op_bit_of('m')))) return std::nullopt;
  std::vector<row_router::interest> out;
  for (std::size_t i = 0; i < g->tables.size(); ++i) {
    const auto& pattern = g->tables[i].first;
    if (pattern.any) return std::nullopt;
    if (!r.tables.empty() && std::none_of(r.tables.begin(), r.tables.end(), [&](const table_pattern& t) {
          return t.schema == pattern.schema && (t.any || t.table == pattern.table);
        }))
      continue;   // (not asked for: none of its events)
    if (!g->rows[i]) return std::nullopt;
    auto eq = predicate::equality_of(*g->rows[i]);
    if (!eq) return std::nullopt;
    auto same = std::find_if(out.begin(), out.end(), [&](const row_router::interest& x) {
      return x.schema == pattern.schema && x.table == pattern.table;
    });
    if (same == out.end()) {
      out.push_back({pattern.schema, pattern.table, eq->column, eq->values});
    } else {
      if (same->column != eq->column) return std::nullopt;
      same->values.insert(same->values.end(), eq->values.begin(), eq->values.end());
    }
  }
  if (out.empty()) return std::nullopt;
  return out;
}

/// The router's finding is the whole decision for r (row_router::found): each table it routes
/// is granted by exactly one entry, whose rows are `column = value` or `column in (…)` alone
/// (no `and`), with every column shown, and r adds no where=. (Otherwise the grant decides each
/// event the router finds, as ever.)
bool router_decides(const stream_request& r, const std::vector<row_router::interest>& interests) {
  const grants* g = r.granted.get();
  if (!g || r.where) return false;
  for (const auto& in : interests) {
    int entries = 0;
    for (std::size_t i = 0; i < g->tables.size(); ++i) {
      const auto& pattern = g->tables[i].first;
      if (pattern.schema != in.schema || !(pattern.any || pattern.table == in.table)) continue;
      if (++entries > 1 || pattern.any || !g->rows[i] || g->columns[i]) return false;
      const auto& n = *g->rows[i];
      if (n.k != predicate::node::kind::compare) return false;
      auto eq = predicate::equality_of(n);
      if (!eq || eq->column != in.column) return false;
    }
    if (entries != 1) return false;
  }
  return true;
}

/// empty_transactions=true: whether e makes its transaction one the client of r may know of
/// (its empty records, when it is sent none of it): e is of a table its token may see — the
/// table and e's op granted (--policy), whatever rows its grants hold — that it asked for
/// (tables=), or a logical message it may receive (granted; by prefixes=, or with no tables=),
/// whatever its ops=, where= and row grants then leave of it. A transaction of tables (or
/// messages) outside its grants or tables= alone is another's: its xid, commit LSN, time and
/// origin are not sent. (Assumption: a grant of the table for other ops than e's does not make
/// e's transaction known — the token may not see that op of it.)
bool known_to(const stream_request& r, const logged_event& e, std::string_view prefix) {
  if (r.granted && !r.granted->allows(e.schema, e.table, static_cast<char>(e.kind))) return false;
  if (e.kind == transform::op::message && !r.prefixes.empty())
    return std::any_of(r.prefixes.begin(), r.prefixes.end(), [&](const std::string& g) { return glob_match(g, prefix); });
  if (r.tables.empty()) return true;
  if (e.table.empty()) return false;   // (a message, with tables= and no prefixes=: not asked for)
  return std::any_of(r.tables.begin(), r.tables.end(),
                     [&](const table_pattern& t) { return t.schema == e.schema && (t.any || t.table == e.table); });
}

}  // namespace subscription_rows

}  // namespace walgate::proxy
