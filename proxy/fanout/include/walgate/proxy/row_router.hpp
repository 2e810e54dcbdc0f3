// An index of clients by the values their row grants hold (issue: 10,000 clients of 10,000
// tenants must not make each event cost 10,000 predicate evaluations). A subscription whose
// rows are all found by equality — every grant of every table it can see limits rows with
// `column = value` or `column in (…)` (alone or in an `and`) — registers those values here once
// it has caught up; then each event visible from that point is looked at once, by the router:
// its table's indexed column read (new and old row), and its position queued for exactly the
// subscriptions holding that value (a truncate: every subscription of its table). The
// subscription then reads only its queued events, deciding each as before (the index finds a
// superset; the grant still decides) — or, when the router's finding is the whole decision
// (subscription_rows.cpp's router_decides: one grant per routed table, its rows an equality alone, no
// column list), taking each as found (found: as it is, moved in, moved out). Values are compared by predicate::equality_key; a column
// of a type without one (floats, instants…) sends its subscriptions back to reading every event.
// Single-threaded (the event loop). No Asio.
#pragma once

#include "walgate/proxy/encodings.hpp"
#include "walgate/proxy/log_reader.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace walgate::proxy {

class row_router {
 public:
  /// What a subscription is found by: a table and column, and the values of it it holds.
  struct interest {
    std::string schema, table, column;
    std::vector<std::string> values;
  };
  /// A registered subscription: given the seqs of its candidate events, in order (each once),
  /// or told to read every event again from seq on (its index cannot be kept; for_good: its
  /// column cannot be indexed, it is not to come back).
  /// What the router found of an event for a target, from the indexed column's values: the new
  /// row holds one of its values (and the old one, for an update with an old row), only the new
  /// row (a row moved in), only the old one (moved out); unknown when it could not tell (a
  /// truncate, an unchanged TOASTed value, a column outside the replica identity, a record it
  /// could not read): the subscription decides from the event, as it always may.
  enum class found : std::uint8_t { unknown = 0, both = 1, moved_in = 2, moved_out = 3 };
  class target {
   public:
    virtual void routed(std::uint64_t seq, found how) = 0;
    virtual void unroutable(std::uint64_t from_seq, bool for_good) = 0;
    /// Checks its grants against e's table definition now (the router calls it once per target
    /// and definition, at the first event of the table it looks at): true when they hold, so
    /// the target can be found by its values; false when they cannot be served, so it is given
    /// the event and ends there as a subscription reading every event would.
    virtual bool check(const logged_event& e, const protocol::pgoutput::cached_relation& r) {
      (void)e;
      (void)r;
      return true;
    }

   protected:
    ~target() = default;
  };

  row_router(const log_reader& log, encoding_cache& encodings) : log_(log), encodings_(encodings) {}
  /// Looks at every event made visible since the last call (the server calls it before waking
  /// its clients). Events before routed() have been looked at.
  void route();
  std::uint64_t routed() const { return next_; }
  /// t is found by these interests from routed() on.
  void add(target* t, const std::vector<interest>& interests);
  void remove(target* t);
  std::size_t targets() const { return targets_; }
  std::uint64_t events_routed() const { return events_; }
  std::uint64_t deliveries_routed() const { return queued_; }
  /// A subscription took an event as found, without deciding it again.
  void count_decided() { ++decided_; }
  std::uint64_t decided() const { return decided_; }

  /// A fingerprint of a table definition as a grant is checked against it (columns, their types
  /// and key flags, the replica identity; subscription_rows.cpp's rows_of keys it the same way, with the table's name).
  static std::uint64_t definition_of(const protocol::pgoutput::cached_relation& r);

 private:
  struct index {
    std::string schema, table, column;
    std::vector<std::pair<target*, std::vector<std::string>>> subs;   // the values as written
    std::uint32_t type_oid = 0;                                       // keyed for this type
    bool keyed = false;
    std::unordered_map<std::string, std::vector<target*>> by_key;
    /// A subscriber is checked against the table's definition (target::check) at the first
    /// event of each definition the router looks at, whatever its values — on the spot, not when
    /// the subscriber next reads (it may read later than the router routes: it would be given
    /// every event until then). One whose grants cannot be served is given every event of the
    /// table, so that it ends at the first, not at the first of its own rows, or never.
    /// untold: the subscribers not checked yet; refused: those checked that cannot be served
    /// (given every event of the table); announced: the definition.
    std::vector<target*> untold, refused;
    std::uint64_t announced = 0;
  };
  void kick_all(std::uint64_t from_seq);

  const log_reader& log_;
  encoding_cache& encodings_;
  std::uint64_t next_ = 0;
  bool started_ = false;
  std::map<std::string, std::vector<std::unique_ptr<index>>> by_table_;   // schema \0 table
  std::size_t targets_ = 0;
  std::uint64_t events_ = 0, queued_ = 0, decided_ = 0;
  std::vector<std::pair<target*, unsigned>> seen_;   // (targets given the current event: how found)
  /// Where each target is in seen_, stamped with the event it was given (events_): finding a
  /// target there is one lookup, not a search of seen_ (an event given to every one of k
  /// subscriptions of a table — a truncate, a row without its indexed value — was k² steps).
  struct seen_at {
    std::uint64_t event = 0;
    std::size_t pos = 0;
  };
  std::unordered_map<target*, seen_at> seen_index_;
};

}  // namespace walgate::proxy
