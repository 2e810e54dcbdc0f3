// walgate's walsender: one coroutine per connection — the startup packet, authentication (SCRAM
// against --replication-users, or trust on a loopback address), the command loop, and while streaming a writer (events → 'w', 'k')
// beside a reader (the client's 'r' and CopyDone). See replication_server.hpp for what it
// serves and the assumptions each path keeps. One file (about 1,800 lines): a connection's
// steps — startup, SCRAM, commands, slots, streaming — are one coroutine's and share its session
// state; the slots' file (downstream_slots) and the protocol's bytes (protocol/walsender.hpp,
// protocol/auth.hpp) already live apart, as do the plugins (transform/output_plugin.hpp: the
// streaming loop groups the log into transactions and calls one) and the SQL run upstream
// (proxy/upstream's sql_forwarder, through replication_server_options).
#include "walgate/proxy/replication_server.hpp"

#include "downstream_slots.hpp"

#include "walgate/protocol/base64.hpp"
#include "walgate/protocol/replication.hpp"
#include "walgate/protocol/walsender.hpp"
#include "walgate/proxy/failure_window.hpp"
#include "walgate/proxy/log_reader.hpp"
#include "walgate/proxy/metrics.hpp"
#include "walgate/proxy/tls_server.hpp"
#include "walgate/transform/record.hpp"
#include "walgate/transform/output_plugin.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>


#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

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
/// when that moved (PostgreSQL's walsender sends one as soon as it is caught up, and as the WAL
/// it has read moves on): walgate's durable position moves without a new event (an fsync ends,
/// the server's keepalive), so a caught-up stream looks this often. A client waiting for a
/// position (pg_recvlogical --endpos) learns of it within this.
constexpr auto caught_up_keepalive = std::chrono::milliseconds(100);
/// Connections at once (PostgreSQL's max_wal_senders is 10 by default): more get PostgreSQL's
/// "sorry, too many clients already".
constexpr std::size_t max_connections = 256;
/// Downstream slots at most (PostgreSQL's max_replication_slots): the table, its file and the
/// per-confirmation hold computation stay bounded whatever clients create.
constexpr std::size_t max_slots = 1000;
/// Connections of one address still in their startup (before authentication ends), at most.
constexpr std::size_t max_starting_per_address = 16;
/// A connection that has not finished its startup in this long is closed (authentication_timeout).
constexpr auto startup_timeout = std::chrono::seconds(10);
/// A message of the authentication exchange, at most (PostgreSQL's PG_MAX_AUTH_TOKEN_LENGTH).
constexpr std::size_t max_auth_message = 65535;
/// The users file, at most (a file on disk is untrusted bytes too).
constexpr std::uintmax_t max_users_file = 16 << 20;
/// Failed authentications logged a second, at most (then one line counting the rest).
constexpr std::size_t auth_log_per_second = 10;
/// Status updates ('r') that move a slot on are written to the slots' file at most this often.
constexpr auto slot_save_delay = std::chrono::milliseconds(50);

/// The ParameterStatus values a client gets, as the upstream reported them to walgate's own
/// session — whose TimeZone (UTC), DateStyle (ISO) and IntervalStyle walgate sets: the values in
/// the log were printed in that session, and the client is told so.
constexpr const char* reported[] = {"server_version", "server_encoding", "client_encoding", "DateStyle",
                                    "integer_datetimes", "standard_conforming_strings", "TimeZone", "IntervalStyle",
                                    "in_hot_standby", "scram_iterations"};
// (is_superuser and session_authorization are the client's own: its user name, and "off" — not
// the role walgate connects upstream as, which a client has no business learning.)

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

/// A one-row result; columns text unless types gives (type oid, size) for each.
std::string text_result(const std::vector<std::string>& names, const std::vector<std::optional<std::string>>& row,
                        const std::string& tag, const std::vector<std::pair<std::uint32_t, std::int16_t>>& types = {}) {
  std::vector<protocol::field_description> fields;
  for (std::size_t i = 0; i < names.size(); ++i) {
    protocol::field_description f;
    f.name = names[i];
    f.type_oid = i < types.size() ? types[i].first : 25;
    f.type_size = i < types.size() ? types[i].second : -1;
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

/// A client's bytes fit for one log line: control and non-ASCII bytes as \xNN, at most 200
/// bytes kept (a forged line, or a megabyte, never reaches the log).
std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > 200) out += "…";
  return out;
}

/// The address a connection's failures are counted under.
std::string peer_of(const tcp::socket& socket) {
  boost::system::error_code ec;
  const auto ep = socket.remote_endpoint(ec);
  if (ec) return "?";
  std::array<unsigned char, 16> bytes{};
  const auto a = ep.address();
  if (a.is_v4()) {
    const auto b = a.to_v4().to_bytes();
    std::copy(b.begin(), b.end(), bytes.begin());
    return peer_key(false, bytes);
  }
  const auto b = a.to_v6().to_bytes();
  std::copy(b.begin(), b.end(), bytes.begin());
  return peer_key(true, bytes);
}

}  // namespace

bool parse_replication_users(std::string_view text, std::map<std::string, protocol::scram_verifier>& users,
                             std::string& error) {
  std::map<std::string, protocol::scram_verifier> out;
  std::size_t line_no = 0;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line[first] == '#') continue;
    line.remove_prefix(first);
    const auto gap = line.find_first_of(" \t");
    const auto at = gap == std::string_view::npos ? std::string_view::npos : line.find_first_not_of(" \t", gap);
    const auto where = "line " + std::to_string(line_no) + ": ";
    if (at == std::string_view::npos) {
      error = where + "expected NAME VERIFIER (walgate replication-user NAME prints such a line)";
      return false;
    }
    std::string name(line.substr(0, gap));
    std::string_view verifier = line.substr(at);
    while (!verifier.empty() && (verifier.back() == ' ' || verifier.back() == '\t')) verifier.remove_suffix(1);
    if (name.size() > ws::max_identifier) {
      error = where + "the user name is longer than 63 bytes";
      return false;
    }
    std::string why;
    auto v = protocol::parse_scram_verifier(verifier, &why);
    if (!v) {
      error = where + "user \"" + name + "\": " + why;
      return false;
    }
    if (!out.emplace(name, std::move(*v)).second) {
      error = where + "user \"" + name + "\" is given twice";
      return false;
    }
  }
  users = std::move(out);
  return true;
}

