#include "walgate/proxy/snapshot_sql.hpp"

#include "walgate/protocol/commands.hpp"
#include "walgate/transform/pg_types.hpp"

namespace walgate::proxy::snapshot_sql {

namespace {

std::string text_array(const std::vector<std::string>& items) {
  std::string out = "{";
  for (std::size_t i = 0; i < items.size(); ++i) {
    out += i ? ",\"" : "\"";
    for (char ch : items[i]) {
      if (ch == '"' || ch == '\\') out.push_back('\\');
      out.push_back(ch);
    }
    out.push_back('"');
  }
  return out + "}";
}

}  // namespace

std::string one_line(const char* s) {
  std::string out = s ? s : "";
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  for (auto& ch : out)
    if (ch == '\n') ch = ' ';
  return out;
}

std::optional<std::unique_ptr<result_guard>> exec(PGconn* c, const std::string& sql, ExecStatusType want,
                                                  std::string& error, const std::vector<std::string>& params) {
  std::vector<const char*> values;
  for (const auto& p : params) values.push_back(p.c_str());
  auto r = std::make_unique<result_guard>(
      params.empty() ? PQexec(c, sql.c_str())
                     : PQexecParams(c, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr,
                                    nullptr, 0));
  if (PQresultStatus(r->r) != want) {
    error = one_line(PQresultErrorMessage(r->r));
    if (error.empty()) error = one_line(PQerrorMessage(c));
    return std::nullopt;
  }
  return r;
}

PGconn* connect(const std::string& conninfo, const char* application_name, long statement_timeout_ms,
                std::string& error) {
  // TCP keepalives and tcp_user_timeout first (the conninfo may set its own): a server or a
  // network that goes silent mid-copy ends the connection within about a minute, instead of a
  // worker waiting in libpq for ever (and a shutdown waiting for the worker).
  const char* keys[] = {"keepalives",       "keepalives_idle",  "keepalives_interval", "keepalives_count",
                        "tcp_user_timeout", "dbname",           "application_name",    "client_encoding",
                        "connect_timeout",  nullptr};
  const char* values[] = {"1", "30", "10", "3", "60000", conninfo.c_str(), application_name, "UTF8", "10", nullptr};
  PGconn* c = PQconnectdbParams(keys, values, 1);
  if (!c || PQstatus(c) != CONNECTION_OK) {
    error = "cannot connect to PostgreSQL: " + one_line(c ? PQerrorMessage(c) : "out of memory");
    if (c) PQfinish(c);
    return nullptr;
  }
  // The session as the walsender's (pg_connection.cpp's startup parameters), so that every
  // value's text is the stream's; a copy that stalls (a client that does not read) ends at the
  // statement timeout.
  const std::string timeout = std::to_string(statement_timeout_ms);
  if (!exec(c,
            "SET DateStyle = 'ISO, YMD'; SET TimeZone = 'UTC'; SET IntervalStyle = 'postgres'; "
            "SET extra_float_digits = 3; SET bytea_output = 'hex'; SET synchronize_seqscans = off; "
            "SET statement_timeout = " + timeout + "; SET idle_in_transaction_session_timeout = " + timeout,
            PGRES_COMMAND_OK, error)) {
    PQfinish(c);
    return nullptr;
  }
  return c;
}

std::optional<table_map> published_tables(PGconn* c, const std::vector<std::string>& publications,
                                          const table_filter& keep, std::string& error) {
  table_map tables;
  const int server = PQserverVersion(c);
  {
    std::string cols = server >= 150000 ? ", attnames::text[]::text, rowfilter" : ", NULL, NULL";
    auto pub = exec(c,
                    "SELECT schemaname::text, tablename::text" + cols +
                        " FROM pg_catalog.pg_publication_tables WHERE pubname = ANY($1::text[])",
                    PGRES_TUPLES_OK, error, {text_array(publications)});
    if (!pub) {
      return std::nullopt;
    }
    for (int i = 0; i < PQntuples((*pub)->r); ++i) {
      std::string schema = PQgetvalue((*pub)->r, i, 0), name = PQgetvalue((*pub)->r, i, 1);
      if (keep && !keep(schema, name)) continue;
      auto& t = tables[{schema, name}];
      t.schema = schema;
      t.name = name;
      if (PQgetisnull((*pub)->r, i, 3)) t.unfiltered = true;
      else t.filters.emplace_back(PQgetvalue((*pub)->r, i, 3));
      if (!PQgetisnull((*pub)->r, i, 2)) {
        // attnames as text: {a,"b c"} — read back by the server itself below
        auto names = exec(c, "SELECT unnest($1::text[])", PGRES_TUPLES_OK, error, {PQgetvalue((*pub)->r, i, 2)});
        if (!names) {
          return std::nullopt;
        }
        for (int k = 0; k < PQntuples((*names)->r); ++k) t.columns.insert(PQgetvalue((*names)->r, k, 0));
      }
    }
  }
  // Each table's columns as pgoutput's Relation message gives them: not dropped, not
  // generated (unless a column list names them), the publication's column list, key flags from
  // the replica identity (FULL: every column).
  for (auto& [key, t] : tables) {
    auto cols = exec(c,
                     "SELECT c.oid, c.relkind, c.relreplident, a.attname, a.atttypid, a.atttypmod, "
                     "EXISTS (SELECT 1 FROM pg_catalog.pg_index i "
                     "  WHERE i.indrelid = c.oid AND i.indisprimary AND a.attnum = ANY(i.indkey)), "
                     "EXISTS (SELECT 1 FROM pg_catalog.pg_index i "
                     "  WHERE i.indrelid = c.oid AND i.indisreplident AND a.attnum = ANY(i.indkey)), "
                     "NULL, NULL, a.attgenerated <> '' "
                     "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                     "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
                     "WHERE n.nspname = $1 AND c.relname = $2 ORDER BY a.attnum",
                     PGRES_TUPLES_OK, error, {t.schema, t.name});
    if (!cols) {
      return std::nullopt;
    }
    auto* r = (*cols)->r;
    t.identity.nspname = t.schema;
    t.identity.relname = t.name;
    for (int i = 0; i < PQntuples(r); ++i) {
      std::string name = PQgetvalue(r, i, 3);
      const bool generated = PQgetvalue(r, i, 10)[0] == 't';
      if (t.columns.empty() ? generated : !t.columns.contains(name)) continue;
      t.identity.oid = static_cast<std::uint32_t>(std::strtoul(PQgetvalue(r, i, 0), nullptr, 10));
      t.relkind = PQgetvalue(r, i, 1)[0];
      const char ident = PQgetvalue(r, i, 2)[0];
      t.identity.replica_identity = ident;
      pg::cached_column col;
      col.name = name;
      col.type_oid = static_cast<std::uint32_t>(std::strtoul(PQgetvalue(r, i, 4), nullptr, 10));
      col.type_modifier = static_cast<std::int32_t>(std::strtol(PQgetvalue(r, i, 5), nullptr, 10));
      const bool pk = PQgetvalue(r, i, 6)[0] == 't', ri_index = PQgetvalue(r, i, 7)[0] == 't';
      col.key = ident == 'f' || (ident == 'd' && pk) || (ident == 'i' && ri_index);
      t.identity.columns.push_back(col);
      if (transform::builtin_type_name(col.type_oid, -1).empty() && !t.types.find(col.type_oid)) {
        // As pgoutput's Type message names it: a domain by its base type (getBaseType).
        auto base = exec(c,
                         "WITH RECURSIVE d(oid, typtype, typbasetype) AS ("
                         "  SELECT oid, typtype, typbasetype FROM pg_catalog.pg_type WHERE oid = $1::oid"
                         "  UNION ALL SELECT t.oid, t.typtype, t.typbasetype FROM pg_catalog.pg_type t"
                         "  JOIN d ON t.oid = d.typbasetype WHERE d.typtype = 'd') "
                         "SELECT n.nspname, t.typname FROM d JOIN pg_catalog.pg_type t ON t.oid = d.oid "
                         "JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace WHERE d.typtype <> 'd'",
                         PGRES_TUPLES_OK, error, {std::to_string(col.type_oid)});
        if (!base) {
          return std::nullopt;
        }
        if (PQntuples((*base)->r) == 1) {
          pg::type ty;
          ty.oid = col.type_oid;
          ty.nspname = PQgetvalue((*base)->r, 0, 0);
          ty.name = PQgetvalue((*base)->r, 0, 1);
          t.types.update(ty);
        }
      }
      col.key = pk;
      t.primary.columns.push_back(std::move(col));
    }
    t.primary.oid = t.identity.oid;
    t.primary.nspname = t.schema;
    t.primary.relname = t.name;
    t.primary.replica_identity = t.identity.replica_identity;
  }
  return tables;
}

std::string copy_sql(const table_def& t, const std::string& from, const std::string& extra) {
  std::string cols;
  for (const auto& c : t.identity.columns) cols += (cols.empty() ? "" : ", ") + protocol::quote_identifier(c.name);
  std::string sql = "COPY (SELECT " + cols + " FROM " + (t.relkind == 'p' && from.empty() ? "" : "ONLY ") +
                    (from.empty() ? protocol::quote_identifier(t.schema) + "." + protocol::quote_identifier(t.name) : from);
  std::string where;
  if (!t.unfiltered && !t.filters.empty()) {
    where = "(";
    for (std::size_t i = 0; i < t.filters.size(); ++i) where += (i ? " OR (" : "(") + t.filters[i] + ")";
    where += ")";
  }
  if (!extra.empty()) where += (where.empty() ? "" : " AND ") + extra;
  if (!where.empty()) sql += " WHERE " + where;
  return sql + ") TO STDOUT";
}

}  // namespace walgate::proxy::snapshot_sql
