// The event log's file layout, shared by its parts (event_log.cpp: appending and syncing;
// event_log_recovery.cpp: opening and recovery; event_log_read.cpp: reading and finding ids):
// frames, segment names, the position files, durable syncs. Internal to proxy/log (its private header).
#pragma once

#include "walgate/proxy/event_log.hpp"

#include "walgate/protocol/crc32c.hpp"
#include "walgate/protocol/cursor.hpp"
#include "walgate/transform/record.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

namespace walgate::proxy::log_file {

namespace fs = std::filesystem;
using protocol::lsn;


inline void frame(std::string& out, char type, std::string_view payload) {
  std::size_t start = out.size();
  protocol::writer w(out);
  w.u8(static_cast<std::uint8_t>(type)).u32(static_cast<std::uint32_t>(payload.size())).raw(payload);
  w.u32(protocol::crc32c(std::string_view(out).substr(start)));
}

inline constexpr std::size_t frame_overhead = 1 + 4 + 4;
inline constexpr std::string_view format_line = "walgate event log 2\n";
inline constexpr std::size_t index_every = 256;
inline constexpr std::size_t index_bytes = 64u << 10;
inline constexpr std::size_t large_record = 1u << 20;   // written to the file directly, never copied
/// Frames gathered in memory before they go to the file in one write (a large transaction's go
/// as they come, unsynced, past this much).
inline constexpr std::size_t pending_write_bytes = 1u << 20;
/// Room for a record's framing beside its values when reserved at once (large records).
inline constexpr std::size_t record_slack = 4096;
/// Recent commits remembered (first seq, end offset): where transaction_end_offset looks.
inline constexpr std::size_t recent_commits_kept = 4096;
/// Recent transactions remembered by xid (first seq): where first_recent_transaction looks (a
/// per-client snapshot's transactions logged before it but not seen by it; log_reader.hpp).
inline constexpr std::size_t recent_xids_kept = 65536;

inline std::string segment_name(std::uint64_t first_seq) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "segment-%020llu.log", static_cast<unsigned long long>(first_seq));
  return buf;
}

inline std::function<void(int)>& sync_observer() {
  static std::function<void(int)> f;
  return f;
}

/// fsync (or fdatasync) that tells the test hook what was made durable.
inline int durable_sync(int fd, bool data_only) {
  int r = data_only ? ::fdatasync(fd) : ::fsync(fd);
  if (r == 0 && sync_observer()) sync_observer()(fd);
  return r;
}

inline bool sync_dir(const fs::path& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  bool ok = dfd >= 0 && durable_sync(dfd, false) == 0;
  int saved = errno;
  if (dfd >= 0) ::close(dfd);
  errno = saved;
  return ok;
}

/// The first seq a segment file's name gives, or nullopt when the name is not exactly one this
/// log writes (segment-<20 digits>.log): a stray file is left alone, never parsed.
inline std::optional<std::uint64_t> segment_first_seq(const std::string& name) {
  if (name.size() != 8 + 20 + 4 || name.compare(0, 8, "segment-") != 0 || name.compare(28, 4, ".log") != 0)
    return std::nullopt;
  std::uint64_t v = 0;
  for (std::size_t i = 8; i < 28; ++i) {
    char c = name[i];
    if (c < '0' || c > '9') return std::nullopt;
    std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

/// A 12-byte position file (ACKED, ORIGIN): Int64 LSN | Int32 CRC-32C of it. A file that does
/// not check out is no position.
inline lsn read_position_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string a((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  protocol::cursor c(a);
  std::uint64_t v = c.u64();
  std::uint32_t sum = c.u32();
  if (c.ok() && c.empty() && sum == protocol::crc32c(std::string_view(a).substr(0, 8))) return lsn{v};
  return lsn{};
}

inline bool write_position_file(const fs::path& dir, const char* name, lsn l, bool fsync, std::string& error) {
  std::string data;
  protocol::writer(data).u64(l.value);
  protocol::writer(data).u32(protocol::crc32c(data));
  const auto path = dir / name;
  std::error_code ec;
  const bool existed = fs::exists(path, ec);
  // 12 bytes rewritten in place: within one sector, so a crash leaves the old or the new value.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0640);
  bool ok = fd >= 0 && ::pwrite(fd, data.data(), data.size(), 0) == static_cast<ssize_t>(data.size()) &&
            (!fsync || durable_sync(fd, true) == 0);
  int saved = errno;
  if (fd >= 0) ::close(fd);
  if (ok && fsync && !existed) {
    ok = sync_dir(dir);
    saved = errno;
  }
  if (!ok) error = "cannot store the position in " + path.string() + ": " + std::strerror(saved);
  return ok;
}

inline std::shared_ptr<logged_event> make_event(std::uint64_t seq, std::string record) {
  auto e = std::make_shared<logged_event>();
  e->seq = seq;
  e->record = std::move(record);
  if (auto v = transform::read_record(protocol::as_bytes(e->record))) {
    const auto& c = (*v)->get();
    e->id = transform::event_id{c.txn->commit_lsn, c.index};
    e->kind = c.kind;
    e->xid = c.txn->xid;
    if (c.relation) {
      e->schema = c.relation->nspname;
      e->table = c.relation->relname;
    }
  }
  return e;
}

}  // namespace walgate::proxy::log_file
