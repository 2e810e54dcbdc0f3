#include "walgate/proxy/event_filter.hpp"

#include "walgate/proxy/policy.hpp"

namespace walgate::proxy {

table_index::table_index(const std::vector<table_pattern>& tables) {
  for (const auto& t : tables) {
    auto& s = schemas_[t.schema];
    if (t.any) s.any = true;
    else s.tables.emplace(t.table);
  }
}

bool table_index::has(std::string_view schema, std::string_view table) const {
  auto it = schemas_.find(schema);
  return it != schemas_.end() && (it->second.any || it->second.tables.find(table) != it->second.tables.end());
}

bool matches(const stream_request& r, const logged_event& e, const table_index* index) {
  // A read (a row of the initial snapshot) is an insert to ops=, as to grants.
  const char op = e.kind == transform::op::read ? 'c' : static_cast<char>(e.kind);
  if (r.ops && !(r.ops & (1u << (op - 'a')))) return false;
  if (r.granted && !r.granted->allows(e.schema, e.table, static_cast<char>(e.kind))) return false;
  if (r.tables.empty()) return true;
  if (e.table.empty()) return false;   // messages have no table
  if (index) return index->has(e.schema, e.table);
  for (const auto& t : r.tables)
    if (t.schema == e.schema && (t.any || t.table == e.table)) return true;
  return false;
}

}  // namespace walgate::proxy
