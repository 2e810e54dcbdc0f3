// The replication client against a real server: frames for real inserts, keepalive replies,
// confirmed_flush_lsn following only what we report as durable, pre-flight errors, and
// reconnection that resumes from the durable position.
#include "walgate/proxy/pg_connection.hpp"
#include "walgate/proxy/replication_client.hpp"

#include "split_helpers.hpp"
#include "test_cluster.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <thread>

using namespace walgate;
using namespace walgate::proxy;
namespace asio = boost::asio;
using protocol::lsn;

namespace {

/// Records every frame; durable is what the test says (or, when auto_durable, each Commit's
/// end LSN, as a sink that stores transactions would report).
class recording_sink final : public replication_sink {
 public:
  void on_stream_start(const stream_start_info& i) override {
    std::lock_guard g(m_);
    starts_.push_back(i);
  }
  boost::system::error_code on_xlog_data(const protocol::xlog_data& x) override {
    std::lock_guard g(m_);
    char tag = x.data.empty() ? '?' : static_cast<char>(x.data[0]);
    tags_.push_back(tag);
    payloads_.emplace_back(protocol::as_string_view(x.data));
    if (tag == 'C') {
      commits_.push_back(x.wal_start);
      if (auto_durable_) durable_ = x.wal_start;
    }
    return {};
  }
  void on_keepalive(const protocol::primary_keepalive& k) override {
    std::lock_guard g(m_);
    ++keepalives_;
    if (k.reply_requested) ++reply_requests_;
  }
  lsn durable_lsn() const override {
    std::lock_guard g(m_);
    return durable_;
  }
  void set_durable(lsn l) {
    std::lock_guard g(m_);
    durable_ = l;
  }
  void set_auto_durable(bool on) {
    std::lock_guard g(m_);
    auto_durable_ = on;
  }
  std::string tags() const {
    std::lock_guard g(m_);
    return tags_;
  }
  std::vector<lsn> commits() const {
    std::lock_guard g(m_);
    return commits_;
  }
  std::vector<std::string> payloads() const {
    std::lock_guard g(m_);
    return payloads_;
  }
  int reply_requests() const {
    std::lock_guard g(m_);
    return reply_requests_;
  }
  std::size_t starts() const {
    std::lock_guard g(m_);
    return starts_.size();
  }
  stream_start_info last_start() const {
    std::lock_guard g(m_);
    return starts_.back();
  }

 private:
  mutable std::mutex m_;
  std::string tags_;
  std::vector<std::string> payloads_;
  std::vector<lsn> commits_;
  std::vector<stream_start_info> starts_;
  int keepalives_ = 0, reply_requests_ = 0;
  lsn durable_;
  bool auto_durable_ = false;
};

/// A replication client running on its own thread.
struct running_client {
  asio::io_context io;
  recording_sink& sink;
  replication_client client;
  std::thread thread;
  std::optional<outcome<void>> result;
  std::atomic<bool> finished{false};

  running_client(replication_settings s, recording_sink& k) : sink(k), client(io.get_executor(), std::move(s), k) {
    asio::co_spawn(io, client.run(), [this](std::exception_ptr, outcome<void> r) {
      result = std::move(r);
      finished = true;
    });
    thread = std::thread([this] { io.run(); });
  }
  void stop() {
    asio::post(io, [this] { client.stop(); });
    if (thread.joinable()) thread.join();
  }
  ~running_client() {
    stop();
  }
};

replication_settings settings_for(const std::string& slot, const std::string& publication) {
  replication_settings s;
  s.conn = *parse_conninfo(test::cluster().conninfo()).params;
  s.slot = slot;
  s.publications = {publication};
  s.backoff_initial = std::chrono::milliseconds(50);
  s.backoff_max = std::chrono::milliseconds(200);
  return s;
}

std::string slot_value(const std::string& slot, const std::string& column) {
  auto rows = test::cluster().sql("SELECT " + column + " FROM pg_replication_slots WHERE slot_name = '" + slot + "'");
  return rows.empty() || !rows[0][0] ? std::string() : *rows[0][0];
}

outcome<void> run_once(replication_settings s) {
  s.max_attempts = 1;
  recording_sink sink;
  running_client c(std::move(s), sink);
  test::wait_until([&] { return c.finished.load(); }, std::chrono::seconds(30));
  c.stop();
  REQUIRE(c.result);
  return *c.result;
}

}  // namespace

