// walgate's walsender: one coroutine per connection — the startup packet, authentication (trust,
// on a loopback address), the command loop, and while streaming a writer (events → 'w', 'k')
// beside a reader (the client's 'r' and CopyDone). See replication_server.hpp for what it
// serves and the assumptions each path keeps.
#include "walgate/proxy/replication_server.hpp"

#include "downstream_slots.hpp"

#include "walgate/protocol/replication.hpp"
#include "walgate/protocol/walsender.hpp"
#include "walgate/proxy/log_reader.hpp"
#include "walgate/transform/record.hpp"
#include "walgate/transform/test_decoding.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <cstdlib>
#include <random>

namespace walgate::proxy {

namespace asio = boost::asio;
using asio::awaitable;
using asio::ip::tcp;
using protocol::lsn;
namespace ws = protocol::walsender;
namespace pg = protocol::pgoutput;

namespace {

/// A message the server reads from a client, at most (PostgreSQL's PQ_LARGE_MESSAGE_LIMIT is
/// 1 GB; nothing a replication client sends comes near 1 MB).
constexpr std::size_t max_client_message = 1 << 20;
/// Events read from the log at a time, and about how many record bytes.
constexpr std::size_t batch_events = 512;
constexpr std::size_t batch_bytes = 1 << 20;
/// While caught up, a keepalive telling the client where walgate is goes out at most this often
/// when that moved (PostgreSQL's walsender sends one as soon as it is caught up).
constexpr auto caught_up_keepalive = std::chrono::milliseconds(1000);
/// Connections at once (PostgreSQL's max_wal_senders is 10 by default): more get PostgreSQL's
/// "sorry, too many clients already".
constexpr std::size_t max_connections = 256;
/// A connection that has not finished its startup in this long is closed (authentication_timeout).
constexpr auto startup_timeout = std::chrono::seconds(10);
/// Status updates ('r') that move a slot on are written to the slots' file at most this often.
constexpr auto slot_save_delay = std::chrono::milliseconds(50);

/// The ParameterStatus values a client gets, as the upstream reported them to walgate's own
/// session — whose TimeZone (UTC), DateStyle (ISO) and IntervalStyle walgate sets: the values in
/// the log were printed in that session, and the client is told so.
constexpr const char* reported[] = {"server_version", "server_encoding", "client_encoding", "DateStyle",
                                    "integer_datetimes", "standard_conforming_strings", "TimeZone", "IntervalStyle",
                                    "is_superuser", "session_authorization", "in_hot_standby", "scram_iterations"};

std::string copy_data(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 5);
  out.push_back('d');
  const auto n = static_cast<std::uint32_t>(payload.size() + 4);
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((n >> shift) & 0xff));
  out += payload;
  return out;
}

std::string error_message(const char* severity, const std::string& sqlstate, const std::string& message,
                          const std::string& detail = {}, const std::string& hint = {}) {
  protocol::server_notice n;
  n.severity = severity;
  n.sqlstate = sqlstate;
  n.message = message;
  n.detail = detail;
  n.hint = hint;
  return ws::build_error_response(n);
}

std::string text_result(const std::vector<std::string>& names, const std::vector<std::optional<std::string>>& row,
                        const std::string& tag) {
  std::vector<protocol::field_description> fields;
  for (const auto& n : names) {
    protocol::field_description f;
    f.name = n;
    f.type_oid = 25;
    f.type_size = -1;
    f.type_modifier = -1;
    fields.push_back(f);
  }
  std::vector<std::optional<std::string_view>> values;
  for (const auto& v : row) values.push_back(v ? std::optional<std::string_view>(*v) : std::nullopt);
  return ws::build_row_description(fields) + ws::build_data_row(values) + ws::build_command_complete(tag);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

/// SQL text with runs of white space made one space, no space at either end, and one trailing
/// semicolon dropped: what is compared with the statements clients send by themselves.
std::string normalize_sql(std::string_view s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  if (!out.empty() && out.back() == ';') out.pop_back();
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

/// server_version_num from server_version ("15.10 (Debian 15.10-0+deb12u1)" → 150010).
std::string version_num(const std::string& v) {
  int major = 0, minor = 0;
  std::size_t i = 0;
  while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) major = major * 10 + (v[i++] - '0');
  if (i < v.size() && v[i] == '.') {
    ++i;
    while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) minor = minor * 10 + (v[i++] - '0');
  }
  return std::to_string(major * 10000 + minor);
}

}  // namespace

struct replication_server::impl : std::enable_shared_from_this<impl> {
  impl(asio::io_context& io, replication_server_options o, log_reader& l)
      : io(io), opts(std::move(o)), log(l), acceptor(io),
        slots(std::filesystem::path(opts.data_dir) / "replication-slots", opts.fsync) {}

  struct session;
  static awaitable<void> run_session(std::shared_ptr<session> s);

  asio::io_context& io;
  replication_server_options opts;
  log_reader& log;
  tcp::acceptor acceptor;
  downstream_slots slots;
  std::vector<std::weak_ptr<session>> sessions;
  std::size_t visible_listener = 0, fetched_listener = 0;
  int next_pid = 0;
  bool save_scheduled = false;
  bool stopped = false;
  std::mt19937 random{std::random_device{}()};

  void say(const std::string& line) {
    if (opts.log) opts.log(line);
  }

