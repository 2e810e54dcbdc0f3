#include "walgate/protocol/commands.hpp"

#include <charconv>
#include <cctype>

namespace walgate::protocol {

int server_major_from_version_string(std::string_view v) {
  int major = 0;
  std::size_t i = 0;
  while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])) && major < 100000)
    major = major * 10 + (v[i++] - '0');
  if (i == 0) return 0;
  if (major >= 10000) return major / 10000;  // server_version_num
  return major;
}

std::uint32_t max_pgoutput_protocol(int server_major) {
  if (server_major >= 16) return 4;
  if (server_major == 15) return 3;
  if (server_major == 14) return 2;
  return 1;
}

bool valid_slot_name(std::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

std::string quote_identifier(std::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

std::string quote_literal(std::string_view value) {
  std::string out = "'";
  for (char c : value) {
    if (c == '\'') out.push_back('\'');
    out.push_back(c);
  }
  out.push_back('\'');
  return out;
}

namespace {
command fail(std::string why) { return command{{}, std::move(why)}; }
}  // namespace

command build_create_slot(const create_slot_options& o, int server_major) {
  if (!valid_slot_name(o.slot))
    return fail("invalid slot name '" + o.slot + "': use 1-63 characters of a-z, 0-9 and _");
  std::string s = "CREATE_REPLICATION_SLOT " + o.slot;
  if (o.temporary) s += " TEMPORARY";
  s += " LOGICAL pgoutput";
  if (o.failover && server_major < 17) return fail("failover slots need PostgreSQL 17 or later");
  if (o.failover && o.temporary) return fail("a temporary slot cannot be a failover slot");
  if (server_major >= 15) {
    const char* snap = o.snapshot == snapshot_action::export_snapshot ? "'export'"
                       : o.snapshot == snapshot_action::use       ? "'use'"
                                                                  : "'nothing'";
    s += std::string(" (SNAPSHOT ") + snap;
    if (o.two_phase) s += ", TWO_PHASE";
    if (o.failover) s += ", FAILOVER";
    s += ")";
  } else {
    if (o.two_phase) return fail("two-phase slots need PostgreSQL 15 or later");
    s += o.snapshot == snapshot_action::export_snapshot ? " EXPORT_SNAPSHOT"
         : o.snapshot == snapshot_action::use          ? " USE_SNAPSHOT"
                                                       : " NOEXPORT_SNAPSHOT";
  }
  return command{s, {}};
}

command build_drop_slot(std::string_view slot, bool wait) {
  if (!valid_slot_name(slot))
    return fail("invalid slot name '" + std::string(slot) + "': use 1-63 characters of a-z, 0-9 and _");
  std::string s = "DROP_REPLICATION_SLOT " + std::string(slot);
  if (wait) s += " WAIT";
  return command{s, {}};
}

command build_start_replication(const start_replication_options& o, int server_major) {
  if (!valid_slot_name(o.slot))
    return fail("invalid slot name '" + o.slot + "': use 1-63 characters of a-z, 0-9 and _");
  if (o.publications.empty()) return fail("at least one publication name is required");
  std::uint32_t max_proto = max_pgoutput_protocol(server_major);
  if (o.proto_version < 1 || o.proto_version > max_proto)
    return fail("pgoutput proto_version " + std::to_string(o.proto_version) + " is not supported by PostgreSQL " +
                std::to_string(server_major) + " (highest: " + std::to_string(max_proto) + ")");
  if (o.messages && server_major < 14) return fail("logical decoding messages need PostgreSQL 14 or later");
  if (o.binary && server_major < 14) return fail("binary transfer needs PostgreSQL 14 or later");
  if (o.streaming == streaming_mode::on && (server_major < 14 || o.proto_version < 2))
    return fail("streaming of in-progress transactions needs PostgreSQL 14 and proto_version 2 or later");
  if (o.streaming == streaming_mode::parallel && (server_major < 16 || o.proto_version < 4))
    return fail("parallel streaming needs PostgreSQL 16 and proto_version 4");
  if (o.two_phase && (server_major < 15 || o.proto_version < 3))
    return fail("two-phase decoding needs PostgreSQL 15 and proto_version 3 or later");
  if (o.origin) {
    if (server_major < 16) return fail("the origin option needs PostgreSQL 16 or later");
    if (*o.origin != "none" && *o.origin != "any") return fail("origin must be 'none' or 'any'");
  }
  std::string pubs;
  for (const auto& p : o.publications) {
    if (p.empty() || p.find('\0') != std::string::npos) return fail("invalid publication name");
    if (!pubs.empty()) pubs += ',';
    pubs += quote_identifier(p);
  }
  std::string s = "START_REPLICATION SLOT " + o.slot + " LOGICAL " + o.start.to_string() +
                  " (proto_version '" + std::to_string(o.proto_version) +
                  "', publication_names " + quote_literal(pubs);
  if (o.messages) s += ", messages 'true'";
  if (o.binary) s += ", binary 'true'";
  if (o.streaming == streaming_mode::on) s += ", streaming 'on'";
  if (o.streaming == streaming_mode::parallel) s += ", streaming 'parallel'";
  if (o.two_phase) s += ", two_phase 'on'";
  if (o.origin) s += ", origin " + quote_literal(*o.origin);
  s += ")";
  return command{s, {}};
}

}  // namespace walgate::protocol

namespace walgate::protocol {

command build_timeline_history(std::uint32_t timeline) {
  command c;
  if (timeline < 1) {
    c.error = "timeline 0 has no history";
    return c;
  }
  c.text = "TIMELINE_HISTORY " + std::to_string(timeline);
  return c;
}

std::optional<std::vector<timeline_switch>> parse_timeline_history(std::string_view text) {
  constexpr std::size_t max_lines = 1u << 16;
  std::vector<timeline_switch> out;
  std::size_t lines = 0;
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!text.empty()) {
    if (++lines > max_lines) return std::nullopt;
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    std::size_t i = 0;
    while (i < line.size() && blank(line[i])) ++i;
    if (i == line.size() || line[i] == '#') continue;
    // <tli>
    const std::size_t tli_at = i;
    while (i < line.size() && line[i] >= '0' && line[i] <= '9') ++i;
    std::uint32_t tli = 0;
    auto r = std::from_chars(line.data() + tli_at, line.data() + i, tli, 10);
    if (i == tli_at || r.ec != std::errc{} || r.ptr != line.data() + i) return std::nullopt;
    if (i == line.size() || !blank(line[i])) return std::nullopt;
    while (i < line.size() && blank(line[i])) ++i;
    // <X/X>, then blanks and the reason (or nothing)
    const std::size_t lsn_at = i;
    while (i < line.size() && !blank(line[i])) ++i;
    auto at = lsn::parse(line.substr(lsn_at, i - lsn_at));
    if (!at) return std::nullopt;
    if (tli == 0 || (!out.empty() && (tli <= out.back().timeline || *at < out.back().switchpoint))) return std::nullopt;
    out.push_back({tli, *at});
  }
  return out;
}

std::optional<lsn> switchpoint_of(const std::vector<timeline_switch>& history, std::uint32_t timeline) {
  for (const auto& s : history)
    if (s.timeline == timeline) return s.switchpoint;
  return std::nullopt;
}

}  // namespace walgate::protocol