TEST_CASE("frames for real inserts, and confirmed_flush_lsn advances only to the reported flush position") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE rep_items(id int PRIMARY KEY, name text); CREATE PUBLICATION rep_pub FOR TABLE rep_items;");
  recording_sink sink;
  auto s = settings_for("rep_slot", "rep_pub");
  s.status_interval = std::chrono::milliseconds(200);
  running_client c(s, sink);
  REQUIRE(test::wait_until([&] { return c.client.streaming(); }));
  CHECK(sink.last_start().proto_version == protocol::max_pgoutput_protocol(pg.server_major()));

  pg.sql("INSERT INTO rep_items VALUES (1, 'one'), (2, 'two'), (3, 'three')");
  pg.sql("INSERT INTO rep_items VALUES (4, 'four')");
  REQUIRE(test::wait_until([&] { return sink.commits().size() == 2; }));
  CHECK(sink.tags() == "BRIIICBIC");
  auto payloads = sink.payloads();
  CHECK(payloads[1].find("rep_items") != std::string::npos);   // the Relation message
  CHECK(payloads[2].find("one") != std::string::npos);

  auto commits = sink.commits();
  // Nothing reported durable yet: the slot has not moved past where it was created.
  std::string created_at = slot_value("rep_slot", "confirmed_flush_lsn");
  CHECK(lsn::parse(created_at) < commits[0]);

  sink.set_durable(commits[0]);
  REQUIRE(test::wait_until([&] { return slot_value("rep_slot", "confirmed_flush_lsn") == commits[0].to_string(); }));
  // Stays there: never beyond what we said is durable, although more was received.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  CHECK(slot_value("rep_slot", "confirmed_flush_lsn") == commits[0].to_string());
  CHECK(c.client.positions().acknowledged == commits[0]);
  CHECK(c.client.positions().received >= commits[1]);

  sink.set_durable(commits[1]);
  REQUIRE(test::wait_until([&] { return slot_value("rep_slot", "confirmed_flush_lsn") == commits[1].to_string(); }));
  c.stop();
  CHECK(c.result);
  CHECK(slot_value("rep_slot", "active") == "f");
}

TEST_CASE("keepalives that request a reply are answered at once") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE ka_items(id int PRIMARY KEY); CREATE PUBLICATION ka_pub FOR TABLE ka_items;");
  pg.sql("ALTER SYSTEM SET wal_sender_timeout = '1s'");
  pg.sql("SELECT pg_reload_conf()");
  recording_sink sink;
  auto s = settings_for("ka_slot", "ka_pub");
  // Our own timer would keep the walsender content; make it slower than the server's timeout
  // so that only the answers to its reply requests keep the connection alive.
  s.status_interval = std::chrono::seconds(30);
  s.ack_delay = std::chrono::seconds(30);
  running_client c(s, sink);
  REQUIRE(test::wait_until([&] { return c.client.streaming(); }));
  REQUIRE(test::wait_until([&] { return sink.reply_requests() >= 3; }, std::chrono::seconds(15)));
  // Three timeouts' worth have passed: the walsender would have dropped us had we not answered.
  CHECK(c.client.reconnects() == 0);
  CHECK(c.client.streaming());
  pg.sql("ALTER SYSTEM RESET wal_sender_timeout");
  pg.sql("SELECT pg_reload_conf()");
}

TEST_CASE("reconnects with backoff and resumes from the durable position") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE rc_items(id int PRIMARY KEY); CREATE PUBLICATION rc_pub FOR TABLE rc_items;");
  recording_sink sink;
  sink.set_auto_durable(true);
  auto s = settings_for("rc_slot", "rc_pub");
  s.status_interval = std::chrono::milliseconds(200);
  running_client c(s, sink);
  REQUIRE(test::wait_until([&] { return c.client.streaming(); }));
  pg.sql("INSERT INTO rc_items VALUES (1)");
  REQUIRE(test::wait_until([&] { return sink.commits().size() == 1; }));
  REQUIRE(test::wait_until([&] { return slot_value("rc_slot", "confirmed_flush_lsn") == sink.commits()[0].to_string(); }));

  pg.sql("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'rc_slot'");
  pg.sql("INSERT INTO rc_items VALUES (2)");
  REQUIRE(test::wait_until([&] { return sink.commits().size() == 2; }));
  CHECK(c.client.reconnects() >= 1);
  CHECK(sink.starts() >= 2);
  // Resumed from the durable position: the first transaction is not delivered again.
  CHECK(sink.last_start().start == sink.commits()[0]);
  CHECK(sink.tags() == "BRICBRIC");
}

