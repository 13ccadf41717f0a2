// Row softmax, fp32, and top-k selection over a small number of columns (the MoE router's E experts).
//
// Notation: rows = tokens, E = experts (or any column count), k = experts per token.
// Float tensors are fp32, contiguous and 2-D [rows, cols] (use Tensor::view to flatten).
#pragma once

#include <cstdint>
#include <span>

#include "ampipe/core/tensor.h"

namespace ampipe::kernels {

// y[r, j] = exp(x[r, j] - max_j x[r, :]) / sum_j exp(x[r, j] - max_j x[r, :]). y: [rows, cols], overwritten;
// may alias x.
void softmax_forward(const Tensor& x, Tensor& y);
// dx[r, j] = y[r, j] * (dy[r, j] - sum_i dy[r, i] * y[r, i]), y is the forward's output. dx: overwritten; may
// alias dy.
void softmax_backward(const Tensor& dy, const Tensor& y, Tensor& dx);

// Top-k per row of probs [rows, E] (1 <= k <= E). For each row, writes the k selected column indices to
// idx[r * k + i] (int32, [rows, k] row-major, overwritten) and their values to val [rows, k] (overwritten).
// Order and ties (this decides routing, so it must be reproducible bit for bit):
//   - slot i holds the i-th largest value; among equal values the lower column index comes first.
//     Equivalently: columns are sorted by (value descending, index ascending) and the first k are taken.
//   - Equality is fp32 ==, so +0 and -0 tie. probs must not contain NaN (checked). O(k^2 E) per row (k is small).
void topk_rows(const Tensor& probs, int k, std::span<int32_t> idx, Tensor& val);

// One row, raw pointers: what the Tensor forms above run per row, and what the router (model/gate.cpp) runs on its
// logits, group scores and masked rows, so that both round and break ties alike.
//   softmax_row: row[0, n) replaced by its softmax (the arithmetic of softmax_forward).
//   softmax_backward_row: dx = y * (dy - sum_i dy_i y_i) over n columns; dx may alias dy.
//   topk_row: the k largest of row[0, n), largest first, ties to the lower index (topk_rows' order); no NaN check.
void softmax_row(float* row, int64_t n);
void softmax_backward_row(const float* y, const float* dy, float* dx, int64_t n);
void topk_row(const float* row, int64_t n, int64_t k, int32_t* idx);

}  // namespace ampipe::kernels
