// Limits on streams per subject and address, failed authentications per address, and the
// refusal log (proxy/http/src/admission.cpp), with a clock of the test's own.
#include "admission.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace walgate::proxy;
using clock_type = std::chrono::steady_clock;

TEST_CASE("admission: a peer's address is its IPv4 address, or its IPv6 /64") {
  std::array<unsigned char, 16> b{};
  b[0] = 192, b[1] = 168, b[2] = 0, b[3] = 7;
  CHECK(peer_key(false, b) == "192.168.0.7");
  std::array<unsigned char, 16> mapped{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3};
  CHECK(peer_key(true, mapped) == "10.1.2.3");
  std::array<unsigned char, 16> v6{0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0x2a, 9, 9, 9, 9, 9, 9, 9, 9};
  CHECK(peer_key(true, v6) == "2001:db8:1:2a::/64");
  v6[15] = 1;   // another address of the same /64: the same key
  CHECK(peer_key(true, v6) == "2001:db8:1:2a::/64");
}

TEST_CASE("admission: streams per subject and per address, given back when they go") {
  admission a(admission::options{2, 3, 0});
  admission::reason why{};
  std::string message;
  auto s1 = a.take("alice", "10.0.0.1", why, message);
  auto s2 = a.take("alice", "10.0.0.1", why, message);
  REQUIRE(s1);
  REQUIRE(s2);
  CHECK_FALSE(a.take("alice", "10.0.0.2", why, message));
  CHECK(why == admission::reason::subject_limit);
  CHECK(message.find("--max-streams-per-subject") != std::string::npos);
  auto s3 = a.take("bob", "10.0.0.1", why, message);
  REQUIRE(s3);
  CHECK_FALSE(a.take("carol", "10.0.0.1", why, message));
  CHECK(why == admission::reason::address_limit);
  CHECK(a.take("", "10.0.0.2", why, message));   // (no subject: only the address counts)
  CHECK(a.streams_of_subject("alice") == 2);
  s1.reset();
  CHECK(a.streams_of_subject("alice") == 1);
  CHECK(a.streams_of_address("10.0.0.1") == 2);
  auto moved = std::move(*s2);   // a moved slot is given back once
  s2.reset();
  CHECK(a.streams_of_subject("alice") == 1);
  { auto gone = std::move(moved); }
  CHECK(a.streams_of_subject("alice") == 0);
  CHECK(a.take("alice", "10.0.0.1", why, message));
  // No limits: nothing is counted.
  admission none;
  auto x = none.take("alice", "10.0.0.1", why, message);
  REQUIRE(x);
  CHECK(none.streams_of_subject("alice") == 0);
}

