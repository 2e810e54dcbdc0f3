// One encoding of an event, made once and shared by every client of that encoding. Small ones
// are bytes in memory. Large ones (a row with a value of hundreds of megabytes) are written once
// to an unlinked file in the spill directory and sent from there in bounded pieces: such a value
// is then held in memory once, as its record, not once per format and again per client.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace walgate::proxy {

class payload {
 public:
  /// Bytes kept in memory.
  static std::shared_ptr<const payload> in_memory(std::string bytes);
  /// Bytes written to a new unlinked file (mode 0600) in dir; null with error when it cannot be
  /// made or written (the caller keeps the bytes in memory instead).
  static std::shared_ptr<const payload> spill(const std::filesystem::path& dir, std::string_view bytes, std::string& error);

  /// Bytes made for one client (its transaction records): in memory, never compressed for
  /// permessage-deflate (deflated() is null: sent as uncompressed messages).
  static std::shared_ptr<const payload> for_one(std::string bytes);
  /// The first keep bytes of base followed by tail (a client's own form of a shared encoding:
  /// Debezium's transaction block), never compressed (as for_one). From memory: a copy. From a
  /// spill file: read from base's file, nothing copied (spilled() is true of it too).
  static std::shared_ptr<const payload> with_tail(std::shared_ptr<const payload> base, std::size_t keep, std::string tail);
  /// head, base's bytes, tail: in memory a copy that is shared like any encoding (compressible:
  /// keys=true's {"key":…,"value":…}); from a spill file read from it.
  /// head, the parts' bytes with sep between them, tail (group=transaction's message), never
  /// compressed (as for_one): in memory when every part is and the whole is under 1 MiB, else
  /// read piece by piece from the parts where they are (spilled() is true of it).
  static std::shared_ptr<const payload> joined(std::string head, std::vector<std::shared_ptr<const payload>> parts,
                                               std::string_view sep, std::string tail);
  /// With one_client, never compressed (as for_one).
  static std::shared_ptr<const payload> framed(std::string head, std::shared_ptr<const payload> base, std::string tail,
                                               bool one_client = false);

  payload(const payload&) = delete;
  payload& operator=(const payload&) = delete;
  ~payload();

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool spilled() const { return fd_ >= 0 || c_; }
  /// The bytes of an in-memory payload (empty for a spilled one).
  std::string_view bytes() const { return bytes_; }
  /// Reads out.size() bytes at offset of a spilled payload into out; false with error (the
  /// file is read back whole or not at all: a short read is an error too).
  bool read(std::size_t offset, std::span<char> out, std::string& error) const;
  /// What it costs in memory (with its compressed forms).
  std::size_t memory() const;

  /// Its permessage-deflate form for a window of window_bits (deflate.hpp), made on first
  /// demand and kept (single-threaded: whoever shares the payload shares this): null when it
  /// goes uncompressed (spilled, outside deflate_min_bytes..deflate_max_bytes, or not smaller).
  /// made says what the call added in memory (0 when it was there already).
  const std::string* deflated(int window_bits, std::size_t* made = nullptr) const;

 private:
  payload() = default;
  struct deflated_form {
    int window_bits = 0;
    bool compressed = false;
    std::string bytes;
    std::unique_ptr<deflated_form> next;   // another window's (rare: browsers all ask for 15)
  };
  mutable std::unique_ptr<deflated_form> deflated_;   // (null until asked; a form never moves)
  std::string bytes_;   // (composed: the tail)
  /// Bytes composed of other payloads (with_tail, framed, joined): head, then each part's first
  /// len bytes with sep between them, then bytes_. Apart, so that the common payload stays small.
  struct composed {
    std::string head;
    std::vector<std::pair<std::shared_ptr<const payload>, std::size_t>> parts;   // (payload, bytes of it)
    std::vector<std::size_t> starts;   // where each part begins, then where bytes_ does
    std::string sep;
  };
  /// The one way the three are made: in memory (a copy) when every part is and the whole is
  /// under copy_below bytes, else composed (read from the parts where they are).
  static std::shared_ptr<const payload> compose(std::string head,
                                                std::vector<std::pair<std::shared_ptr<const payload>, std::size_t>> parts,
                                                std::string_view sep, std::string tail, bool one_client,
                                                std::size_t copy_below);
  std::unique_ptr<composed> c_;
  int fd_ = -1;
  bool one_client_ = false;   // (for_one, with_tail: never compressed)
  std::size_t size_ = 0;
};

using payload_ptr = std::shared_ptr<const payload>;

}  // namespace walgate::proxy
