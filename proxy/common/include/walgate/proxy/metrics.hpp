// A small registry of Prometheus metrics (text exposition format 0.0.4): each part registers
// its own metrics — the gateway its stream figures, the log its size, the server its clients —
// with a function that reads them when /metrics is asked for; a metric of one sample per client
// is kept for a while (N scrapes a second cost one pass over the clients). Single-threaded.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace walgate::proxy {

class metrics_registry {
 public:
  struct sample {
    std::string labels;   ///< "" or {name="value",…}
    std::string value;
  };
  using collect_fn = std::function<void(std::vector<sample>&)>;

  /// A metric of labelled samples (type: "counter" or "gauge"). keep (not 0): its samples are
  /// collected at most once in that time, their text reused meanwhile (for a metric of one
  /// sample per client: the other metrics are read at every rendering).
  void add(std::string name, std::string type, std::string help, collect_fn collect,
           std::chrono::steady_clock::duration keep = {});
  /// A metric of one value, read by value() (any number type).
  template <class F>
  void add_value(std::string name, std::string type, std::string help, F value) {
    add(std::move(name), std::move(type), std::move(help), [value](std::vector<sample>& out) {
      std::ostringstream o;
      o << value();
      out.push_back({"", o.str()});
    });
  }
  /// Every metric, in the order registered; now: what a kept metric's age is measured from.
  std::string render(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());
  bool has(const std::string& name) const;

 private:
  struct metric {
    std::string name, type, help;
    collect_fn collect;
    std::chrono::steady_clock::duration keep{};
    std::string kept;                               // its samples' text, when keep is set
    std::chrono::steady_clock::time_point made{};   // when kept was collected
    bool has_kept = false;
  };
  std::vector<metric> metrics_;
};

}  // namespace walgate::proxy
