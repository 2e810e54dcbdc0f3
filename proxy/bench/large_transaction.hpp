// One transaction of `mib` insert records of 1 MiB each (the initial snapshot of a big
// database, a bulk UPDATE), logged and synced: what the recovery benchmark and the restart-memory
// test both open. Header-only: the benchmark and log_tests include it.
#pragma once

#include "walgate/proxy/event_log.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace walgate::bench {

/// Commit 0/1000 (end 0/1008), table public.big (v text). False when the log failed (log.error()).
inline bool log_large_transaction(proxy::event_log& log, std::uint32_t mib) {
  namespace pg = protocol::pgoutput;
  protocol::transaction_info t;
  t.commit_lsn = protocol::lsn{0x1000};
  t.end_lsn = protocol::lsn{0x1008};
  if (!log.begin(t.commit_lsn)) return false;
  pg::cached_relation rel;
  rel.oid = 1;
  rel.nspname = "public";
  rel.relname = "big";
  rel.columns = {{"v", 25, -1, true}};
  const std::string value((1u << 20) - 64, 'x');
  std::vector<pg::tuple_column> row{{pg::column_kind::text, protocol::as_bytes(value)}};
  for (std::uint32_t i = 0; i < mib; ++i) {
    transform::change c;
    c.txn = &t;
    c.kind = transform::op::insert;
    c.index = i;
    c.relation = &rel;
    c.after = row;
    log.add(c);
  }
  log.commit(t.commit_lsn, t.end_lsn);
  return log.sync();
}

}  // namespace walgate::bench