struct replication_server::impl : std::enable_shared_from_this<impl> {
  impl(asio::io_context& io, replication_server_options o, log_reader& l)
      : io(io), opts(std::move(o)), log(l), acceptor(io),
        slots(std::filesystem::path(opts.data_dir) / "replication-slots", opts.fsync),
        failures({opts.auth_failures_per_minute, std::chrono::seconds(60), 65536}) {
    mock_secret = protocol::scram_mock_secret("walgate: no users file");
  }

  /// The users file read into users; false with error (users unchanged).
  bool load_users(std::string& error) {
    std::error_code fec;
    const auto size = std::filesystem::file_size(opts.users_file, fec);
    if (fec) {
      error = "--replication-users " + opts.users_file + ": " + fec.message();
      return false;
    }
    if (size > max_users_file) {
      error = "--replication-users " + opts.users_file + ": larger than 16 MiB";
      return false;
    }
    std::ifstream f(opts.users_file, std::ios::binary);
    std::stringstream text;
    text << f.rdbuf();
    if (!f) {
      error = "--replication-users " + opts.users_file + ": cannot be read";
      return false;
    }
    std::map<std::string, protocol::scram_verifier> read;
    if (!parse_replication_users(text.str(), read, error)) {
      error = "--replication-users " + opts.users_file + ": " + error;
      return false;
    }
    // A user not in the file is told the iteration count most users have, and a salt from a
    // secret that stays while the file does (across restarts too, as a real user's salt).
    std::map<std::uint32_t, std::size_t> counts;
    for (const auto& [name, v] : read) ++counts[v.iterations];
    mock_iterations = 4096;
    std::size_t most = 0;
    for (const auto& [i, n] : counts)
      if (n > most) most = n, mock_iterations = i;
    mock_secret = protocol::scram_mock_secret("walgate mock salts\n" + text.str());
    users = std::move(read);
    return true;
  }

  /// One line for a failed authentication, at most auth_log_per_second a second.
  void say_failure(const std::string& line) {
    const auto now = std::chrono::steady_clock::now();
    if (now - log_second >= std::chrono::seconds(1)) {
      if (unlogged) say(std::to_string(unlogged) + " more failed replication authentication(s) not logged");
      log_second = now;
      logged = unlogged = 0;
    }
    if (logged++ < auth_log_per_second) say(line);
    else ++unlogged;
  }

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
  std::map<std::string, protocol::scram_verifier> users;   ///< (used when opts.users_file is given)
  /// --tls-cert/--tls-key's context and its certificate's tls-server-end-point hash (what
  /// SCRAM-SHA-256-PLUS binds to); a connection keeps the pair it began with across a reload.
  struct tls_state {
    std::shared_ptr<asio::ssl::context> context;
    std::string end_point;
  };
  std::shared_ptr<const tls_state> tls;
  bool load_tls(std::string& error) {
    auto ctx = make_server_tls(opts.tls_cert, opts.tls_key, error);
    if (!ctx) return false;
    auto state = std::make_shared<tls_state>();
    // (empty for a certificate whose signature has no single hash, Ed25519's: SCRAM-SHA-256-PLUS
    // is then not offered, as PostgreSQL does not)
    state->end_point = server_end_point(*ctx);
    state->context = std::move(ctx);
    tls = std::move(state);
    return true;
  }
  std::string mock_secret;     ///< a user not in the file: its mock salt is derived from this
  std::uint32_t mock_iterations = 4096;   ///< and the iteration count it is told
  failure_window failures;
  std::chrono::steady_clock::time_point log_second{};
  std::size_t logged = 0, unlogged = 0;
  std::uint64_t auth_failure_count = 0;   ///< every failed authentication (walgate_replication_auth_failures_total)

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
      // (The writer thread holds only a weak reference: the last one to the server is never
      // dropped there, where its destructor would join that very thread.)
      // (Posted to the loop, which a write finishing during the shutdown may find stopped: the
      // handler then never runs, and holds only a weak reference.)
      self->slots.save([weak = std::weak_ptr<impl>(self), ex = self->io.get_executor()](const std::string& e) {
        if (e.empty()) return;
        asio::post(ex, [weak, e] {
          if (auto j = weak.lock()) j->say("replication slots not stored: " + e);
        });
      });
    });
  }

  awaitable<void> accept_loop();
  void wake_streams();

  /// The log keeps what the slots have not confirmed: from the oldest position of a slot that
  /// is not invalidated (or dropped), nothing when there is none.
  void update_hold() {
    std::optional<lsn> oldest;
    for (const auto& [name, s] : slots.all())
      if (!s.hold_released) oldest = oldest ? std::min(*oldest, s.confirmed_flush) : s.confirmed_flush;
    if (oldest == held) return;
    held = oldest;
    if (opts.hold) opts.hold(oldest);
  }
  std::optional<lsn> held;
  asio::steady_timer limit_timer{io};

  /// Every second: a slot that holds more of the log than opts.slot_max_bytes is invalidated
  /// (written to the file, its hold let go, its stream ended), as PostgreSQL invalidates a slot
  /// past max_slot_wal_keep_size.
  void check_limits() {
    if (!opts.slot_max_bytes || stopped) return;
    bool changed = false;
    for (auto& [name, s] : slots.all()) {
      if (s.invalidated || s.dropping) continue;
      // (As PostgreSQL keeps the larger of wal_keep_size and the slot limit: a slot holding
      // what retention keeps anyway costs nothing and is left alone.)
      const auto held_bytes = log.bytes_held_from(s.confirmed_flush);
      if (held_bytes <= std::max<std::uint64_t>(opts.slot_max_bytes, opts.retention_bytes)) continue;
      s.invalidated = true;
      changed = true;
      say("replication slot " + name + " invalidated: it holds " + std::to_string(held_bytes >> 20) +
          " MiB of the event log, over --replication-slot-max-mb (" + std::to_string(opts.slot_max_bytes >> 20) + ")");
    }
    if (changed) {
      // The flag stored first, then the hold let go: a crash between the two finds the slot
      // invalidated with what it held still there, never valid with it gone.
      slots.save([weak = std::weak_ptr<impl>(shared_from_this()), ex = io.get_executor()](const std::string& e) {
        asio::post(ex, [weak, e] {
          auto self = weak.lock();
          if (!self) return;
          if (!e.empty()) {
            self->say("replication slots not stored (an invalidation; their hold stays until it is): " + e);
            self->schedule_save();
            return;
          }
          for (auto& [n, slot] : self->slots.all())
            if (slot.invalidated) slot.hold_released = true;
          self->update_hold();
        });
      });
      wake_streams();
    }
    limit_timer.expires_after(std::chrono::seconds(1));
    limit_timer.async_wait([weak = std::weak_ptr<impl>(shared_from_this())](boost::system::error_code ec) {
      if (auto self = weak.lock(); self && !ec) self->check_limits();
    });
  }
};