  /// Waits until the slots' file holds the table as it is now; the error, or "".
  awaitable<std::string> persist() {
    auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::steady_clock::time_point::max());
    auto result = std::make_shared<std::optional<std::string>>();
    slots.save([timer, result, ex = io.get_executor()](const std::string& e) {
      asio::post(ex, [timer, result, e] {
        *result = e;
        timer->cancel();
      });
    });
    while (!*result) {
      boost::system::error_code ec;
      co_await timer->async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    co_return **result;
  }

  /// A slot's confirmed position moved: the file is written soon, once for a burst of updates
  /// (a failure is logged: the position in memory stays, and the next write carries it).
  void schedule_save() {
    if (save_scheduled) return;
    save_scheduled = true;
    auto timer = std::make_shared<asio::steady_timer>(io, slot_save_delay);
    timer->async_wait([self = shared_from_this(), timer](boost::system::error_code) {
      self->save_scheduled = false;
      self->slots.save([self](const std::string& e) {
        if (!e.empty()) asio::post(self->io, [self, e] { self->say("replication slots not stored: " + e); });
      });
    });
  }

  awaitable<void> accept_loop();
  void wake_streams();
};

struct replication_server::impl::session : std::enable_shared_from_this<session> {
  session(std::shared_ptr<impl> s, tcp::socket sock, int pid)
      : srv(std::move(s)), socket(std::move(sock)), wake(socket.get_executor()), pid(pid) {}

  std::shared_ptr<impl> srv;
  tcp::socket socket;
  asio::steady_timer wake;   ///< the writer's wait while streaming: cancelled to wake it
  int pid;
  std::string in;            ///< bytes read and not yet consumed
  std::vector<std::string> temporary_slots;   ///< made by this connection: dropped with it
  std::string streaming_slot;   ///< the slot this connection streams from ("" when not streaming)
  upstream_identity id;
  bool closed = false;

  // Streaming state.
  bool copy_done = false;
  std::chrono::steady_clock::time_point last_received;
  lsn sent;                  ///< the last 'w' or 'k' position sent: what a client may confirm, at most
  bool caught_up = false;    ///< sent everything the log holds (then it may confirm walgate's durable position)
  std::string pending_fatal;   ///< what the reader found wrong, sent by the writer as it stops
  bool streaming = false;
  asio::steady_timer watchdog{socket.get_executor()};

  awaitable<bool> fill() {
    char buf[16384];
    boost::system::error_code ec;
    auto n = co_await socket.async_read_some(asio::buffer(buf), asio::redirect_error(asio::use_awaitable, ec));
    if (ec || n == 0) {
      closed = true;
      co_return false;
    }
    in.append(buf, n);
    co_return true;
  }
  awaitable<bool> send(std::string bytes) {
    boost::system::error_code ec;
    co_await asio::async_write(socket, asio::buffer(bytes), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) closed = true;
    co_return !ec;
  }
  // (Coroutines here take strings by value: a temporary bound to a coroutine's reference
  // parameter is what GCC 12 has mishandled.)
  awaitable<void> fatal(std::string sqlstate, std::string message, std::string hint = {}) {
    co_await send(error_message("FATAL", sqlstate, message, {}, hint));
    closed = true;
    co_return;
  }
  awaitable<bool> error(std::string sqlstate, std::string message, std::string detail = {}, std::string hint = {}) {
    co_return co_await send(error_message("ERROR", sqlstate, message, detail, hint) + ws::build_ready_for_query('I'));
  }

  bool started = false;   ///< the startup is over (the startup timer closes the connection until then)

  awaitable<void> run() {
    {
      auto timer = std::make_shared<asio::steady_timer>(socket.get_executor(), startup_timeout);
      timer->async_wait([self = shared_from_this(), timer](boost::system::error_code ec) {
        if (ec || self->started || self->closed) return;
        self->closed = true;
        boost::system::error_code ignored;
        self->socket.close(ignored);
      });
    }
    // (Every coroutine here ends in an explicit co_return: GCC 12 traps (ud2) resuming a member
    // coroutine that flowed off its end after a plain call.)
    const bool ok = co_await startup();
    started = true;
    if (ok) co_await commands();
    finish();
    co_return;
  }

  void finish() {
    boost::system::error_code ec;
    socket.close(ec);
    for (const auto& name : temporary_slots)
      if (auto* s = srv->slots.find(name); s && s->temporary && s->active_pid == pid) srv->slots.all().erase(name);
    if (auto* s = srv->slots.find(streaming_slot); s && s->active_pid == pid && !s->temporary) s->active_pid = 0;
  }

  // --- Startup ---------------------------------------------------------------------------------

