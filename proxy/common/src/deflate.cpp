#include "walgate/proxy/deflate.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <memory>

namespace walgate::proxy {

std::atomic<std::uint64_t> deflated_total{0};

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

/// One deflate context per window size and thread, reset for each message.
struct deflater {
  z_stream z{};
  bool ok = false;
  explicit deflater(int bits) {
    // Level 6 (zlib's default) with a full memory level: made once per process, not per client.
    ok = deflateInit2(&z, 6, Z_DEFLATED, -bits, 8, Z_DEFAULT_STRATEGY) == Z_OK;
  }
  ~deflater() {
    if (ok) deflateEnd(&z);
  }
};

}  // namespace

std::optional<pmd_agreement> negotiate_pmd(std::string_view header) {
  // extension *( "," extension ), each name *( ";" param [ "=" value ] )
  while (!header.empty()) {
    auto comma = header.find(',');
    std::string_view ext = header.substr(0, comma);
    header = comma == std::string_view::npos ? std::string_view() : header.substr(comma + 1);
    auto semi = ext.find(';');
    if (!iequals(trim(ext.substr(0, semi)), "permessage-deflate")) continue;
    std::string_view params = semi == std::string_view::npos ? std::string_view() : ext.substr(semi + 1);
    bool valid = true, server_nct = false, client_nct = false, client_bits = false;
    int server_bits = 0;
    auto window = [](std::string_view v) {
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      int bits = 0;
      for (char ch : v) bits = ch >= '0' && ch <= '9' && bits < 100 ? bits * 10 + (ch - '0') : 100;
      return v.empty() || v.front() == '0' || bits < 8 || bits > 15 ? 0 : bits;   // (1*DIGIT without a leading 0)
    };
    while (valid && !params.empty()) {
      auto next = params.find(';');
      std::string_view p = params.substr(0, next);
      params = next == std::string_view::npos ? std::string_view() : params.substr(next + 1);
      auto eq = p.find('=');
      std::string_view key = trim(p.substr(0, eq));
      const bool has_value = eq != std::string_view::npos;
      std::string_view value = has_value ? trim(p.substr(eq + 1)) : std::string_view();
      if (iequals(key, "server_no_context_takeover") && !has_value && !server_nct) {
        server_nct = true;
      } else if (iequals(key, "client_no_context_takeover") && !has_value && !client_nct) {
        client_nct = true;
      } else if (iequals(key, "server_max_window_bits") && has_value && !server_bits) {
        server_bits = window(value);
        valid = server_bits != 0;
      } else if (iequals(key, "client_max_window_bits") && !client_bits) {
        client_bits = true;
        valid = !has_value || window(value) != 0;
      } else {
        valid = false;   // unknown, repeated, or a value where none belongs
      }
    }
    if (!valid || server_bits == 8) continue;   // declined: the next offer, if any
    pmd_agreement a;
    a.answer = "permessage-deflate; server_no_context_takeover";
    if (server_bits) {
      a.server_bits = server_bits;
      a.answer += "; server_max_window_bits=" + std::to_string(server_bits);
    }
    if (client_nct) a.answer += "; client_no_context_takeover";
    a.client_no_context_takeover = client_nct;
    return a;
  }
  return std::nullopt;
}

struct inflater::impl {
  z_stream z{};
  bool ok = false;
  impl() { ok = inflateInit2(&z, -15) == Z_OK; }
  ~impl() {
    if (ok) inflateEnd(&z);
  }
};

inflater::inflater() : z_(std::make_unique<impl>()) {}
inflater::~inflater() = default;

void inflater::reset() {
  if (z_->ok) inflateReset(&z_->z);
}

bool inflater::feed(std::string_view in, bool last, const std::function<bool(std::string_view)>& out) {
  if (!z_->ok) return false;
  auto run = [&](std::string_view bytes) {
    auto& z = z_->z;
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
    z.avail_in = static_cast<uInt>(bytes.size());
    thread_local std::array<char, 4096> chunk;
    for (;;) {
      z.next_out = reinterpret_cast<Bytef*>(chunk.data());
      z.avail_out = static_cast<uInt>(chunk.size());
      const int rc = inflate(&z, Z_SYNC_FLUSH);
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) return false;
      const std::size_t n = chunk.size() - z.avail_out;
      if (n && !out(std::string_view(chunk.data(), n))) return false;
      if (rc == Z_STREAM_END) {   // a final block: what follows starts afresh (the 00 00 ff ff: an empty stored block)
        if (inflateReset(&z) != Z_OK) return false;
        if (z.avail_in == 0) return true;
        continue;
      }
      if (z.avail_out != 0) return z.avail_in == 0;   // all read and all given out (else: stuck)
    }
  };
  if (!in.empty() && !run(in)) return false;
  return !last || run(std::string_view("\x00\x00\xff\xff", 4));
}

