#include "socket_sender.hpp"

#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <cstring>
#include <thread>

namespace walgate::proxy {

namespace asio = boost::asio;

send_flight::~send_flight() {
  if (orphan_fd >= 0) ::close(orphan_fd);
}

namespace {

class threaded_sender final : public socket_sender, public std::enable_shared_from_this<threaded_sender> {
 public:
  threaded_sender(asio::any_io_executor loop, unsigned threads) : loop_(loop), done_fd_(loop) {
    int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
    done_fd_.assign(fd);
    try {
      for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
    } catch (...) {   // (the threads made so far are stopped before the error goes on)
      stop();
      throw;
    }
  }

  ~threaded_sender() override {
    stop();
    // (flights still in done_ are freed here, on the loop's thread: their owners are gone, since
    // each held this)
  }

  void submit(std::shared_ptr<send_flight> f) override {
    std::size_t queued;
    bool idle;
    {
      std::lock_guard l(m_);
      queue_.push_back(f);
      f->sent.store(false, std::memory_order_relaxed);   // (once queued: published by the mutex)
      queued = queue_.size();
      idle = idle_ > 0;
    }
    // A sleeping sender thread is woken for several flights, not for each: at once when
    // wake_at are queued, else once the handlers the loop has queued now have run (the other
    // clients woken with this one make theirs meanwhile). A wake is a futex call on the loop
    // and a context switch, as much as a small write costs.
    if (idle) {
      if (queued >= wake_at) cv_.notify_one();
      else if (!kick_posted_) {
        asio::post(loop_, [w = weak_from_this()] {
          if (auto self = w.lock()) {
            self->kick_posted_ = false;
            self->wake();
          }
        });
        kick_posted_ = true;   // (once posted: a post that throws leaves no kick expected)
      }
    }
    ++outstanding_;
    arm();
  }

  void wake() override {
    bool asleep;
    {
      std::lock_guard l(m_);
      asleep = !queue_.empty() && idle_ > 0;
    }
    if (asleep) cv_.notify_one();
  }

  /// Flights queued for a sleeping sender thread before it is woken without waiting for the
  /// loop's turn to end.
  static constexpr std::size_t wake_at = 16;

 private:
  /// A sender thread: takes everything queued, writes each, gives them back; until stopped and
  /// nothing is queued.
  void run() {
    ::pthread_setname_np(::pthread_self(), "walgate-send");   // (as top -H and perf show it)
    std::vector<std::shared_ptr<send_flight>> batch;
    for (;;) {
      {
        std::unique_lock l(m_);
        ++idle_;
        cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
        --idle_;
        if (queue_.empty()) return;   // (stopping)
        batch.swap(queue_);
      }
      for (auto& f : batch) {
        send(*f);
        f->sent.store(true, std::memory_order_release);
      }
      bool signal;
      {
        std::lock_guard l(m_);
        signal = done_.empty();
        if (signal) done_.swap(batch);
        else done_.insert(done_.end(), std::make_move_iterator(batch.begin()), std::make_move_iterator(batch.end()));
      }
      batch.clear();   // (never the last owner of a flight: the loop frees them)
      if (signal) {
        const std::uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(done_fd_.native_handle(), &one, sizeof one);   // (an eventfd: never short)
      }
    }
  }

  void stop() {
    {
      std::lock_guard l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  /// As much of the flight as the socket takes now: IOV_MAX iovecs per call, until one is taken
  /// in part (the socket is full) or fails.
  static void send(send_flight& f) {
    f.written = 0;
    f.error = 0;
    for (std::size_t at = 0; at < f.iov.size();) {
      msghdr mh{};
      mh.msg_iov = f.iov.data() + at;
      mh.msg_iovlen = std::min<std::size_t>(f.iov.size() - at, IOV_MAX);
      std::size_t want = 0;
      for (std::size_t i = 0; i < mh.msg_iovlen; ++i) want += f.iov[at + i].iov_len;
      ssize_t n;
      do n = ::sendmsg(f.fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
      while (n < 0 && errno == EINTR);
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) f.error = errno;
        return;
      }
      f.written += static_cast<std::size_t>(n);
      if (static_cast<std::size_t>(n) < want) return;
      at += mh.msg_iovlen;
    }
  }

  /// On the loop: while flights are out, a read of the eventfd (so the loop has work while a
  /// write is on a sender thread, and none when nothing is). The read is tried at once, then
  /// waited for: a signal written while no read was pending is not missed. It resets the
  /// eventfd before the finished flights are taken, so a flight given back after that signals
  /// again.
  void arm() {
    if (armed_ || outstanding_ == 0) return;
    armed_ = true;
    done_fd_.async_read_some(asio::buffer(&signals_, sizeof signals_),
                             [w = weak_from_this()](boost::system::error_code ec, std::size_t) {
                               auto self = w.lock();
                               if (!self) return;
                               self->armed_ = false;
                               // (The finished list is the truth, whatever the read said: a read
                               // that failed — it cannot but at destruction, handled above —
                               // leaves no flight behind.)
                               (void)ec;
                               self->take_done();
                               self->arm();
                             });
  }

  void take_done() {
    {
      std::lock_guard l(m_);
      given_.swap(done_);
    }
    outstanding_ -= given_.size();
    for (auto& f : given_) {
      ++writes;
      if (f->owner) f->done(f->owner, *f);   // (may submit it again)
    }
    given_.clear();
  }

  asio::any_io_executor loop_;
  asio::posix::stream_descriptor done_fd_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<send_flight>> queue_, done_;
  unsigned idle_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
  // The loop's alone.
  std::vector<std::shared_ptr<send_flight>> given_;
  std::uint64_t signals_ = 0;   // (what the eventfd read gives: not used)
  std::size_t outstanding_ = 0;
  bool armed_ = false;
  bool kick_posted_ = false;
};

}  // namespace

std::shared_ptr<socket_sender> socket_sender::make(asio::any_io_executor loop, unsigned threads) {
  return std::make_shared<threaded_sender>(std::move(loop), threads);
}

}  // namespace walgate::proxy
