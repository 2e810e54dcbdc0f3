// The event record: one change event as self-contained bytes — transaction info, the relation's
// definition, the names of its non-built-in types, the old and new tuples as PostgreSQL sent
// them. It is what the event log stores, and the live path encodes from the same record, so a
// replayed event encodes to exactly what the live path sent.
#pragma once

#include "walgate/transform/change.hpp"

#include <boost/system/result.hpp>

#include <memory>
#include <span>
#include <unordered_map>
#include <string>
#include <vector>

namespace walgate::transform {

/// Appends the record of c to out.
void write_record(std::string& out, const change& c);

/// write_record that remembers the relation part of each relation's records (its definition
/// and type names, keyed by their generations), so a stream of changes copies it whole instead
/// of writing it field by field. The bytes are the same.
class record_writer {
 public:
  void write(std::string& out, const change& c);

 private:
  struct block {
    std::uint64_t relation_generation = 0, types_generation = 0;
    std::string bytes;
  };
  std::unordered_map<const void*, block> blocks_;
};

/// A record made before its place in the log is known (the initial snapshot's rows, made on the
/// copying threads with index 0): sets its event index, and its snapshot_last flag. False (and
/// nothing changed) when the bytes do not begin with a record's header.
bool place_record(std::span<char> record, std::uint32_t index, bool snapshot_last);

/// A parsed record: owns the relation, type names and tuple storage; values are views into the
/// record bytes, which must outlive it.
class record_view {
 public:
  const change& get() const { return change_; }
  const std::string& schema() const { return relation_.nspname; }
  const std::string& table() const { return relation_.relname; }

 private:
  friend boost::system::result<void, protocol::decode_error> read_record(protocol::bytes_view, record_view&);
  change change_;
  protocol::transaction_info txn_;
  protocol::pgoutput::cached_relation relation_;
  protocol::pgoutput::type_cache types_;
  std::vector<protocol::pgoutput::tuple_column> before_, after_;
  protocol::pgoutput::message message_;
};

/// Parses a record (bounds-checked: the log's bytes are trusted no more than the network's).
boost::system::result<std::unique_ptr<record_view>, protocol::decode_error> read_record(protocol::bytes_view bytes);
/// The same into a view that is reused: its storage (column names, tuples) is kept between
/// records, so a steady stream of records of one table parses without allocating.
boost::system::result<void, protocol::decode_error> read_record(protocol::bytes_view bytes, record_view& into);

}  // namespace walgate::transform
