// Encodings of logged events, made once per event and encoding and shared by every reader of
// that encoding (the bytes live with the event, in its encoded_forms, and count against what the
// log keeps in memory for it). Small encodings are bytes in memory; those of spill_bytes or more
// are written once to an unlinked file in spill_dir and sent from it in pieces (payload.hpp).
// Encodings that some reader wants of every event are made eagerly as each event is logged,
// from the change in hand; the rest on first demand, from the record. Single-threaded (but for
// preparer, below).
//
// The log knows nothing of them (log_reader.hpp): they are kept with an event as its attachment
// (logged_event::attached), an encoded_forms, which
//   - is made by this file alone, on first use: by encoding_cache on the event loop (the log's
//     executor), which then counts it (its own size with what was put in it) against the log's
//     memory (log_reader::account_memory, through which the memory tail's count for the event
//     stays its memory()); and by preparer on a background reader's thread, for the events that
//     reader has just read, before the loop can see them (they reach it with the read's
//     notification; such events are never in the memory tail: their block counts their memory()
//     when it is done);
//   - is only ever added to (a form, once made, stays, and its payload is shared by every
//     client of it), on the loop once the event reached it;
//   - goes with the event.
#pragma once

#include "walgate/proxy/log_reader.hpp"
#include "walgate/proxy/payload.hpp"
#include "walgate/transform/formats.hpp"
#include "walgate/transform/record.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace walgate::proxy {

struct stream_request;

/// The encodings an event can be asked for; pgoutput2json compact without "s" is shared too, and
/// so is compact with "s" (sent to a client with the first row of a table, and after a change).
/// Their values number the slots of encoded_forms and the bits of want_encoding; which format
/// each is of is in encoding_specs, never in this order.
enum class encoding : std::uint8_t {
  native, debezium, pgoutput2json, waltail, wal2json, pgoutput2json_compact, pgoutput2json_schema, count_
};
inline constexpr std::size_t encoding_count = static_cast<std::size_t>(encoding::count_);

/// The bits of log_reader::read's `prepare` (the log passes them on to preparer as they are):
/// what a read in the background makes ready for the events it reads, off the event loop: bit i
/// for encoding i (want_encoding), bit 16 + w for an encoding's permessage-deflate form with
/// window w (want_deflate, 9-15), made of each encoding asked for.
constexpr std::uint32_t want_encoding(encoding e) { return 1u << static_cast<unsigned>(e); }
constexpr std::uint32_t want_deflate(int window_bits) { return 1u << (16 + window_bits); }
static_assert(encoding_count <= 16, "want_encoding's bits are below want_deflate's");

/// What an encoding is: the format it is of, and pgoutput2json's compact mode (k/r as arrays)
/// with or without "s" (include_schema).
struct encoding_spec {
  encoding enc;
  transform::format fmt;
  bool compact = false;
  bool include_schema = false;
};
/// Every encoding's, one each (in no order that matters: encodings and formats are mapped by
/// this table, never by their enums' order).
inline constexpr encoding_spec encoding_specs[] = {
    {encoding::native, transform::format::native},
    {encoding::debezium, transform::format::debezium},
    {encoding::pgoutput2json, transform::format::pgoutput2json},
    {encoding::waltail, transform::format::waltail},
    {encoding::wal2json, transform::format::wal2json},
    {encoding::pgoutput2json_compact, transform::format::pgoutput2json, true, false},
    {encoding::pgoutput2json_schema, transform::format::pgoutput2json, true, true},
};
/// enc's entry of encoding_specs (null for count_).
constexpr const encoding_spec* spec_of(encoding enc) {
  for (const auto& s : encoding_specs)
    if (s.enc == enc) return &s;
  return nullptr;
}
/// The encoding of format f (compact: pgoutput2json's compact mode, without "s"; a format
/// without that mode has its one encoding).
constexpr encoding encoding_of(transform::format f, bool compact) {
  for (const auto& s : encoding_specs)
    if (s.fmt == f && s.compact == compact && !s.include_schema) return s.enc;
  for (const auto& s : encoding_specs)
    if (s.fmt == f && !s.compact && !s.include_schema) return s.enc;
  return encoding::native;   // (none: encoding_specs_complete says it cannot be)
}
/// Every encoding has one entry, and every format (transform::all_formats) its own encoding.
constexpr bool encoding_specs_complete() {
  for (std::size_t i = 0; i < encoding_count; ++i) {
    int n = 0;
    for (const auto& s : encoding_specs) n += static_cast<std::size_t>(s.enc) == i ? 1 : 0;
    if (n != 1) return false;
  }
  for (const auto& s : encoding_specs)
    if (static_cast<std::size_t>(s.enc) >= encoding_count || (s.include_schema && !s.compact)) return false;
  for (auto f : transform::all_formats) {
    int n = 0;
    for (const auto& s : encoding_specs) n += s.fmt == f && !s.compact && !s.include_schema ? 1 : 0;
    if (n != 1) return false;
  }
  return true;
}
static_assert(encoding_specs_complete(), "encoding_specs: one entry per encoding, and an encoding per format");

