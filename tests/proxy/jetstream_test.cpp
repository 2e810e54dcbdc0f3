// Scale-out, origin side: the event log published to NATS JetStream (real nats-server processes
// started here, a 3-node cluster on loopback ports), under faults — the walgate executable
// killed with SIGKILL, NATS nodes killed, all of JetStream down for a while — then the stream
// read back message by message: every event exactly once, in log order, with its headers, and
// its records replayed into a model of each table equal to SELECT.
//
// ctest label "nats"; needs nats-server (.ci/install-deps.sh installs it): without it, SKIPPED.
#include "walgate/proxy/jetstream.hpp"
#include "walgate/transform/formats.hpp"
#include "walgate/transform/record.hpp"

#include "fault_harness.hpp"
#include "jwt_helpers.hpp"
#include "nats_harness.hpp"

#include <doctest/doctest.h>

#include <fstream>

using namespace walgate;
using namespace walgate::test::fault_harness;
using namespace walgate::test::nats_harness;

namespace {


/// A metric's value from walgate's /metrics (-1: not there, or walgate not answering); with
/// --auth jwt, bearer is a token with the admin claim.
long long metric(std::uint16_t port, const std::string& name, const std::string& bearer = {}) {
  const std::string text = http_get(port, "/metrics", bearer).second;
  const auto at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + name.size() + 2));
}

/// A stream request's status (its head only: a 200 stream does not end).
int status_of(std::uint16_t port, const std::string& target) {
  asio::io_context io;
  tcp::socket s(io);
  boost::system::error_code ec;
  s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return -1;
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "localhost");
  http::write(s, req, ec);
  beast::flat_buffer b;
  http::response_parser<http::string_body> p;
  http::read_header(s, b, p, ec);
  return ec ? -1 : p.get().result_int();
}

/// The first `n` lines of a stream request's body (NDJSON), or fewer when `wait` passes first
/// or nothing comes for `idle`.
std::vector<std::string> first_lines(std::uint16_t port, const std::string& target, std::size_t n,
                                     std::chrono::seconds wait = std::chrono::seconds(60),
                                     std::chrono::seconds idle = std::chrono::seconds(60)) {
  std::vector<std::string> out;
  asio::io_context io;
  tcp::socket s(io);
  boost::system::error_code ec;
  s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return out;
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "localhost");
  http::write(s, req, ec);
  if (ec) return out;
  beast::flat_buffer b;
  b.reserve(1 << 20);   // (reads of up to 64 KiB, Beast's cap, not of the 512 bytes a small buffer gives)
  http::response_parser<http::string_body> p;
  p.body_limit(boost::none);
  http::read_header(s, b, p, ec);
  if (ec) return out;
  if (p.get().result_int() != 200) {
    http::read(s, b, p, ec);
    out.push_back("HTTP " + std::to_string(p.get().result_int()) + ": " + p.get().body());
    return out;
  }
  const auto until = std::chrono::steady_clock::now() + wait;
  auto last_data = std::chrono::steady_clock::now();
  std::size_t consumed = 0;
  bool failed = false;
  for (;;) {
    test::parse_buffered(p, b);   // (what is left needs more bytes: wait for the socket)
    auto& body = p.get().body();
    std::size_t nl;
    while (out.size() < n && (nl = body.find('\n', consumed)) != std::string::npos) {
      if (nl > consumed) out.push_back(body.substr(consumed, nl - consumed));   // (blank: keep-alive)
      consumed = nl + 1;
    }
    const auto now = std::chrono::steady_clock::now();
    if (failed || p.is_done() || out.size() >= n || now >= until || now - last_data >= idle) break;
    pollfd pf{s.native_handle(), POLLIN, 0};
    if (::poll(&pf, 1, 100) <= 0) continue;
    last_data = std::chrono::steady_clock::now();
    http::read_some(s, b, p, ec);
    failed = static_cast<bool>(ec);
  }
  return out;
}

/// Replays native events into a model of each table (as the fault tests' client does).
void apply_native(std::map<std::string, table_model>& tables, const std::string& line, std::vector<std::string>& problems) {
  auto v = json::parse(line);
  auto& o = v.as_object();
  const std::string op(o.at("op").as_string());
  if (op == "message") return;
  auto& t = tables[std::string(o.at("table").as_string())];
  auto key = [](const json::value& row) { return row.as_object().at("id").to_number<long long>(); };
  if (op == "insert" || op == "read") {
    t[key(o.at("after"))] = std::string(o.at("after").at("v").as_string());
  } else if (op == "update") {
    if (!o.at("before").is_null()) t.erase(key(o.at("before")));
    t[key(o.at("after"))] = std::string(o.at("after").at("v").as_string());
  } else if (op == "delete") {
    if (!t.erase(key(o.at("before")))) problems.push_back("delete of a row not in the model: " + line);
  } else if (op == "truncate") {
    t.clear();
  }
}

}  // namespace

