#include "walgate/proxy/memory_tail.hpp"

#include <algorithm>

namespace walgate::proxy {

namespace {
constexpr std::size_t large_event = 1u << 20;
}

void memory_tail::push(const event_ptr& e, bool may_linger) {
  e->in_tail = true;
  e->accounted = e->memory();
  bytes_ += e->accounted;
  // (Held from now: the next event of its own transaction must not evict it either.)
  if (may_linger && e->accounted > budget_ / 2 && e->accounted >= large_event)
    linger_.emplace_back(e->seq, std::chrono::steady_clock::time_point::max());
  tail_.push_back(e);
}

void memory_tail::evict(std::uint64_t written) {
  const auto now = std::chrono::steady_clock::now();
  while (tail_.size() > 1 && bytes_ > budget_ && tail_.front()->end_offset <= written) {
    while (!linger_.empty() && linger_.front().first < tail_.front()->seq) linger_.pop_front();
    if (!linger_.empty() && linger_.front().first == tail_.front()->seq && now < linger_.front().second) break;
    bytes_ -= tail_.front()->accounted;
    tail_.front()->in_tail = false;
    if (tail_.front().use_count() > 1) share(tail_.front());   // a reader holds it right now
    tail_.pop_front();
  }
}

bool memory_tail::account(const logged_event& e, std::size_t bytes) {
  if (!e.in_tail) return false;
  e.accounted += bytes;
  bytes_ += bytes;
  return true;
}

void memory_tail::committed() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto& [seq, deadline] : linger_)
    if (deadline == std::chrono::steady_clock::time_point::max()) deadline = until;
}

void memory_tail::drop_from(std::uint64_t seq) {
  while (!tail_.empty() && tail_.back()->seq >= seq) {
    bytes_ -= tail_.back()->accounted;
    tail_.back()->in_tail = false;
    tail_.pop_back();
  }
  for (auto it = shared_.begin(); it != shared_.end();) it = it->first >= seq ? shared_.erase(it) : std::next(it);
  while (!linger_.empty() && linger_.back().first >= seq) linger_.pop_back();
}

void memory_tail::clear() {
  for (auto& e : tail_) e->in_tail = false;
  tail_.clear();
  bytes_ = 0;
  linger_.clear();
}

std::vector<event_ptr> memory_tail::read(std::uint64_t seq, std::size_t max) const {
  std::vector<event_ptr> out;
  if (!tail_.empty() && seq >= tail_.front()->seq) {
    const auto from = static_cast<std::size_t>(seq - tail_.front()->seq);
    if (from < tail_.size()) out.reserve(std::min(max, tail_.size() - from));   // (one allocation, not one per doubling)
    for (std::size_t i = from; i < tail_.size() && out.size() < max; ++i) out.push_back(tail_[i]);
    return out;
  }
  // Out of the tail, but still held by a reader sending it: shared (and the tail after them).
  for (std::uint64_t next = seq; out.size() < max; ++next) {
    if (!tail_.empty() && next >= tail_.front()->seq) {
      for (std::size_t i = static_cast<std::size_t>(next - tail_.front()->seq); i < tail_.size() && out.size() < max; ++i)
        out.push_back(tail_[i]);
      break;
    }
    auto it = shared_.find(next);
    auto e = it == shared_.end() ? nullptr : it->second.lock();
    if (!e) break;
    out.push_back(std::move(e));
  }
  return out;
}

void memory_tail::share(const event_ptr& e) const {
  shared_[e->seq] = e;
  // Entries of events nobody holds any more go now and then (amortized: when the map doubled).
  if (shared_.size() > 2 * shared_pruned_at_ + 1024) {
    for (auto it = shared_.begin(); it != shared_.end();) it = it->second.expired() ? shared_.erase(it) : std::next(it);
    shared_pruned_at_ = shared_.size();
  }
}

}  // namespace walgate::proxy
