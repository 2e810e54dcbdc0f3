#include "walgate/proxy/metrics.hpp"

#include <doctest/doctest.h>

#include <stdexcept>

using walgate::proxy::metrics_registry;

TEST_CASE("metrics registry: each part's metrics in Prometheus text format, read when rendered") {
  metrics_registry r;
  std::uint64_t n = 1;
  r.add_value("walgate_a_total", "counter", "As counted.", [&] { return n; });
  r.add("walgate_b", "gauge", "Bs by kind.", [](std::vector<metrics_registry::sample>& out) {
    out.push_back({"{kind=\"x\"}", "2"});
    out.push_back({"{kind=\"y\"}", "0.5"});
  });
  n = 7;
  CHECK(r.render() ==
        "# HELP walgate_a_total As counted.\n# TYPE walgate_a_total counter\nwalgate_a_total 7\n"
        "# HELP walgate_b Bs by kind.\n# TYPE walgate_b gauge\nwalgate_b{kind=\"x\"} 2\nwalgate_b{kind=\"y\"} 0.5\n");
  CHECK(r.has("walgate_b"));
  CHECK_THROWS_AS(r.add_value("walgate_b", "gauge", "again", [] { return 0; }), std::logic_error);
}
