// The sender threads (proxy/http/src/socket_sender.cpp), a WebSocket connection's corked stream
// writing through them (corked_stream.hpp) and an NDJSON or SSE stream's writes
// (chunked_stream.hpp's offloaded_writes), on real loopback TCP sockets: bytes in order, a
// socket that takes only part, a failed send, a stream closed or destroyed while its write is on
// a sender thread (its descriptor and bytes outlive it until the write is back, then go).
#include "chunked_stream.hpp"
#include "corked_stream.hpp"
#include "socket_sender.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <cerrno>
#include <climits>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using namespace walgate::proxy;

namespace {

/// A connected pair of loopback TCP sockets: walgate's side, the client's.
std::pair<tcp::socket, tcp::socket> tcp_pair(asio::io_context& io) {
  tcp::acceptor a(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  tcp::socket c(io);
  c.connect(a.local_endpoint());
  tcp::socket s = a.accept();
  return {std::move(s), std::move(c)};
}

/// Runs the loop until done() (at most 20 s).
template <class Done>
void run_until(asio::io_context& io, Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done() && std::chrono::steady_clock::now() < until) {
    io.restart();
    io.run_for(std::chrono::milliseconds(5));
  }
}

/// Everything the client's socket gets until the end of the stream (a read that waits 10 s
/// ends it too).
std::string read_to_end(int fd) {
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

/// n bytes from the client's socket, read slowly (so that walgate's side fills): fewer at the
/// end of the stream, or after 10 s without any.
std::string read_slowly(int fd, std::size_t n) {
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string got;
  char buf[65536];
  while (got.size() < n) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r <= 0) break;
    got.append(buf, static_cast<std::size_t>(r));
  }
  return got;
}

bool fd_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

std::string frame(std::string_view payload) {
  char head[10];
  std::string f(head, websocket_text_frame_header(head, payload.size()));
  return f + std::string(payload);
}

std::string pattern(std::size_t n, char seed) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + static_cast<unsigned char>(seed)) % 26);
  return s;
}

}  // namespace

