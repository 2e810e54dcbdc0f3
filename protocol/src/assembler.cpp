#include "walgate/protocol/assembler.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace walgate::protocol {

namespace pg = pgoutput;
using result_t = boost::system::result<void, assembly_error>;

namespace {
assembly_error fail(errc code, std::string message) { return assembly_error{code, std::move(message)}; }
std::string xid_text(std::uint32_t xid) { return std::to_string(xid); }
transaction_info committed(std::uint32_t xid, lsn commit_lsn, lsn end_lsn, std::int64_t time, bool streamed,
                           std::string_view gid) {
  transaction_info t;
  t.xid = xid;
  t.commit_lsn = commit_lsn;
  t.end_lsn = end_lsn;
  t.commit_time = time;
  t.streamed = streamed;
  t.gid = std::string(gid);
  return t;
}
// Record header in a held buffer: Int64 WAL start | Int32 length, then the message bytes.
constexpr std::size_t record_header = 12;
}  // namespace

// The raw messages of one held transaction, in memory or in a spill file, as records.
class assembler::held_buffer {
 public:
  held_buffer(std::size_t& memory_counter, bool stream_format)
      : memory_(memory_counter), stream_format_(stream_format) {}
  ~held_buffer() {
    memory_ -= mem_.size();
    if (file_) {
      std::fclose(file_);
      std::error_code ec;
      std::filesystem::remove(path_, ec);
    }
  }

  bool stream_format() const { return stream_format_; }
  std::size_t size() const { return size_; }
  std::size_t in_memory() const { return mem_.size(); }
  bool spilled() const { return file_ != nullptr; }
  transaction_info info;   // for prepared transactions: what Begin Prepare / Prepare said

  result_t append(lsn wal_start, bytes_view data, std::optional<std::uint32_t> subxid) {
    if (subxid) {
      bool seen = std::any_of(subxacts_.begin(), subxacts_.end(), [&](const auto& s) { return s.first == *subxid; });
      if (!seen) subxacts_.emplace_back(*subxid, size_);
    }
    std::string header;
    writer(header).u64(wal_start.value).u32(static_cast<std::uint32_t>(data.size()));
    if (file_) {
      if (std::fwrite(header.data(), 1, header.size(), file_) != header.size() ||
          std::fwrite(data.data(), 1, data.size(), file_) != data.size())
        return fail(errc::limit_exceeded, "cannot write spill file " + path_.string() + ": " + std::strerror(errno));
    } else {
      mem_ += header;
      mem_.append(reinterpret_cast<const char*>(data.data()), data.size());
      memory_ += header.size() + data.size();
    }
    size_ += header.size() + data.size();
    return {};
  }

  /// Drops everything from the first message of subxid on.
  result_t truncate_subxact(std::uint32_t subxid) {
    auto it = std::find_if(subxacts_.begin(), subxacts_.end(), [&](const auto& s) { return s.first == subxid; });
    if (it == subxacts_.end()) return {};   // nothing of it was buffered
    std::size_t offset = it->second;
    subxacts_.erase(std::remove_if(subxacts_.begin(), subxacts_.end(), [&](const auto& s) { return s.second >= offset; }),
                    subxacts_.end());
    if (file_) {
      if (std::fflush(file_) != 0 || ::ftruncate(::fileno(file_), static_cast<off_t>(offset)) != 0 ||
          std::fseek(file_, 0, SEEK_END) != 0)
        return fail(errc::limit_exceeded, "cannot truncate spill file " + path_.string() + ": " + std::strerror(errno));
    } else {
      memory_ -= mem_.size() - offset;
      mem_.resize(offset);
    }
    size_ = offset;
    return {};
  }

  result_t spill(const std::filesystem::path& dir, std::uint64_t sequence) {
    if (file_) return {};
    path_ = dir / ("walgate-txn-" + std::to_string(::getpid()) + "-" + std::to_string(sequence) + ".spill");
    // Created here or not at all (never a file someone put in the way), readable by us alone.
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return fail(errc::limit_exceeded, "cannot create spill file " + path_.string() + ": " + std::strerror(errno));
    file_ = ::fdopen(fd, "w+b");
    if (!file_) {
      int saved = errno;
      ::close(fd);
      std::error_code ec;
      std::filesystem::remove(path_, ec);
      return fail(errc::limit_exceeded, "cannot create spill file " + path_.string() + ": " + std::strerror(saved));
    }
    if (std::fwrite(mem_.data(), 1, mem_.size(), file_) != mem_.size()) {
      auto e = fail(errc::limit_exceeded, "cannot write spill file " + path_.string() + ": " + std::strerror(errno));
      std::fclose(file_);   // still whole in memory
      file_ = nullptr;
      std::error_code ec;
      std::filesystem::remove(path_, ec);
      return e;
    }
    memory_ -= mem_.size();
    std::string().swap(mem_);
    return {};
  }

