// The walgate command line: one-line errors naming the setting, secure defaults, and the
// precedence flags > WALGATE_* environment > TOML config file.
#include <doctest/doctest.h>
#include <filesystem>

#include <algorithm>
#include <array>
#include <vector>
#include <cstdio>
#include <fstream>
#include <string>
#include <sys/wait.h>

namespace {
struct run_result {
  int status = -1;
  std::string output;
};
/// output: stdout and stderr, or stderr only.
run_result run(const std::string& args, const std::string& env = "", bool stderr_only = false) {
  // (Bounded: a run that does not end by itself — walgate serving, where the test expected it to
  // refuse — fails the check on its status, 124, rather than hanging the suite.)
  std::string cmd = env + " timeout 60 " + std::string(WALGATE_BINARY) + " " + args + (stderr_only ? " 2>&1 >/dev/null" : " 2>&1");
  run_result r;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), p)) r.output += buf.data();
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}
const std::string base = "--pg 'host=/nonexistent port=1' --publication p --data-dir /tmp/walgate-cli-test ";
}  // namespace

TEST_CASE("--help reads well and --version answers") {
  auto h = run("--help");
  CHECK(h.status == 0);
  for (const char* flag : {"--pg", "--slot", "--publication", "--create-publication", "--listen", "--data-dir",
                           "--config", "--allow-unauthenticated", "--tls-cert", "--tls-key", "demo", "stream"})
    CHECK_MESSAGE(h.output.find(flag) != std::string::npos, flag);
  CHECK(run("--version").output.find("walgate 0.1.0") != std::string::npos);
}

