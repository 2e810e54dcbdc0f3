#include "walgate/protocol/websocket.hpp"

#include "walgate/protocol/base64.hpp"
#include "walgate/protocol/cursor.hpp"

#include <openssl/sha.h>

#include <algorithm>
#include <cstring>

namespace walgate::protocol::websocket {

piece frame_reader::fail(std::uint16_t code, const char* reason) noexcept {
  failed_ = true;
  fail_code_ = code;
  fail_reason_ = reason;
  piece p;
  p.what = piece::kind::failed;
  p.code = code;
  p.reason = reason;
  return p;
}

piece frame_reader::next(std::span<char>& in) noexcept {
  if (failed_) return fail(fail_code_, fail_reason_);
  for (;;) {
    if (!in_payload_) {
      // The header: 2 bytes, then the extended length (0, 2 or 8) and the mask (4) they announce.
      std::size_t need = 2;
      if (have_ >= 2) {
        const unsigned len7 = head_[1] & 0x7F;
        need += (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + ((head_[1] & 0x80) ? 4 : 0);
      }
      while (have_ < need && !in.empty()) {
        head_[have_++] = static_cast<unsigned char>(in[0]);
        in = in.subspan(1);
        if (have_ == 2) {
          const unsigned len7 = head_[1] & 0x7F;
          need += (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + ((head_[1] & 0x80) ? 4 : 0);
        }
      }
      if (have_ < need) return {};
      cursor c(std::string_view(reinterpret_cast<const char*>(head_), have_));
      const std::uint8_t b0 = c.u8("frame flags"), b1 = c.u8("frame length");
      const bool fin = b0 & 0x80, rsv1 = b0 & 0x40;
      const std::uint8_t op = b0 & 0x0F;
      if (b0 & 0x30) return fail(close_protocol_error, "reserved bits set");
      if (!(b1 & 0x80)) return fail(close_protocol_error, "an unmasked frame (a client must mask its frames)");
      std::uint64_t len = b1 & 0x7F;
      if (len == 126) {
        len = c.u16("frame length");
        if (len < 126) return fail(close_protocol_error, "a frame length not minimally encoded");
      } else if (len == 127) {
        len = c.u64("frame length");
        if (len <= 0xFFFF) return fail(close_protocol_error, "a frame length not minimally encoded");
        if (len >> 63) return fail(close_protocol_error, "a frame length past 2^63");
      }
      for (auto& m : mask_) m = c.u8("masking key");
      if (!c.ok() || !c.empty()) return fail(close_protocol_error, "a malformed frame header");   // (cannot happen)
      const bool control = op & 0x08;
      if (control) {
        if (op != op_close && op != op_ping && op != op_pong) return fail(close_protocol_error, "an unknown opcode");
        if (!fin) return fail(close_protocol_error, "a fragmented control frame");
        if (len > 125) return fail(close_protocol_error, "a control frame over 125 bytes");
        if (rsv1) return fail(close_protocol_error, "RSV1 on a control frame");
      } else if (op == op_continuation) {
        if (!in_message_) return fail(close_protocol_error, "a continuation frame outside a message");
        if (rsv1) return fail(close_protocol_error, "RSV1 on a continuation frame");
      } else if (op == op_text || op == op_binary) {
        if (in_message_) return fail(close_protocol_error, "a new message inside a fragmented one");
        if (rsv1 && !compression_) return fail(close_protocol_error, "RSV1 without permessage-deflate");
        in_message_ = true;
        message_begins_ = true;
        message_op_ = op;
        message_compressed_ = rsv1;
      } else {
        return fail(close_protocol_error, "an unknown opcode");
      }
      have_ = 0;
      op_ = op;
      fin_ = fin;
      left_ = len;
      mask_at_ = 0;
      control_len_ = 0;
      in_payload_ = true;
    }
    // The payload: control frames gathered whole, data handed on as it comes.
    const bool control = op_ & 0x08;
    if (left_ == 0) {
      in_payload_ = false;
      piece p;
      if (control) {
        p.what = piece::kind::control;
        p.opcode = op_;
        p.bytes = std::string_view(control_, control_len_);
        return p;
      }
      if (!message_begins_ && !fin_) continue;   // an empty fragment in the middle: nothing to say
      p.what = piece::kind::data;
      p.opcode = message_op_;
      p.begins = message_begins_;
      p.ends = fin_;
      p.compressed = message_compressed_;
      message_begins_ = false;
      if (fin_) in_message_ = false;
      return p;
    }
    if (in.empty()) return {};
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left_, in.size()));
    for (std::size_t i = 0; i < n; ++i) {
      in[i] = static_cast<char>(static_cast<unsigned char>(in[i]) ^ mask_[mask_at_]);
      mask_at_ = (mask_at_ + 1) & 3;
    }
    left_ -= n;
    if (control) {
      std::memcpy(control_ + control_len_, in.data(), n);
      control_len_ = static_cast<std::uint8_t>(control_len_ + n);
      in = in.subspan(n);
      continue;   // whole at left_ == 0
    }
    piece p;
    p.what = piece::kind::data;
    p.opcode = message_op_;
    p.begins = message_begins_;
    p.ends = left_ == 0 && fin_;
    p.compressed = message_compressed_;
    p.bytes = std::string_view(in.data(), n);
    in = in.subspan(n);
    message_begins_ = false;
    if (left_ == 0) {
      in_payload_ = false;
      if (fin_) in_message_ = false;
    }
    return p;
  }
}

bool utf8_checker::feed(std::string_view bytes) noexcept {
  for (const char ch : bytes) {
    const auto b = static_cast<unsigned char>(ch);
    if (need_) {
      if (b < lo_ || b > hi_) return false;
      lo_ = 0x80, hi_ = 0xBF;
      --need_;
    } else if (b < 0x80) {
    } else if (b >= 0xC2 && b <= 0xDF) {
      need_ = 1;
    } else if (b == 0xE0) {
      need_ = 2, lo_ = 0xA0;
    } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
      need_ = 2;
    } else if (b == 0xED) {
      need_ = 2, hi_ = 0x9F;   // no surrogates
    } else if (b == 0xF0) {
      need_ = 3, lo_ = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
      need_ = 3;
    } else if (b == 0xF4) {
      need_ = 3, hi_ = 0x8F;   // nothing past U+10FFFF
    } else {
      return false;
    }
  }
  return true;
}