  awaitable<bool> startup() {
    for (;;) {
      auto r = ws::split_startup_packet(protocol::as_bytes(std::string_view(in)));
      if (r.status == protocol::split_status::need_more) {
        if (!co_await fill()) co_return false;
        continue;
      }
      if (r.status == protocol::split_status::error) {
        co_await fatal("08P01", "invalid startup packet: " + r.error.message());
        co_return false;
      }
      const auto what = r.packet.what;
      if (what == ws::startup_packet::kind::ssl_request || what == ws::startup_packet::kind::gssenc_request) {
        // (TLS on this endpoint is not built: 'N', and the client goes on in the clear or gives up)
        in.erase(0, r.packet.size);
        if (!in.empty()) {   // bytes after an SSLRequest before the answer: PostgreSQL refuses them too
          co_await fatal("08P01", "received unencrypted data after SSL request");
          co_return false;
        }
        if (!co_await send("N")) co_return false;
        continue;
      }
      if (what == ws::startup_packet::kind::cancel_request) co_return false;   // (nothing to cancel: closed)
      // A StartupMessage: its parameters copied out before the bytes go.
      std::map<std::string, std::string> params;
      std::vector<std::string> unknown_options;
      for (const auto& [k, v] : r.packet.params) {
        if (k.rfind("_pq_.", 0) == 0) unknown_options.emplace_back(k);
        else params.emplace(std::string(k), std::string(v));
      }
      const std::uint32_t minor = r.packet.version & 0xffff;
      in.erase(0, r.packet.size);
      if (minor > 0 || !unknown_options.empty()) {
        std::vector<std::string_view> views(unknown_options.begin(), unknown_options.end());
        if (!co_await send(ws::build_negotiate_protocol_version(0, views))) co_return false;
      }
      co_return co_await authenticate(params);
    }
  }

  awaitable<bool> authenticate(const std::map<std::string, std::string>& params) {
    auto param = [&](const char* n) -> std::string {
      auto it = params.find(n);
      return it == params.end() ? std::string() : it->second;
    };
    const std::string user = param("user");
    if (user.empty()) {
      co_await fatal("28000", "no PostgreSQL user name specified in startup packet");
      co_return false;
    }
    if (param("replication") != "database") {
      co_await fatal("0A000", "walgate serves logical replication connections only (replication=database)",
                     "connect with replication=database, as pg_recvlogical and subscribers do; stream JSON over HTTP instead");
      co_return false;
    }
    auto known = srv->opts.identity ? srv->opts.identity() : std::nullopt;
    if (!known) {
      co_await fatal("57P03", "walgate has not connected to its upstream PostgreSQL yet",
                     "try again once walgate is streaming");
      co_return false;
    }
    id = *known;
    const std::string db = param("database").empty() ? user : param("database");
    if (db != id.dbname) {
      co_await fatal("3D000", "database \"" + db + "\" does not exist",
                     "walgate serves the database it streams from: \"" + id.dbname + "\"");
      co_return false;
    }
    std::string out = ws::build_authentication_ok();
    for (const char* name : reported)
      if (auto it = id.parameters.find(name); it != id.parameters.end()) out += ws::build_parameter_status(name, it->second);
    out += ws::build_parameter_status("application_name", param("application_name"));
    out += ws::build_backend_key_data(pid, static_cast<std::int32_t>(srv->random()));
    out += ws::build_ready_for_query('I');
    co_return co_await send(std::move(out));
  }

  // --- Commands --------------------------------------------------------------------------------

  awaitable<void> commands() {
    bool extended_error = false;   // an extended-protocol message was refused: the rest up to Sync are ignored
    while (!closed) {
      auto r = ws::split_frontend_message(protocol::as_bytes(std::string_view(in)), max_client_message);
      if (r.status == protocol::split_status::need_more) {
        if (!co_await fill()) co_return;
        continue;
      }
      if (r.status == protocol::split_status::error) {
        co_await fatal("08P01", "invalid message from the client: " + r.error.message());
        co_return;
      }
      const char tag = static_cast<char>(r.message.tag);
      std::string body(protocol::as_string_view(r.message.body));
      in.erase(0, r.message.size);
      switch (tag) {
        case 'X': co_return;
        case 'Q': {
          auto text = ws::parse_query(protocol::as_bytes(std::string_view(body)));
          if (!text) {
            co_await fatal("08P01", "invalid Query message: " + text.error().message());
            co_return;
          }
          co_await query(std::string(*text));
          break;
        }
        case 'S':
          extended_error = false;
          if (!co_await send(ws::build_ready_for_query('I'))) co_return;
          break;
        case 'P': case 'B': case 'E': case 'D': case 'C': case 'F':
          if (!extended_error) {
            extended_error = true;
            const std::string refused =
                error_message("ERROR", "08P01",
                              tag == 'F' ? "fastpath function calls not supported in a replication connection"
                                         : "extended query protocol not supported in a replication connection");
            if (!co_await send(refused)) co_return;
          }
          break;
        case 'H': break;
        case 'd': case 'c': case 'f': break;   // (CopyData after a COPY ended: ignored, as PostgreSQL does)
        default:
          co_await fatal("08P01", "invalid frontend message type " + std::to_string(static_cast<unsigned char>(tag)));
          co_return;
      }
    }
    co_return;
  }

