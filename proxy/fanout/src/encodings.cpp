#include "walgate/proxy/encodings.hpp"

#include "walgate/proxy/stream_request.hpp"
#include "walgate/transform/json.hpp"

#include <algorithm>
#include <cstdio>

namespace walgate::proxy {

namespace {
payload_ptr encode_small(const logged_event& e, encoding enc, const transform::change& from,
                         const transform::encoder_options& options, std::string& scratch);
}  // namespace

encoding encoding_for(const stream_request& r) { return encoding_of(r.fmt, r.compact); }

void encoding_cache::on_logged(const logged_event& e, const transform::change& c) {
  for (std::size_t i = 0; i < eager_.size(); ++i) {
    if (eager_[i] <= 0) continue;
    const encoded_forms* f = forms_if(e);
    if (!f || !f->json[i]) encode_into(e, static_cast<encoding>(i), c);
  }
}

payload_ptr encoding_cache::get(const logged_event& e, encoding enc, std::string& error) {
  if (auto p = made_encoding(e, enc)) return p;
  auto r = transform::read_record(protocol::as_bytes(e.record), record_scratch_);
  if (!r) {
    error = "event #" + std::to_string(e.seq) + " in the event log cannot be read (" + r.error().message() + ")";
    return nullptr;
  }
  encode_into(e, enc, record_scratch_.get());
  return made_encoding(e, enc);
}

const transform::change* encoding_cache::decode(const logged_event& e, std::string& error) {
  auto r = transform::read_record(protocol::as_bytes(e.record), record_scratch_);
  if (!r) {
    error = "event #" + std::to_string(e.seq) + " in the event log cannot be read (" + r.error().message() + ")";
    return nullptr;
  }
  return &record_scratch_.get();
}

namespace {

/// An update as the insert of its new row or the delete of its old one (a row moved into or out
/// of a grant); false with error when it has no old row to delete.
bool as_op(transform::change& c, transform::op as, const logged_event& e, std::string& error) {
  if (as == c.kind) return true;
  if (as == transform::op::insert) {
    c.kind = transform::op::insert;
    c.before_kind = 0;
    c.before = {};
    return true;
  }
  c.kind = transform::op::delete_;
  // Only an update with its old row moves a row out (without one its key, and so the
  // predicate's columns, did not change): the delete is of that old row, never the new one.
  if (c.before.empty()) {
    error = "event #" + std::to_string(e.seq) + ": a row moved out of a grant without its old row";
    return false;
  }
  c.after = {};
  return true;
}

/// c with only the columns mask shows: its relation and rows cut to them (held in m).
struct masked_change {
  protocol::pgoutput::cached_relation rel;
  std::vector<protocol::pgoutput::tuple_column> before, after;
};
bool apply_mask(transform::change& c, const std::string& mask, masked_change& m, const logged_event& e, std::string& error) {
  const auto& r = *c.relation;
  if (mask.size() != r.columns.size() || (!c.after.empty() && c.after.size() != mask.size()) ||
      (!c.before.empty() && c.before.size() != mask.size())) {
    error = "event #" + std::to_string(e.seq) + ": its columns are not those of the grant's table definition";
    return false;
  }
  m.rel.oid = r.oid;
  m.rel.nspname = r.nspname;
  m.rel.relname = r.relname;
  m.rel.replica_identity = r.replica_identity;
  m.rel.generation = 0;
  m.rel.columns.clear();
  m.before.clear();
  m.after.clear();
  for (std::size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] != '1') continue;
    m.rel.columns.push_back(r.columns[i]);
    if (!c.after.empty()) m.after.push_back(c.after[i]);
    if (!c.before.empty()) m.before.push_back(c.before[i]);
  }
  c.relation = &m.rel;
  c.after = m.after;
  c.before = m.before;
  return true;
}

}  // namespace

payload_ptr encoding_cache::get_as(const logged_event& e, encoding enc, transform::op as, std::string& error) {
  const std::size_t at = static_cast<std::size_t>(enc) * 2 + (as == transform::op::insert ? 0 : 1);
  if (const encoded_forms* f = forms_if(e); f && f->moved && (*f->moved)[at]) return (*f->moved)[at];
  const transform::change* from = decode(e, error);
  if (!from) return nullptr;
  transform::change c = *from;
  if (!as_op(c, as, e, error)) return nullptr;
  auto p = encode_small(e, enc, c, opts_.encoder, encode_scratch_);
  bool made = false;
  auto& forms = forms_of(e, &made);
  if (!forms.moved) forms.moved = std::make_unique<std::array<payload_ptr, 2 * encoding_count>>();
  (*forms.moved)[at] = p;
  count_made(e, made, p->memory());
  return p;
}

