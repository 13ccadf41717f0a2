#include "ampipe/cli/flag_registry.h"

#include <algorithm>
#include <sstream>

#include "ampipe/cli/bench_layer.h"
#include "ampipe/cli/calibrate.h"
#include "ampipe/cli/convert.h"
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

// Megatron flags `ampipe train` (and simulate) parse only to refuse (megatron_flags.h); with `accepted` ("a|b"),
// those values pass (numbers compared as numbers: --moe-z-loss-coeff 0.0 is 0).
FlagSpec refused(const char* name, Grammar grammar, const char* reason, const char* accepted = nullptr,
                 unsigned subs = kTrainSubs) {
  FlagSpec s = flag(name, subs, kGroupRefused, grammar, std::string("not supported: ") + reason, nullptr);
  s.refused = reason;
  s.accepted = accepted;
  return s;
}

// Megatron / MindSpeed flags `ampipe train` (and simulate) accept with no effect on this engine: parsed with their
// grammar (and `choices`, "a|b"), named by one start-up note with `why` (RefusedFlags::noop_note).
FlagSpec noop(const char* name, Grammar grammar, const char* why, const char* choices = nullptr,
             unsigned subs = kTrainSubs) {
  std::string help = std::string("no effect: ") + why;
  if (choices != nullptr) {
    std::string c = choices;
    std::replace(c.begin(), c.end(), '|', ',');
    help += " (Megatron's values: " + c + ")";
  }
  FlagSpec s = flag(name, subs, kGroupNoEffect, grammar, help, nullptr);
  s.noop = why;
  s.choices = choices;
  return s;
}

// Why a no-op flag has no effect here: the start-up note says it after each one given.
constexpr const char* kFusion = "GPU kernel fusion";
constexpr const char* kKernel = "GPU kernel choice";
constexpr const char* kCuda = "NCCL/CUDA only";
constexpr const char* kOverlap = "GPU/NPU communication overlap";
constexpr const char* kLoader = "dataloader workers";
constexpr const char* kTimers = "timers/logging detail";
constexpr const char* kCkpt = "checkpoint format details";
constexpr const char* kFp16 = "fp16 loss scaling only; --fp16 is refused";
constexpr const char* kHccl = "Ascend HCCL only";
constexpr const char* kDispatch = "GPU token dispatcher choice; this engine's is its all-to-all";
constexpr const char* kFramework = "the Python framework MindSpeed runs on";
constexpr const char* kDeterministic =
    "this engine's runs are always deterministic, bitwise at the same seed and layout";
constexpr const char* kRouterFp32 = "the router runs in fp32 here";
constexpr const char* kFp32Weights = "every weight is fp32 here";
constexpr const char* kFp32Grads = "gradients accumulate and are all-reduced in fp32 here";
constexpr const char* kNoBias = "a linear layer's bias is added in the layer itself here (the same sums)";
constexpr const char* kInputJitter = "the router input has no jitter here unless --noisy-gate-policy Jitter";
constexpr const char* kDdpAverage = "where the data-parallel mean is taken; the same mean";
constexpr const char* kRankOrder = "rank order in the process groups; the result is the same";
constexpr const char* kUlyssesKv = "Ulysses context parallelism only, and on by default in MindSpeed-LLM";
constexpr const char* kFsdpDetail = "Megatron-FSDP detail; --use-megatron-fsdp is refused";
constexpr const char* kMetaInit = "model construction detail: the weights are initialised on the CPU here";
constexpr const char* kMemory = "GPU/NPU memory saving; the result is the same";
constexpr const char* kRecompute =
    "recomputation for GPU/NPU memory; the result is the same, and --recompute-granularity is this engine's";
constexpr const char* kHandler = "MindSpeed-LLM's preprocessing handler: no effect on reading preprocessed data";
constexpr const char* kVarSeq = "variable-length batches: every sequence here has --seq-length tokens";
constexpr const char* kPerToken =
    "every sequence has --seq-length unmasked tokens here: the per-token mean is the mean";
constexpr const char* kBert = "BERT/T5 datasets only";
constexpr const char* kWandb = "Weights & Biases logging";
constexpr const char* kProfile = "profiling; this engine's is --trace";
constexpr const char* kStraggler = "straggler detection";
constexpr const char* kDiagnostic = "a diagnostic check";
constexpr const char* kRerun = "Megatron's result-validation re-runs";
constexpr const char* kExperimental = "it only unlocks Megatron's experimental flags, each checked on its own";
constexpr const char* kInference = "inference and generation only";
constexpr const char* kRetain = "checkpoint retention: every checkpoint is kept here";
constexpr const char* kCkptTokenizer = "--use-checkpoint-args never takes the tokenizer here";
constexpr const char* kHighAvailability = "NPU fault tolerance";

// Why a refused flag is refused: its one line says it. A flag whose meaning is the engine's only for one value
// accepts that value (refused()'s `accepted`).
constexpr const char* kNoPipeline =
    "the pipeline stages here are --pipeline-model-parallel-size with --decoder-first-pipeline-num-layers / "
    "--decoder-last-pipeline-num-layers for an uneven split";
constexpr const char* kTokenizer =
    "a Hugging Face tokenizer is --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json here (the "
    "other tokenizers: SentencePieceTokenizer, GPT2BPETokenizer)";
constexpr const char* kNoRope =
    "the rotary embeddings here are Megatron's (--rotary-base, --rotary-percent, --rotary-interleaved, "
    "--rotary-seq-len-interpolation-factor, --use-rope-scaling with --rope-scaling-factor): YaRN, LongRoPE, GLM's and "
    "the other scalings are not implemented";
constexpr const char* kDocMask =
    "the attention and the positions span the whole sequence (no reset at end-of-document tokens)";
constexpr const char* kCausal = "the attention is causal";
constexpr const char* kNoMla = "multi-latent attention is not implemented (the attention is multi-head)";
constexpr const char* kNoSparseAttention =
    "sparse attention (DeepSeek's indexer, compressed keys and values) is not implemented (the attention is dense)";
constexpr const char* kNoLinearAttention =
    "linear attention (gated delta net) is not implemented (every block has softmax attention)";
constexpr const char* kNoMamba = "Mamba layers are not implemented (every block has softmax attention)";
constexpr const char* kNoWindow =
    "sliding-window attention is not implemented (the attention sees the whole causal prefix)";
constexpr const char* kNoAlibi = "ALiBi is not implemented";
constexpr const char* kNoHyperConnections = "hyper-connections are not implemented (one residual stream)";
constexpr const char* kNoCla = "every layer has its own keys and values (no cross-layer sharing)";
constexpr const char* kFusedQkv = "q, k and v come from one linear layer here";
constexpr const char* kQkScale = "the attention scores are scaled by 1/sqrt(head dim) only (no per-layer scaling)";
constexpr const char* kAttnScale = "the attention scores are scaled by 1/sqrt(head dim)";
constexpr const char* kNoAttnGate = "the attention output has no gate";
constexpr const char* kSoftmax = "the attention softmax is the plain one";
constexpr const char* kNoSoftcap = "the logits are not capped";
constexpr const char* kPreLn =
    "the blocks are pre-LN: one LayerNorm before the attention and one before the MoE, none after";
constexpr const char* kEmbeddings = "the embeddings enter the first block as they are (no scaling or normalization)";
constexpr const char* kNormGain = "the norm weights are the gains themselves (no 1 + w parametrization)";
constexpr const char* kFinalNorm = "the last block is followed by the final norm";
constexpr const char* kNoLossMask = "the loss counts every token (no end-of-document masking)";
constexpr const char* kNoBiases = "the linear layers have no biases (only the LayerNorms have, and QKV with --add-qkv-bias)";
constexpr const char* kActivation = "the experts use GeLU, or SwiGLU with --swiglu";
constexpr const char* kFcType = "the expert FFN is fc1, the activation, fc2";
constexpr const char* kNoScale = "the embeddings, the residual branches and the logits are not rescaled";
constexpr const char* kNoMtp = "multi-token prediction is not implemented (the loss is next-token prediction)";
constexpr const char* kNoNoopLayers = "every layer is a transformer block here (no identity layers)";
constexpr const char* kRouter =
    "a Megatron-core router option this engine does not have: its routers are DeepSpeed-MoE's gate (--moe-model-type "
    "deepspeed_moe) and Megatron-Core's top-k router (megatron_moe: --moe-router-score-function softmax or sigmoid, "
    "--moe-router-pre-softmax, --moe-router-topk-scaling-factor, --moe-router-num-groups, --moe-router-group-topk, "
    "--moe-router-enable-expert-bias, --moe-router-load-balancing-type aux_loss, seq_aux_loss, sinkhorn or none)";