TEST_CASE("subjects: names made subject-safe; a stream's configuration checked against the options") {
  CHECK(proxy::subject_token("orders") == "orders");
  CHECK(proxy::subject_token("order items") == "order~20items");
  CHECK(proxy::subject_token("a.b*>~") == "a~2Eb~2A~3E~7E");
  CHECK(proxy::subject_token("Ünï") == "~C3~9Cn~C3~AF");
  CHECK(proxy::subject_token("snake_case-1") == "snake_case-1");
  CHECK(proxy::header_value("public.t:1") == "public.t:1");
  CHECK(proxy::header_value("public.t:a\r\nNats-Msg-Id: x") == "public.t:a%0D%0ANats-Msg-Id: x");
  CHECK(proxy::header_value("100%\xC3\xA9") == "100%25%C3%A9");
  proxy::logged_event e;
  e.schema = "public";
  e.table = "line items";
  CHECK(proxy::event_subject("wg", e) == "wg.public.line~20items");
  e.kind = transform::op::message;
  e.schema.clear();
  e.table.clear();
  CHECK(proxy::event_subject("wg.x", e) == "wg.x.~message");

  // Resume positions in a stream by binary search: ids 0/100:0..4, 0/200:0..4, … at seqs 11…
  std::vector<transform::event_id> ids;
  for (std::uint64_t t = 1; t <= 200; ++t)
    for (std::uint32_t i = 0; i < 5; ++i) ids.push_back({protocol::lsn{t * 0x100}, i});
  auto id_at = [&](std::uint64_t seq) -> std::optional<transform::event_id> { return ids[seq - 11]; };
  const std::uint64_t first = 11, last = 11 + ids.size() - 1;
  std::size_t gets = 0, most = 0;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    CHECK(proxy::stream_seq_after(ids[k], first, last, id_at, &gets) == first + k + 1);
    most = std::max(most, gets);
  }
  CHECK(most <= 12);   // 1 + log2(1000)
  CHECK(proxy::stream_seq_after({protocol::lsn{0x50}, 0}, first, last, id_at) == 0u);                   // before it: 410
  CHECK(proxy::stream_seq_after({protocol::lsn{0x100}, 9}, first, last, id_at) == first + 5);           // between two
  CHECK(proxy::stream_seq_after({protocol::lsn{0x100}, 0, transform::event_id::mark::commit}, first, last, id_at) == first + 5);
  CHECK(proxy::stream_seq_after({protocol::lsn{0x200}, 0, transform::event_id::mark::begin}, first, last, id_at) == first + 5);
  CHECK(proxy::stream_seq_after({protocol::lsn{0xFFFFF}, 0}, first, last, id_at) == last + 1);           // the head
  CHECK_FALSE(proxy::stream_seq_after(ids[500], first, last, [](std::uint64_t) { return std::optional<transform::event_id>{}; }));

  proxy::jetstream_options want;
  want.subject_prefix = "wg";
  want.replicas = 3;
  proxy::jetstream_stream_config have;
  have.subjects = {"wg.>"};
  have.replicas = 3;
  CHECK(proxy::stream_mismatch(have, want).empty());
  have.subjects = {"wg.>", "other.>"};
  have.replicas = 1;
  have.discard_old = false;
  have.file_storage = false;
  have.max_msgs_per_subject = 10;
  const auto diff = proxy::stream_mismatch(have, want);
  CHECK(diff.find("its subjects are [wg.>,other.>]") != std::string::npos);
  CHECK(diff.find("1 replica(s), --nats-replicas says 3") != std::string::npos);
  CHECK(diff.find("discards new") != std::string::npos);
  CHECK(diff.find("its storage is memory") != std::string::npos);
  CHECK(diff.find("at most 10 messages per subject") != std::string::npos);
}