payload_ptr encoding_cache::get_masked(const logged_event& e, encoding enc, transform::op as, const std::string& mask,
                                       std::string& error) {
  if (const encoded_forms* f = forms_if(e))
    for (const auto& m : f->masked)
      if (!m.keyed && m.enc == enc && m.as == as && m.mask == mask) return m.bytes;
  const transform::change* from = decode(e, error);
  if (!from) return nullptr;
  if (!from->relation) {
    error = "event #" + std::to_string(e.seq) + " in the event log has no table definition";
    return nullptr;
  }
  transform::change c = *from;
  masked_change m;
  if (!as_op(c, as, e, error) || !apply_mask(c, mask, m, e, error)) return nullptr;
  auto p = encode_small(e, enc, c, opts_.encoder, encode_scratch_);
  bool made = false;
  forms_of(e, &made).masked.push_back({enc, as, mask, p});
  count_made(e, made, sizeof(encoded_forms::masked_encoding) + mask.size() + p->memory());
  return p;
}

std::string encoding_cache::key_of(const logged_event& e, encoding enc, transform::op as, const std::string* mask,
                                   std::string& error) {
  const transform::change* from = decode(e, error);
  if (!from) return {};
  if (!from->relation) return "null";   // (a message)
  transform::change c = *from;
  if (c.kind == transform::op::truncate) return "null";
  if (as != c.kind && !as_op(c, as, e, error)) return {};
  masked_change m;
  if (mask && !apply_mask(c, *mask, m, e, error)) return {};
  if (std::none_of(c.relation->columns.begin(), c.relation->columns.end(), [](const auto& col) { return col.key; }))
    return "null";   // (no key columns: REPLICA IDENTITY NOTHING, or DEFAULT without a primary key)
  // An update is keyed by the row as it is now (its new key, when the update changed it). A
  // TOASTed value it did not change is not in its new row: the old row's is the same (under
  // REPLICA IDENTITY FULL every column is a key column), so that a row keeps one key.
  std::vector<protocol::pgoutput::tuple_column> merged;
  if (c.kind == transform::op::update) {
    if (!c.before.empty() && std::any_of(c.after.begin(), c.after.end(), [](const auto& x) {
          return x.kind == protocol::pgoutput::column_kind::unchanged_toast;
        })) {
      merged.assign(c.after.begin(), c.after.end());
      for (std::size_t k = 0; k < merged.size() && k < c.before.size(); ++k)
        if (merged[k].kind == protocol::pgoutput::column_kind::unchanged_toast &&
            c.before[k].kind != protocol::pgoutput::column_kind::unchanged_toast)
          merged[k] = c.before[k];
      c.after = merged;
    }
    c.before_kind = 0;
    c.before = {};
  }
  switch (enc) {
    case encoding::debezium: return transform::debezium_key(c, opts_.encoder);
    case encoding::pgoutput2json:
    case encoding::pgoutput2json_compact:
    case encoding::pgoutput2json_schema: return transform::pgoutput2json_key(c);
    case encoding::waltail: {
      std::string out;
      transform::append_json_string(out, transform::waltail_ordering_key(c));
      return out;
    }
    default: return "null";
  }
}

payload_ptr encoding_cache::keyed(const logged_event& e, encoding enc, transform::op as, const std::string* mask,
                                  const payload_ptr& value, std::string& error) {
  const std::string mask_key = mask ? *mask : std::string("*");
  if (const encoded_forms* f = forms_if(e))
    for (const auto& m : f->masked)
      if (m.keyed && m.enc == enc && m.as == as && m.mask == mask_key) return m.bytes;
  std::string key = key_of(e, enc, as, mask, error);
  if (key.empty()) return nullptr;
  auto p = payload::framed("{\"key\":" + key + ",\"value\":", value, "}");
  bool made = false;
  forms_of(e, &made).masked.push_back({enc, as, mask_key, p, true});
  count_made(e, made, sizeof(encoded_forms::masked_encoding) + mask_key.size() + p->memory());
  return p;
}

payload_ptr encoding_cache::tombstone(const logged_event& e, const std::string* mask) {
  auto v = transform::read_record(protocol::as_bytes(e.record), record_scratch_);
  if (!v) return nullptr;
  transform::change c = record_scratch_.get();
  masked_change m;
  std::string error;
  if (mask && (!c.relation || !apply_mask(c, *mask, m, e, error))) return nullptr;
  return payload::in_memory("{\"key\":" + transform::debezium_key(c, opts_.encoder) + ",\"value\":null}");
}

