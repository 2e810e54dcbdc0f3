// PostgreSQL's pgoutput (src/backend/replication/pgoutput/pgoutput.c), emulated from the event
// log for PostgreSQL's own subscribers: the log keeps what pgoutput sent walgate, so each change
// goes out as the same logical replication protocol message, with the Relation (and Type)
// messages a subscriber needs before a relation's first change on the connection.
//
// Assumptions, each broken by a test in tests/transform/pgoutput_plugin_test.cpp (exact bytes,
// read back by walgate's own decoder) or tests/proxy/replication_server_test.cpp (a real
// subscriber applying from walgate, killed and restarted):
// - the log's tuples are pgoutput's own ('n', 'u', 't'): copied as they are;
// - the subscriber's publication_names are walgate's own publications (the log holds what they
//   publish — their row filters and column lists already applied upstream); another
//   publication is refused, never an empty or wrong stream;
// - transactions go out whole (B … C) whatever `streaming` asks: a subscriber takes a whole
//   transaction at any protocol version, as it does from a publisher below
//   logical_decoding_work_mem; a prepared transaction of a `two_phase` subscriber arrives at
//   its COMMIT PREPARED as a plain commit (the log keeps it that way);
// - a relation is described again when its definition in the log changes (an ALTER TABLE),
//   as pgoutput does after an invalidation; a Type message comes before for each column type
//   outside the built-in range (OID ≥ 10000), as pgoutput sends them.
#pragma once

#include "walgate/transform/output_plugin.hpp"

#include <string>
#include <vector>

namespace walgate::transform {

struct pgoutput_options {
  std::uint32_t proto_version = 1;
  std::vector<std::string> publication_names;
  bool messages = false;
  std::string streaming = "off";   ///< off, on, parallel (accepted; transactions go whole)
  bool two_phase = false;
  bool origin_none = false;        ///< origin 'none': transactions with an origin left out
  bool lazy_begin = true;          ///< BEGIN with the first message (pgoutput from 15; before, always)
};

struct pgoutput_parse {
  pgoutput_options options;
  std::string sqlstate;
  std::string error;
};
/// START_REPLICATION's options as pgoutput_startup parses them (parse_output_parameters), with
/// its texts; `binary 'true'` is refused (walgate's log holds text values).
pgoutput_parse parse_pgoutput_options(const plugin_options& options, const plugin_context& context);

/// PostgreSQL's SplitIdentifierString() with ',': names unquoted (lower-cased) or quoted ("" a
/// quote), whitespace around them; false on a syntax error.
bool split_identifier_list(std::string_view text, std::vector<std::string>& out);

std::unique_ptr<output_plugin> make_pgoutput_plugin(const pgoutput_options& o, plugin_sink sink);

}  // namespace walgate::transform
