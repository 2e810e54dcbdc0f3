// One PostgreSQL connection over our own sockets: TCP or Unix, SSLRequest and the TLS handshake
// per sslmode, the startup packet, authentication (cleartext, MD5, SCRAM-SHA-256 and -PLUS),
// simple queries, and CopyData reading for replication. Over 500 lines for a reason: these are
// the exchanges of one connection in the order the protocol has them, and each step uses the
// state (buffers, TLS, channel binding) the one before set up; split apart they would share
// everything.
#include "walgate/proxy/pg_connection.hpp"

#include "walgate/protocol/auth.hpp"
#include "walgate/protocol/commands.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <cstring>
#include <deque>
#include <fstream>
#include <stdexcept>
#include <variant>

namespace walgate::proxy {

void throw_exception_from_error(const failure& f, const boost::source_location&) {
  throw std::runtime_error(f.message);
}

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
using asio::awaitable;
using boost::system::error_code;
using tcp = asio::ip::tcp;
using unix_socket = asio::local::stream_protocol::socket;
using tls_stream = ssl::stream<tcp::socket>;
using protocol::errc;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

namespace {

constexpr std::size_t initial_buffer = 256 * 1024;
constexpr std::size_t min_read = 64 * 1024;

/// Translates an ErrorResponse into a failure, adding what to change where we know it.
failure server_failure(const protocol::server_notice& n, std::string_view during) {
  failure f;
  f.code = make_error_code(errc::server_error);
  f.sqlstate = n.sqlstate;
  f.message = std::string(during) + ": " + n.to_string();
  const std::string& s = n.sqlstate;
  // Authentication and configuration errors do not go away by reconnecting.
  if (s == "28P01" || s == "28000" || s == "3D000" || s == "42501" || s == "42704" || s == "0A000" ||
      s == "42601" || s == "42710" || s == "08P01")
    f.retryable = false;
  // PG10-17: "must be superuser or replication role to start walsender";
  // PG18: "permission denied to start WAL sender".
  if (s == "42501" && (n.message.find("replication") != std::string::npos ||
                       n.message.find("WAL sender") != std::string::npos ||
                       n.message.find("walsender") != std::string::npos))
    f.message += "\nwalgate: the role needs the REPLICATION attribute: ALTER ROLE <name> REPLICATION;";
  return f;
}

failure io_failure(const error_code& ec, std::string_view during, bool timed_out) {
  if (timed_out) return make_failure(errc::timeout, std::string(during) + ": timed out");
  if (ec == asio::error::eof || ec == ssl::error::stream_truncated)
    return failure{make_error_code(errc::connection_closed),
                   std::string(during) + ": server closed the connection unexpectedly", {}, true};
  return failure{ec, std::string(during) + ": " + ec.message(), {}, true};
}

bool is_ip_address(const std::string& host) {
  error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

}  // namespace

struct pg_connection::impl : std::enable_shared_from_this<pg_connection::impl> {
  explicit impl(asio::any_io_executor ex) : executor(ex), timer(ex), flush_timer(ex) {}

  asio::any_io_executor executor;
  std::variant<std::monostate, tcp::socket, unix_socket, std::unique_ptr<tls_stream>> transport;
  std::unique_ptr<ssl::context> tls_context;
  asio::steady_timer timer;        // watchdog for the current timed step
  std::uint64_t timer_generation = 0;
  bool timed_out = false;
  std::chrono::milliseconds io_timeout{30000};

  std::vector<std::byte> buf = std::vector<std::byte>(initial_buffer);
  std::size_t begin = 0, end = 0;
  std::size_t max_message = protocol::max_backend_message_length;

  std::deque<std::string> out;
  bool writing = false;
  error_code write_error;
  asio::steady_timer flush_timer;  // signalled when the write queue drains

  connection_info info;
  std::function<void(const protocol::server_notice&)> on_notice;
  std::string capture_path;
  std::unique_ptr<std::ofstream> capture;

  // --- transport ------------------------------------------------------------------------

  bool open() const {
    return std::visit(
        [](const auto& t) -> bool {
          using T = std::decay_t<decltype(t)>;
          if constexpr (std::is_same_v<T, std::monostate>) return false;
          else if constexpr (std::is_same_v<T, std::unique_ptr<tls_stream>>) return t && t->lowest_layer().is_open();
          else return t.is_open();
        },
        transport);
  }

