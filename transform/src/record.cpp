#include "walgate/transform/record.hpp"

#include "walgate/transform/pg_types.hpp"

namespace walgate::transform {

namespace pg = protocol::pgoutput;
using protocol::cursor;
using protocol::writer;

namespace {
// 2: a message's prefix is a Str32 (PostgreSQL puts no bound on it); 1 (read too): a Str16.
constexpr std::uint8_t record_version = 2;

void str16(writer& w, std::string_view s) {
  w.u16(static_cast<std::uint16_t>(std::min<std::size_t>(s.size(), 0xffff))).raw(s.substr(0, 0xffff));
}
std::string_view read_str16(cursor& c, const char* what) { return protocol::as_string_view(c.bytes(c.u16(what), what)); }

void tuple(writer& w, pg::tuple_view t) {
  w.u16(static_cast<std::uint16_t>(t.size()));
  for (const auto& col : t) {
    w.u8(static_cast<std::uint8_t>(col.kind));
    if (col.kind == pg::column_kind::text || col.kind == pg::column_kind::binary)
      w.u32(static_cast<std::uint32_t>(col.value.size())).raw(col.value);
  }
}

void read_tuple(cursor& c, std::vector<pg::tuple_column>& out) {
  std::uint16_t n = c.u16("record tuple count");
  if (c.ok() && (n > pg::max_columns || n > c.remaining())) c.fail(protocol::errc::length_out_of_range, "record tuple count");
  for (std::uint16_t i = 0; i < n && c.ok(); ++i) {
    auto kind = static_cast<pg::column_kind>(c.u8("record column kind"));
    if (kind == pg::column_kind::text || kind == pg::column_kind::binary) {
      std::uint32_t len = c.u32("record value length");
      out.push_back({kind, c.bytes(len, "record value")});
    } else if (kind == pg::column_kind::null || kind == pg::column_kind::unchanged_toast) {
      out.push_back({kind, {}});
    } else {
      c.fail(protocol::errc::invalid_value, "record column kind");
    }
  }
}
}  // namespace

// Byte1 version | Byte1 op | Int64 commit_lsn | Int64 end_lsn | Int64 commit_time | Int32 xid |
// Int64 change_lsn | Int32 index | Str16 origin | Int64 origin_lsn | Str16 gid | Byte1 flags (1 streamed,
//   2 the last row of a snapshot, 4 a truncate's CASCADE, 8 its RESTART IDENTITY) |
// relation: Int32 oid | Str16 nsp | Str16 name | Byte1 identity | Int16 n | n × (Byte1 key | Str16 name |
//           Int32 type | Int32 typmod) |
// Int16 ntypes | ntypes × (Int32 oid | Str16 nsp | Str16 name) |
// Byte1 before kind | tuple before | tuple after |
// message: Byte1 present [| Byte1 transactional | Int64 lsn | Str32 prefix | Int32 len | bytes]
namespace {
void write_header(writer& w, const change& c) {
  const auto& t = *c.txn;
  w.u8(record_version).u8(static_cast<std::uint8_t>(c.kind));
  w.u64(t.commit_lsn.value).u64(t.end_lsn.value).i64(t.commit_time).u32(t.xid);
  w.u64(c.change_lsn.value).u32(c.index);
  str16(w, t.origin.value_or(""));
  w.u64(t.origin_lsn.value);
  str16(w, t.gid);
  w.u8((t.streamed ? 1 : 0) | (c.snapshot_last ? 2 : 0) | ((c.truncate_options & 1) ? 4 : 0) |
       ((c.truncate_options & 2) ? 8 : 0));
}

void write_relation(writer& w, const change& c) {
  if (c.relation) {
    const auto& r = *c.relation;
    w.u32(r.oid);
    str16(w, r.nspname);
    str16(w, r.relname);
    w.u8(static_cast<std::uint8_t>(r.replica_identity));
    w.u16(static_cast<std::uint16_t>(r.columns.size()));
    std::vector<std::uint32_t> custom;
    for (const auto& col : r.columns) {
      w.u8(col.key ? 1 : 0);
      str16(w, col.name);
      w.u32(col.type_oid).i32(col.type_modifier);
      if (builtin_type_name(col.type_oid, -1).empty() && c.types && c.types->find(col.type_oid)) custom.push_back(col.type_oid);
    }
    w.u16(static_cast<std::uint16_t>(custom.size()));
    for (auto oid : custom) {
      const auto* ty = c.types->find(oid);
      w.u32(oid);
      str16(w, ty->nspname);
      str16(w, ty->name);
    }
  } else {
    w.u32(0);
    str16(w, "");
    str16(w, "");
    w.u8('d').u16(0).u16(0);
  }
}

void write_rest(writer& w, const change& c) {
  w.u8(static_cast<std::uint8_t>(c.before_kind));
  tuple(w, c.before);
  tuple(w, c.after);
  if (c.message) {
    w.u8(1).u8(c.message->transactional ? 1 : 0).u64(c.message->message_lsn.value);
    w.u32(static_cast<std::uint32_t>(c.message->prefix.size())).raw(c.message->prefix);
    w.u32(static_cast<std::uint32_t>(c.message->content.size())).raw(c.message->content);
  } else {
    w.u8(0);
  }
}
}  // namespace

void write_record(std::string& out, const change& c) {
  writer w(out);
  write_header(w, c);
  write_relation(w, c);
  write_rest(w, c);
}

void record_writer::write(std::string& out, const change& c) {
  writer w(out);
  write_header(w, c);
  std::uint64_t types_generation = c.types ? c.types->generation() : 0;
  if (!c.relation || c.relation->generation == 0) {
    write_relation(w, c);
  } else {
    if (blocks_.size() >= 4096 && !blocks_.contains(c.relation)) blocks_.clear();   // relations come and go
    auto& b = blocks_[c.relation];
    if (b.relation_generation != c.relation->generation || b.types_generation != types_generation) {
      b.bytes.clear();
      writer bw(b.bytes);
      write_relation(bw, c);
      b.relation_generation = c.relation->generation;
      b.types_generation = types_generation;
    }
    w.raw(b.bytes);
  }
  write_rest(w, c);
}

bool place_record(std::span<char> record, std::uint32_t index, bool snapshot_last) {
  cursor c(protocol::bytes_view(reinterpret_cast<const std::byte*>(record.data()), record.size()));
  const std::uint8_t version = c.u8();
  c.u8();
  c.u64();
  c.u64();
  c.i64();
  c.u32();
  c.u64();
  const std::size_t index_at = c.offset();
  c.u32();
  read_str16(c, "record origin");
  c.u64();
  read_str16(c, "record gid");
  const std::size_t flags_at = c.offset();
  c.u8();
  if (!c.ok() || version != record_version) return false;
  for (int i = 0; i < 4; ++i) record[index_at + i] = static_cast<char>((index >> (24 - 8 * i)) & 0xff);
  auto& flags = reinterpret_cast<std::uint8_t&>(record[flags_at]);
  flags = static_cast<std::uint8_t>(snapshot_last ? flags | 2 : flags & ~2);
  return true;
}

boost::system::result<std::unique_ptr<record_view>, protocol::decode_error> read_record(protocol::bytes_view bytes) {
  auto v = std::make_unique<record_view>();
  auto r = read_record(bytes, *v);
  if (!r) return r.error();
  return v;
}

boost::system::result<void, protocol::decode_error> read_record(protocol::bytes_view bytes, record_view& into) {
  record_view* v = &into;
  v->txn_ = protocol::transaction_info{};
  v->before_.clear();
  v->after_.clear();
  if (v->types_.size()) v->types_.clear();
  v->message_ = protocol::pgoutput::message{};
  v->change_ = change{};
  cursor c(bytes);
  const std::uint8_t version = c.u8("record version");
  if (c.ok() && version != record_version && version != 1) c.fail(protocol::errc::invalid_value, "record version");
  auto kind = static_cast<op>(c.u8("record op"));
  if (c.ok() && kind != op::insert && kind != op::update && kind != op::delete_ && kind != op::truncate &&
      kind != op::read && kind != op::message)
    c.fail(protocol::errc::invalid_value, "record op");
  auto& t = v->txn_;
  t.commit_lsn = protocol::lsn{c.u64()};
  t.end_lsn = protocol::lsn{c.u64()};
  t.commit_time = c.i64();
  t.xid = c.u32();
  protocol::lsn change_lsn{c.u64()};
  std::uint32_t index = c.u32();
  auto origin = read_str16(c, "record origin");
  if (!origin.empty()) t.origin = std::string(origin);
  t.origin_lsn = protocol::lsn{c.u64()};
  t.gid.assign(read_str16(c, "record gid"));
  const std::uint8_t flags = c.u8();
  t.streamed = (flags & 1) != 0;
  const bool snapshot_last = (flags & 2) != 0;
  auto& r = v->relation_;
  r.oid = c.u32("record relation");
  r.nspname.assign(read_str16(c, "record schema"));
  r.relname.assign(read_str16(c, "record table"));
  r.replica_identity = static_cast<char>(c.u8());
  std::uint16_t ncols = c.u16("record column count");
  if (c.ok() && (ncols > pg::max_columns || ncols > c.remaining())) c.fail(protocol::errc::length_out_of_range, "record column count");
  if (c.ok()) r.columns.resize(ncols);   // kept column names keep their storage
  for (std::uint16_t i = 0; i < ncols && c.ok(); ++i) {
    auto& col = r.columns[i];
    col.key = c.u8() == 1;
    col.name.assign(read_str16(c, "record column name"));
    col.type_oid = c.u32();
    col.type_modifier = c.i32();
  }
  std::uint16_t ntypes = c.u16("record type count");
  for (std::uint16_t i = 0; i < ntypes && c.ok(); ++i) {
    pg::type ty;
    ty.oid = c.u32();
    ty.nspname = read_str16(c, "record type schema");
    ty.name = read_str16(c, "record type name");
    if (c.ok()) v->types_.update(ty);
  }
  char before_kind = static_cast<char>(c.u8());
  read_tuple(c, v->before_);
  read_tuple(c, v->after_);
  bool has_message = c.u8() == 1;
  if (has_message) {
    auto& m = v->message_;
    m.transactional = c.u8() == 1;
    m.message_lsn = protocol::lsn{c.u64()};
    m.prefix = version == 1 ? read_str16(c, "record message prefix")
                            : protocol::as_string_view(c.bytes(c.u32("record message prefix length"), "record message prefix"));
    m.content = c.bytes(c.u32("record message length"), "record message content");
  }
  c.expect_end("record");
  // What the encoders rely on: a message event has its message, every other event its relation.
  if (c.ok() && (kind == op::message) != has_message) c.fail(protocol::errc::invalid_value, "record message");
  if (c.ok() && kind != op::message && !(r.oid || !r.relname.empty()))
    c.fail(protocol::errc::invalid_value, "record relation");
  if (!c.ok()) {
    r.columns.clear();
    return c.error();
  }
  auto& ch = v->change_;
  ch.kind = kind;
  ch.txn = &v->txn_;
  ch.change_lsn = change_lsn;
  ch.index = index;
  ch.relation = r.oid || !r.relname.empty() ? &v->relation_ : nullptr;
  ch.before_kind = before_kind;
  ch.before = v->before_;
  ch.after = v->after_;
  ch.message = has_message ? &v->message_ : nullptr;
  ch.types = &v->types_;
  ch.snapshot_last = snapshot_last;
  ch.truncate_options = static_cast<std::uint8_t>(((flags & 4) ? 1 : 0) | ((flags & 8) ? 2 : 0));
  return {};
}

}  // namespace walgate::transform