TEST_CASE("JetStream origin: under kill -9 of walgate, of NATS nodes and all of JetStream down for a minute, the stream holds every event once, in order, equal to SELECT") {
  if (nats_server_binary().empty()) {
    MESSAGE("SKIPPED: nats-server is not installed (.ci/install-deps.sh installs Debian's nats-server)");
    return;
  }
  nats_cluster nats(3);
  scenario sc("jsa");
  const std::string stream = "WG_JSA";
  sc.gw.args.insert(sc.gw.args.end(), {"--nats", nats.urls(), "--nats-stream", stream, "--nats-replicas", "3",
                                       "--nats-subject-prefix", "wg.jsa"});
  sc.start_streaming();
  {
    writer w(test::cluster().conninfo(), "jsa", 11, /*truncate=*/true);
    // walgate killed at random moments (the publisher finds where the stream ends each time).
    for (int i = 0; i < cycles(3); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(random_ms(400, 1500)));
      REQUIRE(sc.gw.kill_with(SIGKILL) == 128 + SIGKILL);
      sc.start();
    }
    // A NATS node killed, then another after the first is back.
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    nats.kill(0);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    nats.restart(0);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    nats.kill(1);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    nats.restart(1);
    // All of JetStream down: the origin goes on logging (and serving), the lag grows.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    for (std::size_t i = 0; i < 3; ++i) nats.kill(i);
    const long long logged_before = metric(sc.port, "walgate_log_next_seq");
    // (a minute, as the issue asks; WALGATE_NATS_OUTAGE_S shortens it for a quick run)
    const char* outage = std::getenv("WALGATE_NATS_OUTAGE_S");
    std::this_thread::sleep_for(std::chrono::seconds(outage ? std::max(1, std::atoi(outage)) : 60));
    const long long logged_after = metric(sc.port, "walgate_log_next_seq");
    CHECK(logged_after > logged_before);
    CHECK(metric(sc.port, "walgate_nats_publish_lag_events") > 0);
    CHECK(metric(sc.port, "walgate_nats_publish_lag_bytes") > 0);
    CHECK(metric(sc.port, "walgate_nats_connected") == 0);
    for (std::size_t i = 0; i < 3; ++i) nats.start(i);
    for (std::size_t i = 0; i < 3; ++i) nats.wait_listening(i);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    w.finish();
    MESSAGE("statements " << w.statements.load());
    CHECK(w.statements > 0);
  }
  // Caught up: nothing the log holds is unconfirmed.
  REQUIRE_MESSAGE(test::wait_until(
                      [&] {
                        return metric(sc.port, "walgate_nats_publish_lag_events") == 0 &&
                               metric(sc.port, "walgate_nats_connected") == 1;
                      },
                      std::chrono::seconds(120)),
                  sc.gw.log());
  const long long logged = metric(sc.port, "walgate_log_next_seq");
  CHECK(metric(sc.port, "walgate_nats_fault") == 0);
  // (caught up, the byte lag is 0 too: not the last transaction's commit frame)
  CHECK(metric(sc.port, "walgate_nats_publish_lag_bytes") == 0);

  // The stream, message by message.
  stream_reader r(nats.urls(), stream);
  std::optional<std::pair<std::uint64_t, std::uint64_t>> st;
  REQUIRE(test::wait_until([&] { return (st = r.state()).has_value(); }, std::chrono::seconds(30)));
  MESSAGE("events logged " << logged << ", stream last seq " << st->first << ", messages " << st->second);
  CHECK(st->second == st->first);                              // nothing deleted in between
  CHECK(st->first == static_cast<std::uint64_t>(logged));      // every event of the log, once
  std::map<std::string, table_model> model;
  std::vector<std::string> problems;
  transform::event_id last{};
  std::string last_commit;
  bool txn_ended = true;
  std::uint64_t checked = 0, truncates = 0;
  for (std::uint64_t seq = 1; seq <= st->first; ++seq) {
    auto m = r.get(seq);
    REQUIRE_MESSAGE(m, "stream message " << seq << " cannot be read");
    const auto& h = m->headers;
    if (!h.count("Walgate-Id") || !h.count("Walgate-Seq") || !h.count("Nats-Msg-Id")) {
      problems.push_back("message " + std::to_string(seq) + " lacks its headers");
      continue;
    }
    auto id = transform::event_id::parse(h.at("Walgate-Id"));
    if (!id || !(last < *id)) problems.push_back("message " + std::to_string(seq) + ": id " + h.at("Walgate-Id") + " after " + last.to_string());
    if (id) last = *id;
    if (h.at("Nats-Msg-Id") != h.at("Walgate-Id")) problems.push_back("message " + std::to_string(seq) + ": Nats-Msg-Id differs");
    if (h.at("Walgate-Seq") != std::to_string(seq - 1)) problems.push_back("message " + std::to_string(seq) + ": log seq " + h.at("Walgate-Seq"));
    // A transaction's messages: its last one (only) marked.
    const std::string commit = id ? id->commit_lsn.to_string() : "";
    if (commit != last_commit && !txn_ended) problems.push_back("transaction " + last_commit + " has no Walgate-Txn-End");
    if (commit == last_commit && txn_ended) problems.push_back("transaction " + commit + " has a Walgate-Txn-End before its last event");
    last_commit = commit;
    txn_ended = h.count("Walgate-Txn-End") > 0;
    auto rec = transform::read_record(protocol::bytes_view(reinterpret_cast<const std::byte*>(m->body.data()), m->body.size()));
    if (!rec) {
      problems.push_back("message " + std::to_string(seq) + ": its record does not decode");
      continue;
    }
    const auto& c = (*rec)->get();
    if (m->subject != "wg.jsa.public." + (*rec)->table()) problems.push_back("message " + std::to_string(seq) + " on " + m->subject);
    const std::string key = h.count("Walgate-Key") ? h.at("Walgate-Key") : "";
    if (key != (c.kind == transform::op::truncate ? std::string() : proxy::header_value(transform::waltail_ordering_key(c))))
      problems.push_back("message " + std::to_string(seq) + ": key " + key);
    truncates += c.kind == transform::op::truncate;
    std::string line;
    REQUIRE(transform::encode_change(line, c, transform::format::native));
    apply_native(model, line, problems);
    ++checked;
  }
  CHECK(txn_ended);
  // Resume positions found in the real stream by direct gets (what an edge will do): 200 ids.
  {
    std::size_t gets = 0, total_gets = 0;
    std::uint64_t wrong = 0;
    auto id_at = [&](std::uint64_t seq) -> std::optional<transform::event_id> {
      auto v = r.direct_header(seq, "Walgate-Id");
      if (!v) return std::nullopt;
      return transform::event_id::parse(*v);
    };
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < 200; ++k) {
      const std::uint64_t seq = 1 + static_cast<std::uint64_t>(rng()() % st->first);
      auto id = id_at(seq);
      REQUIRE(id);
      auto found = proxy::stream_seq_after(*id, 1, st->first, id_at, &gets);
      wrong += !found || *found != seq + 1;
      total_gets += gets;
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("resume positions by binary search over " << st->first << " messages: " << total_gets / 200.0
                                                       << " direct gets and " << ms / 200 << " ms each (3 replicas)");
    CHECK(wrong == 0);
  }
  for (const auto& p : problems) FAIL_CHECK(p);
  CHECK(problems.empty());
  CHECK(checked == st->first);
  MESSAGE("truncates in the stream: " << truncates);
  sql_conn q(test::cluster().conninfo());
  CHECK(model["jsa_a"] == select_table(q, "jsa_a"));
  CHECK(model["jsa_b"] == select_table(q, "jsa_b"));
  // The outages made publishes fail, and the publisher found the stream's end again after them.
  std::string said;
  {
    const std::string log = sc.gw.log();
    for (std::size_t at = 0, nl; at < log.size(); at = nl + 1) {
      nl = log.find('\n', at);
      if (nl == std::string::npos) nl = log.size();
      if (log.compare(at, 18, "walgate: JetStream") == 0) said += log.substr(at, nl - at + 1);
    }
  }
  MESSAGE("walgate said:\n" << said);
  CHECK(metric(sc.port, "walgate_nats_resyncs_total") >= 1);
}

