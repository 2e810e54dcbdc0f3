// Replication commands (sent as simple queries on a replication=database connection), in the
// syntax each server version accepts, with every name and value quoted correctly.
#pragma once

#include "walgate/protocol/lsn.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::protocol {

/// Major version from server_version_num (e.g. 150018 -> 15) or the server_version parameter
/// ("15.18 (Debian 15.18-0+deb12u1)", "18.4", "16beta2" -> 15/18/16). 0 if unparseable.
int server_major_from_version_string(std::string_view server_version);

/// Highest pgoutput proto_version a server major version accepts:
/// 1 (PG10-13), 2 (PG14: streaming), 3 (PG15: two-phase), 4 (PG16+: parallel streaming).
std::uint32_t max_pgoutput_protocol(int server_major);

/// Replication slot names: 1-63 characters of [a-z0-9_] (ReplicationSlotValidateName in
/// src/backend/replication/slot.c; NAMEDATALEN - 1 = 63).
bool valid_slot_name(std::string_view name);

/// "name" with embedded double quotes doubled. Never returns an unquoted form, so case and
/// every character are kept exactly.
std::string quote_identifier(std::string_view name);
/// 'value' with embedded single quotes doubled (standard_conforming_strings, which the
/// replication command scanner also follows). The caller rejects NUL bytes.
std::string quote_literal(std::string_view value);

struct command {
  std::string text;    ///< The command, when error is empty.
  std::string error;   ///< Why it cannot be built for this server, in one line.
  explicit operator bool() const { return error.empty(); }
};

enum class snapshot_action { export_snapshot, no_export, use };

struct create_slot_options {
  std::string slot;
  bool temporary = false;
  snapshot_action snapshot = snapshot_action::no_export;
  bool two_phase = false;   ///< PG15+.
  /// PG17+: the slot is synchronised to standbys that ask for it (sync_replication_slots), so
  /// that a consumer can go on from a promoted standby. Not with temporary (the server refuses).
  bool failover = false;
};
/// CREATE_REPLICATION_SLOT name [TEMPORARY] LOGICAL pgoutput ...: the option-list syntax
/// (SNAPSHOT 'export', TWO_PHASE) on PG15+, the legacy keywords (EXPORT_SNAPSHOT...) before.
command build_create_slot(const create_slot_options& o, int server_major);

/// DROP_REPLICATION_SLOT name [WAIT]: WAIT waits for an active walsender to release it.
command build_drop_slot(std::string_view slot, bool wait);

enum class streaming_mode { off, on, parallel };

struct start_replication_options {
  std::string slot;
  lsn start;                        ///< 0/0: the slot's confirmed_flush_lsn.
  std::uint32_t proto_version = 1;
  std::vector<std::string> publications;
  bool messages = false;            ///< PG14+: logical decoding messages.
  streaming_mode streaming = streaming_mode::off;  ///< on: PG14+ (proto 2); parallel: PG16+ (proto 4).
  bool binary = false;              ///< PG14+.
  bool two_phase = false;           ///< PG15+ (proto 3).
  std::optional<std::string> origin;  ///< "none" or "any", PG16+.
};
/// START_REPLICATION SLOT name LOGICAL X/Y (proto_version '4', publication_names '"a","B c"', ...)
/// Options are emitted only when set; a requested option the server lacks is an error naming
/// the version that introduced it.
command build_start_replication(const start_replication_options& o, int server_major);

}  // namespace walgate::protocol

namespace walgate::protocol {

/// TIMELINE_HISTORY <tli>: the history file of a timeline (a row: its file name, its content).
command build_timeline_history(std::uint32_t timeline);

/// One line of a timeline history file: `timeline` was left for the next one at `switchpoint`
/// (the first byte that timeline does not share with its parent's later WAL).
struct timeline_switch {
  std::uint32_t timeline = 0;
  lsn switchpoint;
};
/// Parses a timeline history file (TIMELINE_HISTORY's content; PostgreSQL writes it in
/// timeline.c): lines "<tli><ws><X/X><ws><reason>", blank lines and lines whose first
/// non-blank character is '#' skipped, as readTimeLineHistory reads it. Timelines strictly
/// increasing and switch points not decreasing (a history that says otherwise is not one the
/// server wrote); nullopt when malformed or longer than 2^16 lines.
std::optional<std::vector<timeline_switch>> parse_timeline_history(std::string_view text);
/// Where a history leaves `timeline` (its switch point), nullopt when it does not name it: a
/// timeline not in the server's history is not one of its ancestors.
std::optional<lsn> switchpoint_of(const std::vector<timeline_switch>& history, std::uint32_t timeline);

}  // namespace walgate::protocol