TEST_CASE("a wrong setting is a one-line error naming it") {
  auto a = run(base + "--status-interval 5");
  CHECK(a.status != 0);
  CHECK(a.output.find("--status-interval") != std::string::npos);
  auto b = run(base + "--listen nowhere");
  CHECK(b.status == 2);
  CHECK(b.output.find("--listen") != std::string::npos);
  auto c = run(base + "--debezium-decimal-mode exact");
  CHECK(c.status != 0);
  CHECK(c.output.find("--debezium-decimal-mode") != std::string::npos);
  auto d = run("--publication p");
  CHECK(d.status == 2);
  CHECK(d.output.find("--pg is required") != std::string::npos);
  // Every client needs a file descriptor: a limit the open-file limit cannot hold is refused.
  auto f = run(base + "--max-clients 1000", "prlimit --nofile=512:512");
  CHECK(f.status == 2);
  CHECK(f.output.find("--max-clients 1000: needs 1384 open files but the limit (ulimit -n) is 512") !=
        std::string::npos);
  auto g = run(base + "--allow-origin https://app.example/path");
  CHECK(g.status == 2);
  CHECK(g.output.find("--allow-origin (or WALGATE_ALLOW_ORIGIN, or allow-origin in the config file): "
                      "'https://app.example/path' is not an origin") != std::string::npos);
  auto o = run(base + "--origin local");
  CHECK(o.status == 2);
  CHECK(o.output.find("--origin (or WALGATE_ORIGIN, or origin in the config file): 'local' is not one of none any") !=
        std::string::npos);
  // JetStream: the servers and the stream go together; names a stream and subjects can hold.
  auto n1 = run(base + "--nats nats://127.0.0.1:4222");
  CHECK(n1.status == 2);
  CHECK(n1.output.find("--nats and --nats-stream go together") != std::string::npos);
  auto n2 = run(base + "--nats 127.0.0.1:4222 --nats-stream S");
  CHECK(n2.status == 2);
  CHECK(n2.output.find("'127.0.0.1:4222' is not a NATS URL: use nats://host:port") != std::string::npos);
  auto n3 = run(base + "--nats nats://127.0.0.1:4222 --nats-stream a.b");
  CHECK(n3.status == 2);
  CHECK(n3.output.find("'a.b' cannot name a stream") != std::string::npos);
  auto n4 = run(base + "--nats nats://127.0.0.1:4222 --nats-stream S --nats-subject-prefix 'wg.*'");
  CHECK(n4.status == 2);
  CHECK(n4.output.find("'wg.*' is not a subject prefix") != std::string::npos);
  auto n5 = run(base + "--nats nats://127.0.0.1:4222 --nats-stream S --nats-replicas 7");
  CHECK(n5.status == 2);
  CHECK(n5.output.find("--nats-replicas") != std::string::npos);
  auto edge = run("edge --listen 127.0.0.1:0");
  CHECK(edge.status == 2);
  CHECK(edge.output.find("walgate edge needs --nats and --nats-stream") != std::string::npos);
  auto edge_pg = run("edge --pg 'host=x' --nats nats://127.0.0.1:4222 --nats-stream S");
  CHECK(edge_pg.status != 0);   // (an edge takes no PostgreSQL settings)
  CHECK(edge_pg.output.find("--pg") != std::string::npos);
  // nor the snapshot limits (an edge answers snapshot=true with 501)
  auto edge_snap = run("edge --nats nats://127.0.0.1:4222 --nats-stream S --snapshots-per-minute-per-address 5");
  CHECK(edge_snap.status == 2);
  CHECK(edge_snap.output.find("--snapshots-per-minute-per-address") != std::string::npos);
  {   // an edge's data directory is never an origin's
    const std::string dir = "/tmp/walgate-cli-test-edge-dir";
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/EDGE") << "x\n";
    auto on_edge_dir = run("--pg 'host=/nonexistent port=1' --publication p --data-dir " + dir);
    CHECK(on_edge_dir.status == 1);
    CHECK(on_edge_dir.output.find("is a walgate edge's copy of a stream (it has an EDGE file)") != std::string::npos);
    std::filesystem::remove_all(dir);
  }
  auto serve_db = run(base + "--debezium-db app");
  CHECK(serve_db.status != 0);   // (the origin names its database from --pg)
  CHECK(serve_db.output.find("--debezium-db") != std::string::npos);
  auto e = run("--publication p --pg 'host=x bogus=1'");
  CHECK(e.status == 2);
  CHECK(e.output.find("--pg (or WALGATE_PG, or pg in the config file): invalid connection string") != std::string::npos);
  // The demo makes its own server: a stale WALGATE_PG does not stop it, a public --listen does.
  auto demo = run("demo --listen 0.0.0.0:0", "WALGATE_PG='host=x bogus=1'");
  CHECK(demo.status == 2);
  CHECK(demo.output.find("is not a loopback address") != std::string::npos);
}

TEST_CASE("a flag a command does not take, a value missing or not taken: exit 2 with CLI11's message on stderr, on every command") {
  // (docs/api.md: a wrong setting exits 2 — not CLI11's own codes, 109 for an unknown flag)
  const std::string unknown = "The following argument was not expected: --no-such-flag";
  const std::string edge = "edge --nats nats://127.0.0.1:4222 --nats-stream S ";
  struct bad {
    std::string args, says;
  };
  for (const auto& b : std::vector<bad>{
           {base + "--no-such-flag", unknown},
           {base + "--allow-unauthenticated=maybe", "Could not convert: --allow-unauthenticated = maybe"},
           {base + "--slot", "--slot: 1 required TEXT missing"},
           {base + "stray", "--data-dir: At Most 1 required but received 2"},
           {edge + "--no-such-flag", unknown},
           {edge + "--allow-unauthenticated=maybe", "Could not convert: --allow-unauthenticated = maybe"},
           {edge + "--listen", "--listen: 1 required HOST:PORT missing"},
           {"stream --publication p --no-such-flag", unknown},
           {"stream --publication p --slot", "--slot: 1 required TEXT missing"},
           {"demo --no-such-flag", unknown},
           {"demo --listen", "--listen: 1 required HOST:PORT missing"},
       }) {
    auto r = run(b.args, "", /*stderr_only=*/true);
    CHECK_MESSAGE(r.status == 2, b.args << " -> " << r.status);
    CHECK_MESSAGE(r.output.find(b.says) != std::string::npos, b.args << " -> " << r.output);
  }
  // Help is not an error, on any command.
  for (const char* help : {"--help", "edge --help", "stream --help", "demo --help"}) {
    auto h = run(help);
    CHECK_MESSAGE(h.status == 0, help);
    const bool lists_flags = h.output.find("--listen") != std::string::npos || h.output.find("--slot") != std::string::npos;
    CHECK_MESSAGE(lists_flags, help);
  }
}

