// The block's normalisation (LayerConfig::normalization, --normalization): LayerNorm (kernels/layernorm.h, weight
// and bias) or RMSNorm (kernels/rmsnorm.h, weight only: `bias` and `dbias` are undefined and `mean` is not used).
// The one place that chooses between them: LN1, LN2 (model/attention_block.cpp) and the final norm
// (train/gpt_model.cpp) call these.
#pragma once

#include "ampipe/core/tensor.h"
#include "ampipe/model/layer_config.h"

namespace ampipe::model {

void norm_forward(const LayerConfig& cfg, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                  Tensor& mean, Tensor& rstd);
void norm_backward(const LayerConfig& cfg, const Tensor& dy, const Tensor& x, const Tensor& weight,
                   const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight_accum, Tensor& dbias_accum,
                   bool accumulate_dx);

}  // namespace ampipe::model