bool deflate_message(std::string_view message, int window_bits, std::string& out) {
  if (window_bits < 9 || window_bits > 15 || message.empty()) return false;
  thread_local std::array<std::unique_ptr<deflater>, 16> contexts;
  auto& d = contexts[static_cast<std::size_t>(window_bits)];
  if (!d) d = std::make_unique<deflater>(window_bits);
  if (!d->ok || deflateReset(&d->z) != Z_OK) return false;
  // Made in a buffer kept for the next message, and copied out at its exact size.
  thread_local std::string buf;
  buf.resize(message.size() + 16);   // (a result as large as the message is refused anyway)
  d->z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(message.data()));
  d->z.avail_in = static_cast<uInt>(message.size());
  d->z.next_out = reinterpret_cast<Bytef*>(buf.data());
  d->z.avail_out = static_cast<uInt>(buf.size());
  int rc = deflate(&d->z, Z_SYNC_FLUSH);
  if (rc != Z_OK || d->z.avail_in != 0 || d->z.avail_out == 0) return false;   // (no room: not smaller)
  std::size_t n = buf.size() - d->z.avail_out;
  if (n < 4 || buf.compare(n - 4, 4, std::string_view("\x00\x00\xff\xff", 4)) != 0) return false;
  n -= 4;
  if (n >= message.size()) return false;
  out.assign(buf.data(), n);
  if (buf.capacity() > (1u << 20)) buf = std::string();
  ++deflated_total;
  return true;
}

namespace {
void append_stored_length(std::string& out, std::size_t n) {
  // LEN and NLEN (its one's complement), little-endian (RFC 1951 3.2.4).
  const auto len = static_cast<std::uint16_t>(n), nlen = static_cast<std::uint16_t>(~len);
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>(len >> 8);
  out += static_cast<char>(nlen & 0xff);
  out += static_cast<char>(nlen >> 8);
}
}  // namespace

std::string deflate_stored_head(std::string_view bytes) {
  std::string out(1, '\0');   // BFINAL 0, BTYPE 00, and the bits to the byte's end
  append_stored_length(out, std::min<std::size_t>(bytes.size(), 0xffff));
  out.append(bytes.substr(0, 0xffff));
  return out;
}

std::string deflate_stored_tail(std::string_view bytes) {
  std::string out;
  append_stored_length(out, std::min<std::size_t>(bytes.size(), 0xffff));
  out.append(bytes.substr(0, 0xffff));
  out += '\0';   // the next stored block's header: the receiver's 00 00 ff ff are its LEN and NLEN
  return out;
}

bool inflate_message(std::string_view compressed, int window_bits, std::size_t max, std::string& out) {
  z_stream z{};
  if (inflateInit2(&z, -window_bits) != Z_OK) return false;
  std::string in(compressed);
  in.append("\x00\x00\xff\xff", 4);
  z.next_in = reinterpret_cast<Bytef*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  out.clear();
  bool ok = true, ended = false;
  char chunk[16384];
  while (ok && z.avail_in > 0) {
    z.next_out = reinterpret_cast<Bytef*>(chunk);
    z.avail_out = sizeof chunk;
    int rc = inflate(&z, Z_SYNC_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) ok = false;
    out.append(chunk, sizeof chunk - z.avail_out);
    if (out.size() > max) ok = false;
    if (rc == Z_BUF_ERROR && z.avail_out != 0) break;   // no progress possible
    if (rc == Z_STREAM_END) {   // a final block: the 00 00 ff ff after it is not read
      ended = true;
      break;
    }
  }
  ok = ok && (z.avail_in == 0 || (ended && z.avail_in <= 4));
  inflateEnd(&z);
  return ok;
}

}  // namespace walgate::proxy