  awaitable<void> query(std::string text) {
    if (normalize_sql(text).empty()) {
      co_await send(ws::build_empty_query_response() + ws::build_ready_for_query('I'));
      co_return;
    }
    auto parsed = ws::parse_replication_command(text);
    if (!parsed.command) {
      // (PostgreSQL's replication grammar reports bison's bare "syntax error"; the lexer's own
      // messages — an unterminated string, a bad LSN — as they are)
      // (made before the co_await: GCC 12 corrupts the heap with a conditional's temporary
      // bound to a coroutine's reference parameter)
      const std::string message = parsed.error.rfind("syntax error", 0) == 0 ? std::string("syntax error") : parsed.error;
      co_await error("42601", message);
      co_return;
    }
    auto& c = *parsed.command;
    using k = ws::replication_command::kind;
    switch (c.what) {
      case k::identify_system: {
        auto pos = srv->opts.durable_lsn ? srv->opts.durable_lsn() : lsn{};
        {
      // (built outside the co_await: GCC 12 cannot keep an initializer list's array in a coroutine frame)
      std::string bytes = text_result({"systemid", "timeline", "xlogpos", "dbname"},
                                  {id.system_id, std::to_string(id.timeline), pos.to_string(), id.dbname}, "IDENTIFY_SYSTEM") +
                      ws::build_ready_for_query('I');
      co_await send(std::move(bytes));
    }
        co_return;
      }
      case k::show: co_await show(c.name); co_return;
      case k::create_slot: co_await create_slot(c); co_return;
      case k::drop_slot: co_await drop_slot(c); co_return;
      case k::start_replication: co_await start(c); co_return;
      case k::sql: co_await sql(text); co_return;
      default:
        co_await error("0A000", "walgate serves logical replication only: this command is not served here",
                       "walgate answers IDENTIFY_SYSTEM, SHOW, CREATE_REPLICATION_SLOT … LOGICAL, DROP_REPLICATION_SLOT "
                       "and START_REPLICATION SLOT … LOGICAL");
        co_return;
    }
    co_return;
  }

  awaitable<void> show(const std::string& name) {
    std::optional<std::string> value;
    auto upstream = [&](const char* p) -> std::optional<std::string> {
      for (const auto& [k, v] : id.parameters)
        if (lower(k) == p) return v;
      return std::nullopt;
    };
    if (name == "data_directory_mode") value = "0700";
    else if (name == "server_version_num") {
      if (auto v = upstream("server_version")) value = version_num(*v);
    } else if (name == "server_version" || name == "server_encoding" || name == "client_encoding" || name == "datestyle" ||
               name == "timezone" || name == "intervalstyle" || name == "integer_datetimes" ||
               name == "standard_conforming_strings") {
      value = upstream(name.c_str());
    }
    if (!value) {
      co_await error("42704", "unrecognized configuration parameter \"" + name + "\"");
      co_return;
    }
    {
      // (built outside the co_await: GCC 12 cannot keep an initializer list's array in a coroutine frame)
      std::string bytes = text_result({name}, {*value}, "SHOW") + ws::build_ready_for_query('I');
      co_await send(std::move(bytes));
    }
    co_return;
  }

  awaitable<void> sql(const std::string& text) {
    // What libpq's replication clients send by themselves before anything else (streamutil.c's
    // ALWAYS_SECURE_SEARCH_PATH_SQL): answered as the server would, changing nothing here (the
    // emulated plugins print as with an empty search_path).
    if (lower(normalize_sql(text)) == "select pg_catalog.set_config('search_path', '', false)") {
      {
      // (built outside the co_await: GCC 12 cannot keep an initializer list's array in a coroutine frame)
      std::string bytes = text_result({"set_config"}, {std::string()}, "SELECT 1") + ws::build_ready_for_query('I');
      co_await send(std::move(bytes));
    }
      co_return;
    }
    co_await error("0A000", "walgate's walsender does not run SQL",
                   "it answers replication commands; forwarding SQL to the upstream (--replication-sql) is not built yet");
    co_return;
  }

  awaitable<void> create_slot(const ws::replication_command& c) {
    if (!c.logical) {
      co_await error("0A000", "walgate serves logical replication only: physical slots are not made here");
      co_return;
    }
    if (auto e = slot_name_error(c.name); !e.empty()) {
      // (PostgreSQL's ReplicationSlotValidateName: too long is 42622; the hint goes with a character)
      // (Arguments made before the co_await: GCC 12 mishandles a conditional of string literals
      // in a coroutine's call.)
      const std::string code = e.find("too long") != std::string::npos ? "42622" : "42602";
      std::string hint;
      if (e.find("contains invalid character") != std::string::npos)
        hint = "Replication slot names may only contain lower case letters, numbers, and the underscore character.";
      co_await error(code, e, std::string(), hint);
      co_return;
    }
    if (srv->slots.find(c.name)) {
      co_await error("42710", "replication slot \"" + c.name + "\" already exists");
      co_return;
    }
    if (c.plugin != "test_decoding") {
      co_await error("0A000", "output plugin \"" + c.plugin + "\" is not served by walgate yet",
                     {}, "walgate emulates test_decoding; pgoutput and wal2json are to come");
      co_return;
    }
    downstream_slot s;
    s.name = c.name;
    s.plugin = c.plugin;
    s.temporary = c.temporary;
    std::string snapshot = "export";   // (the server's default for a logical slot)
    for (const auto& o : c.options) {
      if (o.name == "snapshot") snapshot = o.value.value_or("");
      else if (o.name == "two_phase") s.two_phase = !o.value || lower(*o.value) == "true" || *o.value == "1" || lower(*o.value) == "on";
      else if (o.name == "failover") s.failover = !o.value || lower(*o.value) == "true" || *o.value == "1" || lower(*o.value) == "on";
      else {   // (reserve_wal too: PostgreSQL takes it for physical slots only)
        co_await error("42601", "unrecognized option: " + o.name);
        co_return;
      }
    }
    if (snapshot != "nothing") {
      const std::string message =
          "walgate cannot " + std::string(snapshot == "use" ? "use" : "export") + " a snapshot with a downstream slot yet";
      co_await error("0A000", message,
                     {}, "create the slot with (SNAPSHOT 'nothing') or NOEXPORT_SNAPSHOT; its stream starts after every transaction walgate holds");
      co_return;
    }
    // Every transaction the log holds now is before the slot: it starts with the next one.
    const auto last = srv->log.last_visible_id();
    lsn start = srv->opts.durable_lsn ? srv->opts.durable_lsn() : lsn{};
    if (last.commit_lsn.valid()) start = std::max(start, lsn{last.commit_lsn.value + 1});
    s.confirmed_flush = start;
    // Held by this connection while it is stored (another gets 55006 meanwhile); a temporary
    // slot is held by it for good, as PostgreSQL's are by their backend.
    s.active_pid = pid;
    srv->slots.all().emplace(s.name, s);
    if (s.temporary) {
      temporary_slots.push_back(s.name);
    } else {
      const auto e = co_await srv->persist();
      auto* made = srv->slots.find(s.name);
      if (!e.empty()) {
        if (made && made->active_pid == pid) srv->slots.all().erase(s.name);
        co_await error("58030", "could not store replication slot \"" + s.name + "\": " + e);
        co_return;
      }
      if (made && made->active_pid == pid) made->active_pid = 0;
    }
    srv->say("replication slot " + s.name + " made (" + s.plugin + (s.temporary ? ", temporary" : "") + ") at " +
             start.to_string() + " by connection " + std::to_string(pid));
    {
      // (built outside the co_await: GCC 12 cannot keep an initializer list's array in a coroutine frame)
      std::string bytes = text_result({"slot_name", "consistent_point", "snapshot_name", "output_plugin"},
                              {s.name, start.to_string(), std::nullopt, s.plugin}, "CREATE_REPLICATION_SLOT") +
                  ws::build_ready_for_query('I');
      co_await send(std::move(bytes));
    }
    co_return;
  }

