// walgate stream: prints each decoded pgoutput message of a slot (a diagnosis tool; it
// acknowledges what it printed).
#include "commands.hpp"

#include "walgate/protocol/pgoutput.hpp"
#include "walgate/proxy/conninfo.hpp"
#include "walgate/proxy/replication_client.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <variant>

namespace walgate::cli {

namespace asio = boost::asio;

namespace {

/// Prints what the stream carries. Test hook: WALGATE_TEST_THROW_IN_STREAM set makes the first
/// XLogData frame throw, as a bug would (the tests check the exit status and the reason).
class print_sink final : public proxy::replication_sink {
 public:
  void on_stream_start(const proxy::stream_start_info& i) override {
    context_ = protocol::pgoutput::decode_context{i.proto_version, false, false};
    std::printf("-- streaming from PostgreSQL %d, pgoutput proto_version %u, from %s\n", i.server_major, i.proto_version,
                i.start.to_string().c_str());
    std::fflush(stdout);
  }
  boost::system::error_code on_xlog_data(const protocol::xlog_data& x) override {
    namespace pg = protocol::pgoutput;
    if (throw_) throw std::runtime_error("test hook: an exception in the stream path at " + x.wal_start.to_string());
    auto decoded = decoder_.decode(x.data, context_);
    if (!decoded) {
      log_line("cannot decode the message at " + x.wal_start.to_string() + ": " + decoded.error().message());
      return make_error_code(decoded.error().code);
    }
    char tag = pg::tag_of(*decoded);
    std::string line = x.wal_start.to_string() + "  " + pg::name_of(tag);
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, pg::begin>) {
            line += " xid " + std::to_string(m.xid);
            in_transaction_ = true;
          } else if constexpr (std::is_same_v<T, pg::commit>) {
            line += " end " + m.end_lsn.to_string();
          } else if constexpr (std::is_same_v<T, pg::relation>) {
            const auto& r = relations_.update(m);
            line += " " + r.nspname + "." + r.relname + " (" + std::to_string(r.columns.size()) + " columns)";
          } else if constexpr (std::is_same_v<T, pg::insert>) {
            line += row(m.relation_oid, m.new_tuple);
          } else if constexpr (std::is_same_v<T, pg::update>) {
            line += row(m.relation_oid, m.new_tuple);
          } else if constexpr (std::is_same_v<T, pg::delete_>) {
            line += row(m.relation_oid, m.old_tuple);
          }
        },
        *decoded);
    std::printf("%s\n", line.c_str());
    if (tag == 'C') {
      in_transaction_ = false;
      std::fflush(stdout);
      // A printed transaction is "durable" for this command: its Commit's WAL start is its end LSN.
      durable_ = std::max(durable_, x.wal_start);
    }
    return {};
  }
  void on_keepalive(const protocol::primary_keepalive& k) override {
    if (!in_transaction_) durable_ = std::max(durable_, k.wal_end);
  }
  protocol::lsn durable_lsn() const override { return durable_; }

 private:
  std::string row(std::uint32_t oid, protocol::pgoutput::tuple_view t) const {
    const auto* r = relations_.find(oid);
    if (!r) return " (relation " + std::to_string(oid) + " not described)";
    std::string out = " " + r->nspname + "." + r->relname;
    for (std::size_t i = 0; i < t.size() && i < r->columns.size(); ++i) {
      out += " " + r->columns[i].name + "=";
      switch (t[i].kind) {
        case protocol::pgoutput::column_kind::null: out += "NULL"; break;
        case protocol::pgoutput::column_kind::unchanged_toast: out += "(unchanged)"; break;
        default: out += protocol::as_string_view(t[i].value);
      }
    }
    return out;
  }
  protocol::pgoutput::decoder decoder_;
  protocol::pgoutput::decode_context context_;
  protocol::pgoutput::relation_cache relations_;
  bool in_transaction_ = false;
  protocol::lsn durable_;
  bool throw_ = std::getenv("WALGATE_TEST_THROW_IN_STREAM") != nullptr;
};

}  // namespace

int run_stream(const config& s) {
  auto parsed = proxy::parse_conninfo(s.pg);
  if (!parsed.params) {
    log_line("--pg: " + parsed.error);
    return 2;
  }
  asio::io_context io;
  print_sink sink;
  proxy::replication_settings rs;
  rs.conn = *parsed.params;
  // (with several hosts, primary unless --pg's target_session_attrs names another: as walgate serve)
  if (!rs.conn.target_session_attrs && rs.conn.endpoints.size() > 1) rs.conn.target_session_attrs = proxy::session_target::primary;
  rs.log = [](const std::string& line) { log_line(line); };
  rs.slot = s.slot;
  rs.publications = s.publications;
  rs.status_interval = std::chrono::milliseconds(s.status_interval_ms);
  proxy::replication_client client(io.get_executor(), rs, sink);
  if (!s.capture.empty()) client.set_capture_file(s.capture);
  client.set_retry_handler([](const proxy::failure& f, std::chrono::milliseconds d) {
    log_line(f.message + " (reconnecting in " + std::to_string(d.count()) + " ms)");
  });
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int) {
    if (!ec) client.stop();
  });
  int rc = 0;
  // Assumption: the coroutine ends with an outcome or an exception; both that are not success exit 1.
  asio::co_spawn(io, client.run(), [&](std::exception_ptr e, proxy::outcome<void> r) {
    signals.cancel();
    if (e) {
      log_line("the replication stream failed: " + exception_text(e));
      rc = 1;
    } else if (!r) {
      log_line(r.error().message);
      rc = 1;
    }
    io.stop();   // (an exception leaves the client's other work pending: nothing more is to be done)
  });
  io.run();
  return rc;
}

}  // namespace walgate::cli