constexpr const char* kAuxLoss = "the only balancing loss here is the aux loss (--moe-aux-loss-coeff)";
constexpr const char* kJitter = "router jitter here is DeepSpeed-MoE's (--noisy-gate-policy Jitter)";
constexpr const char* kNoMup = "MuP is not implemented";
constexpr const char* kNoFp8 = "fp8 training is not implemented; use --bf16";
constexpr const char* kNoQat = "quantization-aware training is not implemented";
constexpr const char* kNoMc2 =
    "Ascend MC2 (tensor-parallel matmul fused with its communication) is not run by this engine (--use-ascend-mc2)";
constexpr const char* kFp32Moments = "the AdamW moments are fp32 here";
constexpr const char* kFp32Optimizer = "the master weights, gradients and AdamW moments are fp32 here";
constexpr const char* kAdamW = "the optimizer is AdamW (Megatron's adam)";
constexpr const char* kOneLr = "one learning rate for every parameter (no separate embedding and output-layer rate)";
constexpr const char* kWarmupInit = "the warm-up starts from 0 here";
constexpr const char* kConstantWd = "the weight decay is constant here (--weight-decay)";
constexpr const char* kConstantBatch = "the global batch size is constant here";
constexpr const char* kEvalBatch = "evaluation uses --global-batch-size";
constexpr const char* kExitDuration =
    "a wall-clock limit is not implemented: the run stops at --train-iters, --exit-interval or SIGTERM (which saves)";
constexpr const char* kSaveOptim =
    "the checkpoints always hold the optimizer state here (a resume continues the run exactly); --no-load-optim loads "
    "without it";
constexpr const char* kNoHf =
    "training reads and writes ampipe checkpoints (--save, --load); ampipe convert turns a Hugging Face Mixtral, "
    "Qwen2-MoE or Qwen3-MoE into one and back";
constexpr const char* kNoModelOpt = "ModelOpt distillation and export are not implemented";
constexpr const char* kNoSft =
    "fine-tuning datasets (instruction prompts, packing, padding) are not read here: training reads a token stream "
    "(--data-path)";
constexpr const char* kNoRl = "reinforcement learning and preference training (GRPO, DPO, PPO) are not implemented";
constexpr const char* kNoLora = "LoRA is not implemented (every weight is trained)";
constexpr const char* kNoFim = "fill-in-the-middle data is not implemented";
constexpr const char* kNoMock = "mock data is not implemented: without --data-path training reads the bundled corpus";
constexpr const char* kDataOrder = "the data order is this engine's seeded shuffle per epoch (docs/training.md)";
constexpr const char* kPreprocessing = "preprocessing is ampipe preprocess's (a training run reads --data-path)";
constexpr const char* kNoYaml = "--config takes a JSON file here (no YAML)";
constexpr const char* kNoErrorInjection = "error injection is not implemented";
constexpr const char* kNoSharding =
    "parameters, gradients and optimizer state are not sharded over data-parallel ranks here";
constexpr const char* kExpertTp =
    "the experts are sharded over the tensor-parallel ranks here (no tp-extended expert parallelism)";
constexpr const char* kTp1d = "tensor parallelism here is Megatron's 1-D column/row split";
constexpr const char* kAlignedTp =
    "the tensor-parallel shards are equal here (sizes divisible by --tensor-model-parallel-size)";
constexpr const char* kNoUlysses = "context parallelism here is ring attention (megatron_cp_algo), not Ulysses";
constexpr const char* kRingCp = "context parallelism here is ring attention over load-balanced halves (p2p)";

