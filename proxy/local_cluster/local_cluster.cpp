#include "walgate/proxy/local_cluster.hpp"

#include <libpq-fe.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace walgate::proxy {

namespace fs = std::filesystem;

namespace {

struct run_as {
  bool switch_user = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

run_as server_user(std::string& error) {
  run_as r;
  if (geteuid() != 0) return r;
  const passwd* pw = getpwnam("postgres");
  if (!pw) {
    error = "running as root, but there is no 'postgres' user to run the server as "
            "(install postgresql, or run as an ordinary user)";
    return r;
  }
  r.switch_user = true;
  r.uid = pw->pw_uid;
  r.gid = pw->pw_gid;
  return r;
}

int setgroups_safe(const run_as& as) {
  gid_t g = as.gid;
  return ::setgroups(1, &g);
}

/// fork + exec with stdout/stderr to log; in the child, drop to the server user and ask for
/// SIGQUIT when we die. Returns the child's pid, or -1.
pid_t spawn(const std::vector<std::string>& argv, const fs::path& log, const run_as& as) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  // child
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, 0);
  if (as.switch_user) {
    if (setgid(as.gid) != 0 || setgroups_safe(as) != 0 || setuid(as.uid) != 0) _exit(126);
  }
  prctl(PR_SET_PDEATHSIG, SIGQUIT);
  if (getppid() != parent) _exit(125);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

int run(const std::vector<std::string>& argv, const fs::path& log, const run_as& as) {
  pid_t pid = spawn(argv, log, as);
  if (pid < 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string tail(const fs::path& file, std::size_t max_lines = 20) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  std::string l;
  while (std::getline(in, l)) {
    lines.push_back(l);
    if (lines.size() > max_lines) lines.erase(lines.begin());
  }
  std::string out;
  for (auto& x : lines) out += "\n  " + x;
  return out;
}

std::uint16_t free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  std::uint16_t port = 0;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(s);
  return port;
}

void chown_tree(const fs::path& p, const run_as& as) {
  if (!as.switch_user) return;
  if (::chown(p.c_str(), as.uid, as.gid) != 0) return;
  if (fs::is_directory(p))
    for (const auto& e : fs::recursive_directory_iterator(p))
      if (::lchown(e.path().c_str(), as.uid, as.gid) != 0) return;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::trunc);
  out << text;
}

}  // namespace


fs::path local_cluster::find_bindir() {
  if (const char* env = std::getenv("WALGATE_PG_BINDIR"); env && *env) return env;
  fs::path best;
  int best_major = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    int major = std::atoi(e.path().filename().c_str());
    if (major > best_major && fs::exists(e.path() / "bin" / "postgres")) {
      best_major = major;
      best = e.path() / "bin";
    }
  }
  return best;
}

