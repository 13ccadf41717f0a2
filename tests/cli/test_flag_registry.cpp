// The flag registry (cli/flag_registry.h): every flag has a help group, its --config key names it and round-trips,
// the subcommands' options are the registry's, and --ampipe-degree has one parser for its three grammars.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>

#include "ampipe/cli/bench_layer.h"
#include "ampipe/cli/calibrate.h"
#include "ampipe/cli/config_keys.h"
#include "ampipe/cli/flag_registry.h"
#include "ampipe/cli/layer_check.h"
#include "ampipe/cli/plan.h"
#include "ampipe/cli/preprocess.h"
#include "ampipe/cli/simulate.h"
#include "ampipe/cli/train_flags.h"
#include "ampipe/core/error.h"
#include "ampipe/train/train_config.h"

using namespace ampipe;
using namespace ampipe::cli;

namespace {

constexpr Sub kSubs[] = {kLayerCheck, kBenchLayer, kTrain, kPlan, kCalibrate, kSimulate, kPreprocess, kConvert};

bool is_group(const std::string& g) {
  const auto& order = help_group_order();
  return g == kGroupHidden || std::find(order.begin(), order.end(), g) != order.end();
}

}  // namespace

TEST(FlagRegistry, EveryFlagHasOneHelpGroupAndOneEntryPerSubcommand) {
  std::set<std::pair<std::string, unsigned>> seen;
  for (const FlagSpec& s : flag_registry()) {
    SCOPED_TRACE(s.name);
    ASSERT_EQ(s.name.rfind("--", 0), 0u);
    EXPECT_NE(s.subs, 0u);
    EXPECT_FALSE(s.help.empty());
    EXPECT_TRUE(is_group(s.group)) << "group \"" << s.group << "\" is not one of --help's";
    // (train's no-op --profile is simulate's hardware profile)
    if (s.refused == nullptr && s.noop == nullptr) {
      EXPECT_EQ(std::string(flag_group(s.name)), s.group) << "one flag, one group in every subcommand";
    }
    EXPECT_EQ(s.field == nullptr, s.refused != nullptr || s.noop != nullptr);
    EXPECT_FALSE(s.refused != nullptr && s.noop != nullptr) << "refused or accepted, not both";
    if (s.noop != nullptr) {
      EXPECT_EQ(s.group, kGroupNoEffect);
    }
    for (Sub sub : kSubs)
      if (s.subs & sub) {
        EXPECT_TRUE(seen.insert({s.name, sub}).second) << "twice in " << sub_name(sub);
      }
  }
}

TEST(FlagRegistry, EverySubcommandsOptionsAreTheRegistrysAndGrouped) {
  LayerCheckArgs lc;
  BenchLayerArgs bl;
  TrainFlags tr;
  PlanArgs pl;
  CalibrateArgs ca;
  SimulateArgs si;
  PreprocessArgs pp;
  CLI::App apps[7];
  lc.add_to(apps[0]);
  bl.add_to(apps[1]);
  tr.add_to(apps[2]);
  pl.add_to(apps[3]);
  ca.add_to(apps[4]);
  si.add_to(apps[5]);
  pp.add_to(apps[6]);
  for (int i = 0; i < 7; ++i) {
    const Sub sub = kSubs[i];
    SCOPED_TRACE(sub_name(sub));
    size_t n = 0;
    for (const CLI::Option* o : apps[i].get_options()) {
      if (o->get_lnames().empty() || o->get_lnames().front() == "help") continue;
      const std::string name = "--" + o->get_lnames().front();
      const FlagSpec* s = find_flag(sub, name);
      ASSERT_NE(s, nullptr) << name << " is not in the registry";
      EXPECT_EQ(o->get_group(), s->group) << name;
      EXPECT_TRUE(is_group(o->get_group())) << name;
      ++n;
    }
    EXPECT_EQ(n, flags_of(sub).size());
  }
}

