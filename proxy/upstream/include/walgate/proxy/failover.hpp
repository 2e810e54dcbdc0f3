// Whether walgate's slot can survive a failover (issue 34): asked of the primary the stream is
// on and of the standbys listed in --pg, every minute by walgate serve (watch_slot), told in
// /metrics (walgate_slot_failover_ready) and in one log line when it changes.
#pragma once

#include "walgate/proxy/conninfo.hpp"
#include "walgate/proxy/failure.hpp"

#include <boost/asio/awaitable.hpp>

#include <string>
#include <vector>

namespace walgate::proxy {

class pg_connection;

struct failover_report {
  /// The slot is a failover slot, synchronized_standby_slots is set on the primary, and a standby
  /// listed in --pg holds a synchronised, persistent copy of the slot and is set up to follow.
  bool ready = false;
  /// Standbys reached that hold such a copy ("HOST:PORT").
  std::vector<std::string> ready_standbys;
  /// What keeps it from being ready, each what the operator must set or do.
  std::vector<std::string> missing;
  /// One line for the log: ready, on which standbys; or not, and why.
  std::string summary(const std::string& slot) const;
};

/// Asks primary (a connection to the stream's server, not in recovery) about slot, and each
/// other host of params (a connection each, target_session_attrs any) that is a standby.
/// Failures to reach a standby are part of the report, not errors; a failure of primary's
/// queries is returned.
boost::asio::awaitable<outcome<failover_report>> check_failover(pg_connection& primary, const conn_params& params,
                                                                 const std::string& slot);

}  // namespace walgate::proxy