std::unique_ptr<local_cluster> local_cluster::start(const cluster_options& o, std::string& error) {
  fs::path bindir = o.bindir.empty() ? find_bindir() : o.bindir;
  if (bindir.empty() || !fs::exists(bindir / "postgres") || !fs::exists(bindir / "initdb")) {
    error = "no PostgreSQL server binaries found" + (bindir.empty() ? std::string() : " in " + bindir.string()) +
            ": install postgresql-15 (apt-get install postgresql-15) or set WALGATE_PG_BINDIR";
    return nullptr;
  }
  run_as as = server_user(error);
  if (!error.empty()) return nullptr;

  std::unique_ptr<local_cluster> c(new local_cluster());
  std::string tmpl = (fs::temp_directory_path() / (o.name + "-XXXXXX")).string();
  if (!mkdtemp(tmpl.data())) {
    error = "cannot create a temporary directory: " + std::string(std::strerror(errno));
    return nullptr;
  }
  c->dir_ = tmpl;
  c->datadir_ = c->dir_ / "data";
  c->bindir_ = bindir;
  chown_tree(c->dir_, as);
  fs::path log = c->log_file();

  int rc = run({(bindir / "initdb").string(), "-D", c->datadir_.string(), "-U", "postgres", "-A", "trust", "-E",
                "UTF8", "--locale=C", "--no-sync"},
               log, as);
  if (rc != 0) {
    error = "initdb failed (exit " + std::to_string(rc) + "):" + tail(log);
    return nullptr;
  }
  {
    std::ifstream v(c->datadir_ / "PG_VERSION");
    v >> c->major_;
  }

  if (o.tls) {
    // A CA and a server certificate for "localhost" (no IP address in it, so that
    // verify-full against 127.0.0.1 fails as it must).
    fs::path d = c->dir_;
    std::string cmd = "cd '" + d.string() +
                      "' && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj '/CN=walgate test CA' "
                      "-keyout ca.key -out ca.crt >>server.log 2>&1 && "
                      "openssl req -newkey rsa:2048 -nodes -subj '/CN=localhost' -keyout server.key "
                      "-out server.csr >>server.log 2>&1 && "
                      "printf 'subjectAltName=DNS:localhost\\n' > san.ext && "
                      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
                      "-extfile san.ext -out server.crt >>server.log 2>&1 && chmod 600 server.key";
    if (std::system(cmd.c_str()) != 0) {
      error = "could not create TLS certificates with openssl:" + tail(log);
      return nullptr;
    }
    chown_tree(c->dir_, as);
  }

  for (int attempt = 0; attempt < (o.port ? 1 : 5); ++attempt) {
    c->port_ = o.port ? o.port : free_port();
    std::ostringstream conf;
    conf << "\n# walgate test cluster\n"
         << "listen_addresses = '127.0.0.1'\n"
         << "port = " << c->port_ << "\n"
         << "unix_socket_directories = '" << c->dir_.string() << "'\n"
         << "wal_level = logical\n"
         << "max_wal_senders = 20\n"
         << "max_replication_slots = 20\n"
         << "max_prepared_transactions = 10\n"
         << "fsync = off\n"
         << "synchronous_commit = off\n"
         << "full_page_writes = off\n"
         << "shared_buffers = 32MB\n"
         << "log_min_messages = warning\n";
    if (o.tls)
      conf << "ssl = on\nssl_cert_file = '" << (c->dir_ / "server.crt").string() << "'\nssl_key_file = '"
           << (c->dir_ / "server.key").string() << "'\n";
    for (const auto& l : o.extra_conf) conf << l << "\n";
    {
      std::ofstream out(c->datadir_ / "postgresql.conf", std::ios::app);
      out << conf.str();
    }
    std::string hba;
    for (const auto& l : o.hba) hba += l + "\n";
    if (o.hba.empty()) hba = "local all all trust\nhost all all 127.0.0.1/32 trust\n";
    write_file(c->datadir_ / "pg_hba.conf", hba);
    chown_tree(c->datadir_ / "pg_hba.conf", as);

    pid_t pid = spawn({(bindir / "postgres").string(), "-D", c->datadir_.string()}, log, as);
    if (pid < 0) {
      error = "could not start postgres: " + std::string(std::strerror(errno));
      return nullptr;
    }
    c->pid_ = pid;
    // Ready when postmaster.pid's 8th line says "ready" (PostgreSQL 10+).
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool ready = false, exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      std::ifstream pidfile(c->datadir_ / "postmaster.pid");
      std::string line;
      for (int i = 0; i < 8 && std::getline(pidfile, line); ++i) {
      }
      if (line.rfind("ready", 0) == 0) {
        ready = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (ready) return c;
    c->pid_ = -1;
    if (!exited) {
      kill(pid, SIGQUIT);
      waitpid(pid, nullptr, 0);
      error = "postgres did not become ready within 60 s:" + tail(log);
      return nullptr;
    }
    // Port taken between our probe and the server's bind: try another.
    if (tail(log).find("could not") == std::string::npos) break;
  }
  error = "postgres failed to start:" + tail(log);
  return nullptr;
}

namespace {

/// Waits for a just-spawned postgres: 1 when it accepts connections (postmaster.pid's 8th line
/// "ready", or "standby" for a hot standby), 0 when it exited, -1 after 60 s.
int wait_ready(pid_t pid, const fs::path& datadir) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return 0;
    std::ifstream pidfile(datadir / "postmaster.pid");
    std::string line;
    for (int i = 0; i < 8 && std::getline(pidfile, line); ++i) {
    }
    if (line.rfind("ready", 0) == 0 || line.rfind("standby", 0) == 0) return 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

/// A running server's data directory copied for a base backup: what PostgreSQL's own base
/// backup leaves out is left out (postmaster.pid and .opts, pg_wal's and pg_replslot's contents,
/// temporary statistics); a file that goes while it is copied is passed over (the backup's
/// WAL replay makes it whole).
void copy_datadir(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to, ec);
  for (auto it = fs::recursive_directory_iterator(from, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) {
      ec.clear();
      continue;
    }
    const fs::path rel = fs::relative(it->path(), from, ec);
    if (ec) {
      ec.clear();
      continue;
    }
    const std::string first = rel.begin()->string();
    const std::string name = rel.filename().string();
    const bool skip_contents = first == "pg_wal" || first == "pg_replslot" || first == "pg_stat_tmp";
    if (name == "postmaster.pid" || name == "postmaster.opts" || name == "backup_label" ||
        (skip_contents && std::distance(rel.begin(), rel.end()) > 1)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory(ec)) fs::create_directories(to / rel, ec);
    else fs::copy_file(it->path(), to / rel, fs::copy_options::overwrite_existing, ec);
    ec.clear();
  }
  fs::create_directories(to / "pg_wal" / "archive_status", ec);
  fs::permissions(to, fs::perms::owner_all, ec);   // (postgres refuses a data directory others may read)
}

}  // namespace

