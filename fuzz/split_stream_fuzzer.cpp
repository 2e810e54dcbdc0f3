// Differential: a CopyData stream decoded whole, and decoded with the bytes arriving in pieces
// cut at input-chosen offsets, must give the same transactions. Input: Byte1 number of cuts n,
// n × Int16 cut offsets, then the stream (backend messages).
#include "walgate/protocol/assembler.hpp"
#include "walgate/protocol/replication.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

using namespace walgate::protocol;

namespace {
struct log_handler final : transaction_handler {
  std::string log;
  boost::system::error_code on_begin(const transaction_info& t) override {
    log += "B" + std::to_string(t.xid) + t.commit_lsn.to_string();
    return {};
  }
  boost::system::error_code on_change(const transaction_info&, const change_event& e) override {
    log += "c" + std::to_string(e.index) + e.change_lsn.to_string() + pgoutput::tag_of(*e.message);
    return {};
  }
  boost::system::error_code on_commit(const transaction_info& t) override {
    log += "C" + t.end_lsn.to_string();
    return {};
  }
};

/// Accumulates pieces and processes every complete message, as the connection does.
std::string run(const std::string& stream, const std::vector<std::size_t>& cuts) {
  log_handler h;
  assembler_options o;
  o.context.proto_version = 4;
  o.memory_limit = 1024;
  assembler a(o, h);
  std::string buffer;
  std::size_t from = 0;
  bool stopped = false;
  auto pieces = cuts;
  pieces.push_back(stream.size());
  for (std::size_t to : pieces) {
    buffer.append(stream, from, to - from);
    from = to;
    while (!stopped) {
      auto r = split_backend_message(as_bytes(buffer), 1 << 20);
      if (r.status == split_status::need_more) break;
      if (r.status == split_status::error) {
        h.log += "!frame";
        stopped = true;
        break;
      }
      if (r.message.tag == 'd') {
        auto p = parse_copy_payload(r.message.body);
        if (!p) {
          h.log += "!payload";
          stopped = true;
        } else if (p->type == copy_payload::kind::xlog_data) {
          if (auto f = a.feed(p->xlog.wal_start, p->xlog.data); !f) {
            h.log += "!" + f.error().message;
            stopped = true;
          }
        }
      }
      buffer.erase(0, r.message.size);
    }
  }
  return h.log;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::size_t n = data[0] % 16;
  if (size < 1 + 2 * n) return 0;
  std::string stream(reinterpret_cast<const char*>(data + 1 + 2 * n), size - 1 - 2 * n);
  std::vector<std::size_t> cuts;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t off = (std::size_t{data[1 + 2 * i]} << 8 | data[2 + 2 * i]);
    cuts.push_back(stream.empty() ? 0 : off % (stream.size() + 1));
  }
  std::sort(cuts.begin(), cuts.end());
  if (run(stream, {}) != run(stream, cuts)) std::abort();
  return 0;
}
