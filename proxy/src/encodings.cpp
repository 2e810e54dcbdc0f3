#include "walgate/proxy/encodings.hpp"

#include "walgate/proxy/stream_request.hpp"

#include <cstdio>

namespace walgate::proxy {

encoding encoding_for(const stream_request& r) {
  switch (r.fmt) {
    case transform::format::native: return encoding::native;
    case transform::format::debezium: return encoding::debezium;
    case transform::format::pgoutput2json: return r.compact ? encoding::pgoutput2json_compact : encoding::pgoutput2json;
    case transform::format::waltail: return encoding::waltail;
    case transform::format::wal2json: return encoding::wal2json;
  }
  return encoding::native;
}

void encoding_cache::on_logged(const logged_event& e, const transform::change& c) {
  for (std::size_t i = 0; i < eager_.size(); ++i)
    if (eager_[i] > 0 && !e.json[i]) encode_into(e, static_cast<encoding>(i), c);
}

payload_ptr encoding_cache::get(const logged_event& e, encoding enc, std::string& error) {
  auto& slot = e.json[static_cast<std::size_t>(enc)];
  if (!slot) {
    auto r = transform::read_record(protocol::as_bytes(e.record), record_scratch_);
    if (!r) {
      error = "event #" + std::to_string(e.seq) + " in the event log cannot be read (" + r.error().message() + ")";
      return nullptr;
    }
    encode_into(e, enc, record_scratch_.get());
  }
  return slot;
}

payload_ptr encoding_cache::tombstone(const logged_event& e) {
  auto v = transform::read_record(protocol::as_bytes(e.record), record_scratch_);
  if (!v) return nullptr;
  return payload::in_memory("{\"key\":" + transform::debezium_key(record_scratch_.get(), opts_.encoder) + ",\"value\":null}");
}

void encoding_cache::encode_into(const logged_event& e, encoding enc, const transform::change& from) {
  transform::change c = from;
  c.seq = e.seq;
  auto o = opts_.encoder;
  const bool compact = enc == encoding::pgoutput2json_compact || enc == encoding::pgoutput2json_schema;
  o.compact = compact;
  o.include_schema = enc == encoding::pgoutput2json_schema;
  transform::format f = compact ? transform::format::pgoutput2json : static_cast<transform::format>(enc);
  auto& slot = e.json[static_cast<std::size_t>(enc)];
  if (e.record.size() < (1u << 20)) {
    // Small: made in a buffer kept for the next one, and kept at its exact size.
    encode_scratch_.clear();
    transform::encode_change(encode_scratch_, c, f, o);
    slot = payload::in_memory(encode_scratch_);
    if (encode_scratch_.capacity() > (1u << 20)) encode_scratch_ = std::string();
  } else {
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
  log_.account_encoding(e, slot->memory());
}

std::string encoding_cache::schema_signature(const logged_event& e) {
  std::string out;
  if (transform::read_record(protocol::as_bytes(e.record), record_scratch_)) {
    const auto& c = record_scratch_.get();
    if (c.relation)
      for (const auto& col : c.relation->columns)
        out += col.name + '\x1f' + std::to_string(col.type_oid) + '\x1f' + std::to_string(col.type_modifier) +
               (col.key ? "k" : "") + '\x1e';
  }
  return out;
}

void encoding_cache::log_once(bool& done, const std::string& line) {
  if (done) return;
  done = true;
  std::fprintf(stderr, "walgate: %s\n", line.c_str());
}

}  // namespace walgate::proxy
