#include "ampipe/cli/train_agreement.h"

#include "ampipe/core/checksum.h"

namespace ampipe::cli {

nlohmann::json train_agreement(const train::TrainConfig& cfg, const TrainFlags& flags, const train::Corpus& corpus) {
  nlohmann::json j = train::to_json(cfg);
  const model::LayerConfig& l = cfg.layer;
  j["layernorm_epsilon"] = l.layernorm_epsilon;
  j["pipe_experts_multi_stream"] = l.pipe_experts_multi_stream;
  j["use_flash_attn"] = cfg.use_flash_attn;
  j["add_bias_linear"] = cfg.add_bias_linear;
  j["tensor_model_parallel_size"] = l.tensor_model_parallel_size;
  j["context_parallel_size"] = cfg.layer.context_parallel_size;
  j["context_parallel_algo"] = cfg.layer.context_parallel_algo;
  j["sequence_parallel"] = l.sequence_parallel;
  j["ampipe_tp_sp_comm_overlap"] = l.ampipe_tp_sp_comm_overlap;
  j["use_ascend_mc2"] = cfg.use_ascend_mc2;
  j["overlap_grad_reduce"] = cfg.overlap_grad_reduce;
  j["overlap_param_gather"] = cfg.overlap_param_gather;
  j["use_nanopipe"] = cfg.use_nanopipe;
  j["recompute_in_bubble"] = cfg.recompute_in_bubble;
  j["recompute_in_advance"] = cfg.recompute_in_advance;
  j["adaptive_recompute_device_swap"] = cfg.adaptive_recompute_device_swap;
  j["adaptive_recompute_device_size"] = cfg.adaptive_recompute_device_size;
  j["adaptive_memory_optimization"] = cfg.adaptive_memory_optimization;
  j["recompute_granularity"] = cfg.recompute_granularity;
  j["recompute_method"] = cfg.recompute_method;
  j["recompute_num_layers"] = cfg.recompute_num_layers;
  j["exit_interval"] = cfg.exit_interval;
  j["train_samples"] = cfg.train_samples;
  j["attention_dropout"] = cfg.attention_dropout;
  j["distributed_backend"] = cfg.distributed_backend;
  j["no_load_optim"] = cfg.no_load_optim;
  j["finetune"] = cfg.finetune;
  j["use_checkpoint_args"] = cfg.use_checkpoint_args;
  j["skip_train"] = cfg.skip_train;
  j["vocab_size"] = cfg.vocab_size;
  j["eval_interval"] = cfg.eval_interval;
  j["eval_iters"] = cfg.eval_iters;
  j["save"] = cfg.save;
  j["load"] = cfg.load;
  j["save_interval"] = cfg.save_interval;
  j["log_interval"] = cfg.log_interval;
  j["trace"] = cfg.trace;
  j["loss_plot"] = cfg.loss_plot;
  j["trace_iteration"] = cfg.trace_iteration;
  j["sim_profile"] = flags.sim_profile;
  j["ampipe_degree"] = flags.ampipe_degree;  // as given: an integer or auto
  j["check_collectives"] = flags.comm.check_collectives;
  j["comm_timeout"] = flags.comm.comm_timeout_s;
  j["data_path contents"] = fmt::format("{} tokens, {}", corpus.tokens.size(),
                                        core::checksum_string(core::xxh64(corpus.tokens.data(),
                                                                          corpus.tokens.size() * sizeof(int32_t))));
  return j;
}

}  // namespace ampipe::cli
