// GEMM through oneDNN matmul. This file and gemm.cpp are the only ones that include dnnl.hpp (written against
// oneDNN 2.6; a port to 3.x touches only gemm.cpp).
//
//   C[m, n] = alpha * op(A)[m, k] * op(B)[k, n]   (+ C when accumulate)
//
// op(X) = X or X^T. Row-major storage with leading dimensions, so a block of rows or a head's columns inside
// a bigger [s, b, n*d] activation can be passed without copying. Inputs are fp32 or bf16 (A and B the same
// type); accumulation is always fp32 (AMX tdpbf16ps for bf16); C is fp32 or bf16.
//
// Primitives are created once per distinct descriptor and thread count, and cached in the compute context per
// calling thread (context.h; attention calls its block GEMMs from several threads), so a call only binds pointers.
#pragma once

#include <cstdint>
#include <string>

#include "ampipe/core/tensor.h"
#include "ampipe/kernels/context.h"

namespace ampipe::kernels {

enum class Trans : uint8_t { n, t };

struct GemmDesc {
  int64_t m = 0, n = 0, k = 0;
  Trans ta = Trans::n, tb = Trans::n;
  // Leading dimensions in elements: the row stride of A as stored ([m, k] if ta == n, [k, m] if ta == t),
  // likewise for B ([k, n] or [n, k]) and C ([m, n]). 0 means packed.
  int64_t lda = 0, ldb = 0, ldc = 0;
  DType in = DType::f32;   // type of A and B
  DType out = DType::f32;  // type of C
  float alpha = 1.0f;
  bool accumulate = false;  // C += ..., via a sum post-op
  // A batch of `batch` independent GEMMs of this shape in one call (Megatron's grouped GEMM of the local experts):
  // matrix i of A, B, C starts stride_a, stride_b, stride_c elements after matrix i-1's. oneDNN's batched matmul
  // spreads the whole batch over the threads at once.
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;

  bool operator==(const GemmDesc&) const = default;
};

// Raw form: pointers to the first element of each matrix.
void gemm(const GemmDesc& d, const void* a, const void* b, void* c, ComputeContext& ctx = ComputeContext::host());

// Tensor form: A, B, C are 2-D (use view() to flatten [s, b, h] to [s*b, h]) with unit column stride; each may
// be a strided view (rows() of a bigger matrix, cols() of a fused buffer): leading dimensions come from the
// tensors' row strides, dtypes from the tensors.
void gemm(const Tensor& a, Trans ta, const Tensor& b, Trans tb, Tensor& c, bool accumulate = false,
          float alpha = 1.0f, ComputeContext& ctx = ComputeContext::host());

// A batch of `batch` GEMMs of the shapes of a, b, c (matrix 0 of each); matrix i of A starts stride_a elements after
// matrix i-1's (likewise B, C), in the same storage: the caller's views must cover the whole batch.
void gemm_batched(const Tensor& a, Trans ta, const Tensor& b, Trans tb, Tensor& c, int64_t batch, int64_t stride_a,
                  int64_t stride_b, int64_t stride_c, bool accumulate = false,
                  ComputeContext& ctx = ComputeContext::host());

// Name of the oneDNN implementation chosen for a descriptor (e.g. "brg:avx512_core_amx_bf16").
std::string gemm_impl_name(const GemmDesc& d);


// A clock of the time spent inside gemm(), summed over the threads that call it (attention's block GEMMs run on
// several threads at once), for a benchmark's split of a step into GEMMs and everything else. Off by default (no
// clock is read); turning it on resets the sum.
void set_gemm_clock(bool on);
double gemm_clock_seconds();

}  // namespace ampipe::kernels