std::optional<close_payload> parse_close(std::string_view payload) noexcept {
  close_payload out;
  if (payload.empty()) return out;
  cursor c(payload);
  out.code = c.u16("close code");
  if (!c.ok()) return std::nullopt;
  const auto code = out.code;
  const bool allowed = (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) || (code >= 3000 && code <= 4999);
  if (!allowed) return std::nullopt;
  out.reason = payload.substr(2);
  utf8_checker u;
  if (!u.feed(out.reason) || !u.complete()) return std::nullopt;
  return out;
}

std::size_t frame_header(char (&out)[10], std::uint8_t opcode, std::uint64_t n, bool fin, bool rsv1) noexcept {
  out[0] = static_cast<char>((fin ? 0x80 : 0x00) | (rsv1 ? 0x40 : 0x00) | (opcode & 0x0F));
  if (n < 126) {
    out[1] = static_cast<char>(n);
    return 2;
  }
  if (n <= 0xFFFF) {
    out[1] = 126;
    out[2] = static_cast<char>(n >> 8);
    out[3] = static_cast<char>(n);
    return 4;
  }
  out[1] = 127;
  for (int i = 0; i < 8; ++i) out[2 + i] = static_cast<char>(n >> (56 - 8 * i));
  return 10;
}

std::string control_frame(std::uint8_t opcode, std::string_view payload) {
  payload = payload.substr(0, 125);
  char head[10];
  std::string out(head, frame_header(head, opcode, payload.size()));
  out.append(payload);
  return out;
}

std::string close_frame(std::uint16_t code, std::string_view reason) {
  std::size_t n = std::min<std::size_t>(reason.size(), 123);
  // Cut at a character boundary: not before a continuation byte.
  while (n < reason.size() && n > 0 && (static_cast<unsigned char>(reason[n]) & 0xC0) == 0x80) --n;
  std::string payload;
  payload.push_back(static_cast<char>(code >> 8));
  payload.push_back(static_cast<char>(code));
  payload.append(reason.substr(0, n));
  return control_frame(op_close, payload);
}

bool valid_key(std::string_view key) {
  auto raw = base64_decode(key);
  return raw && raw->size() == 16;
}

std::string accept_key(std::string_view key) {
  static constexpr std::string_view guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  std::string in(key);
  in.append(guid);
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(in.data()), in.size(), digest);
  return base64_encode(std::string_view(reinterpret_cast<const char*>(digest), sizeof digest));
}

}  // namespace walgate::protocol::websocket