  /// PostgreSQL's answer (with ReadyForQuery) when slot `name` (s: found, or null) cannot be
  /// taken by this connection: missing (42704), or held by another (55006); "" when it can.
  std::string unavailable(const std::string& name, const downstream_slot* s) const {
    if (!s) return error_message("ERROR", "42704", "replication slot \"" + name + "\" does not exist") + ws::build_ready_for_query('I');
    if (s->active_pid && s->active_pid != pid)
      return error_message("ERROR", "55006", "replication slot \"" + name + "\" is active for PID " + std::to_string(s->active_pid)) +
             ws::build_ready_for_query('I');
    return {};
  }

  awaitable<void> drop_slot(const ws::replication_command& c) {
    auto* s = srv->slots.find(c.name);
    if (!s) {
      co_await error("42704", "replication slot \"" + c.name + "\" does not exist");
      co_return;
    }
    while (s && s->active_pid && s->active_pid != pid && c.wait && !closed) {   // WAIT: until it is let go
      asio::steady_timer t(socket.get_executor(), std::chrono::milliseconds(100));
      boost::system::error_code ec;
      co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      s = srv->slots.find(c.name);
    }
    if (const std::string refused = unavailable(c.name, s); !refused.empty()) {
      co_await send(refused);
      co_return;
    }
    if (!s->temporary) {
      // Left out of the file while it is written; gone once it is (kept, and let go, if not).
      s->dropping = true;
      s->active_pid = pid;
      const auto e = co_await srv->persist();
      s = srv->slots.find(c.name);
      if (!e.empty()) {
        if (s) {
          s->dropping = false;
          s->active_pid = 0;
        }
        co_await error("58030", "could not store the replication slots: " + e);
        co_return;
      }
    }
    srv->slots.all().erase(c.name);
    std::erase(temporary_slots, c.name);
    srv->say("replication slot " + c.name + " dropped by connection " + std::to_string(pid));
    co_await send(ws::build_command_complete("DROP_REPLICATION_SLOT") + ws::build_ready_for_query('I'));
    co_return;
  }

  // --- Streaming -------------------------------------------------------------------------------

