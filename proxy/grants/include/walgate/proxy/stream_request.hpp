// What a stream client asks for (/v1/stream and /v1/ws parameters), parsed from untrusted
// query strings; no Beast (the fuzz target parses them too).
#pragma once

#include "walgate/transform/formats.hpp"

#include <boost/json/fwd.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace walgate::proxy {

struct grants;   // policy.hpp
namespace predicate {
struct node;     // predicate.hpp
}

/// A table, or every table of a schema (any), as named in tables= or --create-publication.
struct table_pattern {
  std::string schema;   ///< empty only where a name may omit it (--create-publication)
  std::string table;    ///< the name as stored (unquoted); empty when any
  bool any = false;     ///< schema.*
  bool operator==(const table_pattern&) const = default;
};
/// Parses a comma list of table names, each schema.table or schema.* (with schema_optional,
/// a bare table too). Each name is plain — letters, digits, _ $ - and non-ASCII, matched as
/// stored (no case folding) — or in SQL's quoted form, which may hold anything but NUL:
/// "My Schema"."Order Items", "a""b" for a"b, "*" for a table named *. At most 63 bytes each, as
/// PostgreSQL's names; spaces around names, dots and commas are ignored, as in SQL. nullopt with
/// error naming the item that is wrong.
std::optional<std::vector<table_pattern>> parse_table_list(std::string_view list, bool allow_any, bool schema_optional,
                                                           std::string& error);
/// The name as SQL writes it, each part quoted (its quotes doubled): case and every character kept.
std::string sql_table_name(const table_pattern& t);

/// Parsed /v1/stream and /v1/ws parameters (exposed for tests and the fuzz target).
struct stream_request {
  transform::format fmt = transform::format::native;
  std::vector<table_pattern> tables;
  unsigned ops = 0;                                          ///< bit per transform::op char (insert's takes read); 0 = all
  std::optional<transform::event_id> from;
  bool tombstones = false;                                   ///< debezium: a null line after each delete
  bool compact = false;                                      ///< pgoutput2json compact mode
  bool snapshot = false;                                     ///< the current rows first (unless resuming)
  /// transactions=: begin and commit records around each transaction's events (native,
  /// wal2json, debezium). Unset: the format's default, decided when the stream starts (on for
  /// wal2json, and for debezium with --debezium-transaction-metadata).
  std::optional<bool> transactions;
  /// keys=true: each event as {"key":…,"value":…} with the format's message key (debezium,
  /// pgoutput2json, waltail).
  bool keys = false;
  /// group=transaction: one message per transaction (split at the server's group limit).
  bool group = false;
  /// empty_transactions=true: with transaction records or group=transaction, a transaction with
  /// nothing for this client still gets its begin and commit (or its message, events []) — one
  /// with an event of a table its token may see (table and op granted) within its tables=, or a
  /// message it may receive, that its other filters (ops=, where=, row grants) left out.
  bool empty_transactions = false;
  /// prefixes=: logical messages selected by prefix (globs: * any run, ? one character),
  /// whatever tables= says; empty: every message (unless tables= is given).
  std::vector<std::string> prefixes;
  /// message_events=true: over SSE, a logical message goes as the event named by its prefix.
  bool message_events = false;
  /// access_token= (RFC 6750 2.3): the bearer token of a client that cannot send a header
  /// (EventSource). Checked by the server, never logged.
  std::string access_token;
  /// With --policy: what the client's token grants (events outside it are not sent); null: no
  /// policy.
  std::shared_ptr<const grants> granted;
  /// where=: the client's own row filter (predicate.hpp), its claims substituted once the token
  /// is known (instantiate_where); null: none.
  std::shared_ptr<const predicate::node> where;
};
/// Substitutes the token's claims in a request's where= (none without a token: a claim then
/// matches nothing).
void instantiate_where(stream_request& r, const boost::json::object* claims);
struct request_error {
  std::string parameter, message;
};
/// Parses the query string of a stream request ("format=native&tables=public.*&from=0/16B3748:0").
std::optional<stream_request> parse_stream_query(std::string_view target, request_error& error);
/// The query of /v1/mux: nothing but access_token (its subscriptions' parameters come in
/// messages). The token (empty: none), or nullopt with error.
std::optional<std::string> parse_mux_query(std::string_view target, request_error& error);
/// Whether a glob (* any run of characters, ? one) matches the whole of text.
bool glob_match(std::string_view glob, std::string_view text);
}  // namespace walgate::proxy
