#include "walgate/proxy/sql_forwarder.hpp"

#include "walgate/protocol/walsender.hpp"
#include "walgate/proxy/snapshot_sql.hpp"

#include <libpq-fe.h>

#include <cctype>
#include <memory>

namespace walgate::proxy {

namespace ws = protocol::walsender;
using snapshot_sql::one_line;
using snapshot_sql::result_guard;

namespace {

std::string error_of(const PGresult* r, const PGconn* c) {
  protocol::server_notice n;
  auto field = [&](int code) {
    const char* v = r ? PQresultErrorField(r, code) : nullptr;
    return v ? std::string(v) : std::string();
  };
  n.severity = field(PG_DIAG_SEVERITY_NONLOCALIZED);
  if (n.severity.empty()) n.severity = "ERROR";
  n.sqlstate = field(PG_DIAG_SQLSTATE);
  if (n.sqlstate.empty()) n.sqlstate = "XX000";
  n.message = field(PG_DIAG_MESSAGE_PRIMARY);
  if (n.message.empty()) n.message = one_line(c ? PQerrorMessage(c) : "out of memory");
  n.detail = field(PG_DIAG_MESSAGE_DETAIL);
  n.hint = field(PG_DIAG_MESSAGE_HINT);
  // (a FATAL of the upstream's session is no FATAL of this connection)
  if (n.severity == "FATAL" || n.severity == "PANIC") n.severity = "ERROR";
  return ws::build_error_response(n);
}

std::string walgate_error(const std::string& sqlstate, const std::string& message) {
  protocol::server_notice n;
  n.severity = "ERROR";
  n.sqlstate = sqlstate;
  n.message = message;
  return ws::build_error_response(n);
}

}  // namespace

std::string forwardable(std::string_view sql) {
  std::string lower(sql);
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  // The first word, past whitespace and comments.
  std::size_t p = 0;
  for (;;) {
    while (p < lower.size() && std::isspace(static_cast<unsigned char>(lower[p]))) ++p;
    if (lower.compare(p, 2, "--") == 0) {   // (to the end of the line: \n or \r, as the lexer)
      p = lower.find_first_of("\n\r", p);
      if (p == std::string::npos) p = lower.size();
      continue;
    }
    if (lower.compare(p, 2, "/*") == 0) {   // (block comments nest, as the lexer's)
      int depth = 0;
      while (p < lower.size()) {
        if (lower.compare(p, 2, "/*") == 0) {
          ++depth;
          p += 2;
        } else if (lower.compare(p, 2, "*/") == 0) {
          p += 2;
          if (--depth == 0) break;
        } else {
          ++p;
        }
      }
      continue;
    }
    break;
  }
  std::size_t e = p;
  while (e < lower.size() && std::isalpha(static_cast<unsigned char>(lower[e]))) ++e;
  const std::string first = lower.substr(p, e - p);
  if (first != "select" && first != "with" && first != "show" && first != "table" && first != "values")
    return first.empty() ? std::string("an empty statement") : "a " + first + " statement: only SELECT, WITH, SHOW, TABLE and VALUES are forwarded";
  // Functions whose effects a rolled-back read-only transaction does not undo, SQL run from a
  // string, and escapes that could spell either.
  static constexpr std::string_view refused[] = {
      "pg_logical_emit_message", "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf", "pg_rotate_logfile",
      "pg_switch_wal", "pg_create_restore_point", "pg_create_logical_replication_slot",
      "pg_create_physical_replication_slot", "pg_drop_replication_slot", "pg_replication_slot_advance",
      "pg_copy_logical_replication_slot", "pg_copy_physical_replication_slot", "pg_logical_slot_", "pg_replication_origin",
      "_to_xml", "ts_stat", "dblink", "set_config", "pg_advisory", "pg_stat_reset", "pg_read_file", "pg_read_binary_file",
      "pg_ls_", "pg_stat_file", "pg_sleep", "pg_promote", "pg_wal_replay", "pg_backup", "pg_import_system_collations",
      "lo_export", "lo_import", "u&", "ts_rewrite", "pg_try_advisory", "txid_current", "pg_current_xact_id",
      "pg_log_", "pg_start_backup", "pg_stop_backup", "pg_file_", "_reset", "pg_hba_file_rules", "pg_file_settings"};
  for (auto word : refused)
    if (lower.find(word) != std::string::npos)
      return "it names " + std::string(word) + ", whose effect a read-only transaction does not stop";
  return {};
}

std::string forward_read_only(const std::string& conninfo, const std::string& sql, long statement_timeout_ms) {
  std::string error;
  // (freed on every way out, an exception's too: one guard, no PQfinish before each return)
  std::unique_ptr<PGconn, decltype(&PQfinish)> conn(
      snapshot_sql::connect(conninfo, "walgate replication-sql", statement_timeout_ms, error), &PQfinish);
  PGconn* c = conn.get();
  if (!c) return walgate_error("08006", "walgate cannot reach its upstream to run this statement: " + error);
  std::string out;
  {
    // The wall: the role statements run as may do nothing a rolled-back read-only transaction
    // does not stop — no superuser, no REPLICATION (slots), no signalling other sessions, no
    // server files or programs, and no EXECUTE on pg_logical_emit_message (PUBLIC has it by
    // default: a message forged into every slot's stream). Checked on every connection.
    result_guard role(PQexec(c,
        "SELECT r.rolsuper OR r.rolreplication "
        "OR pg_catalog.pg_has_role(current_user, 'pg_signal_backend', 'MEMBER') "
        "OR pg_catalog.pg_has_role(current_user, 'pg_read_server_files', 'MEMBER') "
        "OR pg_catalog.pg_has_role(current_user, 'pg_write_server_files', 'MEMBER') "
        "OR pg_catalog.pg_has_role(current_user, 'pg_execute_server_program', 'MEMBER') "
        "OR coalesce((SELECT bool_or(pg_catalog.has_function_privilege(p.oid, 'EXECUTE')) FROM pg_catalog.pg_proc p "
        "WHERE p.proname = 'pg_logical_emit_message'), false) "
        "FROM pg_catalog.pg_roles r WHERE r.rolname = current_user"));
    if (PQresultStatus(role.r) != PGRES_TUPLES_OK || PQntuples(role.r) != 1) {
      out = error_of(role.r, c);
      return out;
    }
    if (std::string(PQgetvalue(role.r, 0, 0)) != "f") {
      return walgate_error("42501",
                           "walgate forwards SQL only as a role that cannot change the server outside a read-only "
                           "transaction: give --replication-sql-pg a role without superuser, REPLICATION, "
                           "pg_signal_backend or the server-file roles, and REVOKE EXECUTE ON FUNCTION "
                           "pg_logical_emit_message FROM PUBLIC (and from that role)");
    }
  }
  {
    result_guard begin(PQexec(c, "BEGIN READ ONLY"));
    if (PQresultStatus(begin.r) != PGRES_COMMAND_OK) {
      out = error_of(begin.r, c);
      return out;
    }
  }
  // One row at a time (libpq's single-row mode): a result past max_result_bytes is cancelled
  // and refused instead of filling memory.
  if (!PQsendQueryParams(c, sql.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 0)) {
    out = error_of(nullptr, c);
    return out;
  }
  PQsetSingleRowMode(c);
  bool described = false, too_big = false;
  auto describe = [&](const PGresult* r) {
    const int fields = PQnfields(r);
    std::vector<std::string> names(static_cast<std::size_t>(fields));
    std::vector<protocol::field_description> desc(static_cast<std::size_t>(fields));
    for (int i = 0; i < fields; ++i) {
      auto& d = desc[static_cast<std::size_t>(i)];
      names[static_cast<std::size_t>(i)] = PQfname(r, i);
      d.name = names[static_cast<std::size_t>(i)];
      d.table_oid = PQftable(r, i);
      d.column = static_cast<std::int16_t>(PQftablecol(r, i));
      d.type_oid = PQftype(r, i);
      d.type_size = static_cast<std::int16_t>(PQfsize(r, i));
      d.type_modifier = PQfmod(r, i);
      d.format = 0;
    }
    out += ws::build_row_description(desc);
    described = true;
  };
  while (PGresult* raw = PQgetResult(c)) {
    result_guard r(raw);
    if (too_big) continue;   // (draining what the cancel did not stop)
    switch (PQresultStatus(r.r)) {
      case PGRES_SINGLE_TUPLE: {
        if (!described) describe(r.r);
        const int fields = PQnfields(r.r);
        std::vector<std::optional<std::string_view>> values(static_cast<std::size_t>(fields));
        for (int i = 0; i < fields; ++i)
          values[static_cast<std::size_t>(i)] =
              PQgetisnull(r.r, 0, i) ? std::nullopt
                                     : std::optional<std::string_view>(std::string_view(
                                           PQgetvalue(r.r, 0, i), static_cast<std::size_t>(PQgetlength(r.r, 0, i))));
        // (counted before it is copied: a row past the limit is never built here)
        std::size_t row = 0;
        for (int i = 0; i < fields; ++i) row += static_cast<std::size_t>(PQgetlength(r.r, 0, i)) + 4;
        if (out.size() + row <= max_result_bytes) out += ws::build_data_row(values);
        if (out.size() + row > max_result_bytes) {
          too_big = true;
          if (PGcancel* cancel = PQgetCancel(c)) {
            char why[256];
            PQcancel(cancel, why, sizeof why);
            PQfreeCancel(cancel);
          }
        }
        break;
      }
      case PGRES_TUPLES_OK:
        if (!described) describe(r.r);
        out += ws::build_command_complete(PQcmdStatus(r.r));
        break;
      case PGRES_COMMAND_OK: out += ws::build_command_complete(PQcmdStatus(r.r)); break;
      case PGRES_EMPTY_QUERY: out += ws::build_empty_query_response(); break;
      case PGRES_COPY_OUT:
      case PGRES_COPY_IN:
      case PGRES_COPY_BOTH:
        // (no COPY is relayed: the connection is dropped — the guard — which ends it, and so the loop)
          return walgate_error("42501", "walgate does not forward COPY");
      default: out += error_of(r.r, c); break;   // (after rows already sent, as the server would)
    }
  }
  if (too_big)
    out = walgate_error("54000", "the statement's result is larger than walgate relays (" +
                                     std::to_string(max_result_bytes >> 20) + " MiB)");
  PQclear(PQexec(c, "ROLLBACK"));
  return out;
}

sql_forwarder::sql_forwarder(std::string conninfo, std::function<void(std::function<void()>)> post, std::size_t max_running,
                             std::size_t max_queued, long statement_timeout_ms)
    : conninfo_(std::move(conninfo)), post_(std::move(post)), max_running_(max_running), max_queued_(max_queued),
      timeout_ms_(statement_timeout_ms) {}

sql_forwarder::~sql_forwarder() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void sql_forwarder::run(std::string sql, std::function<void(std::string)> done) {
  if (const auto why = forwardable(sql); !why.empty()) {
    done(walgate_error("42501", "walgate does not forward this statement to its upstream: " + why));
    return;
  }
  submit(
      [this, sql = std::move(sql), done]() -> std::function<void()> {
        std::string bytes;
        try {
          bytes = forward_read_only(conninfo_, sql, timeout_ms_);
        } catch (const std::exception& e) {   // (memory): this statement fails, not the process
          bytes = walgate_error("53200", std::string("cannot relay the statement's result: ") + e.what());
        }
        return [done, bytes = std::move(bytes)] { done(bytes); };
      },
      [done] { done(walgate_error("53300", "too many SQL statements forwarded to the upstream at once: try again")); });
}

void sql_forwarder::published_tables(std::vector<std::string> publications,
                                     std::function<void(std::optional<table_list>, std::string)> done) {
  submit(
      [this, publications = std::move(publications), done]() -> std::function<void()> {
        std::string error;
        std::optional<table_list> out;
        try {
          std::unique_ptr<PGconn, decltype(&PQfinish)> conn(
              snapshot_sql::connect(conninfo_, "walgate replication tables", timeout_ms_, error), &PQfinish);
          if (PGconn* c = conn.get()) {
            std::string names = "{";
            for (const auto& p : publications) {
              if (names.size() > 1) names += ",";
              names += "\"";
              for (char ch : p) {
                if (ch == '"' || ch == '\\') names += '\\';
                names += ch;
              }
              names += "\"";
            }
            names += "}";
            auto r = snapshot_sql::exec(
                c,
                "SELECT DISTINCT n.nspname, c.relname, a.attnum, a.attname, a.attnotnull "
                "FROM pg_catalog.pg_publication_tables t "
                "JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname "
                "JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename "
                "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
                "WHERE t.pubname = ANY($1::text[]) ORDER BY 1, 2, 3",
                PGRES_TUPLES_OK, error, {names});
            if (r) {
              out.emplace();
              const PGresult* res = (*r)->r;
              for (int i = 0; i < PQntuples(res); ++i) {
                const std::string schema = PQgetvalue(res, i, 0), table = PQgetvalue(res, i, 1);
                if (out->empty() || out->back().schema != schema || out->back().table != table)
                  out->push_back(transform::published_table{schema, table, {}});
                out->back().columns.emplace_back(PQgetvalue(res, i, 3), std::string(PQgetvalue(res, i, 4)) == "t");
              }
            }
          }
        } catch (const std::exception& e) {
          out.reset();
          error = e.what();
        }
        return [done, out = std::move(out), error = std::move(error)] { done(out, error); };
      },
      [done] { done(std::nullopt, "too many lookups of the upstream at once"); });
}

void sql_forwarder::submit(std::function<std::function<void()>()> work, const std::function<void()>& overflow) {
  bool full = false;
  {
    std::lock_guard lock(mutex_);
    full = queue_.size() >= max_queued_;
    if (!full) {
      queue_.push_back(std::move(work));
      if (queue_.size() > idle_ && threads_.size() < max_running_) threads_.emplace_back([this] { this->work(); });
    }
  }
  if (full) overflow();   // (outside the lock: it calls the caller back)
  else wake_.notify_one();
}

void sql_forwarder::work() {
  std::unique_lock lock(mutex_);
  for (;;) {
    ++idle_;
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (stopping_) return;
    auto job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    // (each job answers its caller even when it fails: its own try/catch)
    std::function<void()> then;
    try {
      then = job();
    } catch (...) {
    }
    if (then) post_(std::move(then));
    lock.lock();
  }
}

}  // namespace walgate::proxy
