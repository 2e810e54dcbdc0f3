#include "walgate/proxy/conninfo.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>

using namespace walgate::proxy;

namespace {
struct env_guard {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  void set(const char* k, const char* v) {
    const char* old = std::getenv(k);
    saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
    if (v) setenv(k, v, 1);
    else unsetenv(k);
  }
  ~env_guard() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      if (it->second) setenv(it->first.c_str(), it->second->c_str(), 1);
      else unsetenv(it->first.c_str());
    }
  }
};
}  // namespace

TEST_CASE("conninfo: key=value string") {
  auto r = parse_conninfo("host=db.example port=6543 user=alice dbname=shop password='p w' sslmode=require "
                          "application_name=x connect_timeout=7");
  REQUIRE(r.params);
  const auto& p = *r.params;
  REQUIRE(p.endpoints.size() == 1);
  CHECK(p.endpoints[0].host == "db.example");
  CHECK(p.endpoints[0].port == 6543);
  CHECK(p.user == "alice");
  CHECK(p.dbname == "shop");
  CHECK(p.password == "p w");
  CHECK(p.application_name == "x");
  CHECK(p.connect_timeout == std::chrono::seconds(7));
  CHECK((p.sslmode == ssl_mode::require || p.sslmode == ssl_mode::verify_ca));
}

TEST_CASE("conninfo: URI with several hosts and query parameters") {
  auto r = parse_conninfo("postgresql://bob:s%40cret@h1:5433,h2:5434/app?sslmode=verify-full&sslrootcert=/ca.pem");
  REQUIRE(r.params);
  const auto& p = *r.params;
  REQUIRE(p.endpoints.size() == 2);
  CHECK(p.endpoints[0].host == "h1");
  CHECK(p.endpoints[0].port == 5433);
  CHECK(p.endpoints[1].host == "h2");
  CHECK(p.endpoints[1].port == 5434);
  CHECK(p.user == "bob");
  CHECK(p.password == "s@cret");
  CHECK(p.dbname == "app");
  CHECK(p.sslmode == ssl_mode::verify_full);
  CHECK(p.sslrootcert == "/ca.pem");
}

TEST_CASE("conninfo: PG* environment supplies the defaults, the string wins") {
  env_guard env;
  env.set("PGHOST", "/tmp/sockets");
  env.set("PGPORT", "5499");
  env.set("PGUSER", "envuser");
  env.set("PGPASSWORD", "envpass");
  env.set("PGDATABASE", "envdb");
  env.set("PGSSLMODE", "disable");
  env.set("PGCHANNELBINDING", "require");
  auto r = parse_conninfo("");
  REQUIRE(r.params);
  CHECK(r.params->endpoints[0].host == "/tmp/sockets");
  CHECK(r.params->endpoints[0].is_unix_socket());
  CHECK(r.params->endpoints[0].port == 5499);
  CHECK(r.params->user == "envuser");
  CHECK(r.params->password == "envpass");
  CHECK(r.params->dbname == "envdb");
  CHECK(r.params->sslmode == ssl_mode::disable);
  CHECK(r.params->channel_binding == channel_binding_mode::require);
  auto s = parse_conninfo("user=other port=6000");
  REQUIRE(s.params);
  CHECK(s.params->user == "other");
  CHECK(s.params->endpoints[0].port == 6000);
  CHECK(s.params->dbname == "envdb");
}

TEST_CASE("conninfo: defaults without environment") {
  env_guard env;
  for (const char* k : {"PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSWORD", "PGSSLMODE", "PGHOSTADDR"})
    env.set(k, nullptr);
  auto r = parse_conninfo("user=u");
  REQUIRE(r.params);
  CHECK(r.params->endpoints[0].host == "/var/run/postgresql");
  CHECK(r.params->endpoints[0].port == 5432);
  CHECK(r.params->dbname == "u");
  CHECK_FALSE(r.params->password);
  CHECK(r.params->sslmode == ssl_mode::prefer);
}

TEST_CASE("conninfo: errors are one clear line") {
  auto a = parse_conninfo("host=x bogus=1");
  CHECK_FALSE(a.params);
  CHECK(a.error.find("bogus") != std::string::npos);
  auto b = parse_conninfo("port=notaport");
  CHECK_FALSE(b.params);
  CHECK(b.error.find("notaport") != std::string::npos);
  auto c = parse_conninfo("sslmode=sometimes");
  CHECK_FALSE(c.params);
  CHECK(c.error.find("sslmode") != std::string::npos);
  auto d = parse_conninfo("host=a,b,c port=1,2");
  CHECK_FALSE(d.params);
  CHECK(d.error.find("3 hosts") != std::string::npos);
}