TEST_CASE("secure default: a non-loopback address needs --allow-unauthenticated") {
  auto r = run(base + "--listen 0.0.0.0:0");
  CHECK(r.status == 2);
  CHECK(r.output.find("--allow-unauthenticated") != std::string::npos);
}

TEST_CASE("--auth jwt: a key file is needed and read at start; with it a non-loopback address is served") {
  auto a = run(base + "--auth jwt");
  CHECK(a.status == 2);
  CHECK(a.output.find("--auth jwt needs a key file: --jwt-secret-file or --jwks-file (or both)") != std::string::npos);
  auto b = run(base + "--jwks-file /tmp/x.json");
  CHECK(b.status == 2);
  CHECK(b.output.find("go with --auth jwt") != std::string::npos);
  auto c = run(base + "--auth sometimes");
  CHECK(c.status == 2);
  CHECK(c.output.find("'sometimes' is not one of none jwt") != std::string::npos);
  // Accepted as a configuration on a public address (no --allow-unauthenticated needed).
  auto d = run(base + "--listen 0.0.0.0:0 --auth jwt --jwks-file /tmp/x.json --jwt-leeway 5 --jwt-exp optional --print-config");
  CHECK(d.status == 0);
  CHECK(d.output.find("auth = 'jwt'") != std::string::npos);
  CHECK(d.output.find("jwt-leeway = 5") != std::string::npos);
  // The files are read before anything else is done: a missing or malformed one stops it (exit 2).
  auto e = run(base + "--auth jwt --jwks-file /nonexistent/keys.json");
  CHECK(e.status == 2);
  CHECK(e.output.find("--auth jwt: /nonexistent/keys.json:") != std::string::npos);
  const std::string f = "/tmp/walgate-cli-test-jwks.json";
  std::ofstream(f) << R"({"keys":[{"kty":"RSA","kid":"old","n":"AQAB","e":"AQAB"}]})";
  auto g = run(base + "--auth jwt --jwks-file " + f);
  CHECK(g.status == 2);
  CHECK(g.output.find("key 0 (kid old): an RSA key of 17 bits: at least 2048 are needed") != std::string::npos);
  const std::string secret = "/tmp/walgate-cli-test-secret";
  std::ofstream(secret) << "short\n";
  auto h = run(base + "--auth jwt --jwt-secret-file " + secret);
  CHECK(h.status == 2);
  CHECK(h.output.find("the HMAC secret has 5 bytes: at least 32 are needed") != std::string::npos);
  // --policy goes with --auth jwt, and is read at start with the keys.
  auto i = run(base + "--policy /tmp/p.toml");
  CHECK(i.status == 2);
  CHECK(i.output.find("and --policy go with --auth jwt") != std::string::npos);
  std::ofstream(secret, std::ios::trunc) << std::string(40, 's');
  const std::string pol = "/tmp/walgate-cli-test-policy.toml";
  std::ofstream(pol) << "[[grant]]\ntables = [\"public.t\"]\ncolumns = []\n";
  auto j = run(base + "--auth jwt --jwt-secret-file " + secret + " --policy " + pol);
  CHECK(j.status == 2);
  CHECK(j.output.find("--auth jwt: " + pol + ": grant 1: columns is a non-empty list of column names") != std::string::npos);
  std::remove(f.c_str());
  std::remove(secret.c_str());
  std::remove(pol.c_str());
}

