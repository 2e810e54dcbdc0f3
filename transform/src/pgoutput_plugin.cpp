// pgoutput as an output_plugin: its option parsing (parse_output_parameters, pgoutput_startup's
// checks) and its messages (proto.c's logicalrep_write_*), from what the log kept of pgoutput's
// own stream. See the header for what is assumed.
#include "walgate/transform/pgoutput_plugin.hpp"

#include "walgate/protocol/pgoutput.hpp"

#include <cerrno>
#include <cstdlib>
#include <map>
#include <set>
#include <strings.h>

namespace walgate::transform {

namespace pg = protocol::pgoutput;

bool split_identifier_list(std::string_view s, std::vector<std::string>& out) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  std::size_t p = 0;
  while (p < s.size() && space(s[p])) ++p;
  if (p == s.size()) return true;   // (an empty list)
  for (;;) {
    std::string name;
    if (s[p] == '"') {   // quoted: "" is a quote, no lower-casing
      ++p;
      for (;;) {
        if (p >= s.size()) return false;   // (no closing quote)
        if (s[p] == '"') {
          if (p + 1 < s.size() && s[p + 1] == '"') {
            name.push_back('"');
            p += 2;
            continue;
          }
          ++p;
          break;
        }
        name.push_back(s[p++]);
      }
    } else {   // unquoted: up to a separator or whitespace, lower-cased
      const std::size_t start = p;
      while (p < s.size() && s[p] != ',' && !space(s[p])) {
        const char ch = s[p++];
        name.push_back(ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch - 'A' + 'a') : ch);
      }
      if (p == start) return false;   // (an empty name)
    }
    if (name.size() > 63) name.resize(63);   // (NAMEDATALEN - 1; PostgreSQL cuts at a character boundary)
    while (p < s.size() && space(s[p])) ++p;
    out.push_back(std::move(name));
    if (p == s.size()) return true;
    if (s[p] != ',') return false;
    ++p;
    while (p < s.size() && space(s[p])) ++p;
  }
}

namespace {

/// defGetBoolean(): true/false/on/off/1/0 (and a missing value: true), case-insensitive;
/// nullopt when none of them.
std::optional<bool> def_boolean(const std::optional<std::string>& v) {
  if (!v) return true;
  const char* s = v->c_str();
  if (!strcasecmp(s, "true") || !strcasecmp(s, "on") || *v == "1") return true;
  if (!strcasecmp(s, "false") || !strcasecmp(s, "off") || *v == "0") return false;
  return std::nullopt;
}

class pgoutput_plugin final : public output_plugin {
 public:
  pgoutput_plugin(pgoutput_options o, plugin_sink sink) : output_plugin(std::move(sink)), o_(std::move(o)) {}

  // (pgoutput from 15 sends BEGIN with the transaction's first message, and nothing for a
  // transaction that has none to send: a message-only one without `messages`)
  void begin(const plugin_transaction& t, protocol::lsn first) override {
    skipped_ = o_.origin_none && t.has_origin;
    begun_ = false;
    txn_ = &t;
    first_ = first;
    if (!skipped_ && !o_.lazy_begin) open_transaction();   // (before 15: every transaction's BEGIN at once)
  }

  void change(const plugin_transaction&, const transform::change& c) override {
    if (skipped_) return;
    if (c.kind == op::message) {
      if (c.message) message_of(*c.message, c.change_lsn);
      return;
    }
    if (!c.relation) return;
    describe(c, *c.relation, c.change_lsn);
    const std::uint32_t oid = c.relation->oid;
    switch (c.kind) {
      case op::insert: emit(c.change_lsn, pg::insert{std::nullopt, oid, c.after}); break;
      case op::update: emit(c.change_lsn, pg::update{std::nullopt, oid, c.before_kind, c.before, c.after}); break;
      case op::delete_: emit(c.change_lsn, pg::delete_{std::nullopt, oid, c.before_kind ? c.before_kind : 'K', c.before}); break;
      default: break;
    }
  }

  void truncate(const plugin_transaction&, const std::vector<const pg::cached_relation*>& relations, std::uint8_t options,
                protocol::lsn at) override {
    if (skipped_ || relations.empty()) return;
    std::vector<std::uint32_t> oids;
    for (const auto* r : relations) {
      describe_relation(*r, nullptr, at);
      oids.push_back(r->oid);
    }
    emit(at, pg::truncate{std::nullopt, options, oids});
  }

