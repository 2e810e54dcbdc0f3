// The wal2json output plugin (github.com/eulerto/wal2json, 2.5 as Debian 12 ships it), emulated
// from the event log: format-version 1 (one JSON object per transaction, or its pieces with
// write-in-chunks, pretty-print's tabs and newlines) and 2 (one object per change, B and C around
// them), byte for byte as the real plugin on the real server writes them.
//
// Assumptions, each broken by a test in tests/transform/wal2json_plugin_test.cpp (exact bytes)
// or tests/proxy/replication_server_test.cpp (against the real plugin):
// - the value text in the log is the type output function's, which wal2json prints: numbers
//   (int2/4/8, oid, float4/8, numeric) bare, NaN and ±Infinity as null; bool true/false; bytea
//   without its "\x"; everything else a JSON string as PostgreSQL's escape_json() writes it
//   (control characters \u00xx in lower case, every other byte as it is);
// - a value pgoutput sent as 'u' (unchanged TOAST) is left out, column and all, as wal2json
//   leaves out an on-disk external datum;
// - the replica identity is the key columns pgoutput marks (all of them for REPLICA IDENTITY FULL,
//   as wal2json's identity bitmap is empty then): an old tuple when there is one, else the key
//   columns of the new one; format 1 leaves out the identity's nulls, format 2 prints them;
// - type names: format_type() with the typmod (format 2 always; format 1 unless include-typmod
//   is off, then pg_type.typname), types outside pg_catalog qualified (search_path '');
// - format 1 prints no truncate (wal2json 2.5's truncate callback is compiled out) but keeps the
//   transaction's object; a non-transactional message is an object of its own whose leading
//   comma depends on how many changes the transaction before it had (the plugin's counter is
//   not reset for it: {"change":[,{…}]} — kept);
// - message content is printed up to its first NUL byte (the plugin copies it as a C string).
// - include-not-null: pgoutput carries no NOT NULL, so it is read from the upstream's catalog
//   when the stream starts (the real plugin reads its relation cache at each change): a column
//   the catalog did not have then ends the stream with an error, never a guess;
// What the log cannot know is refused at START_REPLICATION, never printed wrong:
// include-default, include-pk, include-column-positions, include-origin, include-domain-data-type
// and filter-origins (pgoutput carries no default, primary key, attnum, origin id or domain).
#pragma once

#include "walgate/transform/output_plugin.hpp"

#include <string>
#include <vector>

namespace walgate::transform {

using wal2json_table = table_pattern;

struct wal2json_options {
  int format_version = 1;
  bool include_transaction = true;
  bool include_xids = false;
  bool include_timestamp = false;
  bool include_schemas = true;
  bool include_types = true;
  bool include_type_oids = false;
  bool include_typmod = true;
  bool include_lsn = false;
  bool include_not_null = false;   ///< from the catalog at the stream's start (set_catalog)
  bool pretty_print = false;
  bool pretty_whitespace = false;   ///< pretty-print was on at some point (the plugin never clears it)
  bool write_in_chunks = false;
  bool insert = true, update = true, delete_ = true, truncate = true;   ///< actions
  std::vector<wal2json_table> filter_tables;
  std::vector<wal2json_table> add_tables{wal2json_table{{}, {}, true, true}};   ///< default: *.*
  std::vector<std::string> filter_msg_prefixes, add_msg_prefixes;
};

struct wal2json_parse {
  wal2json_options options;
  std::string sqlstate;   ///< with error
  std::string error;      ///< wal2json's own text, or walgate's for an option it does not serve
};
/// START_REPLICATION's options as pg_decode_startup parses them (booleans as parse_bool, lists
/// split as split_string_to_list, tables as string_to_SelectTable with its "\" escapes and "*").
wal2json_parse parse_wal2json_options(const plugin_options& options);

std::unique_ptr<output_plugin> make_wal2json_plugin(const wal2json_options& o, plugin_sink sink);

/// PostgreSQL's escape_json() of a C string (it stops at a NUL).
void pg_escape_json(std::string& out, std::string_view s);

}  // namespace walgate::transform