  void close_socket() {
    std::visit(
        [](auto& t) {
          using T = std::decay_t<decltype(t)>;
          error_code ec;
          if constexpr (std::is_same_v<T, std::monostate>) return;
          else if constexpr (std::is_same_v<T, std::unique_ptr<tls_stream>>) {
            if (t) t->lowest_layer().close(ec);
          } else t.close(ec);
        },
        transport);
  }

  void arm() {
    timed_out = false;
    auto gen = ++timer_generation;
    timer.expires_after(io_timeout);
    timer.async_wait([w = weak_from_this(), gen](error_code ec) {
      if (ec) return;
      auto self = w.lock();
      if (!self || self->timer_generation != gen) return;
      self->timed_out = true;
      self->close_socket();
    });
  }
  void disarm() {
    ++timer_generation;
    timer.cancel();
  }

  awaitable<std::tuple<error_code, std::size_t>> read_some(asio::mutable_buffer b) {
    if (auto* s = std::get_if<tcp::socket>(&transport)) co_return co_await s->async_read_some(b, use_tuple);
    if (auto* s = std::get_if<unix_socket>(&transport)) co_return co_await s->async_read_some(b, use_tuple);
    if (auto* s = std::get_if<std::unique_ptr<tls_stream>>(&transport))
      co_return co_await (*s)->async_read_some(b, use_tuple);
    co_return std::tuple<error_code, std::size_t>{asio::error::not_connected, 0};
  }

  template <class Handler>
  void async_write_front(Handler&& h) {
    auto b = asio::buffer(out.front());
    if (auto* s = std::get_if<tcp::socket>(&transport)) return asio::async_write(*s, b, std::forward<Handler>(h));
    if (auto* s = std::get_if<unix_socket>(&transport)) return asio::async_write(*s, b, std::forward<Handler>(h));
    if (auto* s = std::get_if<std::unique_ptr<tls_stream>>(&transport))
      return asio::async_write(**s, b, std::forward<Handler>(h));
    asio::post(executor, [h = std::forward<Handler>(h)]() mutable { h(asio::error::not_connected, 0); });
  }

  void send(std::string bytes) {
    if (write_error) return;
    out.push_back(std::move(bytes));
    if (!writing) do_write();
  }

  void do_write() {
    writing = true;
    async_write_front([w = weak_from_this()](error_code ec, std::size_t) {
      auto self = w.lock();
      if (!self) return;
      if (ec) {
        self->write_error = ec;
        self->out.clear();
        self->writing = false;
        self->close_socket();
        self->flush_timer.cancel();
        return;
      }
      self->out.pop_front();
      if (!self->out.empty()) return self->do_write();
      self->writing = false;
      self->flush_timer.cancel();
    });
  }

  awaitable<outcome<void>> flush(std::string_view during) {
    arm();
    while (writing && !write_error) {
      flush_timer.expires_at(asio::steady_timer::time_point::max());
      co_await flush_timer.async_wait(use_tuple);
    }
    disarm();
    if (write_error) co_return io_failure(write_error, during, timed_out);
    co_return outcome<void>{};
  }

  // --- reading ----------------------------------------------------------------------------

  void make_room(std::size_t needed_from_begin) {
    if (begin == end) begin = end = 0;
    if (begin > 0 && (buf.size() - end < min_read || buf.size() - begin < needed_from_begin)) {
      std::memmove(buf.data(), buf.data() + begin, end - begin);
      end -= begin;
      begin = 0;
    }
    // One large message gets room for exactly itself (a value of hundreds of megabytes is held
    // once, not in a buffer doubled past it); small ones leave room to read many at a time.
    const bool large = needed_from_begin >= min_read;
    std::size_t want = large ? begin + needed_from_begin : std::max(begin + needed_from_begin, end + min_read);
    if (buf.size() < want)
      buf.resize(large ? want : std::max(want, std::min(buf.size() * 2, max_message + 5 + min_read)));
  }

