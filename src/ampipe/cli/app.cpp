#include "ampipe/cli/app.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "ampipe/cli/bench_layer.h"
#include "ampipe/cli/calibrate.h"
#include "ampipe/cli/convert.h"
#include "ampipe/cli/flag_help.h"
#include "ampipe/cli/layer_check.h"
#include "ampipe/cli/plan.h"
#include "ampipe/cli/preprocess.h"
#include "ampipe/cli/simulate.h"
#include "ampipe/cli/train.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/core/parallel.h"

#include <cstdlib>

namespace ampipe::cli {

namespace {

// The subcommand every rank runs, agreed first: a rank running another one (or only printing its help) would leave its
// peers waiting in a collective it never joins.
void agree_subcommand(comm::Runtime& rt, const std::string& name) {
  if (rt.size() == 1) return;
  const std::vector<std::string> all = rt.agree("the subcommand", name);
  std::vector<std::string> differ;
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differ.push_back(fmt::format("{} runs {}", rt.rank_name(int(r)), all[r]));
  if (differ.empty()) return;
  throw ConfigError(fmt::format("the ranks run different commands: {} runs {}, {}{}; every rank must run the same ampipe "
                                "subcommand",
                                rt.rank_name(0), all[0], differ.front(),
                                differ.size() > 1 ? fmt::format(" (and {} more)", differ.size() - 1) : ""));
}

// The start-up timeout from the start (MPI_Init and the first agreements run before the subcommand applies its flags;
// an invalid value is refused there).
comm::RuntimeOptions runtime_options(const CommFlags* f) {
  comm::RuntimeOptions o;
  if (f != nullptr && f->startup_timeout_s > 0 && f->startup_timeout_s <= CommFlags::kMaxTimeoutS)
    o.startup_timeout = std::chrono::milliseconds(std::max<int64_t>(1, int64_t(f->startup_timeout_s * 1000)));
  return o;
}

// Leaves before the subcommand runs (its help, its version, a command line it refuses) with `code` and `message`'s
// line. A rank started with peers joins the world first, agrees on what it runs (`what`: "--help", or the command
// line refused) and ends in the exit agreement, so its peers stop at once, naming it, instead of waiting for it.
int leave(int argc, char** argv, bool with_peers, int code, const std::string& message,
          const std::string& what = "") {
  if (!with_peers) {
    if (!message.empty()) std::fprintf(stderr, "ampipe: error: %s\n", message.c_str());
    return code;
  }
  std::optional<comm::Runtime> rt;
  try {
    rt.emplace(&argc, &argv);
    if (message.empty()) agree_subcommand(*rt, what);
  } catch (const PeerStopped& e) {
    return rt->finish(comm::Runtime::Exit::stopped, 1, e.what());
  } catch (const ConfigError& e) {
    return rt->finish(comm::Runtime::Exit::failed, 2, e.what());
  } catch (const CommError& e) {
    if (rt) rt->abort(std::string("ampipe: error: ") + e.what());
    std::fprintf(stderr, "ampipe: error: %s\n", e.what());
    return 1;
  }
  return rt->finish(code == 0 ? comm::Runtime::Exit::ok : comm::Runtime::Exit::failed, code, message);
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
  ConvertArgs cv;
  CLI::App* cv_cmd = app.add_subcommand(
      "convert", "a Hugging Face Mixtral, Qwen2-MoE or Qwen3-MoE checkpoint into an ampipe train checkpoint, or back");
  cv.add_to(*cv_cmd);

  // Every flag, its help group and whether it is a path (an empty one is refused) come from flag_registry.cpp.
  for (CLI::App* sub : app.get_subcommands({}))
    sub->allow_extras();  // an unknown flag is reported below, with the closest known one
  // A rank started by mpirun with peers takes part in the world even when it only prints its help or refuses its
  // command line: its peers would otherwise wait for it in MPI_Init or the first agreement (see leave below).
  const bool with_peers = comm::launched_with_peers();
  // A long flag with one dash (`-hidden-size 32`) would be read as a cluster of short flags (-h: help, exit 0).
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() > 2 && arg[0] == '-' && arg[1] != '-' && std::isalpha(static_cast<unsigned char>(arg[1])))
      return leave(argc, argv, with_peers, 2, fmt::format("{}: long flags take two dashes (-{})", arg, arg));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return leave(argc, argv, with_peers, app.exit(e), "", "--help");
  } catch (const CLI::CallForAllHelp& e) {
    return leave(argc, argv, with_peers, app.exit(e), "", "--help-all");
  } catch (const CLI::CallForVersion& e) {
    return leave(argc, argv, with_peers, app.exit(e), "", "--version");
  } catch (const CLI::ParseError& e) {
    return leave(argc, argv, with_peers, 2,
                 fmt::format("{} (see ampipe {}--help)", e.what(),
                             app.get_subcommands().empty() ? "" : app.get_subcommands()[0]->get_name() + " "));
  }
  for (const CLI::App* sub : app.get_subcommands()) {
    const std::vector<std::string> extra = sub->remaining();
    if (extra.empty()) continue;
    const std::string& arg = extra.front();
    const std::string help = " (see ampipe " + sub->get_name() + " --help)";
    if (arg.rfind("--", 0) != 0)
      return leave(argc, argv, with_peers, 2,
                   fmt::format("unexpected argument {}: {} takes flags only{}", arg, sub->get_name(), help));
    const std::string close = closest_flag(*sub, arg);
    const std::string flag = arg.substr(0, arg.find('='));
    return leave(argc, argv, with_peers, 2,
                 fmt::format("unknown flag {}: {}", flag,
                             close.empty() ? "ampipe " + sub->get_name() + " has no such flag" + help
                                           : "did you mean " + close + "?"));
  }

