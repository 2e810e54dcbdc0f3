// Encode benchmark: events per second per core for each format, over a captured stream of the
// standard workload (the capture walgate-capture-workload writes). Decoding and assembly happen
// once up front; only encoding is timed.
//   encode_bench FRAMES [PASSES]
#include "walgate/protocol/assembler.hpp"
#include "walgate/transform/formats.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

using namespace walgate;
namespace pg = walgate::protocol::pgoutput;

namespace {
// A change kept for replaying into the encoders: owned copies of the tuples.
struct kept {
  transform::op kind;
  protocol::lsn change_lsn;
  std::uint32_t index;
  std::uint32_t relation;
  std::size_t txn;
  char before_kind;
  std::vector<std::string> before_values, after_values;
  std::vector<pg::column_kind> before_kinds, after_kinds;
};

struct collector final : protocol::transaction_handler {
  const protocol::assembler* a = nullptr;
  std::vector<protocol::transaction_info> txns;
  std::vector<kept> changes;
  boost::system::error_code on_begin(const protocol::transaction_info& t) override {
    txns.push_back(t);
    return {};
  }
  boost::system::error_code on_change(const protocol::transaction_info& t, const protocol::change_event& e) override {
    transform::for_each_change(t, e, a->relations(), &a->types(), [&](const transform::change& c) {
      kept k{c.kind, c.change_lsn, c.index, c.relation->oid, txns.size() - 1, c.before_kind, {}, {}, {}, {}};
      for (const auto& col : c.before) {
        k.before_values.emplace_back(protocol::as_string_view(col.value));
        k.before_kinds.push_back(col.kind);
      }
      for (const auto& col : c.after) {
        k.after_values.emplace_back(protocol::as_string_view(col.value));
        k.after_kinds.push_back(col.kind);
      }
      changes.push_back(std::move(k));
    });
    return {};
  }
  boost::system::error_code on_commit(const protocol::transaction_info&) override { return {}; }
};
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: encode_bench FRAMES [PASSES]\n");
    return 2;
  }
  int passes = argc > 2 ? std::atoi(argv[2]) : 5;
  std::ifstream in(argv[1], std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  collector col;
  protocol::assembler_options o;
  o.context.proto_version = 1;
  protocol::assembler a(o, col);
  col.a = &a;
  protocol::cursor c(bytes);
  while (!c.empty() && c.ok()) {
    protocol::lsn start{c.u64()};
    auto len = c.u32();
    auto b = c.bytes(len);
    if (!c.ok()) break;
    if (auto r = a.feed(start, b); !r) {
      std::fprintf(stderr, "encode_bench: %s\n", r.error().message.c_str());
      return 1;
    }
  }
  // Rebuild tuple views over the kept copies.
  std::vector<std::vector<pg::tuple_column>> before(col.changes.size()), after(col.changes.size());
  for (std::size_t i = 0; i < col.changes.size(); ++i) {
    auto& k = col.changes[i];
    for (std::size_t j = 0; j < k.before_values.size(); ++j)
      before[i].push_back({k.before_kinds[j], protocol::as_bytes(k.before_values[j])});
    for (std::size_t j = 0; j < k.after_values.size(); ++j)
      after[i].push_back({k.after_kinds[j], protocol::as_bytes(k.after_values[j])});
  }
  std::printf("events: %zu changes in %zu transactions, %d passes per format\n", col.changes.size(), col.txns.size(),
              passes);
  transform::encoder_options eo;
  eo.processing_time_ms = 1;
  std::string out;
  out.reserve(4096);
  for (auto f : transform::all_formats) {
    std::size_t bytes_out = 0, events = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int p = 0; p < passes; ++p)
      for (std::size_t i = 0; i < col.changes.size(); ++i) {
        const auto& k = col.changes[i];
        transform::change ch;
        ch.kind = k.kind;
        ch.txn = &col.txns[k.txn];
        ch.change_lsn = k.change_lsn;
        ch.index = k.index;
        ch.relation = a.relations().find(k.relation);
        ch.before_kind = k.before_kind;
        ch.before = before[i];
        ch.after = after[i];
        ch.seq = i;
        out.clear();
        if (transform::encode_change(out, ch, f, eo)) {
          bytes_out += out.size();
          ++events;
        }
      }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-14s %6.2f M events/s per core, %6.0f MB/s of JSON, %5.0f bytes/event\n", transform::to_string(f),
                events / s / 1e6, bytes_out / s / 1e6, events ? static_cast<double>(bytes_out) / events : 0.0);
  }
  return 0;
}
