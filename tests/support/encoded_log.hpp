// An event log in a temporary directory (not fsynced) with the fan-out's encoding cache fed by
// it, as the server wires them: what the subscription and row router tests read from.
#pragma once

#include "walgate/proxy/encodings.hpp"
#include "walgate/proxy/event_log.hpp"

#include "temp_dir.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>

namespace walgate::test {

struct encoded_log {
  temp_dir dir;
  std::unique_ptr<proxy::event_log> log;
  std::unique_ptr<proxy::encoding_cache> enc;
  explicit encoded_log(const char* prefix, proxy::log_options o = {}) : dir(prefix) {
    o.dir = dir.path;
    o.fsync = false;
    std::string error;
    log = proxy::event_log::open(o, error);
    REQUIRE_MESSAGE(log, error);
    enc = std::make_unique<proxy::encoding_cache>(*log, proxy::encoding_cache::options{});
    log->set_publish([this](const proxy::logged_event& e, const transform::change& c) { enc->on_logged(e, c); });
  }
  encoded_log(const encoded_log&) = delete;
  encoded_log& operator=(const encoded_log&) = delete;
};

}  // namespace walgate::test
