// `ampipe convert --load-dir DIR --save-dir OUT` (Megatron's tools/checkpoint/convert.py spelling): a Hugging Face
// Mixtral, Qwen2-MoE or Qwen3-MoE directory (config.json + safetensors) into an ampipe train checkpoint (for
// `ampipe train --load OUT --use-checkpoint-args` or `--finetune`), or an ampipe checkpoint back into a Hugging Face
// directory. The direction follows from what --load-dir holds (config.json: Hugging Face). One rank. The mapping and
// its rules are train/hf_checkpoint.h's; docs/training.md, "Converting Hugging Face checkpoints".
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace ampipe::cli {

struct ConvertArgs {
  std::string load_dir, save_dir;
  int64_t seq_length = 0;  // HF -> ampipe: the checkpoint's --seq-length (0: min(max_position_embeddings, 4096))
  int64_t make_vocab_size_divisible_by = 128;
  void add_to(CLI::App& app);  // the flags of flag_registry.cpp for convert
};

int run_convert(ConvertArgs& args);

}  // namespace ampipe::cli
