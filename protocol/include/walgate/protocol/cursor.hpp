// The one bounds-checked cursor through which every untrusted byte is read, and the writer that
// builds every outgoing message. All integers on the PostgreSQL wire are big-endian.
//
// The cursor is "sticky": the first read that would run past the end (or find no terminator)
// records the offset and the field name, and every later read returns zero/empty without touching
// memory. Callers read a whole message and then check ok() once — a read past the end can never
// produce a value that is used to size anything, because every size-bearing value is checked with
// ok() and against a named limit before use.
#pragma once

#include "walgate/protocol/error.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::protocol {

using bytes_view = std::span<const std::byte>;

inline std::string_view as_string_view(bytes_view b) noexcept {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}
inline bytes_view as_bytes(std::string_view s) noexcept {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

class cursor {
 public:
  cursor() = default;
  explicit cursor(bytes_view data) noexcept : data_(data) {}
  explicit cursor(std::string_view data) noexcept : data_(as_bytes(data)) {}

  std::size_t offset() const noexcept { return pos_; }
  std::size_t remaining() const noexcept { return failed_ ? 0 : data_.size() - pos_; }
  bool empty() const noexcept { return remaining() == 0; }
  bool ok() const noexcept { return !failed_; }

  /// The first failure, with the name of the field that failed and its offset.
  decode_error error() const noexcept { return {code_, what_, error_offset_}; }

  /// Marks the cursor failed with a semantic error found by the caller (e.g. a bad flag value).
  void fail(errc code, const char* what) noexcept {
    if (failed_) return;
    failed_ = true;
    code_ = code;
    what_ = what;
    error_offset_ = pos_;
  }

  std::uint8_t u8(const char* what = "Int8") noexcept {
    if (!check(1, what)) return 0;
    return std::to_integer<std::uint8_t>(data_[pos_++]);
  }
  std::uint16_t u16(const char* what = "Int16") noexcept { return read_be<std::uint16_t>(what); }
  std::int16_t i16(const char* what = "Int16") noexcept {
    return std::bit_cast<std::int16_t>(read_be<std::uint16_t>(what));
  }
  std::uint32_t u32(const char* what = "Int32") noexcept { return read_be<std::uint32_t>(what); }
  std::int32_t i32(const char* what = "Int32") noexcept {
    return std::bit_cast<std::int32_t>(read_be<std::uint32_t>(what));
  }
  std::uint64_t u64(const char* what = "Int64") noexcept { return read_be<std::uint64_t>(what); }
  std::int64_t i64(const char* what = "Int64") noexcept {
    return std::bit_cast<std::int64_t>(read_be<std::uint64_t>(what));
  }

  /// n bytes as a view into the input (valid as long as the input is).
  bytes_view bytes(std::size_t n, const char* what = "Byte(n)") noexcept {
    if (!check(n, what)) return {};
    bytes_view out = data_.subspan(pos_, n);
    pos_ += n;
    return out;
  }

  /// Everything left, as a view.
  bytes_view rest() noexcept {
    if (failed_) return {};
    bytes_view out = data_.subspan(pos_);
    pos_ = data_.size();
    return out;
  }

  /// A NUL-terminated String: a view of the characters (terminator excluded), found in bounds.
  std::string_view cstring(const char* what = "String") noexcept {
    if (failed_) return {};
    const std::byte* begin = data_.data() + pos_;
    const void* nul = std::memchr(begin, 0, data_.size() - pos_);
    if (nul == nullptr) {
      fail(errc::unterminated_string, what);
      return {};
    }
    std::size_t len = static_cast<std::size_t>(static_cast<const std::byte*>(nul) - begin);
    pos_ += len + 1;
    return {reinterpret_cast<const char*>(begin), len};
  }

  /// Fails with trailing_bytes unless the input was consumed exactly.
  void expect_end(const char* what) noexcept {
    if (!failed_ && pos_ != data_.size()) fail(errc::trailing_bytes, what);
  }

 private:
  bool check(std::size_t n, const char* what) noexcept {
    if (failed_) return false;
    if (n > data_.size() - pos_) {
      fail(errc::truncated, what);
      return false;
    }
    return true;
  }

  template <class U>
  U read_be(const char* what) noexcept {
    if (!check(sizeof(U), what)) return 0;
    U v = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i)
      v = static_cast<U>((v << 8) | std::to_integer<U>(data_[pos_ + i]));
    pos_ += sizeof(U);
    return v;
  }

  bytes_view data_{};
  std::size_t pos_ = 0;
  bool failed_ = false;
  errc code_ = errc::ok;
  const char* what_ = "";
  std::size_t error_offset_ = 0;
};

/// Appends big-endian fields to a byte string. Used for every message we send, and by the tests
/// to build exact server messages.
class writer {
 public:
  writer() = default;
  explicit writer(std::string& out) : out_(&out) {}

  writer& u8(std::uint8_t v) {
    buf().push_back(static_cast<char>(v));
    return *this;
  }
  writer& u16(std::uint16_t v) { return be(v); }
  writer& i16(std::int16_t v) { return be(std::bit_cast<std::uint16_t>(v)); }
  writer& u32(std::uint32_t v) { return be(v); }
  writer& i32(std::int32_t v) { return be(std::bit_cast<std::uint32_t>(v)); }
  writer& u64(std::uint64_t v) { return be(v); }
  writer& i64(std::int64_t v) { return be(std::bit_cast<std::uint64_t>(v)); }
  writer& raw(std::string_view s) {
    buf().append(s);
    return *this;
  }
  writer& raw(bytes_view b) { return raw(as_string_view(b)); }
  /// A NUL-terminated String. The caller guarantees s holds no NUL (checked by the builders).
  writer& cstring(std::string_view s) {
    buf().append(s);
    buf().push_back('\0');
    return *this;
  }

  /// Starts a message with a tag byte (0 = untagged, as in the startup packet) and a length
  /// placeholder; finish_message() patches the length (which counts itself, not the tag).
  writer& begin_message(char tag) {
    if (tag != 0) buf().push_back(tag);
    length_at_ = buf().size();
    return u32(0);
  }
  writer& finish_message() {
    auto len = static_cast<std::uint32_t>(buf().size() - length_at_);
    for (int i = 0; i < 4; ++i)
      buf()[length_at_ + static_cast<std::size_t>(i)] = static_cast<char>((len >> (24 - 8 * i)) & 0xff);
    return *this;
  }

  std::string& str() { return buf(); }
  std::string take() { return std::move(buf()); }

 private:
  std::string& buf() { return out_ ? *out_ : own_; }
  template <class U>
  writer& be(U v) {
    char b[sizeof(U)];
    for (std::size_t i = 0; i < sizeof(U); ++i) b[i] = static_cast<char>((v >> (8 * (sizeof(U) - 1 - i))) & 0xff);
    buf().append(b, sizeof b);
    return *this;
  }

  std::string own_;
  std::string* out_ = nullptr;
  std::size_t length_at_ = 0;
};

}  // namespace walgate::protocol