TEST(FlagRegistry, SubcommandsTakeTheirOwnFlags) {
  EXPECT_EQ(find_flag(kSimulate, "--sim-profile"), nullptr);  // simulate has --profile
  EXPECT_NE(find_flag(kSimulate, "--profile"), nullptr);
  EXPECT_NE(find_flag(kTrain, "--sim-profile"), nullptr);
  EXPECT_NE(find_flag(kBenchLayer, "--sim-profile"), nullptr);
  const FlagSpec* step = find_flag(kPlan, "--step");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->grammar, Grammar::on_off);
  EXPECT_EQ(step->subs, unsigned(kPlan));
  // rope is a layer flag: every subcommand that builds a layer takes it (simulate costs what train runs)
  for (Sub sub : {kTrain, kSimulate, kLayerCheck, kBenchLayer})
    for (const char* f : {"--position-embedding-type", "--group-query-attention", "--num-query-groups",
                          "--rotary-base", "--rotary-percent"})
      EXPECT_EQ(find_flag(sub, f)->refused, nullptr) << f;
  EXPECT_EQ(find_flag(kTrain, "--ampipe-degree")->grammar, Grammar::degree_auto);
  EXPECT_EQ(find_flag(kSimulate, "--ampipe-degree")->grammar, Grammar::degree_list);
  EXPECT_EQ(find_flag(kBenchLayer, "--ampipe-degree")->grammar, Grammar::degree_list);
  EXPECT_EQ(find_flag(kPlan, "--ampipe-degree")->grammar, Grammar::degree);
  EXPECT_EQ(find_flag(kLayerCheck, "--ampipe-degree")->grammar, Grammar::degree);
}

TEST(FlagRegistry, ConfigKeysNameTheirFlags) {
  for (Sub sub : {kTrain, kSimulate})
    for (const FlagSpec* s : flags_of(sub)) {
      const std::string key = s->config_key();
      if (key.empty()) continue;  // --config
      EXPECT_EQ(config_key_flag(key), s->name);
      EXPECT_EQ(find_flag(sub, config_key_flag(key)), s);
    }
  // Every key of the training configuration is a train flag, so a checkpoint's metadata.json "config" and the
  // rank agreement name flags; one is set by the engine, not by a flag.
  const std::set<std::string> not_flags = {"layernorm_epsilon"};
  for (const train::ConfigKey& k : train::config_keys()) {
    SCOPED_TRACE(k.key);
    if (not_flags.count(k.key)) {
      EXPECT_EQ(k.uses & train::kKeyCheckpoint, 0u);
      continue;
    }
    const FlagSpec* s = find_flag(kTrain, config_key_flag(k.key));
    ASSERT_NE(s, nullptr) << "no flag --" << k.key;
    EXPECT_EQ(s->config_key(), k.key);
  }
}

namespace {

// `ampipe train` flags parsed and finished, as run_train does before validate.
train::TrainConfig parse_train(const std::string& args) {
  CLI::App app;
  TrainFlags f;
  f.add_to(app);
  app.parse(args, false);
  return f.finish();
}

}  // namespace

TEST(FlagRegistry, NoEffectFlagsAreOneNote) {
  CLI::App app;
  TrainFlags f;
  f.add_to(app);
  app.parse("--no-masked-softmax-fusion --num-workers 2 --transformer-impl local --distributed-backend nccl "
            "--spec local",
            false);
  const train::TrainConfig c = f.finish();
  EXPECT_EQ(c.distributed_backend, "mpi");
  ASSERT_EQ(f.layer.notices.size(), 1u);
  EXPECT_EQ(f.layer.notices[0],
            "no effect on this engine: --no-masked-softmax-fusion (GPU kernel fusion), --transformer-impl local (GPU "
            "kernel choice), --num-workers 2 (dataloader workers), --distributed-backend nccl (this engine "
            "communicates over MPI)");
  EXPECT_EQ(find_flag(kSimulate, "--num-workers")->noop, find_flag(kTrain, "--num-workers")->noop);
  // the optimizer state is always saved here: refused, not ignored
  ASSERT_NE(find_flag(kTrain, "--no-save-optim"), nullptr);
  EXPECT_NE(find_flag(kTrain, "--no-save-optim")->refused, nullptr);
}

TEST(FlagRegistry, NoEffectFlagsKeepMegatronsGrammar) {
  for (const char* args : {"--num-workers two", "--transformer-impl te", "--timing-log-level 3",
                           "--initial-loss-scale x"}) {
    SCOPED_TRACE(args);
    CLI::App app;
    TrainFlags f;
    f.add_to(app);
    EXPECT_THROW(app.parse(args, false), CLI::ValidationError);
  }
  CLI::App app;
  TrainFlags f;
  f.add_to(app);
  app.parse("--spec mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec", false);
  try {
    f.finish();
    ADD_FAILURE() << "--spec with a module was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--spec mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec is not "
                                         "supported"),
              std::string::npos)
        << e.what();
  }
}