TEST_CASE("pre-flight: missing publication, wrong plugin, slot in use, role, server settings") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE pf_items(id int PRIMARY KEY); CREATE PUBLICATION pf_pub FOR TABLE pf_items;");

  auto missing = run_once(settings_for("pf_slot", "no_such_pub"));
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message.find("publication \"no_such_pub\" does not exist") != std::string::npos);
  CHECK(missing.error().message.find("CREATE PUBLICATION") != std::string::npos);
  CHECK_FALSE(missing.error().retryable);

  pg.sql("SELECT pg_create_logical_replication_slot('pf_test_decoding', 'test_decoding')");
  auto plugin = run_once(settings_for("pf_test_decoding", "pf_pub"));
  REQUIRE_FALSE(plugin);
  CHECK(plugin.error().message.find("uses the plugin \"test_decoding\", not pgoutput") != std::string::npos);

  auto no_create = settings_for("pf_absent", "pf_pub");
  no_create.create_slot = false;
  auto absent = run_once(no_create);
  REQUIRE_FALSE(absent);
  CHECK(absent.error().message.find("does not exist") != std::string::npos);

  recording_sink first_sink;
  running_client first(settings_for("pf_busy", "pf_pub"), first_sink);
  REQUIRE(test::wait_until([&] { return first.client.streaming(); }));
  auto busy = run_once(settings_for("pf_busy", "pf_pub"));
  REQUIRE_FALSE(busy);
  CHECK(busy.error().sqlstate == "55006");
  CHECK(busy.error().message.find("is active for PID") != std::string::npos);
  first.stop();

  auto norepl = settings_for("pf_slot", "pf_pub");
  norepl.conn = *parse_conninfo(pg.tcp_conninfo("dbname=postgres user=norepl_user sslmode=disable")).params;
  auto role = run_once(norepl);
  REQUIRE_FALSE(role);
  CHECK(role.error().message.find("REPLICATION") != std::string::npos);
  CHECK_FALSE(role.error().retryable);

  auto bad_slot = run_once(settings_for("Bad-Name", "pf_pub"));
  REQUIRE_FALSE(bad_slot);
  CHECK(bad_slot.error().message.find("invalid slot name") != std::string::npos);
}

TEST_CASE("pre-flight: wal_level not logical, and no free replication slot") {
  proxy::cluster_options o;
  o.name = "walgate-test-replica";
  o.extra_conf = {"wal_level = replica", "max_replication_slots = 1"};
  std::string error;
  auto replica = proxy::local_cluster::start(o, error);
  REQUIRE_MESSAGE(replica, error);
  replica->sql("CREATE PUBLICATION p FOR ALL TABLES");
  auto s = settings_for("s1", "p");
  s.conn = *parse_conninfo(replica->conninfo()).params;
  auto level = run_once(s);
  REQUIRE_FALSE(level);
  CHECK(level.error().message.find("wal_level is 'replica'") != std::string::npos);
  CHECK(level.error().message.find("wal_level = logical") != std::string::npos);
  replica.reset();

  o.name = "walgate-test-full";
  o.extra_conf = {"max_replication_slots = 1"};
  auto full = proxy::local_cluster::start(o, error);
  REQUIRE_MESSAGE(full, error);
  full->sql("CREATE PUBLICATION p FOR ALL TABLES");
  full->sql("SELECT pg_create_logical_replication_slot('taken', 'pgoutput')");
  s.conn = *parse_conninfo(full->conninfo()).params;
  auto slots = run_once(s);
  REQUIRE_FALSE(slots);
  CHECK(slots.error().message.find("no free replication slot") != std::string::npos);
  CHECK(slots.error().message.find("max_replication_slots") != std::string::npos);
}