// The Megatron-LM / MindSpeed / MindSpeed-LLM flags with no effect here, with Megatron's value grammar
// (megatron/training/arguments.py, mindspeed/arguments.py). Those whose meaning would change the result are refused
// instead (add_train_output_flags); --no-save-optim is not here: this engine saves the optimizer state.
void add_noop_flags(std::vector<FlagSpec>& v) {
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

// More flags with no effect here: kernels, fusions, communication overlap, process groups and precision details of
// GPUs and NPUs (Megatron-LM's arguments.py and TransformerConfig, mindspeed/arguments.py and its features,
// MindSpeed-LLM's features). A precision flag is here only when this engine already computes that way (fp32 router,
// fp32 weights and gradients).
void add_noop_kernel_flags(std::vector<FlagSpec>& v) {
  for (const char* f :
       {"--gemm-gradient-accumulation-fusion", "--moe-permute-fusion", "--use-fused-ring-attention-update",
        "--use-fused-moe-token-permute-and-unpermute", "--use-fused-lightning-indexer", "--coc-fused-kernel",
        "--use-fused-lightning-indexer-loss", "--cross-entropy-loss-fusion", "--use-fused-mhc", "--moe-router-fusion",
        "--use-transformer-engine-op-fuser"})
    v.push_back(noop(f, G::on_off, kFusion));
  for (const char* f :
       {"--mla-fa-without-pad", "--mla-mm-split", "--enable-mla-absorb", "--use-triton-mhc", "--use-triton-gdn",
        "--enable-token-rearrange-opt", "--use-fusion-attn-v2", "--use-triton-swiglu-limit"})
    v.push_back(noop(f, G::on_off, kKernel));
  v.push_back(noop("--shape-order", G::text, kKernel, "SBH|BSH|BSND|BNSD"));
  v.push_back(noop("--cross-entropy-fusion-impl", G::text, kKernel, "native|te"));
  v.push_back(noop("--output-layer-slice-num", G::integer, kKernel));
  for (const char* f :
       {"--moe-alltoall-overlap-comm", "--moe-fb-overlap", "--use-ascend-coc", "--mla-up-proj-tp-overlap",
        "--overlap-moe-expert-parallel-comm", "--tp-comm-overlap", "--overlap-p2p-communication-warmup-flush",
        "--defer-embedding-wgrad-compute", "--overlap-param-gather-with-optimizer-step",
        "--moe-allgather-overlap-comm", "--delay-wgrad-compute", "--enable-backward-overlap-ag-with-matmul",
        "--enable-overlap-ag-with-matmul", "--enable-overlap-matmul-with-rs"})
    v.push_back(noop(f, G::on_off, kOverlap));
  for (const char* f : {"--wgrad-deferral-limit", "--coc-parallel-num"}) v.push_back(noop(f, G::integer, kOverlap));
  v.push_back(noop("--moe-shared-expert-overlap", G::on_off,
                   "the shared expert always runs under the all-to-all here (each chunk's after its combine is issued)"));
  v.push_back(noop("--tp-comm-overlap-cfg", G::text, kOverlap));
  // (older Megatron-LM and MindSpeed-LLM spellings)
  for (const char* f : {"--delay-param-gather", "--no-delay-grad-reduce", "--align-param-gather",
                        "--no-overlap-p2p-communication", "--no-scatter-gather-tensors-in-pipeline", "--moe-zerc"})
    v.push_back(noop(f, G::on_off, kOverlap));
  for (const char* f : {"--disable-gloo-group", "--use-nccl-ub", "--disable-gloo-process-groups",
                        "--disable-bf16-reduced-precision-matmul", "--te-rng-tracker"})
    v.push_back(noop(f, G::on_off, kCuda));
  v.push_back(noop("--cuda-graph-impl", G::text, kCuda, "none|local|transformer_engine"));
  v.push_back(noop("--cuda-graph-modules", G::text_list, kCuda));
  v.push_back(noop("--cuda-graph-warmup-steps", G::integer, kCuda));
  v.push_back(noop("--hccl-op-mode", G::text, kHccl));
  v.push_back(noop("--hccl-group-buffer-adaptive", G::on_off, kHccl));
  v.push_back(noop("--moe-token-dispatcher-type", G::text, kDispatch, "allgather|alltoall|alltoall_seq|flex"));
  v.push_back(noop("--moe-flex-dispatcher-backend", G::text, kDispatch, "deepep|hybridep"));
  v.push_back(noop("--ai-framework", G::text, kFramework, "pytorch|mindspore"));
  v.push_back(noop("--enable-share-memory", G::on_off, kFramework));
  for (const char* f : {"--deterministic-mode", "--npu-deterministic", "--use-deter-comp"})
    v.push_back(noop(f, G::on_off, kDeterministic));
  for (const char* f : {"--router-gating-in-fp32", "--topk-softmax-in-fp32", "--moe-revert-type-after-topk"})
    v.push_back(noop(f, G::on_off, kRouterFp32));
  for (const char* f : {"--init-norm-weight-in-fp32", "--rmsnorm-weight-in-fp32"})
    v.push_back(noop(f, G::on_off, kFp32Weights));
  v.push_back(noop("--accumulate-allreduce-grads-in-fp32", G::on_off, kFp32Grads));
  v.push_back(noop("--skip-bias-add", G::on_off, kNoBias));
  v.push_back(noop("--input-jitter", G::on_off, kInputJitter));
  v.push_back(noop("--ddp-average-in-collective", G::on_off, kDdpAverage));
  v.push_back(noop("--use-tp-pp-dp-mapping", G::on_off, kRankOrder));
  v.push_back(noop("--kv-head-repeat-before-uly-alltoall", G::on_off, kUlyssesKv));
  v.push_back(noop("--megatron-fsdp-grad-comm-dtype", G::text, kFsdpDetail, "fp32|fp16|bf16|auto"));
  for (const char* f : {"--megatron-fsdp-main-grads-dtype", "--megatron-fsdp-main-params-dtype"})
    v.push_back(noop(f, G::text, kFsdpDetail, "fp32|bf16|fp16|auto"));
  for (const char* f : {"--fsdp-double-buffer", "--fsdp-manual-registration"})
    v.push_back(noop(f, G::on_off, kFsdpDetail));
  v.push_back(noop("--init-model-with-meta-device", G::on_off, kMetaInit));
  // (older Megatron-LM flags)
  v.push_back(noop("--DDP-impl", G::text, "Megatron's data-parallel implementation choice", "local|torch"));
  v.push_back(noop("--no-query-key-layer-scaling", G::on_off,
                   "the attention scores are scaled by 1/sqrt(head dim) only, as it asks"));
  v.push_back(noop("--use-precision-aware-optimizer", G::on_off,
                   "GPU optimizer kernel choice; the lower precisions it allows are refused"));
}

// More flags with no effect here: memory saving (offloading, swapping, recomputation: the result is the same),
// data loading, logging, profiling, diagnostics, checkpoint format and inference-only settings.
void add_noop_run_flags(std::vector<FlagSpec>& v) {
  for (const char* f : {"--swap-optimizer", "--swap-attention", "--mtp-mem-efficient-logits",
                        "--mla-swap-core-attn-out", "--fine-grained-activation-offloading"})
    v.push_back(noop(f, G::on_off, kMemory));
  v.push_back(noop("--moe-zero-memory", G::text, kMemory, "disable|level0|level1"));
  for (const char* f : {"--loss-chunk-size", "--swap-optimizer-times", "--context-parallel-cache-interval",
                        "--moe-zero-memory-num-layers"})
    v.push_back(noop(f, G::integer, kMemory));
  v.push_back(noop("--loss-compute-mode", G::text, kMemory, "default|chunk"));
  v.push_back(noop("--offload-modules", G::text_list, kMemory));
  v.push_back(noop("--context-parallel-kv-cache-policy", G::text, kMemory, "full|half"));
  v.push_back(noop("--moe-unperm2-mem-optim", G::on_off, kMemory));
  v.push_back(noop("--optimizer-cpu-offload", G::on_off, kMemory));
  v.push_back(noop("--optimizer-offload-fraction", G::number, kMemory));
  v.push_back(noop("--cpu-offloading-num-layers", G::integer, kMemory));
  for (const char* f : {"--recompute-activation-function", "--enable-recompute-layers-per-pp-rank",
                        "--recompute-mla-up-proj", "--recompute-norm"})
    v.push_back(noop(f, G::on_off, kRecompute));
  for (const char* f : {"--recompute-activation-function-num-layers", "--recompute-norm-num-layers"})
    v.push_back(noop(f, G::integer, kRecompute));
  v.push_back(noop("--recompute-modules", G::text_list, kRecompute));
  v.push_back(noop("--moe-layer-recompute", G::on_off, kRecompute));
  v.push_back(noop("--workers", G::integer, kLoader));
  v.push_back(noop("--data-impl", G::text, kLoader, "mmap|infer"));
  v.push_back(noop("--handler-name", G::text, kHandler));
  v.push_back(noop("--variable-seq-lengths", G::on_off, kVarSeq));
  v.push_back(noop("--calculate-per-token-loss", G::on_off, kPerToken));
  v.push_back(noop("--short-seq-prob", G::number, kBert));
  v.push_back(noop("--logging-level", G::integer, kTimers));
  for (const char* f : {"--log-progress", "--op-cal-tflops", "--log-batch-size-to-tensorboard"})
    v.push_back(noop(f, G::on_off, kTimers));
  for (const char* f : {"--wandb-exp-name", "--wandb-project", "--wandb-entity", "--wandb-save-dir"})
    v.push_back(noop(f, G::text, kWandb));
  // (simulate's --profile is its hardware profile)
  v.push_back(noop("--profile", G::on_off, kProfile, nullptr, kTrain));
  for (const char* f : {"--profile-record-shapes", "--profile-with-cpu", "--record-memory-history"})
    v.push_back(noop(f, G::on_off, kProfile));
  for (const char* f : {"--profile-step-end", "--profile-step-start"}) v.push_back(noop(f, G::integer, kProfile));
  v.push_back(noop("--profile-ranks", G::text_list, kProfile));
  v.push_back(noop("--profile-level", G::text, kProfile, "level_none|level0|level1|level2"));
  v.push_back(noop("--profile-save-path", G::text, kProfile));
  v.push_back(noop("--straggler-minmax-count", G::integer, kStraggler));
  v.push_back(noop("--check-weight-hash-across-dp-replicas-interval", G::integer, kDiagnostic));
  v.push_back(noop("--test-mode", G::on_off, kDiagnostic));
  v.push_back(noop("--rerun-mode", G::text, kRerun, "disabled|validate_results|report_stats"));
  v.push_back(noop("--error-injection-type", G::text, kRerun, "correct_result|transient_error|persistent_error"));
  v.push_back(noop("--enable-experimental", G::on_off, kExperimental));
  for (const char* f : {"--inference-logging-step-interval", "--inference-max-seq-length",
                        "--inference-dynamic-batching-num-cuda-graphs", "--max-tokens-to-oom", "--max-new-tokens"})
    v.push_back(noop(f, G::integer, kInference));
  v.push_back(noop("--inference-dynamic-batching-buffer-size-gb", G::number, kInference));
  v.push_back(noop("--inference-dynamic-batching-unified-memory-level", G::integer, kInference, "0|1"));
  v.push_back(
      noop("--inference-dynamic-batching-cuda-graph-sizing-distribution", G::text, kInference, "exponential|linear"));
  v.push_back(noop("--moe-pad-experts-for-cuda-graph-inference", G::on_off, kInference));
  v.push_back(noop("--max-length", G::integer, kInference));
  for (const char* f : {"--async-save", "--use-persistent-ckpt-worker", "--dist-ckpt-optim-fully-reshardable",
                        "--ckpt-fully-parallel-load", "--ckpt-assume-constant-structure", "--auto-detect-ckpt-format",
                        "--no-ckpt-fully-parallel-save", "--verify-integrity", "--ckpt-fully-parallel-save",
                        "--async-ckpt-use-cpu-shm", "--use-dist-ckpt"})
    v.push_back(noop(f, G::on_off, kCkpt));
  v.push_back(noop("--dist-ckpt-strictness", G::text, kCkpt,
                   "assume_ok_unexpected|log_unexpected|log_all|raise_unexpected|raise_all|return_unexpected|return_"
                   "all|ignore_all"));
  v.push_back(noop("--async-strategy", G::text, kCkpt, "nvrx|mcore"));
  v.push_back(noop("--dist-ckpt-format", G::text, kCkpt));
  v.push_back(noop("--save-retain-interval", G::integer, kRetain));
  v.push_back(noop("--no-use-tokenizer-model-from-checkpoint-args", G::on_off, kCkptTokenizer));
  for (const char* f : {"--enable-hbmfault-repair", "--enable-high-availability"})
    v.push_back(noop(f, G::on_off, kHighAvailability));
}

// Megatron-LM / MindSpeed / MindSpeed-LLM model features this engine does not have: honouring the flag would train
// another model, so a script that gives it stops with one line (megatron_flags.cpp). The value that means this
// engine's model passes (--moe-layer-freq 1, --first-k-dense-replace 0, ...).
void add_refused_model_flags(std::vector<FlagSpec>& v) {
  for (const char* f : {"--rope-scaling-original-max-position-embeddings", "--beta-fast", "--beta-slow"})
    v.push_back(refused(f, G::integer, kNoRope));
  for (const char* f : {"--use-glm-rope", "--enable-gpt-oss"}) v.push_back(refused(f, G::on_off, kNoRope));
  for (const char* f :
       {"--rope-scaling-type", "--long-factor", "--longrope-freqs-type", "--short-factor", "--rope-type"})
    v.push_back(refused(f, G::text, kNoRope));
  for (const char* f : {"--rope-scaling-mscale", "--rope-scaling-mscale-all-dim",
                        "--rotary-scaling-factor", "--mscale", "--mscale-all-dim",
                        "--high-freq-factor", "--low-freq-factor", "--original-max-position-embeddings",
                        "--partial-rotary-factor", "--long-mscale", "--short-mscale", "--dynamic-factor"})
    v.push_back(refused(f, G::number, kNoRope));
  v.push_back(refused("--use-partial-rope", G::on_off, kNoRope));  // (older MindSpeed-LLM spellings)
  for (const char* f : {"--rope-scaling-beta-fast", "--rope-scaling-beta-slow"})
    v.push_back(refused(f, G::integer, kNoRope));
  for (const char* f : {"--reset-attention-mask", "--reset-position-ids"}) v.push_back(refused(f, G::on_off, kDocMask));
  v.push_back(refused("--fix-sub-seq-length", G::integer, kDocMask));
  v.push_back(refused("--eod-mask-loss", G::on_off, kNoLossMask));
  for (const char* f : {"--attention-mask-type", "--cp-attention-mask-type"})
    v.push_back(refused(f, G::text, kCausal, "causal"));
  // MindSpeed's flash-attention mask modes: 0 (the mask given: causal here), 2 and 3 (causal); the others mask
  // differently (all, band, prefix)
  v.push_back(refused("--sparse-mode", G::integer, kCausal, "0|2|3"));
  // MindSpeed-LLM's flash-attention window: tokens before and after each query (its defaults: causal)
  v.push_back(refused("--pre-tockens", G::integer, kCausal, "65536|1048576"));
  v.push_back(refused("--next-tockens", G::integer, kCausal, "0"));
  for (const char* f : {"--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--q-lora-rank"})
    v.push_back(refused(f, G::integer, kNoMla));
  for (const char* f : {"--multi-latent-attention", "--enable-mla-scale-kv-lora", "--enable-mla-scale-q-lora"})
    v.push_back(refused(f, G::on_off, kNoMla));
  v.push_back(refused("--multi-head-latent-attention", G::on_off, kNoMla));  // (older MindSpeed-LLM spellings)
  for (const char* f : {"--qk-nope-head-dim", "--qk-rope-head-dim"}) v.push_back(refused(f, G::integer, kNoMla));
  for (const char* f : {"--enable-dsa-indexer", "--use-sparse-flash-attn", "--kv-compress",
                        "--apply-rope-no-in-complex", "--index-share-for-mtp-iteration", "--no-use-sparse-c8-indexer"})
    v.push_back(refused(f, G::on_off, kNoSparseAttention));
  for (const char* f : {"--index-topk", "--index-n-heads", "--index-head-dim", "--max-batch-size", "--o-groups",
                        "--o-lora-rank", "--original-seq-len", "--index-skip-topk-offset", "--index-topk-freq",
                        "--dsa-indexer-head-dim", "--dsa-indexer-n-heads", "--dsa-indexer-topk"})
    v.push_back(refused(f, G::integer, kNoSparseAttention));
  for (const char* f : {"--indexer-loss-coeff", "--compress-rope-theta", "--rope-factor", "--dsa-indexer-loss-coeff"})
    v.push_back(refused(f, G::number, kNoSparseAttention));
  v.push_back(refused("--compress-ratios", G::text_list, kNoSparseAttention));
  v.push_back(refused("--experimental-attention-variant", G::text, kNoSparseAttention));
  for (const char* f : {"--linear-key-head-dim", "--linear-num-key-heads", "--linear-num-value-heads",
                        "--linear-value-head-dim", "--full-attention-interval", "--linear-conv-kernel-dim"})
    v.push_back(refused(f, G::integer, kNoLinearAttention));
  v.push_back(refused("--linear-attention-freq", G::text, kNoLinearAttention));
  for (const char* f : {"--mamba-chunk-size", "--mamba-d-conv", "--mamba-expand"})
    v.push_back(refused(f, G::integer, kNoMamba));
  for (const char* f : {"--sliding-window-size", "--interleave-sliding-window"})
    v.push_back(refused(f, G::integer, kNoWindow));
  for (const char* f : {"--window-attn-skip-freq", "--window-size"}) v.push_back(refused(f, G::text, kNoWindow));
  v.push_back(refused("--sliding-window", G::integer, kNoWindow));
  v.push_back(refused("--alibi-fusion-attn-type", G::integer, kNoAlibi));
  for (const char* f : {"--fill-neg-inf", "--square-alibi-mask"}) v.push_back(refused(f, G::on_off, kNoAlibi));
  v.push_back(refused("--enable-mhc", G::on_off, kNoHyperConnections));
  v.push_back(refused("--hc-mult", G::integer, kNoHyperConnections));
  v.push_back(refused("--cla-share-factor", G::integer, kNoCla, "1"));
  v.push_back(refused("--share-kvstates", G::on_off, kNoCla));
  v.push_back(refused("--no-enable-linear-qkv", G::on_off, kFusedQkv));
  v.push_back(refused("--apply-query-key-layer-scaling", G::on_off, kQkScale));
  v.push_back(refused("--query-pre-attn-scalar", G::integer, kAttnScale));
  v.push_back(refused("--attention-output-gate", G::on_off, kNoAttnGate));
  v.push_back(refused("--softmax-type", G::text, kSoftmax, "vanilla"));
  v.push_back(refused("--output-logit-softcapping", G::number, kNoSoftcap));
  v.push_back(refused("--post-norm", G::on_off, kPreLn));
  v.push_back(refused("--input-embeds-norm", G::on_off, kEmbeddings));
  v.push_back(refused("--embed-layernorm", G::on_off, kEmbeddings));
  v.push_back(refused("--no-post-layer-norm", G::on_off, kFinalNorm));
  for (const char* f : {"--apply-layernorm-1p", "--add-rmsnorm-offset"}) v.push_back(refused(f, G::on_off, kNormGain));
  for (const char* f : {"--add-dense-bias", "--add-output-layer-bias"})
    v.push_back(refused(f, G::on_off, kNoBiases));
  for (const char* f : {"--squared-relu", "--gelu-tanh", "--quick-geglu", "--geglu"})
    v.push_back(refused(f, G::on_off, kActivation));
  for (const char* f : {"--swiglu-limit", "--glu-linear-offset"}) v.push_back(refused(f, G::number, kActivation, "0"));
  v.push_back(refused("--activation-func-clamp-value", G::number, kActivation));
  v.push_back(refused("--fc-type", G::text, kFcType));
  v.push_back(refused("--embedding-multiplier-scale", G::number, kNoScale, "1"));
  for (const char* f : {"--output-multiplier-scale", "--scale-depth"}) v.push_back(refused(f, G::number, kNoScale));
  for (const char* f : {"--dim-model-base", "--scale-emb"}) v.push_back(refused(f, G::number, kNoScale));
  v.push_back(refused("--mtp-num-layers", G::integer, kNoMtp));
  v.push_back(refused("--mtp-loss-scaling-factor", G::number, kNoMtp));
  v.push_back(refused("--mtp-spec", G::text_list, kNoMtp));
  v.push_back(refused("--mtp-after-norm", G::on_off, kNoMtp));
  v.push_back(refused("--noop-layers", G::text, kNoNoopLayers));
  v.push_back(refused("--moe-router-dtype", G::text, kRouter, "fp32"));
  for (const char* f : {"--norm-topk-prob", "--fix-router", "--seq-aux", "--moe-router-force-load-balancing"})
    v.push_back(refused(f, G::on_off, kRouter));
  for (const char* f : {"--num-zero-experts", "--n-hash-layers"})
    v.push_back(refused(f, G::integer, kRouter));
  for (const char* f : {"--moe-comm-aux-loss-coeff", "--moe-device-level-aux-loss-coeff"})
    v.push_back(refused(f, G::number, kAuxLoss, "0"));
  v.push_back(refused("--moe-input-jitter-eps", G::number, kJitter));
  for (const char* f : {"--tokenizer-name-or-path", "--tiktoken-pattern", "--tokenizer-padding-side"})
    v.push_back(refused(f, G::text, kTokenizer));
  v.push_back(refused("--tokenizer-not-use-fast", G::on_off, kTokenizer));
  v.push_back(refused("--tokenizer-kwargs", G::text_list, kTokenizer));
  v.push_back(refused("--mup-base-hidden-size", G::integer, kNoMup));
  v.push_back(refused("--use-mup", G::on_off, kNoMup));
}

// Training features this engine does not have (precision, optimizer and schedule variants, fine-tuning and RL
// data, HuggingFace conversion, parallel layouts it cannot run): refused with their reason, as above.
void add_refused_training_flags(std::vector<FlagSpec>& v) {
  for (const char* f : {"--fp8-format", "--fp8-recipe", "--fp8-amax-compute-algo"})
    v.push_back(refused(f, G::text, kNoFp8));
  for (const char* f : {"--fp8-param-gather", "--first-last-layers-bf16", "--fp8-reuse-quantized-weight"})
    v.push_back(refused(f, G::on_off, kNoFp8));
  v.push_back(refused("--fp8-amax-history-len", G::integer, kNoFp8));
  v.push_back(refused("--fp8-hybrid", G::on_off, kNoFp8));
  v.push_back(refused("--qat-scheme", G::text, kNoQat));
  v.push_back(refused("--use-mc2", G::on_off, kNoMc2));
  for (const char* f : {"--o2-gradient", "--grad-reduce-in-bf16"}) v.push_back(refused(f, G::on_off, kFp32Grads));
  v.push_back(refused("--o2-optimizer", G::on_off, kFp32Moments));
  for (const char* f : {"--exp-avg-dtype", "--exp-avg-sq-dtype", "--main-grads-dtype", "--main-params-dtype"})
    v.push_back(refused(f, G::text, kFp32Optimizer, "fp32"));
  v.push_back(refused("--optimizer", G::text, kAdamW, "adam"));
  for (const char* f : {"--muon-extra-scale-factor", "--muon-momentum", "--ema-decay"})
    v.push_back(refused(f, G::number, kAdamW));
  v.push_back(refused("--muon-scale-mode", G::text, kAdamW));
  v.push_back(refused("--optimizer-selection", G::text, kAdamW, "fused_adamw|fused_torch_adamw"));
  v.push_back(refused("--no-use-layer-wise-param-layout", G::on_off, kAdamW));
  for (const char* f : {"--decoupled-lr", "--decoupled-min-lr"}) v.push_back(refused(f, G::number, kOneLr));
  v.push_back(refused("--lr-warmup-init", G::number, kWarmupInit, "0"));
  for (const char* f : {"--end-weight-decay", "--start-weight-decay"}) v.push_back(refused(f, G::number, kConstantWd));
  v.push_back(refused("--weight-decay-incr-style", G::text, kConstantWd, "constant"));
  v.push_back(refused("--step-batch-size-schedule", G::text, kConstantBatch));
  v.push_back(refused("--rampup-batch-size", G::text_list, kConstantBatch));
  v.push_back(refused("--eval-global-batch-size", G::integer, kEvalBatch));
  v.push_back(refused("--exit-duration-in-mins", G::integer, kExitDuration));
  v.push_back(refused("--no-save-optim", G::on_off, kSaveOptim));
  v.push_back(refused("--pretrained-checkpoint", G::text,
                      "the model a run starts from is --load's (with --finetune for a new run)"));
  for (const char* f : {"--enable-hf2mg-convert", "--enable-mg2hf-convert"}) v.push_back(refused(f, G::on_off, kNoHf));
  for (const char* f : {"--model-type-hf", "--mg-save-dir", "--hf-cfg-dir"}) v.push_back(refused(f, G::text, kNoHf));
  for (const char* f : {"--export-kd-cfg", "--export-kd-teacher-load"}) v.push_back(refused(f, G::text, kNoModelOpt));
  for (const char* f : {"--export-te-mcore-model", "--export-force-local-attention"})
    v.push_back(refused(f, G::on_off, kNoModelOpt));
  for (const char* f : {"--stage", "--prompt-type", "--enable-thinking"}) v.push_back(refused(f, G::text, kNoSft));
  for (const char* f : {"--is-instruction-dataset", "--no-pad-to-seq-lengths", "--neat-pack", "--pack",
                        "--padded-samples", "--cut-max-seqlen"})
    v.push_back(refused(f, G::on_off, kNoSft));
  v.push_back(refused("--pad-to-multiple-of", G::integer, kNoSft));
  for (const char* f : {"--grpo-clamp-eps-lower", "--grpo-clamp-eps-upper", "--grpo-entropy-term-weight",
                        "--grpo-kl-beta", "--rl-generation-lag"})
    v.push_back(refused(f, G::number, kNoRl));
  for (const char* f : {"--grpo-group-size", "--grpo-iterations", "--grpo-prompts-per-step",
                        "--rl-inference-tensor-model-parallel-size", "--rl-inference-pipeline-model-parallel-size",
                        "--rl-inference-expert-model-parallel-size", "--rl-inference-expert-tensor-model-parallel-size",
                        "--rl-inference-model-unified-memory-level"})
    v.push_back(refused(f, G::integer, kNoRl));
  for (const char* f : {"--langrl-env-config", "--rl-sequence-packing-algo", "--dpo-loss-type", "--refit-method",
                        "--rl-consumption-granularity", "--rl-submission-granularity"})
    v.push_back(refused(f, G::text, kNoRl));
  for (const char* f : {"--perform-rl-step", "--rl-offload-optimizer-during-inference", "--rl-partial-rollouts",
                        "--rl-use-sequence-packing", "--is-pairwise-dataset", "--rl-training-cuda-graphs",
                        "--rl-offload-inference-model-weights-when-idle"})
    v.push_back(refused(f, G::on_off, kNoRl));
  for (const char* f : {"--ref-model", "--reward-model", "--placeholder-token", "--simpo-loss-type"})
    v.push_back(refused(f, G::text, kNoRl));  // (older MindSpeed-LLM flags)
  v.push_back(refused("--reward-tokens", G::text_list, kNoRl));
  v.push_back(refused("--rollout-batch-size", G::integer, kNoRl));
  for (const char* f : {"--gamma-beta-ratio", "--simpo-beta"}) v.push_back(refused(f, G::number, kNoRl));
  for (const char* f : {"--lora-alpha", "--lora-r", "--lu-lora-final-layer-index"})
    v.push_back(refused(f, G::integer, kNoLora));
  v.push_back(refused("--lora-target-modules", G::text_list, kNoLora));
  for (const char* f : {"--lora-fusion", "--lora-ckpt-filter"}) v.push_back(refused(f, G::on_off, kNoLora));
  v.push_back(refused("--qlora", G::on_off, kNoLora));
  v.push_back(refused("--lora-load", G::text, kNoLora));
  for (const char* f : {"--lu-lora-lr", "--lu-lora-lr-ratio"}) v.push_back(refused(f, G::number, kNoLora));
  v.push_back(refused("--fim-data", G::on_off, kNoFim));
  for (const char* f : {"--fim-rate", "--fim-spm-rate"}) v.push_back(refused(f, G::number, kNoFim));
  v.push_back(refused("--mock-data", G::on_off, kNoMock));
  v.push_back(refused("--no-shuffle", G::on_off, kDataOrder));
  v.push_back(refused("--dataloader-type", G::text, kDataOrder, "single|cyclic"));
  v.push_back(refused("--output-prefix", G::text, kPreprocessing));
  v.push_back(refused("--yaml-cfg", G::text, kNoYaml));
  v.push_back(refused("--error-injection-rate", G::integer, kNoErrorInjection, "0"));
  for (const char* f : {"--num-layer-list", "--schedules-method", "--pipeline-model-parallel-layout",
                        "--pipeline-num-transformer-layers"})
    v.push_back(refused(f, G::text, kNoPipeline));
  for (const char* f : {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"})
    v.push_back(refused(f, G::on_off, kNoPipeline));
  for (const char* f : {"--data-parallel-sharding-strategy", "--outer-dp-sharding-strategy"})
    v.push_back(refused(f, G::text, kNoSharding, "no_shard"));
  for (const char* f : {"--use-megatron-fsdp", "--use-torch-fsdp2", "--use-custom-fsdp", "--layerzero"})
    v.push_back(refused(f, G::on_off, kNoSharding));
  v.push_back(refused("--num-distributed-optimizer-instances", G::integer, kNoSharding, "1"));
  for (const char* f : {"--fsdp2-config-path", "--layerzero-config"}) v.push_back(refused(f, G::text, kNoSharding));
  v.push_back(refused("--moe-tp-extend-ep", G::on_off, kExpertTp));
  v.push_back(refused("--tp-2d", G::on_off, kTp1d));
  for (const char* f : {"--tp-x", "--tp-y"}) v.push_back(refused(f, G::integer, kTp1d));
  v.push_back(refused("--unaligned-linear", G::on_off, kAlignedTp));
  v.push_back(refused("--ulysses-degree-in-cp", G::integer, kNoUlysses));
  v.push_back(refused("--use-ulysses-allgather-kv", G::on_off, kNoUlysses));
  v.push_back(refused("--cp-window-size", G::integer, kRingCp, "1"));
  v.push_back(refused("--cp-comm-type", G::text_list, kRingCp, "p2p"));
  v.push_back(refused("--hierarchical-context-parallel-sizes", G::text_list, kRingCp));
}

// The positions: learned, none or rotary embeddings and their settings (layer flags).
void add_position_flags(std::vector<FlagSpec>& v) {
  const unsigned L = kLayerSubs;
  v.push_back(flag("--position-embedding-type", L, kGroupModel, G::text,
                   "learned_absolute (an [s, h] table added to the token embeddings), rope (q and k rotated by "
                   "position in every block, no parameters) or none",
                   AT(layer->position_embedding_type), kDef));
  v.push_back(flag("--use-rotary-position-embeddings", L, kGroupModel, G::on_off,
                   "the same as --position-embedding-type rope (Megatron's older spelling)",
                   AT(layer->use_rotary_position_embeddings)));
  v.push_back(flag("--no-position-embedding", L, kGroupModel, G::on_off,
                   "no learned position table: only with rope, which has none (Megatron's rule)",
                   AT(layer->no_position_embedding)));
  v.push_back(flag("--rotary-base", L, kGroupModel, G::integer, "RoPE's base: frequencies 1 / base^(2i / rotary dim)",
                   AT(layer->rotary_base), kDef));
  v.push_back(flag("--rotary-percent", L, kGroupModel, G::number,
                   "share of each head's channels RoPE rotates (the rest pass through)", AT(layer->cfg.rotary_percent),
                   kDef));
  v.push_back(flag("--rotary-interleaved", L, kGroupModel, G::on_off,
                   "RoPE rotates channel pairs (2i, 2i+1) instead of (i, i + rotary dim / 2)",
                   AT(layer->cfg.rotary_interleaved)));
  v.push_back(flag("--rotary-seq-len-interpolation-factor", L, kGroupModel, G::integer,
                   "RoPE's positions divided by this factor (linear interpolation)",
                   AT(layer->cfg.rotary_interpolation_factor)));
  v.push_back(flag("--use-rope-scaling", L, kGroupModel, G::on_off,
                   "Llama 3's frequency scaling of RoPE (low 1, high 4, original context 8192)",
                   AT(layer->cfg.use_rope_scaling)));
  v.push_back(flag("--rope-scaling-factor", L, kGroupModel, G::number, "Llama 3's scaling factor (--use-rope-scaling)",
                   AT(layer->cfg.rope_scaling_factor), kDef));
}

// The layer (LayerFlags), shared by every subcommand that builds a layer: its sizes and the router.
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
  v.push_back(flag("--moe-ffn-hidden-size", L, kGroupMoe, G::integer,
                   "the experts' FFN hidden size F (Megatron's; every block here is an MoE block, so it replaces "
                   "--ffn-hidden-size)",
                   AT(layer->moe_ffn_hidden_size)));
  v.push_back(flag("--moe-intermediate-size", L, kGroupMoe, G::integer,
                   "MindSpeed-LLM's deprecated spelling of --moe-ffn-hidden-size", AT(layer->moe_intermediate_size)));
  v.push_back(flag("--moe-shared-expert-intermediate-size", L, kGroupMoe, G::integer,
                   "a shared expert of this FFN size beside the routed experts: every token through it, its output "
                   "added to theirs (Megatron-Core's; docs/layer.md §6.11)",
                   AT(layer->moe_shared_expert_intermediate_size)));
  v.push_back(flag("--n-shared-experts", L, kGroupMoe, G::integer,
                   "MindSpeed-LLM's shared experts: one shared expert of K x the experts' FFN size",
                   AT(layer->n_shared_experts)));
  v.push_back(flag("--kv-channels", L, kGroupModel, G::integer,
                   "Megatron's attention head dimension: accepted when it is --hidden-size / --num-attention-heads "
                   "(the head dimension here)",
                   AT(layer->kv_channels)));
  v.push_back(flag("--expert-tensor-parallel-size", L, kGroupParallel, G::integer,
                   "Megatron's tensor-parallel size of the experts: accepted when it is --tensor-model-parallel-size "
                   "(the experts are sharded over the tp ranks)",
                   AT(layer->expert_tensor_parallel_size)));
  v.push_back(flag("--num-attention-heads", L, kGroupModel, G::integer, "attention heads n",
                   AT(layer->cfg.num_attention_heads), kDef));
  v.push_back(flag("--num-experts", L, kGroupMoe, G::integer,
                   "experts E (train, simulate: without it (or 0) a dense GPT, as in Megatron; layer-check, "
                   "bench-layer, plan: default 4, 0 a dense block)",
                   AT(layer->cfg.num_experts)));
  v.push_back(flag("--moe-router-topk", L, kGroupMoe, G::integer, "experts per token k (1 or 2)",
                   AT(layer->cfg.moe_router_topk), kDef));
  v.push_back(flag("--moe-train-capacity-factor", L, kGroupMoe, G::number, "expert capacity factor",
                   AT(layer->cfg.moe_train_capacity_factor), kDef));
  v.push_back(flag("--moe-min-capacity", L, kGroupMoe, G::integer, "minimum expert capacity",
                   AT(layer->cfg.moe_min_capacity), kDef));
  v.push_back(flag("--moe-no-drop", L, kGroupMoe, G::on_off, "no capacity limit: no token is dropped",
                   AT(layer->cfg.moe_no_drop)));
  v.push_back(flag("--moe-expert-capacity-factor", L, kGroupMoe, G::number,
                   "megatron_moe: each expert takes at most ceil(S k / E x factor) of a chunk's S tokens, the rest "
                   "dropped (not given or < 0: dropless)",
                   AT(layer->cfg.moe_expert_capacity_factor)));
  v.push_back(flag("--moe-pad-expert-input-to-capacity", L, kGroupMoe, G::on_off,
                   "megatron_moe with --moe-expert-capacity-factor: every expert's input padded to the capacity (a "
                   "fixed capacity; the same results)",
                   AT(layer->cfg.moe_pad_expert_input_to_capacity)));
  v.push_back(flag("--moe-token-drop-policy", L, kGroupMoe, G::text,
                   "megatron_moe with --moe-expert-capacity-factor: probs (drop the lowest routing weights) or "
                   "position (drop the last tokens)",
                   AT(layer->moe_token_drop_policy), kDef));
  v.push_back(flag("--moe-z-loss-coeff", L, kGroupMoe, G::number,
                   "megatron_moe: the router z-loss coefficient (coeff x mean over tokens of logsumexp(logits)^2, added "
                   "to the loss)",
                   AT(layer->cfg.moe_z_loss_coeff)));
  v.push_back(flag("--moe-grouped-gemm", L, kGroupMoe, G::on_off,
                   "the local experts' GEMMs of a chunk and their weight gradients as one batched GEMM call each (the "
                   "same products; docs/layer.md §6.8)",
                   AT(layer->cfg.moe_grouped_gemm)));
  v.push_back(flag("--moe-model-type", L, kGroupMoe, G::text,
                   "deepspeed_moe (DeepSpeed-MoE's top-1/top-2 gate with a capacity) or megatron_moe (Megatron-Core's "
                   "dropless top-k router, k up to 8)",
                   AT(layer->moe_model_type), kDef));
  v.push_back(flag("--moe-router-pre-softmax", L, kGroupMoe, G::on_off,
                   "megatron_moe: top-k of the softmax probabilities (weights not renormalised) instead of the "
                   "softmax over the top-k logits",
                   AT(layer->cfg.moe_router_pre_softmax)));
  v.push_back(flag("--moe-router-topk-scaling-factor", L, kGroupMoe, G::number,
                   "megatron_moe: a factor on the routing weights", AT(layer->cfg.moe_router_topk_scaling_factor)));
  v.push_back(flag("--moe-router-load-balancing-type", L, kGroupMoe, G::text_list,
                   "megatron_moe: aux_loss (Megatron's switch load-balancing loss, scaled by --moe-aux-loss-coeff), "
                   "seq_aux_loss (the same per sequence, averaged), sinkhorn (S-BASE's balanced choices, per router "
                   "call: per AMPipe chunk; needs --moe-aux-loss-coeff 0) or none",
                   AT(layer->moe_router_load_balancing_type), kDef));
  v.push_back(flag("--moe-router-score-function", L, kGroupMoe, G::text,
                   "megatron_moe: softmax, or sigmoid (weights: the chosen sigmoid scores, normalised when topk > 1)",
                   AT(layer->moe_router_score_function), kDef));
  v.push_back(flag("--moe-router-num-groups", L, kGroupMoe, G::integer,
                   "megatron_moe: group-limited routing, the experts in this many equal groups",
                   AT(layer->cfg.moe_router_num_groups)));
  v.push_back(flag("--moe-router-group-topk", L, kGroupMoe, G::integer,
                   "megatron_moe: the groups each token may route to (the best by their top scores)",
                   AT(layer->cfg.moe_router_group_topk)));
  v.push_back(flag("--n-group", L, kGroupMoe, G::integer,
                   "MindSpeed-LLM's deprecated spelling of --moe-router-num-groups (which wins when both are given)",
                   AT(layer->n_group)));
  v.push_back(flag("--topk-group", L, kGroupMoe, G::integer,
                   "MindSpeed-LLM's deprecated spelling of --moe-router-group-topk (which wins when both are given)",
                   AT(layer->topk_group)));
  v.push_back(flag("--routed-scaling-factor", L, kGroupMoe, G::number,
                   "MindSpeed-LLM's deprecated spelling of --moe-router-topk-scaling-factor (which wins when both "
                   "are given)",
                   AT(layer->routed_scaling_factor)));
  v.push_back(flag("--moe-router-enable-expert-bias", L, kGroupMoe, G::on_off,
                   "megatron_moe, sigmoid: a per-expert routing bias moved towards balance after every step "
                   "(aux-loss-free balancing)",
                   AT(layer->cfg.moe_router_enable_expert_bias)));
  v.push_back(flag("--moe-router-bias-update-rate", L, kGroupMoe, G::number,
                   "the expert bias's step: b += rate * sign(mean load - load)",
                   AT(layer->cfg.moe_router_bias_update_rate), kDef));
  v.push_back(
      flag("--no-use-rts", L, kGroupMoe, G::on_off, "turn off random token selection (top-1)", AT(layer->no_use_rts)));
  v.push_back(flag("--noisy-gate-policy", L, kGroupMoe, G::text, "None, Jitter or RSample",
                   AT(layer->noisy_gate_policy), kDef));
}

// The layer, continued: its model options, parallel layout and runtime.
void add_layer_model_flags(std::vector<FlagSpec>& v) {
  const unsigned L = kLayerSubs;
  v.push_back(flag("--swiglu", L, kGroupModel, G::on_off, "SwiGLU experts instead of GeLU", AT(layer->swiglu)));
  v.push_back(flag("--normalization", L, kGroupModel, G::text,
                   "LayerNorm or RMSNorm (weight only, no biases): LN1, LN2 and the final norm",
                   AT(layer->normalization), kDef));
  v.push_back(flag("--norm-epsilon", L, kGroupModel, G::number, "epsilon inside the normalisation's square root",
                   AT(layer->norm_epsilon), kDef));
  v.push_back(flag("--moe-shared-expert-gate", L, kGroupMoe, G::on_off,
                   "the shared expert's output times a per-token sigmoid gate sigmoid(x . g), g [1, h] "
                   "(Megatron-Core's; Qwen2-MoE's shared_expert_gate)",
                   AT(layer->cfg.moe_shared_expert_gate)));
  v.push_back(flag("--shared-expert-gate", L, kGroupMoe, G::on_off,
                   "MindSpeed-LLM's spelling of --moe-shared-expert-gate", AT(layer->cfg.moe_shared_expert_gate)));
  v.push_back(flag("--add-qkv-bias", L, kGroupModel, G::on_off,
                   "a bias in the QKV projection only (Qwen2's; Megatron's --add-qkv-bias), in the [q | k | v] layout "
                   "and tp cut of its rows; initialised to 0",
                   AT(layer->cfg.add_qkv_bias)));
  v.push_back(flag("--add-bias-linear", L, kGroupModel, G::on_off,
                   "biases in the linear layers: QKV, the out-projection, the experts' and a dense layer's fc1 and "
                   "fc2 (Megatron's add_bias_linear; not with a shared expert, which has none); initialised to 0",
                   AT(layer->add_bias_linear)));
  v.push_back(flag("--disable-bias-linear", L, kGroupModel, G::on_off,
                   "no biases in the linear layers (Megatron's spelling of add_bias_linear off)",
                   AT(layer->disable_bias_linear)));
  v.push_back(flag("--qk-layernorm", L, kGroupModel, G::on_off,
                   "q and k of every head normalised over the head dim (the --normalization type, weights shared by "
                   "the heads) after the QKV projection, before RoPE",
                   AT(layer->cfg.qk_layernorm)));
  v.push_back(flag("--group-query-attention", L, kGroupModel, G::on_off,
                   "grouped-query attention: --num-query-groups K, V heads, each shared by consecutive query heads",
                   AT(layer->group_query_attention)));
  v.push_back(flag("--num-query-groups", L, kGroupModel, G::integer,
                   "K, V heads with --group-query-attention (a divisor of the heads, a multiple of the tp size)",
                   AT(layer->num_query_groups), kDef));
  add_position_flags(v);
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
  v.push_back(flag("--startup-timeout", R, kGroupParallel, G::number,
                   "seconds a rank waits for its peers before the first step (the start-up agreements, the checks of "
                   "flags, files and checkpoints on every rank) and for their answer when one of them failed; "
                   "at most --comm-timeout",
                   AT(comm->startup_timeout_s), kDef | kAgree));
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
                   AT(layer_check->global_batch_size), kUnsetZero));
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
                   AT(plan->global_batch_size), kUnsetZero));
  v.push_back(flag("--world-size", kPlan, kGroupParallel, G::integer,
                   "with --step: devices (data-parallel size = world / (tp x cp))", AT(plan->world_size),
                   kDef | kUnsetZero));
  v.push_back(flag("--vocab-size", kPlan, kGroupModel, G::integer, "with --step: vocabulary of the LM head",
                   AT(plan->vocab_size), kDef));
  v.push_back(flag("--pipeline-model-parallel-size", kPlan, kGroupParallel, G::integer,
                   "with --step: pipeline stages (an even split of --num-layers): the 1F1B timeline and each stage's "
                   "step Plan",
                   AT(plan->pipeline_model_parallel_size), kDef));
  v.push_back(flag("--num-virtual-stages-per-pipeline-rank", kPlan, kGroupParallel, G::integer,
                   "with --step: model chunks per pipeline stage, run in Megatron's interleaved schedule",
                   AT(plan->num_virtual_stages_per_pipeline_rank)));
  v.push_back(flag("--microbatch-group-size-per-virtual-pipeline-stage", kPlan, kGroupParallel, G::integer,
                   "with --step: micro-batches a virtual stage runs in a row in the interleaved schedule (default: P)",
                   AT(plan->microbatch_group_size_per_vp_stage)));
}