TEST_CASE("JetStream origin: a stream that does not match is a clear error; walgate goes on logging and serving") {
  if (nats_server_binary().empty()) {
    MESSAGE("SKIPPED: nats-server is not installed (.ci/install-deps.sh installs Debian's nats-server)");
    return;
  }
  nats_cluster nats(1);
  {   // a stream of that name with other subjects
    stream_reader r(nats.url(0), "WG_JSM");
    jsStreamConfig cfg;
    jsStreamConfig_Init(&cfg);
    const char* subjects[] = {"elsewhere.>"};
    cfg.Name = "WG_JSM";
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    jsStreamInfo* si = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    REQUIRE(js_AddStream(&si, r.js, &cfg, nullptr, &jerr) == NATS_OK);
    jsStreamInfo_Destroy(si);
  }
  scenario sc("jsm");
  sc.gw.args.insert(sc.gw.args.end(), {"--nats", nats.url(0), "--nats-stream", "WG_JSM"});
  sc.start_streaming();
  REQUIRE_MESSAGE(test::wait_until([&] { return sc.gw.log().find("stream WG_JSM does not match") != std::string::npos; },
                                   std::chrono::seconds(20)),
                  sc.gw.log());
  CHECK(sc.gw.log().find("its subjects are [elsewhere.>], walgate publishes on walgate.>") != std::string::npos);
  CHECK(metric(sc.port, "walgate_nats_fault") == 1);
  // The origin itself goes on: its clients get the changes, the lag counts them.
  resuming_client client(sc.port, "");
  sql_conn q(test::cluster().conninfo());
  REQUIRE(q.exec("INSERT INTO jsm_a VALUES (1, 'one')"));
  CHECK(test::wait_until(
      [&] {
        std::lock_guard<std::mutex> g(client.m);
        return client.tables["jsm_a"] == table_model{{1, "one"}};
      },
      std::chrono::seconds(20)));
  client.finish();
  CHECK(client.problems.empty());
  CHECK(metric(sc.port, "walgate_nats_publish_lag_events") >= 1);
  CHECK(metric(sc.port, "walgate_nats_connected") == 0);
}

