#include "ampipe/cli/app.h"

#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdio>
#include <optional>

#include "ampipe/cli/bench_layer.h"
#include "ampipe/cli/calibrate.h"
#include "ampipe/cli/flag_help.h"
#include "ampipe/cli/layer_check.h"
#include "ampipe/cli/plan.h"
#include "ampipe/cli/preprocess.h"
#include "ampipe/cli/simulate.h"
#include "ampipe/cli/train.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/kernels/gemm.h"

#include <cstdlib>

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
  app.set_help_all_flag("--help-all", "print the help of every subcommand and exit");
  app.set_version_flag("--version", std::string("ampipe ") + AMPIPE_VERSION);
  app.formatter(grouped_formatter());  // subcommands take it when added

  LayerCheckArgs lc;
  CLI::App* lc_cmd = app.add_subcommand("layer-check", "one forward + backward of one MoE layer, optional export");
  lc.add_to(*lc_cmd);
  BenchLayerArgs bl;
  CLI::App* bl_cmd =
      app.add_subcommand("bench-layer", "time forward + backward of MoE layers for several AMPipe degrees");
  bl.add_to(*bl_cmd);
  TrainFlags tr;
  CLI::App* tr_cmd = app.add_subcommand("train", "train a GPT-MoE with AMPipe (Megatron / MindSpeed flags)");
  tr.add_to(*tr_cmd);
  PlanArgs pl;
  CLI::App* pl_cmd = app.add_subcommand(
      "plan", "print the Plan of one layer step from shapes alone: tasks, FLOPs, bytes, memory, overlap");
  pl.add_to(*pl_cmd);
  CalibrateArgs ca;
  CLI::App* ca_cmd = app.add_subcommand(
      "calibrate", "measure this machine (GEMM, attention, element-wise, task overhead, links) into a profile");
  ca.add_to(*ca_cmd);
  SimulateArgs si;
  CLI::App* si_cmd = app.add_subcommand(
      "simulate", "predict a training iteration of the train flags on a profile, for several AMPipe degrees");
  si.add_to(*si_cmd);
  PreprocessArgs pp;
  CLI::App* pp_cmd = app.add_subcommand(
      "preprocess",
      "tokenize JSON lines into Megatron's indexed dataset (preprocess_data.py's flags), or a text into a token file "
      "(training a SentencePiece model for it), for --data-path");
  pp.add_to(*pp_cmd);

  // Every flag, its help group and whether it is a path (an empty one is refused) come from flag_registry.cpp.
  for (CLI::App* sub : app.get_subcommands({}))
    sub->allow_extras();  // an unknown flag is reported below, with the closest known one
  // A long flag with one dash (`-hidden-size 32`) would be read as a cluster of short flags (-h: help, exit 0).
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() > 2 && arg[0] == '-' && arg[1] != '-' && std::isalpha(static_cast<unsigned char>(arg[1]))) {
      std::fprintf(stderr, "ampipe: error: %s: long flags take two dashes (-%s)\n", arg.c_str(), arg.c_str());
      return 2;
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ampipe: error: %s (see ampipe %s--help)\n", e.what(),
                 app.get_subcommands().empty() ? "" : (app.get_subcommands()[0]->get_name() + " ").c_str());
    return 2;
  }
  for (const CLI::App* sub : app.get_subcommands()) {
    const std::vector<std::string> extra = sub->remaining();
    if (extra.empty()) continue;
    const std::string& arg = extra.front();
    const std::string help = " (see ampipe " + sub->get_name() + " --help)";
    if (arg.rfind("--", 0) != 0) {
      std::fprintf(stderr, "ampipe: error: unexpected argument %s: %s takes flags only%s\n", arg.c_str(),
                   sub->get_name().c_str(), help.c_str());
      return 2;
    }
    const std::string close = closest_flag(*sub, arg);
    const std::string flag = arg.substr(0, arg.find('='));
    std::fprintf(stderr, "ampipe: error: unknown flag %s: %s\n", flag.c_str(),
                 close.empty() ? ("ampipe " + sub->get_name() + " has no such flag" + help).c_str()
                               : ("did you mean " + close + "?").c_str());
    return 2;
  }

  // One compute thread per rank unless the user says otherwise: ranks share these machines' cores, and
  // OpenMP threads spinning on an oversubscribed core are many times slower than one thread.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) kernels::set_num_threads(1);

  std::optional<comm::Runtime> rt;
  try {
    rt.emplace(&argc, &argv);
    if (lc_cmd->parsed()) return run_layer_check(lc);
    if (bl_cmd->parsed()) return run_bench_layer(bl);
    if (tr_cmd->parsed()) return run_train(tr);
    if (pl_cmd->parsed()) return run_plan(pl);
    if (ca_cmd->parsed()) return run_calibrate(ca);
    if (si_cmd->parsed()) return run_simulate(si);
    if (pp_cmd->parsed()) return run_preprocess(pp);
  } catch (const ConfigError& e) {
    print_error(e.what());
    return 2;
  } catch (const CommError& e) {
    if (rt) rt->abort(e.what());
    std::fprintf(stderr, "ampipe: error: %s\n", e.what());
    return 1;
  } catch (const NumericError& e) {  // every rank stops together (the values were all-reduced)
    print_error(e.what());
    return 1;
  }
  return 0;
}

}  // namespace ampipe::cli