// `ampipe train` (and `ampipe simulate`, which takes the train flags): the model and the parallelism.
void add_train_model_flags(std::vector<FlagSpec>& v) {
  const unsigned T = kTrainSubs;
  v.push_back(flag("--config", T, kGroupTraining, G::text,
                   "JSON file of flags (keys: flag names); command-line flags override it", AT(train->config_file),
                   kPath | kNoConfig));
  v.push_back(flag("--num-layers", T, kGroupModel, G::integer, "transformer blocks L", AT(train->cfg.num_layers), kDef));
  v.push_back(flag("--moe-layer-freq", T, kGroupMoe, G::text,
                   "which blocks have experts: an integer k (blocks 0, k, 2k, ...) or a list of 0/1 per block such as "
                   "\"([0]+[1]*23)\"; the others are dense (an MLP of --ffn-hidden-size)",
                   AT(train->cfg.moe_layer_freq), kDef));
  v.push_back(flag("--first-k-dense-replace", T, kGroupMoe, G::integer,
                   "the first K blocks dense (MindSpeed-LLM's, DeepSeek's first_k_dense_replace)",
                   AT(train->cfg.first_k_dense_replace), kDef));
  v.push_back(flag("--untie-embeddings-and-output-weights", T, kGroupModel, G::on_off,
                   "separate LM-head matrix instead of the token embedding",
                   AT(train->cfg.untie_embeddings_and_output_weights)));
  v.push_back(flag("--use-flash-attn", T, kGroupModel, G::on_off,
                   "flash attention (this engine's only attention kernel; required with --ampipe-degree > 1)",
                   AT(train->cfg.use_flash_attn)));
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
  v.push_back(flag("--pipeline-model-parallel-size", T, kGroupParallel, G::integer,
                   "pipeline stages P: the layers split into P consecutive stages, run in Megatron's 1F1B schedule "
                   "(interleaved with virtual stages)",
                   AT(train->cfg.pipeline_model_parallel_size), kDef));
  v.push_back(flag("--decoder-first-pipeline-num-layers", T, kGroupParallel, G::integer,
                   "layers of the first pipeline stage (the others split the rest evenly)",
                   AT(train->cfg.decoder_first_pipeline_num_layers)));
  v.push_back(flag("--decoder-last-pipeline-num-layers", T, kGroupParallel, G::integer,
                   "layers of the last pipeline stage (the others split the rest evenly)",
                   AT(train->cfg.decoder_last_pipeline_num_layers)));
  v.push_back(flag("--num-layers-per-virtual-pipeline-stage", T, kGroupParallel, G::integer,
                   "layers per virtual pipeline stage: each rank holds num-layers / (P x this) model chunks, run in "
                   "Megatron's interleaved schedule",
                   AT(train->cfg.num_layers_per_virtual_pipeline_stage)));
  v.push_back(flag("--num-virtual-stages-per-pipeline-rank", T, kGroupParallel, G::integer,
                   "model chunks (virtual stages) per pipeline rank, run in Megatron's interleaved schedule",
                   AT(train->cfg.num_virtual_stages_per_pipeline_rank)));
  v.push_back(flag("--microbatch-group-size-per-virtual-pipeline-stage", T, kGroupParallel, G::integer,
                   "micro-batches a virtual stage runs in a row in the interleaved schedule (default: P)",
                   AT(train->cfg.microbatch_group_size_per_vp_stage)));
  v.push_back(flag("--use-distributed-optimizer", T, kGroupParallel, G::on_off,
                   "shard AdamW's state over each data-parallel group (ZeRO-1, Megatron's distributed optimizer): "
                   "gradients reduce-scattered, each rank updating its shard, parameters all-gathered",
                   AT(train->cfg.use_distributed_optimizer)));
  v.push_back(flag("--overlap-grad-reduce", T, kGroupParallel, G::on_off,
                   "overlap each layer's data-parallel gradient reduction with the backward (always done here)",
                   AT(train->cfg.overlap_grad_reduce)));
  v.push_back(flag("--overlap-param-gather", T, kGroupParallel, G::on_off,
                   "all-gather each layer's updated parameters under the next step's forward, each waited for "
                   "right before the layer's first forward (needs --use-distributed-optimizer and "
                   "--overlap-grad-reduce)",
                   AT(train->cfg.overlap_param_gather)));
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
                   AT(train->cfg.global_batch_size), kUnsetZero));
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
  v.push_back(flag("--lr-warmup-fraction", T, kGroupLr, G::number,
                   "warm up over this fraction of the decay (Megatron's: f x --lr-decay-iters, or with --train-samples "
                   "of --lr-decay-samples; a whole number of iterations) instead of --lr-warmup-iters",
                   AT(train->lr_warmup_fraction)));
  v.push_back(flag("--lr-warmup-samples", T, kGroupLr, G::integer,
                   "with --train-samples: warm up over this many samples (a multiple of the global batch)",
                   AT(train->lr_warmup_samples)));
  v.push_back(flag("--lr-decay-samples", T, kGroupLr, G::integer,
                   "with --train-samples: the decay reaches --min-lr after this many samples (a multiple of the global "
                   "batch; default --train-samples)",
                   AT(train->lr_decay_samples)));
  v.push_back(flag("--weight-decay", T, kGroupTraining, G::number, "AdamW decoupled weight decay (matrices only)",
                   AT(train->cfg.weight_decay), kDef));
  v.push_back(flag("--apply-wd-to-qk-layernorm", T, kGroupTraining, G::on_off,
                   "weight decay on the --qk-layernorm weights and biases too",
                   AT(train->cfg.apply_wd_to_qk_layernorm)));
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
                   "SentencePieceTokenizer, Llama2Tokenizer or HuggingFaceTokenizer (with --tokenizer-model), GPT2BPETokenizer (with "
                   "--vocab-file, --merge-file); default: bytes of plain text, ids of a token file or dataset",
                   AT(train->cfg.tokenizer_type)));
  v.push_back(flag("--tokenizer-model", T, kGroupData, G::text,
                   "SentencePiece model, or a Hugging Face tokenizer.json (or its directory): tokenizes a plain-text "
                   "--data-path at load, and gives the vocabulary size",
                   AT(train->cfg.tokenizer_model), kPath));
  // Megatron's vocabulary sizing (train/vocab_size.h)
  v.push_back(flag("--vocab-size", T, kGroupModel, G::integer,
                   "the vocabulary before padding where no tokenizer gives one (token files, indexed datasets; "
                   "simulate, which reads no data): every id must be below it (default: the largest id + 1, 256 for "
                   "byte-level text); with a tokenizer its count is the vocabulary (Megatron's: a larger value has no "
                   "effect)",
                   AT(train->cfg.vocab_size)));
  v.push_back(flag("--make-vocab-size-divisible-by", T, kGroupModel, G::integer,
                   "pad the vocabulary to a multiple of this x --tensor-model-parallel-size (Megatron's dummy "
                   "tokens: rows of the embedding and the LM head no id uses)",
                   AT(train->cfg.make_vocab_size_divisible_by), kDef));
  v.push_back(flag("--padded-vocab-size", T, kGroupModel, G::integer,
                   "the model's vocabulary (the rows of the embedding and the LM head) as given instead of the "
                   "padding: at least the vocabulary, divisible by --tensor-model-parallel-size",
                   AT(train->cfg.padded_vocab_size)));
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
                   AT(train->cfg.split), kDef | kNonEmpty));
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
  constexpr const char* kFromCheckpoint =
      "take the learning-rate schedule (--lr, --min-lr, --lr-warmup-iters, --lr-decay-iters, --lr-decay-style, "
      "--weight-decay) from the --load checkpoint";
  constexpr const char* kFromRun =
      "the learning-rate schedule is this run's flags, not the --load checkpoint's (always so here: a note names "
      "each setting that differs)";
  v.push_back(flag("--use-checkpoint-opt-param-scheduler", T, kGroupCheckpoint, G::on_off, kFromCheckpoint,
                   AT(train->use_checkpoint_opt_param_scheduler), kAgree));
  v.push_back(flag("--use-checkpoint-opt_param-scheduler", T, kGroupCheckpoint, G::on_off,
                   "Megatron's other spelling of --use-checkpoint-opt-param-scheduler",
                   AT(train->use_checkpoint_opt_param_scheduler), kNoConfig));
  v.push_back(flag("--override-opt-param-scheduler", T, kGroupCheckpoint, G::on_off, kFromRun,
                   AT(train->override_opt_param_scheduler)));
  v.push_back(flag("--override-opt_param-scheduler", T, kGroupCheckpoint, G::on_off,
                   "Megatron's other spelling of --override-opt-param-scheduler", AT(train->override_opt_param_scheduler),
                   kNoConfig));
  v.push_back(flag("--exit-on-missing-checkpoint", T, kGroupCheckpoint, G::on_off,
                   "with --load: exit with an error when it holds no checkpoint, instead of starting from iteration 0",
                   AT(train->exit_on_missing_checkpoint), kAgree));
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
  v.push_back(
      refused("--fp16", G::on_off, "fp16 training needs loss scaling, which this engine does not have; use --bf16"));
  v.push_back(refused("--loss-scale", G::text,
                      "loss scaling belongs to fp16 training, which this engine does not have; use --bf16"));
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
                   "JSON lines: SentencePieceTokenizer, Llama2Tokenizer or HuggingFaceTokenizer (with "
                   "--tokenizer-model), GPT2BPETokenizer (with --vocab-file, --merge-file); default: byte-level (the "
                   "UTF-8 bytes, V = 256, end of document 0)",
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
  v.push_back(flag("--ampipe-degree", S, kGroupMoe, G::degree_list,
                   "AMPipe degrees to predict: a comma list (1,2,4,8) or auto (every degree of 1,2,4,8,16 dividing "
                   "--seq-length, each with pipe-experts and the tp-sp overlap weighed too); the fastest that fits "
                   "in the profile's device memory is chosen",
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
                   AT(simulate->world_size), kUnsetZero));
  v.push_back(flag("--nodes", S, kGroupParallel, G::integer,
                   "nodes the devices sit on (default: world size / the profile's devices_per_node, at least 1)",
                   AT(simulate->nodes), kUnsetZero));
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
  const unsigned V = kConvert;
  v.push_back(flag("--load-dir", V, kGroupCheckpoint, G::text,
                   "a Hugging Face Mixtral, Qwen2-MoE or Qwen3-MoE directory (config.json, model.safetensors or its "
                   "shards) to convert into an ampipe checkpoint, or an ampipe checkpoint directory to convert into one",
                   AT(convert->load_dir), kPath | kRequired));
  v.push_back(flag("--save-dir", V, kGroupCheckpoint, G::text, "the directory to write the converted checkpoint to",
                   AT(convert->save_dir), kPath | kRequired));
  v.push_back(flag("--seq-length", V, kGroupModel, G::integer,
                   "Hugging Face to ampipe: the checkpoint's --seq-length (default: max_position_embeddings, at most "
                   "4096)",
                   AT(convert->seq_length), kUnsetZero));
  v.push_back(flag("--make-vocab-size-divisible-by", V, kGroupModel, G::integer,
                   "Hugging Face to ampipe: the vocabulary padded to a multiple of this (Megatron's; the padding rows "
                   "are zero and cut off again on the way back)",
                   AT(convert->make_vocab_size_divisible_by), kDef));
}