namespace {

/// The format and options of an encoding (encoding_specs).
std::pair<transform::format, transform::encoder_options> format_of(encoding enc, transform::encoder_options o) {
  const encoding_spec* s = spec_of(enc);   // (every encoding has one: encoding_specs_complete)
  o.compact = s && s->compact;
  o.include_schema = s && s->include_schema;
  return {s ? s->fmt : transform::format::native, o};
}

/// A small event's encoding: made in scratch (kept for the next one), held at its exact size.
payload_ptr encode_small(const logged_event& e, encoding enc, const transform::change& from,
                         const transform::encoder_options& options, std::string& scratch) {
  transform::change c = from;
  c.seq = e.seq;
  auto [f, o] = format_of(enc, options);
  scratch.clear();
  transform::encode_change(scratch, c, f, o);
  auto p = payload::in_memory(scratch);
  if (scratch.capacity() > (1u << 20)) scratch = std::string();
  return p;
}

}  // namespace

log_reader::prepare_fn encoding_cache::preparer() const {
  return [options = opts_.encoder](logged_event& e, std::uint32_t want) {
    if (e.record.size() >= (1u << 20)) return;   // (a large one is made on demand, and may be spilled)
    thread_local transform::record_view view;
    thread_local std::string scratch;
    bool parsed = false;
    for (std::size_t i = 0; i < encoding_count; ++i) {
      const auto enc = static_cast<encoding>(i);
      if (!(want & want_encoding(enc))) continue;
      payload_ptr slot = made_encoding(e, enc);
      if (!slot) {
        if (!parsed && !transform::read_record(protocol::as_bytes(e.record), view)) return;   // (said on demand)
        parsed = true;
        slot = encode_small(e, enc, view.get(), options, scratch);
        // (Not counted: the event is the background read's alone, not in the memory tail; its
        // block counts its memory() when it is done.)
        forms_of(e).json[i] = slot;
      }
      for (int w = 9; w <= 15; ++w)
        if (want & want_deflate(w)) slot->deflated(w);
    }
  };
}

void encoding_cache::encode_into(const logged_event& e, encoding enc, const transform::change& from) {
  payload_ptr slot;   // (put in e's forms once made: the forms are made only for what they hold)
  if (e.record.size() < (1u << 20)) {
    slot = encode_small(e, enc, from, opts_.encoder, encode_scratch_);
  } else {
    transform::change c = from;
    c.seq = e.seq;
    auto [f, o] = format_of(enc, opts_.encoder);
    // Large: about its record's size (more where values are escaped), room for that at once
    // rather than growth by doubling; sent from a spill file in pieces (where the file cannot
    // be made — a full disk — from memory).
    std::string bytes;
    bytes.reserve(e.record.size() + e.record.size() / 8 + 4096);
    transform::encode_change(bytes, c, f, o);
    if (bytes.size() >= opts_.spill_bytes && !opts_.spill_dir.empty()) {
      std::string error;
      slot = payload::spill(opts_.spill_dir, bytes, error);
      if (slot) ++spilled_;
      else log_once(spill_write_logged_, error + ": an encoding of " + std::to_string(bytes.size()) +
                                            " bytes is kept in memory instead");
    }
    if (!slot) {
      bytes.shrink_to_fit();
      slot = payload::in_memory(std::move(bytes));
    }
  }
  bool made = false;
  forms_of(e, &made).json[static_cast<std::size_t>(enc)] = slot;
  count_made(e, made, slot->memory());
}

std::string encoding_cache::schema_signature(const logged_event& e, const std::string* mask) {
  std::string out;
  if (transform::read_record(protocol::as_bytes(e.record), record_scratch_)) {
    const auto& c = record_scratch_.get();
    if (c.relation) {
      const auto& cols = c.relation->columns;
      // A mask that is not of this definition: the event cannot be encoded with it either
      // (get_masked fails, the client is closed); its every column then, never fewer.
      const bool masked = mask && mask->size() == cols.size();
      for (std::size_t i = 0; i < cols.size(); ++i) {
        if (masked && (*mask)[i] != '1') continue;   // (hidden: nothing of it in the signature)
        const auto& col = cols[i];
        out += col.name + '\x1f' + std::to_string(col.type_oid) + '\x1f' + std::to_string(col.type_modifier) +
               (col.key ? "k" : "") + '\x1e';
      }
    }
  }
  return out;
}

void encoding_cache::log_once(bool& done, const std::string& line) {
  if (done) return;
  done = true;
  std::fprintf(stderr, "walgate: %s\n", line.c_str());
}

}  // namespace walgate::proxy
