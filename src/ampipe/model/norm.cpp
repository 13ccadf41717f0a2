#include "ampipe/model/norm.h"

#include "ampipe/kernels/layernorm.h"
#include "ampipe/kernels/rmsnorm.h"

namespace ampipe::model {

void norm_forward(const LayerConfig& cfg, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                  Tensor& mean, Tensor& rstd) {
  if (cfg.rmsnorm()) return kernels::rmsnorm_forward(x, weight, cfg.layernorm_epsilon, y, rstd);
  kernels::layernorm_forward(x, weight, bias, cfg.layernorm_epsilon, y, mean, rstd);
}

void norm_backward(const LayerConfig& cfg, const Tensor& dy, const Tensor& x, const Tensor& weight,
                   const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight_accum, Tensor& dbias_accum,
                   bool accumulate_dx) {
  if (cfg.rmsnorm()) return kernels::rmsnorm_backward(dy, x, weight, rstd, dx, dweight_accum, accumulate_dx);
  kernels::layernorm_backward(dy, x, weight, mean, rstd, dx, dweight_accum, dbias_accum, accumulate_dx);
}

}  // namespace ampipe::model
