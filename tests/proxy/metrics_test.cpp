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

TEST_CASE("metrics registry: a metric registered with keep is collected at most once in that time, the others every time") {
  metrics_registry r;
  std::uint64_t clients = 1, reads = 0, total = 10;
  r.add_value("walgate_c_total", "counter", "Cs.", [&] { return total; });
  r.add("walgate_per_client", "gauge", "One per client.",
        [&](std::vector<metrics_registry::sample>& out) {
          ++reads;
          for (std::uint64_t i = 0; i < clients; ++i) out.push_back({"{client=\"" + std::to_string(i) + "\"}", "0"});
        },
        std::chrono::seconds(1));
  const auto t0 = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  CHECK(r.render(t0).find("walgate_per_client{client=\"0\"} 0\n") != std::string::npos);
  CHECK(reads == 1);
  // A hundred scrapes within the second: one pass over the clients; the counter read each time.
  clients = 3;
  for (int i = 0; i < 100; ++i) {
    total = 11 + static_cast<std::uint64_t>(i);
    const auto text = r.render(t0 + std::chrono::milliseconds(10 * i));
    CHECK(text.find("walgate_c_total " + std::to_string(total) + "\n") != std::string::npos);
    CHECK(text.find("walgate_per_client{client=\"2\"}") == std::string::npos);
    CHECK(text.find("# HELP walgate_per_client One per client.\n# TYPE walgate_per_client gauge\n") != std::string::npos);
  }
  CHECK(reads == 1);
  // A second after: collected again.
  CHECK(r.render(t0 + std::chrono::seconds(1)).find("walgate_per_client{client=\"2\"} 0\n") != std::string::npos);
  CHECK(reads == 2);
  // Without keep: at every rendering.
  std::uint64_t plain_reads = 0;
  r.add("walgate_plain", "gauge", "Read each time.", [&](std::vector<metrics_registry::sample>& out) {
    ++plain_reads;
    out.push_back({"", "1"});
  });
  r.render(t0 + std::chrono::seconds(1));
  r.render(t0 + std::chrono::seconds(1));
  CHECK(plain_reads == 2);
}
