// A stream request's table and op filters applied to logged events (the fan-out's side of
// stream_request.hpp, which parses them and knows no log).
#pragma once

#include "walgate/proxy/log_reader.hpp"
#include "walgate/proxy/stream_request.hpp"

#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace walgate::proxy {

/// tables= by hash: one lookup per event, whatever the number of names (a URL of 20 KiB holds
/// a thousand). Built once per subscription.
class table_index {
 public:
  explicit table_index(const std::vector<table_pattern>& tables);
  bool has(std::string_view schema, std::string_view table) const;

 private:
  struct sv_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  struct of_schema {
    bool any = false;
    std::unordered_set<std::string, sv_hash, std::equal_to<>> tables;
  };
  std::unordered_map<std::string, of_schema, sv_hash, std::equal_to<>> schemas_;
};
/// True if the event passes the request's table and op filters (a read passes as an insert);
/// with index, tables= is looked up there (r.tables' index).
bool matches(const stream_request& r, const logged_event& e, const table_index* index = nullptr);
}  // namespace walgate::proxy
