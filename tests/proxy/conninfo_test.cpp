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