TEST(FlagRegistry, ConfigKeysRoundTripThroughConfig) {
  const train::TrainConfig a = parse_train(
      "--hidden-size 64 --num-experts 8 --moe-router-topk 1 --swiglu --no-use-rts --noisy-gate-policy Jitter "
      "--lr 0.01 --split 90,5,5 --recompute-granularity full --recompute-method block --train-iters 50 "
      "--seed 18446744073709551615 --use-flash-attn --ampipe-degree 2 --bf16 --eval-iters 3 --save /tmp/x "
      "--max-position-embeddings 256 --tensor-model-parallel-size 2 --sequence-parallel");
  // A checkpoint's metadata.json "config" (to_json) as --config, nothing else given: the same configuration. (The
  // rank agreement's other keys name flags too, ConfigKeysNameTheirFlags; some of them say one thing two ways,
  // --train-iters and --train-samples, so they are not one --config file.)
  const std::string path = testing::TempDir() + "ampipe_config_round_trip.json";
  std::ofstream(path) << train::to_json(a).dump(2);
  const train::TrainConfig b = parse_train("--config " + path);
  EXPECT_EQ(train::to_json(b), train::to_json(a));
  EXPECT_EQ(b.layer.seed, a.layer.seed);
  EXPECT_EQ(b.layer.expert, model::ExpertKind::swiglu);
  EXPECT_FALSE(b.layer.use_rts);
  std::remove(path.c_str());
}

TEST(FlagRegistry, DegreeGrammars) {
  EXPECT_TRUE(parse_degree("auto", Grammar::degree_auto).is_auto);
  EXPECT_TRUE(parse_degree("auto", Grammar::degree_list).is_auto);
  EXPECT_EQ(parse_degree("4", Grammar::degree).list, std::vector<int>{4});
  EXPECT_EQ(parse_degree("0", Grammar::degree).list, std::vector<int>{0});  // the range is the layer's rule
  EXPECT_EQ(parse_degree("2", Grammar::degree_auto).list, std::vector<int>{2});
  EXPECT_EQ(parse_degree("1,2,2,4", Grammar::degree_list).list, (std::vector<int>{1, 2, 4}));
  EXPECT_THROW(parse_degree("auto", Grammar::degree), ConfigError);
  EXPECT_THROW(parse_degree("1,2", Grammar::degree), ConfigError);
  EXPECT_THROW(parse_degree("1,", Grammar::degree_list), ConfigError);
  EXPECT_THROW(parse_degree("0,2", Grammar::degree_list), ConfigError);
  try {
    parse_degree("two", Grammar::degree_auto);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--ampipe-degree two is invalid: give an integer or auto");
  }
}

// Flags left out take Megatron-LM's defaults (megatron/training/arguments.py and TransformerConfig), and
// MindSpeed's for its deepspeed_moe capacity; the values are written out here, not read from the code.
TEST(FlagRegistry, LeftOutFlagsTakeMegatronsDefaults) {
  {  // (simulate takes these flags and fields too)
    CLI::App app;
    TrainFlags f;
    f.add_to(app);
    app.parse("--hidden-size 96", false);
    const train::TrainConfig c = f.finish();
    EXPECT_EQ(c.layer.ffn_hidden_size, 4 * 96);  // 4h
    EXPECT_TRUE(c.dense);                        // no --num-experts: a dense GPT (validate refuses it, last)
    EXPECT_EQ(c.layer.hidden_dropout, 0.1);
    EXPECT_EQ(c.layer.moe_train_capacity_factor, 1.0);
    EXPECT_EQ(c.layer.moe_min_capacity, 4);
    EXPECT_EQ(c.layer.moe_router_topk, 2);
    EXPECT_EQ(c.layer.init_method_std, 0.02);
    EXPECT_EQ(c.layer.seed, 1234u);
    EXPECT_EQ(c.moe_aux_loss_coeff, 0.0);
    EXPECT_EQ(c.min_lr, 0.0);
    EXPECT_EQ(c.lr_warmup_iters, 0);
    EXPECT_EQ(c.lr_decay_style, "linear");
    EXPECT_EQ(c.weight_decay, 0.01);
    EXPECT_EQ(c.adam_beta1, 0.9);
    EXPECT_EQ(c.adam_beta2, 0.999);
    EXPECT_EQ(c.adam_eps, 1e-8);
    EXPECT_EQ(c.clip_grad, 1.0);
    EXPECT_EQ(c.eval_interval, 1000);
    EXPECT_EQ(c.eval_iters, 100);
    EXPECT_EQ(c.log_interval, 100);
    EXPECT_EQ(c.split, "969,30,1");
    EXPECT_EQ(c.valid_fraction, 0.0);
  }
  // With --swiglu: int(4h * 2/3 / 64) * 64 (Megatron's rule): h 1024 -> 2688, h 96 -> 256, h 64 -> 128.
  for (const auto& [h, F] : {std::pair<int, int64_t>{1024, 2688}, {96, 256}, {64, 128}}) {
    CLI::App app;
    TrainFlags f;
    f.add_to(app);
    app.parse(fmt::format("--swiglu --hidden-size {} --num-experts 4", h), false);
    const train::TrainConfig c = f.finish();
    EXPECT_EQ(c.layer.ffn_hidden_size, F) << "h " << h;
    EXPECT_FALSE(c.dense);
  }
  CLI::App app;
  TrainFlags f;
  f.add_to(app);
  app.parse("--swiglu --hidden-size 16", false);
  EXPECT_THROW(f.finish(), ConfigError);  // the rule gives 0: --ffn-hidden-size must be given
}