  /// Reads one whole backend message; its body is a view into buf, valid until the next call.
  awaitable<outcome<protocol::backend_message>> read_message(bool timed, std::string_view during) {
    // A large buffer left by one huge message is given back once it is empty.
    if (begin == end && buf.size() > 4 * initial_buffer) {
      buf = std::vector<std::byte>(initial_buffer);
      begin = end = 0;
    }
    for (;;) {
      protocol::bytes_view avail(buf.data() + begin, end - begin);
      auto r = protocol::split_backend_message(avail, max_message);
      if (r.status == protocol::split_status::ready) {
        begin += r.message.size;
        co_return r.message;
      }
      if (r.status == protocol::split_status::error) {
        close_socket();
        co_return make_failure(errc::length_out_of_range,
                               std::string(during) + ": the server sent a message whose length is out of range (limit " +
                                   std::to_string(max_message) + " bytes); connection closed");
      }
      std::size_t needed = 5;
      if (avail.size() >= 5) {
        protocol::cursor c(avail);
        c.u8();
        needed = 1 + std::size_t{c.u32()};
      }
      make_room(needed);
      if (timed) arm();
      auto [ec, n] = co_await read_some(asio::buffer(buf.data() + end, buf.size() - end));
      if (timed) disarm();
      if (ec) {
        close_socket();
        co_return io_failure(ec, during, timed && timed_out);
      }
      if (capture) capture->write(reinterpret_cast<const char*>(buf.data() + end), static_cast<std::streamsize>(n)).flush();
      end += n;
    }
  }

  /// Handles messages that may arrive at any time: NoticeResponse and ParameterStatus.
  /// Returns true when the message was consumed.
  bool handle_async_message(const protocol::backend_message& m) {
    if (m.tag == 'N') {
      if (auto n = protocol::parse_error_or_notice(m.body); n && on_notice) on_notice(*n);
      return true;
    }
    if (m.tag == 'S') {
      if (auto p = protocol::parse_parameter_status(m.body))
        info.parameters[std::string(p->name)] = std::string(p->value);
      return true;
    }
    return false;
  }

  failure protocol_violation(const protocol::backend_message& m, std::string_view during) {
    close_socket();
    std::string tag = std::isprint(static_cast<unsigned char>(m.tag)) ? std::string(1, m.tag)
                                                                        : "0x" + std::to_string(static_cast<int>(m.tag));
    return make_failure(errc::unexpected_message,
                        std::string(during) + ": unexpected message '" + tag + "' from the server; connection closed");
  }

  failure malformed(const protocol::decode_error& e, std::string_view during) {
    close_socket();
    return make_failure(static_cast<errc>(e.code), std::string(during) + ": malformed message from the server: " +
                                                       e.message() + "; connection closed");
  }

  // --- connecting -------------------------------------------------------------------------

  awaitable<outcome<void>> connect_socket(const conn_endpoint& ep) {
    std::string where = ep.is_unix_socket() ? ep.host + "/.s.PGSQL." + std::to_string(ep.port)
                                            : ep.host + (ep.address.empty() || ep.address == ep.host ? "" : " (" + ep.address + ")") +
                                                  ":" + std::to_string(ep.port);
    std::string during = "connecting to " + where;
    if (ep.is_unix_socket()) {
      unix_socket s(executor);
      transport = std::move(s);
      arm();
      auto [ec] = co_await std::get<unix_socket>(transport).async_connect(
          asio::local::stream_protocol::endpoint(where), use_tuple);
      disarm();
      if (ec) co_return io_failure(ec, during, timed_out);
      co_return outcome<void>{};
    }
    tcp::resolver resolver(executor);
    arm();
    // hostaddr: that address, never the name's (which may resolve elsewhere).
    const std::string& name = ep.address.empty() ? ep.host : ep.address;
    auto [rec, results] = co_await resolver.async_resolve(
        name, std::to_string(ep.port),
        ep.address.empty() ? tcp::resolver::flags{} : tcp::resolver::numeric_host | tcp::resolver::numeric_service, use_tuple);
    disarm();
    if (rec)
      co_return failure{rec,
                        (ep.address.empty() ? "could not resolve host \"" : "invalid hostaddr \"") + name + "\": " +
                            rec.message(),
                        {}, ep.address.empty()};
    transport = tcp::socket(executor);
    arm();
    auto [cec, endpoint] = co_await asio::async_connect(std::get<tcp::socket>(transport), results, use_tuple);
    disarm();
    if (cec) co_return io_failure(cec, during, timed_out);
    info.address = endpoint.address().to_string();
    error_code ignore;
    std::get<tcp::socket>(transport).set_option(tcp::no_delay(true), ignore);
    co_return outcome<void>{};
  }

