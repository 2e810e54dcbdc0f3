// check_failover (failover.hpp): the primary's slot and setting, then each standby of --pg.
// Assumptions, each broken by failover_test.cpp: a host of --pg that is not in recovery is not
// a standby of this primary (passed over, not counted); a standby's copy counts only once it is
// synced and persistent (a temporary copy is dropped at promotion); synchronized_standby_slots
// must name the standby's own physical slot (primary_slot_name), or the primary may send walgate
// what that standby has not received.
#include "walgate/proxy/failover.hpp"

#include "walgate/protocol/commands.hpp"
#include "walgate/proxy/pg_connection.hpp"

#include <boost/asio/this_coro.hpp>

#include <algorithm>

namespace walgate::proxy {

namespace {

namespace asio = boost::asio;

std::vector<std::string> setting_list(const std::string& v) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= v.size()) {
    auto comma = v.find(',', start);
    std::string item = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    item.erase(0, item.find_first_not_of(" \t\""));
    item.erase(item.find_last_not_of(" \t\"") + 1);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

std::string failover_report::summary(const std::string& slot) const {
  if (ready) {
    std::string s = "replication slot \"" + slot + "\" can survive a failover: synchronised on ";
    for (std::size_t i = 0; i < ready_standbys.size(); ++i) s += (i ? ", " : "") + ready_standbys[i];
    return s;
  }
  std::string s = "replication slot \"" + slot + "\" cannot survive a failover yet";
  for (const auto& m : missing) s += "; " + m;
  return s;
}

asio::awaitable<outcome<failover_report>> check_failover(pg_connection& primary, const conn_params& params,
                                                          const std::string& slot) {
  failover_report out;
  const int major = primary.info().server_major;
  if (auto hot = primary.info().parameters.find("in_hot_standby");
      hot != primary.info().parameters.end() && hot->second == "on") {
    out.missing.push_back("the stream is on a standby: its slot cannot be a failover slot (only a primary's is "
                          "synchronised)");
    co_return out;
  }
  if (major < 17) {
    out.missing.push_back("failover slots need PostgreSQL 17 or later (this server is " + std::to_string(major) +
                          "): a promoted standby has no copy of the slot, and walgate then needs a new one and clients "
                          "a new snapshot");
    co_return out;
  }
  auto q = co_await primary.query(
      "SELECT (SELECT failover FROM pg_catalog.pg_replication_slots WHERE slot_name = " + protocol::quote_literal(slot) +
      "), current_setting('synchronized_standby_slots')");
  if (!q) co_return q.error();
  if (q->rows.size() != 1 || q->rows[0].size() != 2)
    co_return make_failure(protocol::errc::unexpected_message, "an unexpected answer about the failover settings");
  const auto& row = q->rows[0];
  const bool failover = row[0].value_or("") == "t";
  if (!row[0]) out.missing.push_back("the slot does not exist on the primary yet");
  else if (!failover)
    out.missing.push_back("it is not a failover slot: start walgate with --failover-slot on (the default)");
  const auto synchronized = setting_list(row[1].value_or(""));
  if (synchronized.empty())
    out.missing.push_back("synchronized_standby_slots is not set on the primary: without it a promoted standby may lack "
                          "transactions walgate already logged; set it to the standbys' physical slots (their "
                          "primary_slot_name) and reload");

  const std::string where = primary.info().host + ":" + std::to_string(primary.info().port);
  bool any_standby = false;
  for (const auto& ep : params.endpoints) {
    const std::string host = ep.host + ":" + std::to_string(ep.port);
    // (the primary itself: its host and port, and its address when hostaddr names one — two
    // servers may share a name for TLS and differ by hostaddr)
    if (host == where && (ep.address.empty() || ep.address == primary.info().address)) continue;
    conn_params one = params;
    one.endpoints = {ep};
    one.target_session_attrs = session_target::any;
    pg_connection c(co_await asio::this_coro::executor);
    if (auto r = co_await c.connect(one, false); !r) {
      out.missing.push_back("standby " + host + " cannot be reached: " + r.error().message.substr(0, 200));
      continue;
    }
    // What it is first (a host that is no standby, or one before 17, has no slot sync settings).
    auto what = co_await c.query("SELECT pg_is_in_recovery(), current_setting('server_version_num')::int");
    if (!what || what->rows.size() != 1 || what->rows[0].size() != 2) {
      out.missing.push_back("standby " + host + " could not be asked: " +
                            (what ? std::string("an unexpected answer") : what.error().message));
      continue;
    }
    if (what->rows[0][0].value_or("") != "t") continue;   // (not a standby: another primary, or this one by another name)
    any_standby = true;
    if (std::stoi(what->rows[0][1].value_or("0")) < 170000) {
      out.missing.push_back("standby " + host + " is before PostgreSQL 17: it cannot synchronise the slot");
      continue;
    }
    auto s = co_await c.query(
        "SELECT current_setting('sync_replication_slots', true), current_setting('hot_standby_feedback', true), "
        "current_setting('primary_slot_name', true), (SELECT synced AND NOT temporary FROM pg_catalog.pg_replication_slots "
        "WHERE slot_name = " + protocol::quote_literal(slot) + ")");
    if (!s || s->rows.size() != 1 || s->rows[0].size() != 4) {
      out.missing.push_back("standby " + host + " could not be asked: " + (s ? std::string("an unexpected answer") : s.error().message));
      continue;
    }
    // (r[1..4] as before: settings, then the copy)
    std::vector<std::optional<std::string>> r{std::optional<std::string>("t")};
    r.insert(r.end(), s->rows[0].begin(), s->rows[0].end());
    std::vector<std::string> needs;
    if (r[1].value_or("") != "on") needs.push_back("sync_replication_slots = on");
    if (r[2].value_or("") != "on") needs.push_back("hot_standby_feedback = on");
    const std::string physical = r[3].value_or("");
    if (physical.empty()) needs.push_back("primary_slot_name (a physical slot on the primary)");
    else if (!synchronized.empty() && std::find(synchronized.begin(), synchronized.end(), physical) == synchronized.end())
      needs.push_back("its slot \"" + physical + "\" in the primary's synchronized_standby_slots");
    if (!needs.empty()) {
      std::string m = "standby " + host + " needs ";
      for (std::size_t i = 0; i < needs.size(); ++i) m += (i ? ", " : "") + needs[i];
      out.missing.push_back(m + " (and dbname in its primary_conninfo)");
      continue;
    }
    if (r[4].value_or("") != "t") {
      out.missing.push_back("standby " + host + " has no synchronised copy of the slot yet");
      continue;
    }
    out.ready_standbys.push_back(host);
  }
  if (!any_standby && out.ready_standbys.empty() &&
      std::none_of(out.missing.begin(), out.missing.end(), [](const std::string& m) { return m.starts_with("standby "); }))
    out.missing.push_back("no standby is listed in --pg (host=primary,standby): whether the slot is synchronised is not known");
  out.ready = failover && !synchronized.empty() && !out.ready_standbys.empty();
  co_return out;
}

}  // namespace walgate::proxy
