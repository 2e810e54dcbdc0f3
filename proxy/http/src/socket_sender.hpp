// The client side's second thread (or more): the system calls that send walgate's batches to
// its stream clients over plain TCP (WebSocket, NDJSON, SSE). The event loop makes a client's
// batch (its frames or chunk, from the shared encodings) and hands it over as a send_flight; a
// sender thread writes it to the socket without blocking (sendmsg, MSG_DONTWAIT) and gives it
// back to the loop, which goes on from there: done, or the rest sent by the loop when the socket
// can take it (a client that reads slowly never holds a sender thread), or the error. On
// loopback and on a real network alike, that system call is most of what a delivery costs the
// loop (the kernel's TCP send, and on loopback the receiver's side too), so it is what moves.
//
// What is shared, and how (corked_stream.hpp for WebSocket, chunked_stream.hpp's
// offloaded_writes for NDJSON and SSE):
// - a flight's bytes and its iovecs: made by the loop, read by the sender thread while it is
//   submitted, untouched by the loop until it is given back;
// - the socket: the sender thread writes to its descriptor only while a flight is submitted;
//   the loop never closes it then (a close is a shutdown(2) until the flight is back; a
//   WebSocket stream destroyed meanwhile hands its descriptor and its bytes to the flight, closed
//   and freed when the flight ends; an NDJSON or SSE stream's write, destroyed only at shutdown,
//   waits for `sent` first) — so the descriptor's number is never reused while a write may use it;
// - the queue of flights (a mutex and a condition variable) and the finished ones (a mutex; an
//   eventfd wakes the loop, which takes them all at once).
// Nothing else: a sender thread reads only the bytes a flight names, and the memory tail, the
// encoding cache, the subscriptions and the client list stay the event loop's.
#pragma once

#include <boost/asio/any_io_executor.hpp>

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace walgate::proxy {

/// One write handed to a sender thread.
struct send_flight {
  send_flight() = default;
  send_flight(const send_flight&) = delete;
  send_flight& operator=(const send_flight&) = delete;
  ~send_flight();

  // Set by the loop before it is submitted; read by the sender thread.
  int fd = -1;
  std::vector<iovec> iov;
  std::size_t total = 0;   ///< the bytes of iov
  // Set by the sender thread; read by the loop when it is given back.
  std::size_t written = 0;
  int error = 0;           ///< errno of a failed send; 0: sent, or the socket took only `written`
  /// Set by the sender thread once it is done with fd and iov (false from submit until then): a
  /// stream whose bytes cannot outlive it waits for this before they go (at shutdown).
  std::atomic<bool> sent{true};
  // The loop's alone.
  void* owner = nullptr;   ///< the stream waiting for it; null when that went first
  void (*done)(void* owner, send_flight&) = nullptr;
  int orphan_fd = -1;      ///< its owner went first: the socket, closed when the flight is freed
  std::shared_ptr<void> hold;   ///< its owner went first: the bytes being sent
};

class socket_sender {
 public:
  /// threads sender threads; completions run on loop (an io_context run by one thread).
  static std::shared_ptr<socket_sender> make(boost::asio::any_io_executor loop, unsigned threads);
  virtual ~socket_sender() = default;   // (the threads finish what is queued, then stop)

  /// On the loop: the flight is written by a sender thread, then f->done(f->owner, *f) is called
  /// on the loop (unless its owner is gone).
  virtual void submit(std::shared_ptr<send_flight> f) = 0;

  /// From any thread: a sleeping sender thread is woken for what is queued now, without waiting
  /// for the loop (a stream that must wait for its flight without the loop, at shutdown).
  virtual void wake() = 0;

  /// On the loop: flights given back; and writes the socket took only in part, whose rest then
  /// went from the loop (counted by the stream that goes on with it).
  std::uint64_t writes = 0, partial = 0;
};

}  // namespace walgate::proxy
