// pgoutput messages (logical replication protocol versions 1-4): one struct per message, named
// as in PostgreSQL's "Logical Replication Message Formats", a decoder and a writer for each.
//
// Lifetime: every view in a decoded message (names, tuple values, column and OID lists) points
// either into the input bytes or into the decoder's reusable storage. A message is valid until
// the next decode() on the same decoder and while the input bytes live. What must outlive that
// (relation definitions) is copied into relation_cache explicitly.
#pragma once

#include "walgate/protocol/backend.hpp"
#include "walgate/protocol/lsn.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

namespace walgate::protocol::pgoutput {

/// What the decoder must be told, never guess: the negotiated protocol version, whether the
/// message is inside a Stream Start/Stop block (then data messages carry the xid first), and
/// whether Stream Abort carries its LSN and time (protocol 4 with streaming = parallel).
struct decode_context {
  std::uint32_t proto_version = 1;
  bool in_stream = false;
  bool stream_abort_info = false;
};

/// MaxTupleAttributeNumber (src/include/access/htup_details.h): no tuple or relation has more.
inline constexpr std::size_t max_columns = 1664;

enum class column_kind : char { null = 'n', unchanged_toast = 'u', text = 't', binary = 'b' };

struct tuple_column {
  column_kind kind = column_kind::null;
  bytes_view value;   ///< The text or binary bytes; empty for null and unchanged TOAST.
};
using tuple_view = std::span<const tuple_column>;

// Begin: Int64 final_lsn | Int64 commit_ts | Int32 xid
struct begin {
  lsn final_lsn;
  std::int64_t commit_time = 0;   ///< PostgreSQL-epoch microseconds.
  std::uint32_t xid = 0;
};
// Commit: Int8 flags | Int64 commit_lsn | Int64 end_lsn | Int64 commit_ts
struct commit {
  std::uint8_t flags = 0;
  lsn commit_lsn;
  lsn end_lsn;
  std::int64_t commit_time = 0;
};
// Origin: Int64 origin_lsn | String name
struct origin {
  lsn origin_lsn;
  std::string_view name;
};
struct relation_column {
  std::uint8_t flags = 0;   ///< 1: part of the replica identity key.
  std::string_view name;
  std::uint32_t type_oid = 0;
  std::int32_t type_modifier = -1;
  bool key() const { return (flags & 1) != 0; }
};
// Relation: [xid] | Int32 oid | String namespace ("" = pg_catalog) | String name |
//           Int8 replica identity | Int16 ncols | ncols × (Int8 flags | String name | Int32 type | Int32 typmod)
struct relation {
  std::optional<std::uint32_t> xid;
  std::uint32_t oid = 0;
  std::string_view nspname;
  std::string_view relname;
  char replica_identity = 'd';   ///< d default, n nothing, f full, i index.
  std::span<const relation_column> columns;
};
// Type: [xid] | Int32 oid | String namespace | String name
struct type {
  std::optional<std::uint32_t> xid;
  std::uint32_t oid = 0;
  std::string_view nspname;
  std::string_view name;
};
// Insert: [xid] | Int32 relation | 'N' TupleData
struct insert {
  std::optional<std::uint32_t> xid;
  std::uint32_t relation_oid = 0;
  tuple_view new_tuple;
};
// Update: [xid] | Int32 relation | ['K' TupleData | 'O' TupleData] | 'N' TupleData
struct update {
  std::optional<std::uint32_t> xid;
  std::uint32_t relation_oid = 0;
  char old_kind = 0;        ///< 0 none, 'K' key columns, 'O' the whole old row (REPLICA IDENTITY FULL).
  tuple_view old_tuple;
  tuple_view new_tuple;
};
// Delete: [xid] | Int32 relation | ('K' TupleData | 'O' TupleData)
struct delete_ {
  std::optional<std::uint32_t> xid;
  std::uint32_t relation_oid = 0;
  char old_kind = 'K';
  tuple_view old_tuple;
};
// Truncate: [xid] | Int32 nrels | Int8 options (1 CASCADE, 2 RESTART IDENTITY) | nrels × Int32 oid
struct truncate {
  std::optional<std::uint32_t> xid;
  std::uint8_t options = 0;
  std::span<const std::uint32_t> relation_oids;
  bool cascade() const { return (options & 1) != 0; }
  bool restart_identity() const { return (options & 2) != 0; }
};
// Message: [xid] | Int8 flags (1 transactional) | Int64 lsn | String prefix | Int32 len | Byte(len)
struct message {
  std::optional<std::uint32_t> xid;
  bool transactional = false;
  lsn message_lsn;
  std::string_view prefix;
  bytes_view content;
};
// Stream Start: Int32 xid | Int8 first segment
struct stream_start {
  std::uint32_t xid = 0;
  bool first_segment = false;
};
// Stream Stop: (no fields)
struct stream_stop {};
// Stream Commit: Int32 xid | Int8 flags | Int64 commit_lsn | Int64 end_lsn | Int64 commit_ts
struct stream_commit {
  std::uint32_t xid = 0;
  std::uint8_t flags = 0;
  lsn commit_lsn;
  lsn end_lsn;
  std::int64_t commit_time = 0;
};
// Stream Abort: Int32 xid | Int32 subxid [| Int64 abort_lsn | Int64 abort_ts  (proto 4, parallel)]
struct stream_abort {
  std::uint32_t xid = 0;
  std::uint32_t subxid = 0;
  std::optional<lsn> abort_lsn;
  std::optional<std::int64_t> abort_time;
};
// Begin Prepare: Int64 prepare_lsn | Int64 end_lsn | Int64 prepare_ts | Int32 xid | String gid
struct begin_prepare {
  lsn prepare_lsn;
  lsn end_lsn;
  std::int64_t prepare_time = 0;
  std::uint32_t xid = 0;
  std::string_view gid;
};
// Prepare and Stream Prepare: Int8 flags | Int64 prepare_lsn | Int64 end_lsn | Int64 prepare_ts |
//                             Int32 xid | String gid
struct prepare {
  std::uint8_t flags = 0;
  lsn prepare_lsn;
  lsn end_lsn;
  std::int64_t prepare_time = 0;
  std::uint32_t xid = 0;
  std::string_view gid;
};
struct stream_prepare : prepare {};
// Commit Prepared: Int8 flags | Int64 commit_lsn | Int64 end_lsn | Int64 commit_ts | Int32 xid | String gid
struct commit_prepared {
  std::uint8_t flags = 0;
  lsn commit_lsn;
  lsn end_lsn;
  std::int64_t commit_time = 0;
  std::uint32_t xid = 0;
  std::string_view gid;
};
// Rollback Prepared: Int8 flags | Int64 prepare_end_lsn | Int64 rollback_end_lsn |
//                    Int64 prepare_ts | Int64 rollback_ts | Int32 xid | String gid
struct rollback_prepared {
  std::uint8_t flags = 0;
  lsn prepare_end_lsn;
  lsn rollback_end_lsn;
  std::int64_t prepare_time = 0;
  std::int64_t rollback_time = 0;
  std::uint32_t xid = 0;
  std::string_view gid;
};

using any_message = std::variant<begin, commit, origin, relation, type, insert, update, delete_, truncate, message,
                                 stream_start, stream_stop, stream_commit, stream_abort, begin_prepare, prepare,
                                 stream_prepare, commit_prepared, rollback_prepared>;

/// The tag byte of a message ('B', 'C', ...).
char tag_of(const any_message& m);
/// The message's name as in PostgreSQL's documentation ("Begin", "Stream Commit"...).
const char* name_of(char tag);

/// Decodes one pgoutput message (the data of one XLogData frame). Reuses its storage, so the
/// steady path of Insert/Update/Delete allocates nothing once the largest row has been seen.
class decoder {
 public:
  parse_result<any_message> decode(bytes_view data, const decode_context& ctx);

