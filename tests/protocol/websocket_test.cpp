// WebSocket frames from clients, byte for byte, split at every offset; the frames walgate sends;
// close payloads; UTF-8 checked in pieces; the handshake's accept key.
#include "walgate/protocol/websocket.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace walgate::protocol::websocket;
using namespace std::string_literals;

namespace {

/// A client's frame: masked with key, the length in the form given (0: minimal, else 126/127).
std::string client_frame(std::uint8_t op, std::string_view payload, bool fin = true, bool rsv1 = false,
                         std::string_view key = "\x11\x22\x33\x44", int length_form = 0, bool masked = true) {
  std::string f;
  f.push_back(static_cast<char>((fin ? 0x80 : 0) | (rsv1 ? 0x40 : 0) | op));
  const char m = masked ? char(0x80) : char(0);
  const std::uint64_t n = payload.size();
  const int form = length_form ? length_form : n < 126 ? 0 : n <= 0xFFFF ? 126 : 127;
  if (form == 0) {
    f.push_back(static_cast<char>(m | n));
  } else if (form == 126) {
    f.push_back(static_cast<char>(m | 126));
    f.push_back(static_cast<char>(n >> 8));
    f.push_back(static_cast<char>(n));
  } else {
    f.push_back(static_cast<char>(m | 127));
    for (int i = 0; i < 8; ++i) f.push_back(static_cast<char>(n >> (56 - 8 * i)));
  }
  if (masked) f.append(key);
  for (std::size_t i = 0; i < payload.size(); ++i)
    f.push_back(masked ? static_cast<char>(payload[i] ^ key[i % 4]) : payload[i]);
  return f;
}

/// What a reader made of the input, whatever its split: messages whole, control frames, the failure.
struct seen {
  std::vector<std::string> log;
  std::string message;
  void add(const piece& p) {
    if (p.what == piece::kind::data) {
      if (p.begins) message = (p.opcode == op_text ? "text" : "binary") + std::string(p.compressed ? "+z:" : ":");
      message.append(p.bytes);
      if (p.ends) log.push_back(message);
    } else if (p.what == piece::kind::control) {
      log.push_back("control " + std::to_string(p.opcode) + ":" + std::string(p.bytes));
    } else if (p.what == piece::kind::failed) {
      log.push_back("failed " + std::to_string(p.code) + ": " + p.reason);
    }
  }
};

/// Reads input in the given pieces (a copy: the reader unmasks in place); stops at a failure.
std::vector<std::string> read_pieces(const std::vector<std::string>& parts, bool compression = false) {
  frame_reader r(compression);
  seen s;
  for (auto part : parts) {
    std::span<char> in(part.data(), part.size());
    for (;;) {
      piece p = r.next(in);
      if (p.what == piece::kind::more) {
        CHECK(in.empty());
        break;
      }
      s.add(p);
      if (p.what == piece::kind::failed) return s.log;
    }
  }
  return s.log;
}

/// The same result whole, split in two at every offset, and a byte at a time.
std::vector<std::string> read_every_split(const std::string& input, bool compression = false) {
  auto whole = read_pieces({input}, compression);
  for (std::size_t i = 0; i <= input.size(); ++i) {
    INFO("split at " << i);
    CHECK(read_pieces({input.substr(0, i), input.substr(i)}, compression) == whole);
  }
  std::vector<std::string> bytes;
  for (char c : input) bytes.emplace_back(1, c);
  CHECK(read_pieces(bytes, compression) == whole);
  return whole;
}

using log = std::vector<std::string>;

}  // namespace

TEST_CASE("websocket frames: a text message, masked, read at every split") {
  auto f = client_frame(op_text, "hello, walgate");
  CHECK(f == "\x81\x8e\x11\x22\x33\x44"s + "\x79\x47\x5f\x28\x7e\x0e\x13\x33\x70\x4e\x54\x25\x65\x47"s);
  CHECK(read_every_split(f) == log{"text:hello, walgate"});
}

