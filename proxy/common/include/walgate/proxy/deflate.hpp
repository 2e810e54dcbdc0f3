// WebSocket permessage-deflate (RFC 7692) as walgate sends it: every message compressed on its
// own (server_no_context_takeover), so one compressed form of an event serves every client
// that negotiated the same window — made once, like the event's encoding, and written as the
// same frame to each of them. No socket here, no Beast.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace walgate::proxy {

/// walgate's answer to a client's Sec-WebSocket-Extensions (RFC 7692 5, 7.1): the first
/// permessage-deflate offer whose parameters are all known, valid and not repeated is accepted,
/// unless it limits the server's window to 8 bits (zlib has none; the offer is declined and the
/// next one looked at). The answer always has server_no_context_takeover (each message
/// compressed on its own: one compressed form serves every client of that window), the
/// server_max_window_bits the offer asked for, and client_no_context_takeover when the offer
/// had it; never client_max_window_bits (walgate inflates with a 15-bit window, which reads any
/// smaller one). Nullopt: no offer accepted, the connection is not compressed.
struct pmd_agreement {
  std::string answer;                       // the Sec-WebSocket-Extensions value
  int server_bits = 15;                     // the window walgate compresses with
  bool client_no_context_takeover = false;  // the client compresses each message on its own
};
std::optional<pmd_agreement> negotiate_pmd(std::string_view offers);

/// The receiving side of a connection's compressed client messages (RFC 7692 7.2.2), made when
/// the first one arrives: one message a piece at a time, the 00 00 ff ff appended at its end;
/// the context kept from message to message unless reset.
class inflater {
 public:
  inflater();
  ~inflater();
  inflater(const inflater&) = delete;
  inflater& operator=(const inflater&) = delete;
  /// Inflates a piece of a message (last: its end), handing the output on in pieces of at most
  /// 4 KiB to out, which returns false to stop. False when the data does not inflate, or out
  /// stopped.
  bool feed(std::string_view in, bool last, const std::function<bool(std::string_view)>& out);
  /// A fresh context (client_no_context_takeover: for each message).
  void reset();

 private:
  struct impl;
  std::unique_ptr<impl> z_;
};

/// Messages smaller than this go uncompressed (RSV1 clear) on a compressing connection: they
/// barely shrink (docs/benchmarks.md, "WebSocket compression"), and a client inflates for nothing.
inline constexpr std::size_t deflate_min_bytes = 256;
/// Nor do messages of this size or more (compressing them would be CPU-heavy work on the event
/// loop); they go uncompressed, in fragments when large.
inline constexpr std::size_t deflate_max_bytes = 64u << 10;

/// One message compressed with a fresh context and the given window (9..15): raw DEFLATE,
/// flushed to a byte boundary, without the final 00 00 ff ff (RFC 7692 7.2.1). False (out
/// untouched) when the result is not smaller than the message, or zlib fails.
bool deflate_message(std::string_view message, int window_bits, std::string& out);
/// A message that wraps a compressed one (a multiplexed subscription's envelope around an
/// event, docs/api.md): bytes before and after it as DEFLATE stored blocks, so that the shared
/// compressed form is sent as it is. stored_head(b) is a whole non-final stored block
/// (00, LEN, NLEN, b) to put at the start of the message; stored_tail(b) follows
/// deflate_message's output (which ends in the header of the empty stored block its sync flush
/// wrote, before the 00 00 ff ff it drops): LEN, NLEN, b, and the header of one more empty
/// stored block, whose LEN and NLEN are the 00 00 ff ff the receiver appends. At most 65,535
/// bytes each (one stored block).
std::string deflate_stored_head(std::string_view bytes);
std::string deflate_stored_tail(std::string_view bytes);
/// Messages deflate_message compressed (walgate_ws_deflated_total): once per event and window.
extern std::atomic<std::uint64_t> deflated_total;
/// The receiving side, for tests (Beast inflates what clients send): one message (the
/// 00 00 ff ff appended again) into out, refusing more than max bytes. False when malformed.
bool inflate_message(std::string_view compressed, int window_bits, std::size_t max, std::string& out);

}  // namespace walgate::proxy