  /// Calls f(wal_start, data) for each record in order; data is valid during the call.
  template <class F>
  result_t for_each(F&& f) {
    if (!file_) {
      cursor c(as_bytes(mem_));
      while (!c.empty()) {
        lsn start{c.u64()};
        std::uint32_t len = c.u32();
        bytes_view data = c.bytes(len);
        if (!c.ok()) return fail(errc::truncated, "held transaction buffer is corrupt");
        if (auto r = f(start, data); !r) return r;
      }
      return {};
    }
    if (std::fflush(file_) != 0 || std::fseek(file_, 0, SEEK_SET) != 0)
      return fail(errc::limit_exceeded, "cannot read spill file " + path_.string() + ": " + std::strerror(errno));
    std::string body;
    for (std::size_t read = 0; read < size_;) {
      char header[record_header];
      if (std::fread(header, 1, record_header, file_) != record_header)
        return fail(errc::truncated, "spill file " + path_.string() + " is shorter than written");
      cursor c(std::string_view(header, record_header));
      lsn start{c.u64()};
      std::uint32_t len = c.u32();
      body.resize(len);
      if (len > 0 && std::fread(body.data(), 1, len, file_) != len)
        return fail(errc::truncated, "spill file " + path_.string() + " is shorter than written");
      read += record_header + len;
      if (auto r = f(start, as_bytes(body)); !r) return r;
    }
    return {};
  }

 private:
  std::size_t& memory_;
  bool stream_format_;
  std::string mem_;
  std::size_t size_ = 0;
  std::FILE* file_ = nullptr;
  std::filesystem::path path_;
  std::vector<std::pair<std::uint32_t, std::size_t>> subxacts_;   // subxid -> offset of its first record
};

assembler::assembler(assembler_options options, transaction_handler& handler)
    : options_(std::move(options)), handler_(handler) {
  if (options_.spill_dir.empty()) options_.spill_dir = std::filesystem::temp_directory_path();
}

assembler::~assembler() = default;

std::size_t assembler::spilled_bytes() const {
  std::size_t n = 0;
  auto add = [&](const held_buffer& b) {
    if (b.spilled()) n += b.size();
  };
  for (const auto& [xid, b] : streams_) add(*b);
  for (const auto& [gid, b] : prepared_) add(*b);
  if (preparing_) add(*preparing_);
  return n;
}

assembly_error assembler::handler_failed(const boost::system::error_code& ec) const {
  return fail(errc::invalid_value, "transaction handler failed: " + ec.message());
}

result_t assembler::ensure_begun() {
  if (begun_) return {};
  begun_ = true;
  if (auto ec = handler_.on_begin(*current_)) return handler_failed(ec);
  return {};
}

result_t assembler::deliver_change(lsn wal_start, const pg::any_message& m) {
  change_event e;
  e.change_lsn = wal_start;
  e.index = next_index_;
  e.message = &m;
  std::uint32_t oid = 0;
  if (auto* i = std::get_if<pg::insert>(&m)) oid = i->relation_oid;
  if (auto* u = std::get_if<pg::update>(&m)) oid = u->relation_oid;
  if (auto* d = std::get_if<pg::delete_>(&m)) oid = d->relation_oid;
  if (oid != 0) {
    e.relation = relations_.find(oid);
    if (!e.relation)
      return fail(errc::unexpected_message, std::string(pg::name_of(pg::tag_of(m))) + " at " + wal_start.to_string() +
                                                " for relation " + std::to_string(oid) +
                                                " that no Relation message described");
  }
  if (auto* t = std::get_if<pg::truncate>(&m)) {
    for (auto r : t->relation_oids)
      if (!relations_.find(r))
        return fail(errc::unexpected_message, "Truncate at " + wal_start.to_string() + " of relation " +
                                                  std::to_string(r) + " that no Relation message described");
    next_index_ += static_cast<std::uint32_t>(std::max<std::size_t>(1, t->relation_oids.size()));
  } else {
    next_index_ += 1;
  }
  if (auto r = ensure_begun(); !r) return r;
  if (auto ec = handler_.on_change(*current_, e)) return handler_failed(ec);
  return {};
}

