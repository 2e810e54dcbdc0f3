#include "admission.hpp"

#include <algorithm>
#include <cstdio>

namespace walgate::proxy {

const char* admission::name(reason r) {
  switch (r) {
    case reason::no_token: return "no_token";
    case reason::invalid_token: return "invalid_token";
    case reason::invalid_request: return "invalid_request";
    case reason::forbidden: return "forbidden";
    case reason::subject_limit: return "subject_limit";
    case reason::address_limit: return "address_limit";
    case reason::auth_rate_limit: return "auth_rate_limit";
    case reason::too_many_clients: return "too_many_clients";
    case reason::count_: break;
  }
  return "?";
}

admission::slot& admission::slot::operator=(slot&& o) noexcept {
  if (this != &o) {
    release();
    a_ = o.a_;
    subject_ = std::move(o.subject_);
    address_ = std::move(o.address_);
    o.a_ = nullptr;
  }
  return *this;
}

void admission::slot::release() {
  if (!a_) return;
  auto down = [](std::unordered_map<std::string, std::size_t>& m, const std::string& k) {
    if (k.empty()) return;
    auto it = m.find(k);
    if (it != m.end() && --it->second == 0) m.erase(it);
  };
  down(a_->subjects_, subject_);
  down(a_->addresses_, address_);
  a_ = nullptr;
}

std::optional<admission::slot> admission::take(std::string_view subject, std::string_view address, reason& why,
                                               std::string& message) {
  if (opts_.per_subject && !subject.empty() && streams_of_subject(subject) >= opts_.per_subject) {
    why = reason::subject_limit;
    message = "too many streams for this subject (limit " + std::to_string(opts_.per_subject) +
              ", --max-streams-per-subject); close one or try again later";
    return std::nullopt;
  }
  if (opts_.per_address && !address.empty() && streams_of_address(address) >= opts_.per_address) {
    why = reason::address_limit;
    message = "too many streams from this address (limit " + std::to_string(opts_.per_address) +
              ", --max-streams-per-address); close one or try again later";
    return std::nullopt;
  }
  slot s;
  s.a_ = this;
  // (Counted only under a limit: without one, nothing is remembered per subject or address.)
  if (opts_.per_subject && !subject.empty()) {
    s.subject_ = std::string(subject);
    ++subjects_[s.subject_];
  }
  if (opts_.per_address && !address.empty()) {
    s.address_ = std::string(address);
    ++addresses_[s.address_];
  }
  return s;
}

std::size_t admission::streams_of_subject(std::string_view subject) const {
  auto it = subjects_.find(std::string(subject));
  return it == subjects_.end() ? 0 : it->second;
}
std::size_t admission::streams_of_address(std::string_view address) const {
  auto it = addresses_.find(std::string(address));
  return it == addresses_.end() ? 0 : it->second;
}

std::optional<std::int64_t> admission::blocked(std::string_view address, std::chrono::steady_clock::time_point now,
                                               count_kind* which) const {
  const auto invalid = failures_.wait(address, now), claims = claims_.wait(address, now);
  if (!invalid && !claims) return std::nullopt;
  const bool by_claims = claims && (!invalid || *claims > *invalid);
  if (which) *which = by_claims ? count_kind::refused_claims : count_kind::invalid_tokens;
  return by_claims ? claims : invalid;
}

void admission::failed(std::string_view address, std::chrono::steady_clock::time_point now) {
  failures_.count(address, now);
}

void admission::claims_refused(std::string_view address, std::chrono::steady_clock::time_point now) {
  claims_.count(address, now);
}

void admission::refused(reason why, unsigned status, std::string_view path, std::string_view address,
                        std::string_view subject, std::string_view message, std::chrono::steady_clock::time_point now) {
  ++counts_[static_cast<std::size_t>(why)];
  if (!log_) return;
  if (now - log_second_ >= std::chrono::seconds(1)) {
    if (unlogged_) log_("refused: " + std::to_string(unlogged_) + " more request(s) in the last second, not logged one by one");
    log_second_ = now;
    logged_ = unlogged_ = 0;
  }
  if (logged_ >= opts_.log_per_second) {
    ++unlogged_;
    return;
  }
  ++logged_;
  std::string line = "refused " + std::to_string(status) + " " + std::string(path) + " from " + std::string(address);
  if (!subject.empty()) {
    line += " (subject ";
    for (char c : subject.substr(0, 200)) line.push_back(static_cast<unsigned char>(c) < 0x20 ? '?' : c);
    line += ")";
  }
  line += ": ";
  for (char c : message.substr(0, 300)) line.push_back(static_cast<unsigned char>(c) < 0x20 ? '?' : c);
  log_(line);
}

}  // namespace walgate::proxy
