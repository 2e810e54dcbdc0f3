// Event records (the event log's bytes, trusted no more than the network's): read_record on
// arbitrary bytes never crashes; reading into a view that held another record first gives the
// same result as a fresh view (same error or same encodings in every format), and a record read
// back writes the same bytes through record_writer as through write_record.
#include "walgate/transform/formats.hpp"
#include "walgate/transform/record.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

using namespace walgate;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::size_t split = size > 1 ? 1 + data[0] * (size - 1) / 256 : 1;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  auto first = protocol::bytes_view(bytes + 1, split - 1);
  auto second = protocol::bytes_view(bytes + split, size - split);
  transform::record_view reused;
  (void)transform::read_record(first, reused);
  auto fresh = transform::read_record(second);
  auto again = transform::read_record(second, reused);
  if (fresh.has_value() != again.has_value()) std::abort();
  if (!fresh) return 0;
  transform::encoder_options o;
  o.processing_time_ms = 1;
  for (auto f : {transform::format::native, transform::format::debezium, transform::format::pgoutput2json,
                 transform::format::waltail, transform::format::wal2json}) {
    std::string a, b;
    bool ea = transform::encode_change(a, (*fresh)->get(), f, o);
    bool eb = transform::encode_change(b, reused.get(), f, o);
    if (ea != eb || a != b) std::abort();
  }
  std::string w1, w2;
  transform::write_record(w1, reused.get());
  transform::record_writer writer;
  writer.write(w2, reused.get());
  if (w1 != w2) std::abort();
  return 0;
}
