#include "downstream_slots.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace walgate::proxy {

namespace {
constexpr const char* header = "walgate replication slots 1";

bool plugin_name_ok(const std::string& p) {
  if (p.empty() || p.size() > 63) return false;
  for (char c : p)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  return true;
}

bool fsync_path(const std::filesystem::path& p, int flags) {
  int fd = ::open(p.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}
}  // namespace

std::string slot_name_error(const std::string& name) {
  if (name.empty()) return "replication slot name \"" + name + "\" is too short";
  if (name.size() >= 64) return "replication slot name \"" + name + "\" is too long";
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
      return "replication slot name \"" + name + "\" contains invalid character";
  return {};
}

downstream_slots::downstream_slots(std::filesystem::path file, bool fsync) : file_(std::move(file)), fsync_(fsync) {
  writer_ = std::thread([this] { run(); });
}

downstream_slots::~downstream_slots() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

std::string downstream_slots::serialize(const std::map<std::string, downstream_slot>& slots) {
  std::string out(header);   // (not header + "\n": GCC 12 warns falsely of an out-of-bounds copy there)
  out += "\n";
  for (const auto& [name, s] : slots) {
    if (s.temporary || s.dropping) continue;
    std::string flags;
    if (s.two_phase) flags = "two_phase";
    if (s.failover) flags += flags.empty() ? "failover" : ",failover";
    if (s.invalidated) flags += flags.empty() ? "invalidated" : ",invalidated";
    out += name + " " + s.plugin + " " + s.confirmed_flush.to_string() + " " + (flags.empty() ? "-" : flags) + "\n";
  }
  return out;
}

bool downstream_slots::parse(const std::string& text, std::map<std::string, downstream_slot>& out, std::string& error) {
  std::istringstream in(text);
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (n == 1) {
      if (line != header) {
        error = "line 1 is not \"" + std::string(header) + "\"";
        return false;
      }
      continue;
    }
    std::vector<std::string> f;
    std::size_t at = 0;
    while (at <= line.size()) {
      auto sp = line.find(' ', at);
      f.push_back(line.substr(at, sp == std::string::npos ? std::string::npos : sp - at));
      if (sp == std::string::npos) break;
      at = sp + 1;
    }
    downstream_slot s;
    auto lsn = f.size() == 4 ? protocol::lsn::parse(f[2]) : std::nullopt;
    // Flags: "-", or some of two_phase, failover, invalidated in that order, comma-separated.
    bool flags_ok = f.size() == 4 && f[3] == "-";
    if (f.size() == 4 && f[3] != "-") {
      flags_ok = true;
      std::size_t next = 0;   // (the next flag allowed: each once, in order)
      static const char* const names[] = {"two_phase", "failover", "invalidated"};
      std::size_t from = 0;
      while (flags_ok) {
        const auto comma = f[3].find(',', from);
        const std::string flag = f[3].substr(from, comma == std::string::npos ? std::string::npos : comma - from);
        std::size_t i = next;
        while (i < 3 && flag != names[i]) ++i;
        if (i == 3) flags_ok = false;
        next = i + 1;
        if (comma == std::string::npos) break;
        from = comma + 1;
      }
    }
    if (f.size() != 4 || !slot_name_error(f[0]).empty() || !plugin_name_ok(f[1]) || !lsn || !flags_ok) {
      error = "line " + std::to_string(n) + " is not \"<slot> <plugin> <X/Y> <flags>\"";
      return false;
    }
    s.name = f[0];
    s.plugin = f[1];
    s.confirmed_flush = *lsn;
    s.two_phase = f[3].find("two_phase") != std::string::npos;
    s.failover = f[3].find("failover") != std::string::npos;
    s.invalidated = f[3].find("invalidated") != std::string::npos;
    s.hold_released = s.invalidated;
    if (!out.emplace(s.name, s).second) {
      error = "line " + std::to_string(n) + " names slot " + s.name + " again";
      return false;
    }
  }
  if (n == 0) {
    error = "the file is empty";
    return false;
  }
  if (!text.empty() && text.back() != '\n') {
    error = "the last line is cut short";
    return false;
  }
  return true;
}

bool downstream_slots::load(std::string& error) {
  std::error_code ec;
  if (!std::filesystem::exists(file_, ec)) return true;
  std::ifstream in(file_, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in && !in.eof()) {
    error = "cannot read " + file_.string();
    return false;
  }
  std::string why;
  if (!parse(ss.str(), slots_, why)) {
    error = file_.string() + ": " + why;
    return false;
  }
  return true;
}

downstream_slot* downstream_slots::find(const std::string& name) {
  auto it = slots_.find(name);
  return it == slots_.end() ? nullptr : &it->second;
}

void downstream_slots::save(std::function<void(const std::string&)> done) {
  std::string text = serialize(slots_);
  {
    std::lock_guard lock(mutex_);
    pending_ = true;
    pending_text_ = std::move(text);
    if (done) pending_done_.push_back(std::move(done));
  }
  cv_.notify_all();
}

std::string downstream_slots::write_file(const std::string& text) {
  const auto tmp = file_.string() + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot write " + tmp + ": " + std::strerror(errno);
  std::size_t off = 0;
  while (off < text.size()) {
    auto n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string e = "cannot write " + tmp + ": " + std::strerror(errno);
      ::close(fd);
      return e;
    }
    off += static_cast<std::size_t>(n);
  }
  if (fsync_ && ::fsync(fd) != 0) {
    std::string e = "cannot fsync " + tmp + ": " + std::strerror(errno);
    ::close(fd);
    return e;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), file_.c_str()) != 0) return "cannot rename " + tmp + ": " + std::strerror(errno);
  if (fsync_ && !fsync_path(file_.parent_path().empty() ? "." : file_.parent_path(), O_RDONLY | O_DIRECTORY))
    return "cannot fsync " + file_.parent_path().string() + ": " + std::strerror(errno);
  return {};
}

void downstream_slots::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || pending_; });
    if (!pending_ && stop_) return;
    std::string text = std::move(pending_text_);
    auto done = std::move(pending_done_);
    pending_done_.clear();
    pending_ = false;
    lock.unlock();
    const std::string error = write_file(text);
    for (auto& d : done) d(error);
    lock.lock();
  }
}

}  // namespace walgate::proxy