/// The encoding a request asks for (its format, and pgoutput2json's compact mode).
encoding encoding_for(const stream_request& r);

/// An event's encodings, kept with it (logged_event::attached; see the top of this file for who
/// makes it, on which thread, and when its memory is counted).
struct encoded_forms final : event_attachment {
  /// Per encoding (its value), made once on first demand and shared by every client.
  std::array<payload_ptr, encoding_count> json;
  /// Encodings of the event as another op, per encoding: an update that moves a row into a
  /// client's row grant is sent to it as an insert (2 * enc), out of it as a delete
  /// (2 * enc + 1); made on demand (the array too).
  std::unique_ptr<std::array<payload_ptr, 2 * encoding_count>> moved;
  /// Encodings of the event with only some columns (column grants): per encoding, op and
  /// column mask (table_rows::masks), made on demand.
  struct masked_encoding {
    encoding enc;
    transform::op as;
    std::string mask;   ///< ("*" for a keyed form of every column)
    payload_ptr bytes;
    bool keyed = false;   ///< keys=true's {"key":…,"value":…} form (encoding_cache::keyed)
  };
  std::vector<masked_encoding> masked;

  /// Its own size, each payload's memory, and each masked form's entry and mask (what the
  /// event counted of them when it held them itself).
  std::size_t memory() const override {
    std::size_t n = sizeof(*this);
    for (const auto& j : json)
      if (j) n += j->memory();
    if (moved)
      for (const auto& j : *moved)
        if (j) n += j->memory();
    for (const auto& m : masked) n += sizeof(m) + m.mask.size() + (m.bytes ? m.bytes->memory() : 0);
    return n;
  }
};

/// e's encodings, made (empty) on first use — *made is then set, and the maker counts
/// sizeof(encoded_forms) against the log's memory (encoding_cache does; a background read
/// need not). The fan-out is the only one to attach anything to an event (its attachment is
/// an encoded_forms, or none).
inline encoded_forms& forms_of(const logged_event& e, bool* made = nullptr) {
  if (!e.attached) {
    e.attached = std::make_unique<encoded_forms>();
    if (made) *made = true;
  }
  return static_cast<encoded_forms&>(*e.attached);
}
/// e's encodings when made; null otherwise (never makes them).
inline const encoded_forms* forms_if(const logged_event& e) {
  return static_cast<const encoded_forms*>(e.attached.get());
}
/// e's shared encoding in enc when made; null otherwise (never makes it: encoding_cache::get).
inline payload_ptr made_encoding(const logged_event& e, encoding enc) {
  const encoded_forms* f = forms_if(e);
  return f ? f->json[static_cast<std::size_t>(enc)] : nullptr;
}

class encoding_cache {
 public:
  struct options {
    transform::encoder_options encoder;   ///< Debezium name, db, decimal/time modes.
    std::filesystem::path spill_dir;      ///< empty: large encodings stay in memory
    std::size_t spill_bytes = 4u << 20;
  };
  encoding_cache(log_reader& log, options o) : log_(log), opts_(std::move(o)) {}

