// TrainConfig::validate rules that need more than one rank to reach (the CLI tests in tests/CMakeLists.txt cover
// the others through the binary), and the learning-rate schedule and the data sampling.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>
#include <utility>

#include "ampipe/train/adamw.h"
#include "ampipe/train/checkpoint.h"
#include "ampipe/train/checkpoint_args.h"
#include "ampipe/train/text_data.h"
#include "ampipe/train/train_config.h"

using namespace ampipe;

namespace {
std::string message(const train::TrainConfig& c, int world) {
  try {
    c.validate(world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(TrainConfig, TensorParallelRules) {
  train::TrainConfig c;
  c.layer.tensor_model_parallel_size = 2;
  EXPECT_EQ(message(c, 2), "");
  EXPECT_THAT(message(c, 3), ::testing::HasSubstr("world size 3 is not tp x cp x dp"));
  c.layer.tensor_model_parallel_size = 3;  // 64 hidden columns, 4 heads
  EXPECT_THAT(message(c, 3), ::testing::HasSubstr("is not divisible by --tensor-model-parallel-size 3"));
  c.layer.tensor_model_parallel_size = 2;
  c.layer.ampipe_tp_sp_comm_overlap = true;
  EXPECT_THAT(message(c, 2), ::testing::HasSubstr("--ampipe-tp-sp-comm-overlap needs --ampipe-degree > 1"));
  c.ampipe_degree = 2;
  c.use_flash_attn = true;
  EXPECT_EQ(message(c, 2), "");
  c.layer.tensor_model_parallel_size = 1;
  EXPECT_THAT(message(c, 1), 
              ::testing::HasSubstr("--ampipe-tp-sp-comm-overlap needs --tensor-model-parallel-size > 1"));
}

TEST(TrainConfig, ContextParallelWorldSize) {
  train::TrainConfig c;
  c.layer.context_parallel_size = 2;
  EXPECT_THAT(message(c, 3), ::testing::HasSubstr("world size 3 is not tp x cp x dp"));
  EXPECT_EQ(message(c, 4), "");
  c.ampipe_degree = 2;
  c.use_flash_attn = true;
  c.layer.seq_length = 12;  // not divisible by 2 x 2 x 2
  EXPECT_THAT(message(c, 4), 
              ::testing::HasSubstr("is not divisible by 2 x --ampipe-degree 2 x --context-parallel-size 2"));
  c.layer.seq_length = 16;
  c.layer.context_parallel_algo = "ulysses_cp_algo";
  EXPECT_THAT(message(c, 4), ::testing::HasSubstr("--context-parallel-algo ulysses_cp_algo is not supported"));
}

TEST(TrainConfig, ExpertParallelInsideDataParallel) {
  train::TrainConfig c;
  c.layer.expert_model_parallel_size = 4;
  EXPECT_THAT(message(c, 2), ::testing::HasSubstr("--expert-model-parallel-size 4 does not divide"));
  EXPECT_EQ(message(c, 4), "");
}

TEST(TrainConfig, GlobalBatchDividesOverDataParallelRanks) {
  train::TrainConfig c;
  c.layer.micro_batch_size = 2;
  c.global_batch_size = 6;
  EXPECT_THAT(message(c, 2), ::testing::HasSubstr("--global-batch-size 6 is not divisible by --micro-batch-size 2 x "
                                                  "data-parallel size 2"));
  EXPECT_EQ(message(c, 3), "");
}

// Virtual pipeline stages, Megatron's rules (megatron/training/arguments.py and its interleaved schedule): the chunks
// of each rank and their layers, one of the two flags, an even split, and the micro-batch groups.
TEST(TrainConfig, VirtualStagesFollowMegatronsRules) {
  train::TrainConfig c;
  c.layer.num_experts = 4;
  c.num_layers = 8;
  c.layer.micro_batch_size = 1;
  c.pipeline_model_parallel_size = 2;
  c.num_layers_per_virtual_pipeline_stage = 2;  // 4 layers per rank: 2 chunks of 2
  c.global_batch_size = 4;
  EXPECT_EQ(message(c, 2), "");
  EXPECT_EQ(c.virtual_stages(), 2);
  EXPECT_EQ(c.stage_layers(0), (std::vector<int>{0, 1, 4, 5}));  // virtual stages 0 and 2
  EXPECT_EQ(c.stage_layers(1), (std::vector<int>{2, 3, 6, 7}));  // 1 and 3
  c.recompute_granularity = "full";
  c.recompute_method = "block";
  c.recompute_num_layers = 1;  // the first layer of each chunk
  EXPECT_EQ(c.stage_recompute(1), (std::vector<bool>{true, false, true, false}));
  c.recompute_granularity = c.recompute_method = "";
  // in flight: rank 0 of P = 2, v = 2, K = 4 holds all four micro-batches of its first chunk, rank 1 three
  EXPECT_EQ(c.pipeline_in_flight(0, 4), 4);
  EXPECT_EQ(c.pipeline_in_flight(1, 4), 3);
  train::TrainConfig b = c;
  b.num_virtual_stages_per_pipeline_rank = 2;
  EXPECT_THAT(message(b, 2), ::testing::HasSubstr("both given"));
  b = c;
  b.num_layers_per_virtual_pipeline_stage = 3;
  EXPECT_THAT(message(b, 2), 
              ::testing::HasSubstr("--num-layers-per-virtual-pipeline-stage 3 does not divide the 4 layers of each pipeline stage"));
  b = c;
  b.pipeline_model_parallel_size = 1;
  EXPECT_THAT(message(b, 1), 
              ::testing::HasSubstr("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1"));
  b = c;
  b.decoder_first_pipeline_num_layers = 2;
  EXPECT_THAT(message(b, 2), 
              ::testing::HasSubstr("give the virtual stages as --num-virtual-stages-per-pipeline-rank for an uneven split"));
  b = c;
  b.num_layers_per_virtual_pipeline_stage = 0;
  b.num_virtual_stages_per_pipeline_rank = 3;
  EXPECT_THAT(message(b, 2), 
              ::testing::HasSubstr("--num-layers 8 is not divisible by --pipeline-model-parallel-size 2 x 3 virtual stages"));
  b = c;
  b.global_batch_size = 1;  // one micro-batch for two stages
  EXPECT_THAT(message(b, 2), 
              ::testing::HasSubstr("--microbatch-group-size-per-virtual-pipeline-stage 2 must be in [--pipeline-model-parallel-size 2, "
              "micro-batches per rank 1]"));
  b = c;
  b.global_batch_size = 5;  // groups of 2: the last holds 1 < P
  EXPECT_THAT(message(b, 2), ::testing::HasSubstr("leave a last group of 1"));
  b.microbatch_group_size_per_vp_stage = 3;  // groups 3 + 2: Megatron runs it, this engine whole groups only
  EXPECT_THAT(message(b, 2), ::testing::HasSubstr("runs the interleaved schedule over whole groups only"));
  b.global_batch_size = 6;  // groups 3 + 3
  EXPECT_EQ(message(b, 2), "");
  b = c;
  b.num_layers_per_virtual_pipeline_stage = 4;  // one chunk per rank: the plain 1F1B schedule
  EXPECT_EQ(message(b, 2), "");
  EXPECT_EQ(b.virtual_stages(), 1);
  EXPECT_EQ(b.stage_layers(1), (std::vector<int>{4, 5, 6, 7}));
}

TEST(TrainConfig, DegreeOneAcceptsTheDefaults) {
  const train::TrainConfig defaults;
  EXPECT_EQ(message(defaults, 1), "");
}

namespace {
// --use-pipe-experts --pipe-experts-multi-data N --ampipe-degree M (with flash attention, which M > 1 needs), on
// the default layer: s = 64, b = 1, E = 4, top-2, capacity factor 1 (C = 16 per chunk of 32 tokens at M = 2).
train::TrainConfig pipe_experts(int N, int M) {
  train::TrainConfig c;
  c.ampipe_degree = M;
  c.use_flash_attn = true;
  c.layer.use_pipe_experts = true;
  c.layer.pipe_experts_multi_data = N;
  return c;
}
}  // namespace

TEST(TrainConfig, PipeExpertsRunsWhenItsRulesHold) {
  for (auto [N, M] : {std::pair{1, 1}, std::pair{4, 1}, std::pair{4, 2}, std::pair{8, 4}, std::pair{32, 2}}) {
    train::TrainConfig c = pipe_experts(N, M);
    EXPECT_EQ(message(c, 1), "") << N << " " << M;
    EXPECT_EQ(c.drop_idle_pipe_experts(), "") << N << " " << M;
    EXPECT_TRUE(c.layer.use_pipe_experts);
  }
}

TEST(TrainConfig, PipeExpertsSlicesDivideOverTheChunks) {
  EXPECT_THAT(message(pipe_experts(3, 2), 1),
              ::testing::HasSubstr("--pipe-experts-multi-data 3 is not divisible by --ampipe-degree 2"));
  EXPECT_THAT(message(pipe_experts(6, 4), 1),
              ::testing::HasSubstr("--pipe-experts-multi-data 6 is not divisible by --ampipe-degree 4"));
}

TEST(TrainConfig, PipeExpertsNeedsMoreSlicesThanChunks) {
  EXPECT_THAT(message(pipe_experts(2, 2), 1),
              ::testing::HasSubstr("--pipe-experts-multi-data 2 must be > --ampipe-degree 2 with --use-pipe-experts"));
  EXPECT_THAT(message(pipe_experts(4, 4), 1),
              ::testing::HasSubstr("--pipe-experts-multi-data 4 must be > --ampipe-degree 4"));
}

TEST(TrainConfig, PipeExpertsSlicesAtMostTheCapacity) {
  EXPECT_EQ(message(pipe_experts(32, 2), 1), "");  // 16 slices per chunk, capacity 16
  EXPECT_THAT(message(pipe_experts(34, 2), 1),
              ::testing::HasSubstr("--pipe-experts-multi-data 34 cannot be greater than the expert capacity: 17 "
                                   "slices per chunk of 32 tokens, whose capacity is 16 slots per expert"));
}

TEST(TrainConfig, PipeExpertsIsRefusedWithNoDrop) {
  train::TrainConfig c = pipe_experts(4, 2);
  c.layer.moe_no_drop = true;
  EXPECT_THAT(message(c, 1), ::testing::HasSubstr("--use-pipe-experts cannot be used with --moe-no-drop"));
}

TEST(TrainConfig, PipeExpertsMultiStreamIsRefusedWithOneLine) {
  // Multi-stream overlaps the pieces' tp collectives: it needs sequence parallelism over more than one tp rank.
  for (bool sp : {false, true}) {
    train::TrainConfig c = pipe_experts(2, 2);
    c.layer.pipe_experts_multi_stream = true;
    c.layer.sequence_parallel = sp;
    EXPECT_THAT(message(c, 1), ::testing::HasSubstr("--pipe-experts-multi-stream can only be used with "
                                                    "--sequence-parallel and --tensor-model-parallel-size > 1"))
        << sp;
  }
}

TEST(TrainConfig, PipeExpertsOptionsNeedTheFeature) {
  train::TrainConfig c;
  c.layer.pipe_experts_multi_data = 2;
  EXPECT_THAT(message(c, 1), ::testing::HasSubstr("--pipe-experts-multi-data 2 needs --use-pipe-experts"));
  c.layer.pipe_experts_multi_data = 1;
  c.layer.pipe_experts_multi_stream = true;
  EXPECT_THAT(message(c, 1), ::testing::HasSubstr("--pipe-experts-multi-stream needs --use-pipe-experts"));
  c.layer.pipe_experts_multi_stream = false;
  c.layer.pipe_experts_multi_data = 0;
  EXPECT_THAT(message(c, 1), ::testing::HasSubstr("--pipe-experts-multi-data 0 is invalid"));
}

TEST(TrainConfig, PipeExpertsIsRefusedWithMc2) {
  train::TrainConfig c = pipe_experts(1, 1);
  c.use_ascend_mc2 = true;
  EXPECT_THAT(message(c, 1), ::testing::HasSubstr("--use-pipe-experts cannot be used with --use-ascend-mc2"));
  // Even in the nothing-to-pipeline case the refusal stands (the feature is not dropped first).
  c.layer.num_experts = 1;
  c.layer.moe_router_topk = 1;
  EXPECT_EQ(c.drop_idle_pipe_experts(), "");
  EXPECT_THAT(message(c, 1), ::testing::HasSubstr("--use-pipe-experts cannot be used with --use-ascend-mc2"));
}

TEST(TrainConfig, PipeExpertsWithNothingToPipelineRunsWithoutItAndSaysSo) {
  // One local expert (E = 2 over ep = 2 ranks, or E = 1) and N = 1: a notice, and the feature off.
  for (auto [E, ep] : {std::pair{2, 2}, std::pair{1, 1}}) {
    train::TrainConfig c = pipe_experts(1, 1);
    c.layer.num_experts = E;
    c.layer.expert_model_parallel_size = ep;
    c.layer.moe_router_topk = 1;
    EXPECT_EQ(message(c, 2), "");
    const std::string notice = c.drop_idle_pipe_experts();
    EXPECT_THAT(notice, ::testing::HasSubstr("has nothing to pipeline"));
    EXPECT_EQ(notice.find('\n'), std::string::npos);
    EXPECT_FALSE(c.layer.use_pipe_experts);
    EXPECT_EQ(message(c, 2), "");
    EXPECT_EQ(c.drop_idle_pipe_experts(), "");  // once
  }
  // Two local experts, or N > 1: something to pipeline.
  train::TrainConfig two = pipe_experts(1, 1);
  EXPECT_EQ(two.drop_idle_pipe_experts(), "");
  EXPECT_TRUE(two.layer.use_pipe_experts);
  train::TrainConfig sliced = pipe_experts(2, 1);
  sliced.layer.num_experts = 1;
  sliced.layer.moe_router_topk = 1;
  EXPECT_EQ(sliced.drop_idle_pipe_experts(), "");
  EXPECT_TRUE(sliced.layer.use_pipe_experts);
  // A rule that fails is validate's error, not a notice.
  train::TrainConfig no_drop = pipe_experts(1, 1);
  no_drop.layer.num_experts = 1;
  no_drop.layer.moe_router_topk = 1;
  no_drop.layer.moe_no_drop = true;
  EXPECT_EQ(no_drop.drop_idle_pipe_experts(), "");
  EXPECT_TRUE(no_drop.layer.use_pipe_experts);
  EXPECT_THAT(message(no_drop, 1), ::testing::HasSubstr("--use-pipe-experts cannot be used with --moe-no-drop"));
}

// The configuration's keys (train/train_config.h, config_keys): what a checkpoint records (to_json), the model's
// shape a resume must match, and what --use-checkpoint-args takes, all from the one table.
// --data-path in a checkpoint's config: a string while it holds one path (as before blends; "" for the bundled corpus),
// an array for a blend, and either reads back.
TEST(TrainConfig, DataPathIsAStringWhileItHoldsOnePath) {
  train::TrainConfig c;
  EXPECT_EQ(train::to_json(c)["data_path"], "");
  c.data_path = {"corpus.txt"};
  EXPECT_EQ(train::to_json(c)["data_path"], "corpus.txt");
  c.data_path = {"0.7", "A", "0.3", "B"};
  c.valid_data_path = {"V"};
  const nlohmann::json j = train::to_json(c);
  EXPECT_EQ(j["data_path"], nlohmann::json({"0.7", "A", "0.3", "B"}));
  EXPECT_EQ(j["valid_data_path"], "V");
  train::TrainConfig back;
  for (const train::ConfigKey& k : train::config_keys())
    if (std::string(k.key).ends_with("data_path")) k.set(back, j[k.key]);
  EXPECT_EQ(back.data_path, c.data_path);
  EXPECT_EQ(back.valid_data_path, c.valid_data_path);
  EXPECT_TRUE(back.train_data_path.empty());
}

TEST(TrainConfig, CheckpointKeysAndModelArgsComeFromOneTable) {
  const std::set<std::string> recorded = {
      "num_layers", "seq_length", "micro_batch_size", "hidden_size", "ffn_hidden_size", "moe_ffn_hidden_size",
      "moe_shared_expert_intermediate_size", "moe_layer_freq", "first_k_dense_replace", "num_attention_heads",
      "num_experts", "moe_grouped_gemm", "moe_z_loss_coeff", "moe_router_topk", "moe_train_capacity_factor", "moe_min_capacity", "moe_no_drop",
      "no_use_rts", "noisy_gate_policy", "swiglu", "normalization", "norm_epsilon", "group_query_attention",
      "num_query_groups", "position_embedding_type", "qk_layernorm", "add_qkv_bias", "moe_shared_expert_gate", "rotary_base",
      "rotary_percent",
      "rotary_interleaved",
      "rotary_seq_len_interpolation_factor", "use_rope_scaling", "rope_scaling_factor", "hidden_dropout", "attention_dropout", "init_method_std", "seed",
      "bf16",
      "expert_model_parallel_size", "use_pipe_experts", "pipe_experts_multi_data",
      "untie_embeddings_and_output_weights", "moe_aux_loss_coeff", "moe_model_type", "moe_router_pre_softmax",
      "moe_router_topk_scaling_factor", "moe_router_load_balancing_type", "moe_router_score_function",
      "moe_router_num_groups", "moe_router_group_topk", "moe_router_enable_expert_bias", "moe_router_bias_update_rate",
      "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity", "moe_token_drop_policy", "ampipe_degree",
      "recompute_granularity", "recompute_method", "recompute_num_layers", "global_batch_size", "train_iters", "lr",
      "min_lr", "lr_warmup_iters", "lr_decay_style", "lr_decay_iters", "weight_decay", "apply_wd_to_qk_layernorm",
      "adam_beta1", "adam_beta2",
      "adam_eps", "clip_grad", "data_path", "train_data_path", "valid_data_path", "test_data_path", "tokenizer_type",
      "tokenizer_model", "vocab_file", "merge_file", "padded_vocab_size", "split", "max_position_embeddings",
      // the layout and the evaluation: metadata.json rebuilds the run as --config at any degree and layout (issue 27)
      "tensor_model_parallel_size", "sequence_parallel", "ampipe_tp_sp_comm_overlap", "context_parallel_size",
      "context_parallel_algo", "use_flash_attn", "add_bias_linear", "pipe_experts_multi_stream", "eval_interval",
      "eval_iters",
      // the distributed optimizer: a layout choice (checkpoints hold whole tensors and load either way)
      "use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
      // the pipeline stages: a layout choice too (checkpoints hold every stage's tensors)
      "pipeline_model_parallel_size", "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
      "num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
      "microbatch_group_size_per_virtual_pipeline_stage"};
  const train::TrainConfig defaults;
  const nlohmann::json recorded_json = train::to_json(defaults);
  std::set<std::string> keys;
  for (const auto& [k, v] : recorded_json.items()) keys.insert(k);
  EXPECT_EQ(keys, recorded);
  EXPECT_EQ(train::model_arg_keys(),
            (std::vector<std::string>{"num_layers", "seq_length", "hidden_size", "ffn_hidden_size",
                                      "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_layer_freq",
                                      "first_k_dense_replace", "num_attention_heads", "num_experts", "swiglu", "normalization",
                                      "num_query_groups", "position_embedding_type", "qk_layernorm", "add_qkv_bias",
                                      "add_bias_linear",
                                      "moe_shared_expert_gate", "untie_embeddings_and_output_weights",
                                      "padded_vocab_size"}));
  // Every key the ranks compare includes every recorded one, and each key is written once.
  const nlohmann::json agree = train::train_config_json(defaults, train::kKeyAgree);
  std::set<std::string> seen;
  for (const train::ConfigKey& k : train::config_keys()) {
    EXPECT_TRUE(seen.insert(k.key).second) << k.key;
    EXPECT_TRUE(agree.contains(k.key)) << k.key;
    if (k.model != train::ModelArg::none) {
      EXPECT_NE(k.set, nullptr) << k.key;
    }
  }
  // --use-checkpoint-args takes the shape and the router's top-k from a checkpoint's config, in that order.
  train::TrainConfig c;
  c.layer.hidden_size = 128;
  c.layer.moe_router_topk = 2;
  c.layer.expert = model::ExpertKind::gelu;
  nlohmann::json ckpt = train::to_json(c);
  ckpt["hidden_size"] = 64;
  ckpt["swiglu"] = true;
  ckpt["moe_router_topk"] = 1;
  ckpt["lr"] = 0.5;  // not a model argument: stays this run's
  EXPECT_EQ(train::apply_checkpoint_model_args(c, ckpt),
            (std::vector<std::string>{"--hidden-size 128 -> 64", "--swiglu false -> true", "--moe-router-topk 2 -> 1"}));
  EXPECT_EQ(c.layer.hidden_size, 64);
  EXPECT_EQ(c.layer.expert, model::ExpertKind::swiglu);
  EXPECT_EQ(c.layer.moe_router_topk, 1);
  EXPECT_EQ(c.lr, defaults.lr);
}

// The checkpoint marker has one parser (read_checkpoint_info and load_checkpoint agree on its bound).
TEST(TrainConfig, LatestMarkerIsAnIterationUpToTheBound) {
  EXPECT_EQ(train::parse_latest_marker("12\n"), 12);
  EXPECT_EQ(train::parse_latest_marker("0"), 0);
  EXPECT_EQ(train::parse_latest_marker(std::to_string(train::kMaxCheckpointIteration)),
            train::kMaxCheckpointIteration);
  EXPECT_EQ(train::parse_latest_marker(std::to_string(train::kMaxCheckpointIteration + 1)), -1);
  EXPECT_EQ(train::parse_latest_marker("-1"), -1);
  EXPECT_EQ(train::parse_latest_marker("12 x"), -1);
  EXPECT_EQ(train::parse_latest_marker(""), -1);
  EXPECT_EQ(train::parse_latest_marker("99999999999999999999999"), -1);
}

TEST(LearningRate, WarmupThenCosineToMinLr) {
  train::TrainConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.lr_warmup_iters = 10;
  c.train_iters = 110;
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 0), 0.1);
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 9), 1.0);
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 10), 1.0);
  EXPECT_NEAR(train::learning_rate(c, 60), 0.55, 1e-12);
  EXPECT_NEAR(train::learning_rate(c, 110), 0.1, 1e-12);
}