  awaitable<outcome<void>> negotiate_tls(const conn_params& p, const conn_endpoint& ep) {
    const std::string during = "negotiating TLS with " + ep.host;
    send(protocol::build_ssl_request());
    if (auto r = co_await flush(during); !r) co_return r.error();
    // Exactly one byte: after 'S' the server waits for our ClientHello.
    std::byte answer{};
    arm();
    auto [ec, n] = co_await read_some(asio::buffer(&answer, 1));
    disarm();
    if (ec) co_return io_failure(ec, during, timed_out);
    char a = static_cast<char>(answer);
    if (a == 'N') {
      if (p.sslmode >= ssl_mode::require)
        co_return failure{make_error_code(errc::tls_unavailable),
                          "server " + ep.host + " does not support TLS, but sslmode=" + std::string(to_string(p.sslmode)) +
                              " requires it (enable ssl in postgresql.conf, or lower sslmode)",
                          {}, false};
      co_return outcome<void>{};
    }
    if (a != 'S')
      co_return make_failure(errc::unexpected_message, during + ": unexpected answer to SSLRequest");

    tls_context = std::make_unique<ssl::context>(ssl::context::tls_client);
    SSL_CTX_set_min_proto_version(tls_context->native_handle(), TLS1_2_VERSION);
    error_code cec;
    bool verify = p.sslmode == ssl_mode::verify_ca || p.sslmode == ssl_mode::verify_full;
    if (verify) {
      if (p.sslrootcert.empty())
        co_return failure{make_error_code(errc::tls_unavailable),
                          "sslmode=" + std::string(to_string(p.sslmode)) +
                              " needs a root certificate: set sslrootcert (or PGSSLROOTCERT)",
                          {}, false};
      tls_context->load_verify_file(p.sslrootcert, cec);
      if (cec)
        co_return failure{cec, "could not read root certificate file \"" + p.sslrootcert + "\": " + cec.message(), {},
                          false};
      tls_context->set_verify_mode(ssl::verify_peer);
    } else {
      tls_context->set_verify_mode(ssl::verify_none);
    }
    if (!p.sslcert.empty()) {
      tls_context->use_certificate_chain_file(p.sslcert, cec);
      if (!cec) tls_context->use_private_key_file(p.sslkey.empty() ? p.sslcert : p.sslkey, ssl::context::pem, cec);
      if (cec)
        co_return failure{cec, "could not load client certificate \"" + p.sslcert + "\": " + cec.message(), {}, false};
    }
    auto stream = std::make_unique<tls_stream>(std::move(std::get<tcp::socket>(transport)), *tls_context);
    if (p.sslmode == ssl_mode::verify_full) {
      // OpenSSL's own check (RFC 6125 names, or the IP address SAN), so that a mismatch is
      // reported as such.
      X509_VERIFY_PARAM* param = SSL_get0_param(stream->native_handle());
      if (is_ip_address(ep.host)) X509_VERIFY_PARAM_set1_ip_asc(param, ep.host.c_str());
      else SSL_set1_host(stream->native_handle(), ep.host.c_str());
    }
    if (!is_ip_address(ep.host)) SSL_set_tlsext_host_name(stream->native_handle(), ep.host.c_str());
    transport = std::move(stream);
    auto& s = *std::get<std::unique_ptr<tls_stream>>(transport);
    arm();
    auto [hec] = co_await s.async_handshake(ssl::stream_base::client, use_tuple);
    disarm();
    if (hec) {
      std::string why = hec.message();
      long vr = SSL_get_verify_result(s.native_handle());
      if (vr != X509_V_OK) why += " (" + std::string(X509_verify_cert_error_string(vr)) + ")";
      if (p.sslmode == ssl_mode::verify_full &&
          (vr == X509_V_ERR_HOSTNAME_MISMATCH || vr == X509_V_ERR_IP_ADDRESS_MISMATCH))
        why = "server certificate does not match host name \"" + ep.host + "\"";
      co_return failure{hec, "TLS handshake with " + ep.host + " failed: " + why, {}, !verify};
    }
    info.tls = true;
    co_return outcome<void>{};
  }

  std::string channel_binding_data() {
    auto* s = std::get_if<std::unique_ptr<tls_stream>>(&transport);
    if (!s) return {};
    X509* cert = SSL_get1_peer_certificate((*s)->native_handle());
    if (!cert) return {};
    unsigned char* der = nullptr;
    int len = i2d_X509(cert, &der);
    std::string out;
    if (len > 0) out = protocol::tls_server_end_point({reinterpret_cast<const char*>(der), static_cast<std::size_t>(len)});
    OPENSSL_free(der);
    X509_free(cert);
    return out;
  }