TEST_CASE("flags over WALGATE_* environment over the config file") {
  std::string cfg = "/tmp/walgate-cli-test.toml";
  std::ofstream(cfg) << "slot = \"from_file_X\"\npg = \"host=/nonexistent port=1\"\npublication = [\"p\"]\n";
  auto file = run("--config " + cfg);
  CHECK(file.output.find("'from_file_X'") != std::string::npos);
  auto env = run("--config " + cfg, "WALGATE_SLOT=from_env_X");
  CHECK(env.output.find("'from_env_X'") != std::string::npos);
  auto flag = run("--config " + cfg + " --slot from_flag_X", "WALGATE_SLOT=from_env_X");
  CHECK(flag.output.find("'from_flag_X'") != std::string::npos);
  std::remove(cfg.c_str());
}

TEST_CASE("out-of-range settings from the environment or the config file: the same one-line error, exit 2") {
  struct bad {
    std::string env, toml, name;
  };
  const std::vector<bad> cases = {
      {"WALGATE_STATUS_INTERVAL=0", "status-interval = 0", "--status-interval"},
      {"WALGATE_CLIENT_LAG_MB=0", "client-lag-mb = 0", "--client-lag-mb"},
      {"WALGATE_CLIENT_LAG_MB=99999999999999", "client-lag-mb = 99999999999999", "--client-lag-mb"},
      {"WALGATE_RETENTION_MB=0", "retention-mb = 0", "--retention-mb"},
      {"WALGATE_TAIL_MB=1000000", "tail-mb = 1000000", "--tail-mb"},
      {"WALGATE_DEBEZIUM_DECIMAL_MODE=exact", "debezium-decimal-mode = \"exact\"", "--debezium-decimal-mode"},
      {"WALGATE_STREAMING=maybe", "streaming = \"maybe\"", "--streaming"},
  };
  const std::string cfg = "/tmp/walgate-cli-range.toml";
  for (const auto& c : cases) {
    auto from_env = run(base, c.env);
    CHECK_MESSAGE(from_env.status == 2, c.env);
    CHECK_MESSAGE(from_env.output.find(c.name) != std::string::npos, from_env.output);
    CHECK_MESSAGE(std::count(from_env.output.begin(), from_env.output.end(), '\n') == 1, from_env.output);
    std::ofstream(cfg, std::ios::trunc) << c.toml << "\n";
    auto from_file = run(base + "--config " + cfg);
    CHECK_MESSAGE(from_file.status == 2, c.toml);
    CHECK_MESSAGE(from_file.output == from_env.output, from_file.output);
    auto from_flag = run(base + c.name + " " + c.env.substr(c.env.find('=') + 1));
    CHECK_MESSAGE(from_flag.status == 2, c.name);
    CHECK_MESSAGE(from_flag.output == from_env.output, from_flag.output);
  }
  // Numbers are numbers: no sign, no trailing text.
  auto neg = run(base, "WALGATE_RETENTION_MB=-1");
  CHECK(neg.status == 2);
  CHECK(neg.output.find("WALGATE_RETENTION_MB: not a number") != std::string::npos);
  auto junk = run(base, "WALGATE_STATUS_INTERVAL=10s");
  CHECK(junk.status == 2);
  CHECK(junk.output.find("WALGATE_STATUS_INTERVAL: not a number") != std::string::npos);
  std::remove(cfg.c_str());
}