TEST_CASE("pgpass lookup: wildcards, escapes, and unsafe permissions") {
  auto dir = std::filesystem::temp_directory_path() / "walgate-pgpass-test";
  std::filesystem::create_directories(dir);
  auto file = dir / "pgpass";
  {
    std::ofstream out(file);
    out << "# comment\n"
        << "otherhost:5432:*:alice:wrong\n"
        << "db.example:5432:shop:alice:right\\:colon\n"
        << "*:*:*:bob:bobpw\n"
        << "localhost:5433:*:carol:carolpw\n";
  }
  ::chmod(file.c_str(), 0600);
  conn_endpoint ep{"db.example", 5432};
  CHECK(lookup_passfile(file, ep, "shop", "alice") == "right:colon");
  CHECK(lookup_passfile(file, ep, "shop", "bob") == "bobpw");
  CHECK_FALSE(lookup_passfile(file, ep, "shop", "dave"));
  conn_endpoint sock{"/tmp", 5433};   // a Unix socket matches "localhost"
  CHECK(lookup_passfile(file, sock, "x", "carol") == "carolpw");
  ::chmod(file.c_str(), 0644);   // readable by others: ignored, as libpq does
  CHECK_FALSE(lookup_passfile(file, ep, "shop", "alice"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("conninfo: target_session_attrs as given, never libpq's built-in default") {
  env_guard env;
  env.set("PGTARGETSESSIONATTRS", nullptr);
  // Unset: each connection's own default (walgate's stream: primary), not libpq's "any".
  auto none = parse_conninfo("host=a,b port=1,2");
  REQUIRE(none.params);
  CHECK_FALSE(none.params->target_session_attrs);
  const std::pair<const char*, session_target> values[] = {
      {"any", session_target::any},         {"read-write", session_target::read_write},
      {"read-only", session_target::read_only}, {"primary", session_target::primary},
      {"standby", session_target::standby}, {"prefer-standby", session_target::prefer_standby}};
  for (const auto& [text, value] : values) {
    CAPTURE(text);
    auto p = parse_conninfo(std::string("host=a target_session_attrs=") + text);
    REQUIRE(p.params);
    REQUIRE(p.params->target_session_attrs);
    CHECK(*p.params->target_session_attrs == value);
    CHECK(to_string(value) == text);
    auto uri = parse_conninfo(std::string("postgresql://a,b/db?target_session_attrs=") + text);
    REQUIRE_MESSAGE(uri.params, uri.error);
    CHECK(uri.params->target_session_attrs == value);
  }
  env.set("PGTARGETSESSIONATTRS", "standby");
  CHECK(parse_conninfo("host=a").params->target_session_attrs == session_target::standby);
  CHECK(parse_conninfo("host=a target_session_attrs=primary").params->target_session_attrs == session_target::primary);
  env.set("PGTARGETSESSIONATTRS", nullptr);
  // libpq itself refuses an unknown value; so do we, in one line.
  auto bad = parse_conninfo("host=a target_session_attrs=master");
  CHECK_FALSE(bad.params);
  CHECK(bad.error.find("target_session_attrs") != std::string::npos);
}

TEST_CASE("conninfo: which states each target keeps") {
  const session_state primary{false, false}, read_only_primary{false, true}, standby{true, true};
  CHECK(passed_over(session_target::any, standby).empty());
  CHECK(passed_over(session_target::primary, primary).empty());
  CHECK(passed_over(session_target::primary, read_only_primary).empty());
  CHECK(passed_over(session_target::primary, standby) == "a standby (in recovery)");
  CHECK(passed_over(session_target::read_write, read_only_primary) == "read-only (default_transaction_read_only on)");
  CHECK(passed_over(session_target::read_write, standby) == "a standby (in recovery)");
  CHECK(passed_over(session_target::read_only, primary) == "read-write");
  CHECK(passed_over(session_target::read_only, read_only_primary).empty());
  CHECK(passed_over(session_target::standby, primary) == "a primary (not in recovery)");
  CHECK(passed_over(session_target::prefer_standby, standby).empty());
}

TEST_CASE("conninfo: hostaddr pairs with host, as in libpq") {
  auto both = parse_conninfo("host=db.example,other hostaddr=127.0.0.1,::1 port=5432,5433");
  REQUIRE_MESSAGE(both.params, both.error);
  REQUIRE(both.params->endpoints.size() == 2);
  CHECK(both.params->endpoints[0].host == "db.example");
  CHECK(both.params->endpoints[0].address == "127.0.0.1");
  CHECK(both.params->endpoints[1].address == "::1");
  CHECK_FALSE(both.params->endpoints[0].is_unix_socket());
  // hostaddr alone names the hosts too; a socket directory with hostaddr goes over TCP (libpq).
  auto alone = parse_conninfo("hostaddr=10.0.0.5 port=1");
  REQUIRE(alone.params);
  CHECK(alone.params->endpoints[0].host == "10.0.0.5");
  CHECK(alone.params->endpoints[0].address == "10.0.0.5");
  auto socket_dir = parse_conninfo("host=/tmp hostaddr=127.0.0.1");
  REQUIRE(socket_dir.params);
  CHECK_FALSE(socket_dir.params->endpoints[0].is_unix_socket());
  CHECK(parse_conninfo("host=/tmp").params->endpoints[0].is_unix_socket());
  auto mismatch = parse_conninfo("host=a,b hostaddr=127.0.0.1");
  CHECK_FALSE(mismatch.params);
  CHECK(mismatch.error == "invalid connection string: could not match 2 host names to 1 hostaddr values");
}
