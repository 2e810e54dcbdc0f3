// NATS servers for the scale-out tests: nats-server processes with JetStream on loopback ports
// (one node, or a cluster whose routes are 127.0.0.1 ports), killed and restarted by the test;
// and a reader of a stream's messages by sequence (nats.c).
#pragma once

#include <doctest/doctest.h>
#include <nats/nats.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace walgate::test::nats_harness {

/// The nats-server executable ("" when it is not installed).
inline std::string nats_server_binary() {
  for (const char* p : {"/usr/bin/nats-server", "/usr/local/bin/nats-server", "/usr/sbin/nats-server"})
    if (std::filesystem::exists(p)) return p;
  return {};
}

inline std::uint16_t free_tcp_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

inline bool port_open(std::uint16_t port) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket s(io);
  boost::system::error_code ec;
  s.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
  return !ec;
}

/// nats-server nodes with JetStream (file storage in a directory of their own each).
struct nats_cluster {
  struct node {
    std::uint16_t port = 0, cluster_port = 0;
    std::filesystem::path dir;
    pid_t pid = -1;
  };
  std::vector<node> nodes;
  std::filesystem::path root;
  std::string config;   // nats-server configuration lines for every node ("": none)

  explicit nats_cluster(std::size_t n, std::string config_lines = "") : config(std::move(config_lines)) {
    std::string t = (std::filesystem::temp_directory_path() / "walgate-nats-XXXXXX").string();
    root = mkdtemp(t.data());
    for (std::size_t i = 0; i < n; ++i) {
      node x;
      x.port = free_tcp_port();
      x.cluster_port = n > 1 ? free_tcp_port() : 0;
      x.dir = root / ("n" + std::to_string(i));
      std::filesystem::create_directories(x.dir);
      nodes.push_back(x);
    }
    for (std::size_t i = 0; i < n; ++i) start(i);
    for (std::size_t i = 0; i < n; ++i) wait_listening(i);
  }
  ~nats_cluster() {
    for (std::size_t i = 0; i < nodes.size(); ++i) kill(i);
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
  std::string url(std::size_t i) const { return "nats://127.0.0.1:" + std::to_string(nodes[i].port); }
  std::string urls() const {
    std::string out;
    for (std::size_t i = 0; i < nodes.size(); ++i) out += (i ? "," : "") + url(i);
    return out;
  }
  void start(std::size_t i) {
    auto& x = nodes[i];
    std::vector<std::string> args = {nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", std::to_string(x.port), "-sd",
                                     x.dir.string(), "--server_name", "n" + std::to_string(i)};
    if (nodes.size() > 1) {
      std::string routes;
      for (std::size_t j = 0; j < nodes.size(); ++j)
        if (j != i) routes += (routes.empty() ? "" : ",") + std::string("nats://127.0.0.1:") + std::to_string(nodes[j].cluster_port);
      args.insert(args.end(), {"--cluster_name", "walgate-test", "--cluster",
                               "nats://127.0.0.1:" + std::to_string(x.cluster_port), "--routes", routes});
    }
    if (!config.empty()) {
      const auto file = x.dir / "server.conf";
      std::ofstream(file) << config << "\n";
      args.insert(args.end(), {"-c", file.string()});
    }
    const std::string log = (x.dir / "server.log").string();
    x.pid = fork();
    REQUIRE(x.pid >= 0);
    if (x.pid == 0) {
      FILE* f = std::freopen(log.c_str(), "a", stderr);
      (void)f;
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  void wait_listening(std::size_t i) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!port_open(nodes[i].port)) {
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < until, "nats-server n" << i << " did not start: " << server_log(i));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  void kill(std::size_t i) {
    auto& x = nodes[i];
    if (x.pid <= 0) return;
    ::kill(x.pid, SIGKILL);
    int st = 0;
    waitpid(x.pid, &st, 0);
    x.pid = -1;
  }
  void restart(std::size_t i) {
    start(i);
    wait_listening(i);
  }
  std::string server_log(std::size_t i) const {
    std::ifstream f(nodes[i].dir / "server.log");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
  }
};

/// One message of the stream: its sequence, subject, headers and body.
struct stream_message {
  std::uint64_t seq = 0;
  std::string subject, body;
  std::map<std::string, std::string> headers;
};

/// A client of the stream for checks (a connection to the given servers).
struct stream_reader {
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  std::string stream;
  stream_reader(const std::string& urls, std::string name) : stream(std::move(name)) {
    natsOptions* o = nullptr;
    REQUIRE(natsOptions_Create(&o) == NATS_OK);
    std::vector<std::string> list;
    for (std::size_t s = 0, c; s <= urls.size(); s = c + 1) {
      c = urls.find(',', s);
      if (c == std::string::npos) c = urls.size();
      list.push_back(urls.substr(s, c - s));
    }
    std::vector<const char*> ptrs;
    for (auto& u : list) ptrs.push_back(u.c_str());
    natsOptions_SetServers(o, ptrs.data(), static_cast<int>(ptrs.size()));
    natsOptions_SetMaxReconnect(o, -1);
    natsStatus s = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    REQUIRE_MESSAGE(s == NATS_OK, natsStatus_GetText(s));
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 5000;
    REQUIRE(natsConnection_JetStream(&js, nc, &jo) == NATS_OK);
  }
  ~stream_reader() {
    if (js) jsCtx_Destroy(js);
    if (nc) natsConnection_Destroy(nc);
  }
  /// The stream's last sequence and message count; nullopt when it cannot be read now.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> state() {
    jsStreamInfo* si = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    if (js_GetStreamInfo(&si, js, stream.c_str(), nullptr, &jerr) != NATS_OK) return std::nullopt;
    auto out = std::make_pair(si->State.LastSeq, si->State.Msgs);
    jsStreamInfo_Destroy(si);
    return out;
  }
  /// A message's header by a direct get (any replica answers; the stream allows direct gets).
  std::optional<std::string> direct_header(std::uint64_t seq, const char* name) {
    natsMsg* m = nullptr;
    jsDirectGetMsgOptions o;
    jsDirectGetMsgOptions_Init(&o);
    o.Sequence = seq;
    if (js_DirectGetMsg(&m, js, stream.c_str(), nullptr, &o) != NATS_OK) return std::nullopt;
    const char* v = nullptr;
    std::optional<std::string> out;
    if (natsMsgHeader_Get(m, name, &v) == NATS_OK && v) out = v;
    natsMsg_Destroy(m);
    return out;
  }
  std::optional<stream_message> get(std::uint64_t seq) {
    natsMsg* m = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    for (int attempt = 0; attempt < 50; ++attempt) {
      if (js_GetMsg(&m, js, stream.c_str(), seq, nullptr, &jerr) == NATS_OK) break;
      m = nullptr;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!m) return std::nullopt;
    stream_message out;
    out.seq = seq;
    out.subject = natsMsg_GetSubject(m);
    out.body.assign(natsMsg_GetData(m), static_cast<std::size_t>(natsMsg_GetDataLength(m)));
    const char** keys = nullptr;
    int count = 0;
    if (natsMsgHeader_Keys(m, &keys, &count) == NATS_OK) {
      for (int i = 0; i < count; ++i) {
        const char* v = nullptr;
        if (natsMsgHeader_Get(m, keys[i], &v) == NATS_OK && v) out.headers[keys[i]] = v;
      }
      free(keys);
    }
    natsMsg_Destroy(m);
    return out;
  }
};

}  // namespace walgate::test::nats_harness
