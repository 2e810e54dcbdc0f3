// A replication sink for tests that records every frame until a logical message with the given
// prefix marks the end of a workload. It acknowledges nothing.
#pragma once

#include "golden.hpp"
#include "walgate/proxy/replication_client.hpp"

#include <mutex>
#include <string>
#include <vector>

namespace walgate::test {

class capture_sink final : public proxy::replication_sink {
 public:
  explicit capture_sink(std::string end_marker) : end_marker_(std::move(end_marker)) {}
  boost::system::error_code on_xlog_data(const protocol::xlog_data& x) override {
    std::lock_guard g(m_);
    std::string data(protocol::as_string_view(x.data));
    // The end: a logical message, or the Relation message of a marker table (PostgreSQL 13,
    // whose pgoutput sends no messages), naming the marker.
    if (!data.empty() && (data[0] == 'M' || data[0] == 'R') && data.find(end_marker_) != std::string::npos) done_ = true;
    frames_.push_back({x.wal_start, std::move(data)});
    return {};
  }
  protocol::lsn durable_lsn() const override { return {}; }
  bool done() const {
    std::lock_guard g(m_);
    return done_;
  }
  std::vector<frame_record> frames() const {
    std::lock_guard g(m_);
    return frames_;
  }

 private:
  mutable std::mutex m_;
  std::string end_marker_;
  std::vector<frame_record> frames_;
  bool done_ = false;
};

}  // namespace walgate::test