result_t assembler::hold(held_buffer& buf, lsn wal_start, bytes_view data, std::optional<std::uint32_t> subxid) {
  if (auto r = buf.append(wal_start, data, subxid); !r) return r;
  return enforce_memory_limit();
}

result_t assembler::enforce_memory_limit() {
  while (memory_bytes_ > options_.memory_limit) {
    held_buffer* largest = nullptr;
    auto consider = [&](held_buffer* b) {
      if (b && !b->spilled() && (!largest || b->in_memory() > largest->in_memory())) largest = b;
    };
    for (auto& [xid, b] : streams_) consider(b.get());
    for (auto& [gid, b] : prepared_) consider(b.get());
    consider(preparing_.get());
    if (!largest || largest->in_memory() == 0) return {};
    // A spill that fails is an error (the bound cannot be kept), never a retry loop.
    // (Numbered process-wide: several assemblers may share a directory.)
    static std::atomic<std::uint64_t> sequence{0};
    if (auto r = largest->spill(options_.spill_dir, ++sequence); !r) return r;
  }
  return {};
}

result_t assembler::replay(held_buffer& buf, transaction_info info) {
  current_ = std::move(info);
  begun_ = false;
  next_index_ = 0;
  bool stream_format = buf.stream_format();
  auto r = buf.for_each([&](lsn start, bytes_view data) -> result_t {
    pg::decode_context ctx = options_.context;
    ctx.in_stream = stream_format;
    auto m = decoder_.decode(data, ctx);
    if (!m) return fail(m.error().code, "held message: " + m.error().message());
    switch (pg::tag_of(*m)) {
      case 'O': {
        const auto& o = std::get<pg::origin>(*m);
        current_->origin = std::string(o.name);
        current_->origin_lsn = o.origin_lsn;
        return {};
      }
      case 'R': relations_.update(std::get<pg::relation>(*m)); return {};
      case 'Y': types_.update(std::get<pg::type>(*m)); return {};
      default: return deliver_change(start, *m);
    }
  });
  if (!r) {
    current_.reset();
    return r;
  }
  if (auto b = ensure_begun(); !b) return b;
  auto ec = handler_.on_commit(*current_);
  current_.reset();
  if (ec) return handler_failed(ec);
  return {};
}

