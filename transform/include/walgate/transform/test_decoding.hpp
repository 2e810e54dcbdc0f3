// PostgreSQL's test_decoding output plugin (contrib/test_decoding/test_decoding.c), emulated
// from the event log: what a downstream slot created with plugin test_decoding sends in each
// 'w' message, byte for byte as the real plugin on the real server writes it for the same change.
//
// Assumptions, each broken by a test in tests/transform/test_decoding_test.cpp:
// - the value text in the log is the type output function's (pgoutput text mode), which is what
//   test_decoding prints; a value pgoutput sent as 'u' (unchanged TOAST) is printed
//   "unchanged-toast-datum", as test_decoding does for an on-disk external datum;
// - type names are format_type_be()'s, without typmod, and types outside pg_catalog are
//   schema-qualified (pg_recvlogical and every libpq replication client run with search_path '');
// - identifiers are quoted as quote_identifier() does: unless all of [a-z0-9_] starting with
//   [a-z_] and not a keyword other than an unreserved one (PostgreSQL 18's keyword list);
// - an old tuple prints its non-null columns only (skip_nulls), a new one every column;
// - one Truncate of several tables is one line: the log keeps a truncate per table, with the
//   same change LSN — the caller joins them (test_decoding_truncate).
#pragma once

#include "walgate/transform/change.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::transform {

struct test_decoding_options {
  bool include_xids = true;
  bool include_timestamp = false;
  bool skip_empty_xacts = false;
  bool only_local = false;
  /// test_decoding 17+: a transactional message is a change (with skip-empty-xacts its BEGIN is
  /// printed before it, and its COMMIT after); before 17 it is printed alone. Set by the caller
  /// from the server's version.
  bool message_is_change = true;
};

/// The options of START_REPLICATION as test_decoding parses them (pg_decode_startup): each a
/// boolean (parse_bool's words; no value: true). error: PostgreSQL's text ("option \"x\" = \"y\"
/// is unknown", "could not parse value \"y\" for parameter \"x\"").
struct test_decoding_parse {
  test_decoding_options options;
  std::string error;
};
test_decoding_parse parse_test_decoding_options(const std::vector<std::pair<std::string, std::optional<std::string>>>& options);

/// "BEGIN 745" / "BEGIN".
std::string test_decoding_begin(const test_decoding_options& o, std::uint32_t xid);
/// "COMMIT 745" / "COMMIT", with " (at <commit time>)" when include_timestamp (the time as
/// timestamptz_to_str prints it in UTC: "2026-12-07 15:04:20.123456+00").
std::string test_decoding_commit(const test_decoding_options& o, std::uint32_t xid, std::int64_t commit_time);
/// An Insert, Update, Delete or Message line (a Truncate: test_decoding_truncate).
void test_decoding_change(std::string& out, const change& c);
/// One Truncate of the relations given (in order), with its options (1 CASCADE, 2 RESTART IDENTITY).
void test_decoding_truncate(std::string& out, const std::vector<const protocol::pgoutput::cached_relation*>& relations,
                            std::uint8_t options);

/// PostgreSQL's quote_identifier().
std::string pg_quote_identifier(std::string_view name);

}  // namespace walgate::transform