TEST_CASE("--print-config: file, environment and flags combined and checked, as TOML that reads back the same") {
  const std::string cfg = "/tmp/walgate-cli-print.toml", again = "/tmp/walgate-cli-print-again.toml";
  std::ofstream(cfg, std::ios::trunc) << "retention-mb = 77\npublication = [\"a\", \"b\"]\nslot = \"from_file\"\n"
                                         "create-publication = 'public.t, \"My S\".\"T 2\"'\n";
  auto r = run("--config " + cfg + " --slot from_flag --pg 'postgresql://u:sekret@db.example/app' --print-config",
               "WALGATE_TAIL_MB=5 WALGATE_STREAMING=off");
  CHECK(r.status == 0);
  INFO(r.output);
  CHECK(r.output.find("retention-mb = 77\n") != std::string::npos);   // the file
  CHECK(r.output.find("tail-mb = 5\n") != std::string::npos);         // the environment
  CHECK(r.output.find("streaming = 'off'") != std::string::npos);
  CHECK(r.output.find("slot = 'from_flag'") != std::string::npos);    // the flag wins
  CHECK(r.output.find("publication = [ 'a', 'b' ]") != std::string::npos);
  CHECK(r.output.find("client-lag-mb = 64\n") != std::string::npos);  // defaults are printed too
  CHECK(r.output.find("ws-max-subscriptions = 64\n") != std::string::npos);
  // The password is masked; the rest of the connection string is kept.
  CHECK(r.output.find("sekret") == std::string::npos);
  CHECK(r.output.find("password='********'") != std::string::npos);
  CHECK(r.output.find("host='db.example'") != std::string::npos);
  // What it prints is a config file that gives the same configuration.
  std::ofstream(again, std::ios::trunc) << r.output;
  auto back = run("--config " + again + " --print-config");
  CHECK(back.status == 0);
  CHECK(back.output == r.output);
  // Every secret libpq knows is masked.
  auto ssl = run("--pg 'host=h sslpassword=keypass password=pw' --print-config");
  CHECK(ssl.status == 0);
  CHECK(ssl.output.find("keypass") == std::string::npos);
  CHECK(ssl.output.find("pw'") == std::string::npos);
  // A flag given =false is false.
  auto off = run("--no-fsync=false --allow-unauthenticated=false --print-config");
  CHECK(off.output.find("no-fsync = false") != std::string::npos);
  CHECK(off.output.find("allow-unauthenticated = false") != std::string::npos);
  auto on = run("--no-fsync --print-config");
  CHECK(on.output.find("no-fsync = true") != std::string::npos);
  // It checks what it prints: a wrong value is the same one-line error, exit 2.
  auto bad = run("--config " + cfg + " --print-config", "WALGATE_TAIL_MB=0");
  CHECK(bad.status == 2);
  CHECK(bad.output.find("--tail-mb (or WALGATE_TAIL_MB, or tail-mb in the config file): 0 is not in [1, 65536]") !=
        std::string::npos);
  // The connection and snapshot limits (issue 32): flags of their own, printed, checked.
  auto limits = run("--max-connections-per-address 4 --max-other-connections 64 --snapshots-per-minute-per-address 0 "
                    "--snapshots-per-minute-per-subject 7 --snapshots-per-minute-per-mux 3 --print-config");
  CHECK(limits.status == 0);
  for (const char* line : {"max-connections-per-address = 4", "max-other-connections = 64", "snapshots-per-minute-per-address = 0",
                           "snapshots-per-minute-per-subject = 7", "snapshots-per-minute-per-mux = 3"})
    CHECK_MESSAGE(limits.output.find(line) != std::string::npos, line << "\n" << limits.output);
  auto defaults = run("--print-config");
  for (const char* line : {"max-connections-per-address = 32", "max-other-connections = 256",
                           "snapshots-per-minute-per-address = 300", "snapshots-per-minute-per-subject = 60",
                           "snapshots-per-minute-per-mux = 10"})
    CHECK_MESSAGE(defaults.output.find(line) != std::string::npos, line);
  auto zero = run("--max-connections-per-address 0 --print-config");
  CHECK(zero.status == 2);
  CHECK(zero.output.find("--max-connections-per-address (or WALGATE_MAX_CONNECTIONS_PER_ADDRESS, or "
                         "max-connections-per-address in the config file): 0 is not in [1, 100000]") != std::string::npos);
  auto few = run("--print-config", "WALGATE_MAX_OTHER_CONNECTIONS=8");
  CHECK(few.status == 2);
  CHECK(few.output.find("8 is not in [16, 100000]") != std::string::npos);
  auto subs = run("--print-config", "WALGATE_WS_MAX_SUBSCRIPTIONS=0");
  CHECK(subs.status == 2);
  CHECK(subs.output.find("--ws-max-subscriptions (or WALGATE_WS_MAX_SUBSCRIPTIONS, or ws-max-subscriptions in the config "
                         "file): 0 is not in [1, 10000]") != std::string::npos);
  std::remove(cfg.c_str());
  std::remove(again.c_str());
}