result_t assembler::feed(lsn wal_start, bytes_view data) {
  pg::decode_context ctx = options_.context;
  ctx.in_stream = stream_xid_.has_value();
  auto decoded = decoder_.decode(data, ctx);
  if (!decoded)
    return fail(decoded.error().code, "cannot decode the pgoutput message at " + wal_start.to_string() + ": " +
                                          decoded.error().message());
  const pg::any_message& m = *decoded;
  const char tag = pg::tag_of(m);
  auto unexpected = [&](const char* where) {
    return fail(errc::unexpected_message,
                std::string(pg::name_of(tag)) + " at " + wal_start.to_string() + " " + where);
  };

  // A non-transactional logical message may come at any point; it is emitted at once.
  if (auto* msg = std::get_if<pg::message>(&m); msg && !msg->transactional) {
    if (auto ec = handler_.on_message(wal_start, *msg)) return handler_failed(ec);
    return {};
  }

  // Inside a stream block: hold the raw message under the top-level xid.
  if (stream_xid_) {
    if (tag == 'E') {
      stream_xid_.reset();
      return {};
    }
    std::optional<std::uint32_t> subxid;
    std::visit(
        [&](const auto& v) {
          if constexpr (requires { v.xid; })
            if constexpr (std::is_same_v<std::decay_t<decltype(v.xid)>, std::optional<std::uint32_t>>) subxid = v.xid;
        },
        m);
    switch (tag) {
      case 'R': case 'Y': case 'I': case 'U': case 'D': case 'T': case 'M': case 'O':
        return hold(*streams_.at(*stream_xid_), wal_start, data, subxid);
      default:
        return unexpected("inside a stream block");
    }
  }

  // Between Begin Prepare and Prepare: hold.
  if (preparing_) {
    switch (tag) {
      case 'R': case 'Y': case 'I': case 'U': case 'D': case 'T': case 'M': case 'O':
        return hold(*preparing_, wal_start, data, std::nullopt);
      case 'P': {
        const auto& p = std::get<pg::prepare>(m);
        std::string gid(p.gid);
        if (prepared_.count(gid)) return fail(errc::unexpected_message, "Prepare of gid '" + gid + "' that is already held");
        preparing_->info.xid = p.xid;
        preparing_->info.gid = gid;
        prepared_[gid] = std::move(preparing_);
        return {};
      }
      default:
        return unexpected("between Begin Prepare and Prepare");
    }
  }

  // Inside an ordinary transaction: deliver as it comes.
  if (current_) {
    switch (tag) {
      case 'C': {
        const auto& c = std::get<pg::commit>(m);
        if (c.commit_lsn != current_->commit_lsn)
          return fail(errc::unexpected_message, "Commit at " + c.commit_lsn.to_string() +
                                                    " does not match its Begin's final LSN " +
                                                    current_->commit_lsn.to_string());
        current_->end_lsn = c.end_lsn;
        current_->commit_time = c.commit_time;
        if (auto r = ensure_begun(); !r) return r;
        auto ec = handler_.on_commit(*current_);
        current_.reset();
        if (ec) return handler_failed(ec);
        return {};
      }
      case 'O': {
        const auto& o = std::get<pg::origin>(m);
        current_->origin = std::string(o.name);
        current_->origin_lsn = o.origin_lsn;
        return {};
      }
      case 'R': relations_.update(std::get<pg::relation>(m)); return {};
      case 'Y': types_.update(std::get<pg::type>(m)); return {};
      case 'I': case 'U': case 'D': case 'T': case 'M':
        return deliver_change(wal_start, m);
      default:
        return unexpected("inside a transaction");
    }
  }

  // Between transactions.
  switch (tag) {
    case 'B': {
      const auto& b = std::get<pg::begin>(m);
      current_.emplace();
      current_->xid = b.xid;
      current_->commit_lsn = b.final_lsn;
      current_->commit_time = b.commit_time;
      begun_ = false;
      next_index_ = 0;
      return {};
    }
    case 'R': relations_.update(std::get<pg::relation>(m)); return {};
    case 'Y': types_.update(std::get<pg::type>(m)); return {};
    case 'S': {
      const auto& s = std::get<pg::stream_start>(m);
      auto& buf = streams_[s.xid];
      if (!buf) {
        buf = std::make_unique<held_buffer>(memory_bytes_, true);
        buf->info.xid = s.xid;
      }
      stream_xid_ = s.xid;
      return {};
    }
    case 'c': {
      const auto& c = std::get<pg::stream_commit>(m);
      auto it = streams_.find(c.xid);
      if (it == streams_.end())
        return fail(errc::unexpected_message, "Stream Commit of xid " + xid_text(c.xid) + " that was never streamed");
      held_ptr buf = std::move(it->second);
      streams_.erase(it);
      return replay(*buf, committed(c.xid, c.commit_lsn, c.end_lsn, c.commit_time, true, {}));
    }
    case 'A': {
      const auto& a = std::get<pg::stream_abort>(m);
      auto it = streams_.find(a.xid);
      if (it == streams_.end()) return {};   // nothing was streamed for it
      if (a.subxid == a.xid) {
        streams_.erase(it);
        return {};
      }
      return it->second->truncate_subxact(a.subxid);
    }
    case 'b': {
      const auto& b = std::get<pg::begin_prepare>(m);
      preparing_ = std::make_unique<held_buffer>(memory_bytes_, false);
      preparing_->info.xid = b.xid;
      preparing_->info.gid = std::string(b.gid);
      return {};
    }
    case 'p': {
      const auto& p = std::get<pg::stream_prepare>(m);
      auto it = streams_.find(p.xid);
      std::string gid(p.gid);
      if (prepared_.count(gid)) return fail(errc::unexpected_message, "Stream Prepare of gid '" + gid + "' that is already held");
      held_ptr buf;
      if (it != streams_.end()) {
        buf = std::move(it->second);
        streams_.erase(it);
      } else {
        buf = std::make_unique<held_buffer>(memory_bytes_, true);
      }
      buf->info.xid = p.xid;
      buf->info.gid = gid;
      buf->info.streamed = true;
      prepared_[gid] = std::move(buf);
      return {};
    }
    case 'K': {
      const auto& k = std::get<pg::commit_prepared>(m);
      auto it = prepared_.find(std::string(k.gid));
      if (it == prepared_.end())
        return fail(errc::unexpected_message, "Commit Prepared of gid '" + std::string(k.gid) +
                                                  "' whose Prepare is not held here");
      held_ptr buf = std::move(it->second);
      prepared_.erase(it);
      return replay(*buf, committed(k.xid, k.commit_lsn, k.end_lsn, k.commit_time, buf->info.streamed, k.gid));
    }
    case 'r': {
      const auto& r = std::get<pg::rollback_prepared>(m);
      prepared_.erase(std::string(r.gid));
      return {};
    }
    default:
      return unexpected("outside a transaction");
  }
}

}  // namespace walgate::protocol
