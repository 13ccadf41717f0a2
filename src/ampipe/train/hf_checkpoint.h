// Hugging Face checkpoints of Mixtral (MixtralForCausalLM), Qwen2-MoE (Qwen2MoeForCausalLM) and Qwen3-MoE
// (Qwen3MoeForCausalLM), to and from ampipe train checkpoints (`ampipe convert`, docs/training.md "Converting Hugging
// Face checkpoints").
//
// A Hugging Face directory holds config.json and model.safetensors, or shards model-0000i-of-0000n.safetensors
// named by model.safetensors.index.json's "weight_map". The tensors map one to one, as exact copies (bf16 widened to
// fp32 and back is exact), so HF -> ampipe -> HF gives every tensor's bytes back:
//
//   model.embed_tokens.weight [V, h]             embedding.word_embeddings.weight [V', h] (V' = V padded, rows
//                                                [V, V') zero; cut back to V)
//   model.layers.{i}.input_layernorm.weight      layers.{i}.ln1.weight
//   ...self_attn.{q,k,v}_proj.weight             layers.{i}.attn.qkv.weight: rows [q (n*d) | k (g*d) | v (g*d)]
//   ...self_attn.{q,k,v}_proj.bias (Qwen2)       layers.{i}.attn.qkv.bias: the same blocks (--add-qkv-bias)
//   ...self_attn.{q,k}_norm.weight (Qwen3)       layers.{i}.attn.{q,k}_layernorm.weight (--qk-layernorm)
//   ...self_attn.o_proj.weight                   layers.{i}.attn.proj.weight
//   ...post_attention_layernorm.weight           layers.{i}.ln2.weight
//   ...block_sparse_moe.gate.weight (Mixtral),   layers.{i}.moe.gate.weight
//   ...mlp.gate.weight (Qwen)
//   experts.{e}.w1 / gate_proj [F, h]            layers.{i}.moe.experts.fc1.weight[e] rows [0, F) (SiLU branch)
//   experts.{e}.w3 / up_proj [F, h]              ... rows [F, 2F) (linear branch)
//   experts.{e}.w2 / down_proj [h, F]            layers.{i}.moe.experts.fc2.weight[e]
//   ...mlp.shared_expert.gate_proj [Fs, h]       layers.{i}.mlp.fc1.weight rows [0, Fs) (Qwen2's shared expert,
//   ...mlp.shared_expert.up_proj [Fs, h]         ... rows [Fs, 2Fs)           --moe-shared-expert-intermediate-size)
//   ...mlp.shared_expert.down_proj [h, Fs]       layers.{i}.mlp.fc2.weight
//   ...mlp.shared_expert_gate.weight [1, h]      layers.{i}.mlp.gate.weight (--moe-shared-expert-gate)
//   a Qwen dense layer's (decoder_sparse_step, mlp_only_layers: --moe-layer-freq as a 0/1 list):
//   ...mlp.{gate,up}_proj [Fd, h]                layers.{i}.mlp.fc1.weight rows [gate | up] (Fd: intermediate_size,
//   ...mlp.down_proj [h, Fd]                     layers.{i}.mlp.fc2.weight                 --ffn-hidden-size)
//   model.norm.weight                            final_layernorm.weight
//   lm_head.weight (untied)                      output_layer.weight
//
// The model flags follow from config.json (RMSNorm, rotary embeddings, SwiGLU experts, Megatron-Core's dropless
// top-k router: Mixtral and Qwen's norm_topk_prob renormalise over the chosen experts, norm_topk_prob false is
// --moe-router-pre-softmax); a value ampipe cannot express is refused with one line naming config.json's key. The
// ampipe checkpoint's metadata.json keeps the original config.json and the tensors' dtype under "hf", so the way back
// writes them again; a checkpoint trained by ampipe from scratch gets a config.json built from its flags.
#pragma once

#include <cstdint>
#include <string>

#include "ampipe/comm/group.h"

namespace ampipe::train {

struct HfConvertOptions {
  int64_t seq_length = 0;  // the ampipe checkpoint's --seq-length (0: min(max_position_embeddings, 4096))
  int64_t make_vocab_size_divisible_by = 128;
};

// Whether `dir` looks like a Hugging Face model directory (it holds config.json).
bool is_hf_dir(const std::string& dir);

// Hugging Face directory `hf_dir` -> an ampipe train checkpoint (iteration 0, a fresh optimizer) in `out_dir`, as
// `ampipe train --save` writes it. One rank. Throws ConfigError naming the file or config.json key, the value and
// the rule. Returns a one-line summary.
std::string hf_to_ampipe(const std::string& hf_dir, const std::string& out_dir, const HfConvertOptions& opts,
                         const comm::Groups& groups);

// The newest checkpoint of `ckpt_dir` -> a Hugging Face directory `out_dir` (config.json, model.safetensors,
// model.safetensors.index.json). Throws ConfigError for a model Hugging Face's Mixtral / Qwen2-MoE / Qwen3-MoE cannot
// express. The architecture follows from the flags: a (gated) shared expert is Qwen2-MoE's, --qk-layernorm
// Qwen3-MoE's, else Mixtral's.
std::string ampipe_to_hf(const std::string& ckpt_dir, const std::string& out_dir, const comm::Groups& groups);

}  // namespace ampipe::train