TEST_CASE("websocket frames: lengths of 0, 125, 126, 65535 and 65536; two messages in one buffer") {
  CHECK(read_every_split(client_frame(op_text, "")) == log{"text:"});
  std::string a(125, 'a'), b(126, 'b'), c(65535, 'c'), d(65536, 'd');
  CHECK(client_frame(op_binary, b).substr(0, 4) == "\x82\xfe\x00\x7e"s);
  CHECK(client_frame(op_binary, d).substr(0, 10) == "\x82\xff\x00\x00\x00\x00\x00\x01\x00\x00"s);
  CHECK(read_every_split(client_frame(op_text, a) + client_frame(op_binary, b)) == log{"text:" + a, "binary:" + b});
  CHECK(read_pieces({client_frame(op_text, c) + client_frame(op_text, d)}) == log{"text:" + c, "text:" + d});
}

TEST_CASE("websocket frames: fragments with control frames between them, and empty fragments") {
  const std::string input = client_frame(op_text, "one ", false) + client_frame(op_ping, "p?") +
                            client_frame(op_continuation, "", false) + client_frame(op_continuation, "two", false) +
                            client_frame(op_pong, "") + client_frame(op_continuation, " three", true) +
                            client_frame(op_binary, "", false) + client_frame(op_continuation, "", true) +
                            client_frame(op_text, "z", true, true) + client_frame(op_close, "\x03\xe8" "bye");
  CHECK(read_every_split(input, true) ==
        log{"control 9:p?", "control 10:", "text:one two three", "binary:", "text+z:z", "control 8:\x03\xe8" "bye"});
}

TEST_CASE("websocket frames: a message's pieces say where it begins and ends, unmasked in place") {
  frame_reader r;
  std::string f = client_frame(op_text, "abcdef", true, false, "\x01\x02\x03\x04");
  std::span<char> in(f.data(), 8);   // the header and two bytes
  piece p = r.next(in);
  REQUIRE(p.what == piece::kind::data);
  CHECK(p.begins);
  CHECK_FALSE(p.ends);
  CHECK(p.bytes == "ab");
  CHECK(p.bytes.data() == f.data() + 6);
  CHECK(r.in_message());
  CHECK(r.next(in).what == piece::kind::more);
  in = std::span<char>(f.data() + 8, 4);
  p = r.next(in);
  REQUIRE(p.what == piece::kind::data);
  CHECK_FALSE(p.begins);
  CHECK(p.ends);
  CHECK(p.bytes == "cdef");
  CHECK_FALSE(r.in_message());
}

TEST_CASE("websocket frames: every protocol error is 1002 with its reason, and stays failed") {
  struct {
    std::string input;
    const char* reason;
    bool compression = false;
  } cases[] = {
      {client_frame(op_text, "x", true, false, "abcd", 0, false), "an unmasked frame (a client must mask its frames)"},
      {"\xa1\x81" "abcd" "x"s, "reserved bits set"},
      {"\x91\x81" "abcd" "x"s, "reserved bits set"},
      {client_frame(3, "x"), "an unknown opcode"},
      {client_frame(0xB, "x"), "an unknown opcode"},
      {client_frame(op_ping, "x", false), "a fragmented control frame"},
      {client_frame(op_ping, std::string(126, 'x')), "a control frame over 125 bytes"},
      {client_frame(op_ping, "x", true, true), "RSV1 on a control frame", true},
      {client_frame(op_continuation, "x"), "a continuation frame outside a message"},
      {client_frame(op_text, "x", false) + client_frame(op_continuation, "y", true, true), "RSV1 on a continuation frame", true},
      {client_frame(op_text, "x", false) + client_frame(op_text, "y"), "a new message inside a fragmented one"},
      {client_frame(op_text, "x", true, true), "RSV1 without permessage-deflate"},
      {client_frame(op_text, "x", true, false, "abcd", 126), "a frame length not minimally encoded"},
      {client_frame(op_text, std::string(200, 'x'), true, false, "abcd", 127), "a frame length not minimally encoded"},
      {"\x81\xff\x80\x00\x00\x00\x00\x00\x00\x00" "abcd"s, "a frame length past 2^63"},
  };
  for (const auto& c : cases) {
    INFO(c.reason);
    auto got = read_every_split(c.input, c.compression);
    REQUIRE(!got.empty());
    CHECK(got.back() == "failed 1002: "s + c.reason);
  }
  frame_reader r;
  std::string bad = client_frame(op_continuation, "x"), good = client_frame(op_text, "ok");
  std::span<char> in(bad.data(), bad.size());
  CHECK(r.next(in).what == piece::kind::failed);
  in = std::span<char>(good.data(), good.size());
  CHECK(r.next(in).code == close_protocol_error);   // failed for good
}

