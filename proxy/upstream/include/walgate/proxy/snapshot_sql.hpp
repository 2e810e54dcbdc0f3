// The SQL side of snapshots, shared by per-client snapshots (snapshot.cpp) and the initial
// snapshot of the log (initial_snapshot.cpp): libpq helpers, the published tables and their
// columns as pgoutput sends them, and the COPY that reads a table's rows. Public in proxy/upstream: origin and fanout use it.
#pragma once

#include "walgate/protocol/pgoutput.hpp"

#include <libpq-fe.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace walgate::proxy::snapshot_sql {

namespace pg = protocol::pgoutput;

/// A libpq connection and result, closed and cleared on every path.
struct conn_guard {
  PGconn* c = nullptr;
  ~conn_guard() {
    if (c) PQfinish(c);
  }
};
struct result_guard {
  PGresult* r = nullptr;
  explicit result_guard(PGresult* p) : r(p) {}
  ~result_guard() {
    if (r) PQclear(r);
  }
  result_guard(const result_guard&) = delete;
  result_guard& operator=(const result_guard&) = delete;
};

/// A server message on one line.
std::string one_line(const char* s);

struct table_def {
  std::string schema, name;
  char relkind = 'r';
  std::vector<std::string> filters;   // row filters of the publications that have one
  bool unfiltered = false;            // some publication takes every row
  std::set<std::string> columns;      // published columns (PostgreSQL 15+); empty: every one
  pg::cached_relation identity;       // key flags from the replica identity (as the stream's)
  pg::cached_relation primary;        // key flags from the primary key (pgoutput2json's copy)
  pg::type_cache types;
};
using table_map = std::map<std::pair<std::string, std::string>, table_def>;

/// Runs sql (with text parameters); the result, or nullopt with error.
std::optional<std::unique_ptr<result_guard>> exec(PGconn* c, const std::string& sql, ExecStatusType want,
                                                  std::string& error, const std::vector<std::string>& params = {});

/// Opens a connection to conninfo in the replication session's settings (the text of every value
/// as pgoutput gives it), with statement_timeout (ms; 0: none) as the idle-in-transaction timeout
/// too; null with error.
PGconn* connect(const std::string& conninfo, const char* application_name, long statement_timeout_ms,
                std::string& error);

/// Which published tables (schema, table) a caller wants; empty: every one.
using table_filter = std::function<bool(const std::string& schema, const std::string& table)>;

/// The published tables (of those publications) that keep selects, with their columns as
/// pgoutput's Relation message gives them: not dropped, not generated (unless a column list names
/// them), the publication's column list, key flags from the replica identity (FULL: every
/// column); and the names of their non-built-in types as its Type message gives them (a domain by
/// its base type). nullopt with error when the server failed.
std::optional<table_map> published_tables(PGconn* c, const std::vector<std::string>& publications,
                                          const table_filter& keep, std::string& error);

/// COPY (SELECT <the published columns> FROM [ONLY] <from> [WHERE <row filter> [AND extra]]) TO
/// STDOUT. from: empty for the table itself, else the quoted name of one of its partitions;
/// extra: a further condition (a ctid range).
std::string copy_sql(const table_def& t, const std::string& from = {}, const std::string& extra = {});

}  // namespace walgate::proxy::snapshot_sql
