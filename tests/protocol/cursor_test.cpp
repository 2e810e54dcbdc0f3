#include "walgate/protocol/cursor.hpp"
#include "walgate/protocol/base64.hpp"
#include "walgate/protocol/lsn.hpp"

#include "split_helpers.hpp"

#include <doctest/doctest.h>

using namespace walgate::protocol;
using namespace std::string_literals;

TEST_CASE("cursor reads big-endian integers and strings as views") {
  std::string in = "\x01\x02\x03\xff\xff\xff\xfe\x00\x00\x00\x00\x00\x00\x01\x00hello\0rest"s;
  cursor c(in);
  CHECK(c.u8() == 1);
  CHECK(c.u16() == 0x0203);
  CHECK(c.i32() == -2);
  CHECK(c.u64() == 0x100);
  auto s = c.cstring();
  CHECK(s == "hello");
  CHECK(s.data() == in.data() + 15);   // a view, not a copy
  CHECK(as_string_view(c.rest()) == "rest");
  CHECK(c.ok());
  CHECK(c.empty());
}

TEST_CASE("cursor failure is sticky and names the field and offset") {
  std::string in = "\x00\x01\x02"s;
  cursor c(in);
  CHECK(c.u16("first") == 1);
  CHECK(c.u32("second") == 0);   // only one byte left
  CHECK_FALSE(c.ok());
  CHECK(c.u8("third") == 0);     // nothing read after a failure
  auto e = c.error();
  CHECK(e.code == errc::truncated);
  CHECK(std::string(e.what) == "second");
  CHECK(e.offset == 2);
  CHECK(e.message() == "message truncated in second at offset 2");
}

TEST_CASE("cursor rejects unterminated strings and oversized byte reads") {
  std::string abc = "abc";
  cursor c(abc);
  CHECK(c.cstring("name").empty());
  CHECK(c.error().code == errc::unterminated_string);
  cursor d(abc);
  CHECK(d.bytes(4).empty());
  CHECK(d.error().code == errc::truncated);
  cursor e(abc);
  CHECK(e.bytes(static_cast<std::size_t>(-1)).empty());   // no overflow in the bounds check
  CHECK_FALSE(e.ok());
}

TEST_CASE("writer builds exact big-endian bytes and patches message lengths") {
  writer w;
  w.begin_message('Q').cstring("SELECT 1").finish_message();
  CHECK(w.str() == "Q\x00\x00\x00\x0dSELECT 1\0"s);
  writer v;
  v.i16(-2).u32(0x01020304).i64(-1);
  CHECK(v.str() == "\xff\xfe\x01\x02\x03\x04\xff\xff\xff\xff\xff\xff\xff\xff"s);
}

TEST_CASE("lsn text form round-trips") {
  CHECK(lsn{0x16B3748ULL}.to_string() == "0/16B3748");
  CHECK(lsn{(0xAULL << 32) | 0xFFULL}.to_string() == "A/FF");
  CHECK(lsn::parse("0/16B3748")->value == 0x16B3748ULL);
  CHECK(lsn::parse("FFFFFFFF/FFFFFFFF")->value == ~0ULL);
  CHECK_FALSE(lsn::parse("0x1/2"));
  CHECK_FALSE(lsn::parse("1/"));
  CHECK_FALSE(lsn::parse("/1"));
  CHECK_FALSE(lsn::parse("123456789/0"));
  CHECK_FALSE(lsn::parse("1/2 "));
  CHECK_FALSE(lsn::parse("-1/2"));
  CHECK(lsn{1} < lsn{2});
}

TEST_CASE("postgres epoch conversion") {
  CHECK(pg_us_to_unix(0) == 946684800000000LL);
  CHECK(unix_us_to_pg(946684800000001LL) == 1);
}

TEST_CASE("base64 encodes and strictly decodes") {
  CHECK(base64_encode("") == "");
  CHECK(base64_encode("f") == "Zg==");
  CHECK(base64_encode("fo") == "Zm8=");
  CHECK(base64_encode("foo") == "Zm9v");
  CHECK(base64_encode("foobar") == "Zm9vYmFy");
  CHECK(base64_decode("Zm9vYg==") == "foob");
  CHECK(base64_decode("Zm9vYmE=") == "fooba");
  CHECK_FALSE(base64_decode("Zm9"));
  CHECK_FALSE(base64_decode("Zm=v"));
  CHECK_FALSE(base64_decode("Z===") );
  CHECK_FALSE(base64_decode("Zm9v\n"));
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  CHECK(base64_decode(base64_encode(all)) == all);
}

#include "walgate/protocol/crc32c.hpp"

TEST_CASE("CRC-32C: the standard check value, hardware and table agree, and it continues") {
  CHECK(crc32c("123456789") == 0xE3069283u);   // RFC 3720 B.4 / the CRC catalogue's check value
  CHECK(crc32c_portable("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);   // RFC 3720 B.4: 32 bytes of zeros
  CHECK(crc32c(std::string(32, '\xff')) == 0x62A8AB43u);   // RFC 3720 B.4: 32 bytes of 0xff
  std::string data;
  for (int i = 0; i < 1000; ++i) data += static_cast<char>(i * 7 + 3);
  for (std::size_t len = 0; len < 40; ++len) CHECK(crc32c(data.substr(0, len)) == crc32c_portable(data.substr(0, len)));
  CHECK(crc32c(data) == crc32c_portable(data));
  for (std::size_t split = 0; split <= data.size(); split += 37)
    CHECK(crc32c(std::string_view(data).substr(split), crc32c(std::string_view(data).substr(0, split))) == crc32c(data));
}
