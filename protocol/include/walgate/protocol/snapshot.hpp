// What a per-client snapshot needs from PostgreSQL's bytes, with no connection in it:
//
//   pg_snapshot      pg_current_snapshot()'s text "xmin:xmax:xip,..." (64-bit xids), and
//                    whether a transaction by its 32-bit xid (as pgoutput's Begin carries it)
//                    was committed before the snapshot — its rows are in what the snapshot read;
//   copy_text_row    one row of COPY ... TO STDOUT in text format (tab-separated, \N for NULL,
//                    backslash escapes) into the columns pgoutput would have sent for it.
//
// Both parse untrusted bytes through bounds checks: malformed input is an error, never a guess.
#pragma once

#include "walgate/protocol/lsn.hpp"
#include "walgate/protocol/pgoutput.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::protocol {

struct pg_snapshot {
  std::uint64_t xmin = 0, xmax = 0;
  std::vector<std::uint64_t> xip;   ///< sorted
  /// The full (epoch-extended) xid of a 32-bit one near this snapshot: within 2^31 of xmax, as
  /// every xid the server can still hand out or report is.
  std::uint64_t widen(std::uint32_t xid) const;
  /// Whether the transaction with this top-level xid had committed when the snapshot was taken
  /// (a logged transaction is committed: it is visible unless it was still running then).
  bool sees(std::uint32_t xid) const;
  /// "xmin:xmax:xip,xip" as PostgreSQL prints it.
  std::string to_string() const;
};
/// Parses pg_current_snapshot()::text; nullopt when malformed (xmin <= xip < xmax, sorted,
/// xmin <= xmax, at most 2^20 entries).
std::optional<pg_snapshot> parse_pg_snapshot(std::string_view text);

/// Parses one COPY text-format row (without or with its trailing newline) into out, whose values
/// are views into line (a value without escapes) or into storage (cleared and refilled: the
/// values with escapes, unescaped): both must outlive out's use. false with error
/// when malformed (a backslash at the end, more columns than max_columns).
bool parse_copy_text_row(std::string_view line, std::string& storage, std::vector<pgoutput::tuple_column>& out,
                         std::string& error);

}  // namespace walgate::protocol
