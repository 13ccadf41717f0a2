// Which blocks of a model have experts: Megatron's --moe-layer-freq (an integer k: blocks 0, k, 2k, ... have
// experts; or a Python list expression of one 0/1 per block, "[1,0,1,0]", "([0]+[1]*23)", "[0]*3+[1]*5") and
// MindSpeed-LLM's --first-k-dense-replace K (the first K blocks dense).
#pragma once

#include <string>
#include <vector>

namespace ampipe::train {

// One flag per block (true: experts). Throws ConfigError naming the flag, the value and the rule (an expression
// that is not a list of 0/1 made of [...], * and +, a list whose length is not num_layers, K > num_layers).
std::vector<bool> moe_layer_pattern(const std::string& moe_layer_freq, int first_k_dense_replace, int num_layers);

}  // namespace ampipe::train