  void commit(const plugin_transaction& t) override {
    if (!skipped_ && begun_) emit(t.end_lsn, pg::commit{0, t.commit_lsn, t.end_lsn, t.commit_time});
    skipped_ = begun_ = false;
    txn_ = nullptr;
  }

  void message(const transform::change& c) override {
    txn_ = nullptr;   // (between transactions: no BEGIN for it)
    if (c.message && !(o_.origin_none && c.txn && c.txn->origin)) message_of(*c.message, c.change_lsn);
  }

 private:
  void emit(protocol::lsn at, const pg::any_message& m) {
    if (txn_ && !begun_) open_transaction();
    out_ = pg::encode(m, ctx_);
    sink_(at, out_);
  }

  void open_transaction() {
    {
      begun_ = true;
      out_ = pg::encode(pg::begin{txn_->commit_lsn, txn_->commit_time, txn_->xid}, ctx_);
      sink_(first_, out_);
      // (pgoutput's send_repl_origin: the origin right after BEGIN, when the transaction has one)
      if (txn_->has_origin) {
        out_ = pg::encode(pg::origin{txn_->origin_lsn, txn_->origin}, ctx_);
        sink_(first_, out_);
      }
    }
  }

  void message_of(const pg::message& m, protocol::lsn at) {
    if (!o_.messages) return;
    pg::message copy = m;
    copy.xid.reset();   // (an xid only inside a streamed transaction)
    emit(at, copy);
  }

  /// The Type messages of its non-built-in column types and the Relation message, before a
  /// relation's first change on this connection or after its definition changed.
  void describe(const transform::change& c, const pg::cached_relation& r, protocol::lsn at) { describe_relation(r, c.types, at); }

  void describe_relation(const pg::cached_relation& r, const pg::type_cache* types, protocol::lsn at) {
    auto it = described_.find(r.oid);
    if (it != described_.end() && same(it->second, r)) return;
    for (const auto& col : r.columns) {
      if (col.type_oid < 10000) continue;   // (FirstGenbkiObjectId: built-in types need no description)
      const pg::cached_type* t = types ? types->find(col.type_oid) : nullptr;
      if (t) emit(at, pg::type{std::nullopt, t->oid, t->nspname, t->name});
    }
    std::vector<pg::relation_column> cols;
    cols.reserve(r.columns.size());
    for (const auto& col : r.columns)
      cols.push_back(pg::relation_column{static_cast<std::uint8_t>(col.key ? 1 : 0), col.name, col.type_oid, col.type_modifier});
    emit(at, pg::relation{std::nullopt, r.oid, r.nspname, r.relname, r.replica_identity, cols});
    described_[r.oid] = r;
  }

  static bool same(const pg::cached_relation& a, const pg::cached_relation& b) {
    if (a.nspname != b.nspname || a.relname != b.relname || a.replica_identity != b.replica_identity ||
        a.columns.size() != b.columns.size())
      return false;
    for (std::size_t i = 0; i < a.columns.size(); ++i) {
      const auto &x = a.columns[i], &y = b.columns[i];
      if (x.name != y.name || x.type_oid != y.type_oid || x.type_modifier != y.type_modifier || x.key != y.key) return false;
    }
    return true;
  }

  pgoutput_options o_;
  pg::decode_context ctx_;
  bool skipped_ = false;
  bool begun_ = false;                          ///< BEGIN sent for the open transaction
  const plugin_transaction* txn_ = nullptr;     ///< the open transaction (the caller's, alive until commit)
  protocol::lsn first_;
  std::string out_;
  std::map<std::uint32_t, pg::cached_relation> described_;
};

}  // namespace

