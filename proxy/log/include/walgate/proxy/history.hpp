// The server history an event log follows, in its data directory beside the segments:
//
//   TIMELINE  "<system identifier> <timeline>\n": the cluster and timeline the log was last
//             streamed from (walgate serve checks it at every connection, before streaming);
//   CUT       a cut requested (when a promoted server never had what the log holds past its
//             timeline's switch point): made by event_log::cut_history at the next start,
//             before anything reads the log, then removed;
//   CUTS      one line per cut made, "<at> <last> <from timeline> <to timeline>": ids with a
//             commit LSN in [at, last] were logged from a timeline the server left at `at`;
//             on the server's timeline they name nothing, or other changes (410 to a resume).
//
// Assumptions, each tested (history_test.cpp, failover_test.cpp): two servers with one system
// identifier share their WAL up to a timeline's switch point and nothing after it; the server
// always knows the history of its own timeline (TIMELINE_HISTORY); a position past the switch
// point on the old timeline may be reused by the new one for another change.
#pragma once

#include "walgate/protocol/commands.hpp"
#include "walgate/protocol/lsn.hpp"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace walgate::proxy {

struct followed_timeline {
  std::string system_id;   ///< IDENTIFY_SYSTEM's systemid (decimal)
  std::uint32_t timeline = 0;
  /// The server of walgate's last connection was a standby (in recovery; 16+: decoding there).
  /// Written "<systemid> <timeline> standby"; a file without it (before 2026-12) is not.
  bool standby = false;
};
/// TIMELINE; nullopt when absent or malformed (then it is written anew at the next connection).
std::optional<followed_timeline> read_followed_timeline(const std::filesystem::path& dir);
/// Written to a temporary file, synced, renamed over TIMELINE, the directory synced.
bool write_followed_timeline(const std::filesystem::path& dir, const followed_timeline& t, bool fsync, std::string& error);

struct history_cut {
  protocol::lsn at;     ///< the switch point: everything committed from here on was cut
  protocol::lsn last;   ///< the last commit LSN cut (invalid in a request: found when cutting)
  std::uint32_t from_timeline = 0, to_timeline = 0;
  /// Whether an id with this commit LSN was logged from the timeline cut off (and so names no
  /// change of the server's history, or another one).
  bool covers(protocol::lsn commit) const { return last.valid() && commit >= at && commit <= last; }
};
/// CUTS (a line that does not parse is skipped: a torn append of the last one is made again).
std::vector<history_cut> read_history_cuts(const std::filesystem::path& dir);
/// CUT, written durably (temporary file, rename, directory synced).
bool write_cut_request(const std::filesystem::path& dir, const history_cut& c, bool fsync, std::string& error);
std::optional<history_cut> read_cut_request(const std::filesystem::path& dir);

/// What a connection to a server means for the log (walgate serve asks at each one, before
/// streaming): the server's cluster, timeline and that timeline's history against what the log
/// followed, and how far the log reaches (durable: logged or acknowledged).
struct history_verdict {
  enum class kind {
    same,     ///< the timeline the log follows: go on
    follow,   ///< a later timeline that left the log's at `at`, and the log holds nothing past it:
              ///< store the new timeline, go on
    cut,      ///< a later timeline, but the log holds history past `at` the server never had: cut there
    retry,    ///< an earlier timeline (a server not following the promotion yet): another connection may do
    refuse,   ///< another cluster, or a timeline that does not descend from the log's
  } what = kind::same;
  protocol::lsn at;
  std::string message;   ///< for the log line or the failure (where: the server, as it is named in it)
  /// follow: the log holds history past `at` of the server's own timelines — streamed from a
  /// standby that walgate decoded on while it followed a new timeline or was promoted.
  bool promoted_under_us = false;
};
/// slot_confirmed: the slot's confirmed_flush_lsn on the server (stream_start_info; nullopt: no
/// such slot). When the log's last connection was to a standby (stored->standby) and the server
/// holds the slot, the log's history past the switch point is the server's own: followed, not
/// cut. Why that holds: a standby's logical slot is its own (not a failover slot, never
/// synchronised), so a server holding it is that standby, now on a later timeline; walgate
/// decoded on it continuously since its last connection (each connection checks, and stores, the
/// timeline and whether the server is a standby), and what that standby replayed or wrote is its
/// timelines' history — whether it followed another promoted server or was promoted itself. A
/// slot position says nothing here (another consumer may have moved it). Not: a log whose last
/// connection was to a primary (a slot there may be a synchronised copy of another server's).
history_verdict check_history(const std::optional<followed_timeline>& stored, const std::string& system_id,
                              std::uint32_t timeline, const std::vector<protocol::timeline_switch>& history,
                              protocol::lsn durable, const std::string& where,
                              std::optional<protocol::lsn> slot_confirmed = std::nullopt);

}  // namespace walgate::proxy
