// Decode benchmark: pgoutput messages per second and MB/s on one core, and heap allocations per
// row message, over a captured stream (records "Int64 WAL start | Int32 length | bytes", as
// written by walgate-capture-workload).
//   decode_bench FRAMES [PASSES] [PROTO_VERSION]
#include "walgate/protocol/assembler.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <vector>

namespace {
std::atomic<std::uint64_t> allocations{0};
}

void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using namespace walgate::protocol;
namespace pg = walgate::protocol::pgoutput;
using clock_type = std::chrono::steady_clock;

namespace {
struct frame {
  lsn wal_start;
  std::string data;
};

struct null_handler final : transaction_handler {
  std::uint64_t changes = 0;
  boost::system::error_code on_begin(const transaction_info&) override { return {}; }
  boost::system::error_code on_change(const transaction_info&, const change_event&) override {
    ++changes;
    return {};
  }
  boost::system::error_code on_commit(const transaction_info&) override { return {}; }
};
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: decode_bench FRAMES [PASSES] [PROTO_VERSION]\n");
    return 2;
  }
  int passes = argc > 2 ? std::atoi(argv[2]) : 20;
  std::uint32_t proto = argc > 3 ? static_cast<std::uint32_t>(std::atoi(argv[3])) : 1;
  std::ifstream in(argv[1], std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  std::vector<frame> frames;
  cursor c(bytes);
  std::size_t payload = 0;
  while (!c.empty() && c.ok()) {
    lsn start{c.u64()};
    auto len = c.u32();
    auto b = c.bytes(len);
    if (!c.ok()) break;
    frames.push_back({start, std::string(as_string_view(b))});
    payload += len;
  }
  if (frames.empty()) {
    std::fprintf(stderr, "decode_bench: no frames in %s\n", argv[1]);
    return 1;
  }

  pg::decoder decoder;
  pg::decode_context ctx{proto, false, false};
  std::uint64_t rows = 0, errors = 0;
  // Warm-up pass: the decoder's storage grows to the widest row once.
  for (const auto& f : frames) {
    auto m = decoder.decode(as_bytes(f.data), ctx);
    if (!m) ++errors;
    else if (char t = pg::tag_of(*m); t == 'I' || t == 'U' || t == 'D') ++rows;
  }
  if (errors) {
    std::fprintf(stderr, "decode_bench: %llu frames failed to decode\n", static_cast<unsigned long long>(errors));
    return 1;
  }

  // Steady path: allocations counted over a whole pass of row messages only.
  std::uint64_t row_allocs = 0;
  for (const auto& f : frames) {
    char t = f.data.empty() ? 0 : f.data[0];
    bool row = t == 'I' || t == 'U' || t == 'D';
    auto before = allocations.load(std::memory_order_relaxed);
    auto m = decoder.decode(as_bytes(f.data), ctx);
    if (row) row_allocs += allocations.load(std::memory_order_relaxed) - before;
    (void)m;
  }

  std::uint64_t sink = 0;
  auto t0 = clock_type::now();
  for (int p = 0; p < passes; ++p)
    for (const auto& f : frames) {
      auto m = decoder.decode(as_bytes(f.data), ctx);
      sink += m ? m->index() : 0;
    }
  double decode_s = std::chrono::duration<double>(clock_type::now() - t0).count();

  // Decode plus transaction assembly (relation lookup, indexes, callbacks).
  double assemble_s = 0;
  std::uint64_t changes = 0;
  {
    auto t1 = clock_type::now();
    for (int p = 0; p < passes; ++p) {
      null_handler h;
      assembler_options o;
      o.context = ctx;
      assembler a(o, h);
      for (const auto& f : frames)
        if (!a.feed(f.wal_start, as_bytes(f.data))) return 1;
      changes += h.changes;
    }
    assemble_s = std::chrono::duration<double>(clock_type::now() - t1).count();
  }

  double msgs = static_cast<double>(frames.size()) * passes;
  std::printf("frames: %zu messages (%llu row messages), %.1f MB of pgoutput data, %d passes\n", frames.size(),
              static_cast<unsigned long long>(rows), payload / 1e6, passes);
  std::printf("decode only:       %.2f M messages/s, %.0f MB/s (one core)\n", msgs / decode_s / 1e6,
              payload * passes / decode_s / 1e6);
  std::printf("decode + assemble: %.2f M messages/s, %.2f M changes/s (one core)\n", msgs / assemble_s / 1e6,
              changes / assemble_s / 1e6);
  std::printf("heap allocations per row message on the steady path: %.3f (%llu over %llu rows)\n",
              rows ? static_cast<double>(row_allocs) / rows : 0.0, static_cast<unsigned long long>(row_allocs),
              static_cast<unsigned long long>(rows));
  return sink == 42 ? 3 : 0;
}