  /// e in enc, made now if not yet; null when e's record cannot be read (error says why).
  payload_ptr get(const logged_event& e, encoding enc, std::string& error);
  /// e's change, decoded from its record: valid until the next call on this cache; null when
  /// the record cannot be read (error says why).
  const transform::change* decode(const logged_event& e, std::string& error);
  /// e (an update) encoded in enc as an insert of its new row (as = insert) or a delete of its
  /// old row's key — or its whole old row under REPLICA IDENTITY FULL (as = delete_); made once
  /// per event, encoding and op, kept with the event (encoded_forms::moved).
  payload_ptr get_as(const logged_event& e, encoding enc, transform::op as, std::string& error);
  /// e in enc as op `as` (its own, or an update moved in or out: as get_as) with only the
  /// columns mask shows ('1' per column of its table's definition shown, '0' not): in every
  /// field of every format (rows, keys, schemas). Made once per event, encoding, op and mask,
  /// kept with the event (encoded_forms::masked).
  payload_ptr get_masked(const logged_event& e, encoding enc, transform::op as, const std::string& mask, std::string& error);
  /// keys=true: value — e in enc as op `as` with the columns mask shows (null: every one) — as
  /// {"key":<key_of>,"value":<value>}: made once per event, encoding, op and mask and kept with
  /// the event (encoded_forms::masked); null if e's record cannot be read.
  payload_ptr keyed(const logged_event& e, encoding enc, transform::op as, const std::string* mask,
                    const payload_ptr& value, std::string& error);
  /// The message key of e as op `as` (mask as keyed) in the format of enc, as JSON: Debezium's
  /// record key ({"id":4471}), PgOutput2Json's key values ([4471]), Waltail's ordering key
  /// ("public.orders:4471"); null for an event without one (a message, a truncate, a table
  /// without key columns). Empty with error when e's record cannot be read.
  std::string key_of(const logged_event& e, encoding enc, transform::op as, const std::string* mask, std::string& error);
  /// A Debezium tombstone for a deleted row ({"key":…,"value":null}), its key of the columns
  /// mask shows (null: every one); null if unreadable.
  payload_ptr tombstone(const logged_event& e, const std::string* mask = nullptr);
  /// The signature of e's table definition (column names, types, typmods, key flags) that
  /// says when pgoutput2json compact's "s" must be sent again: of the columns mask shows (as
  /// get_masked; null: every one), so that a column a client does not see, added, dropped,
  /// renamed or retyped, sends it no new "s". Empty when e's record cannot be read.
  std::string schema_signature(const logged_event& e, const std::string* mask = nullptr);

  /// A reader that wants every event in enc (no filter) comes and goes: while one does, each
  /// event is encoded so as it is logged (on_logged).
  void want_all(encoding enc, int delta) { eager_[static_cast<std::size_t>(enc)] += delta; }
  /// bytes more held for e's encodings (a compressed form made on a payload): counted against
  /// the log's memory tail as its encodings are.
  void account(const logged_event& e, std::size_t bytes) { log_.account_memory(e, bytes); }
  /// The log's prepare hook (log_reader::set_prepare): what it runs on events it read in the
  /// background, on its reader thread, with the bits its readers asked for: makes the
  /// encodings asked for (want_encoding; records under 1 MiB) and their compressed forms
  /// (want_deflate), in the events' encoded_forms (made there, not counted: see the top of this
  /// file). It holds a copy of the encoder options: it outlives this cache safely.
  log_reader::prepare_fn preparer() const;
  /// The log's publish hook: e was just logged from c.
  void on_logged(const logged_event& e, const transform::change& c);

  const transform::encoder_options& encoder() const { return opts_.encoder; }
  std::uint64_t spilled() const { return spilled_; }

 private:
  void encode_into(const logged_event& e, encoding enc, const transform::change& from);
  /// Counts bytes just put in e's forms (and the forms themselves when made is set).
  void count_made(const logged_event& e, bool made, std::size_t bytes) {
    log_.account_memory(e, (made ? sizeof(encoded_forms) : 0) + bytes);
  }
  static void log_once(bool& done, const std::string& line);

  log_reader& log_;
  options opts_;
  std::array<int, encoding_count> eager_{};
  transform::record_view record_scratch_;   // one parse buffer for every record read here
  std::string encode_scratch_;
  std::uint64_t spilled_ = 0;
  bool spill_write_logged_ = false;
};

}  // namespace walgate::proxy
