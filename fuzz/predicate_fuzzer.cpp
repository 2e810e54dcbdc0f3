// The policy's row predicates (and a client's where=): untrusted text through the parser; what
// parses is written back and read again to the same text, instantiated with claims, bound to a
// relation and evaluated on rows of every kind of value. Never a crash, never an unbounded
// allocation or recursion.
#include "walgate/proxy/predicate.hpp"

#include <boost/json/src.hpp>   // header-only Boost.JSON: the fuzz build links no Boost library

#include <cstddef>
#include <cstdint>
#include <cstdlib>

using namespace walgate::proxy::predicate;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string error;
  auto n = parse(in, error);
  if (!n) {
    if (error.empty()) std::abort();   // every refusal says why
    return 0;
  }
  // Written back, it reads the same (when the text fits the limit: quoting and spaces can make
  // it longer than what was parsed; never deeper).
  const std::string text = to_string(*n);
  if (text.size() <= max_text) {
    auto again = parse(text, error);
    if (!again || to_string(*again) != text) std::abort();
  }
  static const boost::json::object claims =
      boost::json::parse(R"({"tenant":"acme","orgs":[1,2,"3"],"n":7.5,"admin":true,"app":{"t":"x"}})").as_object();
  static const std::vector<column_info> cols = {{"a", 23}, {"b", 1700}, {"c", 701}, {"d", 16}, {"e", 1184},
                                                {"f", 1082}, {"g", 1042}, {"h", 2950}, {"i", 25}, {"tenant", 25}};
  auto inst = instantiate(*n, claims);
  auto b = bind_to(inst, cols, error);
  if (!b) {
    if (error.rfind("no column ", 0) != 0) std::abort();   // (instantiate leaves no claim)
    return 0;
  }
  static const std::vector<std::vector<cell>> rows = {
      {{cell::state::text, "10"}, {cell::state::text, "1.50"}, {cell::state::text, "NaN"}, {cell::state::text, "t"},
       {cell::state::text, "2026-01-01 00:00:00+00"}, {cell::state::text, "infinity"}, {cell::state::text, "ab  "},
       {cell::state::text, "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"}, {cell::state::text, "x"}, {cell::state::text, "acme"}},
      {{cell::state::null, {}}, {cell::state::unchanged, {}}, {cell::state::text, "-1e300"}, {cell::state::text, "maybe"},
       {cell::state::text, "not a time"}, {cell::state::text, "1999-12-31"}, {cell::state::null, {}},
       {cell::state::unchanged, {}}, {cell::state::text, ""}, {cell::state::null, {}}},
      {}};
  for (const auto& r : rows) (void)b->evaluate(r);
  return 0;
}
