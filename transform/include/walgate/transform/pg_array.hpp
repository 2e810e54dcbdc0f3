// PostgreSQL's array text form: [dimensions=]{element,element,{...},...}. Elements are bare or
// double-quoted (with backslash escapes); a bare NULL is SQL NULL.
#pragma once

#include <string>
#include <string_view>

namespace walgate::transform {

class array_visitor {
 public:
  virtual ~array_visitor() = default;
  virtual void begin_array() = 0;
  virtual void end_array() = 0;
  /// One element; value is valid only during the call (unescaped when it was quoted).
  virtual void element(std::string_view value) = 0;
  virtual void null() = 0;
};

/// MAXDIM (src/include/utils/array.h): arrays have at most 6 dimensions.
inline constexpr int max_array_dimensions = 6;

/// Parses text and calls the visitor; false (and possibly some calls already made) when the
/// text is not a well-formed array literal. Callers that must not emit partial output parse
/// twice: once with a counting visitor to validate, then for real.
bool parse_pg_array(std::string_view text, char delimiter, array_visitor& visitor);

}  // namespace walgate::transform
