// The event log's memory: the newest events (with what readers attached to them) within a byte
// budget, so that live readers share them instead of reading the file; and, weakly, events out
// of it that a reader still holds, so that other readers share those too. Single-threaded.
#pragma once

#include "walgate/proxy/log_reader.hpp"

#include <chrono>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

namespace walgate::proxy {

class memory_tail {
 public:
  explicit memory_tail(std::size_t budget) : budget_(budget) {}

  /// A just-appended event, counted at its memory(). One of 1 MiB or more and larger than half
  /// the budget lingers (with what follows it) until 5 s after its transaction commits, even
  /// over the budget, so that the readers reading live take it from memory.
  void push(const event_ptr& e, bool may_linger = true);
  /// Evicts the oldest events past the budget — never one ending after `written` (not in the
  /// file yet: a reader behind the tail must find it there), nor a lingering one.
  void evict(std::uint64_t written);
  /// bytes were just attached to e (logged_event::attached): counted if e is here (true: evict
  /// may be due).
  bool account(const logged_event& e, std::size_t bytes);
  /// The transaction being appended committed: its lingering events' 5 s start.
  void committed();
  /// Drops the events from seq on (a transaction cut off before its end).
  void drop_from(std::uint64_t seq);
  /// Drops everything (a prefill that did not reach the head).
  void clear();

  /// From memory, up to max events from seq on: the tail, or events out of it that a reader
  /// still holds (and the tail after them). Empty when seq is in neither.
  std::vector<event_ptr> read(std::uint64_t seq, std::size_t max) const;
  /// The event seq when it is in the tail (not one out of it that a reader holds); null if not.
  event_ptr at(std::uint64_t seq) const {
    if (tail_.empty() || seq < tail_.front()->seq || seq - tail_.front()->seq >= tail_.size()) return nullptr;
    return tail_[static_cast<std::size_t>(seq - tail_.front()->seq)];
  }
  /// Remembers e weakly: read() finds it while someone holds it.
  void share(const event_ptr& e) const;

  const std::deque<event_ptr>& events() const { return tail_; }
  bool empty() const { return tail_.empty(); }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t budget_;
  std::deque<event_ptr> tail_;
  std::size_t bytes_ = 0;
  mutable std::unordered_map<std::uint64_t, std::weak_ptr<const logged_event>> shared_;
  mutable std::size_t shared_pruned_at_ = 0;
  std::deque<std::pair<std::uint64_t, std::chrono::steady_clock::time_point>> linger_;   // (seq, until; max while uncommitted)
};

}  // namespace walgate::proxy