// Megatron's three decay styles with --lr-decay-iters 60 before --train-iters 110, against values computed by hand:
// warm-up 10 iterations to lr 1, then over iterations 10..60 (r = (it - 10) / 50) to min_lr 0.1, then min_lr.
TEST(LearningRate, DecayStylesAndDecayIters) {
  train::TrainConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.lr_warmup_iters = 10;
  c.train_iters = 110;
  c.lr_decay_iters = 60;
  c.lr_decay_style = "constant";
  EXPECT_NO_THROW(c.validate(1));
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 0), 0.1);  // warm-up is the same for every style
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 10), 1.0);
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 100), 1.0);
  c.lr_decay_style = "linear";
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 4), 0.5);
  EXPECT_NEAR(train::learning_rate(c, 10), 1.0, 1e-12);
  EXPECT_NEAR(train::learning_rate(c, 35), 0.55, 1e-12);  // r = 0.5: 0.1 + 0.9 * 0.5
  EXPECT_NEAR(train::learning_rate(c, 50), 0.28, 1e-12);  // r = 0.8: 0.1 + 0.9 * 0.2
  EXPECT_NEAR(train::learning_rate(c, 60), 0.1, 1e-12);
  EXPECT_NEAR(train::learning_rate(c, 100), 0.1, 1e-12);
  c.lr_decay_style = "cosine";
  EXPECT_NEAR(train::learning_rate(c, 20), 0.914057647468726, 1e-12);  // r = 0.2: 0.1 + 0.9 * (1 + cos 36 deg) / 2
  EXPECT_NEAR(train::learning_rate(c, 35), 0.55, 1e-12);
  EXPECT_NEAR(train::learning_rate(c, 85), 0.1, 1e-12);
  c.lr_decay_iters = 0;  // 0: decay to --train-iters
  EXPECT_NEAR(train::learning_rate(c, 60), 0.55, 1e-12);
  c.lr_decay_style = "exponential";
  EXPECT_THAT(message(c, 1), 
              ::testing::HasSubstr("--lr-decay-style exponential is not one of constant, linear, cosine"));
  c.lr_decay_style = "linear";
  c.lr_decay_iters = 5;
  EXPECT_THAT(message(c, 1), ::testing::HasSubstr("--lr-decay-iters 5 is invalid: it must be >= --lr-warmup-iters 10"));
  // A warm-up may outlast the run only with a decay that does (Megatron's lr_warmup_steps < lr_decay_steps)
  c.lr_warmup_iters = 200;
  c.lr_decay_iters = 0;
  EXPECT_THAT(message(c, 1), 
              ::testing::HasSubstr("--lr-warmup-iters 200 is invalid: it must be in [0, --train-iters 110]"));
  c.lr_decay_iters = 1000;
  EXPECT_NO_THROW(c.validate(1));
  EXPECT_NEAR(train::learning_rate(c, 99), 0.5, 1e-12);  // still warming up at iteration 100 of 110
}

