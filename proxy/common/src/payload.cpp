#include "walgate/proxy/payload.hpp"

#include "walgate/proxy/deflate.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace walgate::proxy {

std::shared_ptr<const payload> payload::in_memory(std::string bytes) {
  std::shared_ptr<payload> p(new payload);
  p->size_ = bytes.size();
  p->bytes_ = std::move(bytes);
  return p;
}

std::shared_ptr<const payload> payload::spill(const std::filesystem::path& dir, std::string_view bytes,
                                              std::string& error) {
  // O_TMPFILE: the file has no name, so nothing is left behind by a crash (and no other process
  // can open it by a guessed name).
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    error = "cannot make a spill file in " + dir.string() + ": " + std::strerror(errno);
    return nullptr;
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = "cannot write a spill file in " + dir.string() + ": " + (n < 0 ? std::strerror(errno) : "no space");
      ::close(fd);
      return nullptr;
    }
    done += static_cast<std::size_t>(n);
  }
  std::shared_ptr<payload> p(new payload);
  p->fd_ = fd;
  p->size_ = bytes.size();
  return p;
}

std::shared_ptr<const payload> payload::for_one(std::string bytes) {
  std::shared_ptr<payload> p(new payload);
  p->size_ = bytes.size();
  p->bytes_ = std::move(bytes);
  p->one_client_ = true;
  return p;
}

std::shared_ptr<const payload> payload::compose(std::string head,
                                                std::vector<std::pair<std::shared_ptr<const payload>, std::size_t>> parts,
                                                std::string_view sep, std::string tail, bool one_client,
                                                std::size_t copy_below) {
  std::size_t size = head.size() + tail.size() + (parts.empty() ? 0 : (parts.size() - 1) * sep.size());
  bool in_memory = true;
  for (auto& [part, len] : parts) {
    len = std::min(len, part->size());
    size += len;
    in_memory = in_memory && !part->spilled();
  }
  if (in_memory && size < copy_below) {
    std::string bytes;
    bytes.reserve(size);
    bytes += head;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (i) bytes += sep;
      bytes.append(parts[i].first->bytes().substr(0, parts[i].second));
    }
    bytes += tail;
    return one_client ? for_one(std::move(bytes)) : payload::in_memory(std::move(bytes));
  }
  std::shared_ptr<payload> p(new payload);
  p->size_ = size;
  p->one_client_ = true;   // (composed: read in pieces, never compressed)
  p->c_ = std::make_unique<composed>();
  auto& c = *p->c_;
  c.head = std::move(head);
  c.sep = std::string(sep);
  p->bytes_ = std::move(tail);
  std::size_t at = c.head.size();
  c.starts.reserve(parts.size() + 1);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) at += sep.size();
    c.starts.push_back(at);
    at += parts[i].second;
  }
  c.starts.push_back(at);   // (where the tail begins; no parts: right after the head)
  c.parts = std::move(parts);
  return p;
}

std::shared_ptr<const payload> payload::joined(std::string head, std::vector<std::shared_ptr<const payload>> parts,
                                               std::string_view sep, std::string tail) {
  std::vector<std::pair<std::shared_ptr<const payload>, std::size_t>> whole;
  whole.reserve(parts.size());
  for (auto& x : parts) {
    const std::size_t n = x->size();
    whole.emplace_back(std::move(x), n);
  }
  return compose(std::move(head), std::move(whole), sep, std::move(tail), true, 1u << 20);
}

std::shared_ptr<const payload> payload::framed(std::string head, std::shared_ptr<const payload> base, std::string tail,
                                               bool one_client) {
  const std::size_t n = base->size();
  return compose(std::move(head), {{std::move(base), n}}, "", std::move(tail), one_client, SIZE_MAX);
}

std::shared_ptr<const payload> payload::with_tail(std::shared_ptr<const payload> base, std::size_t keep, std::string tail) {
  return compose("", {{std::move(base), keep}}, "", std::move(tail), true, SIZE_MAX);
}

std::size_t payload::memory() const {
  std::size_t n = sizeof(*this) + 32 + bytes_.size();
  if (c_) n += sizeof(composed) + c_->head.size() + c_->sep.size() + c_->parts.size() * 24 + c_->starts.size() * 8;
  for (auto* f = deflated_.get(); f; f = f->next.get()) n += sizeof(*f) + 32 + f->bytes.capacity();
  return n;
}

const std::string* payload::deflated(int window_bits, std::size_t* made) const {
  if (made) *made = 0;
  if (spilled() || one_client_ || size_ < deflate_min_bytes || size_ >= deflate_max_bytes) return nullptr;
  auto* slot = &deflated_;
  for (; *slot; slot = &(*slot)->next)
    if ((*slot)->window_bits == window_bits) return (*slot)->compressed ? &(*slot)->bytes : nullptr;
  auto f = std::make_unique<deflated_form>();
  f->window_bits = window_bits;
  f->compressed = deflate_message(bytes_, window_bits, f->bytes);
  if (made) *made = sizeof(*f) + 32 + f->bytes.capacity();   // (as memory() counts it)
  *slot = std::move(f);
  return (*slot)->compressed ? &(*slot)->bytes : nullptr;
}

payload::~payload() {
  if (fd_ >= 0) ::close(fd_);
}

bool payload::read(std::size_t offset, std::span<char> out, std::string& error) const {
  if (c_) {   // composed: head, the parts (their first len bytes) with sep between, bytes_
    const auto& c = *c_;
    if (offset > size_ || out.size() > size_ - offset) {
      error = "a read outside the spilled payload";
      return false;
    }
    std::size_t done = 0;
    while (done < out.size()) {
      const std::size_t at = offset + done, left = out.size() - done;
      std::size_t n;
      if (at < c.head.size()) {
        n = std::min(left, c.head.size() - at);
        std::copy_n(c.head.data() + at, n, out.data() + done);
      } else if (at >= c.starts.back()) {
        n = left;
        std::copy_n(bytes_.data() + (at - c.starts.back()), n, out.data() + done);
      } else {
        // The part at or before at, then either in its bytes or in the separator after it.
        const auto i = static_cast<std::size_t>(std::upper_bound(c.starts.begin(), c.starts.end() - 1, at) - c.starts.begin()) - 1;
        const auto& [part, len] = c.parts[i];
        const std::size_t in = at - c.starts[i];
        if (in < len) {
          n = std::min(left, len - in);
          if (part->spilled()) {
            if (!part->read(in, out.subspan(done, n), error)) return false;
          } else {
            std::copy_n(part->bytes().data() + in, n, out.data() + done);
          }
        } else {
          const std::size_t s = in - len;
          n = std::min(left, c.sep.size() - s);
          std::copy_n(c.sep.data() + s, n, out.data() + done);
        }
      }
      done += n;
    }
    return true;
  }
  if (fd_ < 0 || offset > size_ || out.size() > size_ - offset) {
    error = "a read outside the spilled payload";
    return false;
  }
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = std::string("cannot read a spill file: ") + (n < 0 ? std::strerror(errno) : "it is shorter than written");
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace walgate::proxy
