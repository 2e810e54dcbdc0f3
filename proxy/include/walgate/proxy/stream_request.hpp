// What a stream client asks for (/v1/stream and /v1/ws parameters), parsed from untrusted
// query strings; no Beast (the fuzz target parses them too).
#pragma once

#include "walgate/proxy/log_reader.hpp"
#include "walgate/transform/formats.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace walgate::proxy {

/// Parsed /v1/stream and /v1/ws parameters (exposed for tests and the fuzz target).
struct stream_request {
  transform::format fmt = transform::format::native;
  std::vector<std::pair<std::string, std::string>> tables;   ///< (schema, table); "*" table = any
  unsigned ops = 0;                                          ///< bit per transform::op char; 0 = all
  std::optional<transform::event_id> from;
  bool tombstones = false;                                   ///< debezium: a null line after each delete
  bool compact = false;                                      ///< pgoutput2json compact mode
};
struct request_error {
  std::string parameter, message;
};
/// Parses the query string of a stream request ("format=native&tables=public.*&from=0/16B3748:0").
std::optional<stream_request> parse_stream_query(std::string_view target, request_error& error);
/// True if the event passes the request's table and op filters.
bool matches(const stream_request& r, const logged_event& e);
}  // namespace walgate::proxy