  awaitable<outcome<void>> authenticate(const conn_params& p, const conn_endpoint& ep) {
    const std::string during = "authenticating as \"" + p.user + "\"";
    std::optional<std::string> password = p.password;
    if (!password) password = lookup_passfile(p.passfile, ep, p.dbname, p.user);
    auto need_password = [&]() -> failure {
      return failure{make_error_code(errc::auth_failed),
                     "the server requested password authentication for \"" + p.user +
                         "\", but no password was supplied (use password= in the connection string, "
                         "PGPASSWORD, or a pgpass file)",
                     {}, false};
    };
    std::unique_ptr<protocol::scram_client> scram;
    bool scram_verified = false;   // the server's signature checked (SASLFinal)
    for (;;) {
      auto m = co_await read_message(true, during);
      if (!m) co_return m.error();
      if (handle_async_message(*m)) continue;
      if (m->tag == 'E') {
        auto n = protocol::parse_error_or_notice(m->body);
        if (!n) co_return malformed(n.error(), during);
        close_socket();
        co_return server_failure(*n, "connection to " + ep.host + " failed");
      }
      if (m->tag != 'R') co_return protocol_violation(*m, during);
      auto a = protocol::parse_authentication(m->body);
      if (!a) co_return malformed(a.error(), during);
      switch (a->code) {
        case protocol::auth_code::ok:
          // A SASL exchange that began ends with the server's proof (SASLFinal, verified):
          // AuthenticationOk before it is a server (or a man in the middle) that never showed it
          // knows the password — refused, as libpq does.
          if (scram && !scram_verified) {
            close_socket();
            co_return failure{make_error_code(errc::auth_failed),
                              "the server sent AuthenticationOk before the SCRAM exchange was complete (it never "
                              "proved it knows the password): refused",
                              {}, false};
          }
          if (info.auth_method.empty()) info.auth_method = "trust";
          if (p.channel_binding == channel_binding_mode::require && info.auth_method != "SCRAM-SHA-256-PLUS") {
            close_socket();
            co_return failure{make_error_code(errc::auth_failed),
                              "channel_binding=require, but the server authenticated without channel binding (" +
                                  info.auth_method + ")",
                              {}, false};
          }
          co_return outcome<void>{};
        case protocol::auth_code::cleartext_password:
        case protocol::auth_code::md5_password:
          if (p.channel_binding == channel_binding_mode::require)
            co_return failure{make_error_code(errc::auth_failed),
                              "channel_binding=require, but the server asked for " +
                                  std::string(protocol::auth_code_name(a->code)) + " authentication",
                              {}, false};
          if (!password) co_return need_password();
          if (a->code == protocol::auth_code::cleartext_password) {
            info.auth_method = "password";
            send(protocol::build_password(*password));
          } else {
            info.auth_method = "md5";
            send(protocol::build_password(protocol::md5_password_response(
                p.user, *password, protocol::as_string_view(a->md5_salt))));
          }
          break;
        case protocol::auth_code::sasl: {
          if (scram) co_return protocol_violation(*m, during);   // one exchange: a second could skip its proof
          if (!password) co_return need_password();
          bool plus_offered = false, plain_offered = false;
          for (auto mech : a->mechanisms) {
            if (mech == "SCRAM-SHA-256-PLUS") plus_offered = true;
            if (mech == "SCRAM-SHA-256") plain_offered = true;
          }
          std::string binding;
          bool use_plus = info.tls && plus_offered && p.channel_binding != channel_binding_mode::disable;
          if (use_plus) binding = channel_binding_data();
          if (use_plus && binding.empty())
            co_return make_failure(errc::auth_failed, "could not compute channel binding data from the server certificate",
                                   false);
          if (p.channel_binding == channel_binding_mode::require && !use_plus)
            co_return failure{make_error_code(errc::auth_failed),
                              "channel_binding=require, but the server does not offer SCRAM-SHA-256-PLUS"
                              " (it needs TLS and a server built with OpenSSL)",
                              {}, false};
          if (!use_plus && !plain_offered) {
            std::string offered;
            for (auto mech : a->mechanisms) offered += (offered.empty() ? "" : ", ") + std::string(mech);
            co_return failure{make_error_code(errc::auth_unsupported),
                              "the server offered SASL mechanisms walgate does not support: " + offered, {}, false};
          }
          // "y,," tells the server we could bind but it did not offer PLUS over TLS (a downgrade
          // check); without TLS we say "n,,".
          scram = std::make_unique<protocol::scram_client>(*password, "", "", binding,
                                                           info.tls && p.channel_binding != channel_binding_mode::disable);
          info.auth_method = std::string(scram->mechanism());
          send(protocol::build_sasl_initial_response(scram->mechanism(), scram->client_first()));
          break;
        }
        case protocol::auth_code::sasl_continue: {
          if (!scram) co_return protocol_violation(*m, during);
          auto final_msg = scram->client_final(protocol::as_string_view(a->sasl_data));
          if (!final_msg) {
            close_socket();
            co_return failure{final_msg.error(), "SCRAM authentication failed: " + scram->failure(), {}, false};
          }
          send(protocol::build_sasl_response(*final_msg));
          break;
        }
        case protocol::auth_code::sasl_final: {
          if (!scram) co_return protocol_violation(*m, during);
          if (auto v = scram->verify_server_final(protocol::as_string_view(a->sasl_data)); !v) {
            close_socket();
            co_return failure{v.error(), "SCRAM authentication failed: " + scram->failure(), {}, false};
          }
          scram_verified = true;
          break;
        }
        default:
          close_socket();
          co_return failure{make_error_code(errc::auth_unsupported),
                            "the server requested " + std::string(protocol::auth_code_name(a->code)) +
                                " authentication, which walgate does not support; use scram-sha-256, md5, password "
                                "or trust for this role in pg_hba.conf",
                            {}, false};
      }
      if (auto f = co_await flush(during); !f) co_return f.error();
    }
  }

