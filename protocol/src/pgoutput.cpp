#include "walgate/protocol/pgoutput.hpp"

#include <atomic>

namespace walgate::protocol::pgoutput {

namespace {

std::optional<std::uint32_t> read_xid(cursor& c, const decode_context& ctx, const char* what) {
  if (!ctx.in_stream) return std::nullopt;
  return c.u32(what);
}

// TupleData: Int16 ncols | ncols × ('n' | 'u' | 't' Int32 len Byte(len) | 'b' Int32 len Byte(len))
void read_tuple(cursor& c, std::vector<tuple_column>& out, const char* what) {
  out.clear();
  std::uint16_t n = c.u16(what);
  if (!c.ok()) return;
  // Each column takes at least one byte: a count beyond what is left cannot be right, and is
  // refused before anything is sized by it.
  if (n > max_columns || n > c.remaining()) {
    c.fail(errc::length_out_of_range, what);
    return;
  }
  out.reserve(n);   // no-op on the steady path: the vector keeps its capacity
  for (std::uint16_t i = 0; i < n && c.ok(); ++i) {
    auto kind = static_cast<char>(c.u8("TupleData column kind"));
    switch (kind) {
      case 'n': out.push_back({column_kind::null, {}}); break;
      case 'u': out.push_back({column_kind::unchanged_toast, {}}); break;
      case 't':
      case 'b': {
        std::int32_t len = c.i32("TupleData value length");
        if (c.ok() && len < 0) {
          c.fail(errc::length_out_of_range, "TupleData value length");
          break;
        }
        bytes_view v = c.bytes(static_cast<std::size_t>(len), "TupleData value");
        out.push_back({static_cast<column_kind>(kind), v});
        break;
      }
      default:
        if (c.ok()) c.fail(errc::invalid_value, "TupleData column kind");
    }
  }
}

template <class T>
parse_result<any_message> done(cursor& c, T&& msg, const char* what) {
  c.expect_end(what);
  if (!c.ok()) return c.error();
  return any_message(std::forward<T>(msg));
}

void write_tuple(writer& w, tuple_view t) {
  w.u16(static_cast<std::uint16_t>(t.size()));
  for (const auto& col : t) {
    w.u8(static_cast<std::uint8_t>(col.kind));
    if (col.kind == column_kind::text || col.kind == column_kind::binary)
      w.i32(static_cast<std::int32_t>(col.value.size())).raw(col.value);
  }
}

void write_xid(writer& w, const std::optional<std::uint32_t>& xid, const decode_context& ctx) {
  if (ctx.in_stream) w.u32(xid.value_or(0));
}

}  // namespace

parse_result<any_message> decoder::decode(bytes_view data, const decode_context& ctx) {
  cursor c(data);
  auto tag = static_cast<char>(c.u8("pgoutput message tag"));
  if (!c.ok()) return c.error();
  const bool v2 = ctx.proto_version >= 2, v3 = ctx.proto_version >= 3;
  switch (tag) {
    case 'B': {
      begin m;
      m.final_lsn = lsn{c.u64("Begin final_lsn")};
      m.commit_time = c.i64("Begin commit_ts");
      m.xid = c.u32("Begin xid");
      return done(c, m, "Begin");
    }
    case 'C': {
      commit m;
      m.flags = c.u8("Commit flags");
      m.commit_lsn = lsn{c.u64("Commit commit_lsn")};
      m.end_lsn = lsn{c.u64("Commit end_lsn")};
      m.commit_time = c.i64("Commit commit_ts");
      return done(c, m, "Commit");
    }
    case 'O': {
      origin m;
      m.origin_lsn = lsn{c.u64("Origin lsn")};
      m.name = c.cstring("Origin name");
      return done(c, m, "Origin");
    }
    case 'R': {
      relation m;
      m.xid = read_xid(c, ctx, "Relation xid");
      m.oid = c.u32("Relation oid");
      m.nspname = c.cstring("Relation namespace");
      m.relname = c.cstring("Relation name");
      m.replica_identity = static_cast<char>(c.u8("Relation replica identity"));
      if (c.ok() && m.replica_identity != 'd' && m.replica_identity != 'n' && m.replica_identity != 'f' &&
          m.replica_identity != 'i')
        c.fail(errc::invalid_value, "Relation replica identity");
      std::uint16_t n = c.u16("Relation column count");
      if (c.ok() && (n > max_columns || n > c.remaining())) c.fail(errc::length_out_of_range, "Relation column count");
      relation_columns_.clear();
      if (c.ok()) relation_columns_.reserve(n);
      for (std::uint16_t i = 0; i < n && c.ok(); ++i) {
        relation_column col;
        col.flags = c.u8("Relation column flags");
        col.name = c.cstring("Relation column name");
        col.type_oid = c.u32("Relation column type");
        col.type_modifier = c.i32("Relation column typmod");
        relation_columns_.push_back(col);
      }
      m.columns = relation_columns_;
      return done(c, m, "Relation");
    }
    case 'Y': {
      type m;
      m.xid = read_xid(c, ctx, "Type xid");
      m.oid = c.u32("Type oid");
      m.nspname = c.cstring("Type namespace");
      m.name = c.cstring("Type name");
      return done(c, m, "Type");
    }
    case 'I': {
      insert m;
      m.xid = read_xid(c, ctx, "Insert xid");
      m.relation_oid = c.u32("Insert relation");
      if (c.u8("Insert tuple marker") != 'N' && c.ok()) c.fail(errc::invalid_value, "Insert tuple marker");
      read_tuple(c, new_columns_, "Insert new tuple");
      m.new_tuple = new_columns_;
      return done(c, m, "Insert");
    }
    case 'U': {
      update m;
      m.xid = read_xid(c, ctx, "Update xid");
      m.relation_oid = c.u32("Update relation");
      auto marker = static_cast<char>(c.u8("Update tuple marker"));
      old_columns_.clear();
      if (c.ok() && (marker == 'K' || marker == 'O')) {
        m.old_kind = marker;
        read_tuple(c, old_columns_, "Update old tuple");
        marker = static_cast<char>(c.u8("Update tuple marker"));
      }
      if (c.ok() && marker != 'N') c.fail(errc::invalid_value, "Update tuple marker");
      read_tuple(c, new_columns_, "Update new tuple");
      m.old_tuple = old_columns_;
      m.new_tuple = new_columns_;
      return done(c, m, "Update");
    }
    case 'D': {
      delete_ m;
      m.xid = read_xid(c, ctx, "Delete xid");
      m.relation_oid = c.u32("Delete relation");
      m.old_kind = static_cast<char>(c.u8("Delete tuple marker"));
      if (c.ok() && m.old_kind != 'K' && m.old_kind != 'O') c.fail(errc::invalid_value, "Delete tuple marker");
      read_tuple(c, old_columns_, "Delete old tuple");
      m.old_tuple = old_columns_;
      return done(c, m, "Delete");
    }
    case 'T': {
      truncate m;
      m.xid = read_xid(c, ctx, "Truncate xid");
      std::uint32_t n = c.u32("Truncate relation count");
      m.options = c.u8("Truncate options");
      if (c.ok() && (m.options & ~std::uint8_t{3})) c.fail(errc::invalid_value, "Truncate options");
      if (c.ok() && n > c.remaining() / 4) c.fail(errc::length_out_of_range, "Truncate relation count");
      oids_.clear();
      if (c.ok()) oids_.reserve(n);
      for (std::uint32_t i = 0; i < n && c.ok(); ++i) oids_.push_back(c.u32("Truncate relation"));
      m.relation_oids = oids_;
      return done(c, m, "Truncate");
    }
    case 'M': {
      message m;
      m.xid = read_xid(c, ctx, "Message xid");
      std::uint8_t flags = c.u8("Message flags");
      if (c.ok() && flags > 1) c.fail(errc::invalid_value, "Message flags");
      m.transactional = flags == 1;
      m.message_lsn = lsn{c.u64("Message lsn")};
      m.prefix = c.cstring("Message prefix");
      std::int32_t len = c.i32("Message length");
      if (c.ok() && len < 0) c.fail(errc::length_out_of_range, "Message length");
      m.content = c.bytes(static_cast<std::size_t>(len), "Message content");
      return done(c, m, "Message");
    }
    case 'S': {
      if (!v2) break;
      stream_start m;
      m.xid = c.u32("Stream Start xid");
      std::uint8_t first = c.u8("Stream Start first segment");
      if (c.ok() && first > 1) c.fail(errc::invalid_value, "Stream Start first segment");
      m.first_segment = first == 1;
      return done(c, m, "Stream Start");
    }
    case 'E': {
      if (!v2) break;
      return done(c, stream_stop{}, "Stream Stop");
    }
    case 'c': {
      if (!v2) break;
      stream_commit m;
      m.xid = c.u32("Stream Commit xid");
      m.flags = c.u8("Stream Commit flags");
      m.commit_lsn = lsn{c.u64("Stream Commit commit_lsn")};
      m.end_lsn = lsn{c.u64("Stream Commit end_lsn")};
      m.commit_time = c.i64("Stream Commit commit_ts");
      return done(c, m, "Stream Commit");
    }
    case 'A': {
      if (!v2) break;
      stream_abort m;
      m.xid = c.u32("Stream Abort xid");
      m.subxid = c.u32("Stream Abort subxid");
      if (ctx.stream_abort_info) {
        m.abort_lsn = lsn{c.u64("Stream Abort abort_lsn")};
        m.abort_time = c.i64("Stream Abort abort_ts");
      }
      return done(c, m, "Stream Abort");
    }
    case 'b': {
      if (!v3) break;
      begin_prepare m;
      m.prepare_lsn = lsn{c.u64("Begin Prepare prepare_lsn")};
      m.end_lsn = lsn{c.u64("Begin Prepare end_lsn")};
      m.prepare_time = c.i64("Begin Prepare prepare_ts");
      m.xid = c.u32("Begin Prepare xid");
      m.gid = c.cstring("Begin Prepare gid");
      return done(c, m, "Begin Prepare");
    }
    case 'P':
    case 'p': {
      if (!v3) break;
      prepare m;
      const char* what = tag == 'P' ? "Prepare" : "Stream Prepare";
      m.flags = c.u8(what);
      m.prepare_lsn = lsn{c.u64(what)};
      m.end_lsn = lsn{c.u64(what)};
      m.prepare_time = c.i64(what);
      m.xid = c.u32(what);
      m.gid = c.cstring(what);
      if (tag == 'P') return done(c, m, what);
      return done(c, stream_prepare{m}, what);
    }
    case 'K': {
      if (!v3) break;
      commit_prepared m;
      m.flags = c.u8("Commit Prepared flags");
      m.commit_lsn = lsn{c.u64("Commit Prepared commit_lsn")};
      m.end_lsn = lsn{c.u64("Commit Prepared end_lsn")};
      m.commit_time = c.i64("Commit Prepared commit_ts");
      m.xid = c.u32("Commit Prepared xid");
      m.gid = c.cstring("Commit Prepared gid");
      return done(c, m, "Commit Prepared");
    }
    case 'r': {
      if (!v3) break;
      rollback_prepared m;
      m.flags = c.u8("Rollback Prepared flags");
      m.prepare_end_lsn = lsn{c.u64("Rollback Prepared prepare_end_lsn")};
      m.rollback_end_lsn = lsn{c.u64("Rollback Prepared rollback_end_lsn")};
      m.prepare_time = c.i64("Rollback Prepared prepare_ts");
      m.rollback_time = c.i64("Rollback Prepared rollback_ts");
      m.xid = c.u32("Rollback Prepared xid");
      m.gid = c.cstring("Rollback Prepared gid");
      return done(c, m, "Rollback Prepared");
    }
    default:
      break;
  }
  // An unknown tag, or one that the negotiated protocol version does not have.
  return decode_error{errc::unknown_message, "pgoutput message tag", 0};
}

char tag_of(const any_message& m) {
  static constexpr char tags[] = {'B', 'C', 'O', 'R', 'Y', 'I', 'U', 'D', 'T', 'M',
                                  'S', 'E', 'c', 'A', 'b', 'P', 'p', 'K', 'r'};
  return tags[m.index()];
}

const char* name_of(char tag) {
  switch (tag) {
    case 'B': return "Begin";
    case 'C': return "Commit";
    case 'O': return "Origin";
    case 'R': return "Relation";
    case 'Y': return "Type";
    case 'I': return "Insert";
    case 'U': return "Update";
    case 'D': return "Delete";
    case 'T': return "Truncate";
    case 'M': return "Message";
    case 'S': return "Stream Start";
    case 'E': return "Stream Stop";
    case 'c': return "Stream Commit";
    case 'A': return "Stream Abort";
    case 'b': return "Begin Prepare";
    case 'P': return "Prepare";
    case 'p': return "Stream Prepare";
    case 'K': return "Commit Prepared";
    case 'r': return "Rollback Prepared";
    default: return "unknown";
  }
}

std::string encode(const any_message& any, const decode_context& ctx) {
  writer w;
  w.u8(static_cast<std::uint8_t>(tag_of(any)));
  auto write_prepare = [&](const prepare& m) {
    w.u8(m.flags).u64(m.prepare_lsn.value).u64(m.end_lsn.value).i64(m.prepare_time).u32(m.xid).cstring(m.gid);
  };
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, begin>) {
          w.u64(m.final_lsn.value).i64(m.commit_time).u32(m.xid);
        } else if constexpr (std::is_same_v<T, commit>) {
          w.u8(m.flags).u64(m.commit_lsn.value).u64(m.end_lsn.value).i64(m.commit_time);
        } else if constexpr (std::is_same_v<T, origin>) {
          w.u64(m.origin_lsn.value).cstring(m.name);
        } else if constexpr (std::is_same_v<T, relation>) {
          write_xid(w, m.xid, ctx);
          w.u32(m.oid).cstring(m.nspname).cstring(m.relname).u8(static_cast<std::uint8_t>(m.replica_identity));
          w.u16(static_cast<std::uint16_t>(m.columns.size()));
          for (const auto& c : m.columns) w.u8(c.flags).cstring(c.name).u32(c.type_oid).i32(c.type_modifier);
        } else if constexpr (std::is_same_v<T, type>) {
          write_xid(w, m.xid, ctx);
          w.u32(m.oid).cstring(m.nspname).cstring(m.name);
        } else if constexpr (std::is_same_v<T, insert>) {
          write_xid(w, m.xid, ctx);
          w.u32(m.relation_oid).u8('N');
          write_tuple(w, m.new_tuple);
        } else if constexpr (std::is_same_v<T, update>) {
          write_xid(w, m.xid, ctx);
          w.u32(m.relation_oid);
          if (m.old_kind) {
            w.u8(static_cast<std::uint8_t>(m.old_kind));
            write_tuple(w, m.old_tuple);
          }
          w.u8('N');
          write_tuple(w, m.new_tuple);
        } else if constexpr (std::is_same_v<T, delete_>) {
          write_xid(w, m.xid, ctx);
          w.u32(m.relation_oid).u8(static_cast<std::uint8_t>(m.old_kind));
          write_tuple(w, m.old_tuple);
        } else if constexpr (std::is_same_v<T, truncate>) {
          write_xid(w, m.xid, ctx);
          w.u32(static_cast<std::uint32_t>(m.relation_oids.size())).u8(m.options);
          for (auto oid : m.relation_oids) w.u32(oid);
        } else if constexpr (std::is_same_v<T, message>) {
          write_xid(w, m.xid, ctx);
          w.u8(m.transactional ? 1 : 0).u64(m.message_lsn.value).cstring(m.prefix);
          w.i32(static_cast<std::int32_t>(m.content.size())).raw(m.content);
        } else if constexpr (std::is_same_v<T, stream_start>) {
          w.u32(m.xid).u8(m.first_segment ? 1 : 0);
        } else if constexpr (std::is_same_v<T, stream_stop>) {
        } else if constexpr (std::is_same_v<T, stream_commit>) {
          w.u32(m.xid).u8(m.flags).u64(m.commit_lsn.value).u64(m.end_lsn.value).i64(m.commit_time);
        } else if constexpr (std::is_same_v<T, stream_abort>) {
          w.u32(m.xid).u32(m.subxid);
          if (ctx.stream_abort_info) w.u64(m.abort_lsn.value_or(lsn{}).value).i64(m.abort_time.value_or(0));
        } else if constexpr (std::is_same_v<T, begin_prepare>) {
          w.u64(m.prepare_lsn.value).u64(m.end_lsn.value).i64(m.prepare_time).u32(m.xid).cstring(m.gid);
        } else if constexpr (std::is_same_v<T, prepare> || std::is_same_v<T, stream_prepare>) {
          write_prepare(m);
        } else if constexpr (std::is_same_v<T, commit_prepared>) {
          w.u8(m.flags).u64(m.commit_lsn.value).u64(m.end_lsn.value).i64(m.commit_time).u32(m.xid).cstring(m.gid);
        } else if constexpr (std::is_same_v<T, rollback_prepared>) {
          w.u8(m.flags).u64(m.prepare_end_lsn.value).u64(m.rollback_end_lsn.value).i64(m.prepare_time);
          w.i64(m.rollback_time).u32(m.xid).cstring(m.gid);
        }
      },
      any);
  return w.take();
}

