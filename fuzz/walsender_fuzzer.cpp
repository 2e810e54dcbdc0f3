// The server side of the replication protocol on arbitrary client bytes: the first packet, then
// tagged messages, each Query through the replication-command grammar (and, as text, through the
// verifier parser a --replication-users line goes through), the first 'p' through the
// SASLInitialResponse parser and SCRAM's server-first step, the second through server-final — as
// a connection to --replication-listen feeds them. A START_REPLICATION's options go through each
// emulated plugin's option parser (wal2json's lists and escaped table names among them).
#include "walgate/protocol/auth.hpp"
#include "walgate/protocol/walsender.hpp"
#include "walgate/transform/output_plugin.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

using namespace walgate::protocol;
using namespace walgate::protocol::walsender;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  bytes_view in(reinterpret_cast<const std::byte*>(data), size);
  auto first = split_startup_packet(in);
  if (first.status != split_status::ready) return 0;
  if (first.packet.size < 8 || first.packet.size > in.size() || first.packet.size > max_startup_packet) std::abort();
  (void)startup_param(first.packet, "replication");
  in = in.subspan(first.packet.size);
  // (one PBKDF2 for the whole run, with the fewest iterations: the exchange, not the hash, is fuzzed)
  static const scram_verifier verifier = make_scram_verifier("pencil", 1, "saltsalt");
  scram_server scram(verifier, "user", "secret", {}, "SERVERNONCE");
  int sasl_messages = 0;
  while (!in.empty()) {
    auto r = split_frontend_message(in, 1 << 16);
    if (r.status != split_status::ready) break;
    if (r.message.size > in.size() || r.message.body.size() + 5 != r.message.size) std::abort();
    if (r.message.tag == 'Q') {
      auto text = parse_query(r.message.body);
      if (text) {
        auto c = parse_replication_command(*text);
        if (c.command.has_value() == !c.error.empty()) std::abort();   // one or the other
        if (c.command && !c.command->options.empty()) {
          walgate::transform::plugin_options options;
          for (const auto& o : c.command->options) options.emplace_back(o.name, o.value);
          walgate::transform::plugin_context context;
          context.publications = {"p"};
          for (const char* plugin : {"test_decoding", "wal2json", "pgoutput"}) {
            auto made = walgate::transform::make_output_plugin(plugin, options, context, [](lsn, std::string_view) {});
            if (!made.plugin == made.error.empty()) std::abort();   // a plugin or an error
          }
        }
        std::string why;
        auto v = parse_scram_verifier(*text, &why);
        if (v.has_value() == !why.empty()) std::abort();
        if (v && (v->stored_key.size() != 32 || v->server_key.size() != 32 || v->salt.empty())) std::abort();
      }
    } else if (r.message.tag == 'p') {
      if (sasl_messages++ == 0) {
        auto initial = parse_sasl_initial_response(r.message.body);
        if (initial && initial->data) {
          auto f = scram.server_first(initial->mechanism, as_string_view(*initial->data));
          if (!f && scram.failure().empty()) std::abort();
        }
      } else {
        auto f = scram.server_final(as_string_view(r.message.body));
        if (!f && scram.failure().empty()) std::abort();
        if (f && f->rfind("v=", 0) != 0) std::abort();
      }
    }
    in = in.subspan(r.message.size);
  }
  return 0;
}