TEST_CASE("a dropped slot is not silently recreated past stored changes; a slot acknowledged past them or invalidated is refused") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE gone_items(id int PRIMARY KEY); CREATE PUBLICATION gone_pub FOR TABLE gone_items;");
  {  // a consumer that stored nothing yet may create the slot
    recording_sink sink;
    running_client c(settings_for("gone_slot", "gone_pub"), sink);
    REQUIRE(test::wait_until([&] { return c.client.streaming(); }));
    c.stop();
  }
  pg.sql("SELECT pg_drop_replication_slot('gone_slot')");
  auto s = settings_for("gone_slot", "gone_pub");
  s.max_attempts = 1;
  recording_sink stored;
  stored.set_durable(*lsn::parse("0/1000000"));   // what an event log holds after a restart
  running_client c(s, stored);
  REQUIRE(test::wait_until([&] { return c.finished.load(); }, std::chrono::seconds(30)));
  c.stop();
  REQUIRE(c.result);
  REQUIRE_FALSE(*c.result);
  CHECK(c.result->error().message.find("does not exist, but changes up to 0/1000000 from it are already stored") !=
        std::string::npos);
  CHECK_FALSE(c.result->error().retryable);
  CHECK(slot_value("gone_slot", "slot_name").empty());   // and it was not created

  // A slot acknowledged past what is stored: another consumer, or an event log restored from a
  // backup. The server would start at the slot's position: refused, with why.
  pg.sql("CREATE TABLE ahead_items(id int PRIMARY KEY); CREATE PUBLICATION ahead_pub FOR TABLE ahead_items;");
  {
    recording_sink sink;
    running_client a(settings_for("ahead_slot", "ahead_pub"), sink);
    REQUIRE(test::wait_until([&] { return a.client.streaming(); }));
    a.stop();
  }
  REQUIRE(test::wait_until([&] { return slot_value("ahead_slot", "active") == "f"; }));
  auto stored_at = *lsn::parse(slot_value("ahead_slot", "confirmed_flush_lsn"));
  {  // another consumer takes a transaction and acknowledges it
    recording_sink other;
    other.set_auto_durable(true);
    running_client a(settings_for("ahead_slot", "ahead_pub"), other);
    REQUIRE(test::wait_until([&] { return a.client.streaming(); }));
    pg.sql("INSERT INTO ahead_items VALUES (1)");
    REQUIRE(test::wait_until([&] { return *lsn::parse(slot_value("ahead_slot", "confirmed_flush_lsn")) > stored_at; }));
    a.stop();
  }
  REQUIRE(test::wait_until([&] { return slot_value("ahead_slot", "active") == "f"; }));
  auto as = settings_for("ahead_slot", "ahead_pub");
  as.max_attempts = 1;
  {
    recording_sink older;
    older.set_durable(stored_at);
    running_client a(as, older);
    REQUIRE(test::wait_until([&] { return a.finished.load(); }, std::chrono::seconds(30)));
    a.stop();
    REQUIRE(a.result);
    REQUIRE_FALSE(*a.result);
    CHECK(a.result->error().message.find("was acknowledged up to") != std::string::npos);
    CHECK(a.result->error().message.find("past the changes stored here (up to " + stored_at.to_string() + ")") !=
          std::string::npos);
    CHECK_FALSE(a.result->error().retryable);
  }
  {  // stored up to where the slot is: a plain restart
    recording_sink same;
    same.set_durable(*lsn::parse(slot_value("ahead_slot", "confirmed_flush_lsn")));
    running_client a(as, same);
    CHECK(test::wait_until([&] { return a.client.streaming(); }));
  }

  // A slot the server invalidated for want of WAL (max_slot_wal_keep_size) is refused with why.
  proxy::cluster_options o;
  o.name = "walgate-test-keep";
  o.extra_conf = {"max_slot_wal_keep_size = 1MB", "max_wal_size = 32MB", "min_wal_size = 32MB"};
  std::string error;
  auto keep = proxy::local_cluster::start(o, error);
  REQUIRE_MESSAGE(keep, error);
  keep->sql("CREATE TABLE k(x text); CREATE PUBLICATION p FOR ALL TABLES");
  keep->sql("SELECT pg_create_logical_replication_slot('lost_slot', 'pgoutput')");
  for (int i = 0; i < 4; ++i) keep->sql("INSERT INTO k SELECT repeat('x', 1000) FROM generate_series(1, 3000); SELECT pg_switch_wal()");
  keep->sql("CHECKPOINT");
  REQUIRE(test::wait_until([&] {
    auto rows = keep->sql("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'lost_slot'");
    return !rows.empty() && rows[0][0] && *rows[0][0] == "lost";
  }));
  auto ls = settings_for("lost_slot", "p");
  ls.conn = *parse_conninfo(keep->conninfo()).params;
  auto lost = run_once(ls);
  REQUIRE_FALSE(lost);
  CHECK(lost.error().message.find("was invalidated (wal_status lost)") != std::string::npos);
  CHECK_FALSE(lost.error().retryable);
}

TEST_CASE("streaming over TLS with SCRAM-SHA-256-PLUS") {
  auto& pg = test::cluster();
  pg.sql("CREATE TABLE tls_items(id int PRIMARY KEY); CREATE PUBLICATION tls_pub FOR TABLE tls_items;");
  recording_sink sink;
  auto s = settings_for("tls_slot", "tls_pub");
  s.conn = *parse_conninfo("host=localhost port=" + std::to_string(pg.port()) +
                           " dbname=postgres user=tls_only password='tls secret' sslmode=verify-full sslrootcert=" +
                           pg.ca_file().string())
                .params;
  running_client c(s, sink);
  REQUIRE(test::wait_until([&] { return c.client.streaming(); }));
  pg.sql("INSERT INTO tls_items VALUES (42)");
  REQUIRE(test::wait_until([&] { return sink.commits().size() == 1; }));
  CHECK(sink.tags() == "BRIC");
}