TEST(TextData, ShuffledEpochsVisitEveryWindowOnceAndHoldOutTheTail) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += char('a' + i % 26);
  train::TextData d(train::text_corpus(text), 8, 0.1, 3, "test");
  EXPECT_EQ(d.train_samples(), (1800 - 1) / 8);
  EXPECT_EQ(d.valid_samples(), (200 - 1) / 8);
  std::vector<int32_t> in(8), tg(8);
  std::set<int32_t> firsts_epoch0;
  const int64_t N = d.train_samples();
  std::vector<int> order;
  for (int64_t g = 0; g < N; ++g) {
    d.train_sample(g, in, tg);
    for (int i = 0; i < 7; ++i) EXPECT_EQ(tg[size_t(i)], in[size_t(i + 1)]);
    order.push_back(in[0]);
  }
  // Deterministic by seed: a second object gives the same order; epoch 1 is a different order.
  train::TextData d2(train::text_corpus(text), 8, 0.1, 3, "test");
  d2.train_sample(5, in, tg);
  EXPECT_EQ(in[0], order[5]);
  int same = 0;
  for (int64_t g = 0; g < N; ++g) {
    d.train_sample(N + g, in, tg);
    same += in[0] == order[size_t(g)];
  }
  EXPECT_LT(same, N / 2);
}

