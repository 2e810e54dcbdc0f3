// One NATS connection and its thread (nats_connection.hpp: what it assumes, who calls what).
#include "nats_connection.hpp"

#include "nats_util.hpp"

namespace walgate::proxy {

using namespace nats_util;

nats_connection::nats_connection(std::function<void(std::function<void()>)> post, std::function<void(const std::string&)> say,
                                 settings s)
    : post_(std::move(post)), say_(std::move(say)), settings_(std::move(s)) {}

// --- the thread ----------------------------------------------------------------------------------

void nats_connection::start(std::function<void()> run) { thread_ = std::thread(std::move(run)); }

bool nats_connection::stop() {
  if (!thread_.joinable()) return false;
  {
    std::lock_guard lk(m_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  return true;
}

bool nats_connection::stopped() {
  std::lock_guard lk(m_);
  return stopping_;
}

void nats_connection::pause(std::chrono::milliseconds d) {
  std::unique_lock lk(m_);
  cv_.wait_for(lk, d, [&] { return stopping_; });
}

void nats_connection::wake() {
  {
    std::lock_guard lk(m_);
    woken_ = true;
  }
  cv_.notify_one();
}

bool nats_connection::idle(std::chrono::milliseconds d) {
  std::unique_lock lk(m_);
  cv_.wait_for(lk, d, [&] { return stopping_ || woken_; });
  woken_ = false;
  return !stopping_;
}

// --- log lines -----------------------------------------------------------------------------------

void nats_connection::state(const std::string& s, bool is_fault) {
  fault_ = is_fault ? 1 : 0;
  if (s == last_state_) return;
  last_state_ = s;
  if (!s.empty()) say_("JetStream: " + s);
}

// --- the connection ------------------------------------------------------------------------------

void nats_connection::on_closed(natsConnection*, void* closure) {
  auto* self = static_cast<nats_connection*>(closure);
  {
    std::lock_guard lk(self->m_);
    self->closed_ = true;
  }
  self->cv_.notify_all();
}

bool nats_connection::connect() {
  const settings& c = settings_;
  nats_options_ptr opts;
  natsStatus s = natsOptions_Create(&opts.p);
  std::vector<const char*> servers;
  for (const auto& u : c.servers) servers.push_back(u.c_str());
  if (s == NATS_OK) s = natsOptions_SetServers(opts.p, servers.data(), static_cast<int>(servers.size()));
  if (s == NATS_OK) s = natsOptions_SetName(opts.p, c.name.c_str());
  // The reconnect policy: nats.c reconnects, forever, every 250 ms (what fails meanwhile, a
  // publish or a fetch, is found again by the owner).
  if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts.p, -1);
  if (s == NATS_OK) s = natsOptions_SetReconnectWait(opts.p, 250);
  if (s == NATS_OK) s = natsOptions_SetTimeout(opts.p, 2000);
  if (s == NATS_OK && c.watch_link)
    s = natsOptions_SetDisconnectedCB(
        opts.p, [](natsConnection*, void* self) { static_cast<nats_connection*>(self)->link_up_ = false; }, this);
  if (s == NATS_OK) s = natsOptions_SetClosedCB(opts.p, &nats_connection::on_closed, this);
  if (s == NATS_OK && c.watch_link)
    s = natsOptions_SetReconnectedCB(
        opts.p, [](natsConnection*, void* self) { static_cast<nats_connection*>(self)->link_up_ = true; }, this);
  {
    std::lock_guard lk(m_);
    closed_ = false;
  }
  if (s == NATS_OK) s = natsConnection_Connect(&nc_, opts.p);
  if (s != NATS_OK) {
    nc_ = nullptr;
    {
      std::lock_guard lk(m_);
      closed_ = true;   // (no connection was made: no callback comes)
    }
    state(c.cannot_connect(nats_error(s)));
    return false;
  }
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.Wait = c.wait_ms;
  jo.PublishAsync.MaxPending = c.max_pending;
  jo.PublishAsync.AckHandler = c.ack_handler;
  jo.PublishAsync.AckHandlerClosure = c.ack_closure;
  s = natsConnection_JetStream(&js_, nc_, &jo);
  if (s != NATS_OK) {
    state("cannot open a JetStream context: " + nats_error(s));
    disconnect();
    return false;
  }
  link_up_ = true;
  return true;
}

void nats_connection::disconnect() {
  if (js_) jsCtx_Destroy(js_);
  js_ = nullptr;
  if (nc_) {
    natsConnection_Close(nc_);
    // Its callbacks (on nats.c's thread) end with the closed one: waited for, so none comes
    // after this object is gone.
    std::unique_lock lk(m_);
    cv_.wait_for(lk, std::chrono::seconds(5), [&] { return closed_; });
    lk.unlock();
    natsConnection_Destroy(nc_);
  }
  nc_ = nullptr;
}

}  // namespace walgate::proxy