pgoutput_parse parse_pgoutput_options(const plugin_options& options, const plugin_context& context) {
  pgoutput_parse r;
  auto& o = r.options;
  auto fail = [&](const char* sqlstate, std::string text) {
    r.sqlstate = sqlstate;
    r.error = std::move(text);
    return r;
  };
  std::set<std::string> given;
  bool proto_given = false, names_given = false;
  for (const auto& [name, value] : options) {
    // (each version's pgoutput knows the options of its own: binary, messages and streaming from
    // 14, two_phase from 15, origin from 16)
    const int major = context.server_major;
    const bool known = name == "proto_version" || name == "publication_names" ||
                       ((name == "binary" || name == "messages" || name == "streaming") && major >= 14) ||
                       (name == "two_phase" && major >= 15) || (name == "origin" && major >= 16);
    if (!known) return fail("XX000", "unrecognized pgoutput option: " + name);
    if (!given.insert(name).second) return fail("42601", "conflicting or redundant options");
    if (name == "proto_version") {
      proto_given = true;
      const std::string v = value.value_or("");
      errno = 0;
      char* end = nullptr;
      const unsigned long long parsed = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || errno != 0 || *end != '\0') return fail("22023", "invalid proto_version");
      if (parsed > 0xffffffffULL) return fail("22023", "proto_version \"" + v + "\" out of range");
      o.proto_version = static_cast<std::uint32_t>(parsed);
    } else if (name == "publication_names") {
      names_given = true;
      if (!split_identifier_list(value.value_or(""), o.publication_names)) return fail("42602", "invalid publication_names syntax");
    } else if (name == "streaming") {
      const std::string v = value.value_or("on");
      if (auto b = def_boolean(value)) o.streaming = *b ? "on" : "off";
      else if (context.server_major >= 16 && strcasecmp(v.c_str(), "parallel") == 0) o.streaming = "parallel";
      else return fail("22023", name + " requires a Boolean value" + (context.server_major >= 16 ? " or \"parallel\"" : ""));
    } else if (name == "origin") {
      const std::string v = value.value_or("");
      if (strcasecmp(v.c_str(), "none") == 0) o.origin_none = true;
      else if (strcasecmp(v.c_str(), "any") == 0) o.origin_none = false;
      else return fail("22023", "unrecognized origin value: \"" + v + "\"");
    } else {
      auto b = def_boolean(value);
      if (!b) return fail("22023", name + " requires a Boolean value");
      if (name == "binary" && *b)
        return fail("0A000", "pgoutput option \"binary\" is not served by walgate: its log holds values as text");
      if (name == "messages") o.messages = *b;
      if (name == "two_phase") o.two_phase = *b;
    }
  }
  o.lazy_begin = context.server_major >= 15;
  if (!proto_given) return fail("22023", "option \"proto_version\" missing");
  if (!names_given) return fail("22023", "option \"publication_names\" missing");
  const std::uint32_t max = context.server_major >= 16 ? 4 : context.server_major == 15 ? 3 : context.server_major == 14 ? 2 : 1;
  if (o.proto_version > max)
    return fail("0A000", "client sent proto_version=" + std::to_string(o.proto_version) + " but server only supports protocol " +
                             std::to_string(max) + " or lower");
  if (o.proto_version < 1)
    return fail("0A000", "client sent proto_version=" + std::to_string(o.proto_version) +
                             " but server only supports protocol 1 or higher");
  if (o.streaming != "off" && o.proto_version < 2)
    return fail("0A000", "requested proto_version=" + std::to_string(o.proto_version) + " does not support streaming, need 2 or higher");
  if (o.streaming == "parallel" && o.proto_version < 4)
    return fail("0A000", "requested proto_version=" + std::to_string(o.proto_version) +
                             " does not support parallel streaming, need 4 or higher");
  if (o.two_phase && o.proto_version < 3)
    return fail("0A000", "requested proto_version=" + std::to_string(o.proto_version) +
                             " does not support two-phase commit, need 3 or higher");
  // The log holds walgate's publications' changes: a subscriber asks for those, or is refused.
  std::vector<std::string> foreign;
  for (const auto& p : o.publication_names) {
    bool ours = false;
    for (const auto& w : context.publications) ours = ours || w == p;
    if (!ours) foreign.push_back(p);
  }
  std::string served;
  for (const auto& p : context.publications) served += (served.empty() ? "\"" : ", \"") + p + "\"";
  if (!foreign.empty()) {
    std::string names;
    for (const auto& p : foreign) names += (names.empty() ? "\"" : ", \"") + p + "\"";
    return fail("0A000", "publication " + names + " is not served by walgate: its log holds publication " +
                             (served.empty() ? std::string("(none)") : served) + " alone");
  }
  // (the log does not say which of walgate's publications a change came through: a subscriber
  // asks for all of them, or its stream would hold tables it did not ask for)
  for (const auto& w : context.publications) {
    bool asked = false;
    for (const auto& p : o.publication_names) asked = asked || p == w;
    if (!asked)
      return fail("0A000", "walgate serves its publications " + served +
                               " together: publication_names must name every one of them (\"" + w + "\" is missing)");
  }
  return r;
}

std::unique_ptr<output_plugin> make_pgoutput_plugin(const pgoutput_options& o, plugin_sink sink) {
  return std::make_unique<pgoutput_plugin>(o, std::move(sink));
}

}  // namespace walgate::transform