  awaitable<outcome<void>> connect_one(const conn_params& p, const conn_endpoint& ep, bool replication) {
    info = connection_info{};
    info.host = ep.host;
    info.port = ep.port;
    write_error = {};
    out.clear();
    begin = end = 0;
    if (auto r = co_await connect_socket(ep); !r) co_return r.error();
    if (!ep.is_unix_socket() && p.sslmode != ssl_mode::disable && p.sslmode != ssl_mode::allow)
      if (auto r = co_await negotiate_tls(p, ep); !r) co_return r.error();
    if (!capture_path.empty())
      capture = std::make_unique<std::ofstream>(capture_path, std::ios::binary | std::ios::app);

    std::vector<std::pair<std::string, std::string>> params = {
        {"user", p.user},
        {"database", p.dbname},
        {"application_name", p.application_name},
        {"client_encoding", "UTF8"},
        // Text output of values (pgoutput formats them in the walsender's session) must not
        // depend on server defaults: ISO dates, UTC, round-trip floats, hex bytea.
        {"DateStyle", "ISO, YMD"},
        {"TimeZone", "UTC"},
        {"IntervalStyle", "postgres"},
        {"extra_float_digits", "3"},
        {"bytea_output", "hex"},
    };
    if (replication) params.emplace_back("replication", "database");
    std::string startup = protocol::build_startup(params);
    if (startup.empty())
      co_return make_failure(errc::invalid_value, "connection settings contain a NUL byte", false);
    send(std::move(startup));
    if (auto r = co_await flush("sending startup"); !r) co_return r.error();
    if (auto r = co_await authenticate(p, ep); !r) co_return r.error();

    const std::string during = "starting the session";
    for (;;) {
      auto m = co_await read_message(true, during);
      if (!m) co_return m.error();
      if (handle_async_message(*m)) continue;
      switch (m->tag) {
        case 'K':
          if (auto k = protocol::parse_backend_key_data(m->body); !k) co_return malformed(k.error(), during);
          break;
        case 'E': {
          auto n = protocol::parse_error_or_notice(m->body);
          if (!n) co_return malformed(n.error(), during);
          close_socket();
          co_return server_failure(*n, "connection to " + ep.host + " failed");
        }
        case 'v':  // NegotiateProtocolVersion: we ask for 3.0 and no extensions; accept.
          break;
        case 'Z':
          info.server_version = info.parameters["server_version"];
          info.server_major = protocol::server_major_from_version_string(info.server_version);
          co_return outcome<void>{};
        default:
          co_return protocol_violation(*m, during);
      }
    }
  }
};

// The state target_session_attrs decides by: ParameterStatus where the server reports it
// (in_hot_standby and default_transaction_read_only: 14+), else queries (on a replication
// connection too: replication=database runs SQL).
awaitable<outcome<session_state>> pg_connection::find_session_state() {
  session_state st;
  const auto& parameters = impl_->info.parameters;
  auto hot = parameters.find("in_hot_standby");
  auto ro = parameters.find("default_transaction_read_only");
  if (hot != parameters.end() && ro != parameters.end()) {
    st.in_recovery = hot->second == "on";
    st.read_only = st.in_recovery || ro->second == "on";
    co_return st;
  }
  auto one = [this](std::string sql) -> awaitable<outcome<std::string>> {
    auto r = co_await query(std::move(sql));
    if (!r) co_return r.error();
    if (r->rows.size() != 1 || r->rows[0].size() != 1 || !r->rows[0][0])
      co_return make_failure(errc::unexpected_message, "an unexpected answer to a state query");
    co_return *r->rows[0][0];
  };
  auto recovery = co_await one("SELECT pg_catalog.pg_is_in_recovery()");
  if (!recovery) co_return recovery.error();
  auto read_only = co_await one("SHOW transaction_read_only");
  if (!read_only) co_return read_only.error();
  st.in_recovery = *recovery == "t";
  st.read_only = st.in_recovery || *read_only == "on";
  co_return st;
}

pg_connection::pg_connection(asio::any_io_executor ex) : impl_(std::make_shared<impl>(ex)) {}

pg_connection::~pg_connection() {
  if (impl_) {
    impl_->disarm();
    impl_->close_socket();
  }
}

awaitable<outcome<void>> pg_connection::connect(const conn_params& params, bool replication,
                                                std::function<void(const std::string&)> log) {
  auto keep = impl_;
  keep->io_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(params.connect_timeout);
  const session_target target = params.target_session_attrs.value_or(session_target::any);
  std::string errors;
  // Assumptions (each broken by a test in connection_test.cpp / failover_test.cpp):
  // - a host that is not the target (a standby for primary…) may become it (a promotion): it is
  //   passed over, and with no host left the failure is retryable;
  // - a host that refuses with "cannot connect now" (SQLSTATE class 57: starting up, shutting
  //   down) is passed over as a network failure is — the next host may be the new primary;
  // - prefer-standby takes a standby if any host is one (a first pass), else any host (a second).
  const int passes = target == session_target::prefer_standby ? 2 : 1;
  bool passed_for_state = false;   // (a host passed over for what it is, not for being down)
  for (int pass = 0; pass < passes; ++pass) {
    const session_target want = pass == 0 ? target : session_target::any;
    for (const auto& ep : params.endpoints) {
      const std::string where = ep.host + ":" + std::to_string(ep.port);
      auto r = co_await keep->connect_one(params, ep, replication);
      if (!r) {
        keep->close_socket();
        // A server that answered and refused (authentication, configuration) refuses again;
        // network failures, and a server that cannot take connections now, move on.
        const bool not_now = r.error().sqlstate.starts_with("57");
        // (a hostaddr that is no address is that host's fault, as in libpq: the next one is tried)
        const bool not_an_address = !ep.address.empty() && r.error().message.starts_with("invalid hostaddr");
        if ((!r.error().retryable && !not_an_address) ||
            (r.error().code == make_error_code(errc::server_error) && !not_now) || params.endpoints.size() == 1)
          co_return r;
        if (log) log("PostgreSQL at " + where + " passed over: " + r.error().message);
        errors += (errors.empty() ? "" : "\n") + r.error().message;
        continue;
      }
      if (want == session_target::any) co_return r;
      auto state = co_await find_session_state();
      std::string why;
      if (!state) why = "its state could not be read: " + state.error().message;
      else why = passed_over(want, *state);
      if (why.empty()) co_return outcome<void>{};
      keep->close_socket();
      passed_for_state = true;
      why = "PostgreSQL at " + where + " passed over: it is " + why + " (target_session_attrs=" +
            std::string(to_string(target)) + (pass == 1 ? ", second pass" : "") + ")";
      if (log) log(why);
      errors += (errors.empty() ? "" : "\n") + why;
    }
  }
  auto f = make_failure(errc::connection_closed,
                        errors.empty()      ? "no host to connect to"
                        : passed_for_state ? errors + "\nno host is a " + std::string(to_string(target)) + " one; trying again"
                                           : errors);
  f.passed_for_state = passed_for_state;
  co_return f;
}

awaitable<outcome<query_result>> pg_connection::query(std::string sql) {
  auto keep = impl_;
  std::string q = protocol::build_query(sql);
  if (q.empty()) co_return make_failure(errc::invalid_value, "query contains a NUL byte", false);
  keep->send(std::move(q));
  const std::string during = "running \"" + sql.substr(0, 60) + (sql.size() > 60 ? "...\"" : "\"");
  if (auto f = co_await keep->flush(during); !f) co_return f.error();
  query_result result;
  std::optional<failure> error;
  for (;;) {
    auto m = co_await keep->read_message(true, during);
    if (!m) co_return m.error();
    if (keep->handle_async_message(*m)) continue;
    switch (m->tag) {
      case 'T': {
        auto cols = protocol::parse_row_description(m->body);
        if (!cols) co_return keep->malformed(cols.error(), during);
        result.columns.clear();
        for (auto& c : *cols) result.columns.emplace_back(c.name);
        break;
      }
      case 'D': {
        auto row = protocol::parse_data_row(m->body);
        if (!row) co_return keep->malformed(row.error(), during);
        auto& r = result.rows.emplace_back();
        for (auto& v : *row) r.push_back(v ? std::optional<std::string>(std::string(*v)) : std::nullopt);
        break;
      }
      case 'C': {
        auto tag = protocol::parse_command_complete(m->body);
        if (!tag) co_return keep->malformed(tag.error(), during);
        result.command_tag = std::string(*tag);
        break;
      }
      case 'I':
        break;
      case 'E': {
        auto n = protocol::parse_error_or_notice(m->body);
        if (!n) co_return keep->malformed(n.error(), during);
        error = server_failure(*n, during);
        break;
      }
      case 'Z':
        if (error) co_return *error;
        co_return result;
      default:
        co_return keep->protocol_violation(*m, during);
    }
  }
}

awaitable<outcome<void>> pg_connection::start_copy_both(std::string command) {
  auto keep = impl_;
  std::string q = protocol::build_query(command);
  if (q.empty()) co_return make_failure(errc::invalid_value, "command contains a NUL byte", false);
  keep->send(std::move(q));
  const std::string during = "starting replication";
  if (auto f = co_await keep->flush(during); !f) co_return f.error();
  std::optional<failure> error;
  for (;;) {
    auto m = co_await keep->read_message(true, during);
    if (!m) co_return m.error();
    if (keep->handle_async_message(*m)) continue;
    switch (m->tag) {
      case 'W':
        if (auto c = protocol::parse_copy_response(m->body); !c) co_return keep->malformed(c.error(), during);
        co_return outcome<void>{};
      case 'E': {
        auto n = protocol::parse_error_or_notice(m->body);
        if (!n) co_return keep->malformed(n.error(), during);
        error = server_failure(*n, during);
        break;
      }
      case 'Z':
        if (error) co_return *error;
        co_return make_failure(errc::unexpected_message, during + ": the server did not enter copy mode");
      default:
        co_return keep->protocol_violation(*m, during);
    }
  }
}

awaitable<outcome<std::optional<protocol::bytes_view>>> pg_connection::read_copy_data() {
  auto keep = impl_;
  const char* during = "reading the replication stream";
  for (;;) {
    auto m = co_await keep->read_message(false, during);
    if (!m) co_return m.error();
    switch (m->tag) {
      case 'd':
        co_return std::optional<protocol::bytes_view>(m->body);
      case 'c':
        co_return std::optional<protocol::bytes_view>{};
      case 'N':
      case 'S':
        keep->handle_async_message(*m);
        break;
      case 'E': {
        auto n = protocol::parse_error_or_notice(m->body);
        if (!n) co_return keep->malformed(n.error(), during);
        keep->close_socket();
        co_return server_failure(*n, during);
      }
      default:
        co_return keep->protocol_violation(*m, during);
    }
  }
}

void pg_connection::send(std::string bytes) { impl_->send(std::move(bytes)); }

awaitable<outcome<void>> pg_connection::flush() {
  auto keep = impl_;
  co_return co_await keep->flush("writing to the server");
}

void pg_connection::close() {
  impl_->disarm();
  impl_->close_socket();
}
bool pg_connection::is_open() const { return impl_->open(); }
std::size_t pg_connection::backlog() const {
  // (over TLS, what OpenSSL holds decrypted or not yet decrypted is not counted: tens of KiB)
  std::size_t n = impl_->end - impl_->begin;
  boost::system::error_code ec;
  if (auto* s = std::get_if<tcp::socket>(&impl_->transport)) n += s->available(ec);
  else if (auto* u = std::get_if<unix_socket>(&impl_->transport)) n += u->available(ec);
  else if (auto* t = std::get_if<std::unique_ptr<tls_stream>>(&impl_->transport); t && *t) n += (*t)->next_layer().available(ec);
  return n;
}
const connection_info& pg_connection::info() const { return impl_->info; }
void pg_connection::set_io_timeout(std::chrono::milliseconds t) { impl_->io_timeout = t; }
void pg_connection::set_notice_handler(std::function<void(const protocol::server_notice&)> h) {
  impl_->on_notice = std::move(h);
}
void pg_connection::set_max_message_length(std::size_t n) {
  impl_->max_message = std::min(n, protocol::max_backend_message_length);
}
void pg_connection::set_capture_file(std::string path) { impl_->capture_path = std::move(path); }

}  // namespace walgate::proxy