std::unique_ptr<local_cluster> local_cluster::start_standby(const local_cluster& primary, std::string& error,
                                                           const std::vector<std::string>& extra_conf,
                                                           std::uint16_t port) {
  run_as as = server_user(error);
  if (!error.empty()) return nullptr;
  std::unique_ptr<local_cluster> c(new local_cluster());
  std::string tmpl = (fs::temp_directory_path() / "walgate-standby-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) {
    error = "cannot create a temporary directory: " + std::string(std::strerror(errno));
    return nullptr;
  }
  c->dir_ = tmpl;
  c->datadir_ = c->dir_ / "data";
  c->bindir_ = primary.bindir_;
  c->major_ = primary.major_;
  std::string suffix = c->dir_.filename().string().substr(std::string("walgate-standby-").size());
  for (auto& ch : suffix) ch = static_cast<char>(std::isalnum(static_cast<unsigned char>(ch)) ? std::tolower(ch) : '_');
  c->standby_slot_ = "standby_" + suffix;
  try {
    // Physical replication is matched by "replication" in pg_hba.conf, never by "all".
    {
      std::ifstream hba(primary.datadir_ / "pg_hba.conf");
      std::string text((std::istreambuf_iterator<char>(hba)), std::istreambuf_iterator<char>());
      if (text.find("local replication all trust") == std::string::npos) {
        write_file(primary.datadir_ / "pg_hba.conf", "local replication all trust\n" + text);
        chown_tree(primary.datadir_ / "pg_hba.conf", as);
        primary.sql("SELECT pg_reload_conf()");
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      }
    }
    primary.sql("SELECT pg_create_physical_replication_slot('" + c->standby_slot_ + "', true)");
    // The backup's start and stop in one session (non-exclusive).
    PGconn* conn = PQconnectdb(primary.conninfo().c_str());
    struct finish {
      PGconn* c;
      ~finish() { PQfinish(c); }
    } finished{conn};
    if (PQstatus(conn) != CONNECTION_OK) throw std::runtime_error(std::string("connect: ") + PQerrorMessage(conn));
    auto one = [conn](const std::string& q) {
      PGresult* r = PQexec(conn, q.c_str());
      std::string v;
      const bool ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
      if (ok) v = PQgetvalue(r, 0, 0);
      std::string e = ok ? "" : PQresultErrorMessage(r);
      PQclear(r);
      if (!ok) throw std::runtime_error(q + ": " + e);
      return v;
    };
    const bool v15 = primary.major_ >= 15;
    one(v15 ? "SELECT pg_backup_start('walgate standby', true)" : "SELECT pg_start_backup('walgate standby', true, false)");
    copy_datadir(primary.datadir_, c->datadir_);
    const std::string label =
        one(v15 ? "SELECT labelfile FROM pg_backup_stop(false)" : "SELECT labelfile FROM pg_stop_backup(false, false)");
    write_file(c->datadir_ / "backup_label", label);
  } catch (const std::exception& e) {
    error = std::string("base backup: ") + e.what();
    return nullptr;
  }
  write_file(c->datadir_ / "standby.signal", "");
  c->port_ = port ? port : free_port();
  {
    std::ofstream out(c->datadir_ / "postgresql.conf", std::ios::app);
    out << "\n# walgate test standby\n"
        << "port = " << c->port_ << "\n"
        << "unix_socket_directories = '" << c->dir_.string() << "'\n"
        << "primary_conninfo = 'host=" << primary.dir_.string() << " port=" << primary.port_
        << " user=postgres dbname=postgres application_name=" << c->standby_slot_ << "'\n"
        << "primary_slot_name = '" << c->standby_slot_ << "'\n"
        << "hot_standby = on\n"
        << "hot_standby_feedback = on\n";
    for (const auto& l : extra_conf) out << l << "\n";
  }
  chown_tree(c->dir_, as);
  pid_t pid = spawn({(c->bindir_ / "postgres").string(), "-D", c->datadir_.string()}, c->log_file(), as);
  if (pid < 0) {
    error = "could not start the standby: " + std::string(std::strerror(errno));
    return nullptr;
  }
  c->pid_ = pid;
  const int ready = wait_ready(pid, c->datadir_);
  if (ready == 1) return c;
  if (ready < 0) kill(pid, SIGQUIT);
  waitpid(pid, nullptr, 0);
  c->pid_ = -1;
  error = "the standby did not start:" + tail(c->log_file());
  return nullptr;
}