// --split 8,1,1: validation and test tokens are floor(n/10) each, after the training tokens, in that order.
TEST(TextData, SplitIsTrainValidTestInOrder) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += char('a' + (i * 7) % 26);
  const train::DataSplit sp = train::parse_split("8,1,1");
  EXPECT_EQ(train::split_str(sp), "8,1,1");
  train::TextData d(train::text_corpus(text), 8, sp, 3, "test");
  EXPECT_EQ(d.train_samples(), (1600 - 1) / 8);
  EXPECT_EQ(d.valid_samples(), (200 - 1) / 8);
  EXPECT_EQ(d.test_samples(), (200 - 1) / 8);
  std::vector<int32_t> in(8), tg(8);
  d.valid_sample(0, in, tg);
  EXPECT_EQ(in[0], int32_t('a' + (1600 * 7) % 26));
  d.test_sample(1, in, tg);
  EXPECT_EQ(in[0], int32_t('a' + (1808 * 7) % 26));
  EXPECT_EQ(tg[7], int32_t('a' + (1816 * 7) % 26));
  // --valid-fraction f is the split 1-f, f, 0: the same windows as before --split existed.
  train::TextData v(train::text_corpus(text), 8, 0.1, 3, "test");
  EXPECT_EQ(v.valid_samples(), (200 - 1) / 8);
  EXPECT_EQ(v.test_samples(), 0);
  EXPECT_EQ(train::parse_split("969,30").test, 0.0);
  EXPECT_THROW(train::parse_split("1,2,3,4"), ConfigError);
  EXPECT_THROW(train::parse_split("1,-1"), ConfigError);
  EXPECT_THROW(train::parse_split("1,"), ConfigError);
}