TEST_CASE("JetStream origin: an event larger than the servers' max_payload stops publishing there, saying so; nothing skipped") {
  if (nats_server_binary().empty()) {
    MESSAGE("SKIPPED: nats-server is not installed (.ci/install-deps.sh installs Debian's nats-server)");
    return;
  }
  nats_cluster nats(1, "max_payload: 8192");
  scenario sc("jsp");
  sc.gw.args.insert(sc.gw.args.end(), {"--nats", nats.url(0), "--nats-stream", "WG_JSP"});
  sc.start_streaming();
  sql_conn q(test::cluster().conninfo());
  REQUIRE(q.exec("INSERT INTO jsp_a VALUES (1, 'small')"));
  REQUIRE(test::wait_until([&] { return metric(sc.port, "walgate_nats_stream_last_seq") == 1; }, std::chrono::seconds(30)));
  // Caught up: no lag, in events or in bytes (the commit frame after the last event is not lag).
  REQUIRE(test::wait_until([&] { return metric(sc.port, "walgate_nats_publish_lag_events") == 0; }, std::chrono::seconds(30)));
  CHECK(metric(sc.port, "walgate_nats_publish_lag_bytes") == 0);
  REQUIRE(q.exec("INSERT INTO jsp_a VALUES (2, repeat('x', 20000))"));
  REQUIRE(q.exec("INSERT INTO jsp_a VALUES (3, 'after it')"));
  REQUIRE_MESSAGE(test::wait_until([&] { return sc.gw.log().find("more than the NATS servers take (max_payload 8192)") != std::string::npos; },
                                   std::chrono::seconds(30)),
                  sc.gw.log());
  CHECK(test::wait_until([&] { return metric(sc.port, "walgate_nats_fault") == 1; }, std::chrono::seconds(60)));
  // Not skipped: the stream still ends at the event before it, the rest waits in the log.
  CHECK(metric(sc.port, "walgate_nats_stream_last_seq") == 1);
  CHECK(metric(sc.port, "walgate_nats_publish_lag_events") == 2);
  CHECK(metric(sc.port, "walgate_nats_publish_lag_bytes") > 20000);   // (the large event's frame among them)
  stream_reader r(nats.url(0), "WG_JSP");
  auto st = r.state();
  REQUIRE(st);
  CHECK(st->first == 1);
}

TEST_CASE("JetStream origin: a stream whose last message aged out continues after the confirmed event kept in the data directory; without it, a fault") {
  if (nats_server_binary().empty()) {
    MESSAGE("SKIPPED: nats-server is not installed (.ci/install-deps.sh installs Debian's nats-server)");
    return;
  }
  nats_cluster nats(1);
  scenario sc("jsc");
  sc.gw.args.insert(sc.gw.args.end(), {"--nats", nats.url(0), "--nats-stream", "WG_JSC", "--nats-max-age", "2"});
  sc.start_streaming();
  sql_conn q(test::cluster().conninfo());
  REQUIRE(q.exec("INSERT INTO jsc_a VALUES (1, 'a'), (2, 'b'), (3, 'c')"));
  REQUIRE(test::wait_until([&] { return metric(sc.port, "walgate_nats_stream_last_seq") == 3; }, std::chrono::seconds(30)));
  stream_reader r(nats.url(0), "WG_JSC");
  auto m3 = r.get(3);
  REQUIRE(m3);
  const std::string third = m3->headers["Walgate-Id"];
  // Aged out: the stream is empty, its last sequence stays 3.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> st;
  REQUIRE(test::wait_until([&] { return (st = r.state()) && st->second == 0; }, std::chrono::seconds(30)));
  CHECK(st->first == 3);
  // kill -9: the cursor was saved when publishing went idle.
  REQUIRE(sc.gw.kill_with(SIGKILL) == 128 + SIGKILL);
  REQUIRE(q.exec("INSERT INTO jsc_a VALUES (4, 'd'), (5, 'e')"));
  sc.start();
  REQUIRE_MESSAGE(test::wait_until([&] { return metric(sc.port, "walgate_nats_stream_last_seq") == 5; }, std::chrono::seconds(30)),
                  sc.gw.log());
  CHECK(metric(sc.port, "walgate_nats_fault") == 0);
  auto m4 = r.get(4);
  REQUIRE(m4);
  CHECK(m4->headers["Walgate-Seq"] == "3");
  CHECK(transform::event_id::parse(third).value() < transform::event_id::parse(m4->headers["Walgate-Id"]).value());
  // Without the cursor file: the end cannot be told; publishing stops, saying why.
  REQUIRE(test::wait_until([&] { return (st = r.state()) && st->second == 0; }, std::chrono::seconds(30)));
  REQUIRE(sc.gw.kill_with(SIGKILL) == 128 + SIGKILL);
  std::filesystem::remove(sc.data_dir / "jetstream.cursor");
  REQUIRE(q.exec("INSERT INTO jsc_a VALUES (6, 'f')"));
  sc.start();
  REQUIRE_MESSAGE(test::wait_until([&] { return sc.gw.log().find("last message (seq 5) is gone") != std::string::npos; },
                                   std::chrono::seconds(30)),
                  sc.gw.log());
  CHECK(test::wait_until([&] { return metric(sc.port, "walgate_nats_fault") == 1; }));
  CHECK(r.state()->first == 5);
}

