// What subscription.cpp and subscription_rows.cpp share, not for other files: the row grants'
// state of a subscription (its definition, needed complete where the subscription is made and
// destroyed), and the request's questions subscription_rows.cpp answers for the constructor
// (what the row router finds its events by, whether that finding is the whole decision) and
// for take() (whether a transaction is one its client may know of).
#pragma once

#include "walgate/proxy/policy.hpp"
#include "walgate/proxy/predicate.hpp"
#include "walgate/proxy/subscription.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace walgate::proxy {

/// A granted table's row conditions, per definition of it (table_rows, policy.hpp).
struct subscription::row_state {
  std::map<std::string, table_rows> tables;   // schema.table + definition signature
  std::vector<predicate::cell> cells;
};

namespace subscription_rows {

// (Defined, and described, in subscription_rows.cpp.)
/// What r's events can be found by in the row router; nullopt: not by equality.
std::optional<std::vector<row_router::interest>> interests_of(const stream_request& r);
/// The router's finding is the whole decision for r.
bool router_decides(const stream_request& r, const std::vector<row_router::interest>& interests);
/// empty_transactions=true: whether e makes its transaction one the client of r may know of.
bool known_to(const stream_request& r, const logged_event& e, std::string_view prefix);

}  // namespace subscription_rows

}  // namespace walgate::proxy
