// The downstream slots of walgate's walsender: name, plugin, confirmed_flush, and the flags
// recorded at creation, in the file <data-dir>/replication-slots. The table lives on the log's
// executor; the file is written on a thread of its own (write to a temporary file, fsync it,
// rename it over the old one, fsync the directory), the latest table winning when several
// saves wait. Temporary slots are never written.
//
// File: a first line "walgate replication slots 1", then one line per slot:
//   <name> <plugin> <confirmed_flush X/Y> <flags: some of two_phase,failover,invalidated in that order, or ->
// A file that does not read back exactly (a name of other characters, a bad LSN, a line of
// more or fewer fields) is an error naming the line: walgate does not start on it.
#pragma once

#include "walgate/protocol/lsn.hpp"

#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace walgate::proxy {

struct downstream_slot {
  std::string name;
  std::string plugin;
  protocol::lsn confirmed_flush;
  bool two_phase = false;
  bool failover = false;
  bool temporary = false;
  int active_pid = 0;   ///< the connection streaming from it, making or dropping it, or its temporary owner (0: none)
  bool dropping = false;   ///< being dropped: left out of the file
  /// Held more of the log than --replication-slot-max-mb: no longer holds any, and cannot
  /// stream (PostgreSQL's invalidation for max_slot_wal_keep_size). Kept until dropped.
  bool invalidated = false;
  /// Invalidated, and that stored: retention no longer keeps anything for it (read back from
  /// the file as invalidated: released at once).
  bool hold_released = false;
};

/// PostgreSQL's ReplicationSlotValidateName: "" when name is valid, else its error message.
std::string slot_name_error(const std::string& name);

class downstream_slots {
 public:
  downstream_slots(std::filesystem::path file, bool fsync);
  ~downstream_slots();

  bool load(std::string& error);
  downstream_slot* find(const std::string& name);
  std::map<std::string, downstream_slot>& all() { return slots_; }
  /// Writes the table (without temporary slots) in the background; done (may be empty) is
  /// called on the writer's thread with "" or the error once a write holding it is durable.
  void save(std::function<void(const std::string&)> done = {});

  /// The file's text of a table (exposed for tests).
  static std::string serialize(const std::map<std::string, downstream_slot>& slots);
  static bool parse(const std::string& text, std::map<std::string, downstream_slot>& out, std::string& error);

 private:
  void run();
  std::string write_file(const std::string& text);

  std::filesystem::path file_;
  bool fsync_;
  std::map<std::string, downstream_slot> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool pending_ = false;
  std::string pending_text_;
  std::vector<std::function<void(const std::string&)>> pending_done_;
  std::thread writer_;
};

}  // namespace walgate::proxy
