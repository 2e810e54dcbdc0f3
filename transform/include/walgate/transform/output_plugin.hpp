// An output plugin emulated from the event log: what a downstream slot (proxy/walsender) sends in
// each 'w' message, byte for byte as the real plugin on the real server writes it for the same
// changes. The walsender reads the log, groups it into transactions and calls the plugin; the
// plugin calls its sink with each 'w' message's bytes and the WAL position its header carries
// (the one the real walsender puts there: a change's own LSN, a transaction's end for a commit).
//
// Assumptions the walsender keeps (each broken by a test in tests/transform/*plugin*_test.cpp or
// tests/proxy/replication_server_test.cpp):
// - begin() comes before a transaction's first change, at that change's LSN (pgoutput sends no
//   empty transaction since 15, and walgate's log has none: a transaction is its changes);
// - the Truncate of several tables, which the log keeps as one event per table with the same
//   change LSN, reaches the plugin as one truncate() of all of them, in order;
// - a non-transactional message comes between transactions, never inside one (the log orders
//   it where the server decoded it, as the real plugin sees it).
#pragma once

#include "walgate/transform/change.hpp"
#include "walgate/transform/test_decoding.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace walgate::transform {

/// A table a client names in its options: "schema.table", a "*" for either part.
struct table_pattern {
  std::string schema, table;
  bool all_schemas = false, all_tables = false;
};

/// A table walgate's publications publish, as the upstream's catalog says when a stream starts:
/// its columns and which are NOT NULL (pg_attribute.attnotnull).
struct published_table {
  std::string schema, table;
  std::vector<std::pair<std::string, bool>> columns;   ///< (name, not null), in attnum order
};

/// What a plugin knows of the transaction it is in (a copy: the log's views are reused).
struct plugin_transaction {
  std::uint32_t xid = 0;
  protocol::lsn commit_lsn;   ///< the commit record's start (ReorderBufferTXN's final_lsn)
  protocol::lsn end_lsn;      ///< the commit record's end
  std::int64_t commit_time = 0;
  bool has_origin = false;
  std::string origin;          ///< its replication origin's name, when it has one
  protocol::lsn origin_lsn;    ///< and that origin's LSN
};

using plugin_sink = std::function<void(protocol::lsn at, std::string_view bytes)>;
using plugin_options = std::vector<std::pair<std::string, std::optional<std::string>>>;

class output_plugin {
 public:
  virtual ~output_plugin() = default;
  virtual void begin(const plugin_transaction& t, protocol::lsn first_change) = 0;
  /// An Insert, Update, Delete or transactional Message of the open transaction.
  virtual void change(const plugin_transaction& t, const transform::change& c) = 0;
  virtual void truncate(const plugin_transaction& t, const std::vector<const protocol::pgoutput::cached_relation*>& relations,
                        std::uint8_t options, protocol::lsn at) = 0;
  virtual void commit(const plugin_transaction& t) = 0;
  /// A non-transactional message (between transactions).
  virtual void message(const transform::change& c) = 0;
  /// True when begin() prints the transaction's end_lsn (wal2json's include-lsn "nextlsn"): the
  /// caller then finds it before the first change (the log knows it at the transaction's last
  /// event); otherwise end_lsn has to be right by commit() only.
  virtual bool needs_end_at_begin() const { return false; }
  /// The tables the client asked for by name (wal2json's add-tables): each must match a table
  /// walgate's publications publish — a stream that could never hold one is an error, not an
  /// empty stream. Empty: none named.
  virtual std::vector<table_pattern> named_tables() const { return {}; }
  /// True when the plugin needs the publication's tables from the catalog before it streams
  /// (named tables to check, wal2json's include-not-null); set_catalog gives them.
  virtual bool needs_catalog() const { return !named_tables().empty(); }
  virtual void set_catalog(const std::vector<published_table>&) {}
  /// Set when the stream has to end with an ERROR (the real plugin's), e.g. a wal2json
  /// format-version 1 transaction past PostgreSQL's 1 GiB string limit.
  const std::string& failed() const { return failed_; }
  const std::string& failed_sqlstate() const { return failed_sqlstate_; }
  const std::string& failed_detail() const { return failed_detail_; }

 protected:
  explicit output_plugin(plugin_sink sink) : sink_(std::move(sink)) {}
  plugin_sink sink_;
  std::string failed_;
  std::string failed_sqlstate_ = "XX000", failed_detail_;
};

struct plugin_made {
  std::unique_ptr<output_plugin> plugin;
  std::string sqlstate;   ///< with error: the ErrorResponse's
  std::string error;      ///< the real plugin's startup error text, or walgate's for what it does not serve
};

/// format_type() of a column's type as a plugin in a session with search_path '' prints it:
/// without the typmod as format_type_be() (test_decoding: "character", "public.mood") or with it as
/// format_type_with_typemod() (wal2json: "character(4)", "bpchar", "numeric(10,2)").
std::string plugin_type_name(const change& c, const protocol::pgoutput::cached_column& col, bool with_typmod);
/// pg_type.typname of a column's type (wal2json with include-typmod off): "int4", "_text", "mood".
std::string plugin_typname(const change& c, const protocol::pgoutput::cached_column& col);

/// PostgreSQL's parse_bool(): a prefix of true/false/yes/no (on/off: at least two letters), 1/0.
bool pg_parse_bool(std::string_view v, bool& out);

std::unique_ptr<output_plugin> make_test_decoding_plugin(const test_decoding_options& o, plugin_sink sink);

/// The plugins walgate emulates: "test_decoding", "wal2json" and "pgoutput".
bool is_emulated_plugin(std::string_view name);

/// What a plugin's startup may check its options against.
struct plugin_context {
  int server_major = 18;                   ///< the upstream's (test_decoding's output changed in 17; pgoutput's protocol versions)
  std::vector<std::string> publications;   ///< walgate's own (pgoutput's publication_names must be among them)
};

/// The plugin with START_REPLICATION's options, as its startup callback parses them.
plugin_made make_output_plugin(std::string_view name, const plugin_options& options, const plugin_context& context,
                               plugin_sink sink);

}  // namespace walgate::transform
