// Transactions of inserts (and snapshot rows' records) made for an event log in the log's unit
// tests: a relation "public.items" of one int column.
#pragma once

#include "walgate/proxy/event_log.hpp"
#include "walgate/transform/record.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace walgate::test {

namespace pg = walgate::protocol::pgoutput;

struct txn_builder {
  pg::cached_relation rel;
  std::vector<std::string> values;
  std::vector<std::vector<pg::tuple_column>> rows;
  txn_builder() {
    rel.oid = 1;
    rel.nspname = "public";
    rel.relname = "items";
    rel.columns = {{"id", 23, -1, true}};
    values.reserve(10000);
    rows.reserve(10000);
  }
  // A transaction committing at commit_lsn with n inserts.
  bool append(proxy::event_log& log, std::uint64_t commit_lsn, int n, protocol::transaction_info& txn) {
    txn.commit_lsn = protocol::lsn{commit_lsn};
    txn.end_lsn = protocol::lsn{commit_lsn + 8};
    std::vector<transform::change> changes;
    for (int i = 0; i < n; ++i) {
      values.push_back(std::to_string(commit_lsn * 100 + i));
      rows.push_back({{pg::column_kind::text, protocol::as_bytes(values.back())}});
      transform::change c;
      c.txn = &txn;
      c.kind = transform::op::insert;
      c.index = static_cast<std::uint32_t>(i);
      c.change_lsn = protocol::lsn{commit_lsn - 1};
      c.relation = &rel;
      c.after = rows.back();
      changes.push_back(c);
    }
    return log.append(txn, changes);
  }
  /// The record of a read event (a snapshot row) of value at index, made as the initial
  /// snapshot's copying threads make them: for add_record.
  std::string read_record(const protocol::transaction_info& txn, std::string_view value, std::uint32_t index) const {
    std::vector<pg::tuple_column> row{{pg::column_kind::text, protocol::as_bytes(value)}};
    transform::change c;
    c.kind = transform::op::read;
    c.txn = &txn;
    c.change_lsn = txn.commit_lsn;
    c.index = index;
    c.relation = &rel;
    c.after = row;
    std::string out;
    transform::write_record(out, c);
    return out;
  }
};

}  // namespace walgate::test
