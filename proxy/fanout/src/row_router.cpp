#include "walgate/proxy/row_router.hpp"

#include "walgate/proxy/predicate.hpp"

#include <algorithm>

namespace walgate::proxy {

void row_router::add(target* t, const std::vector<interest>& interests) {
  if (!started_) {
    next_ = log_.visible_seq();
    started_ = true;
  }
  for (const auto& in : interests) {
    auto& list = by_table_[in.schema + '\0' + in.table];
    index* ix = nullptr;
    for (auto& x : list)
      if (x->column == in.column) ix = x.get();
    if (!ix) {
      list.push_back(std::make_unique<index>());
      ix = list.back().get();
      ix->schema = in.schema;
      ix->table = in.table;
      ix->column = in.column;
    }
    ix->subs.emplace_back(t, in.values);
    ix->keyed = false;   // (keyed again at its next event)
    ix->untold.push_back(t);   // (given the table's events until it has checked their definition)
  }
  ++targets_;
}

void row_router::remove(target* t) {
  bool found = false;
  for (auto it = by_table_.begin(); it != by_table_.end();) {
    auto& list = it->second;
    for (auto& ix : list) {
      const auto before = ix->subs.size();
      std::erase_if(ix->subs, [t](const auto& s) { return s.first == t; });
      std::erase(ix->untold, t);
      std::erase(ix->refused, t);
      if (ix->subs.size() != before) {
        found = true;
        ix->keyed = false;
      }
    }
    std::erase_if(list, [](const auto& ix) { return ix->subs.empty(); });
    it = list.empty() ? by_table_.erase(it) : std::next(it);
  }
  if (found) --targets_;
  seen_index_.erase(t);
}

std::uint64_t row_router::definition_of(const protocol::pgoutput::cached_relation& r) {
  std::uint64_t h = 1469598103934665603ull;   // FNV-1a
  auto mix = [&h](std::string_view bytes) {
    for (unsigned char ch : bytes) {
      h ^= ch;
      h *= 1099511628211ull;
    }
  };
  // (per routed event: no allocation)
  for (const auto& col : r.columns) {
    mix(col.name);
    char type[6] = {'\x1f', static_cast<char>(col.type_oid), static_cast<char>(col.type_oid >> 8),
                    static_cast<char>(col.type_oid >> 16), static_cast<char>(col.type_oid >> 24), col.key ? 'k' : '-'};
    mix(std::string_view(type, sizeof type));
  }
  mix(std::string_view(&r.replica_identity, 1));
  return h | 1;   // (never 0: 0 is "none told yet")
}

void row_router::kick_all(std::uint64_t from_seq) {
  std::vector<target*> all;
  for (auto& [k, list] : by_table_)
    for (auto& ix : list)
      for (auto& [t, v] : ix->subs) all.push_back(t);
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  by_table_.clear();   // (every target leaves: no search per target)
  seen_index_.clear();
  targets_ = 0;
  for (auto* t : all) t->unroutable(from_seq, false);
}

void row_router::route() {
  const std::uint64_t visible = log_.visible_seq();
  if (by_table_.empty()) {   // nobody to route for: nothing to look at
    next_ = visible;
    started_ = true;
    return;
  }
  namespace pg = protocol::pgoutput;
  while (next_ < visible && !by_table_.empty()) {
    std::string error;
    bool fetching = false;
    // Just made visible: in the log's memory. (A transaction larger than that is not read here,
    // on the event loop: its subscriptions read it themselves, as any other reader.)
    auto batch = log_.read(next_, 4096, 16u << 20, &error, &fetching, 0);
    if (batch.empty()) {
      kick_all(next_);
      next_ = visible;
      return;
    }
    for (const auto& e : batch) {
      if (e->seq >= visible) break;
      const std::uint64_t seq = e->seq;
      next_ = seq + 1;
      ++events_;
      auto it = by_table_.find(e->schema + '\0' + e->table);
      if (it == by_table_.end()) continue;
      seen_.clear();
      // How each target was found (bits: 1 by the new row, 2 by the old one, 4 undecided);
      // given once per event, after every index of the table was looked at.
      constexpr unsigned by_new = 1, by_old = 2, undecided = 4;
      auto mark = [&](target* t, unsigned how) {
        auto& at = seen_index_[t];
        if (at.event == events_) {
          seen_[at.pos].second |= how;
          return;
        }
        at = seen_at{events_, seen_.size()};
        seen_.emplace_back(t, how);
      };
      auto give = [&](target* t) { mark(t, undecided); };
      auto hand_out = [&](const transform::change* c) {
        for (auto& [t, bits] : seen_) {
          auto how = found::unknown;
          if (c && !(bits & undecided)) {
            if (c->kind == transform::op::insert) how = (bits & by_new) ? found::both : found::unknown;
            else if (c->kind == transform::op::delete_) how = (bits & by_old) ? found::both : found::unknown;
            else if (c->kind == transform::op::update) {
              // No old row: the key (so the indexed column, a key column here) did not change.
              if (c->before.empty()) how = (bits & by_new) ? found::both : found::unknown;
              else if ((bits & by_new) && (bits & by_old)) how = found::both;
              else how = (bits & by_new) ? found::moved_in : found::moved_out;
            }
          }
          t->routed(seq, how);
          ++queued_;
        }
      };
      if (e->kind == transform::op::truncate) {
        for (auto& ix : it->second)
          for (auto& [t, v] : ix->subs) give(t);
        hand_out(nullptr);
        continue;
      }
      const transform::change* c = encodings_.decode(*e, error);
      if (!c || !c->relation) {   // unreadable: every subscriber of the table decides (and says so)
        for (auto& ix : it->second)
          for (auto& [t, v] : ix->subs) give(t);
        hand_out(nullptr);
        continue;
      }
      auto& list = it->second;
      std::vector<target*> kick;
      const std::uint64_t definition = definition_of(*c->relation);
      for (std::size_t k = 0; k < list.size(); ++k) {
        index& ix = *list[k];
        if (definition != ix.announced) {   // a new definition: no subscriber has checked it
          ix.announced = definition;
          ix.untold.clear();
          ix.refused.clear();
          for (auto& [t, values] : ix.subs) ix.untold.push_back(t);
        }
        // Each subscriber checked once per definition; those that cannot be served are given
        // every event of the table from then on (they end at the first they read).
        for (target* t : ix.untold)
          if (!t->check(*e, *c->relation)) ix.refused.push_back(t);
        ix.untold.clear();
        for (target* t : ix.refused) give(t);
        const auto& cols = c->relation->columns;
        auto col = std::find_if(cols.begin(), cols.end(), [&](const auto& x) { return x.name == ix.column; });
        if (col == cols.end()) continue;   // no such column: none of its rows is held by equality on it
        const std::size_t pos = static_cast<std::size_t>(col - cols.begin());
        // A column outside the replica identity is not in a delete's (or a key-keeping
        // update's) old row: the row leaving cannot be found by its value — every client of
        // the index decides (and its grant says what to change: REPLICA IDENTITY FULL).
        if (!col->key && c->relation->replica_identity != 'f') {
          for (auto& [t, values] : ix.subs) give(t);
          continue;
        }
        if (!ix.keyed || ix.type_oid != col->type_oid) {
          ix.by_key.clear();
          ix.type_oid = col->type_oid;
          bool supported = true;
          for (auto& [t, values] : ix.subs)
            for (const auto& v : values)
              if (auto key = predicate::equality_key(col->type_oid, v, supported)) ix.by_key[*key].push_back(t);
          if (!supported) {   // a type without equality keys: these subscriptions read every event
            for (auto& [t, values] : ix.subs) kick.push_back(t);
            ix.by_key.clear();
            continue;
          }
          for (auto& [key, ts] : ix.by_key) {
            std::sort(ts.begin(), ts.end());
            ts.erase(std::unique(ts.begin(), ts.end()), ts.end());
          }
          ix.keyed = true;
        }
        for (unsigned which : {by_new, by_old}) {
          const pg::tuple_view row = which == by_new ? c->after : c->before;
          if (pos >= row.size()) continue;
          const auto& v = row[pos];
          if (v.kind == pg::column_kind::null) continue;
          if (v.kind == pg::column_kind::unchanged_toast) {   // not sent: anyone's
            for (auto& [t, values] : ix.subs) give(t);
            continue;
          }
          bool supported = true;
          auto key = predicate::equality_key(col->type_oid, protocol::as_string_view(v.value), supported);
          if (!key) continue;
          if (auto hit = ix.by_key.find(*key); hit != ix.by_key.end())
            for (auto* t : hit->second) mark(t, which);
        }
      }
      hand_out(c);
      if (!kick.empty()) {   // (from this event on, which they may have been given: their queue goes too)
        std::sort(kick.begin(), kick.end());
        kick.erase(std::unique(kick.begin(), kick.end()), kick.end());
        for (auto* t : kick) {
          remove(t);
          t->unroutable(seq, true);
        }
        if (by_table_.empty()) {
          next_ = visible;
          return;
        }
      }
    }
  }
}

}  // namespace walgate::proxy
