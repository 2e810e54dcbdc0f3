// What both halves of the row predicates (predicate.cpp, predicate_bound.cpp) compare text with.
#pragma once

#include <cctype>
#include <string_view>

namespace walgate::proxy::predicate {

inline bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

}  // namespace walgate::proxy::predicate
