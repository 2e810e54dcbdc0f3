// Decodes the frames captured from real PostgreSQL 15 and 18 servers (tests/golden/) through
// the decoder and the assembler, and checks them against the reviewed summary.
#include "golden.hpp"
#include "golden_expected.hpp"
#include "split_helpers.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

using namespace walgate;

namespace {
std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE("golden captures of PostgreSQL 15 and 18 decode to the reviewed summary") {
  struct capture {
    const char* file;
    std::uint32_t proto;
    bool binary;
  };
  for (auto c : {capture{"pg15-text", 3, false}, capture{"pg15-binary", 3, true}, capture{"pg18-text", 4, false},
                 capture{"pg18-binary", 4, true}}) {
    INFO(c.file);
    auto frames = test::decode_frames(read_file(std::string(WALGATE_GOLDEN_DIR) + "/" + c.file + ".frames"));
    REQUIRE(frames.size() > 100);
    std::string expected = test::golden_expected(c.binary);
    REQUIRE_FALSE(expected.empty());
    CHECK(test::summarize(frames, c.proto) == expected);
  }
}

TEST_CASE("every golden frame re-encodes to the bytes the server sent") {
  for (const char* file : {"pg15-text", "pg18-binary"}) {
    auto frames = test::decode_frames(read_file(std::string(WALGATE_GOLDEN_DIR) + "/" + file + ".frames"));
    protocol::pgoutput::decoder d;
    protocol::pgoutput::decode_context ctx{std::string(file).find("pg18") == 0 ? 4u : 3u, false, false};
    std::size_t checked = 0;
    for (const auto& f : frames) {
      auto bytes = protocol::as_bytes(f.data);
      char tag = f.data[0];
      if (tag == 'S') ctx.in_stream = true;
      auto m = d.decode(bytes, ctx);
      REQUIRE_MESSAGE(m.has_value(), file << " frame at " << f.wal_start.to_string());
      CHECK(protocol::pgoutput::encode(*m, ctx) == f.data);
      if (tag == 'E') ctx.in_stream = false;
      ++checked;
    }
    CHECK(checked == frames.size());
  }
}
