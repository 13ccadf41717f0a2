// Dispatch and combine in index form. Notation and rules: dispatch.h.
#include "ampipe/kernels/dispatch.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/core/parallel.h"

namespace ampipe::kernels {

namespace {

void check_rows(const Tensor& t, int64_t S, int64_t h, const char* what) {
  AMPIPE_CHECK(t.dim() == 2 && t.size(0) == S && t.size(1) == h && t.strides()[1] == 1,
               "{} {} must be [S={}, h={}] with unit column stride", what, shape_str(t.shape()), S, h);
}

void check_ech(const Tensor& t, const Routing& r, int64_t h, const char* what) {
  AMPIPE_CHECK(t.is_contiguous() && t.shape() == Shape({r.E, r.C, h}), "{} {} must be contiguous [E={}, C={}, h={}]",
               what, shape_str(t.shape()), r.E, r.C, h);
}

void check_routing(const Routing& r) {
  AMPIPE_CHECK(r.expert != nullptr && r.slot != nullptr && r.weight != nullptr && r.slot_token != nullptr,
               "routing not assigned (S={}, E={}, k={}, C={})", r.S, r.E, r.k, r.C);
}

// Row `i` of a 2-D tensor with unit column stride, as float (fp32 only) or raw.
template <typename T> T* row_ptr(Tensor& t, int64_t i) { return t.data<T>() + i * t.strides()[0]; }
template <typename T> const T* row_ptr(const Tensor& t, int64_t i) { return t.data<T>() + i * t.strides()[0]; }

}  // namespace

void dispatch_forward(const Tensor& x, const Routing& r, Tensor& out) {
  check_routing(r);
  const int64_t h = x.size(1);
  check_rows(x, r.S, h, "dispatch input x");
  check_ech(out, r, h, "dispatch output");
  Tensor out2 = out.view({r.E * r.C, h});  // [E, C, h] -> [E*C, h]
  parallel_for(r.E * r.C, rows_grain(h), [&](int64_t ec0, int64_t ec1) {
    for (int64_t ec = ec0; ec < ec1; ++ec) {
      const int32_t t = r.slot_token[ec];
      if (out.dtype() == DType::f32) {
        float* o = row_ptr<float>(out2, ec);
        if (t < 0) {
          std::memset(o, 0, size_t(h) * sizeof(float));
        } else if (x.dtype() == DType::f32) {
          std::memcpy(o, row_ptr<float>(x, t), size_t(h) * sizeof(float));
        } else {
          const bf16* s = row_ptr<bf16>(x, t);
          for (int64_t j = 0; j < h; ++j) o[j] = bf16_to_f32(s[j]);
        }
      } else {
        bf16* o = row_ptr<bf16>(out2, ec);
        if (t < 0) {
          std::fill(o, o + h, bf16{});
        } else if (x.dtype() == DType::bf16) {
          std::memcpy(o, row_ptr<bf16>(x, t), size_t(h) * sizeof(bf16));
        } else {
          const float* s = row_ptr<float>(x, t);
          for (int64_t j = 0; j < h; ++j) o[j] = f32_to_bf16(s[j]);
        }
      }
    }
  });
}

void dispatch_backward(const Tensor& d_out, const Routing& r, Tensor& dx_accum) {
  check_routing(r);
  const int64_t h = dx_accum.size(1);
  AMPIPE_CHECK(d_out.dtype() == DType::f32 && dx_accum.dtype() == DType::f32, "dispatch_backward needs fp32");
  check_rows(dx_accum, r.S, h, "dispatch dx_accum");
  check_ech(d_out, r, h, "dispatch d_out");
  const float* g = d_out.data<float>();
  // Token by token (tokens spread over the threads), each adding its slots in ascending slot order (expert, then
  // capacity row): the sums of a serial pass over the slots, at any thread count.
  parallel_for(r.S, rows_grain(r.k * h), [&](int64_t t0, int64_t t1) {
    std::vector<int64_t> ecs;
    for (int64_t t = t0; t < t1; ++t) {
      ecs.clear();
      for (int64_t i = 0; i < r.k; ++i) {
        const int32_t s = r.slot[t * r.k + i];
        if (s >= 0) ecs.push_back(int64_t(r.expert[t * r.k + i]) * r.C + s);
      }
      std::sort(ecs.begin(), ecs.end());
      float* dx = row_ptr<float>(dx_accum, t);
      for (const int64_t ec : ecs) {
        const float* src = g + ec * h;
        for (int64_t j = 0; j < h; ++j) dx[j] += src[j];
      }
    }
  });
}

void combine_forward(const Tensor& y, const Routing& r, Tensor& out) {
  check_routing(r);
  const int64_t h = out.size(1);
  AMPIPE_CHECK(y.dtype() == DType::f32, "combine input y must be fp32");
  check_ech(y, r, h, "combine input y");
  check_rows(out, r.S, h, "combine output");
  const float* Y = y.data<float>();
  parallel_for(r.S, rows_grain(r.k * h), [&](int64_t t0, int64_t t1) {
    std::vector<float> acc_buf;  // only for a bf16 output
    if (out.dtype() == DType::bf16) acc_buf.resize(size_t(h));
    for (int64_t t = t0; t < t1; ++t) {
      float* acc = out.dtype() == DType::f32 ? row_ptr<float>(out, t) : acc_buf.data();
      std::memset(acc, 0, size_t(h) * sizeof(float));
      for (int64_t i = 0; i < r.k; ++i) {
        const int32_t s = r.slot[t * r.k + i];
        if (s < 0) continue;
        const float w = r.weight[t * r.k + i];
        const float* src = Y + (int64_t(r.expert[t * r.k + i]) * r.C + s) * h;
        for (int64_t j = 0; j < h; ++j) acc[j] += w * src[j];
      }
      if (out.dtype() == DType::bf16) {
        bf16* o = row_ptr<bf16>(out, t);
        for (int64_t j = 0; j < h; ++j) o[j] = f32_to_bf16(acc[j]);
      }
    }
  });
}

void combine_backward(const Tensor& d_out, const Tensor& y, const Routing& r, Tensor& dy, Tensor& d_weight) {
  check_routing(r);
  const int64_t h = d_out.size(1);
  AMPIPE_CHECK(d_out.dtype() == DType::f32 && y.dtype() == DType::f32 && dy.dtype() == DType::f32 &&
                   d_weight.dtype() == DType::f32,
               "combine_backward needs fp32");
  check_rows(d_out, r.S, h, "combine d_out");
  check_ech(y, r, h, "combine y");
  check_ech(dy, r, h, "combine dy");
  AMPIPE_CHECK(d_weight.is_contiguous() && d_weight.numel() == r.S * r.k, "d_weight {} vs [S={}, k={}]",
               shape_str(d_weight.shape()), r.S, r.k);
  const float* Y = y.data<float>();
  float* dY = dy.data<float>();
  float* dw = d_weight.data<float>();
  // Empty slots get zero; every filled slot is written exactly once below.
  parallel_for(r.E * r.C, rows_grain(h), [&](int64_t ec0, int64_t ec1) {
    for (int64_t ec = ec0; ec < ec1; ++ec)
      if (r.slot_token[ec] < 0) std::memset(dY + ec * h, 0, size_t(h) * sizeof(float));
  });
  parallel_for(r.S, rows_grain(2 * r.k * h), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* g = row_ptr<float>(d_out, t);
      for (int64_t i = 0; i < r.k; ++i) {
        const int64_t ci = t * r.k + i;
        const int32_t s = r.slot[ci];
        if (s < 0) {
          dw[ci] = 0.0f;
          continue;
        }
        const float w = r.weight[ci];
        const int64_t off = (int64_t(r.expert[ci]) * r.C + s) * h;
        float dot = 0.0f;
        for (int64_t j = 0; j < h; ++j) {
          dY[off + j] = w * g[j];
          dot += g[j] * Y[off + j];
        }
        dw[ci] = dot;
      }
    }
  });
}

void copy_row_blocks(const Tensor& src, Tensor& dst, const std::vector<RowBlock>& blocks) {
  AMPIPE_CHECK(src.dim() == 2 && dst.dim() == 2 && src.size(1) == dst.size(1), "copy_row_blocks {} into {}",
               shape_str(src.shape()), shape_str(dst.shape()));
  for (const RowBlock& b : blocks)
    AMPIPE_CHECK(b.rows >= 0 && b.src_row >= 0 && b.dst_row >= 0 && b.src_row + b.rows <= src.size(0) &&
                     b.dst_row + b.rows <= dst.size(0),
                 "row block [{}, +{}) -> [{}, +{}) outside {} / {}", b.src_row, b.rows, b.dst_row, b.rows,
                 shape_str(src.shape()), shape_str(dst.shape()));
  parallel_for(int64_t(blocks.size()), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      const RowBlock& b = blocks[size_t(i)];
      Tensor d = dst.rows(b.dst_row, b.dst_row + b.rows);
      d.copy_from(src.rows(b.src_row, b.src_row + b.rows));
    }
  });
}

}  // namespace ampipe::kernels
