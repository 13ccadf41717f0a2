#include "ampipe/cli/flag_registry.h"

#include <algorithm>
#include <sstream>

#include "ampipe/cli/bench_layer.h"
#include "ampipe/cli/calibrate.h"
#include "ampipe/cli/layer_check.h"
#include "ampipe/cli/layer_flags.h"
#include "ampipe/cli/megatron_flags.h"
#include "ampipe/cli/memory_check.h"
#include "ampipe/cli/plan.h"
#include "ampipe/cli/preprocess.h"
#include "ampipe/cli/simulate.h"
#include "ampipe/cli/train_flags.h"
#include "ampipe/core/error.h"
#include "ampipe/train/text_data.h"

namespace ampipe::cli {

namespace {

// Who takes which flags.
constexpr unsigned kTrainSubs = kTrain | kSimulate;                        // TrainFlags
constexpr unsigned kRuntimeSubs = kLayerCheck | kBenchLayer | kTrainSubs;  // CommFlags, MemoryFlags
constexpr unsigned kLayerSubs = kRuntimeSubs | kPlan;                      // LayerFlags
constexpr unsigned kDef = kShowDefault;

// The field a flag sets: an lvalue reached from the FlagTargets `t`.
#define AT(lvalue) [](const FlagTargets& t) -> FlagRef { return &t.lvalue; }

using G = Grammar;

FlagSpec flag(const char* name, unsigned subs, const char* group, Grammar grammar, std::string help,
              FlagRef (*field)(const FlagTargets&), unsigned attrs = 0) {
  FlagSpec s;
  s.name = name;
  s.subs = subs;
  s.group = group;
  s.grammar = grammar;
  s.help = std::move(help);
  s.field = field;
  s.attrs = attrs;
  return s;
}

// Megatron flags `ampipe train` (and simulate) parse only to refuse (megatron_flags.h); with `accepted`, that one
// value passes.
FlagSpec refused(const char* name, Grammar grammar, const char* reason, const char* accepted = nullptr,
                 unsigned subs = kTrainSubs) {
  FlagSpec s = flag(name, subs, kGroupRefused, grammar, std::string("not supported: ") + reason, nullptr);
  s.refused = reason;
  s.accepted = accepted;
  return s;
}

// Megatron / MindSpeed flags `ampipe train` (and simulate) accept with no effect on this engine: parsed with their
// grammar (and `choices`, "a|b"), named by one start-up note with `why` (RefusedFlags::noop_note).
FlagSpec noop(const char* name, Grammar grammar, const char* why, const char* choices = nullptr) {
  std::string help = std::string("no effect: ") + why;
  if (choices != nullptr) {
    std::string c = choices;
    std::replace(c.begin(), c.end(), '|', ',');
    help += " (Megatron's values: " + c + ")";
  }
  FlagSpec s = flag(name, kTrainSubs, kGroupNoEffect, grammar, help, nullptr);
  s.noop = why;
  s.choices = choices;
  return s;
}

// The Megatron-LM / MindSpeed / MindSpeed-LLM flags with no effect here, with Megatron's value grammar
// (megatron/training/arguments.py, mindspeed/arguments.py). Those whose meaning would change the result are refused
// instead (add_train_output_flags); --no-save-optim is not here: this engine saves the optimizer state.
void add_noop_flags(std::vector<FlagSpec>& v) {
  constexpr const char* kFusion = "GPU kernel fusion";
  constexpr const char* kKernel = "GPU kernel choice";
  constexpr const char* kCuda = "NCCL/CUDA only";
  constexpr const char* kOverlap = "GPU/NPU communication overlap";
  constexpr const char* kLoader = "dataloader workers";
  constexpr const char* kTimers = "timers/logging detail";
  constexpr const char* kCkpt = "checkpoint format details";
  constexpr const char* kFp16 = "fp16 loss scaling only; --fp16 is refused";
  for (const char* f : {"--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion", "--no-bias-dropout-fusion",
                        "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--no-rope-fusion", "--use-fused-swiglu",
                        "--use-fused-rmsnorm", "--use-fused-rotary-pos-emb", "--no-persist-layer-norm"})
    v.push_back(noop(f, G::on_off, kFusion));
  v.push_back(noop("--jit-compile", G::on_off, "NPU kernel compilation"));
  v.push_back(noop("--transformer-impl", G::text, kKernel, "local|transformer_engine"));
  v.push_back(noop("--attention-backend", G::text, kKernel, "flash|fused|unfused|local|auto"));
  v.push_back(noop("--use-mcore-models", G::on_off, "Megatron's model implementation choice"));
  v.push_back(noop("--use-legacy-models", G::on_off, "Megatron's model implementation choice"));
  v.push_back(noop("--attention-softmax-in-fp32", G::on_off, "the attention softmax is always fp32 here"));
  v.push_back(noop("--disable-bias-linear", G::on_off, "the linear layers have no biases here"));
  v.push_back(noop("--no-async-tensor-model-parallel-allreduce", G::on_off, "deprecated; Megatron ignores it too"));
  v.push_back(noop("--use-cpu-initialization", G::on_off,
                   "weights are always initialised on the CPU, whole, then sharded over tp"));
  v.push_back(noop("--empty-unused-memory-level", G::integer, kCuda, "0|1|2"));
  v.push_back(
      noop("--distributed-timeout-minutes", G::integer, "NCCL/CUDA only; the wait limit here is --comm-timeout"));
  v.push_back(noop("--reuse-fp32-param", G::on_off, "NPU memory saving of the distributed optimizer"));
  v.push_back(noop("--moe-permutation-async-comm", G::on_off, kOverlap));
  v.push_back(noop("--use-cp-send-recv-overlap", G::on_off, kOverlap));
  v.push_back(noop("--manual-gc", G::on_off, "Python garbage collection"));
  v.push_back(noop("--manual-gc-interval", G::integer, "Python garbage collection"));
  v.push_back(noop("--num-workers", G::integer, kLoader));
  v.push_back(noop("--num-dataset-builder-threads", G::integer, kLoader));
  v.push_back(noop("--no-create-attention-mask-in-dataloader", G::on_off,
                   "dataloader detail: the attention is causal in its kernel"));
  v.push_back(noop("--no-mmap-bin-files", G::on_off, "dataloader detail"));
  v.push_back(noop("--data-cache-path", G::text, "dataloader index cache"));
  for (const char* f : {"--log-throughput", "--no-barrier-with-level-1-timing", "--log-timers-to-tensorboard",
                        "--log-validation-ppl-to-tensorboard", "--log-memory-to-tensorboard",
                        "--log-world-size-to-tensorboard", "--no-log-loss-scale-to-tensorboard", "--log-params-norm",
                        "--log-num-zeros-in-grad"})
    v.push_back(noop(f, G::on_off, kTimers));
  v.push_back(noop("--timing-log-level", G::integer, kTimers, "0|1|2"));
  v.push_back(noop("--timing-log-option", G::text, kTimers, "max|minmax|all"));
  v.push_back(noop("--tensorboard-queue-size", G::integer, kTimers));
  v.push_back(noop("--ckpt-format", G::text, kCkpt, "torch|torch_dist|zarr|torch_dcp|fsdp_dtensor"));
  v.push_back(noop("--no-shared-storage", G::on_off, kCkpt));
  // No random state is restored from a checkpoint: all random numbers come from this run's --seed (checkpoint.h).
  v.push_back(noop("--no-load-rng", G::on_off, "no random state is loaded here: this run's --seed keys them all"));
  v.push_back(noop("--no-save-rng", G::on_off, "no random state is loaded here: this run's --seed keys them all"));
  for (const char* f : {"--initial-loss-scale", "--min-loss-scale", "--loss-scale-window"})
    v.push_back(noop(f, G::number, kFp16));
  v.push_back(noop("--hysteresis", G::integer, kFp16));
  // Megatron without the check trains on; this engine stops on every rank at a NaN or Inf loss or gradient norm
  // (docs/training.md): a run without NaN is the same, and a run with one does not go on silently.
  v.push_back(noop("--no-check-for-nan-in-loss-and-grad", G::on_off,
                   "ignored: this engine always stops on a NaN loss or gradient"));
}

// The layer (LayerFlags), shared by every subcommand that builds a layer, and the runtime flags.
void add_layer_flags(std::vector<FlagSpec>& v) {
  const unsigned L = kLayerSubs;
  v.push_back(flag("--seq-length", L, kGroupModel, G::integer, "sequence length s", AT(layer->cfg.seq_length), kDef));
  v.push_back(flag("--micro-batch-size", L, kGroupTraining, G::integer, "sequences per micro-batch b",
                   AT(layer->cfg.micro_batch_size), kDef));
  v.push_back(flag("--hidden-size", L, kGroupModel, G::integer, "hidden size h", AT(layer->cfg.hidden_size), kDef));
  v.push_back(flag("--ffn-hidden-size", L, kGroupModel, G::integer,
                   "expert FFN hidden size F (default: Megatron's 4 x --hidden-size; with --swiglu 4h x 2/3 rounded "
                   "down to a multiple of 64)",
                   AT(layer->cfg.ffn_hidden_size)));
  v.push_back(flag("--num-attention-heads", L, kGroupModel, G::integer, "attention heads n",
                   AT(layer->cfg.num_attention_heads), kDef));
  v.push_back(flag("--num-experts", L, kGroupMoe, G::integer,
                   "experts E (train, simulate: required, since without it Megatron trains a dense GPT and this "
                   "engine has MoE blocks only; layer-check, bench-layer, plan: default 4)",
                   AT(layer->cfg.num_experts)));
  v.push_back(flag("--moe-router-topk", L, kGroupMoe, G::integer, "experts per token k (1 or 2)",
                   AT(layer->cfg.moe_router_topk), kDef));
  v.push_back(flag("--moe-train-capacity-factor", L, kGroupMoe, G::number, "expert capacity factor",
                   AT(layer->cfg.moe_train_capacity_factor), kDef));
  v.push_back(flag("--moe-min-capacity", L, kGroupMoe, G::integer, "minimum expert capacity",
                   AT(layer->cfg.moe_min_capacity), kDef));
  v.push_back(flag("--moe-no-drop", L, kGroupMoe, G::on_off, "no capacity limit: no token is dropped",
                   AT(layer->cfg.moe_no_drop)));
  v.push_back(
      flag("--no-use-rts", L, kGroupMoe, G::on_off, "turn off random token selection (top-1)", AT(layer->no_use_rts)));
  v.push_back(flag("--noisy-gate-policy", L, kGroupMoe, G::text, "None, Jitter or RSample",
                   AT(layer->noisy_gate_policy), kDef));
  v.push_back(flag("--swiglu", L, kGroupModel, G::on_off, "SwiGLU experts instead of GeLU", AT(layer->swiglu)));
  v.push_back(flag("--normalization", L, kGroupModel, G::text,
                   "LayerNorm or RMSNorm (weight only, no biases): LN1, LN2 and the final norm",
                   AT(layer->normalization), kDef));
  v.push_back(flag("--norm-epsilon", L, kGroupModel, G::number, "epsilon inside the normalisation's square root",
                   AT(layer->norm_epsilon), kDef));
  v.push_back(flag("--hidden-dropout", L, kGroupModel, G::number, "dropout after attention and after the MoE",
                   AT(layer->cfg.hidden_dropout), kDef));
  v.push_back(flag("--attention-dropout", L, kGroupModel, G::number,
                   "dropout on the attention probabilities (Megatron's; keyed by query token, head and key position)",
                   AT(layer->cfg.attention_dropout), kDef));
  v.push_back(flag("--init-method-std", L, kGroupModel, G::number, "std of the normal weight init",
                   AT(layer->cfg.init_method_std), kDef));
  v.push_back(flag("--seed", L, kGroupModel, G::uint64, "global random seed (0 .. 2^64-1)", AT(layer->cfg.seed), kDef));
  v.push_back(flag("--bf16", L, kGroupModel, G::on_off, "bf16 GEMM inputs and all-to-all payloads, fp32 accumulation",
                   AT(layer->cfg.bf16)));
  v.push_back(flag("--expert-model-parallel-size", L, kGroupParallel, G::integer, "expert-parallel size ep",
                   AT(layer->cfg.expert_model_parallel_size), kDef));
  v.push_back(flag("--tensor-model-parallel-size", L, kGroupParallel, G::integer,
                   "tensor-parallel size tp (Megatron's column/row-parallel attention and experts)",
                   AT(layer->cfg.tensor_model_parallel_size), kDef));
  v.push_back(flag("--sequence-parallel", L, kGroupParallel, G::on_off,
                   "Megatron sequence parallelism: LayerNorms, dropout, residual and gate on seq-length/tp rows per "
                   "rank",
                   AT(layer->cfg.sequence_parallel)));
  v.push_back(flag("--context-parallel-size", L, kGroupParallel, G::integer,
                   "context-parallel size cp: ring attention over load-balanced halves of the sequence",
                   AT(layer->cfg.context_parallel_size), kDef));
  v.push_back(flag("--context-parallel-algo", L, kGroupParallel, G::text,
                   "context-parallel algorithm (megatron_cp_algo)", AT(layer->cfg.context_parallel_algo), kDef));
  v.push_back(flag("--ampipe-tp-sp-comm-overlap", L, kGroupParallel, G::on_off,
                   "overlap the experts' tensor-parallel collectives per (chunk, local expert) piece",
                   AT(layer->cfg.ampipe_tp_sp_comm_overlap)));
  v.push_back(flag("--use-pipe-experts", L, kGroupMoe, G::on_off,
                   "slice each expert's tokens to overlap its all-to-all", AT(layer->cfg.use_pipe_experts)));
  v.push_back(flag("--pipe-experts-multi-stream", L, kGroupMoe, G::on_off, "pipe-experts multi-stream",
                   AT(layer->cfg.pipe_experts_multi_stream)));
  v.push_back(flag("--pipe-experts-multi-data", L, kGroupMoe, G::integer, "pipe-experts slices N",
                   AT(layer->cfg.pipe_experts_multi_data), kDef));
  v.push_back(flag("--moe-aux-loss-coeff", L, kGroupMoe, G::number, "coefficient of the load-balancing loss",
                   AT(layer->moe_aux_loss_coeff), kDef));
  // Runtime (CommFlags, MemoryFlags).
  const unsigned R = kRuntimeSubs;
  v.push_back(flag("--check-collectives", R, kGroupParallel, G::on_off,
                   "exchange a fingerprint of every collective and fail on every rank when ranks diverge",
                   AT(comm->check_collectives), kAgree));
  v.push_back(flag("--comm-timeout", R, kGroupParallel, G::number,
                   "seconds a wait may block before the job is aborted (at most a week; larger values are clamped)",
                   AT(comm->comm_timeout_s), kDef | kAgree));
  v.push_back(flag("--memory-limit", R, kGroupTraining, G::text,
                   "peak memory this rank may use, e.g. 8G or 512M (binary suffixes); default: the host's available "
                   "memory (MemAvailable or the cgroup limit, shared by the ranks on the host); 0: no check",
                   AT(memory->memory_limit), kDef));
}

// layer-check, bench-layer and plan: their own flags.
void add_layer_command_flags(std::vector<FlagSpec>& v) {
  v.push_back(flag(
      "--ampipe-degree", kLayerCheck | kPlan, kGroupMoe, G::degree, "AMPipe degree M: chunks the sequence is cut into",
      [](const FlagTargets& t) -> FlagRef { return t.plan ? &t.plan->ampipe_degree : &t.layer_check->ampipe_degree; },
      kDef));
  v.push_back(flag("--global-batch-size", kLayerCheck, kGroupTraining, G::integer,
                   "sequences in the global batch (default: micro-batch size x data-parallel ranks)",
                   AT(layer_check->global_batch_size)));
  v.push_back(flag("--export", kLayerCheck, kGroupOptions, G::text,
                   "write params/inputs/outputs/grads safetensors into this directory", AT(layer_check->export_dir),
                   kPath));
  v.push_back(flag("--trace", kLayerCheck, kGroupLogging, G::text,
                   "write a Chrome trace (Perfetto) of the step to this file", AT(layer_check->trace_file), kPath));
  const unsigned B = kBenchLayer;
  v.push_back(flag("--ampipe-degree", B, kGroupMoe, G::degree_list,
                   "AMPipe degrees to compare, e.g. 1,2,4,8 (default 1,2,4), or auto: the degree the simulator "
                   "predicts fastest (on --sim-profile, else a self-calibration), run next to degree 1",
                   AT(bench->degree_text), kDef));
  v.push_back(flag("--sim-profile", B, kGroupMoe, G::text,
                   "hardware profile (ampipe calibrate): for --ampipe-degree auto, and to print the simulator's "
                   "predicted step next to every measured one",
                   AT(bench->sim_profile), kPath));
  v.push_back(flag("--pipe-experts-sweep", B, kGroupOptions, G::int_list,
                   "pipe-experts slice counts N to compare, crossed with --ampipe-degree (0 = without pipe-experts), "
                   "e.g. 0,1,2,4; combinations the pipe-experts rules refuse are skipped and listed",
                   AT(bench->pipe_experts_sweep)));
  v.push_back(flag("--tp-overlap-sweep", B, kGroupOptions, G::int_list,
                   "comma list of 0/1: run every degree without and/or with --ampipe-tp-sp-comm-overlap (tp > 1; "
                   "degree 1 runs without it)",
                   AT(bench->tp_overlap_sweep)));
  v.push_back(flag("--num-layers", B, kGroupModel, G::integer, "layers per step", AT(bench->num_layers), kDef));
  v.push_back(
      flag("--warmup", B, kGroupOptions, G::integer, "untimed repetitions per degree", AT(bench->warmup), kDef));
  v.push_back(flag("--iters", B, kGroupOptions, G::integer, "timed repetitions per degree", AT(bench->iters), kDef));
  v.push_back(flag("--json", B, kGroupLogging, G::text, "also write the results as JSON to this file",
                   AT(bench->json_file), kPath));
  v.push_back(flag("--trace", B, kGroupLogging, G::text,
                   "Chrome trace of the last repetition of every degree (each step also gets a 'bench.step "
                   "degree=M' record, cat 'step', on the compute lane)",
                   AT(bench->trace_file), kPath));
  v.push_back(flag("--poll-us", B, kGroupOptions, G::integer,
                   "engine sleep in microseconds after a polling pass that completed nothing (default: runtime's, 100)",
                   AT(bench->poll_us)));
  v.push_back(flag("--num-layers", kPlan, kGroupModel, G::integer, "layers of the stack, for the planned memory",
                   AT(plan->num_layers), kDef));
  v.push_back(flag("--json", kPlan, kGroupLogging, G::text,
                   "also write the tasks, the buffers and the summary as JSON to this file", AT(plan->json_file),
                   kPath));
  v.push_back(flag("--step", kPlan, kGroupLogging, G::on_off,
                   "print the whole training step's Plan (every micro-batch's layers, embedding, head, the gradient "
                   "buckets, the optimizer) instead of one layer's",
                   AT(plan->step)));
  v.push_back(flag("--global-batch-size", kPlan, kGroupTraining, G::integer,
                   "with --step: sequences per iteration (default: one micro-batch per data-parallel rank)",
                   AT(plan->global_batch_size)));
  v.push_back(flag("--world-size", kPlan, kGroupParallel, G::integer,
                   "with --step: devices (data-parallel size = world / (tp x cp))", AT(plan->world_size), kDef));
  v.push_back(flag("--vocab-size", kPlan, kGroupModel, G::integer, "with --step: vocabulary of the LM head",
                   AT(plan->vocab_size), kDef));
}

// `ampipe train` (and `ampipe simulate`, which takes the train flags): the model and the parallelism.
void add_train_model_flags(std::vector<FlagSpec>& v) {
  const unsigned T = kTrainSubs;
  v.push_back(flag("--config", T, kGroupTraining, G::text,
                   "JSON file of flags (keys: flag names); command-line flags override it", AT(train->config_file),
                   kPath | kNoConfig));
  v.push_back(flag("--num-layers", T, kGroupModel, G::integer, "MoE blocks L", AT(train->cfg.num_layers), kDef));
  v.push_back(flag("--untie-embeddings-and-output-weights", T, kGroupModel, G::on_off,
                   "separate LM-head matrix instead of the token embedding",
                   AT(train->cfg.untie_embeddings_and_output_weights)));
  v.push_back(flag("--moe-model-type", T, kGroupMoe, G::text,
                   "deepspeed_moe (the MoE layer of this engine) or megatron_moe", AT(train->cfg.moe_model_type),
                   kDef));
  v.push_back(flag("--use-flash-attn", T, kGroupModel, G::on_off,
                   "flash attention (this engine's only attention kernel; required with --ampipe-degree > 1)",
                   AT(train->cfg.use_flash_attn)));
  v.push_back(flag("--add-bias-linear", T, kGroupNotRun, G::on_off, "biases in linear layers (not supported)",
                   AT(train->cfg.add_bias_linear)));
  v.push_back(flag("--max-position-embeddings", T, kGroupModel, G::integer,
                   "Megatron's position-embedding size: must be >= --seq-length (the embedding has --seq-length "
                   "rows, the only positions a sequence uses)",
                   AT(train->cfg.max_position_embeddings)));
  v.push_back(flag("--distributed-backend", T, kGroupParallel, G::text,
                   "mpi: this engine communicates over MPI (Megatron's nccl and gloo are accepted with a note)",
                   AT(train->cfg.distributed_backend), kDef));
  // simulate takes a list instead (its entry below); train's is kept as given for the rank agreement
  v.push_back(flag("--ampipe-degree", kTrain, kGroupMoe, G::degree_auto,
                   "AMPipe degree M: chunks the sequence is cut into, or auto (the degree the simulator predicts "
                   "fastest on --sim-profile, else on a self-calibration at start-up)",
                   AT(train->ampipe_degree), kDef | kAgree));
  v.push_back(flag("--sim-profile", kTrain, kGroupMoe, G::text,
                   "hardware profile for --ampipe-degree auto (ampipe calibrate --out)", AT(train->sim_profile),
                   kPath | kAgree));
  const char* kIncompatible = "(incompatible with AMPipe)";
  v.push_back(flag("--use-ascend-mc2", T, kGroupNotRun, G::on_off, kIncompatible, AT(train->cfg.use_ascend_mc2)));
  v.push_back(
      flag("--overlap-grad-reduce", T, kGroupNotRun, G::on_off, kIncompatible, AT(train->cfg.overlap_grad_reduce)));
  v.push_back(
      flag("--overlap-param-gather", T, kGroupNotRun, G::on_off, kIncompatible, AT(train->cfg.overlap_param_gather)));
  v.push_back(flag("--use-nanopipe", T, kGroupNotRun, G::on_off, kIncompatible, AT(train->cfg.use_nanopipe)));
  v.push_back(
      flag("--recompute-in-bubble", T, kGroupNotRun, G::on_off, kIncompatible, AT(train->cfg.recompute_in_bubble)));
  v.push_back(
      flag("--recompute-in-advance", T, kGroupNotRun, G::on_off, kIncompatible, AT(train->cfg.recompute_in_advance)));
  v.push_back(flag("--adaptive-recompute-device-swap", T, kGroupNotRun, G::on_off, kIncompatible,
                   AT(train->cfg.adaptive_recompute_device_swap)));
  v.push_back(flag("--adaptive-recompute-device-size", T, kGroupNotRun, G::integer, kIncompatible,
                   AT(train->cfg.adaptive_recompute_device_size)));
  v.push_back(flag("--adaptive-memory-optimization", T, kGroupNotRun, G::on_off, kIncompatible,
                   AT(train->cfg.adaptive_memory_optimization)));
  v.push_back(flag("--recompute-granularity", T, kGroupTraining, G::text,
                   "full: recompute whole layers in the backward; selective: recompute every layer's attention core "
                   "only",
                   AT(train->cfg.recompute_granularity)));
  v.push_back(flag("--recompute-activations", T, kGroupTraining, G::on_off,
                   "Megatron's spelling of --recompute-granularity selective", AT(train->recompute_activations)));
  v.push_back(flag("--recompute-method", T, kGroupTraining, G::text,
                   "with full: uniform (every layer) or block (the first --recompute-num-layers layers)",
                   AT(train->cfg.recompute_method)));
  v.push_back(flag("--recompute-num-layers", T, kGroupTraining, G::integer,
                   "block: layers recomputed; uniform: Megatron's layers per group (every layer is recomputed here)",
                   AT(train->cfg.recompute_num_layers), kDef));
}

// `ampipe train`: the optimizer, the schedule and the data.
void add_train_schedule_flags(std::vector<FlagSpec>& v) {
  const unsigned T = kTrainSubs;
  v.push_back(flag("--global-batch-size", T, kGroupTraining, G::integer,
                   "sequences per iteration (default: micro-batch size x data-parallel size)",
                   AT(train->cfg.global_batch_size)));
  v.push_back(flag("--train-iters", T, kGroupTraining, G::integer, "iterations", AT(train->cfg.train_iters), kDef));
  v.push_back(flag("--train-samples", T, kGroupTraining, G::integer,
                   "train for this many sequences instead: --train-iters = samples / global batch (Megatron's "
                   "meaning)",
                   AT(train->cfg.train_samples)));
  v.push_back(flag("--exit-interval", T, kGroupTraining, G::integer,
                   "stop at the first iteration divisible by N, counted from iteration 0 as in Megatron (0: never)",
                   AT(train->cfg.exit_interval), kDef));
  v.push_back(flag("--skip-train", T, kGroupTraining, G::on_off,
                   "no training: evaluate the model (--load) on the validation and test splits",
                   AT(train->cfg.skip_train)));
  v.push_back(flag("--lr", T, kGroupLr, G::number, "peak learning rate", AT(train->cfg.lr), kDef));
  v.push_back(
      flag("--min-lr", T, kGroupLr, G::number, "learning rate at the end of the decay", AT(train->cfg.min_lr), kDef));
  v.push_back(flag("--lr-warmup-iters", T, kGroupLr, G::integer, "linear warm-up iterations",
                   AT(train->cfg.lr_warmup_iters), kDef));
  v.push_back(flag("--lr-decay-style", T, kGroupLr, G::text,
                   "after the warm-up: constant, linear or cosine (to --min-lr)", AT(train->cfg.lr_decay_style), kDef));
  v.push_back(flag("--lr-decay-iters", T, kGroupLr, G::integer,
                   "iteration at which the decay reaches --min-lr (0: --train-iters)", AT(train->cfg.lr_decay_iters),
                   kDef));
  v.push_back(flag("--weight-decay", T, kGroupTraining, G::number, "AdamW decoupled weight decay (matrices only)",
                   AT(train->cfg.weight_decay), kDef));
  v.push_back(flag("--adam-beta1", T, kGroupTraining, G::number, "AdamW beta1", AT(train->cfg.adam_beta1), kDef));
  v.push_back(flag("--adam-beta2", T, kGroupTraining, G::number, "AdamW beta2", AT(train->cfg.adam_beta2), kDef));
  v.push_back(flag("--adam-eps", T, kGroupTraining, G::number, "AdamW epsilon", AT(train->cfg.adam_eps), kDef));
  v.push_back(flag("--clip-grad", T, kGroupTraining, G::number, "clip the global gradient norm to this (0: off)",
                   AT(train->cfg.clip_grad), kDef));
  v.push_back(flag("--data-path", T, kGroupData, G::string_list,
                   "training data: a plain-text file, a pre-tokenized llm.c token file, or Megatron's indexed "
                   "dataset PREFIX (PREFIX.bin + PREFIX.idx) or blend of them: weights and prefixes (0.7 A 0.3 B) or "
                   "prefixes (A B, weighted by their sizes), each cut by --split (default: the bundled corpus)",
                   AT(train->cfg.data_path), kPath));
  v.push_back(flag("--train-data-path", T, kGroupData, G::string_list,
                   "Megatron's separate training data instead of --data-path and --split: an indexed dataset "
                   "prefix or a blend, as --data-path's, used whole",
                   AT(train->cfg.train_data_path), kPath));
  v.push_back(flag("--valid-data-path", T, kGroupData, G::string_list,
                   "the validation data with --train-data-path (without it: no evaluation, as in Megatron)",
                   AT(train->cfg.valid_data_path), kPath));
  v.push_back(flag("--test-data-path", T, kGroupData, G::string_list,
                   "the test data with --train-data-path (without it: no test evaluation)",
                   AT(train->cfg.test_data_path), kPath));
  v.push_back(flag("--tokenizer-type", T, kGroupData, G::text,
                   "SentencePieceTokenizer or HuggingFaceTokenizer (with --tokenizer-model), GPT2BPETokenizer (with "
                   "--vocab-file, --merge-file); default: bytes of plain text, ids of a token file or dataset",
                   AT(train->cfg.tokenizer_type)));
  v.push_back(flag("--tokenizer-model", T, kGroupData, G::text,
                   "SentencePiece model, or a Hugging Face tokenizer.json (or its directory): tokenizes a plain-text "
                   "--data-path at load, and gives the vocabulary size",
                   AT(train->cfg.tokenizer_model), kPath));
  v.push_back(flag("--vocab-file", T, kGroupData, G::text, "GPT2BPETokenizer's vocab.json",
                   AT(train->cfg.vocab_file), kPath));
  v.push_back(flag("--merge-file", T, kGroupData, G::text, "GPT2BPETokenizer's merges.txt",
                   AT(train->cfg.merge_file), kPath));
  v.push_back(flag("--valid-fraction", T, kGroupData, G::number,
                   "tail of the text held out for validation: the split 1-f,f,0 instead of --split (0: --split)",
                   AT(train->cfg.valid_fraction),
                   kDef));
  v.push_back(flag("--split", T, kGroupData, G::text,
                   "train,valid,test weights of the token stream, or of each indexed dataset's documents, in that "
                   "order (Megatron's default with --data-path: 969,30,1)",
                   AT(train->cfg.split), kDef));
  v.push_back(flag("--eval-interval", T, kGroupData, G::integer, "evaluate every N iterations (0: never)",
                   AT(train->cfg.eval_interval), kDef));
  v.push_back(flag("--eval-iters", T, kGroupData, G::integer, "global batches per evaluation (0: no evaluation)",
                   AT(train->cfg.eval_iters), kDef));
}

// `ampipe train`: checkpoints, output, and the Megatron flags it refuses.
void add_train_output_flags(std::vector<FlagSpec>& v) {
  const unsigned T = kTrainSubs;
  v.push_back(
      flag("--save", T, kGroupCheckpoint, G::text, "checkpoint directory to write", AT(train->cfg.save), kPath));
  v.push_back(
      flag("--load", T, kGroupCheckpoint, G::text, "checkpoint directory to resume from", AT(train->cfg.load), kPath));
  v.push_back(flag("--save-interval", T, kGroupCheckpoint, G::integer, "save every N iterations (0: only at the end)",
                   AT(train->cfg.save_interval), kDef));
  v.push_back(flag("--no-load-optim", T, kGroupCheckpoint, G::on_off,
                   "--load the model only: a fresh optimizer, the iteration continues", AT(train->cfg.no_load_optim)));
  v.push_back(flag("--finetune", T, kGroupCheckpoint, G::on_off,
                   "--load the model only and start a new run: iteration 0, first sample, fresh optimizer",
                   AT(train->cfg.finetune)));
  v.push_back(flag("--use-checkpoint-args", T, kGroupCheckpoint, G::on_off,
                   "take the model flags (layers, sizes, heads, experts, top-k, ...) from the --load checkpoint",
                   AT(train->cfg.use_checkpoint_args)));
  v.push_back(flag("--exit-signal-handler", T, kGroupTraining, G::on_off,
                   "on SIGTERM or SIGINT finish the iteration on every rank, save (with --save) and exit (always on)",
                   AT(train->exit_signal_handler)));
  v.push_back(flag("--log-interval", T, kGroupLogging, G::integer, "log line every N iterations",
                   AT(train->cfg.log_interval), kDef));
  v.push_back(flag("--trace", kTrain, kGroupLogging, G::text,
                   "write a Chrome trace (Perfetto) of one iteration to this file", AT(train->cfg.trace), kPath));
  v.push_back(flag("--trace", kSimulate, kGroupLogging, G::text,
                   "write the predicted timeline of the chosen degree (one micro-batch and the gradient all-reduce) "
                   "as a Chrome trace to this file",
                   AT(train->cfg.trace), kPath));
  v.push_back(flag("--loss-plot", T, kGroupLogging, G::text,
                   "write the loss curves (training per iteration, validation per evaluation) as a PNG at the end",
                   AT(train->cfg.loss_plot)));
  v.push_back(flag("--trace-iteration", T, kGroupLogging, G::integer,
                   "which iteration of this run --trace records (1-based; after a resume at R: iteration R + K)",
                   AT(train->cfg.trace_iteration), kDef));
  v.push_back(flag("--tensorboard-dir", T, kGroupLogging, G::text,
                   "rank 0 writes TensorBoard event files here: the log line's scalars and the expert loads, every "
                   "--log-interval iterations, and each evaluation",
                   AT(train->cfg.tensorboard_dir), kPath));
  v.push_back(flag("--tensorboard-log-interval", T, kGroupLogging, G::integer,
                   "accepted for Megatron launch scripts: --log-interval governs the TensorBoard scalars (the means "
                   "over each log interval)",
                   AT(train->tensorboard_log_interval)));
  v.push_back(flag("--moe-per-layer-logging", T, kGroupLogging, G::on_off,
                   "one log line per MoE layer: tokens kept per expert, max/mean load, dropped share",
                   AT(train->cfg.moe_per_layer_logging)));
  constexpr const char* kNoPipeline =
      "this engine has no pipeline parallelism (AMPipe pipelines inside a block); use data and expert parallelism";
  constexpr const char* kNoGqa = "the attention is multi-head attention only (no grouped queries)";
  v.push_back(refused("--pipeline-model-parallel-size", G::text, kNoPipeline, "1"));
  v.push_back(refused("--num-layers-per-virtual-pipeline-stage", G::text, kNoPipeline));
  v.push_back(
      refused("--fp16", G::on_off, "fp16 training needs loss scaling, which this engine does not have; use --bf16"));
  v.push_back(refused("--loss-scale", G::text,
                      "loss scaling belongs to fp16 training, which this engine does not have; use --bf16"));
  v.push_back(refused("--use-distributed-optimizer", G::on_off,
                      "the optimizer state is not sharded: every data-parallel rank keeps the whole AdamW state"));
  v.push_back(refused("--position-embedding-type", G::text,
                      "the model has learned absolute position embeddings only (no rope)", "learned_absolute",
                      kTrain));  // simulate costs rope: its own flag below
  v.push_back(refused("--group-query-attention", G::on_off, kNoGqa));
  v.push_back(refused("--num-query-groups", G::text, kNoGqa));
  v.push_back(refused("--moe-grouped-gemm", G::on_off, "the experts run as one GEMM each; there is no grouped GEMM"));
  v.push_back(refused("--spec", G::text_list,
                      "a layer spec picks the block's modules; this engine builds its own GPT-MoE block", "local"));
}

// preprocess's flags of Megatron's tools/preprocess_data.py (JSON lines in, indexed datasets out).
void add_preprocess_json_flags(std::vector<FlagSpec>& v) {
  const unsigned P = kPreprocess;
  v.push_back(flag("--json-keys", P, kGroupData, G::string_list,
                   "the keys of each JSON object to tokenize, each into its own dataset (default: text)",
                   AT(preprocess->json_keys)));
  v.push_back(flag("--tokenizer-type", P, kGroupData, G::text,
                   "JSON lines: SentencePieceTokenizer or HuggingFaceTokenizer (with --tokenizer-model), "
                   "GPT2BPETokenizer (with --vocab-file, --merge-file); default: byte-level (the UTF-8 bytes, V = 256, "
                   "end of document 0)",
                   AT(preprocess->tokenizer_type)));
  v.push_back(flag("--append-eod", P, kGroupData, G::on_off,
                   "end each document with the tokenizer's end-of-document id", AT(preprocess->append_eod)));
  v.push_back(flag("--workers", P, kGroupOptions, G::integer,
                   "tokenizing threads (the output is the same for any number)", AT(preprocess->workers), kDef));
  v.push_back(flag("--log-interval", P, kGroupLogging, G::integer, "a progress line every N documents",
                   AT(preprocess->log_interval), kDef));
  v.push_back(flag("--split-sentences", P, kGroupData, G::on_off,
                   "refused: Megatron splits sentences with NLTK's punkt models, which this engine does not have",
                   AT(preprocess->split_sentences)));
  v.push_back(flag("--keep-newlines", P, kGroupData, G::on_off, "no effect: it only shapes --split-sentences",
                   AT(preprocess->keep_newlines)));
  v.push_back(flag("--lang", P, kGroupData, G::text, "no effect: it only shapes --split-sentences",
                   AT(preprocess->lang), kDef));
  v.push_back(flag("--partitions", P, kGroupOptions, G::integer, "1 only: one input file, read in one partition",
                   AT(preprocess->partitions), kDef));
  v.push_back(flag("--keep-sequential-samples", P, kGroupOptions, G::on_off,
                   "no effect: one partition keeps the input's order", AT(preprocess->keep_sequential_samples)));
  v.push_back(flag("--vocab-file", P, kGroupData, G::text, "GPT2BPETokenizer's vocab.json",
                   AT(preprocess->vocab_file), kPath));
  v.push_back(flag("--merge-file", P, kGroupData, G::text, "GPT2BPETokenizer's merges.txt",
                   AT(preprocess->merge_file), kPath));
}

// simulate's own flags (after the train flags, which it takes too), calibrate and preprocess.
void add_tool_flags(std::vector<FlagSpec>& v) {
  const unsigned S = kSimulate;
  v.push_back(flag("--position-embedding-type", S, kGroupModel, G::text,
                   "learned_absolute (the engine's: s x h parameters, reduced with the dense gradients) or rope "
                   "(Megatron's rotary embeddings: no parameters, an element-wise rotation of q and k per layer)",
                   AT(simulate->position_embedding), kDef));
  v.push_back(flag("--ampipe-degree", S, kGroupMoe, G::degree_list,
                   "AMPipe degrees to predict: a comma list (1,2,4,8) or auto (every degree of 1,2,4,8,16 dividing "
                   "--seq-length); the fastest is chosen",
                   AT(simulate->degrees), kDef));
  v.push_back(flag("--profile", S, kGroupOptions, G::text,
                   "hardware profile JSON (ampipe calibrate, or profiles/*.json)", AT(simulate->profile_file),
                   kPath | kRequired));
  v.push_back(flag("--compute-efficiency", S, kGroupOptions, G::number,
                   "a factor on every compute rate of the profile (GEMM, attention, element-wise): one constant for "
                   "what the profile does not capture, e.g. set from one measured configuration (docs/simulator.md "
                   "§8)",
                   AT(simulate->compute_efficiency), kDef));
  v.push_back(flag("--world-size", S, kGroupParallel, G::integer, "devices to simulate (default: the MPI world size)",
                   AT(simulate->world_size)));
  v.push_back(flag("--nodes", S, kGroupParallel, G::integer,
                   "nodes the devices sit on (default: world size / the profile's devices_per_node, at least 1)",
                   AT(simulate->nodes)));
  v.push_back(flag("--vocab-size", S, kGroupModel, G::integer,
                   "vocabulary V for the LM head and Megatron's count (default 256: the bundled corpus's bytes)",
                   AT(simulate->vocab_size)));
  v.push_back(flag("--json", S, kGroupLogging, G::text, "also write the predictions as JSON to this file",
                   AT(simulate->json_file), kPath));
  v.push_back(flag("--out", kCalibrate, kGroupOptions, G::text,
                   "profile JSON file to write (for ampipe simulate --profile)", AT(calibrate->out_file),
                   kPath | kRequired));
  v.push_back(flag("--name", kCalibrate, kGroupOptions, G::text,
                   "profile name (default: \"calibrated: <CPU model>, <host>\")", AT(calibrate->name)));
  const unsigned P = kPreprocess;
  v.push_back(flag("--input", P, kGroupData, G::text,
                   "JSON lines (FILE.jsonl, one object per document: Megatron's preprocess_data.py) or a plain-text "
                   "file (UTF-8) to tokenize",
                   AT(preprocess->input), kPath | kRequired));
  v.push_back(flag("--output-prefix", P, kGroupData, G::text,
                   "JSON lines: writes PREFIX_KEY_document.bin/.idx (Megatron's indexed dataset) per --json-keys "
                   "key; plain text: PREFIX.bin (llm.c token file), without --tokenizer-model also PREFIX.model and "
                   "PREFIX.vocab",
                   AT(preprocess->output_prefix), kPath | kRequired));
  v.push_back(flag("--tokenizer-model", P, kGroupData, G::text,
                   "JSON lines: the SentencePiece model or Hugging Face tokenizer.json of --tokenizer-type; plain "
                   "text: a SentencePiece model to tokenize with (default: train one)",
                   AT(preprocess->tokenizer_model), kPath));
  v.push_back(flag("--vocab-size", P, kGroupModel, G::integer,
                   fmt::format("plain text: pieces of the SentencePiece model trained on --input, in [{}, {}]",
                               PreprocessArgs::kMinVocab, train::kTokenFileMaxVocab),
                   AT(preprocess->vocab_size), kDef));
  v.push_back(flag("--check-roundtrip", P, kGroupHidden, G::on_off,
                   "decode the ids again and fail unless the text comes back exactly",
                   AT(preprocess->check_roundtrip)));
  add_preprocess_json_flags(v);
}

#undef AT

std::vector<FlagSpec> make_registry() {
  std::vector<FlagSpec> v;
  add_layer_flags(v);
  add_layer_command_flags(v);
  add_train_model_flags(v);
  add_train_schedule_flags(v);
  add_train_output_flags(v);
  add_noop_flags(v);
  add_tool_flags(v);
  return v;
}

// --seed: 0 .. 2^64-1, digits only (CLI11 would read -1 as 2^64-1).
CLI::Validator uint64_validator() {
  return CLI::Validator(
      [](std::string& v) {
        const bool digits = !v.empty() && v.size() <= 20 && v.find_first_not_of("0123456789") == std::string::npos &&
                            (v.size() < 20 || v <= "18446744073709551615");
        return digits ? std::string() : v + " is not an integer in [0, 18446744073709551615]";
      },
      "UINT64");
}

// Path options: an empty path is an error, not "no file" (`--save ""` used to write nothing and exit 0).
CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& v) {
        return v.empty() ? std::string("an empty path is not a file or directory") : std::string();
      },
      "PATH");
}