void local_cluster::stop_immediate() {
  if (pid_ <= 0) return;
  kill(pid_, SIGQUIT);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

local_cluster::~local_cluster() { stop(); }

bool local_cluster::restart_immediate(std::string& error) {
  if (pid_ <= 0) {
    error = "the server is not running";
    return false;
  }
  kill(pid_, SIGQUIT);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  run_as as = server_user(error);
  if (!error.empty()) return false;
  // The port stays ours for a moment after the server's exit (nobody else binds it here).
  for (int attempt = 0; attempt < 50; ++attempt) {
    pid_t pid = spawn({(bindir_ / "postgres").string(), "-D", datadir_.string()}, log_file(), as);
    if (pid < 0) {
      error = "could not start postgres: " + std::string(std::strerror(errno));
      return false;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      std::ifstream pidfile(datadir_ / "postmaster.pid");
      std::string line;
      for (int i = 0; i < 8 && std::getline(pidfile, line); ++i) {
      }
      if (line.rfind("ready", 0) == 0) {
        pid_ = pid;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!exited) {
      kill(pid, SIGQUIT);
      waitpid(pid, nullptr, 0);
      error = "postgres did not become ready within 60 s after an immediate stop:" + tail(log_file());
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));   // the port not free yet: again
  }
  error = "postgres did not start again after an immediate stop:" + tail(log_file());
  return false;
}

void local_cluster::stop() {
  if (pid_ > 0) {
    kill(pid_, SIGINT);  // fast shutdown
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    int status = 0;
    bool gone = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        gone = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!gone) {
      kill(pid_, SIGQUIT);
      waitpid(pid_, &status, 0);
    }
    pid_ = -1;
  }
  if (!dir_.empty() && !std::getenv("WALGATE_KEEP_CLUSTER")) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

std::string local_cluster::conninfo(const std::string& extra) const {
  return "host=" + dir_.string() + " port=" + std::to_string(port_) + " user=postgres dbname=postgres " + extra;
}

std::string local_cluster::tcp_conninfo(const std::string& extra) const {
  return "host=127.0.0.1 port=" + std::to_string(port_) + " " + extra;
}

bool local_cluster::set_hba(const std::vector<std::string>& lines, std::string& error) {
  std::string hba;
  for (const auto& l : lines) hba += l + "\n";
  write_file(datadir_ / "pg_hba.conf", hba);
  std::string e;
  run_as as = server_user(e);
  chown_tree(datadir_ / "pg_hba.conf", as);
  error = try_sql("SELECT pg_reload_conf()");
  // The reload is asynchronous: wait until the postmaster has re-read the file.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return error.empty();
}

std::vector<std::vector<std::optional<std::string>>> local_cluster::sql(const std::string& query,
                                                                       const std::string& database) const {
  PGconn* conn = PQconnectdb((conninfo() + (database.empty() ? "" : " dbname=" + database)).c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string e = PQerrorMessage(conn);
    PQfinish(conn);
    throw std::runtime_error("connect: " + e);
  }
  PGresult* res = PQexec(conn, query.c_str());
  auto st = PQresultStatus(res);
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    std::string e = PQresultErrorMessage(res);
    PQclear(res);
    PQfinish(conn);
    throw std::runtime_error(e);
  }
  std::vector<std::vector<std::optional<std::string>>> rows;
  for (int r = 0; r < PQntuples(res); ++r) {
    auto& row = rows.emplace_back();
    for (int f = 0; f < PQnfields(res); ++f)
      row.push_back(PQgetisnull(res, r, f) ? std::nullopt : std::optional<std::string>(PQgetvalue(res, r, f)));
  }
  PQclear(res);
  PQfinish(conn);
  return rows;
}

std::string local_cluster::try_sql(const std::string& query) const {
  try {
    sql(query);
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace walgate::proxy
