// Counts the heap allocations made on this thread while a counting scope is open (the test
// binary that links alloc_counter.cpp replaces the global operator new; nothing else changes).
#pragma once

#include <cstddef>

namespace walgate::test {

/// Allocations on this thread since the scope opened.
class counting_allocations {
 public:
  counting_allocations();
  ~counting_allocations();
  counting_allocations(const counting_allocations&) = delete;
  counting_allocations& operator=(const counting_allocations&) = delete;
  std::size_t count() const;
};

}  // namespace walgate::test
