// The emulated output plugins by name (see output_plugin.hpp).
#include "walgate/transform/output_plugin.hpp"

#include "walgate/transform/pgoutput_plugin.hpp"
#include "walgate/transform/wal2json_plugin.hpp"

namespace walgate::transform {

bool is_emulated_plugin(std::string_view name) { return name == "test_decoding" || name == "wal2json" || name == "pgoutput"; }

plugin_made make_output_plugin(std::string_view name, const plugin_options& options, const plugin_context& context,
                               plugin_sink sink) {
  plugin_made made;
  if (name == "test_decoding") {
    auto parsed = parse_test_decoding_options(options);
    if (!parsed.error.empty()) {
      made.sqlstate = "22023";
      made.error = parsed.error;
      return made;
    }
    parsed.options.message_is_change = context.server_major >= 17;
    made.plugin = make_test_decoding_plugin(parsed.options, std::move(sink));
    return made;
  }
  if (name == "wal2json") {
    auto parsed = parse_wal2json_options(options);
    if (!parsed.error.empty()) {
      made.sqlstate = parsed.sqlstate;
      made.error = parsed.error;
      return made;
    }
    made.plugin = make_wal2json_plugin(parsed.options, std::move(sink));
    return made;
  }
  if (name == "pgoutput") {
    auto parsed = parse_pgoutput_options(options, context);
    if (!parsed.error.empty()) {
      made.sqlstate = parsed.sqlstate;
      made.error = parsed.error;
      return made;
    }
    made.plugin = make_pgoutput_plugin(parsed.options, std::move(sink));
    return made;
  }
  made.sqlstate = "58P01";
  made.error = "output plugin \"" + std::string(name) + "\" is not served by walgate";
  return made;
}

}  // namespace walgate::transform
