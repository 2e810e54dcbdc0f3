// The five JSON envelopes. Each encoder appends one event's JSON (no trailing newline) to a
// string; the caller encodes each event once per format and shares the bytes.
//
//   native         walcast's ChangeEvent (shared/reference/000): id, lsn, commit_lsn,
//                  commit_time, schema, table, op, before, after
//   debezium       Debezium's change event (004): before, after, source, op, ts_ms, transaction
//   pgoutput2json  PgOutput2Json (003): c, w, n, t, k, r (and compact mode with s)
//   waltail        Waltail (001): op, table, data, old, seq, idempotency_key, commit_lsn
//   wal2json       wal2json format-version 2: action, schema, table, columns, identity
//
// docs/api.md states every value mapping and every deliberate difference.
#pragma once

#include "walgate/transform/change.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::transform {

enum class format { native, debezium, pgoutput2json, waltail, wal2json };
inline constexpr format all_formats[] = {format::native, format::debezium, format::pgoutput2json, format::waltail,
                                         format::wal2json};
std::optional<format> parse_format(std::string_view name);
const char* to_string(format f);

/// What a value becomes where a format has no such value.
inline constexpr std::string_view unchanged_toast_native = "__unchanged_toast__";
inline constexpr std::string_view unchanged_toast_debezium = "__debezium_unavailable_value";
inline constexpr std::string_view unchanged_toast_pgoutput2json = "__TOAST__";

struct encoder_options {
  // debezium
  enum class decimal_mode { string, double_, precise } decimal = decimal_mode::string;
  enum class time_precision { adaptive_time_microseconds, connect } time = time_precision::adaptive_time_microseconds;
  std::string server_name = "walgate";   ///< source.name (Debezium's topic prefix).
  std::string database;                   ///< source.db
  bool transaction_metadata = false;      ///< transaction: {id, total_order, data_collection_order}
  std::int64_t processing_time_ms = 0;    ///< top-level ts_ms; 0: now
  // pgoutput2json
  bool compact = false;                   ///< k/r as arrays of values
  bool include_schema = false;            ///< compact mode: add "s" (first row of a table per client, and after it changes)
};

/// Appends the event; false (nothing appended) when the format has no such event (Waltail and
/// PgOutput2Json have no truncate or message events).
bool encode_change(std::string& out, const change& c, format f, const encoder_options& o = {});

/// A transaction's records for one client (transactions=true), in the formats that have them
/// (native, wal2json, debezium): the begin, before the first event the client is sent of it,
/// and the commit, after its last, with what the client was sent of it (after its filters).
struct table_count {
  std::string schema, table;
  std::uint64_t events = 0;
};
/// Appends the begin record; false (nothing appended) when the format has none:
///   native    {"id":"<commit_lsn>:B","op":"begin","xid":..,"commit_lsn":..,"commit_time":..[,"origin":..]}
///   wal2json  {"action":"B","xid":..,"timestamp":".."} (the plugin's include-xids and include-timestamp)
///   debezium  {"status":"BEGIN","id":"<xid>:<commit LSN>","ts_ms":..,"event_count":null,"data_collections":null}
bool encode_begin(std::string& out, format f, const protocol::transaction_info& t);
/// Appends the commit record (native "op":"commit" with "events" and "tables", wal2json "C",
/// Debezium "END" with event_count and data_collections); false when the format has none.
bool encode_commit(std::string& out, format f, const protocol::transaction_info& t, std::uint64_t events,
                   const std::vector<table_count>& tables);
/// Debezium's transaction block of a change: {"id":"<xid>:<commit LSN>","total_order":n,"data_collection_order":m}.
void append_debezium_transaction(std::string& out, const protocol::transaction_info& t, std::uint64_t total_order,
                                 std::uint64_t data_collection_order);
/// A timestamptz as PostgreSQL's timestamptz_to_str writes it in UTC (wal2json's "timestamp"):
/// "2026-12-02 21:19:32.12345+00", trailing zeros of the fraction dropped.
std::string pg_timestamptz_utc(std::int64_t pg_epoch_us);

/// Debezium's record key: the replica-identity columns, e.g. {"id":4471}; "null" when the table
/// has no key columns.
std::string debezium_key(const change& c, const encoder_options& o = {});
/// Waltail's ordering key "schema.table:pk" (composite keys comma-joined).
std::string waltail_ordering_key(const change& c);
/// PgOutput2Json's message key: the key column values as a JSON array, e.g. [1].
std::string pgoutput2json_key(const change& c);

}  // namespace walgate::transform