TEST_CASE("a sender thread writes a flight's bytes and gives it back to the loop: whole, in part, or failed") {
  asio::io_context io;
  auto [s, peer] = tcp_pair(io);
  auto sender = socket_sender::make(io.get_executor(), 1);
  int calls = 0;
  auto flight = [&](std::vector<std::string>& parts) {
    auto f = std::make_shared<send_flight>();
    f->fd = s.native_handle();
    for (auto& p : parts) {
      f->iov.push_back({p.data(), p.size()});
      f->total += p.size();
    }
    f->owner = &calls;
    f->done = [](void* o, send_flight&) { ++*static_cast<int*>(o); };
    return f;
  };

  SUBCASE("the sender thread is named walgate-send (top -H, perf)") {
    bool named = false;
    for (int i = 0; i < 200 && !named; ++i) {   // (it names itself as it starts)
      for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
        std::string comm;
        std::getline(std::ifstream(t.path() / "comm"), comm);
        named = named || comm == "walgate-send";
      }
      if (!named) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(named);
  }
  SUBCASE("whole") {
    std::vector<std::string> parts{"hello ", "", "world"};
    auto f = flight(parts);
    sender->submit(f);
    CHECK(calls == 0);   // (given back on the loop, not before it runs)
    run_until(io, [&] { return calls == 1; });
    CHECK(calls == 1);
    CHECK(f->written == 11);
    CHECK(f->error == 0);
    CHECK(sender->writes == 1);
    CHECK(sender->partial == 0);
    char buf[11];
    REQUIRE(::recv(peer.native_handle(), buf, 11, MSG_WAITALL) == 11);
    CHECK(std::string(buf, 11) == "hello world");
  }
  SUBCASE("in part: the socket's buffer is full, and the sender thread does not wait") {
    s.set_option(asio::socket_base::send_buffer_size(4096));
    std::vector<std::string> parts{pattern(8u << 20, 'x')};
    auto f = flight(parts);
    sender->submit(f);
    run_until(io, [&] { return calls == 1; });
    CHECK(calls == 1);
    CHECK(f->error == 0);
    CHECK(f->written > 0);
    CHECK(f->written < f->total);
  }
  SUBCASE("more iovecs than one sendmsg takes (IOV_MAX): every one of them") {
    std::vector<std::string> parts;
    for (int i = 0; i < 3000; ++i) parts.push_back(std::to_string(100000 + i));
    auto f = flight(parts);
    REQUIRE(f->iov.size() > IOV_MAX);
    sender->submit(f);
    run_until(io, [&] { return calls == 1; });
    CHECK(calls == 1);
    CHECK(f->error == 0);
    CHECK(f->written == f->total);
    std::string want;
    for (auto& p : parts) want += p;
    std::string got(want.size(), '\0');
    REQUIRE(::recv(peer.native_handle(), got.data(), got.size(), MSG_WAITALL) == static_cast<ssize_t>(got.size()));
    CHECK(got == want);
  }
  SUBCASE("many at once: a sleeping sender thread is woken when 16 are queued, before the loop's turn ends") {
    // (With fewer the wake-up is a handler on the loop: the other subcases, whose flights are
    // given back once the loop runs, go through it whenever the sender thread was asleep.)
    std::vector<std::vector<std::string>> parts;
    for (int i = 0; i < 16; ++i) parts.push_back({"<" + std::to_string(100 + i) + ">"});
    std::vector<std::shared_ptr<send_flight>> fs;
    for (auto& p : parts) fs.push_back(flight(p));
    // (the sender thread started, done with a first flight and asleep)
    std::vector<std::string> first{"<first>"};
    sender->submit(flight(first));
    run_until(io, [&] { return calls == 1; });
    REQUIRE(calls == 1);
    calls = 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (auto& f : fs) sender->submit(f);
    // Written without the loop running.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    auto all_sent = [&] { return std::all_of(fs.begin(), fs.end(), [](auto& f) { return f->sent.load(); }); };
    while (!all_sent() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(all_sent());
    CHECK(calls == 0);
    run_until(io, [&] { return calls == 16; });
    CHECK(calls == 16);
    std::string want = first[0];
    for (auto& p : parts) want += p[0];
    std::string got(want.size(), '\0');
    REQUIRE(::recv(peer.native_handle(), got.data(), got.size(), MSG_WAITALL) == static_cast<ssize_t>(got.size()));
    CHECK(got == want);
  }
  SUBCASE("failed: the client reset the connection") {
    peer.set_option(asio::socket_base::linger(true, 0));
    peer.close();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::vector<std::string> parts{"x"};
    auto f = flight(parts);
    sender->submit(f);
    run_until(io, [&] { return calls == 1; });
    CHECK(calls == 1);
    CHECK((f->error == ECONNRESET || f->error == EPIPE));
  }
  SUBCASE("its owner gone: not called back; the descriptor it was given is closed when it is freed") {
    std::vector<std::string> parts{"bytes"};
    auto f = flight(parts);
    f->fd = ::dup(s.native_handle());
    REQUIRE(f->fd >= 0);
    sender->submit(f);
    f->owner = nullptr;
    f->orphan_fd = f->fd;
    const int fd = f->fd;
    std::weak_ptr<send_flight> w = f;
    f.reset();
    CHECK(fd_open(fd));   // (held by the sender until the loop takes it back)
    run_until(io, [&] { return w.expired(); });
    CHECK(w.expired());
    CHECK(calls == 0);
    CHECK(!fd_open(fd));
  }
}

TEST_CASE("a corked stream writing through a sender thread: frames in order, the rest sent from the loop") {
  asio::io_context io;
  auto [s, peer] = tcp_pair(io);
  auto sender = socket_sender::make(io.get_executor(), 1);
  corked_stream<tcp::socket> out(std::move(s));
  out.send_with(sender);
  // A batch of small frames (copied) and large ones (referenced), then a second batch: 20 MB in
  // all, more than the sockets hold, so the sender's write is taken in part and the loop sends
  // the rest.
  std::string expected;
  auto big = std::make_shared<std::string>(pattern(4u << 20, 'b'));
  int drained = 0;
  boost::system::error_code failed;
  for (int batch = 0; batch < 2; ++batch) {
    if (batch == 1) out.uncork();   // the first goes out (to the sender thread) while the second is made
    out.cork();
    for (int i = 0; i < 1000; ++i) {
      auto small = pattern(100 + i, static_cast<char>(i));
      out.append_text_frame(small);
      expected += frame(small);
      if (i % 200 == 0) {
        out.append_text_frame(big, *big);
        expected += frame(*big);
      }
    }
  }
  out.async_drain([&](boost::system::error_code ec) {
    ++drained;
    if (ec) failed = ec;
  });
  std::string got;
  std::thread reader([&got, fd = peer.native_handle(), n = expected.size()] { got = read_slowly(fd, n); });
  run_until(io, [&] { return drained == 1; });
  reader.join();
  CHECK(drained == 1);
  CHECK(!failed);
  CHECK(got.size() == expected.size());
  CHECK(got == expected);
  CHECK(sender->writes >= 2);
  CHECK(sender->partial >= 1);
}

TEST_CASE("a corked stream closed, or destroyed, while its write is on a sender thread") {
  asio::io_context io;
  auto [s, peer] = tcp_pair(io);
  s.set_option(asio::socket_base::send_buffer_size(4096));
  auto sender = socket_sender::make(io.get_executor(), 1);
  auto out = std::make_unique<corked_stream<tcp::socket>>(std::move(s));
  out->send_with(sender);
  auto bytes = std::make_shared<std::string>(pattern(8u << 20, 'z'));
  std::weak_ptr<std::string> held = bytes;
  const std::string expected = frame(*bytes);
  out->append_text_frame(bytes, *bytes);   // uncorked: given to the sender thread at once
  bytes.reset();
  CHECK(!held.expired());

  SUBCASE("closed: shut down at once, closed when the write is back; the drain fails") {
    out->close();
    CHECK(out->next_layer().is_open());   // (the sender thread may be writing to it)
    bool drained = false;
    boost::system::error_code failed;
    out->async_drain([&](boost::system::error_code ec) {
      drained = true;
      failed = ec;
    });
    const std::string got = read_to_end(peer.native_handle());   // the end of the stream: the shutdown
    CHECK(got.size() < expected.size());
    CHECK(got == expected.substr(0, got.size()));
    run_until(io, [&] { return drained; });
    CHECK(drained);
    CHECK(failed);
    CHECK(!out->next_layer().is_open());
    out.reset();
    run_until(io, [&] { return held.expired(); });
    CHECK(held.expired());
  }
  SUBCASE("destroyed: its descriptor and bytes are kept by the write, and go when it is back") {
    const int fd = out->next_layer().native_handle();
    out.reset();
    CHECK(!held.expired());   // the sender thread may be reading them
    CHECK(fd_open(fd));       // its number cannot be given to another connection meanwhile
    run_until(io, [&] { return held.expired(); });
    CHECK(held.expired());
    const std::string got = read_to_end(peer.native_handle());   // what the socket took, then the end
    CHECK(got.size() < expected.size());
    CHECK(got == expected.substr(0, got.size()));
  }
}

TEST_CASE("an NDJSON or SSE stream's writes through a sender thread: whole, the rest from the loop, closed meanwhile, "
          "destroyed at shutdown") {
  using walgate::proxy::chunked::offloaded_writes;
  auto io = std::make_unique<asio::io_context>();
  auto [s, peer] = tcp_pair(*io);
  s.set_option(asio::socket_base::send_buffer_size(4096));
  auto sender = socket_sender::make(io->get_executor(), 1);
  // Three buffers, 8 MB: far more than the socket takes at once.
  auto a = pattern(3u << 20, 'a'), b = pattern(10, 'b'), c = pattern(5u << 20, 'c');
  const std::string expected = a + b + c;
  const std::array<asio::const_buffer, 3> bufs{asio::buffer(a), asio::buffer(b), asio::buffer(c)};

  SUBCASE("whole, in order: the socket's part from the sender thread, the rest from the loop") {
    offloaded_writes w(sender, s);
    bool done = false;
    boost::system::error_code result;
    asio::co_spawn(*io, [&]() -> asio::awaitable<void> {
      result = co_await w.write(bufs);
      done = true;
    }, asio::detached);
    std::string got;
    std::thread reader([&got, fd = peer.native_handle(), n = expected.size()] { got = read_slowly(fd, n); });
    run_until(*io, [&] { return done; });
    reader.join();
    CHECK(done);
    CHECK(!result);
    CHECK(got == expected);
    CHECK(sender->writes == 1);
    CHECK(sender->partial == 1);
  }
  SUBCASE("closed while the write is out: shut down at once, closed when it is back; the write fails") {
    offloaded_writes w(sender, s);
    bool started = false, done = false;
    boost::system::error_code result;
    asio::co_spawn(*io, [&]() -> asio::awaitable<void> {
      started = true;
      result = co_await w.write(bufs);
      done = true;
    }, asio::detached);
    // Until the write is given to the sender thread (in the handler that started the coroutine);
    // no more: it is given back only when the loop runs again.
    while (!started) io->poll_one();
    REQUIRE(!done);
    w.close();
    CHECK(s.is_open());   // (the sender thread may be writing to it)
    const std::string got = read_to_end(peer.native_handle());   // the end: the shutdown
    CHECK(got.size() < expected.size());
    CHECK(got == expected.substr(0, got.size()));
    run_until(*io, [&] { return done; });
    CHECK(done);
    CHECK(result == asio::error::operation_aborted);
    CHECK(!s.is_open());
  }
  SUBCASE("the loop's coroutines destroyed while the write is out: it waits for the sender thread, then the socket closes") {
    // As at shutdown: the stream's coroutine owns its socket and bytes, and is destroyed with its
    // io_context, suspended mid-write. (A loop of its own: this one is destroyed here.)
    auto io2 = std::make_unique<asio::io_context>();
    int client_fd = -1;
    std::optional<tcp::socket> s2;
    {
      auto [x, y] = tcp_pair(*io2);
      x.set_option(asio::socket_base::send_buffer_size(4096));
      client_fd = y.release();
      s2.emplace(std::move(x));
    }
    auto sender2 = socket_sender::make(io2->get_executor(), 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));   // (the sender thread asleep: woken by the write's wait)
    auto bytes = std::make_shared<std::string>(expected);
    std::weak_ptr<std::string> held = bytes;
    bool started = false;
    asio::co_spawn(*io2, [sock = std::move(*s2), sender2, bytes = std::move(bytes), &started]() mutable -> asio::awaitable<void> {
      offloaded_writes w(sender2, sock);
      started = true;
      co_await w.write(asio::buffer(*bytes));
    }, asio::detached);
    s2.reset();
    while (!started) io2->poll_one();   // the write given to the sender thread, and not given back
    CHECK(!held.expired());
    sender2.reset();   // (the coroutine holds the last reference)
    io2.reset();       // destroys the coroutine mid-write, on this thread
    CHECK(held.expired());
    const std::string got = read_to_end(client_fd);   // what the socket took, then the end
    ::close(client_fd);
    CHECK(got.size() < expected.size());
    CHECK(got == expected.substr(0, got.size()));
  }
}