TEST(TextData, RejectsEmptyAndBinaryFiles) {
  EXPECT_THROW(train::load_corpus("/dev/null"), ConfigError);
  EXPECT_THROW(train::load_corpus("/nonexistent"), ConfigError);
  EXPECT_NO_THROW(train::load_corpus(""));  // the bundled corpus
}

namespace {
// Writes an llm.c token file: 256 int32 header (magic, version, count), then uint16 ids.
std::string write_token_file(const std::string& name, const std::vector<uint16_t>& ids, int32_t version = 1,
                             int32_t count = -1) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::vector<int32_t> header(256, 0);
  header[0] = train::kTokenFileMagic;
  header[1] = version;
  header[2] = count >= 0 ? count : int32_t(ids.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 256 * 4);  // little-endian host (x86-64)
  out.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
  return path;
}
}  // namespace

TEST(TextData, ReadsPreTokenizedLlmcTokenFiles) {
  std::vector<uint16_t> ids;
  for (int i = 0; i < 3000; ++i) ids.push_back(uint16_t((i * 7919) % 50257));
  const train::Corpus c = train::load_corpus(write_token_file("ok.bin", ids));
  ASSERT_EQ(c.tokens.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(c.tokens[i], int32_t(ids[i]));
  EXPECT_EQ(c.vocab_size, 50239);  // the largest id, 50238, + 1 (not padded: train::size_vocabulary pads it)
  const train::TextData d(c, 16, 0.1, 3, "tokens");
  std::vector<int32_t> in(16), tg(16);
  d.valid_sample(0, in, tg);
  EXPECT_EQ(in[1], tg[0]);  // targets are the inputs shifted by one token
  // A wrong version or a count that does not match the file size is refused, naming the flag and the file.
  for (const std::string& bad : {write_token_file("v2.bin", ids, 2), write_token_file("short.bin", ids, 1, 5000)}) {
    try {
      train::load_corpus(bad);
      FAIL() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--data-path " + bad), std::string::npos) << e.what();
    }
  }
}