  awaitable<void> start(const ws::replication_command& c) {
    if (!c.logical) {
      co_await error("0A000", "walgate serves logical replication only: physical replication is not served here");
      co_return;
    }
    if (c.name.empty()) {
      co_await error("42601", "START_REPLICATION … LOGICAL needs a slot");
      co_return;
    }
    auto* s = srv->slots.find(c.name);
    if (const std::string refused = unavailable(c.name, s); !refused.empty()) {
      co_await send(refused);
      co_return;
    }
    std::vector<std::pair<std::string, std::optional<std::string>>> options;
    for (const auto& o : c.options) options.emplace_back(o.name, o.value);
    auto parsed = transform::parse_test_decoding_options(options);
    if (!parsed.error.empty()) {
      co_await error("22023", parsed.error);
      co_return;
    }
    {
      auto v = id.parameters.find("server_version");
      parsed.options.message_is_change = v == id.parameters.end() || std::atoi(v->second.c_str()) >= 17;
    }
    const lsn from = std::max(c.start, s->confirmed_flush);
    // Where to begin reading: the stream itself skips every transaction whose commit LSN is below
    // `from`, so this only has to be at or before the first one that is not — and nothing the
    // slot needs may have been let go. What retention dropped is known by the first retained
    // event (the log no longer begins at its first one) and, in this process, by the last id it
    // dropped: a slot whose position is past that one lost nothing.
    std::uint64_t seq = srv->log.first_seq();
    const bool dropped_any = srv->log.first_seq() > 0;
    const auto dropped_last = srv->log.last_dropped_id();
    bool lost = false;
    if (from.value == 0) {
      lost = dropped_any;
    } else {
      transform::event_id before;
      before.commit_lsn = lsn{from.value - 1};
      before.at = transform::event_id::mark::commit;
      auto r = srv->log.resume_after(before);
      if (!r.error.empty()) {
        co_await error("XX000", "cannot read walgate's event log: " + r.error);
        co_return;
      }
      if (r.seq) seq = *r.seq;
      else if (!dropped_any || (dropped_last && dropped_last->commit_lsn < from)) seq = srv->log.first_seq();
      else lost = true;
    }
    if (lost) {
      const bool v18 = [&] {
        auto v = id.parameters.find("server_version");
        return v != id.parameters.end() && std::atoi(v->second.c_str()) >= 18;
      }();
      const std::string message =
          std::string(v18 ? "can no longer access replication slot \"" : "can no longer get changes from replication slot \"") +
          c.name + "\"";
      co_await error("55000", message,
                     "walgate's event log no longer holds " + from.to_string() +
                         ": its retention let it go (downstream slots do not hold retention yet)",
                     "drop the slot and make it again; raise --retention-mb to keep more");
      co_return;
    }
    s->active_pid = pid;
    streaming_slot = c.name;
    srv->say("replication slot " + c.name + " streaming to connection " + std::to_string(pid) + " from " + from.to_string());
    if (!co_await send(ws::build_copy_both_response())) co_return;
    co_await stream(c.name, parsed.options, from, seq);
    if (auto* still = srv->slots.find(c.name); still && still->active_pid == pid && !still->temporary) still->active_pid = 0;
    streaming_slot.clear();
    if (!closed && copy_done) {
      // CopyDone from the client: ours, then the COPY's end and the command's (as the walsender:
      // "COPY 0", then "START_REPLICATION"), and the connection goes on.
      co_await send(std::string("c\0\0\0\4", 5) + ws::build_command_complete("COPY 0") +
                    ws::build_command_complete("START_REPLICATION") + ws::build_ready_for_query('I'));
    }
    co_return;
  }

  /// The client's side while streaming: status updates ('r'), CopyDone, Terminate.
  awaitable<void> read_client(std::string slot_name) {
    auto self = shared_from_this();
    while (!closed && !copy_done) {
      auto r = ws::split_frontend_message(protocol::as_bytes(std::string_view(in)), max_client_message);
      if (r.status == protocol::split_status::need_more) {
        if (!co_await fill()) break;
        continue;
      }
      if (r.status == protocol::split_status::error) {
        pending_fatal = error_message("FATAL", "08P01", "invalid message from the client: " + r.error.message());
        closed = true;
        break;
      }
      last_received = std::chrono::steady_clock::now();
      const char tag = static_cast<char>(r.message.tag);
      std::string body(protocol::as_string_view(r.message.body));
      in.erase(0, r.message.size);
      if (tag == 'd' && !body.empty() && body[0] == 'r') {
        auto u = protocol::parse_standby_status_update(protocol::as_bytes(std::string_view(body)));
        if (!u) {
          pending_fatal = error_message("FATAL", "08P01", "invalid standby status update: " + u.error().message());
          closed = true;
          break;
        }
        // Never past what this client was sent (or, caught up, walgate's durable position, which
        // its keepalives say): a client cannot confirm what walgate has not given it.
        lsn cap = sent;
        if (caught_up && srv->opts.durable_lsn) cap = std::max(cap, srv->opts.durable_lsn());
        const lsn flushed = std::min(u->flushed, cap);
        if (auto* s = srv->slots.find(slot_name); s && s->active_pid == pid && flushed > s->confirmed_flush) {
          s->confirmed_flush = flushed;
          if (!s->temporary) srv->schedule_save();
        }
      } else if (tag == 'c') {
        copy_done = true;
      } else if (tag == 'X') {
        closed = true;
      } else if (tag == 'd') {
        // ('h' hot standby feedback and the rest: nothing for a logical stream)
      } else {
        pending_fatal = error_message("FATAL", "08P01", "unexpected message type " + std::to_string(static_cast<unsigned char>(tag)) +
                                                            " during a replication stream");
        closed = true;
      }
    }
    wake.cancel();
    co_return;
  }

  struct open_transaction {
    bool open = false;
    lsn commit, end;
    std::uint32_t xid = 0;
    std::int64_t commit_time = 0;
    bool wrote = false;
    bool skipped = false;   ///< only-local and a transaction with an origin
    std::vector<pg::cached_relation> truncated;   ///< a Truncate being joined (copies: the view is reused)
    std::uint8_t truncate_options = 0;
    lsn truncate_lsn;
  };

  void disconnect_silent(const std::string& slot_name) {
    if (closed) return;
    srv->say("replication connection " + std::to_string(pid) + " (slot " + slot_name + ") sent nothing for " +
             std::to_string(srv->opts.timeout.count()) + " ms: disconnected");
    closed = true;
    boost::system::error_code ec;
    socket.close(ec);
  }

