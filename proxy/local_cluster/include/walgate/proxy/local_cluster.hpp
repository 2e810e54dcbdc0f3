// A throwaway PostgreSQL server: initdb in a temporary directory, wal_level=logical, a free
// port on 127.0.0.1 and a Unix socket in the directory. Used by `walgate demo` and by the tests.
//
// When run as root, initdb and postgres run as the `postgres` user (the server refuses root).
// The server is a child process that receives SIGQUIT if this process dies (PR_SET_PDEATHSIG),
// so a crashed test or demo leaves no server running; the destructor stops it and removes the
// directory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace walgate::proxy {

struct cluster_options {
  std::filesystem::path bindir;            ///< Empty: $WALGATE_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin.
  std::vector<std::string> extra_conf;     ///< Lines appended to postgresql.conf.
  std::vector<std::string> hba;            ///< pg_hba.conf lines (replace the default: local trust for all).
  bool tls = false;                        ///< Generate a CA and a server certificate for "localhost".
  std::string name = "walgate";            ///< Prefix of the temporary directory.
  std::uint16_t port = 0;                  ///< 0: a free one (a port chosen ahead: a host list naming servers not made yet).
};

class local_cluster {
 public:
  /// Starts a server; on failure returns nullptr and sets error (with the server log's tail).
  static std::unique_ptr<local_cluster> start(const cluster_options& o, std::string& error);
  ~local_cluster();

  std::uint16_t port() const { return port_; }
  const std::filesystem::path& dir() const { return dir_; }
  const std::filesystem::path& datadir() const { return datadir_; }
  std::filesystem::path socket_dir() const { return dir_; }
  /// The CA certificate that signed the server certificate (tls only).
  std::filesystem::path ca_file() const { return dir_ / "ca.crt"; }
  int server_major() const { return major_; }
  const std::filesystem::path& bindir() const { return bindir_; }

  /// "host=<socket dir> port=<port> user=postgres dbname=postgres" plus extra.
  std::string conninfo(const std::string& extra = {}) const;
  /// "host=127.0.0.1 port=<port> ..." plus extra.
  std::string tcp_conninfo(const std::string& extra = {}) const;

  /// Rewrites pg_hba.conf and reloads the server.
  bool set_hba(const std::vector<std::string>& lines, std::string& error);
  /// Runs SQL as the superuser through libpq; returns rows of text (NULL as nullopt).
  std::vector<std::vector<std::optional<std::string>>> sql(const std::string& query, const std::string& database = {}) const;
  /// Like sql() but returns the error text instead of throwing ("" on success).
  std::string try_sql(const std::string& query) const;
  /// Stops the server as `pg_ctl stop -m immediate` does (SIGQUIT: no checkpoint, crash
  /// recovery at the next start) and starts it again on the same port; false with error.
  bool restart_immediate(std::string& error);
  /// Stops the server and removes the directory (also done by the destructor).
  void stop();
  /// Stops the server as `pg_ctl stop -m immediate` does and leaves it stopped (its directory
  /// stays until stop() or the destructor): a primary that fails.
  void stop_immediate();
  /// A physical standby of primary, streaming from it through a physical slot of its own (made
  /// here): an online base backup (pg_backup_start/pg_start_backup, the data directory copied,
  /// its backup_label from the stop), standby.signal, primary_conninfo with dbname (slot
  /// synchronisation needs it), hot_standby_feedback on; started and accepting connections.
  /// primary's pg_hba.conf gets "local replication all trust" (reloaded) when it lacks it.
  /// extra_conf: lines appended to the standby's postgresql.conf. nullptr with error.
  /// port: as cluster_options::port.
  static std::unique_ptr<local_cluster> start_standby(const local_cluster& primary, std::string& error,
                                                      const std::vector<std::string>& extra_conf = {},
                                                      std::uint16_t port = 0);
  /// The physical slot a standby streams through (start_standby), or empty.
  const std::string& standby_slot() const { return standby_slot_; }
  /// Path of the server log.
  std::filesystem::path log_file() const { return dir_ / "server.log"; }

  /// Finds a server bin dir as start() does; empty if none.
  static std::filesystem::path find_bindir();

 private:
  local_cluster() = default;
  std::filesystem::path dir_, datadir_, bindir_;
  std::uint16_t port_ = 0;
  int pid_ = -1;
  int major_ = 0;
  std::string standby_slot_;
};

}  // namespace walgate::proxy
