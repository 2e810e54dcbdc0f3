// Encodings of logged events, made once per event and encoding and shared by every reader of
// that encoding (the bytes live with the event, logged_event::json, and count against what the
// log keeps in memory for it). Small encodings are bytes in memory; those of spill_bytes or more
// are written once to an unlinked file in spill_dir and sent from it in pieces (payload.hpp).
// Encodings that some reader wants of every event are made eagerly as each event is logged,
// from the change in hand; the rest on first demand, from the record. Single-threaded.
#pragma once

#include "walgate/proxy/log_reader.hpp"
#include "walgate/transform/formats.hpp"
#include "walgate/transform/record.hpp"

#include <array>
#include <filesystem>
#include <string>

namespace walgate::proxy {

struct stream_request;

/// The encoding a request asks for (its format, and pgoutput2json's compact mode).
encoding encoding_for(const stream_request& r);

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
  /// per event, encoding and op, kept with the event (logged_event::moved).
  payload_ptr get_as(const logged_event& e, encoding enc, transform::op as, std::string& error);
  /// e in enc as op `as` (its own, or an update moved in or out: as get_as) with only the
  /// columns mask shows ('1' per column of its table's definition shown, '0' not): in every
  /// field of every format (rows, keys, schemas). Made once per event, encoding, op and mask,
  /// kept with the event (logged_event::masked).
  payload_ptr get_masked(const logged_event& e, encoding enc, transform::op as, const std::string& mask, std::string& error);
  /// keys=true: value — e in enc as op `as` with the columns mask shows (null: every one) — as
  /// {"key":<key_of>,"value":<value>}: made once per event, encoding, op and mask and kept with
  /// the event (logged_event::masked); null if e's record cannot be read.
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
  void account(const logged_event& e, std::size_t bytes) { log_.account_encoding(e, bytes); }
  /// What the log runs on events it read in the background, on its reader thread: makes the
  /// encodings asked for (want_encoding; records under 1 MiB) and their compressed forms
  /// (want_deflate). It holds a copy of the encoder options: it outlives this cache safely.
  log_reader::prepare_fn preparer() const;
  /// The log's publish hook: e was just logged from c.
  void on_logged(const logged_event& e, const transform::change& c);

  const transform::encoder_options& encoder() const { return opts_.encoder; }
  std::uint64_t spilled() const { return spilled_; }

 private:
  void encode_into(const logged_event& e, encoding enc, const transform::change& from);
  static void log_once(bool& done, const std::string& line);

  log_reader& log_;
  options opts_;
  std::array<int, static_cast<std::size_t>(encoding::count_)> eager_{};
  transform::record_view record_scratch_;   // one parse buffer for every record read here
  std::string encode_scratch_;
  std::uint64_t spilled_ = 0;
  bool spill_write_logged_ = false;
};

}  // namespace walgate::proxy
