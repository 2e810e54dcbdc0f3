#include "walgate/proxy/sql_forwarder.hpp"

#include "walgate/protocol/walsender.hpp"
#include "walgate/proxy/snapshot_sql.hpp"

#include <libpq-fe.h>

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

std::string forward_read_only(const std::string& conninfo, const std::string& sql, long statement_timeout_ms) {
  std::string error;
  PGconn* c = snapshot_sql::connect(conninfo, "walgate replication-sql", statement_timeout_ms, error);
  if (!c) return walgate_error("08006", "walgate cannot reach its upstream to run this statement: " + error);
  std::string out;
  {
    result_guard begin(PQexec(c, "BEGIN READ ONLY"));
    if (PQresultStatus(begin.r) != PGRES_COMMAND_OK) {
      out = error_of(begin.r, c);
      PQfinish(c);
      return out;
    }
  }
  result_guard r(PQexecParams(c, sql.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 0));
  switch (PQresultStatus(r.r)) {
    case PGRES_TUPLES_OK: {
      const int fields = PQnfields(r.r), rows = PQntuples(r.r);
      std::vector<std::string> names(static_cast<std::size_t>(fields));
      std::vector<protocol::field_description> desc(static_cast<std::size_t>(fields));
      for (int i = 0; i < fields; ++i) {
        auto& d = desc[static_cast<std::size_t>(i)];
        names[static_cast<std::size_t>(i)] = PQfname(r.r, i);
        d.name = names[static_cast<std::size_t>(i)];
        d.table_oid = PQftable(r.r, i);
        d.column = static_cast<std::int16_t>(PQftablecol(r.r, i));
        d.type_oid = PQftype(r.r, i);
        d.type_size = static_cast<std::int16_t>(PQfsize(r.r, i));
        d.type_modifier = PQfmod(r.r, i);
        d.format = 0;
      }
      out = ws::build_row_description(desc);
      std::vector<std::optional<std::string_view>> values(static_cast<std::size_t>(fields));
      for (int row = 0; row < rows; ++row) {
        for (int i = 0; i < fields; ++i)
          values[static_cast<std::size_t>(i)] =
              PQgetisnull(r.r, row, i) ? std::nullopt
                                       : std::optional<std::string_view>(std::string_view(
                                             PQgetvalue(r.r, row, i), static_cast<std::size_t>(PQgetlength(r.r, row, i))));
        out += ws::build_data_row(values);
      }
      out += ws::build_command_complete(PQcmdStatus(r.r));
      break;
    }
    case PGRES_COMMAND_OK: out = ws::build_command_complete(PQcmdStatus(r.r)); break;
    case PGRES_EMPTY_QUERY: out = ws::build_empty_query_response(); break;
    default: out = error_of(r.r, c); break;
  }
  PQclear(PQexec(c, "ROLLBACK"));
  PQfinish(c);
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
  submit(
      [this, sql = std::move(sql), done]() -> std::function<void()> {
        std::string bytes = forward_read_only(conninfo_, sql, timeout_ms_);
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
        if (PGconn* c = snapshot_sql::connect(conninfo_, "walgate replication tables", timeout_ms_, error)) {
          if (auto found = snapshot_sql::published_tables(c, publications, {}, error)) {
            out.emplace();
            for (const auto& [name, def] : *found) out->push_back(name);
          }
          PQfinish(c);
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
      if (idle_ == 0 && threads_.size() < max_running_) threads_.emplace_back([this] { this->work(); });
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
    post_(job());
    lock.lock();
  }
}

}  // namespace walgate::proxy