#undef AT

std::vector<FlagSpec> make_registry() {
  std::vector<FlagSpec> v;
  add_layer_flags(v);
  add_layer_model_flags(v);
  add_layer_command_flags(v);
  add_train_model_flags(v);
  add_train_schedule_flags(v);
  add_train_output_flags(v);
  add_refused_model_flags(v);
  add_refused_training_flags(v);
  add_noop_flags(v);
  add_noop_kernel_flags(v);
  add_noop_run_flags(v);
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

// kUnsetZero: an integer >= 1 (0 is the field's "not given").
CLI::Validator positive_validator() {
  return CLI::Validator(
      [](std::string& v) {
        size_t used = 0;
        long long x = 0;
        try {
          x = std::stoll(v, &used);
        } catch (const std::exception&) {
          return std::string();  // not an integer: CLI11's conversion says so
        }
        if (used != v.size() || x >= 1) return std::string();
        return v + " is invalid: it must be >= 1 (leave the flag out for its default)";
      },
      "INT");
}

// kNonEmpty: a text that is not "" ("" is the field's "not given").
CLI::Validator non_empty_text() {
  return CLI::Validator(
      [](std::string& v) { return v.empty() ? std::string("'' is invalid: it must not be empty") : std::string(); },
      "TEXT");
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
    case kConvert:
      return "convert";
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
  const char* megatron_group = nullptr;  // a refused or no-op flag's group, unless a subcommand gives it a meaning
  for (const FlagSpec& s : flag_registry())
    if (s.name == flag) {
      if (s.refused == nullptr && s.noop == nullptr) return s.group.c_str();
      megatron_group = s.group.c_str();
    }
  return megatron_group;
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
    if (s->attrs & kUnsetZero) o->check(positive_validator());
    if (s->attrs & kNonEmpty) o->check(non_empty_text());
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