namespace {

// A value of `s`'s grammar that Megatron accepts (its first choice where it has choices), as command-line text.
std::string megatron_value(const FlagSpec& s) {
  if (s.choices != nullptr) {
    const std::string c = s.choices;
    return c.substr(0, c.find('|'));
  }
  switch (s.grammar) {
    case Grammar::on_off:
      return "";
    case Grammar::integer:
      return "7";
    case Grammar::number:
      return "0.5";
    case Grammar::text_list:
      return "a b";
    default:
      return "x";
  }
}

std::string given(const FlagSpec& s) {
  const std::string v = megatron_value(s);
  return v.empty() ? s.name : s.name + " " + v;
}

}  // namespace

// Every no-op flag of train and simulate parses with its Megatron grammar, and all of them given at once are one
// start-up note, each with its value and why, in the registry's order.
TEST(FlagRegistry, EveryNoEffectFlagParsesAndJoinsTheNote) {
  for (Sub sub : {kTrain, kSimulate}) {
    SCOPED_TRACE(sub_name(sub));
    std::string args;
    std::vector<std::string> items;
    for (const FlagSpec* s : flags_of(sub)) {
      if (s->noop == nullptr) continue;
      args += " " + given(*s);
      items.push_back(given(*s) + " (" + s->noop + ")");
    }
    ASSERT_GT(items.size(), 190u);
    CLI::App app;
    SimulateArgs si;
    TrainFlags tr;
    if (sub == kSimulate)
      si.add_to(app);
    else
      tr.add_to(app);
    TrainFlags& f = sub == kSimulate ? si.train : tr;
    app.parse(args + (sub == kSimulate ? " --profile p.json" : ""), false);
    (void)f.finish();
    ASSERT_EQ(f.layer.notices.size(), 1u);
    std::string note = "no effect on this engine: ";
    for (size_t i = 0; i < items.size(); ++i) note += (i ? ", " : "") + items[i];
    EXPECT_EQ(f.layer.notices[0], note);
  }
}

// Every refused flag given a value this engine does not run stops with one line naming it, its value and why;
// the values it does run pass (numbers compared as numbers).
TEST(FlagRegistry, EveryRefusedFlagIsOneLine) {
  size_t n = 0;
  for (const FlagSpec* s : flags_of(kTrain)) {
    if (s->refused == nullptr) continue;
    SCOPED_TRACE(s->name);
    ++n;
    CLI::App app;
    TrainFlags f;
    f.add_to(app);
    const std::string v = s->grammar == Grammar::on_off ? "" : s->grammar == Grammar::text_list ? "a b" : "7";
    app.parse(v.empty() ? s->name : s->name + " " + v, false);
    try {
      (void)f.finish();
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(s->name + (v.empty() ? "" : " " + v) + " is not supported: " + s->refused,
                                            0),
                0u)
          << e.what();
    }
  }
  EXPECT_GT(n, 200u);
  for (const char* ok : {"--moe-z-loss-coeff 0.0", "--embedding-multiplier-scale 1e0", "--moe-layer-freq 1",
                         "--first-k-dense-replace 0", "--optimizer adam",
                         "--dataloader-type cyclic", "--moe-router-dtype fp32", "--cp-comm-type p2p",
                         "--attention-mask-type causal", "--lr-warmup-init 0.0", "--moe-z-loss-coeff 0"}) {
    SCOPED_TRACE(ok);
    CLI::App app;
    TrainFlags f;
    f.add_to(app);
    app.parse(ok, false);
    EXPECT_NO_THROW((void)f.finish());
  }
}