 private:
  std::vector<tuple_column> old_columns_, new_columns_;
  std::vector<relation_column> relation_columns_;
  std::vector<std::uint32_t> oids_;
};

/// Writes the bytes of a message exactly as pgoutput does (tests and fuzz seeds use this).
std::string encode(const any_message& m, const decode_context& ctx);

// --- caches of what outlives a frame -------------------------------------------------------

struct cached_column {
  std::string name;
  std::uint32_t type_oid = 0;
  std::int32_t type_modifier = -1;
  bool key = false;
};
struct cached_relation {
  std::uint32_t oid = 0;
  std::string nspname;   ///< "pg_catalog" when the message had an empty namespace.
  std::string relname;
  char replica_identity = 'd';
  std::vector<cached_column> columns;
  /// Unique in the process for each definition a relation_cache stored (0: made elsewhere):
  /// what derived data (an encoded record header) is keyed by.
  std::uint64_t generation = 0;
};

/// The next value of the process-wide generation counter (1, 2, ...).
std::uint64_t next_generation();

/// Relation definitions by OID, replaced whenever a new Relation message arrives.
class relation_cache {
 public:
  const cached_relation& update(const relation& r);
  const cached_relation* find(std::uint32_t oid) const;
  std::size_t size() const { return relations_.size(); }
  void clear() { relations_.clear(); }

 private:
  std::unordered_map<std::uint32_t, cached_relation> relations_;
};

struct cached_type {
  std::uint32_t oid = 0;
  std::string nspname;
  std::string name;
};
/// Type messages (sent for non-built-in types before the Relation that uses them).
class type_cache {
 public:
  const cached_type& update(const type& t);
  const cached_type* find(std::uint32_t oid) const;
  std::size_t size() const { return types_.size(); }
  void clear() {
    types_.clear();
    generation_ = 0;
  }
  /// Changes (process-wide unique) whenever a type is stored; 0 while none was.
  std::uint64_t generation() const { return generation_; }

 private:
  std::unordered_map<std::uint32_t, cached_type> types_;
  std::uint64_t generation_ = 0;
};

}  // namespace walgate::protocol::pgoutput
