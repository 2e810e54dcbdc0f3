// Server bytes of a snapshot: a COPY text row (split on its tabs, unescaped, \N) and
// pg_current_snapshot()'s text, and a timeline history file. Never a crash or a read past the input; a parsed row holds no
// more columns than allowed and views only its input or its storage; a parsed snapshot prints back to
// something that parses to the same snapshot, and its visibility test agrees with its bounds.
#include "walgate/protocol/commands.hpp"
#include "walgate/protocol/snapshot.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace walgate::protocol;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string storage, error;
  std::vector<pgoutput::tuple_column> cols;
  if (parse_copy_text_row(in, storage, cols, error)) {
    if (cols.empty() || cols.size() > pgoutput::max_columns) std::abort();
    std::size_t total = 0;
    for (const auto& c : cols) {
      if (c.kind == pgoutput::column_kind::null) continue;
      const char* p = reinterpret_cast<const char*>(c.value.data());
      auto within = [&](std::string_view where) {
        return p >= where.data() && p + c.value.size() <= where.data() + where.size();
      };
      if (!c.value.empty() && !within(storage) && !within(in)) std::abort();
      total += c.value.size();
    }
    if (total > in.size()) std::abort();   // unescaping never grows a row
  } else if (error.empty()) {
    std::abort();   // every refusal says why
  }
  if (auto s = parse_pg_snapshot(in)) {
    auto again = parse_pg_snapshot(s->to_string());
    if (!again || again->xmin != s->xmin || again->xmax != s->xmax || again->xip != s->xip) std::abort();
    for (std::uint64_t x : s->xip)
      if (s->sees(static_cast<std::uint32_t>(x)) && s->widen(static_cast<std::uint32_t>(x)) == x) std::abort();
  }
  // A timeline history file: timelines increasing, switch points not decreasing, each found.
  if (auto h = parse_timeline_history(in)) {
    for (std::size_t i = 0; i < h->size(); ++i) {
      if ((*h)[i].timeline == 0 || (i && ((*h)[i].timeline <= (*h)[i - 1].timeline ||
                                          (*h)[i].switchpoint < (*h)[i - 1].switchpoint)))
        std::abort();
      if (switchpoint_of(*h, (*h)[i].timeline) != (*h)[i].switchpoint) std::abort();
    }
  }
  return 0;
}