// A no-op's value: its grammar (an integer, a number) and Megatron's choices.
CLI::Validator noop_validator(const FlagSpec& s) {
  const Grammar grammar = s.grammar;
  const std::string choices = s.choices ? s.choices : "";
  return CLI::Validator(
      [grammar, choices](std::string& v) {
        size_t used = 0;
        try {
          if (grammar == Grammar::integer) (void)std::stoll(v, &used);
          if (grammar == Grammar::number) (void)std::stod(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if ((grammar == Grammar::integer || grammar == Grammar::number) && (v.empty() || used != v.size()))
          return v + (grammar == Grammar::integer ? " is not an integer" : " is not a number");
        if (choices.empty() || ("|" + choices + "|").find("|" + v + "|") != std::string::npos) return std::string();
        std::string list = choices;
        std::replace(list.begin(), list.end(), '|', ',');
        return v + " is not one of " + list;
      },
      grammar == Grammar::integer ? "INT" : grammar == Grammar::number ? "FLOAT" : "TEXT");
}

CLI::Option* add_option(CLI::App& app, const FlagSpec& s, const FlagRef& ref) {
  if (s.grammar == Grammar::degree) {  // one integer, through parse_degree; CLI11's own words when it is not one
    int* p = std::get<int*>(ref);
    const std::string name = s.name;
    CLI::Option* o = app.add_option_function<std::string>(
        name,
        [p, name](const std::string& text) {
          try {
            *p = parse_degree(text, Grammar::degree).list.front();
          } catch (const ConfigError&) {
            throw CLI::ConversionError(name, std::vector<std::string>{text});  // "Could not convert: --x = v"
          }
        },
        s.help);
    o->type_name("INT");
    if (s.attrs & kShowDefault) o->default_str(std::to_string(*p));
    return o;
  }
  return std::visit(
      [&](auto* p) -> CLI::Option* {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          return app.add_flag(s.name, *p, s.help);
        } else if constexpr (std::is_same_v<T, std::vector<int>>) {
          return app.add_option(s.name, *p, s.help)->delimiter(',');
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {  // Grammar::string_list
          return app.add_option(s.name, *p, s.help)
              ->expected(1, CLI::detail::expected_max_vector_size)
              ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
              ->type_name("TEXT");
        } else {
          CLI::Option* o = app.add_option(s.name, *p, s.help);
          if (s.grammar == Grammar::uint64) o->check(uint64_validator());
          return o;
        }
      },
      ref);
}

}  // namespace

std::string FlagSpec::config_key() const {
  if (attrs & kNoConfig) return "";
  std::string k = name.substr(2);
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

const char* sub_name(Sub sub) {
  switch (sub) {
    case kLayerCheck:
      return "layer-check";
    case kBenchLayer:
      return "bench-layer";
    case kTrain:
      return "train";
    case kPlan:
      return "plan";
    case kCalibrate:
      return "calibrate";
    case kSimulate:
      return "simulate";
    case kPreprocess:
      return "preprocess";
  }
  return "?";
}

const std::vector<std::string>& help_group_order() {
  static const std::vector<std::string> order = {kGroupOptions,  kGroupModel,  kGroupMoe,        kGroupParallel,
                                                 kGroupTraining, kGroupLr,     kGroupCheckpoint, kGroupData,
                                                 kGroupLogging,  kGroupNotRun, kGroupNoEffect, kGroupRefused};
  return order;
}

const std::vector<FlagSpec>& flag_registry() {
  static const std::vector<FlagSpec> registry = make_registry();
  return registry;
}

std::vector<const FlagSpec*> flags_of(Sub sub) {
  std::vector<const FlagSpec*> out;
  for (const FlagSpec& s : flag_registry())
    if (s.subs & sub) out.push_back(&s);
  return out;
}

const FlagSpec* find_flag(Sub sub, const std::string& flag) {
  for (const FlagSpec& s : flag_registry())
    if ((s.subs & sub) && s.name == flag) return &s;
  return nullptr;
}

const char* flag_group(const std::string& flag) {
  const char* refused_group = nullptr;  // a refused flag's group, unless a subcommand gives it a meaning
  for (const FlagSpec& s : flag_registry())
    if (s.name == flag) {
      if (s.refused == nullptr) return s.group.c_str();
      refused_group = s.group.c_str();
    }
  return refused_group;
}

void add_flags(CLI::App& app, Sub sub, const FlagTargets& t) {
  for (const FlagSpec* s : flags_of(sub)) {
    CLI::Option* o = nullptr;
    if (s->refused != nullptr || s->noop != nullptr) {
      RefusedFlags::Entry& e = t.train->refused.entries.emplace_back();
      e.spec = s;
      if (s->grammar == Grammar::on_off) {
        o = app.add_flag(s->name, e.on, s->help);
      } else if (s->grammar == Grammar::text_list) {  // Megatron's nargs='*'
        o = app.add_option(s->name, e.values, s->help)
                ->expected(0, CLI::detail::expected_max_vector_size)
                ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
      } else {
        o = app.add_option(s->name, e.value, s->help);
        if (s->noop != nullptr) o->check(noop_validator(*s));
      }
      e.opt = o;
    } else {
      o = add_option(app, *s, s->field(t));
      if ((s->attrs & kShowDefault) && s->grammar != Grammar::degree) o->capture_default_str();
    }
    if (s->attrs & kRequired) o->required();
    if (s->attrs & kPath) o->check(non_empty_path());
    o->group(s->group);
  }
}

nlohmann::json flag_value(const FlagSpec& spec, const FlagTargets& t) {
  AMPIPE_CHECK(spec.field != nullptr, "flag {} has no field", spec.name);
  return std::visit([](auto* p) { return nlohmann::json(*p); }, spec.field(t));
}

namespace {

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int M = 0;
    try {
      M = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || M < 1)
      throw ConfigError(
          fmt::format("--ampipe-degree {}: \"{}\" is not a positive integer (give a comma list of "
                      "degrees, e.g. 1,2,4,8, or auto)",
                      text, item));
    if (std::find(out.begin(), out.end(), M) == out.end()) out.push_back(M);
  }
  if (out.empty() || text.back() == ',')
    throw ConfigError(fmt::format("--ampipe-degree {}: give a comma list of degrees, e.g. 1,2,4,8, or auto", text));
  return out;
}

}  // namespace

Degrees parse_degree(const std::string& text, Grammar grammar) {
  AMPIPE_CHECK(grammar == Grammar::degree || grammar == Grammar::degree_auto || grammar == Grammar::degree_list,
               "parse_degree: not a degree grammar");
  Degrees d;
  if (grammar != Grammar::degree && text == "auto") {
    d.is_auto = true;
    return d;
  }
  if (grammar == Grammar::degree_list) {
    d.list = parse_list(text);
    return d;
  }
  size_t used = 0;
  int M = 0;
  try {
    M = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw ConfigError(fmt::format("--ampipe-degree {} is invalid: give an integer{}", text,
                                  grammar == Grammar::degree_auto ? " or auto" : ""));
  d.list = {M};
  return d;
}

}  // namespace ampipe::cli
