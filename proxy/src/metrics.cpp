#include "walgate/proxy/metrics.hpp"

#include <stdexcept>

namespace walgate::proxy {

void metrics_registry::add(std::string name, std::string type, std::string help, collect_fn collect) {
  if (has(name)) throw std::logic_error("metric " + name + " registered twice");
  metrics_.push_back({std::move(name), std::move(type), std::move(help), std::move(collect)});
}

bool metrics_registry::has(const std::string& name) const {
  for (const auto& m : metrics_)
    if (m.name == name) return true;
  return false;
}

std::string metrics_registry::render() const {
  std::string out;
  std::vector<sample> samples;
  for (const auto& m : metrics_) {
    samples.clear();
    m.collect(samples);
    out += "# HELP " + m.name + " " + m.help + "\n# TYPE " + m.name + " " + m.type + "\n";
    for (const auto& s : samples) out += m.name + s.labels + " " + s.value + "\n";
  }
  return out;
}

}  // namespace walgate::proxy