  awaitable<void> watch(std::string slot_name) {
    auto self = shared_from_this();
    while (streaming && !closed) {
      watchdog.expires_after(srv->opts.timeout / 4);
      boost::system::error_code ec;
      co_await watchdog.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (!streaming || closed) break;
      if (std::chrono::steady_clock::now() - last_received > srv->opts.timeout) disconnect_silent(slot_name);
    }
    co_return;
  }

  awaitable<void> stream(std::string slot_name, transform::test_decoding_options o, lsn from, std::uint64_t seq) {
    auto self = shared_from_this();
    copy_done = false;
    last_received = std::chrono::steady_clock::now();
    asio::co_spawn(socket.get_executor(), read_client(slot_name), asio::detached);
    transform::record_view view;
    open_transaction t;
    sent = lsn{};
    caught_up = false;
    lsn keepalive_sent;
    auto last_keepalive = std::chrono::steady_clock::now();
    bool ping_outstanding = false;
    std::string out;
    const auto timeout = srv->opts.timeout;

    auto write = [&](lsn at, std::string_view text) {
      protocol::xlog_data x;
      x.wal_start = at;
      x.wal_end = at;
      x.server_clock_us = protocol::pg_now_us();
      x.data = protocol::as_bytes(text);
      out += copy_data(protocol::build_xlog_data(x));
      sent = std::max(sent, at);
    };
    auto begin_if_needed = [&](lsn at) {
      if (!t.wrote && o.skip_empty_xacts) write(at, transform::test_decoding_begin(o, t.xid));
      t.wrote = true;
    };
    auto flush_truncate = [&] {
      if (t.truncated.empty()) return;
      begin_if_needed(t.truncate_lsn);
      std::vector<const pg::cached_relation*> rels;
      for (const auto& r : t.truncated) rels.push_back(&r);
      std::string line;
      transform::test_decoding_truncate(line, rels, t.truncate_options);
      write(t.truncate_lsn, line);
      t.truncated.clear();
    };
    auto close_transaction = [&] {
      if (!t.open) return;
      flush_truncate();
      if (!t.skipped && (!o.skip_empty_xacts || t.wrote)) write(t.end, transform::test_decoding_commit(o, t.xid, t.commit_time));
      t = open_transaction{};
    };

    // The watchdog: a client silent past the timeout is disconnected even while a write to it
    // waits (a client that stopped reading): closing the socket ends the write.
    streaming = true;
    asio::co_spawn(socket.get_executor(), watch(slot_name), asio::detached);
    auto timed_out = [&] { return std::chrono::steady_clock::now() - last_received > timeout; };

    while (!closed && !copy_done) {
      const auto now = std::chrono::steady_clock::now();
      if (timed_out()) {
        disconnect_silent(slot_name);
        break;
      }
      // A keepalive: asking for a reply once the client was quiet for half the timeout (while
      // events are sent too, as the walsender does), or, caught up, telling where walgate is when
      // that moved (nothing below it is missing: the client may confirm it).
      if (now - last_received < timeout / 2) ping_outstanding = false;
      const bool ask = !ping_outstanding && now - last_received >= timeout / 2;
      lsn position = sent;
      if (caught_up && srv->opts.durable_lsn) position = std::max(position, srv->opts.durable_lsn());
      if (ask || (caught_up && position > keepalive_sent && now - last_keepalive >= caught_up_keepalive)) {
        protocol::primary_keepalive k;
        k.wal_end = position;
        k.server_clock_us = protocol::pg_now_us();
        k.reply_requested = ask;
        if (!co_await send(copy_data(protocol::build_primary_keepalive(k)))) break;
        keepalive_sent = position;
        last_keepalive = now;
        if (ask) ping_outstanding = true;
        continue;
      }
      if (seq < srv->log.visible_seq()) {
        caught_up = false;
        std::string error;
        bool fetching = false;
        // (Events not in memory are read in the background, never on this loop: the
        // notification wakes this stream when they are there.)
        auto events = srv->log.read(seq, batch_events, batch_bytes, &error, &fetching);
        if (events.empty() && fetching) {
          wake.expires_after(caught_up_keepalive);
          boost::system::error_code ec;
          co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, ec));
          continue;
        }
        if (events.empty()) {
          const std::string failed =
              error_message("ERROR", error.empty() ? "55000" : "XX000",
                            error.empty() ? "walgate's event log no longer holds what this slot needs next (" + std::to_string(seq) + ")"
                                          : "cannot read walgate's event log: " + error);
          co_await send(failed);
          closed = true;
          break;
        }
        for (const auto& e : events) {
          seq = e->seq + 1;
          if (e->id.commit_lsn < from) continue;   // (a transaction before where the slot starts)
          if (auto r = transform::read_record(protocol::as_bytes(std::string_view(e->record)), view); !r) {
            co_await send(error_message("ERROR", "XX000", "walgate's event log holds a record it cannot read at event " +
                                                             std::to_string(e->seq) + ": " + r.error().message()));
            closed = true;
            break;
          }
          const auto& c = view.get();
          if (c.kind == transform::op::read) continue;   // (an initial snapshot's row: no change a plugin prints)
          if (c.kind == transform::op::message && c.message && !c.message->transactional) {
            close_transaction();
            if (!(o.only_local && c.txn->origin)) {
              std::string line;
              transform::test_decoding_change(line, c);
              write(c.change_lsn, line);
            }
            continue;
          }
          if (t.open && t.commit != e->id.commit_lsn) close_transaction();
          if (!t.open) {
            t.open = true;
            t.commit = e->id.commit_lsn;
            t.end = c.txn->end_lsn;
            t.xid = c.txn->xid;
            t.commit_time = c.txn->commit_time;
            t.skipped = o.only_local && c.txn->origin.has_value();
            if (!t.skipped && !o.skip_empty_xacts) write(c.change_lsn, transform::test_decoding_begin(o, t.xid));
          }
          if (t.skipped) continue;
          if (!t.truncated.empty() && (c.kind != transform::op::truncate || c.change_lsn != t.truncate_lsn)) flush_truncate();
          if (c.kind == transform::op::truncate) {
            if (c.relation) {
              t.truncated.push_back(*c.relation);
              t.truncate_lsn = c.change_lsn;
              t.truncate_options = c.truncate_options;
            }
            continue;
          }
          if (c.kind == transform::op::message) {
            // (test_decoding before 17: no BEGIN for a message, and it is no change)
            if (o.message_is_change) begin_if_needed(c.change_lsn);
            std::string line;
            transform::test_decoding_change(line, c);
            write(c.change_lsn, line);
            continue;
          }
          begin_if_needed(c.change_lsn);
          std::string line;
          transform::test_decoding_change(line, c);
          write(c.change_lsn, line);
        }
        if (closed) break;
        const bool at_end = seq >= srv->log.visible_seq();
        if (at_end) close_transaction();   // (visibility is whole transactions)
        if (!out.empty()) {
          // (One batch at a time, written before the next is read: what a client that reads
          // slowly holds in walgate's memory is one batch, about batch_bytes of records.)
          if (!co_await send(std::move(out))) break;
          out.clear();
        }
        caught_up = at_end;
        continue;
      }
      caught_up = true;
      wake.expires_after(std::min<std::chrono::steady_clock::duration>(caught_up_keepalive, timeout / 4));
      boost::system::error_code ec;
      co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    streaming = false;
    watchdog.cancel();
    caught_up = false;
    if (!pending_fatal.empty() && socket.is_open()) {
      std::string f = std::move(pending_fatal);
      pending_fatal.clear();
      co_await send(std::move(f));
      closed = true;
    }
    co_return;
  }
};

