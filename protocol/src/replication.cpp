#include "walgate/protocol/replication.hpp"

namespace walgate::protocol {

parse_result<copy_payload> parse_copy_payload(bytes_view payload) noexcept {
  cursor c(payload);
  copy_payload p;
  std::uint8_t tag = c.u8("CopyData kind");
  if (!c.ok()) return c.error();
  switch (tag) {
    case 'w':
      p.type = copy_payload::kind::xlog_data;
      p.xlog.wal_start = lsn{c.u64("XLogData WAL start")};
      p.xlog.wal_end = lsn{c.u64("XLogData WAL end")};
      p.xlog.server_clock_us = c.i64("XLogData server clock");
      p.xlog.data = c.rest();
      break;
    case 'k': {
      p.type = copy_payload::kind::keepalive;
      p.keepalive.wal_end = lsn{c.u64("keepalive WAL end")};
      p.keepalive.server_clock_us = c.i64("keepalive server clock");
      std::uint8_t reply = c.u8("keepalive reply flag");
      if (c.ok() && reply > 1) c.fail(errc::invalid_value, "keepalive reply flag");
      p.keepalive.reply_requested = reply == 1;
      c.expect_end("keepalive");
      break;
    }
    default:
      return decode_error{errc::unknown_message, "CopyData kind", 0};
  }
  if (!c.ok()) return c.error();
  return p;
}

std::string build_standby_status_update(const standby_status_update& s) {
  writer w;
  w.u8('r')
      .u64(s.written.value)
      .u64(s.flushed.value)
      .u64(s.applied.value)
      .i64(s.client_clock_us)
      .u8(s.reply_requested ? 1 : 0);
  return w.take();
}

std::string build_standby_status_message(const standby_status_update& s) {
  return build_copy_data(build_standby_status_update(s));
}

std::string build_xlog_data(const xlog_data& x) {
  writer w;
  w.u8('w').u64(x.wal_start.value).u64(x.wal_end.value).i64(x.server_clock_us).raw(x.data);
  return w.take();
}

void append_copy_xlog_data(std::string& out, const xlog_data& x) {
  const std::size_t length = 4 + 1 + 8 + 8 + 8 + x.data.size();   // (CopyData's length counts itself)
  out.reserve(out.size() + 1 + length);
  writer w(out);
  w.u8('d').u32(static_cast<std::uint32_t>(length)).u8('w').u64(x.wal_start.value).u64(x.wal_end.value).i64(x.server_clock_us).raw(x.data);
}

std::string build_primary_keepalive(const primary_keepalive& k) {
  writer w;
  w.u8('k').u64(k.wal_end.value).i64(k.server_clock_us).u8(k.reply_requested ? 1 : 0);
  return w.take();
}

parse_result<standby_status_update> parse_standby_status_update(bytes_view payload) noexcept {
  cursor c(payload);
  standby_status_update s;
  if (c.u8("status update kind") != 'r' && c.ok()) c.fail(errc::unknown_message, "status update kind");
  s.written = lsn{c.u64("written")};
  s.flushed = lsn{c.u64("flushed")};
  s.applied = lsn{c.u64("applied")};
  s.client_clock_us = c.i64("client clock");
  s.reply_requested = c.u8("reply flag") == 1;
  c.expect_end("status update");
  if (!c.ok()) return c.error();
  return s;
}

}  // namespace walgate::protocol