TEST_CASE("admission: failed authentications of an address in a window, then a wait until it ends") {
  admission::options o;
  o.auth_failures = 3;
  o.window = std::chrono::seconds(60);
  o.max_tracked = 2;
  admission a(o);
  const auto t0 = clock_type::now();
  for (int i = 0; i < 3; ++i) {
    CHECK_FALSE(a.blocked("10.0.0.1", t0));
    a.failed("10.0.0.1", t0 + std::chrono::seconds(i));
  }
  auto wait = a.blocked("10.0.0.1", t0 + std::chrono::seconds(10));
  REQUIRE(wait);
  CHECK(*wait == 50);
  CHECK(a.blocked("10.0.0.1", t0 + std::chrono::milliseconds(59'001)) == 1);
  CHECK_FALSE(a.blocked("10.0.0.1", t0 + std::chrono::seconds(60)));
  CHECK_FALSE(a.blocked("10.0.0.2", t0 + std::chrono::seconds(10)));   // another address
  // A new window after the last one ended: counting starts again.
  a.failed("10.0.0.1", t0 + std::chrono::seconds(61));
  CHECK_FALSE(a.blocked("10.0.0.1", t0 + std::chrono::seconds(62)));
  // Bounded: a third address is not tracked while two windows run; once they end, it is.
  a.failed("10.0.0.2", t0 + std::chrono::seconds(62));
  for (int i = 0; i < 3; ++i) a.failed("10.0.0.3", t0 + std::chrono::seconds(62));
  CHECK_FALSE(a.blocked("10.0.0.3", t0 + std::chrono::seconds(63)));
  for (int i = 0; i < 3; ++i) a.failed("10.0.0.3", t0 + std::chrono::seconds(200));
  CHECK(a.blocked("10.0.0.3", t0 + std::chrono::seconds(201)) == 59);
}

TEST_CASE("admission: genuine tokens refused for their claims, counted apart from failures with the same limit and window") {
  admission::options o;
  o.auth_failures = 3;
  o.window = std::chrono::seconds(60);
  admission a(o);
  const auto t0 = clock_type::now();
  // Two of each from one address: neither count is at the limit, and they do not add up.
  for (int i = 0; i < 2; ++i) {
    a.failed("10.0.0.1", t0);
    a.claims_refused("10.0.0.1", t0 + std::chrono::seconds(i));
  }
  CHECK_FALSE(a.blocked("10.0.0.1", t0 + std::chrono::seconds(2)));
  // A third expired token: the address waits until the window of its first one ends, and the
  // count that is over is named.
  a.claims_refused("10.0.0.1", t0 + std::chrono::seconds(5));
  auto which = admission::count_kind::invalid_tokens;
  auto wait = a.blocked("10.0.0.1", t0 + std::chrono::seconds(10), &which);
  REQUIRE(wait);
  CHECK(*wait == 50);
  CHECK(which == admission::count_kind::refused_claims);
  CHECK(a.blocked("10.0.0.1", t0 + std::chrono::milliseconds(59'001)) == 1);
  CHECK_FALSE(a.blocked("10.0.0.1", t0 + std::chrono::seconds(60)));
  CHECK_FALSE(a.blocked("10.0.0.2", t0 + std::chrono::seconds(10)));   // another address
  // Both counts over: the longer wait, and its count.
  for (int i = 0; i < 3; ++i) {
    a.failed("10.0.0.3", t0);
    a.claims_refused("10.0.0.3", t0 + std::chrono::seconds(30));
    a.claims_refused("10.0.0.4", t0);
    a.failed("10.0.0.4", t0 + std::chrono::seconds(30));
  }
  CHECK(a.blocked("10.0.0.3", t0 + std::chrono::seconds(40), &which) == 50);
  CHECK(which == admission::count_kind::refused_claims);
  CHECK(a.blocked("10.0.0.4", t0 + std::chrono::seconds(40), &which) == 50);
  CHECK(which == admission::count_kind::invalid_tokens);
  CHECK(a.blocked("10.0.0.3", t0 + std::chrono::seconds(70), &which) == 20);   // (the failures' window is over)
  CHECK(which == admission::count_kind::refused_claims);
  // No limit: nothing is counted.
  admission none;
  for (int i = 0; i < 10; ++i) none.claims_refused("10.0.0.1", t0);
  CHECK_FALSE(none.blocked("10.0.0.1", t0));
}

TEST_CASE("admission: one log line per refusal, at most log_per_second a second, then one counting the rest") {
  admission::options o;
  o.log_per_second = 2;
  admission a(o);
  std::vector<std::string> lines;
  a.set_log([&](const std::string& l) { lines.push_back(l); });
  const auto t0 = clock_type::now();
  a.refused(admission::reason::forbidden, 403, "/v1/stream", "10.0.0.1", "alice\nforged line", "table x is not granted", t0);
  a.refused(admission::reason::invalid_token, 401, "/v1/ws", "10.0.0.1", "", "invalid token: expired", t0);
  for (int i = 0; i < 5; ++i) a.refused(admission::reason::invalid_token, 401, "/v1/ws", "10.0.0.1", "", "x", t0);
  a.refused(admission::reason::no_token, 401, "/v1/stream", "10.0.0.2", "", "a bearer token is required", t0 + std::chrono::seconds(2));
  CHECK(lines == std::vector<std::string>{
                     "refused 403 /v1/stream from 10.0.0.1 (subject alice?forged line): table x is not granted",
                     "refused 401 /v1/ws from 10.0.0.1: invalid token: expired",
                     "refused: 5 more request(s) in the last second, not logged one by one",
                     "refused 401 /v1/stream from 10.0.0.2: a bearer token is required"});
  CHECK(a.refusals(admission::reason::invalid_token) == 6);
  CHECK(a.refusals(admission::reason::forbidden) == 1);
  CHECK(a.refusals(admission::reason::no_token) == 1);
}

TEST_CASE("failure_window alone (the replication side's count): no limit counts nothing; a limit counts each address apart") {
  const auto t0 = clock_type::now();
  failure_window none;
  for (int i = 0; i < 100; ++i) none.count("10.0.0.1", t0);
  CHECK(none.tracked() == 0);
  CHECK_FALSE(none.wait("10.0.0.1", t0));
  failure_window w({2, std::chrono::seconds(60), 10});
  w.count("10.0.0.1", t0);
  CHECK_FALSE(w.wait("10.0.0.1", t0));
  w.count("10.0.0.1", t0 + std::chrono::seconds(1));
  CHECK(w.wait("10.0.0.1", t0 + std::chrono::seconds(1)) == 59);
  CHECK_FALSE(w.wait("10.0.0.2", t0 + std::chrono::seconds(1)));
  CHECK(w.tracked() == 1);
}