  // One compute thread per rank unless the user says otherwise: ranks share these machines' cores, and
  // OpenMP threads spinning on an oversubscribed core are many times slower than one thread.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) set_num_threads(1);

  // Every failure ends in the exit agreement (comm::Runtime::finish): every rank returns the failing rank's exit code
  // and only that rank's line is printed (naming the rank and host when not every rank failed alike).
  std::optional<comm::Runtime> rt;
  comm::Runtime::Exit kind = comm::Runtime::Exit::ok;
  int code = 0;
  std::string message;
  const std::string name = app.get_subcommands().empty() ? "" : app.get_subcommands()[0]->get_name();
  try {
    rt.emplace(&argc, &argv, runtime_options(lc_cmd->parsed() ? &lc.comm : bl_cmd->parsed() ? &bl.comm
                                             : tr_cmd->parsed()                     ? &tr.comm
                                                                                    : nullptr));
    agree_subcommand(*rt, name);
    if (lc_cmd->parsed()) code = run_layer_check(lc);
    else if (bl_cmd->parsed()) code = run_bench_layer(bl);
    else if (tr_cmd->parsed()) code = run_train(tr);
    else if (pl_cmd->parsed()) code = run_plan(pl);
    else if (ca_cmd->parsed()) code = run_calibrate(ca);
    else if (si_cmd->parsed()) code = run_simulate(si);
    else if (pp_cmd->parsed()) code = run_preprocess(pp);
    else if (cv_cmd->parsed()) code = run_convert(cv);
    if (code != 0) kind = comm::Runtime::Exit::failed;
  } catch (const PeerStopped& e) {  // another rank left: its line is the one printed
    kind = comm::Runtime::Exit::stopped;
    code = 1;
    message = e.what();
  } catch (const ConfigError& e) {
    kind = comm::Runtime::Exit::failed;
    code = 2;
    message = e.what();
  } catch (const CommError& e) {  // a timeout or a mismatch of collectives: the job is aborted on every rank
    if (rt) rt->abort(std::string("ampipe: error: ") + e.what());
    std::fprintf(stderr, "ampipe: error: %s\n", e.what());
    return 1;
  } catch (const NumericError& e) {  // every rank stops together (the values were all-reduced)
    kind = comm::Runtime::Exit::failed;
    code = 1;
    message = e.what();
  } catch (const std::bad_alloc&) {
    kind = comm::Runtime::Exit::failed;
    code = 1;
    message = fmt::format("out of memory: an allocation failed (ampipe {}); lower the sizes or give the process more "
                          "memory",
                          name);
  } catch (const std::exception& e) {
    kind = comm::Runtime::Exit::failed;
    code = 1;
    message = fmt::format("ampipe {} failed: {}", name, e.what());
  }
  if (!rt) {
    if (!message.empty()) std::fprintf(stderr, "ampipe: error: %s\n", message.c_str());
    return code;
  }
  return rt->finish(kind, code, message);
}

}  // namespace ampipe::cli
