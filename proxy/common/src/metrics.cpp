#include "walgate/proxy/metrics.hpp"

#include <stdexcept>

namespace walgate::proxy {

void metrics_registry::add(std::string name, std::string type, std::string help, collect_fn collect,
                           std::chrono::steady_clock::duration keep) {
  if (has(name)) throw std::logic_error("metric " + name + " registered twice");
  metrics_.push_back({std::move(name), std::move(type), std::move(help), std::move(collect), keep, {}, {}, false});
}

bool metrics_registry::has(const std::string& name) const {
  for (const auto& m : metrics_)
    if (m.name == name) return true;
  return false;
}

std::string metrics_registry::render(std::chrono::steady_clock::time_point now) {
  std::string out;
  std::vector<sample> samples;
  for (auto& m : metrics_) {
    out += "# HELP " + m.name + " " + m.help + "\n# TYPE " + m.name + " " + m.type + "\n";
    const bool keeps = m.keep > std::chrono::steady_clock::duration::zero();
    if (keeps && m.has_kept && now >= m.made && now - m.made < m.keep) {
      out += m.kept;   // (collected less than keep ago: not read again)
      continue;
    }
    samples.clear();
    m.collect(samples);
    const std::size_t from = out.size();
    for (const auto& s : samples) out += m.name + s.labels + " " + s.value + "\n";
    if (keeps) {
      m.kept.assign(out, from, std::string::npos);
      m.made = now;
      m.has_kept = true;
    }
  }
  return out;
}

}  // namespace walgate::proxy