struct replication_server::impl::session : std::enable_shared_from_this<session> {
  session(std::shared_ptr<impl> s, tcp::socket sock, int pid)
      : srv(std::move(s)), socket(std::move(sock)), wake(socket.get_executor()), pid(pid), peer(peer_of(socket)) {}

  std::shared_ptr<impl> srv;
  tcp::socket socket;
  /// The connection's TLS once its SSLRequest was answered 'S' (null: in the clear), with the
  /// certificate's binding data it began with.
  std::shared_ptr<const impl::tls_state> tls_with;
  std::unique_ptr<asio::ssl::stream<tcp::socket&>> tls;
  asio::steady_timer wake;   ///< the writer's wait while streaming: cancelled to wake it
  int pid;
  std::string peer;          ///< the client's address as failures are counted (peer_key)
  std::string in;            ///< bytes read and not yet consumed
  std::vector<std::string> temporary_slots;   ///< made by this connection: dropped with it
  std::string streaming_slot;   ///< the slot this connection streams from ("" when not streaming)
  upstream_identity id;
  bool closed = false;

  // Streaming state.
  bool copy_done = false;
  std::chrono::steady_clock::time_point last_received;
  lsn sent;                  ///< the last 'w' or 'k' position sent: what a client may confirm, at most
  bool caught_up = false;    ///< the writer sent everything the log held when it last looked
  std::uint64_t stream_seq = 0;   ///< the next event the writer reads
  /// Everything visible in the log is sent, as of now (caught_up alone is as of the writer's
  /// last look: a transaction may have become visible, and durable, since). Only then may a
  /// keepalive say, and a client confirm, walgate's durable position.
  bool all_sent() const { return caught_up && stream_seq >= srv->log.visible_seq(); }
  std::string pending_fatal;   ///< what the reader found wrong, sent by the writer as it stops
  bool streaming = false;
  asio::steady_timer watchdog{socket.get_executor()};

