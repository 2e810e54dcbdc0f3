#include "walgate/transform/pg_array.hpp"

namespace walgate::transform {

// array    := [ dims '=' ] list
// dims     := ( '[' int ':' int ']' )+
// list     := '{' [ item ( delim item )* ] '}'
// item     := list | quoted | bare
// quoted   := '"' ( '\' any | [^"\\] )* '"'
// bare     := [^{}",\s delim]+ ;  "NULL" (any case) is SQL NULL
bool parse_pg_array(std::string_view text, char delim, array_visitor& v) {
  std::size_t i = 0, n = text.size();
  auto skip_space = [&] {
    while (i < n && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')) ++i;
  };
  if (i < n && text[i] == '[') {
    auto eq = text.find('=');
    if (eq == std::string_view::npos) return false;
    i = eq + 1;
  }
  std::string scratch;
  int depth = 0;
  bool expect_item = true;   // after '{' or a delimiter
  bool any_open = false;
  while (i < n) {
    skip_space();
    if (i >= n) break;
    char c = text[i];
    if (c == '{') {
      if (!expect_item || depth >= max_array_dimensions) return false;
      ++depth;
      any_open = true;
      v.begin_array();
      ++i;
      expect_item = true;
      continue;
    }
    if (c == '}') {
      if (depth == 0) return false;
      --depth;
      v.end_array();
      ++i;
      expect_item = false;
      if (depth == 0) {
        skip_space();
        return i == n;
      }
      continue;
    }
    if (c == delim) {
      if (expect_item || depth == 0) return false;
      ++i;
      expect_item = true;
      continue;
    }
    if (!expect_item || depth == 0) return false;
    if (c == '"') {
      scratch.clear();
      ++i;
      bool closed = false;
      while (i < n) {
        char d = text[i++];
        if (d == '\\') {
          if (i >= n) return false;
          scratch.push_back(text[i++]);
        } else if (d == '"') {
          closed = true;
          break;
        } else {
          scratch.push_back(d);
        }
      }
      if (!closed) return false;
      v.element(scratch);
    } else {
      std::size_t start = i;
      while (i < n && text[i] != delim && text[i] != '}' && text[i] != '{' && text[i] != '"') ++i;
      std::size_t end = i;
      while (end > start && (text[end - 1] == ' ' || text[end - 1] == '\t')) --end;
      std::string_view item = text.substr(start, end - start);
      if (item.empty()) return false;
      if (item.size() == 4 && (item[0] | 0x20) == 'n' && (item[1] | 0x20) == 'u' && (item[2] | 0x20) == 'l' &&
          (item[3] | 0x20) == 'l')
        v.null();
      else
        v.element(item);
    }
    expect_item = false;
  }
  (void)any_open;
  return false;   // ran out of input before the outer '}'
}

}  // namespace walgate::transform