TEST_CASE("walgate edge: two edges serve the stream on every transport; an edge killed, a NATS node killed, the origin killed; clients resume on the other edge; every replay equals SELECT") {
  if (nats_server_binary().empty()) {
    MESSAGE("SKIPPED: nats-server is not installed (.ci/install-deps.sh installs Debian's nats-server)");
    return;
  }
  nats_cluster nats(3);
  scenario sc("jse");
  sc.gw.args.insert(sc.gw.args.end(), {"--nats", nats.urls(), "--nats-stream", "WG_JSE", "--nats-replicas", "3",
                                       "--nats-subject-prefix", "wg.jse"});
  sc.start_streaming();
  auto database = [] {
    sql_conn q(test::cluster().conninfo());
    std::vector<std::vector<std::string>> rows;
    REQUIRE(q.exec("SELECT current_database()", &rows));
    return rows.at(0).at(0);
  };
  struct edge {
    walgate_process p;
    std::uint16_t port = free_port();
    std::filesystem::path dir;
    edge(const std::string& urls, const std::string& database) {
      std::string t = (std::filesystem::temp_directory_path() / "walgate-edge-XXXXXX").string();
      dir = mkdtemp(t.data());
      p.args = {"edge", "--nats", urls, "--nats-stream", "WG_JSE", "--nats-subject-prefix", "wg.jse", "--listen",
                "127.0.0.1:" + std::to_string(port), "--data-dir", dir.string(), "--debezium-db", database};
    }
    ~edge() { std::filesystem::remove_all(dir); }
    void start() {
      p.start();
      REQUIRE_MESSAGE(test::wait_until([&] { return p.listening.load(); }, std::chrono::seconds(30)), p.log());
    }
  };
  const std::string db = database();
  edge e1(nats.urls(), db), e2(nats.urls(), db);
  e1.start();
  e2.start();
  // An edge takes no snapshot.
  CHECK(http_get(e1.port, "/v1/stream?snapshot=true").second.find("an edge (walgate edge) takes no snapshots") != std::string::npos);
  std::vector<std::unique_ptr<resuming_client>> clients;
  {
    writer w(test::cluster().conninfo(), "jse", 5);
    clients.push_back(std::make_unique<resuming_client>(e1.port, "", transport::ndjson));
    clients.push_back(std::make_unique<resuming_client>(e1.port, "", transport::sse));
    clients.push_back(std::make_unique<resuming_client>(e2.port, "", transport::websocket));
    clients[0]->alt_port = e2.port;
    clients[1]->alt_port = e2.port;
    clients[2]->alt_port = e1.port;
    // (an edge serves once it holds the stream's first transaction: the kills start after that)
    REQUIRE(test::wait_until([&] { return metric(e1.port, "walgate_edge_ready") == 1 && metric(e2.port, "walgate_edge_ready") == 1; },
                             std::chrono::seconds(60)));
    std::this_thread::sleep_for(std::chrono::seconds(3));
    w.big_now = true;                                    // (20,000 rows in one transaction: in flight)
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    REQUIRE(e1.p.kill_with(SIGKILL) == 128 + SIGKILL);   // its clients go on at e2
    std::this_thread::sleep_for(std::chrono::seconds(3));
    e1.start();                                          // its mirror goes on from its own log
    std::this_thread::sleep_for(std::chrono::seconds(2));
    nats.kill(1);                                        // a NATS node down: the edges' consumers go on
    std::this_thread::sleep_for(std::chrono::seconds(3));
    nats.restart(1);
    REQUIRE(sc.gw.kill_with(SIGKILL) == 128 + SIGKILL);  // the origin killed: its publisher goes on after a restart
    std::this_thread::sleep_for(std::chrono::seconds(1));
    sc.start();
    REQUIRE(e2.p.kill_with(SIGKILL) == 128 + SIGKILL);   // now every client is at e1
    std::this_thread::sleep_for(std::chrono::seconds(3));
    e2.start();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    w.finish();
    MESSAGE("statements " << w.statements.load());
    CHECK(w.bigs.load() == 1);
  }
  sql_conn q(test::cluster().conninfo());
  const table_model a = select_table(q, "jse_a"), b = select_table(q, "jse_b");
  for (auto& c : clients) {
    const bool equal = test::wait_until(
        [&] {
          std::lock_guard<std::mutex> g(c->m);
          return c->tables["jse_a"] == a && c->tables["jse_b"] == b;
        },
        std::chrono::seconds(90));
    c->finish();
    MESSAGE("a client: " << c->events << " events, " << c->connections << " connections");
    CHECK_MESSAGE(equal, "edge 1 said:\n" << e1.p.log() << "\nedge 2 said:\n" << e2.p.log());
    CHECK(c->duplicates == 0);
    for (const auto& p : c->problems) FAIL_CHECK(p << "\nedge 1 said:\n" << e1.p.log() << "\nedge 2 said:\n" << e2.p.log());
    CHECK(c->connections >= 2);
  }
  CHECK(metric(e1.port, "walgate_edge_consuming") == 1);
  CHECK(metric(e1.port, "walgate_edge_events_mirrored_total") > 0);
  CHECK(metric(e1.port, "walgate_edge_fault") == 0);
  CHECK(http_get(e1.port, "/readyz").second == "{\"status\":\"streaming\"}\n");
  // Every format, from both edges, byte for byte what the origin sends, the whole log (Debezium's
  // source.db from --debezium-db; Waltail's seq equal too: the stream holds the origin's log from
  // its first event).
  const long long published = metric(sc.port, "walgate_nats_stream_last_seq");
  for (auto* e : {&e1, &e2})
    REQUIRE(test::wait_until([&] { return metric(e->port, "walgate_edge_stream_seq") >= published; }, std::chrono::seconds(60)));
  // (the last message copied is the stream's last: none after it, as JetStream counted then)
  for (auto* e : {&e1, &e2}) CHECK(metric(e->port, "walgate_edge_pending_messages") == 0);
  for (const char* f : {"native", "debezium&transactions=true&keys=true", "pgoutput2json", "pgoutput2json&compact=true",
                        "waltail&keys=true", "wal2json", "native&group=transaction"}) {
    const std::string target = std::string("/v1/stream?from=0/0:0&format=") + f;
    // (Debezium's top-level ts_ms is when the record was made: not compared)
    auto made = [](std::vector<std::string> lines) {   // "op":"c","ts_ms":<digits> -> "op":"c","ts_ms":_
      static constexpr std::string_view op = "\"op\":\"", ts = "\",\"ts_ms\":";
      for (auto& l : lines)
        for (std::size_t at = l.find(op); at != std::string::npos; at = l.find(op, at + 1)) {
          const std::size_t t = at + op.size() + 1;
          if (l.compare(t, ts.size(), ts) != 0) continue;
          std::size_t d = t + ts.size(), e = d;
          while (e < l.size() && l[e] >= '0' && l[e] <= '9') ++e;
          if (e > d) l.replace(d, e - d, "_");
        }
      return lines;
    };
    auto t0 = std::chrono::steady_clock::now();
    const auto origin = made(first_lines(sc.port, target, SIZE_MAX, std::chrono::seconds(120), std::chrono::seconds(3)));
    MESSAGE(std::string(f) << ": " << origin.size() << " lines from the origin in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
    CHECK_MESSAGE(origin.size() > (target.find("group=") == std::string::npos ? 20000u : 1000u), std::string(f) << ": " << (origin.empty() ? "" : origin.front()));
    for (auto* e : {&e1, &e2}) {
      t0 = std::chrono::steady_clock::now();
      const auto at_edge = made(first_lines(e->port, target, SIZE_MAX, std::chrono::seconds(120), std::chrono::seconds(3)));
      MESSAGE(std::string(f) << ": " << at_edge.size() << " lines from an edge in "
                << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
      CHECK_MESSAGE(at_edge.size() == origin.size(), std::string(f));
      std::size_t same = 0;
      while (same < std::min(origin.size(), at_edge.size()) && origin[same] == at_edge[same]) ++same;
      CHECK_MESSAGE(same == origin.size(), std::string(f) << ": line " << same << " differs:\norigin " << (same < origin.size() ? origin[same] : "")
                                            << "\nedge   " << (same < at_edge.size() ? at_edge[same] : ""));
    }
  }
}

TEST_CASE("walgate edge: serves while NATS is unreachable (not ready); SIGHUP and a changed file read the key files again") {
  const std::filesystem::path dir = [] {
    std::string t = (std::filesystem::temp_directory_path() / "walgate-edge-XXXXXX").string();
    return std::filesystem::path(mkdtemp(t.data()));
  }();
  const auto secret = dir / "secret";
  std::ofstream(secret) << std::string(40, 'k');
  const std::uint16_t port = free_port();
  walgate_process p;
  p.args = {"edge", "--nats", "nats://127.0.0.1:" + std::to_string(free_port()), "--nats-stream", "WG_JSH", "--listen",
            "127.0.0.1:" + std::to_string(port), "--data-dir", (dir / "data").string(), "--auth", "jwt", "--jwt-secret-file",
            secret.string()};
  p.start();
  REQUIRE_MESSAGE(test::wait_until([&] { return p.listening.load(); }, std::chrono::seconds(30)), p.log());
  CHECK(http_get(port, "/healthz").second == "{\"status\":\"ok\"}\n");
  CHECK(http_get(port, "/readyz").second.find("not streaming") != std::string::npos);
  CHECK(metric(port, "walgate_edge_consuming", test::token(test::hmac_key("HS256", std::string(40, 'k')),
                                                           R"("walgate_admin":true)")) == 0);
  CHECK(metric(port, "walgate_edge_consuming") == -1);   // (/metrics needs the admin claim under --auth jwt)
  ::kill(p.pid, SIGHUP);
  CHECK_MESSAGE(test::wait_until([&] { return p.log().find("SIGHUP: key files read again: 1 key(s)") != std::string::npos; },
                                 std::chrono::seconds(10)),
                p.log());
  std::ofstream(secret) << std::string(48, 'j');
  CHECK_MESSAGE(test::wait_until([&] { return p.log().find("a key file changed: read again") != std::string::npos; },
                                 std::chrono::seconds(10)),
                p.log());
  CHECK(p.kill_with(SIGTERM) == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("walgate edge: not served until it has copied the stream; where its copy begins decides what is gone (410), as on the origin") {
  if (nats_server_binary().empty()) {
    MESSAGE("SKIPPED: nats-server is not installed (.ci/install-deps.sh installs Debian's nats-server)");
    return;
  }
  nats_cluster nats(1);
  scenario sc("jsg");
  sc.gw.args.insert(sc.gw.args.end(), {"--nats", nats.url(0), "--nats-stream", "WG_JSG", "--nats-subject-prefix", "wg.jsg",
                                       "--nats-max-age", "3"});
  sc.start_streaming();
  struct edge {
    walgate_process p;
    std::uint16_t port = free_port();
    std::filesystem::path dir;
    explicit edge(const std::string& url) {
      std::string t = (std::filesystem::temp_directory_path() / "walgate-edge-XXXXXX").string();
      dir = mkdtemp(t.data());
      p.args = {"edge", "--nats", url, "--nats-stream", "WG_JSG", "--nats-subject-prefix", "wg.jsg", "--listen",
                "127.0.0.1:" + std::to_string(port), "--data-dir", (dir / "data").string()};
      p.start();
      REQUIRE_MESSAGE(test::wait_until([&] { return p.listening.load(); }, std::chrono::seconds(30)), p.log());
    }
    ~edge() {
      p.kill_with(SIGTERM);
      std::filesystem::remove_all(dir);
    }
  };
  sql_conn q(test::cluster().conninfo());
  stream_reader r(nats.url(0), "WG_JSG");
  REQUIRE(q.exec("INSERT INTO jsg_a VALUES (1, 'a'), (2, 'b')"));
  REQUIRE(test::wait_until([&] { return metric(sc.port, "walgate_nats_stream_last_seq") == 2; }, std::chrono::seconds(30)));
  auto a1 = r.get(1), a2 = r.get(2);
  REQUIRE(a1);
  REQUIRE(a2);
  CHECK(a1->headers["Walgate-Seq"] == "0");
  CHECK(a1->headers.count("Walgate-Origin") == 1);   // (the origin's first event says where its log began)
  CHECK(a2->headers.count("Walgate-Origin") == 0);
  const std::string a1_id = a1->headers["Walgate-Id"], a2_id = a2->headers["Walgate-Id"];
  const std::string before_origin = "0/1:0";   // (an id from before the origin's log began)
  // An edge whose copy begins at the origin's first event answers as the origin does.
  edge e1(nats.url(0));
  REQUIRE_MESSAGE(test::wait_until([&] { return metric(e1.port, "walgate_edge_ready") == 1; }, std::chrono::seconds(30)), e1.p.log());
  for (auto port : {sc.port, e1.port}) {
    CHECK(status_of(port, "/v1/stream?from=" + a1_id) == 200);
    CHECK(status_of(port, "/v1/stream?from=" + before_origin) == 410);
  }
  CHECK(first_lines(e1.port, "/v1/stream?from=" + a1_id, 1).at(0).find(a2_id) != std::string::npos);
  // The stream's messages age out (3 s): a new edge has nothing to copy, and is not served.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> st;
  REQUIRE(test::wait_until([&] { return (st = r.state()) && st->second == 0; }, std::chrono::seconds(30)));
  edge e2(nats.url(0));
  REQUIRE_MESSAGE(test::wait_until([&] { return metric(e2.port, "walgate_edge_consuming") == 1; }, std::chrono::seconds(30)), e2.p.log());
  CHECK(status_of(e2.port, "/v1/stream") == 503);
  CHECK(http_get(e2.port, "/readyz").second.find("not streaming") != std::string::npos);
  CHECK(metric(e2.port, "walgate_edge_ready") == 0);
  // Its copy begins with the next transaction: what came before it is gone there (410), while
  // e1 and the origin still have it.
  REQUIRE(q.exec("INSERT INTO jsg_a VALUES (3, 'c'), (4, 'd')"));
  REQUIRE_MESSAGE(test::wait_until([&] { return metric(e2.port, "walgate_edge_ready") == 1; }, std::chrono::seconds(30)), e2.p.log());
  auto b1 = r.get(3);
  REQUIRE(b1);
  CHECK(b1->headers["Walgate-Seq"] == "2");
  const std::string b1_id = b1->headers["Walgate-Id"];
  CHECK(status_of(e2.port, "/v1/stream?from=" + a2_id) == 410);
  CHECK(status_of(e2.port, "/v1/stream?from=" + a1_id) == 410);
  CHECK(status_of(e2.port, "/v1/stream?from=" + b1_id) == 200);
  for (auto port : {sc.port, e1.port}) CHECK(status_of(port, "/v1/stream?from=" + a2_id) == 200);
  // Every edge and the origin: the same events from 0/0:0 as far as each has them.
  CHECK(first_lines(e2.port, "/v1/stream?from=0/0:0", 2).size() == 2);
  CHECK(first_lines(e2.port, "/v1/stream?from=0/0:0", 1).at(0).find(b1_id) != std::string::npos);
  CHECK(first_lines(e1.port, "/v1/stream?from=0/0:0", 1).at(0).find(a1_id) != std::string::npos);
  // An edge never takes an origin's data directory, nor an origin an edge's.
  walgate_process wrong;
  wrong.args = {"edge", "--nats", nats.url(0), "--nats-stream", "WG_JSG", "--data-dir", sc.data_dir.string(), "--listen", "127.0.0.1:0"};
  wrong.start();
  CHECK(wrong.wait() == 1);
  CHECK(wrong.log().find("is not a walgate edge's") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(sc.data_dir / "EDGE"));
}
