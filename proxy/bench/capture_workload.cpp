// Captures the standard benchmark workload (../shared/bench/) as walgate receives it: starts a
// throwaway PostgreSQL, creates the table, a publication and a pgoutput slot, runs load.sh, then
// drains the slot with walgate's replication client (proto_version 1, as the reference
// pg_recvlogical run) and writes every XLogData frame as "Int64 WAL start | Int32 length | bytes".
//   walgate-capture-workload OUT.frames [SHARED_BENCH_DIR]      (env ROWS as load.sh)
#include "walgate/protocol/cursor.hpp"
#include "walgate/proxy/local_cluster.hpp"
#include "walgate/proxy/replication_client.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

using namespace walgate;
namespace asio = boost::asio;

namespace {
class file_sink final : public proxy::replication_sink {
 public:
  file_sink(std::ofstream& out, protocol::lsn end, std::function<void()> done) : out_(out), end_(end), done_(std::move(done)) {}
  boost::system::error_code on_xlog_data(const protocol::xlog_data& x) override {
    std::string header;
    protocol::writer(header).u64(x.wal_start.value).u32(static_cast<std::uint32_t>(x.data.size()));
    out_ << header << protocol::as_string_view(x.data);
    ++frames_;
    char tag = x.data.empty() ? 0 : static_cast<char>(x.data[0]);
    in_txn_ = tag == 'C' ? false : tag == 'B' ? true : in_txn_;
    if (tag == 'C') durable_ = x.wal_start;
    return {};
  }
  void on_keepalive(const protocol::primary_keepalive& k) override {
    if (!in_txn_ && k.wal_end >= end_ && !finished_) {
      finished_ = true;
      done_();
    }
  }
  protocol::lsn durable_lsn() const override { return durable_; }
  std::size_t frames() const { return frames_; }

 private:
  std::ofstream& out_;
  protocol::lsn end_, durable_;
  std::function<void()> done_;
  bool in_txn_ = false, finished_ = false;
  std::size_t frames_ = 0;
};
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: walgate-capture-workload OUT.frames [SHARED_BENCH_DIR]\n");
    return 2;
  }
  std::string bench = argc > 2 ? argv[2] : "../shared/bench";
  std::string error;
  proxy::cluster_options o;
  o.name = "walgate-bench";
  auto pg = proxy::local_cluster::start(o, error);
  if (!pg) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  std::string psql = "psql -X -q -h " + pg->socket_dir().string() + " -p " + std::to_string(pg->port()) +
                     " -U postgres -d postgres";
  if (std::system((psql + " -v ON_ERROR_STOP=1 -f " + bench + "/workload.sql").c_str()) != 0) return 1;
  pg->sql("CREATE PUBLICATION bench_pub FOR TABLE bench_orders");
  pg->sql("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')");
  auto t0 = std::chrono::steady_clock::now();
  std::string load = bench + "/load.sh -h " + pg->socket_dir().string() + " -p " + std::to_string(pg->port()) +
                     " -U postgres -d postgres";
  if (std::system(load.c_str()) != 0) return 1;
  auto end = *protocol::lsn::parse(*pg->sql("SELECT pg_current_wal_lsn()")[0][0]);
  std::fprintf(stderr, "loaded in %.1f s; end LSN %s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), end.to_string().c_str());

  std::ofstream out(argv[1], std::ios::binary | std::ios::trunc);
  asio::io_context io;
  proxy::replication_settings s;
  s.conn = *proxy::parse_conninfo(pg->conninfo()).params;
  s.slot = "bench";
  s.publications = {"bench_pub"};
  s.create_slot = false;
  s.proto_version = 1;
  s.max_attempts = 1;
  std::unique_ptr<proxy::replication_client> client;
  file_sink sink(out, end, [&] { client->stop(); });
  client = std::make_unique<proxy::replication_client>(io.get_executor(), s, sink);
  int rc = 0;
  asio::co_spawn(io, client->run(), [&](std::exception_ptr, proxy::outcome<void> r) {
    if (!r) {
      std::fprintf(stderr, "%s\n", r.error().message.c_str());
      rc = 1;
    }
  });
  io.run();
  std::fprintf(stderr, "captured %zu frames to %s\n", sink.frames(), argv[1]);
  return rc;
}
