// TIMELINE, CUT and CUTS in the data directory (history.hpp). Their bytes are untrusted (files on
// disk): each line is parsed whole or not at all.
#include "walgate/proxy/history.hpp"

#include "event_log_file.hpp"

#include <charconv>
#include <fstream>
#include <sstream>

namespace walgate::proxy {

namespace fs = std::filesystem;
using protocol::lsn;
using namespace log_file;

namespace {

std::string read_small(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string s;
  char buf[4096];
  while (in && s.size() < (1u << 20)) {   // (bounded: these files hold a line or a few)
    in.read(buf, sizeof buf);
    s.append(buf, static_cast<std::size_t>(in.gcount()));
  }
  return s;
}

/// Writes name through a temporary file: synced, renamed over, the directory synced.
bool replace_file(const fs::path& dir, const std::string& name, const std::string& data, bool fsync, std::string& error) {
  const fs::path tmp = dir / (name + ".tmp"), path = dir / name;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  bool ok = fd >= 0 && ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()) &&
            (!fsync || durable_sync(fd, false) == 0);
  int saved = errno;
  if (fd >= 0) ::close(fd);
  if (ok) {
    ok = ::rename(tmp.c_str(), path.c_str()) == 0 && (!fsync || sync_dir(dir));
    saved = errno;
  }
  if (!ok) error = "cannot write " + path.string() + ": " + std::strerror(saved);
  return ok;
}

bool parse_u32(std::string_view s, std::uint32_t& v) {
  auto r = std::from_chars(s.data(), s.data() + s.size(), v, 10);
  return !s.empty() && r.ec == std::errc{} && r.ptr == s.data() + s.size();
}

/// "<at> <last> <from> <to>" (last may be "-": a request).
std::optional<history_cut> parse_cut(std::string_view line) {
  std::vector<std::string_view> f;
  while (!line.empty() && f.size() < 5) {
    const auto sp = line.find(' ');
    f.push_back(line.substr(0, sp));
    line = sp == std::string_view::npos ? std::string_view() : line.substr(sp + 1);
  }
  if (f.size() != 4 || !line.empty()) return std::nullopt;
  history_cut c;
  auto at = lsn::parse(f[0]);
  if (!at || !parse_u32(f[2], c.from_timeline) || !parse_u32(f[3], c.to_timeline)) return std::nullopt;
  c.at = *at;
  if (f[1] != "-") {
    auto last = lsn::parse(f[1]);
    if (!last) return std::nullopt;
    c.last = *last;
  }
  return c;
}

std::string cut_line(const history_cut& c) {
  return c.at.to_string() + " " + (c.last.valid() ? c.last.to_string() : std::string("-")) + " " +
         std::to_string(c.from_timeline) + " " + std::to_string(c.to_timeline) + "\n";
}

}  // namespace

