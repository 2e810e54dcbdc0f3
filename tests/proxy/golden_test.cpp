// The golden workload against a real server: every pgoutput message type and tuple kind,
// captured over our own replication client and decoded through the assembler. With
// WALGATE_GOLDEN_OUT=DIR the captured frames are also written to DIR (how tests/golden/ was made).
#include "walgate/proxy/replication_client.hpp"

#include "capture_sink.hpp"
#include "golden.hpp"
#include "golden_expected.hpp"

#include <sstream>
#include "test_cluster.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

using namespace walgate;
using namespace walgate::proxy;
namespace asio = boost::asio;

namespace {

std::vector<test::frame_record> capture(const std::string& slot, bool binary, std::uint32_t& proto) {
  auto& pg = test::cluster();
  replication_settings s;
  s.conn = *parse_conninfo(pg.conninfo()).params;
  s.slot = slot;
  s.publications = {"g_pub", "g_pub_root"};
  s.create_slot = false;
  s.messages = true;
  s.binary = binary;
  s.streaming = pg.server_major() >= 14 ? protocol::streaming_mode::on : protocol::streaming_mode::off;
  s.two_phase = pg.server_major() >= 15;
  s.max_attempts = 1;
  proto = protocol::max_pgoutput_protocol(pg.server_major());
  test::capture_sink sink("g_end");
  asio::io_context io;
  replication_client client(io.get_executor(), s, sink);
  std::optional<outcome<void>> result;
  asio::co_spawn(io, client.run(), [&](std::exception_ptr, outcome<void> r) { result = std::move(r); });
  std::thread t([&] { io.run(); });
  bool finished = test::wait_until([&] { return sink.done() || result.has_value(); }, std::chrono::seconds(60));
  asio::post(io, [&] { client.stop(); });
  t.join();
  REQUIRE_MESSAGE(finished, "the end marker never arrived");
  if (result && !*result) FAIL(result->error().message);
  return sink.frames();
}

}  // namespace

TEST_CASE("golden workload: every message type decoded from a real server") {
  auto& pg = test::cluster();
  const int major = pg.server_major();
  if (major < 14) {
    MESSAGE("the golden workload needs streaming (PostgreSQL 14+); skipped on " << major);
    return;
  }
  pg.sql(test::golden_schema);
  std::string two_phase_arg = major >= 15 ? ", false, true" : "";
  pg.sql("SELECT pg_create_logical_replication_slot('g_text', 'pgoutput'" + two_phase_arg + ")");
  pg.sql("SELECT pg_create_logical_replication_slot('g_binary', 'pgoutput'" + two_phase_arg + ")");
  for (const auto& statement : test::golden_workload(major)) pg.sql(statement);
  pg.sql("ALTER SYSTEM SET logical_decoding_work_mem = '64kB'");
  pg.sql("SELECT pg_reload_conf()");

  for (bool binary : {false, true}) {
    std::uint32_t proto = 0;
    auto frames = capture(binary ? "g_binary" : "g_text", binary, proto);
    std::string summary = test::summarize(frames, proto);
    const std::string raw_summary = summary;
    std::string expected = test::golden_expected(binary);   // made on PostgreSQL 15+
    if (major < 15) {
      // PostgreSQL 14 has no two-phase decoding (the workload leaves it out), and it sends the
      // empty transaction of a DDL statement, which 15 and later skip.
      auto lines = [](const std::string& text) {
        std::vector<std::string> out;
        std::istringstream in(text);
        for (std::string l; std::getline(in, l);) out.push_back(l);
        return out;
      };
      std::string kept;
      bool skipping = false;
      for (const auto& l : lines(expected)) {
        if (l.rfind("BEGIN", 0) == 0 && l.find(" gid=") != std::string::npos) skipping = true;
        if (!skipping) kept += l + "\n";
        if (skipping && l == "COMMIT") skipping = false;
      }
      expected = kept;
      auto got = lines(summary);
      std::string without_empty;
      int empty = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i] == "BEGIN" && i + 1 < got.size() && got[i + 1] == "COMMIT") {
          ++i;
          ++empty;
          continue;
        }
        without_empty += got[i] + "\n";
      }
      CHECK(empty >= 1);
      summary = without_empty;
    }
    CHECK(summary == expected);
    if (const char* out = std::getenv("WALGATE_GOLDEN_OUT")) {
      std::string name = std::string(out) + "/pg" + std::to_string(major) + (binary ? "-binary" : "-text") + ".frames";
      std::ofstream(name, std::ios::binary) << test::encode_frames(frames);
      std::ofstream(name + ".summary") << raw_summary;
    }
    // Every message kind the workload should produce came through at least once.
    std::string tags;
    for (const auto& f : frames)
      if (!f.data.empty() && tags.find(f.data[0]) == std::string::npos) tags += f.data[0];
    for (char expected : std::string(major >= 15 ? "BCORYIUDTMSEcAbPKrp" : "BCORYIUDTMSEcA"))
      CHECK_MESSAGE(tags.find(expected) != std::string::npos, "no '" << expected << "' message in the capture");
  }
  pg.sql("ALTER SYSTEM RESET logical_decoding_work_mem");
  pg.sql("SELECT pg_reload_conf()");
}
