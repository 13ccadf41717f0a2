#include "ampipe/cli/app.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>

#include "ampipe/cli/layer_check.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"

namespace ampipe::cli {

namespace {
// Prints a user error once (rank 0, or the only process) as one line.
void print_error(const std::string& msg) {
  const bool rank0 = !comm::Runtime::exists() || comm::Runtime::current().rank() == 0;
  if (rank0) std::fprintf(stderr, "ampipe: error: %s\n", msg.c_str());
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampipe: MoE transformer training with AMPipe intra-block pipelining"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all");

  LayerCheckArgs lc;
  CLI::App* lc_cmd = app.add_subcommand("layer-check", "one forward + backward of one MoE layer, optional export");
  lc.add_to(*lc_cmd);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ampipe: error: %s (see ampipe %s--help)\n", e.what(),
                 app.get_subcommands().empty() ? "" : (app.get_subcommands()[0]->get_name() + " ").c_str());
    return 2;
  }

  std::optional<comm::Runtime> rt;
  try {
    rt.emplace(&argc, &argv);
    if (lc_cmd->parsed()) return run_layer_check(lc);
  } catch (const ConfigError& e) {
    print_error(e.what());
    return 2;
  } catch (const CommError& e) {
    if (rt) rt->abort(e.what());
    std::fprintf(stderr, "ampipe: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace ampipe::cli
