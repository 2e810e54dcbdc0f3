// Encode once, share everywhere: an event's JSON in each format that some client wants, as
// immutable shared bytes. Every client of a format gets the same buffer; no event is encoded
// twice in the same format.
#pragma once

#include "walgate/transform/formats.hpp"

#include <array>
#include <memory>
#include <string>

namespace walgate::transform {

/// Which formats are wanted (a bit per format).
class format_set {
 public:
  format_set() = default;
  format_set& add(format f) {
    bits_ |= 1u << static_cast<unsigned>(f);
    return *this;
  }
  bool contains(format f) const { return (bits_ >> static_cast<unsigned>(f)) & 1u; }
  bool empty() const { return bits_ == 0; }
  static format_set all() {
    format_set s;
    for (auto f : all_formats) s.add(f);
    return s;
  }

 private:
  unsigned bits_ = 0;
};

struct encoded_event {
  event_id id;
  /// The bytes per format; null where the format was not wanted or has no such event.
  std::array<std::shared_ptr<const std::string>, 5> json;
  const std::shared_ptr<const std::string>& in(format f) const { return json[static_cast<std::size_t>(f)]; }
};

/// Encodes c once in every wanted format.
encoded_event encode_once(const change& c, format_set wanted, const encoder_options& o = {});

}  // namespace walgate::transform