std::uint64_t next_generation() {
  static std::atomic<std::uint64_t> counter{0};
  return ++counter;
}

const cached_relation& relation_cache::update(const relation& r) {
  cached_relation c;
  c.generation = next_generation();
  c.oid = r.oid;
  c.nspname = r.nspname.empty() ? "pg_catalog" : std::string(r.nspname);   // proto.c: "" means pg_catalog
  c.relname = std::string(r.relname);
  c.replica_identity = r.replica_identity;
  c.columns.reserve(r.columns.size());
  for (const auto& col : r.columns)
    c.columns.push_back({std::string(col.name), col.type_oid, col.type_modifier, col.key()});
  auto& slot = relations_[r.oid];
  slot = std::move(c);
  return slot;
}

const cached_relation* relation_cache::find(std::uint32_t oid) const {
  auto it = relations_.find(oid);
  return it == relations_.end() ? nullptr : &it->second;
}

const cached_type& type_cache::update(const type& t) {
  generation_ = next_generation();
  auto& slot = types_[t.oid];
  slot = cached_type{t.oid, t.nspname.empty() ? "pg_catalog" : std::string(t.nspname), std::string(t.name)};
  return slot;
}

const cached_type* type_cache::find(std::uint32_t oid) const {
  auto it = types_.find(oid);
  return it == types_.end() ? nullptr : &it->second;
}

}  // namespace walgate::protocol::pgoutput