// Megatron's flags honoured through this engine's own settings: the experts' size, the head and expert-tp sizes
// when they are the engine's, the warm-up as a fraction of the decay.
TEST(FlagRegistry, MegatronSizesAndWarmupAreHonoured) {
  EXPECT_EQ(parse_train("--num-experts 4 --ffn-hidden-size 512 --moe-ffn-hidden-size 96").layer.ffn_hidden_size, 96);
  EXPECT_EQ(parse_train("--num-experts 4 --moe-intermediate-size 160").layer.ffn_hidden_size, 160);
  EXPECT_NO_THROW(parse_train("--hidden-size 128 --num-attention-heads 4 --kv-channels 32"));
  EXPECT_NO_THROW(parse_train("--tensor-model-parallel-size 2 --expert-tensor-parallel-size 2"));
  for (const char* bad : {"--kv-channels 64", "--expert-tensor-parallel-size 2", "--moe-ffn-hidden-size -1"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_train(bad), ConfigError);
  }
  // the vocabulary flags set their fields (sized with the data: train/vocab_size.h); 0 is "not given", so a 0 given
  // is refused when the flags are parsed
  const train::TrainConfig vocab =
      parse_train("--vocab-size 300 --make-vocab-size-divisible-by 64 --padded-vocab-size 512");
  EXPECT_EQ(vocab.vocab_size, 300);
  EXPECT_EQ(vocab.make_vocab_size_divisible_by, 64);
  EXPECT_EQ(vocab.padded_vocab_size, 512);
  EXPECT_EQ(parse_train("").make_vocab_size_divisible_by, 128);  // Megatron's default
  for (const char* bad : {"--vocab-size 0", "--padded-vocab-size 0"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_train(bad), ConfigError);
  }
  EXPECT_EQ(parse_train("--train-iters 50 --lr-warmup-fraction 0.1").lr_warmup_iters, 5);
  EXPECT_EQ(parse_train("--train-iters 50 --lr-decay-iters 40 --lr-warmup-fraction 0.25").lr_warmup_iters, 10);
  // Megatron's functional tests: a decay (and so a warm-up) longer than the run
  const train::TrainConfig long_decay = parse_train("--num-experts 4 --train-iters 100 --lr-decay-iters 320000 "
                                                    "--lr-warmup-fraction 0.01");
  EXPECT_EQ(long_decay.lr_warmup_iters, 3200);
  EXPECT_NO_THROW(long_decay.validate(1));
  for (const char* bad : {"--train-iters 50 --lr-warmup-fraction 0.01",  // 0.5 iterations
                          "--lr-warmup-fraction 0.1 --lr-warmup-iters 3", "--lr-warmup-samples 8",
                          "--lr-decay-samples 8",
                          "--use-checkpoint-opt_param-scheduler --override-opt-param-scheduler"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_train(bad), ConfigError);
  }
  // --train-samples: the samples become iterations of the global batch once the world size is known
  CLI::App app;
  TrainFlags f;
  f.add_to(app);
  app.parse("--micro-batch-size 4 --train-samples 400 --lr-warmup-samples 40 --lr-decay-samples 320", false);
  train::TrainConfig c = f.finish();
  f.resolve(c, 1);
  EXPECT_EQ(c.train_iters, 100);
  EXPECT_EQ(c.lr_warmup_iters, 10);
  EXPECT_EQ(c.lr_decay_iters, 80);
  CLI::App app2;
  TrainFlags f2;
  f2.add_to(app2);
  app2.parse("--micro-batch-size 4 --train-samples 400 --lr-warmup-fraction 0.05", false);
  c = f2.finish();
  f2.resolve(c, 1);
  EXPECT_EQ(c.lr_warmup_iters, 5);
}