TEST_CASE("walgate stream takes the same settings, from the same sources") {
  auto env = run("stream --publication p", "WALGATE_PG='host=/nonexistent port=1' WALGATE_SLOT=BAD");
  CHECK(env.status == 2);
  CHECK(env.output.find("--slot (or WALGATE_SLOT, or slot in the config file): invalid slot name 'BAD'") !=
        std::string::npos);
  auto flag = run("stream --publication p --status-interval 5", "WALGATE_PG='host=/nonexistent port=1'");
  CHECK(flag.status == 2);
  CHECK(flag.output.find("--status-interval (or WALGATE_STATUS_INTERVAL") != std::string::npos);
}

TEST_CASE("walgate replication-user NAME: a --replication-users line from a password on stdin; replication settings checked") {
  // (run() puts env before "timeout walgate …": a pipe there feeds walgate's stdin)
  auto line = run("replication-user alice --iterations 1000", "printf 's3cret \\303\\251\\n' |");
  REQUIRE_MESSAGE(line.status == 0, line.output);
  CHECK(line.output.rfind("alice SCRAM-SHA-256$1000:", 0) == 0);
  CHECK(line.output.back() == '\n');
  CHECK(std::count(line.output.begin(), line.output.end(), '$') == 2);
  // A new salt each time: two lines for the same password differ.
  auto again = run("replication-user alice --iterations 1000", "printf 's3cret \\303\\251\\n' |");
  CHECK(again.output != line.output);
  auto empty = run("replication-user alice", "printf '\\n' |");
  CHECK(empty.status == 2);
  CHECK(empty.output.find("an empty password") != std::string::npos);
  CHECK(run("replication-user", "printf 'x\\n' |").status == 2);                 // no NAME
  CHECK(run("replication-user 'a b'", "printf 'x\\n' |").status == 2);           // a space in it
  CHECK(run("replication-user alice --iterations 0", "printf 'x\\n' |").status == 2);

  // Without a users file the replication endpoint must be a loopback address; with one, any.
  auto open = run(base + "--replication-listen 0.0.0.0:5599 --print-config");
  CHECK(open.status == 2);
  CHECK_MESSAGE(open.output.find("is not a loopback address and replication clients are not authenticated: give "
                                 "--replication-users") != std::string::npos,
                open.output);
  CHECK(run(base + "--replication-listen 0.0.0.0:5599 --replication-users /dev/null --print-config").status == 0);
  auto alone = run(base + "--replication-users /dev/null --print-config");
  CHECK(alone.status == 2);
  CHECK(alone.output.find("--replication-users goes with --replication-listen") != std::string::npos);
}

TEST_CASE("walgate slots: a data directory's downstream slots as TOML; none, or a file that cannot be read") {
  const std::string dir = "/tmp/walgate-cli-slots-test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto none = run("slots --data-dir " + dir);
  CHECK(none.status == 0);
  CHECK(none.output.find("# no downstream slots in " + dir) != std::string::npos);
  std::ofstream(dir + "/replication-slots") << "walgate replication slots 1\na test_decoding 0/16B3748 two_phase,invalidated\n";
  auto one = run("slots --data-dir " + dir);
  CHECK(one.status == 0);
  CHECK_MESSAGE(one.output.find("[[slot]]\nname = \"a\"\nplugin = \"test_decoding\"\nconfirmed_flush_lsn = \"0/16B3748\"\n"
                                "two_phase = true\nfailover = false\ninvalidated = true\n") != std::string::npos,
                one.output);
  std::ofstream(dir + "/replication-slots") << "walgate replication slots 1\na test_decoding 0/16B3748 invalidated,two_phase\n";
  auto bad = run("slots --data-dir " + dir);
  CHECK(bad.status == 1);
  CHECK(bad.output.find("line 2 is not") != std::string::npos);
  std::filesystem::remove_all(dir);
}