/// A connection's coroutine: holds the session (a lambda coroutine would keep only a pointer to
/// its closure, gone once co_spawn has called it).
awaitable<void> replication_server::impl::run_session(std::shared_ptr<session> s) { co_await s->run(); }

awaitable<void> replication_server::impl::accept_loop() {
  auto self = shared_from_this();
  while (!stopped) {
    boost::system::error_code ec;
    tcp::socket socket(io);
    co_await acceptor.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      if (stopped || ec == asio::error::operation_aborted) co_return;
      // (A connection that failed before it was accepted, or no descriptor left: a pause, not a
      // spin on the loop.)
      asio::steady_timer pause(io, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    std::erase_if(sessions, [](const auto& w) { return w.expired(); });
    if (sessions.size() >= max_connections) {
      const std::string refused = error_message("FATAL", "53300", "sorry, too many clients already");
      socket.write_some(asio::buffer(refused), ec);   // (best effort: a fresh socket takes it)
      socket.close(ec);
      continue;
    }
    auto s = std::make_shared<session>(self, std::move(socket), ++next_pid);
    sessions.push_back(s);
    asio::co_spawn(io, run_session(std::move(s)), asio::detached);
  }
  co_return;
}

void replication_server::impl::wake_streams() {
  for (auto& w : sessions)
    if (auto s = w.lock(); s && !s->streaming_slot.empty()) s->wake.cancel();
}

replication_server::replication_server(asio::io_context& io, replication_server_options o, log_reader& log)
    : impl_(std::make_shared<impl>(io, std::move(o), log)) {}

replication_server::~replication_server() { stop(); }

bool replication_server::start(std::string& error) {
  if (!impl_->slots.load(error)) return false;
  boost::system::error_code ec;
  auto address = asio::ip::make_address(impl_->opts.host, ec);
  if (ec) {
    error = "--replication-listen: invalid address '" + impl_->opts.host + "'";
    return false;
  }
  tcp::endpoint ep(address, impl_->opts.port);
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    error = "--replication-listen " + impl_->opts.host + ":" + std::to_string(impl_->opts.port) + ": " + ec.message();
    return false;
  }
  auto weak = std::weak_ptr<impl>(impl_);
  impl_->visible_listener = impl_->log.on_visible([weak] {
    if (auto i = weak.lock()) i->wake_streams();
  });
  impl_->fetched_listener = impl_->log.on_fetched([weak] {
    if (auto i = weak.lock()) i->wake_streams();
  });
  asio::co_spawn(impl_->io, impl_->accept_loop(), asio::detached);
  return true;
}

std::uint16_t replication_server::port() const {
  boost::system::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void replication_server::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
  if (impl_->visible_listener) impl_->log.remove_listener(impl_->visible_listener);
  if (impl_->fetched_listener) impl_->log.remove_listener(impl_->fetched_listener);
  impl_->visible_listener = impl_->fetched_listener = 0;
  for (auto& w : impl_->sessions)
    if (auto s = w.lock()) {
      s->closed = true;
      s->socket.close(ec);
      s->wake.cancel();
    }
}

}  // namespace walgate::proxy
