// WebSocket (RFC 6455) as a server sees it, bytes only: the frames a client sends, read a piece
// at a time (a frame's payload is unmasked in place and handed on as it arrives, so a connection
// holds no message buffer of its own), the frames a server sends, the close frame's payload, the
// handshake's accept key, and UTF-8 checked incrementally. No sockets here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace walgate::protocol::websocket {

inline constexpr std::uint8_t op_continuation = 0x0, op_text = 0x1, op_binary = 0x2, op_close = 0x8,
                              op_ping = 0x9, op_pong = 0xA;

/// Close codes (RFC 6455 7.4.1) walgate sends.
inline constexpr std::uint16_t close_normal = 1000, close_going_away = 1001, close_protocol_error = 1002,
                               close_no_status = 1005, close_bad_payload = 1007, close_policy = 1008,
                               close_too_big = 1009, close_try_again_later = 1013;

/// What frame_reader::next found.
struct piece {
  enum class kind : std::uint8_t {
    more,      ///< every byte given was used; the next piece needs more
    data,      ///< bytes of a text or binary message
    control,   ///< a whole ping, pong or close frame
    failed,    ///< the client broke the protocol: close with code, saying reason
  };
  kind what = kind::more;
  std::uint8_t opcode = 0;    ///< data: the message's (op_text or op_binary); control: the frame's
  bool begins = false;        ///< data: the message's first bytes
  bool ends = false;          ///< data: the message's last bytes
  bool compressed = false;    ///< data: the message is permessage-deflate (RSV1 on its first frame)
  std::string_view bytes;     ///< data: payload, unmasked (in the caller's buffer); control: its payload
  std::uint16_t code = 0;     ///< failed
  const char* reason = "";    ///< failed
};

/// A client's frames (RFC 6455 5.2), any split: masked (a client must mask), lengths minimally
/// encoded, no reserved bits or opcodes, control frames whole and at most 125 bytes, fragments
/// in order, RSV1 only on a message's first frame and only when permessage-deflate was agreed.
class frame_reader {
 public:
  explicit frame_reader(bool compression = false) noexcept : compression_(compression) {}

  /// The next piece from in, which it advances past the bytes it used; a data piece's bytes are
  /// unmasked in place. A zero-length data frame gives an empty piece when it begins or ends a
  /// message. Once failed, it stays failed.
  piece next(std::span<char>& in) noexcept;

  bool in_message() const noexcept { return in_message_; }

 private:
  piece fail(std::uint16_t code, const char* reason) noexcept;

  unsigned char head_[14]{};
  std::uint8_t have_ = 0;        // header bytes gathered
  bool in_payload_ = false;
  std::uint64_t left_ = 0;       // payload bytes of the frame still to come
  unsigned char mask_[4]{};
  std::uint8_t mask_at_ = 0;
  std::uint8_t op_ = 0;          // the frame's opcode
  bool fin_ = false;
  bool compression_;
  bool in_message_ = false;      // a data message has begun and not ended
  bool message_begins_ = false;  // its next piece is its first
  std::uint8_t message_op_ = 0;
  bool message_compressed_ = false;
  bool failed_ = false;
  std::uint16_t fail_code_ = 0;
  const char* fail_reason_ = "";
  std::uint8_t control_len_ = 0;
  char control_[125]{};
};

/// UTF-8 (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF), checked as the
/// bytes arrive, split anywhere.
class utf8_checker {
 public:
  /// False as soon as the bytes so far cannot begin valid UTF-8.
  bool feed(std::string_view bytes) noexcept;
  /// Whether everything fed ends on a whole character.
  bool complete() const noexcept { return need_ == 0; }
  void reset() noexcept { need_ = 0, lo_ = 0x80, hi_ = 0xBF; }

 private:
  std::uint8_t need_ = 0;                // continuation bytes still expected
  unsigned char lo_ = 0x80, hi_ = 0xBF;  // the range of the next one
};

/// A close frame's payload (RFC 6455 5.5.1, 7.4): the code (close_no_status when empty) and
/// the reason.
struct close_payload {
  std::uint16_t code = close_no_status;
  std::string_view reason;
};
/// Nullopt for a one-byte payload, a code an endpoint may not send (below 1000, 1004-1006,
/// 1015, 1016-2999 unassigned, 5000 and up) or a reason that is not UTF-8.
std::optional<close_payload> parse_close(std::string_view payload) noexcept;

/// A server frame's header (unmasked, RFC 6455 5.2): its length, 2, 4 or 10.
std::size_t frame_header(char (&out)[10], std::uint8_t opcode, std::uint64_t length, bool fin = true,
                         bool rsv1 = false) noexcept;
/// A whole control frame from the server; payload cut to 125 bytes.
std::string control_frame(std::uint8_t opcode, std::string_view payload);
/// A close frame: the code, then the reason cut to fit 125 bytes (at a character boundary).
std::string close_frame(std::uint16_t code, std::string_view reason);

/// Whether a Sec-WebSocket-Key is the base64 of 16 bytes (RFC 6455 4.2.1).
bool valid_key(std::string_view key);
/// The Sec-WebSocket-Accept answering key: base64(SHA-1(key + the RFC's GUID)), RFC 6455 4.2.2.
std::string accept_key(std::string_view key);

}  // namespace walgate::protocol::websocket