TEST_CASE("websocket UTF-8: checked in pieces split anywhere") {
  const std::string valid[] = {"", "plain", "\xc3\xa9t\xc3\xa9", "\xe2\x82\xac", "\xed\x9f\xbf", "\xf0\x90\x80\x80",
                               "\xf4\x8f\xbf\xbf", "\xef\xbf\xbf"};
  const std::string invalid[] = {"\x80", "\xc0\xaf", "\xc1\xbf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf0\x80\x80\x80",
                                 "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xff", "\xc3\x28", "a\xe2\x82"};
  for (const auto& s : valid)
    for (std::size_t i = 0; i <= s.size(); ++i) {
      utf8_checker u;
      CHECK(u.feed(s.substr(0, i)));
      CHECK(u.feed(s.substr(i)));
      CHECK(u.complete());
    }
  for (const auto& s : invalid) {
    INFO(s);
    for (std::size_t i = 0; i <= s.size(); ++i) {
      utf8_checker u;
      CHECK_FALSE((u.feed(s.substr(0, i)) && u.feed(s.substr(i)) && u.complete()));
    }
  }
  utf8_checker u;
  CHECK(u.feed("\xe2\x82"));
  CHECK_FALSE(u.complete());
  u.reset();
  CHECK(u.complete());
}

TEST_CASE("websocket close payloads: code and reason; the codes a peer may not send") {
  auto c = parse_close("");
  REQUIRE(c);
  CHECK(c->code == close_no_status);
  const std::string done = "\x03\xe8" "done"s;   // (the reason is a view into it)
  c = parse_close(done);
  REQUIRE(c);
  CHECK(c->code == 1000);
  CHECK(c->reason == "done");
  CHECK(parse_close("\x0f\xa1"s)->code == 4001);
  CHECK(parse_close("\x0b\xb8"s)->code == 3000);
  CHECK_FALSE(parse_close("\x03"s));
  for (std::uint16_t bad : {0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535}) {
    std::string p{static_cast<char>(bad >> 8), static_cast<char>(bad)};
    CHECK_FALSE(parse_close(p));
  }
  CHECK_FALSE(parse_close("\x03\xe8\xff"s));
}

TEST_CASE("websocket server frames: headers, control frames, close frames cut at a character") {
  char h[10];
  CHECK(std::string(h, frame_header(h, op_text, 5)) == "\x81\x05"s);
  CHECK(std::string(h, frame_header(h, op_text, 126, false, true)) == "\x41\x7e\x00\x7e"s);
  CHECK(std::string(h, frame_header(h, op_continuation, 65536, true)) == "\x80\x7f\x00\x00\x00\x00\x00\x01\x00\x00"s);
  CHECK(control_frame(op_pong, "p?") == "\x8a\x02p?"s);
  CHECK(control_frame(op_ping, "") == "\x89\x00"s);
  CHECK(control_frame(op_ping, std::string(200, 'x')).size() == 127);
  CHECK(close_frame(1001, "server shutting down") == "\x88\x16\x03\xe9server shutting down"s);
  std::string long_reason(122, 'r');
  long_reason += "\xc3\xa9\xc3\xa9";   // é é: the first straddles byte 123
  auto f = close_frame(4001, long_reason);
  CHECK(f.size() == 2 + 2 + 122);
  CHECK(parse_close(f.substr(2)));
}

TEST_CASE("websocket handshake: the accept key of RFC 6455's example, and key checks") {
  CHECK(accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  CHECK(valid_key("dGhlIHNhbXBsZSBub25jZQ=="));
  CHECK_FALSE(valid_key("dGhlIHNhbXBsZSBub25j"));      // 15 bytes
  CHECK_FALSE(valid_key("c2hvcnQ="));                  // "short"
  CHECK_FALSE(valid_key(""));
  CHECK_FALSE(valid_key("dGhlIHNhbXBsZSBub25jZQ==x"));
}
