// What the encoders encode: one change event, as views into the decoded transaction. Built by
// the caller from the assembler's callbacks (see make_changes); valid during the encode call.
#pragma once

#include "walgate/protocol/assembler.hpp"

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace walgate::transform {

enum class op : char { insert = 'c', update = 'u', delete_ = 'd', truncate = 't', read = 'r', message = 'm' };

struct change {
  op kind = op::insert;
  const protocol::transaction_info* txn = nullptr;        ///< Commit LSN, time, xid, origin.
  protocol::lsn change_lsn;                                ///< WAL position of this change.
  std::uint32_t index = 0;                                 ///< Index within the transaction.
  const protocol::pgoutput::cached_relation* relation = nullptr;   ///< Null for messages.
  char before_kind = 0;                                    ///< 0 none, 'K' key columns, 'O' whole old row.
  protocol::pgoutput::tuple_view before;
  protocol::pgoutput::tuple_view after;
  const protocol::pgoutput::message* message = nullptr;    ///< For op::message.
  const protocol::pgoutput::type_cache* types = nullptr;   ///< Names of non-built-in types (wal2json).
  std::uint64_t seq = 0;                                   ///< Waltail's sequence number (from the log).
  std::uint32_t table_order = 1;                           ///< Debezium data_collection_order (1-based).
  bool snapshot_last = false;                              ///< Debezium source.snapshot "last" for the final read row.
  /// A Truncate's options as pgoutput sent them (1 CASCADE, 2 RESTART IDENTITY); logged since
  /// record flags 4 and 8 (a record from before says 0).
  std::uint8_t truncate_options = 0;
  std::string_view snapshot;                               ///< A read row's snapshot (pg_current_snapshot's text): in Waltail's idempotency key.
};

/// An event id "<commit_lsn>:<index>", ordered by commit LSN as a 64-bit number, then index.
/// A transaction's boundary records (transactions=true) have ids of their own that resume like
/// any: "<commit_lsn>:B" (its begin: before its first event) and "<commit_lsn>:C" (its commit:
/// after its last event).
struct event_id {
  enum class mark : std::uint8_t { event, begin, commit };
  protocol::lsn commit_lsn;
  std::uint32_t index = 0;   ///< 0 for a begin or commit
  mark at = mark::event;
  std::strong_ordering operator<=>(const event_id& o) const {
    if (auto c = commit_lsn.value <=> o.commit_lsn.value; c != 0) return c;
    if (auto c = rank(at) <=> rank(o.at); c != 0) return c;
    return index <=> o.index;
  }
  bool operator==(const event_id&) const = default;
  std::string to_string() const {
    return commit_lsn.to_string() + (at == mark::begin ? ":B" : at == mark::commit ? ":C" : ":" + std::to_string(index));
  }
  static std::optional<event_id> parse(std::string_view text);

 private:
  static int rank(mark m) { return m == mark::begin ? 0 : m == mark::event ? 1 : 2; }
};

/// RFC 4122 version 5 UUID (SHA-1) of name in walgate's namespace: identical for every
/// redelivery of the same event id.
std::string uuid_v5(std::string_view name);

/// ISO 8601 UTC with microseconds: "2026-07-19T12:00:00.123456Z".
std::string iso8601_utc(std::int64_t pg_epoch_us);

}  // namespace walgate::transform

namespace walgate::transform {

/// Calls f(const change&) for each event of one assembler change: one for an Insert, Update,
/// Delete or transactional Message, one per relation for a Truncate (each with its own index).
template <class F>
void for_each_change(const protocol::transaction_info& txn, const protocol::change_event& e,
                     const protocol::pgoutput::relation_cache& relations, const protocol::pgoutput::type_cache* types,
                     F&& f) {
  namespace pg = protocol::pgoutput;
  change c;
  c.txn = &txn;
  c.change_lsn = e.change_lsn;
  c.index = e.index;
  c.relation = e.relation;
  c.types = types;
  if (auto* i = std::get_if<pg::insert>(e.message)) {
    c.kind = op::insert;
    c.after = i->new_tuple;
  } else if (auto* u = std::get_if<pg::update>(e.message)) {
    c.kind = op::update;
    c.before_kind = u->old_kind;
    c.before = u->old_tuple;
    c.after = u->new_tuple;
  } else if (auto* d = std::get_if<pg::delete_>(e.message)) {
    c.kind = op::delete_;
    c.before_kind = d->old_kind;
    c.before = d->old_tuple;
  } else if (auto* m = std::get_if<pg::message>(e.message)) {
    c.kind = op::message;
    c.message = m;
  } else if (auto* t = std::get_if<pg::truncate>(e.message)) {
    c.kind = op::truncate;
    c.truncate_options = t->options;
    std::uint32_t index = e.index;
    for (auto oid : t->relation_oids) {
      c.relation = relations.find(oid);
      c.index = index++;
      if (c.relation) f(static_cast<const change&>(c));
    }
    return;
  } else {
    return;
  }
  f(static_cast<const change&>(c));
}

}  // namespace walgate::transform