  awaitable<bool> fill() {
    char buf[16384];
    boost::system::error_code ec;
    std::size_t n = 0;
    if (tls) n = co_await tls->async_read_some(asio::buffer(buf), asio::redirect_error(asio::use_awaitable, ec));
    else n = co_await socket.async_read_some(asio::buffer(buf), asio::redirect_error(asio::use_awaitable, ec));
    if (ec || n == 0) {
      closed = true;
      co_return false;
    }
    in.append(buf, n);
    co_return true;
  }
  awaitable<bool> send(std::string bytes) {
    boost::system::error_code ec;
    // (With TLS, a read — the client's status updates — may be under way at the same time: an
    // SSL stream takes one read and one write at once.)
    if (tls) co_await asio::async_write(*tls, asio::buffer(bytes), asio::redirect_error(asio::use_awaitable, ec));
    else co_await asio::async_write(socket, asio::buffer(bytes), asio::redirect_error(asio::use_awaitable, ec));
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

  /// A result made off the loop (a forwarded statement, a catalog lookup) that this connection's
  /// coroutine waits for: set() — on the loop — keeps it and wakes the waiter. Shared with the
  /// callback, so a result that comes after the connection ended lands nowhere harmful.
  template <class T>
  struct off_loop {
    explicit off_loop(asio::any_io_executor ex) : timer(ex, asio::steady_timer::time_point::max()) {}
    asio::steady_timer timer;
    std::optional<T> value;
    void set(T v) {
      value = std::move(v);
      timer.cancel();
    }
  };
  /// Until the result is there; false when the connection ended meanwhile.
  template <class T>
  awaitable<bool> wait_for(std::shared_ptr<off_loop<T>> state) {
    while (!state->value && !closed) {
      boost::system::error_code ec;
      co_await state->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    co_return !closed;
  }

  bool started = false;   ///< the startup is over (the startup timer closes the connection until then)
  asio::steady_timer startup_timer{socket.get_executor()};

  awaitable<void> run() {
    {
      // (A weak reference, and cancelled at the end: a session that ended is not kept, nor
      // counted against the connection caps, until the timer fires.)
      startup_timer.expires_after(startup_timeout);
      startup_timer.async_wait([weak = std::weak_ptr<session>(shared_from_this())](boost::system::error_code ec) {
        auto self = weak.lock();
        if (ec || !self || self->started || self->closed) return;
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
    startup_timer.cancel();
    for (const auto& name : temporary_slots)
      if (auto* s = srv->slots.find(name); s && s->temporary && s->active_pid == pid) srv->slots.all().erase(name);
    srv->update_hold();
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
      if ((what == ws::startup_packet::kind::ssl_request || what == ws::startup_packet::kind::gssenc_request) && tls) {
        // (a second negotiation inside TLS: PostgreSQL's own refusal)
        std::string message = "unsupported frontend protocol ";
        message += what == ws::startup_packet::kind::ssl_request ? "1234.5679" : "1234.5680";
        message += ": server supports 3.0 to 3.0";
        co_await fatal("0A000", std::move(message));
        co_return false;
      }
      if (what == ws::startup_packet::kind::ssl_request || what == ws::startup_packet::kind::gssenc_request) {
        in.erase(0, r.packet.size);
        if (!in.empty()) {   // bytes after an SSLRequest before the answer: PostgreSQL refuses them too
          std::string message = what == ws::startup_packet::kind::ssl_request
                                    ? "received unencrypted data after SSL request"
                                    : "received unencrypted data after GSSAPI encryption request";
          co_await fatal("08P01", std::move(message));
          co_return false;
        }
        // TLS with --tls-cert/--tls-key: 'S' and the handshake (under the startup's time limit);
        // GSSAPI encryption, or no certificate: 'N', and the client goes on in the clear or gives up.
        tls_with = what == ws::startup_packet::kind::ssl_request ? srv->tls : nullptr;
        if (!tls_with) {
          if (!co_await send("N")) co_return false;
          continue;
        }
        if (!co_await send("S")) co_return false;
        tls = std::make_unique<asio::ssl::stream<tcp::socket&>>(socket, *tls_with->context);
        boost::system::error_code ec;
        co_await tls->async_handshake(asio::ssl::stream_base::server, asio::redirect_error(asio::use_awaitable, ec));
        if (ec) {
          srv->say("replication connection " + std::to_string(pid) + " from " + peer + ": TLS handshake failed: " + ec.message());
          closed = true;
          co_return false;
        }
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
    if (!srv->opts.users_file.empty()) {
      if (auto wait = srv->failures.wait(peer, std::chrono::steady_clock::now())) {
        co_await fatal("28000",
                       "too many failed authentications from " + peer + ": try again in " + std::to_string(*wait) + " s",
                       "the limit is --auth-failures-per-minute (" + std::to_string(srv->opts.auth_failures_per_minute) +
                           ")");
        co_return false;
      }
      if (!co_await sasl(user)) co_return false;
    }
    // (Authenticated, or trusted: only now is the upstream named, as PostgreSQL checks the
    // database after authentication.)
    id = *known;
    const std::string db = param("database").empty() ? user : param("database");
    if (db != id.dbname) {
      if (!co_await send(ws::build_authentication_ok())) co_return false;
      co_await fatal("3D000", "database \"" + db + "\" does not exist",
                     "walgate serves the database it streams from: \"" + id.dbname + "\"");
      co_return false;
    }
    std::string out = ws::build_authentication_ok();
    for (const char* name : reported)
      if (auto it = id.parameters.find(name); it != id.parameters.end()) out += ws::build_parameter_status(name, it->second);
    out += ws::build_parameter_status("application_name", param("application_name"));
    out += ws::build_parameter_status("is_superuser", "off");
    out += ws::build_parameter_status("session_authorization", user);
    out += ws::build_backend_key_data(pid, static_cast<std::int32_t>(srv->random()));
    out += ws::build_ready_for_query('I');
    co_return co_await send(std::move(out));
  }

  /// The next message of the authentication exchange; nullopt when the connection ended (or a
  /// FATAL was sent for a bad one).
  awaitable<std::optional<std::pair<char, std::string>>> auth_message() {
    for (;;) {
      auto r = ws::split_frontend_message(protocol::as_bytes(std::string_view(in)), max_auth_message);
      if (r.status == protocol::split_status::need_more) {
        if (!co_await fill()) co_return std::nullopt;
        continue;
      }
      if (r.status == protocol::split_status::error) {
        co_await fatal("08P01", "invalid message from the client: " + r.error.message());
        co_return std::nullopt;
      }
      std::pair<char, std::string> m{static_cast<char>(r.message.tag), std::string(protocol::as_string_view(r.message.body))};
      in.erase(0, r.message.size);
      co_return m;
    }
  }

  /// SCRAM-SHA-256 (PostgreSQL's exchange: AuthenticationSASL, SASLInitialResponse,
  /// AuthenticationSASLContinue, SASLResponse, AuthenticationSASLFinal). True when the client
  /// proved it knows the password of user; otherwise a FATAL was sent and the failure counted.
  awaitable<bool> sasl(std::string user) {
    std::optional<protocol::scram_verifier> verifier;
    if (auto it = srv->users.find(user); it != srv->users.end()) verifier = it->second;
    protocol::scram_server scram(std::move(verifier), user, srv->mock_secret, tls ? tls_with->end_point : std::string(), {},
                                 srv->mock_iterations);
    if (!co_await send(ws::build_authentication_sasl(scram.mechanisms()))) co_return false;
    auto first = co_await auth_message();
    if (!first) co_return false;
    if (first->first != 'p') {
      co_await fatal("08P01", "expected SASL response, got message type " +
                                  std::to_string(static_cast<unsigned char>(first->first)));
      co_return false;
    }
    auto initial = ws::parse_sasl_initial_response(protocol::as_bytes(std::string_view(first->second)));
    if (!initial || !initial->data) {
      std::string why = "malformed SASLInitialResponse: ";
      why += initial ? std::string("no data") : initial.error().message();
      co_await failed(user, std::move(why), false);
      co_return false;
    }
    auto server_first = scram.server_first(initial->mechanism, protocol::as_string_view(*initial->data));
    if (!server_first) {
      co_await failed(user, scram.failure(), false);
      co_return false;
    }
    if (!co_await send(ws::build_authentication_sasl_continue(*server_first))) co_return false;
    auto response = co_await auth_message();
    if (!response) co_return false;
    if (response->first != 'p') {
      co_await fatal("08P01", "expected SASL response, got message type " +
                                  std::to_string(static_cast<unsigned char>(response->first)));
      co_return false;
    }
    auto server_final = scram.server_final(response->second);
    if (!server_final) {
      co_await failed(user, scram.failure(), scram.proof_failed());
      co_return false;
    }
    co_return co_await send(ws::build_authentication_sasl_final(*server_final));
  }

  /// A failed exchange: counted against the address, logged, and the client told — a proof
  /// that did not hold as PostgreSQL says it (28P01, whether the user exists or not), a
  /// malformed exchange as what was wrong (08P01).
  awaitable<void> failed(std::string user, std::string why, bool proof) {
    srv->failures.count(peer, std::chrono::steady_clock::now());
    ++srv->auth_failure_count;
    srv->say_failure("replication client from " + peer + ": authentication of user \"" + printable(user) +
                     "\" failed: " + printable(why));
    if (proof) co_await fatal("28P01", "password authentication failed for user \"" + user + "\"");
    else co_await fatal("08P01", why);
    co_return;
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
      // After an extended-protocol message was refused, everything up to Sync is skipped, as
      // PostgreSQL's ignore_till_sync does (a Query included); Terminate still ends the session.
      if (extended_error && tag != 'S' && tag != 'X') continue;
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
        case 'F': {
          // (Not an extended-protocol message: refused, and ready again at once.)
          const std::string refused =
              error_message("ERROR", "08P01", "fastpath function calls not supported in a replication connection") +
              ws::build_ready_for_query('I');
          if (!co_await send(refused)) co_return;
          break;
        }
        case 'H': break;   // (Flush: nothing waits)
        case 'P': case 'B': case 'E': case 'D': case 'C': {
          extended_error = true;
          const std::string refused =
              error_message("ERROR", "08P01", "extended query protocol not supported in a replication connection");
          if (!co_await send(refused)) co_return;
          break;
        }
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
    if (!parsed.notices.empty()) {
      std::string notices;
      for (const auto& n : parsed.notices) {
        protocol::server_notice notice;
        notice.severity = "NOTICE";
        notice.sqlstate = "42622";
        notice.message = n;
        notices += ws::build_error_response(notice, false);
      }
      if (!co_await send(std::move(notices))) co_return;
    }
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
      // (timeline an int8 from PostgreSQL 16, an int4 before, as the walsender types it)
      const auto v = id.parameters.find("server_version");
      const bool int8 = v == id.parameters.end() || std::atoi(v->second.c_str()) >= 16;
      std::vector<std::pair<std::uint32_t, std::int16_t>> types{{25, -1}, {int8 ? 20u : 23u, int8 ? 8 : 4}, {25, -1}, {25, -1}};
      std::string bytes = text_result({"systemid", "timeline", "xlogpos", "dbname"},
                                  {id.system_id, std::to_string(id.timeline), pos.to_string(), id.dbname}, "IDENTIFY_SYSTEM",
                                  types) +
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
      // (the column named by the parameter's canonical spelling, as PostgreSQL's SHOW does)
      std::string column = name;
      if (name == "datestyle") column = "DateStyle";
      else if (name == "timezone") column = "TimeZone";
      else if (name == "intervalstyle") column = "IntervalStyle";
      std::string bytes = text_result({column}, {*value}, "SHOW") + ws::build_ready_for_query('I');
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
    if (!srv->opts.run_sql) {
      co_await error("0A000", "walgate's walsender does not run SQL",
                     "it answers replication commands; with --replication-sql forward a statement runs on the upstream, read-only");
      co_return;
    }
    // --replication-sql forward: on the forwarder's threads; this connection waits for the
    // result (the loop does not).
    auto state = std::make_shared<off_loop<std::string>>(socket.get_executor());
    srv->opts.run_sql(text, [state](std::string bytes) { state->set(std::move(bytes)); });
    if (!co_await wait_for(state)) co_return;
    std::string bytes = std::move(*state->value) + ws::build_ready_for_query('I');
    co_await send(std::move(bytes));
    co_return;
  }

  awaitable<void> create_slot(const ws::replication_command& c) {
    // The options first, as PostgreSQL's parseCreateReplSlotOptions: each at most once, snapshot
    // and two_phase (and failover) for a logical slot, reserve_wal for a physical one, Boolean
    // values as defGetBoolean takes them.
    std::string snapshot = "export";   // (the server's default for a logical slot)
    bool snapshot_given = false, reserve_wal_given = false, two_phase_given = false, failover_given = false;
    bool two_phase = false, failover = false;
    for (const auto& o : c.options) {
      auto boolean = [&](bool& out) {
        if (!o.value) return out = true, true;
        const std::string v = lower(*o.value);
        if (v == "true" || v == "on" || v == "1") return out = true, true;
        if (v == "false" || v == "off" || v == "0") return out = false, true;
        return false;
      };
      bool conflicting = false, bad_boolean = false, ignored = false;
      if (o.name == "snapshot") {
        conflicting = snapshot_given || !c.logical;
        snapshot_given = true;
        snapshot = o.value.value_or("");
        if (!conflicting && snapshot != "export" && snapshot != "nothing" && snapshot != "use") {
          const std::string message =
              "unrecognized value for CREATE_REPLICATION_SLOT option \"snapshot\": \"" + snapshot + "\"";
          co_await error("22023", message);
          co_return;
        }
      } else if (o.name == "reserve_wal") {
        conflicting = reserve_wal_given || c.logical;
        reserve_wal_given = true;
        bad_boolean = !conflicting && !boolean(ignored);
      } else if (o.name == "two_phase") {
        conflicting = two_phase_given || !c.logical;
        two_phase_given = true;
        bad_boolean = !conflicting && !boolean(two_phase);
      } else if (o.name == "failover") {
        conflicting = failover_given || !c.logical;
        failover_given = true;
        bad_boolean = !conflicting && !boolean(failover);
      } else {
        co_await error("XX000", "unrecognized option: " + o.name);
        co_return;
      }
      if (conflicting) {
        co_await error("42601", "conflicting or redundant options");
        co_return;
      }
      if (bad_boolean) {
        co_await error("42601", o.name + " requires a Boolean value");
        co_return;
      }
    }
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
    if (srv->slots.all().size() >= max_slots) {   // (temporary ones counted, as PostgreSQL does)
      co_await error("53400", "all replication slots are in use", {},
                     "Free one or increase max_replication_slots. walgate keeps at most " + std::to_string(max_slots) +
                         " downstream slots.");
      co_return;
    }
    if (!transform::is_emulated_plugin(c.plugin)) {
      co_await error("0A000", "output plugin \"" + c.plugin + "\" is not served by walgate yet",
                     {}, "walgate emulates test_decoding, wal2json and pgoutput");
      co_return;
    }
    downstream_slot s;
    s.name = c.name;
    s.plugin = c.plugin;
    s.temporary = c.temporary;
    s.two_phase = two_phase;
    s.failover = failover;
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
    srv->update_hold();
    if (s.temporary) {
      temporary_slots.push_back(s.name);
    } else {
      const auto e = co_await srv->persist();
      auto* made = srv->slots.find(s.name);
      if (!e.empty()) {
        if (made && made->active_pid == pid) srv->slots.all().erase(s.name);
        srv->update_hold();
        // (A failed write may still have replaced the file — its directory's fsync failing
        // after the rename: the next write makes the file the table again.)
        srv->schedule_save();
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
        srv->schedule_save();   // (as for a failed creation: the file is made the table again)
        srv->update_hold();
        co_await error("58030", "could not store the replication slots: " + e);
        co_return;
      }
    }
    srv->slots.all().erase(c.name);
    srv->update_hold();
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
    transform::plugin_options options;
    for (const auto& o : c.options) options.emplace_back(o.name, o.value);
    const int major = [&] {
      auto v = id.parameters.find("server_version");
      return v == id.parameters.end() ? 18 : std::atoi(v->second.c_str());
    }();
    // (The plugin writes each 'w' into `out`, the batch the stream sends next.)
    transform::plugin_context context;
    context.server_major = major;
    context.publications = srv->opts.publications;
    auto made = transform::make_output_plugin(s->plugin, options, context, [this](lsn at, std::string_view text) { write_xlog(at, text); });
    if (!made.plugin) {
      co_await error(made.sqlstate, made.error);
      co_return;
    }
    if (made.plugin->needs_catalog() && !srv->opts.published_tables) {
      co_await error("0A000", "walgate cannot read its upstream's catalog here: the tables named and include-not-null need it");
      co_return;
    }
    if (made.plugin->needs_catalog()) {
      const auto named = made.plugin->named_tables();
      // Each table the client names must be one walgate's publications publish (looked up on the
      // upstream, off the loop): a stream that could never hold it is an error, not an empty stream.
      using found = std::pair<std::optional<replication_server_options::table_list>, std::string>;
      auto state = std::make_shared<off_loop<found>>(socket.get_executor());
      srv->opts.published_tables([state](std::optional<replication_server_options::table_list> t, std::string why) {
        state->set(found(std::move(t), std::move(why)));
      });
      if (!co_await wait_for(state)) co_return;
      const auto& tables = state->value->first;
      if (!tables) {
        co_await error("58000", "cannot check the tables named against walgate's publication: " + state->value->second);
        co_return;
      }
      for (const auto& p : named) {
        bool found = false;
        for (const auto& t : *tables)
          found = found || ((p.all_schemas || p.schema == t.schema) && (p.all_tables || p.table == t.table));
        if (!found) {
          // (the text made before the co_await: GCC 12 mishandles a conditional's temporaries in one)
          std::string pubs;
          for (const auto& n : srv->opts.publications) pubs += (pubs.empty() ? "\"" : ", \"") + n + "\"";
          std::string message = "table \"";
          message += p.all_schemas ? std::string("*") : p.schema;
          message += ".";
          message += p.all_tables ? std::string("*") : p.table;
          message += "\" named by the client is not in walgate's publication " + pubs;
          std::string hint = "walgate's log holds the changes of its publication's tables alone";
          co_await error("42P01", std::move(message), std::string(), std::move(hint));
          co_return;
        }
      }
      made.plugin->set_catalog(*tables);
      // (The slot again after the wait: another connection may have dropped it or begun
      // streaming from it meanwhile — the pointer from before is not used.)
      s = srv->slots.find(c.name);
      if (const std::string refused = unavailable(c.name, s); !refused.empty()) {
        co_await send(refused);
        co_return;
      }
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
    bool lost = s->invalidated;
    if (lost) {
    } else if (from.value == 0) {
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
      // (each version's own text: 18 "can no longer access", 16 and 17 "can no longer get
      // changes from", 13 to 15 "cannot read from logical replication slot")
      std::string message = major >= 18   ? "can no longer access replication slot \""
                            : major >= 16 ? "can no longer get changes from replication slot \""
                                          : "cannot read from logical replication slot \"";
      message += c.name + "\"";
      // (PostgreSQL's detail for a slot invalidated past max_slot_wal_keep_size, and ours for
      // what retention let go before the slot held it — a slot made before walgate restarted
      // without the slots' file, or the limit of --replication-slot-max-mb)
      std::string detail;
      if (s->invalidated)
        detail = major >= 18 ? "This replication slot has been invalidated due to \"wal_removed\"."
                             : "This slot has been invalidated because it exceeded the maximum reserved size.";
      else
        detail = "walgate's event log no longer holds " + from.to_string() + ": its retention let it go";
      co_await error("55000", message, detail,
                     "drop the slot and make it again (its client then needs a new start); raise "
                     "--replication-slot-max-mb to let slots hold more");
      co_return;
    }
    s->active_pid = pid;
    streaming_slot = c.name;
    srv->say("replication slot " + c.name + " streaming to connection " + std::to_string(pid) + " from " + from.to_string());
    if (!co_await send(ws::build_copy_both_response())) co_return;
    co_await stream(c.name, std::move(made.plugin), from, seq);
    if (auto* still = srv->slots.find(c.name); still && still->active_pid == pid && !still->temporary) still->active_pid = 0;
    streaming_slot.clear();
    if (!closed && copy_done) {
      // CopyDone from the client: ours, then the COPY's end and the command's (as the walsender:
      // "COPY 0", then "START_REPLICATION"), and the connection goes on.
      co_await send(protocol::build_copy_done() + ws::build_command_complete("COPY 0") +
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
        if (all_sent() && srv->opts.durable_lsn) cap = std::max(cap, srv->opts.durable_lsn());
        const lsn flushed = std::min(u->flushed, cap);
        if (auto* s = srv->slots.find(slot_name); s && s->active_pid == pid && flushed > s->confirmed_flush) {
          s->confirmed_flush = flushed;
          if (!s->temporary) srv->schedule_save();
          srv->update_hold();
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

  /// The transaction the stream is in, and a Truncate of several tables being joined (the log
  /// keeps one event per table, with the same change LSN; the plugins print one).
  struct open_transaction {
    bool open = false;
    transform::plugin_transaction info;
    std::vector<pg::cached_relation> truncated;   ///< (copies: the view is reused)
    std::uint8_t truncate_options = 0;
    lsn truncate_lsn;
  };

  /// What the stream sends next (the plugin's 'w' messages of the batch being read).
  std::string stream_out;

  void write_xlog(lsn at, std::string_view text) {
    protocol::xlog_data x;
    x.wal_start = at;
    x.wal_end = at;
    x.server_clock_us = protocol::pg_now_us();
    x.data = protocol::as_bytes(text);
    protocol::append_copy_xlog_data(stream_out, x);
    sent = std::max(sent, at);
  }

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

  /// A batch of the log from seq; or, when it is being read in the background (never on this
  /// loop), a wait until the notification wakes this stream (or a keepalive's interval passes),
  /// and nothing (waited set: read again).
  awaitable<std::vector<event_ptr>> read_or_wait(std::uint64_t seq, std::string& error, bool& waited) {
    bool fetching = false;
    auto events = srv->log.read(seq, batch_events, batch_bytes, &error, &fetching);
    waited = events.empty() && fetching;
    if (waited) {
      wake.expires_after(caught_up_keepalive);
      boost::system::error_code ec;
      co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    co_return events;
  }

  /// Where the transaction whose events start at seq ends (its last event says so), read ahead
  /// in the log (in the background when not in memory); nullopt when the log does not tell.
  awaitable<std::optional<lsn>> find_transaction_end(std::uint64_t seq, lsn commit) {
    auto self = shared_from_this();
    while (!closed) {
      std::string error;
      bool waited = false;
      auto events = co_await read_or_wait(seq, error, waited);
      if (waited) continue;
      if (events.empty()) co_return std::nullopt;
      for (const auto& e : events) {
        if (e->id.commit_lsn != commit) co_return std::nullopt;
        if (e->txn_end.valid()) co_return e->txn_end;
        seq = e->seq + 1;
      }
    }
    co_return std::nullopt;
  }

  awaitable<void> stream(std::string slot_name, std::unique_ptr<transform::output_plugin> plugin, lsn from, std::uint64_t seq) {
    auto self = shared_from_this();
    copy_done = false;
    last_received = std::chrono::steady_clock::now();
    asio::co_spawn(socket.get_executor(), read_client(slot_name), asio::detached);
    transform::record_view view;
    open_transaction t;
    sent = lsn{};
    lsn sent_before;   ///< sent as of the last batch written (what a dropped batch goes back to)
    caught_up = false;
    lsn keepalive_sent;
    auto last_keepalive = std::chrono::steady_clock::now();
    bool ping_outstanding = false;
    std::string& out = stream_out;
    out.clear();
    const auto timeout = srv->opts.timeout;

    auto flush_truncate = [&] {
      if (t.truncated.empty()) return;
      std::vector<const pg::cached_relation*> rels;
      for (const auto& r : t.truncated) rels.push_back(&r);
      plugin->truncate(t.info, rels, t.truncate_options, t.truncate_lsn);
      t.truncated.clear();
    };
    // (A transaction whose end the log does not tell is an error, never a commit at 0/0: a
    // subscriber would resume from it and apply the transaction twice.)
    std::optional<lsn> end_unknown;
    auto close_transaction = [&] {
      if (!t.open) return;
      if (!t.info.end_lsn.valid()) {
        end_unknown = t.info.commit_lsn;
        t = open_transaction{};
        return;
      }
      flush_truncate();
      plugin->commit(t.info);
      t = open_transaction{};
    };

    // The watchdog: a client silent past the timeout is disconnected even while a write to it
    // waits (a client that stopped reading): closing the socket ends the write.
    streaming = true;
    asio::co_spawn(socket.get_executor(), watch(slot_name), asio::detached);
    auto timed_out = [&] { return std::chrono::steady_clock::now() - last_received > timeout; };

    while (!closed && !copy_done) {
      const auto now = std::chrono::steady_clock::now();
      if (auto* mine = srv->slots.find(slot_name); mine && mine->invalidated) {
        // (PostgreSQL terminates the walsender that holds a slot it invalidates)
        co_await send(error_message("FATAL", "55000",
                                    "replication slot \"" + slot_name +
                                        "\" was invalidated: it held more of walgate's event log than "
                                        "--replication-slot-max-mb"));
        closed = true;
        break;
      }
      if (timed_out()) {
        disconnect_silent(slot_name);
        break;
      }
      // A keepalive: asking for a reply once the client was quiet for half the timeout (while
      // events are sent too, as the walsender does), or, caught up, telling where walgate is when
      // that moved (nothing below it is missing: the client may confirm it).
      if (now - last_received < timeout / 2) ping_outstanding = false;
      const bool ask = !ping_outstanding && now - last_received >= timeout / 2;
      stream_seq = seq;
      const bool everything_sent = all_sent();
      lsn position = sent.valid() ? sent : from;   // (before anything is sent: where the stream starts, as the walsender)
      if (everything_sent && srv->opts.durable_lsn) position = std::max(position, srv->opts.durable_lsn());
      if (ask || (everything_sent && position > keepalive_sent && now - last_keepalive >= caught_up_keepalive)) {
        protocol::primary_keepalive k;
        k.wal_end = position;
        k.server_clock_us = protocol::pg_now_us();
        k.reply_requested = ask;
        if (!co_await send(protocol::build_copy_data(protocol::build_primary_keepalive(k)))) break;
        keepalive_sent = position;
        last_keepalive = now;
        if (ask) ping_outstanding = true;
        continue;
      }
      if (seq < srv->log.visible_seq()) {
        caught_up = false;
        std::string error;
        bool waited = false;
        auto events = co_await read_or_wait(seq, error, waited);
        if (waited) continue;
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
            plugin->message(c);
            continue;
          }
          if (t.open && t.info.commit_lsn != e->id.commit_lsn) close_transaction();
          if (!t.open) {
            t.open = true;
            t.info.xid = c.txn->xid;
            t.info.commit_lsn = e->id.commit_lsn;
            t.info.end_lsn = e->txn_end.valid() ? e->txn_end : c.txn->end_lsn;   // (a streamed one's record has it)
            t.info.commit_time = c.txn->commit_time;
            t.info.has_origin = c.txn->origin.has_value();
            t.info.origin = c.txn->origin.value_or(std::string());
            t.info.origin_lsn = c.txn->origin_lsn;
            if (!t.info.end_lsn.valid() && plugin->needs_end_at_begin()) {
              // (read ahead to the transaction's last event, which knows it; `view` is untouched)
              auto end = co_await find_transaction_end(e->seq, e->id.commit_lsn);
              if (closed) break;
              if (end) t.info.end_lsn = *end;
              else end_unknown = e->id.commit_lsn;
            }
            if (end_unknown) break;
            plugin->begin(t.info, c.change_lsn);
          }
          if (e->txn_end.valid()) t.info.end_lsn = e->txn_end;
          if (!t.truncated.empty() && (c.kind != transform::op::truncate || c.change_lsn != t.truncate_lsn)) flush_truncate();
          if (c.kind == transform::op::truncate) {
            if (c.relation) {
              t.truncated.push_back(*c.relation);
              t.truncate_lsn = c.change_lsn;
              t.truncate_options = c.truncate_options;
            }
            continue;
          }
          plugin->change(t.info, c);
        }
        if (closed) break;
        const bool at_end = seq >= srv->log.visible_seq();
        if (at_end) close_transaction();   // (visibility is whole transactions)
        if (end_unknown) {
          out.clear();
          co_await send(error_message("ERROR", "XX000",
                                      "walgate's event log does not say where the transaction committed at " +
                                          end_unknown->to_string() + " ends"));
          closed = true;
          break;
        }
        if (!plugin->failed().empty()) {
          // (the real plugin's ERROR ends the stream: what it sent before it goes first)
          std::string failed = std::move(out) + error_message("ERROR", plugin->failed_sqlstate(), plugin->failed(), plugin->failed_detail());
          out.clear();
          co_await send(std::move(failed));
          closed = true;
          break;
        }
        if (copy_done) {
          // (The client's CopyDone came while this batch was read: nothing more is sent, as the
          // walsender stops sending once it has it.)
          out.clear();
          sent = sent_before;
          break;
        }
        if (!out.empty()) {
          // (One batch at a time, written before the next is read: what a client that reads
          // slowly holds in walgate's memory is one batch, about batch_bytes of records.)
          if (!co_await send(std::move(out))) break;
          out.clear();
        }
        sent_before = sent;
        stream_seq = seq;
        caught_up = at_end;   // (all_sent() checks it against the log as it is when asked)
        continue;
      }
      stream_seq = seq;
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
    // One address's connections that have not finished their startup (not authenticated yet):
    // at most max_starting_per_address, so that no one host keeps everyone else out, nor runs
    // many password guesses at once past the failure limit.
    {
      const std::string peer = peer_of(socket);
      std::size_t starting = 0;
      for (const auto& w : sessions)
        if (auto other = w.lock(); other && !other->started && other->peer == peer) ++starting;
      if (starting >= max_starting_per_address) {
        const std::string refused = error_message("FATAL", "53300",
                                                  "too many connections from " + peer + " in their startup at once (" +
                                                      std::to_string(max_starting_per_address) + ")");
        socket.write_some(asio::buffer(refused), ec);
        socket.close(ec);
        continue;
      }
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
  if (!impl_->opts.users_file.empty() && !impl_->load_users(error)) return false;
  if (!impl_->opts.tls_cert.empty() && !impl_->load_tls(error)) return false;
  if (!impl_->slots.load(error)) return false;
  impl_->update_hold();   // (before the log appends anything: nothing a slot needs is let go)
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
  impl_->check_limits();
  return true;
}

bool replication_server::reload_users(std::string& error) {
  if (impl_->opts.users_file.empty()) {
    error = "no --replication-users file";
    return false;
  }
  return impl_->load_users(error);
}

std::size_t replication_server::users() const { return impl_->users.size(); }

bool replication_server::reload_tls(std::string& error) {
  if (impl_->opts.tls_cert.empty()) {
    error = "no TLS is configured";
    return false;
  }
  return impl_->load_tls(error);
}

std::vector<replication_server::slot_figures> replication_server::slots() const {
  std::vector<slot_figures> out;
  for (const auto& [name, s] : impl_->slots.all()) {
    if (s.dropping) continue;
    slot_figures f;
    f.name = name;
    f.plugin = s.plugin;
    f.two_phase = s.two_phase;
    f.failover = s.failover;
    f.confirmed = s.confirmed_flush;
    f.held_bytes = s.invalidated ? 0 : impl_->log.bytes_held_from(s.confirmed_flush);
    f.active = s.active_pid != 0;   // (a temporary slot is held by its connection for good)
    f.temporary = s.temporary;
    f.invalidated = s.invalidated;
    out.push_back(std::move(f));
  }
  return out;
}

std::size_t replication_server::connections() const {
  std::size_t n = 0;
  for (const auto& w : impl_->sessions) n += w.expired() ? 0 : 1;
  return n;
}

std::uint64_t replication_server::auth_failures() const { return impl_->auth_failure_count; }

std::string replication_server::slots_json() const {
  // (Names are [a-z0-9_] and plugins a known name: nothing to escape.)
  auto b = [](bool v) { return v ? "true" : "false"; };
  std::string out = "{\"slots\":[";
  bool first = true;
  for (const auto& f : slots()) {
    if (!first) out += ",";
    first = false;
    out += "{\"slot\":\"" + f.name + "\",\"plugin\":\"" + f.plugin + "\",\"confirmed_flush_lsn\":\"" +
           f.confirmed.to_string() + "\",\"held_bytes\":" + std::to_string(f.held_bytes) + ",\"active\":" + b(f.active) +
           ",\"temporary\":" + b(f.temporary) + ",\"two_phase\":" + b(f.two_phase) + ",\"failover\":" + b(f.failover) +
           ",\"invalidated\":" + b(f.invalidated) + "}";
  }
  return out + "]}";
}

bool describe_slots_file(const std::string& data_dir, std::string& out, std::string& error) {
  const auto file = std::filesystem::path(data_dir) / "replication-slots";
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    out = "# no downstream slots in " + data_dir + " (no replication-slots file)\n";
    return true;
  }
  const auto size = std::filesystem::file_size(file, ec);
  if (ec || size > max_users_file) {
    error = file.string() + ": " + (ec ? ec.message() : std::string("larger than 16 MiB"));
    return false;
  }
  std::ifstream f(file, std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  std::map<std::string, downstream_slot> slots;
  if (!f || !downstream_slots::parse(text.str(), slots, error)) {
    error = file.string() + ": " + (error.empty() ? std::string("cannot be read") : error);
    return false;
  }
  auto b = [](bool v) { return v ? "true" : "false"; };
  out = "# walgate slots: the downstream slots of " + data_dir + "\n";
  for (const auto& [name, s] : slots)
    out += "\n[[slot]]\nname = \"" + name + "\"\nplugin = \"" + s.plugin + "\"\nconfirmed_flush_lsn = \"" +
           s.confirmed_flush.to_string() + "\"\ntwo_phase = " + b(s.two_phase) + "\nfailover = " + b(s.failover) +
           "\ninvalidated = " + b(s.invalidated) + "\n";
  return true;
}

void register_replication_metrics(metrics_registry& r, std::function<const replication_server*()> get) {
  // (A slot's name is [a-z0-9_]: a label value that needs no escaping.)
  auto per_slot = [&r, get](const char* name, const char* help, std::function<std::string(const replication_server::slot_figures&)> value) {
    r.add(name, "gauge", help, [get, value](std::vector<metrics_registry::sample>& out) {
      const auto* w = get();
      if (!w) return;
      for (const auto& f : w->slots()) out.push_back({"{slot=\"" + f.name + "\"}", value(f)});
    });
  };
  per_slot("walgate_replication_slot_confirmed_lsn", "A downstream slot's confirmed position, as a number.",
           [](const auto& f) { return std::to_string(f.confirmed.value); });
  per_slot("walgate_replication_slot_held_bytes",
           "Bytes of the event log a downstream slot keeps from retention (what it has not confirmed).",
           [](const auto& f) { return std::to_string(f.held_bytes); });
  per_slot("walgate_replication_slot_active", "1 while a connection streams from (or holds) a downstream slot.",
           [](const auto& f) { return std::string(f.active ? "1" : "0"); });
  per_slot("walgate_replication_slot_invalidated",
           "1 once a downstream slot held more than --replication-slot-max-mb and was invalidated.",
           [](const auto& f) { return std::string(f.invalidated ? "1" : "0"); });
  r.add_value("walgate_replication_connections", "gauge", "Connections to walgate's walsender.", [get] {
    const auto* w = get();
    return w ? w->connections() : 0;
  });
  r.add_value("walgate_replication_auth_failures_total", "counter",
              "Failed authentications on walgate's walsender (wrong passwords, unknown users, malformed exchanges).",
              [get] {
                const auto* w = get();
                return w ? w->auth_failures() : 0;
              });
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
  impl_->limit_timer.cancel();
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
