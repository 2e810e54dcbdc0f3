// The transaction assembler: pgoutput messages in, whole committed transactions out, in commit
// order, each change with its own LSN and its index within the transaction.
//
// - Ordinary transactions (Begin ... Commit) pass straight through without copying.
// - Streamed transactions (streaming = on/parallel): the raw messages of each top-level xid are
//   buffered until Stream Commit, then replayed as if they had arrived between Begin and Commit.
//   Stream Abort of a subtransaction drops that subtransaction's messages (and everything after
//   its first one, which can only belong to it or to its own subtransactions); of the top-level
//   xid, all of them.
// - Two-phase (two_phase = on): Begin Prepare ... Prepare (or Stream Prepare) is held until
//   Commit Prepared releases it, or Rollback Prepared drops it.
// - Held bytes are bounded: past memory_limit the largest buffer moves to a spill file in
//   spill_dir, so a transaction many times larger than the limit streams through.
//
// Relation and Type messages update the caches in stream order (buffered ones when replayed),
// which is what the server's own apply worker does.
//
// Lifetime: everything handed to the handler is valid only during the call.
#pragma once

#include "walgate/protocol/pgoutput.hpp"

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace walgate::protocol {

struct transaction_info {
  std::uint32_t xid = 0;
  lsn commit_lsn;
  lsn end_lsn;
  std::int64_t commit_time = 0;      ///< PostgreSQL-epoch microseconds.
  std::optional<std::string> origin; ///< Replication origin name, when the transaction has one.
  lsn origin_lsn;
  bool streamed = false;             ///< Arrived in stream blocks.
  std::string gid;                   ///< Set for a two-phase transaction released by Commit Prepared.
};

/// One change: Insert, Update, Delete, Truncate or a transactional logical Message.
struct change_event {
  lsn change_lsn;                    ///< WAL start of the change's frame.
  std::uint32_t index = 0;           ///< Zero-based within the transaction. A Truncate of n relations takes n indexes, from this one.
  const pgoutput::any_message* message = nullptr;
  const pgoutput::cached_relation* relation = nullptr;   ///< For Insert/Update/Delete.
};

class transaction_handler {
 public:
  virtual ~transaction_handler() = default;
  /// Before the first change of a transaction (or at its commit if it has none). All of info
  /// is known by then.
  virtual boost::system::error_code on_begin(const transaction_info& txn) = 0;
  virtual boost::system::error_code on_change(const transaction_info& txn, const change_event& change) = 0;
  virtual boost::system::error_code on_commit(const transaction_info& txn) = 0;
  /// A non-transactional logical decoding message (emitted at once, outside any transaction).
  virtual boost::system::error_code on_message(lsn wal_start, const pgoutput::message& m) { return {}; }
};

struct assembler_options {
  pgoutput::decode_context context;           ///< Protocol version and Stream Abort layout.
  std::size_t memory_limit = 64u << 20;       ///< Bytes of held messages kept in memory, all transactions together.
  std::filesystem::path spill_dir;            ///< Where held transactions spill (empty: the system temp dir).
};

struct assembly_error {
  errc code = errc::ok;
  std::string message;
};

class assembler {
 public:
  assembler(assembler_options options, transaction_handler& handler);
  ~assembler();
  assembler(const assembler&) = delete;
  assembler& operator=(const assembler&) = delete;

  /// Feeds the data of one XLogData frame and its WAL start.
  boost::system::result<void, assembly_error> feed(lsn wal_start, bytes_view data);

  const pgoutput::relation_cache& relations() const { return relations_; }
  const pgoutput::type_cache& types() const { return types_; }
  /// Bytes of held messages in memory, and in spill files.
  std::size_t memory_bytes() const { return memory_bytes_; }
  std::size_t spilled_bytes() const;
  /// Streamed transactions not yet committed or aborted, and prepared transactions held.
  std::size_t open_streams() const { return streams_.size(); }
  std::size_t held_prepared() const { return prepared_.size(); }
  /// True between Begin and Commit of an ordinary transaction, or inside a stream block.
  bool in_transaction() const { return current_.has_value() || stream_xid_.has_value(); }

 private:
  class held_buffer;
  using held_ptr = std::unique_ptr<held_buffer>;

  boost::system::result<void, assembly_error> deliver_change(lsn wal_start, const pgoutput::any_message& m);
  boost::system::result<void, assembly_error> ensure_begun();
  boost::system::result<void, assembly_error> replay(held_buffer& buf, transaction_info info);
  boost::system::result<void, assembly_error> hold(held_buffer& buf, lsn wal_start, bytes_view data,
                                                   std::optional<std::uint32_t> subxid);
  boost::system::result<void, assembly_error> enforce_memory_limit();
  assembly_error handler_failed(const boost::system::error_code& ec) const;

  assembler_options options_;
  transaction_handler& handler_;
  pgoutput::decoder decoder_;
  pgoutput::relation_cache relations_;
  pgoutput::type_cache types_;

  // The ordinary (or replayed) transaction being delivered.
  std::optional<transaction_info> current_;
  bool begun_ = false;
  std::uint32_t next_index_ = 0;

  // Streaming: buffers by top-level xid; the xid of the open stream block.
  std::unordered_map<std::uint32_t, held_ptr> streams_;
  std::optional<std::uint32_t> stream_xid_;
  // Two-phase: the transaction between Begin Prepare and Prepare, and those held by gid.
  held_ptr preparing_;
  std::optional<transaction_info> preparing_info_;
  std::map<std::string, held_ptr> prepared_;

  std::size_t memory_bytes_ = 0;
};

}  // namespace walgate::protocol