std::optional<followed_timeline> read_followed_timeline(const fs::path& dir) {
  std::string s = read_small(dir / "TIMELINE");
  followed_timeline t;
  constexpr std::string_view standby = " standby\n";
  if (s.size() > standby.size() && s.compare(s.size() - standby.size(), standby.size(), standby) == 0) {
    t.standby = true;
    s.replace(s.size() - standby.size(), standby.size(), "\n");
  }
  const auto sp = s.find(' ');
  if (sp == std::string::npos || s.empty() || s.back() != '\n') return std::nullopt;
  t.system_id = s.substr(0, sp);
  if (t.system_id.empty() || t.system_id.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  if (!parse_u32(std::string_view(s).substr(sp + 1, s.size() - sp - 2), t.timeline) || t.timeline == 0) return std::nullopt;
  return t;
}

bool write_followed_timeline(const fs::path& dir, const followed_timeline& t, bool fsync, std::string& error) {
  return replace_file(dir, "TIMELINE", t.system_id + " " + std::to_string(t.timeline) + (t.standby ? " standby" : "") + "\n",
                      fsync, error);
}

std::vector<history_cut> read_history_cuts(const fs::path& dir) {
  std::vector<history_cut> out;
  std::string all = read_small(dir / "CUTS");
  all.erase(all.find_last_of('\n') == std::string::npos ? 0 : all.find_last_of('\n') + 1);   // (a torn last line)
  std::istringstream in(all);
  std::string line;
  while (std::getline(in, line))
    if (auto c = parse_cut(line); c && c->last.valid()) {
      bool seen = false;   // (a cut made again after a crash appends its line again)
      for (const auto& o : out) seen = seen || (o.at == c->at && o.last == c->last);
      if (!seen) out.push_back(*c);
    }
  return out;
}

bool write_cut_request(const fs::path& dir, const history_cut& c, bool fsync, std::string& error) {
  return replace_file(dir, "CUT", cut_line(c), fsync, error);
}

std::optional<history_cut> read_cut_request(const fs::path& dir) {
  std::string s = read_small(dir / "CUT");
  if (s.empty() || s.back() != '\n') return std::nullopt;
  s.pop_back();
  return parse_cut(s);
}

history_verdict check_history(const std::optional<followed_timeline>& stored, const std::string& system_id,
                              std::uint32_t timeline, const std::vector<protocol::timeline_switch>& history,
                              lsn durable, const std::string& where, std::optional<lsn> slot_confirmed) {
  using k = history_verdict::kind;
  history_verdict v;
  if (!stored) {   // (a log that never streamed, or one from before TIMELINE was kept)
    v.what = k::follow;
    return v;
  }
  const std::string tl = "timeline " + std::to_string(timeline), ours = "timeline " + std::to_string(stored->timeline);
  if (stored->system_id != system_id) {
    v.what = k::refuse;
    v.message = where + " is another database cluster (system identifier " + system_id +
                ") than the one this event log was streamed from (" + stored->system_id +
                "): its positions name other changes. Point --pg at that cluster, or start over with an empty "
                "--data-dir (clients then need a new snapshot)";
    return v;
  }
  if (stored->timeline == timeline) return v;
  if (timeline < stored->timeline) {
    v.what = k::retry;
    v.message = where + " is on " + tl + ", behind " + ours +
                " this event log follows (a server that has not followed a promotion yet); trying again";
    return v;
  }
  auto at = protocol::switchpoint_of(history, stored->timeline);
  if (!at) {
    v.what = k::refuse;
    v.message = where + " is on " + tl + ", whose history does not include " + ours +
                " this event log follows: it never shared that history. Point --pg at a server that descends from "
                "it, or start over with an empty --data-dir (clients then need a new snapshot)";
    return v;
  }
  v.at = *at;
  if (durable <= *at) {
    v.what = k::follow;
    v.message = where + " is on " + tl + ", which left " + ours + " at " + at->to_string() +
                ": the event log holds nothing past it (up to " + durable.to_string() + "); following " + tl;
    return v;
  }
  if (stored->standby && slot_confirmed) {
    v.what = k::follow;
    v.promoted_under_us = true;
    v.message = where + " is on " + tl + ", which left " + ours + " at " + at->to_string() +
                "; the event log's history past it (up to " + durable.to_string() + ") is the server's own: it "
                "holds the slot walgate decoded on it as a standby (it followed a new timeline, or was promoted, "
                "while walgate streamed from it); following " + tl;
    return v;
  }
  v.what = k::cut;
  v.message = where + " is on " + tl + ", which left " + ours + " at " + at->to_string() +
              ", but the event log holds (or acknowledged) history of " + ours + " up to " + durable.to_string() +
              " that the new server never had (a failover without synchronized_standby_slots, or to an "
              "asynchronous standby)";
  return v;
}

namespace log_file {
/// Appends c to CUTS, synced (history.cpp; event_log::cut_history).
bool append_cut(const fs::path& dir, const history_cut& c, bool fsync, std::string& error) {
  const std::string line = cut_line(c);
  const fs::path path = dir / "CUTS";
  std::error_code ec;
  const bool existed = fs::exists(path, ec);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  bool ok = fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
            (!fsync || durable_sync(fd, false) == 0);
  int saved = errno;
  if (fd >= 0) ::close(fd);
  if (ok && fsync && !existed) {
    ok = sync_dir(dir);
    saved = errno;
  }
  if (!ok) error = "cannot append to " + path.string() + ": " + std::strerror(saved);
  return ok;
}
}  // namespace log_file

}  // namespace walgate::proxy
