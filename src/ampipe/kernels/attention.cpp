// Causal flash attention on CPU: block GEMMs through kernels::gemm, row-wise softmax work vectorised (AVX2).
//
// Per (batch bb, head hh) the operands are row-major matrices: Q_h = q + bb*ldq + hh*d with row stride b*ldq
// ([sq, d]), likewise K_h, V_h ([skv, d]), out_h, dq_h, dk_h, dv_h. K_h and V_h (the rows this chunk sees) are
// packed once per head, and each query block of Q_h (and dout) once per block, so every block GEMM reads
// contiguous operands; dk, dv of the head collect in packed fp32 and are added to dk_accum, dv_accum at the
// end. A query block is rows [i0, i0+bq) of Q_h, a key block rows [j0, j0+kb) of K_h / V_h.
#include "ampipe/kernels/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/kernels/checks.h"
#include "ampipe/kernels/dropout.h"
#include "ampipe/kernels/gemm.h"
#include "ampipe/core/parallel.h"
#include "ampipe/kernels/simd_math.h"

#ifdef AMPIPE_SIMD_AVX2
#define AMPIPE_ATTN_AVX2 1
#endif

namespace ampipe::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

#ifdef AMPIPE_ATTN_AVX2
using simd::exp8;  // masked entries are zeroed by the callers, never exponentiated

// Round 16 floats to bf16 (nearest even) and store them. Finite inputs only (P in [0, 1], dS finite for
// finite q, k, v, dout); unlike f32_to_bf16 a NaN is not preserved.
inline void store_bf16x16(bf16* dst, __m256 a, __m256 b) {
  auto round = [](__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  };
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(round(a), round(b)), 0xD8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), packed);
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
#endif

float row_max(const float* s, int64_t n) {
  float m = kNegInf;
  int64_t j = 0;
#ifdef AMPIPE_ATTN_AVX2
  if (n >= 8) {
    __m256 vm = _mm256_set1_ps(kNegInf);
    for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
    m = hmax8(vm);
  }
#endif
  for (; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

// p[j] = exp(s[j]*scale - sub) for j < nv, 0 for nv <= j < n. Written in place (fp32) or to pb (bf16, when
// non-null), times mask[j] when a dropout mask is given. Returns the fp32 sum of the unmasked p over j < nv.
float exp_row(float* s, int64_t nv, int64_t n, float scale, float sub, bf16* pb, const float* mask) {
  float sum = 0;
  int64_t j = 0;
#ifdef AMPIPE_ATTN_AVX2
  const __m256 vscale = _mm256_set1_ps(scale), vsub = _mm256_set1_ps(sub);
  __m256 vsum = _mm256_setzero_ps();
  auto masked = [mask](__m256 p, int64_t at) { return mask ? _mm256_mul_ps(p, _mm256_loadu_ps(mask + at)) : p; };
  if (pb) {
    for (; j + 16 <= nv; j += 16) {
      const __m256 a = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), vscale, vsub));
      const __m256 c = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(s + j + 8), vscale, vsub));
      vsum = _mm256_add_ps(vsum, _mm256_add_ps(a, c));
      store_bf16x16(pb + j, masked(a, j), masked(c, j + 8));
    }
  } else {
    for (; j + 8 <= nv; j += 8) {
      const __m256 a = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), vscale, vsub));
      vsum = _mm256_add_ps(vsum, a);
      _mm256_storeu_ps(s + j, masked(a, j));
    }
  }
  sum = hsum8(vsum);
#endif
  for (; j < nv; ++j) {
    const float p = std::exp(s[j] * scale - sub);
    sum += p;
    const float kept = mask ? p * mask[j] : p;
    if (pb)
      pb[j] = f32_to_bf16(kept);
    else
      s[j] = kept;
  }
  for (; j < n; ++j) {
    if (pb)
      pb[j] = bf16{0};
    else
      s[j] = 0.0f;
  }
  return sum;
}

// Backward row: p = exp(s*scale - lse) and ds = p * (dp - D) * scale for j < nv; 0 beyond. fp32 mode writes
// p over s and ds over dp; bf16 mode writes them to pb and dsb. With a dropout mask m (dp is then the gradient of
// the dropped p m): the stored p is p m (what dV needs) and ds = p * (dp m - D) * scale.
void grad_row(float* s, float* dp, int64_t nv, int64_t n, float scale, float lse, float D, bf16* pb, bf16* dsb,
              const float* mask) {
  int64_t j = 0;
#ifdef AMPIPE_ATTN_AVX2
  const __m256 vscale = _mm256_set1_ps(scale), vlse = _mm256_set1_ps(lse), vD = _mm256_set1_ps(D);
  auto masked = [mask](__m256 x, int64_t at) { return mask ? _mm256_mul_ps(x, _mm256_loadu_ps(mask + at)) : x; };
  if (pb) {
    for (; j + 16 <= nv; j += 16) {
      const __m256 p0 = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), vscale, vlse));
      const __m256 p1 = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(s + j + 8), vscale, vlse));
      const __m256 d0 =
          _mm256_mul_ps(_mm256_mul_ps(p0, _mm256_sub_ps(masked(_mm256_loadu_ps(dp + j), j), vD)), vscale);
      const __m256 d1 =
          _mm256_mul_ps(_mm256_mul_ps(p1, _mm256_sub_ps(masked(_mm256_loadu_ps(dp + j + 8), j + 8), vD)), vscale);
      store_bf16x16(pb + j, masked(p0, j), masked(p1, j + 8));
      store_bf16x16(dsb + j, d0, d1);
    }
  } else {
    for (; j + 8 <= nv; j += 8) {
      const __m256 p0 = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), vscale, vlse));
      const __m256 d0 =
          _mm256_mul_ps(_mm256_mul_ps(p0, _mm256_sub_ps(masked(_mm256_loadu_ps(dp + j), j), vD)), vscale);
      _mm256_storeu_ps(s + j, masked(p0, j));
      _mm256_storeu_ps(dp + j, d0);
    }
  }
#endif
  for (; j < nv; ++j) {
    const float p = std::exp(s[j] * scale - lse);
    const float ds = p * ((mask ? dp[j] * mask[j] : dp[j]) - D) * scale;
    const float kept = mask ? p * mask[j] : p;
    if (pb) {
      pb[j] = f32_to_bf16(kept);
      dsb[j] = f32_to_bf16(ds);
    } else {
      s[j] = kept;
      dp[j] = ds;
    }
  }
  for (; j < n; ++j) {
    if (pb) {
      pb[j] = bf16{0};
      dsb[j] = bf16{0};
    } else {
      s[j] = 0.0f;
      dp[j] = 0.0f;
    }
  }
}

void check_shape(const AttentionShape& sh) {
  AMPIPE_CHECK(sh.sq >= 0 && sh.skv >= 0 && sh.b > 0 && sh.n > 0 && sh.d > 0 && sh.q_offset >= 0 &&
                   sh.k_offset >= 0 && sh.k_offset <= sh.q_offset,
               "attention shape sq={} skv={} b={} n={} d={} q_offset={} k_offset={} (k_offset must be <= q_offset)",
               sh.sq, sh.skv, sh.b, sh.n, sh.d, sh.q_offset, sh.k_offset);
  AMPIPE_CHECK(sh.n_kv >= 0 && sh.kv_heads() <= sh.n && sh.n % sh.kv_heads() == 0,
               "attention: {} key/value heads do not divide {} query heads", sh.n_kv, sh.n);
  AMPIPE_CHECK(sh.sq == 0 || sh.skv > 0, "attention: {} query rows but no keys", sh.sq);
}

void check_args(const AttentionShape& sh, DType in, int64_t ldq, int64_t ldk, int64_t ldv,
                const AttentionBlocks& blocks) {
  const int64_t h = sh.n * sh.d, hkv = sh.kv_heads() * sh.d;
  check_shape(sh);
  AMPIPE_CHECK(ldq >= h && ldk >= hkv && ldv >= hkv, "attention row strides q {} k {} v {} below n*d = {}, g*d = {}",
               ldq, ldk, ldv, h, hkv);
  AMPIPE_CHECK(blocks.q > 0 && blocks.k > 0, "attention blocks q={} k={}", blocks.q, blocks.k);
  (void)in;
}

// Tensor-form operands: q, k, v (same dtype, [sq*b, h] and [skv*b, h]) and their row strides.
struct QkvArgs {
  DType in;
  int64_t ldq, ldk, ldv;
};
QkvArgs check_qkv(const AttentionShape& sh, const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  check_shape(sh);
  const int64_t h = sh.n * sh.d, hkv = sh.kv_heads() * sh.d;
  AMPIPE_CHECK(q.defined(), "{}: q is undefined", op);
  const DType in = q.dtype();
  return {in, detail::check_matrix(q, op, "q", in, sh.sq * sh.b, h),
          detail::check_matrix(k, op, "k (dtype of q)", in, sh.skv * sh.b, hkv),
          detail::check_matrix(v, op, "v (dtype of q)", in, sh.skv * sh.b, hkv)};
}

void check_lse(const AttentionShape& sh, const Tensor& lse, const char* op) {
  AMPIPE_CHECK(lse.defined() && lse.dtype() == DType::f32 && lse.is_contiguous() &&
                   lse.numel() == sh.b * sh.n * sh.sq,
               "{}: lse must be a contiguous f32 tensor of b*n*sq = {} elements, got {} {}{}", op,
               sh.b * sh.n * sh.sq, lse.defined() ? dtype_name(lse.dtype()) : "undefined", shape_str(lse.shape()),
               lse.defined() && !lse.is_contiguous() ? " (non-contiguous)" : "");
  AMPIPE_CHECK(lse.device() == Device::cpu, "{}: lse is on {}, this kernel runs on cpu", op,
               device_name(lse.device()));
}

// The kernels work with key positions relative to key row 0: only q_offset - k_offset matters.
AttentionShape relative(AttentionShape sh) {
  sh.q_offset -= sh.k_offset;
  sh.k_offset = 0;
  return sh;
}

// Last visible key + 1 for a query block ending (exclusive) at local row i_end.
int64_t kv_end_for(const AttentionShape& sh, int64_t i_end) { return std::min(sh.skv, sh.q_offset + i_end); }

// Visible keys of local row i within the key block [j0, j0 + kb).
int64_t visible_in_block(const AttentionShape& sh, int64_t i, int64_t j0, int64_t kb) {
  return std::clamp<int64_t>(sh.q_offset + i + 1 - j0, 0, kb);
}

// The dropout multipliers of local query row i (global position q_pos) against keys [j0, j0 + nv) of key block
// starting at global key position k_pos0 + j0, for batch bb and local head hh (AttentionDropout's rule); nullptr
// without dropout.
const float* dropout_row(const AttentionDropout& dr, int64_t b, int64_t bb, int64_t hh, int64_t q_pos, int64_t k_pos,
                         int64_t nv, float* buf) {
  if (dr.p == 0.0f || nv == 0) return nullptr;
  const uint64_t token = dr.token_base + uint64_t(q_pos * b + bb);
  dropout_mask(dr.key, token, uint64_t((dr.head0 + hh) * dr.seq + k_pos), nv, dr.p, buf);
  return buf;
}

// Scratch of one OpenMP thread, kept in the compute context (context.h), grown on demand and reused by every call.
struct Scratch {
  std::vector<float> s, dp, o, m, l, dd, dkp, dvp, mask;
  std::vector<bf16> pb, dsb;
  std::vector<std::byte> kp, vp, qp, dop;  // packed operands in the input dtype
};

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  return v.data();
}

// Copies `rows` rows of `cols` elements (esz bytes each) from a strided matrix (row stride ld elements) into a
// packed one. Packing each head's K and V once (and each Q / dO block) makes every block GEMM operand
// contiguous: with the fused-qkv stride (3h = 3072 fp32 = 12 KiB) the strided GEMMs run 10-50% slower.
void pack_rows(const void* src, int64_t ld, int64_t rows, int64_t cols, size_t esz, void* dst) {
  const auto* s = static_cast<const std::byte*>(src);
  auto* t = static_cast<std::byte*>(dst);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(t + size_t(r * cols) * esz, s + size_t(r * ld) * esz, size_t(cols) * esz);
}

// What the forward and the backward derive alike from the (relative) shape, the input dtype and the tile sizes. The
// backward recomputes the forward's probabilities block by block, so its tiles and scale must be the forward's.
struct Tiling {
  int64_t BQ, BK;      // query rows, key rows of a block
  int64_t kv_max;      // keys seen by any row of the chunk (rows beyond: no work, dK and dV unchanged)
  size_t esz;          // bytes of a q, k, v element
  bool lowp;           // bf16 inputs (P and dS rounded to bf16 for their GEMMs)
  float scale;         // 1 / sqrt(d)
  int64_t kvh, group;  // K, V heads; query heads per K, V head
};
// q, k, v as bytes (their rows are packed by byte size: the dtype is the caller's `in`).
std::array<const std::byte*, 3> operand_bytes(const void* q, const void* k, const void* v) {
  return {static_cast<const std::byte*>(q), static_cast<const std::byte*>(k), static_cast<const std::byte*>(v)};
}

Tiling tiling(const AttentionShape& sh, DType in, const AttentionBlocks& blocks) {
  const int64_t kvh = sh.kv_heads();
  return {std::min(blocks.q, sh.sq), std::min(blocks.k, sh.skv), kv_end_for(sh, sh.sq), dtype_size(in),
          in == DType::bf16, 1.0f / std::sqrt(float(sh.d)), kvh, sh.n / kvh};
}

}  // namespace

int64_t causal_attention_pairs(const AttentionShape& shape) {
  const AttentionShape sh = relative(shape);
  // rows with q_offset + i + 1 <= skv see q_offset + i + 1 keys; the rest see skv.
  const int64_t full_from = std::clamp<int64_t>(sh.skv - sh.q_offset, 0, sh.sq);  // first row seeing all skv
  int64_t pairs = 0;
  // sum_{i < full_from} (q_offset + i + 1)
  pairs += full_from * (sh.q_offset + 1) + full_from * (full_from - 1) / 2;
  pairs += (sh.sq - full_from) * sh.skv;
  return pairs;
}

double causal_attention_flops(const AttentionShape& sh, bool backward) {
  return double(causal_attention_pairs(sh)) * double(sh.b * sh.n) * double(sh.d) * (backward ? 10.0 : 4.0);
}

void attention_forward(const AttentionShape& shape, DType in, const void* q, int64_t ldq, const void* k,
                       int64_t ldk, const void* v, int64_t ldv, float* out, int64_t ldo, float* lse,
                       const AttentionBlocks& blocks, ComputeContext& ctx) {
  check_args(shape, in, ldq, ldk, ldv, blocks);
  const AttentionShape sh = relative(shape);
  AMPIPE_CHECK(ldo >= sh.n * sh.d, "attention out row stride {} below n*d = {}", ldo, sh.n * sh.d);
  const AttentionDropout& dr = shape.dropout;  // keyed by the global positions shape.q_offset + i, k_offset + j
  if (sh.sq == 0) return;
  const int64_t b = sh.b, n = sh.n, d = sh.d;
  const auto [BQ, BK, kv_max, esz, lowp, scale, kvh, group] = tiling(sh, in, blocks);

  const auto [qc, kc, vc] = operand_bytes(q, k, v);

  // One unit of work per (batch, K/V head): its K and V packed once, then its query heads in order. Units write
  // disjoint rows and columns of out and lse, so they run on any thread in any order with the same bits.
  parallel_for(b * kvh, 1, [&](int64_t u0, int64_t u1) {
    Scratch& sc = ctx.state<Scratch>();
    float* S = grow(sc.s, BQ * BK);  // [bq, kb] logits, then fp32 P
    float* O = grow(sc.o, BQ * d);   // [bq, d] unnormalised output
    float* M = grow(sc.m, BQ);       // running max of scaled logits
    float* L = grow(sc.l, BQ);       // running sum of exp
    bf16* Pb = lowp ? grow(sc.pb, BQ * BK) : nullptr;
    float* Mk = grow(sc.mask, BK);                           // one row's dropout multipliers
    std::byte* Kp = grow(sc.kp, kv_max * d * int64_t(esz));  // [kv_max, d] packed head of K
    std::byte* Vp = grow(sc.vp, kv_max * d * int64_t(esz));
    std::byte* Qp = grow(sc.qp, BQ * d * int64_t(esz));      // [bq, d] packed query block
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t bb = u / kvh, g = u % kvh;
      // [skv, b, g*d] -> [kv_max, d] for K, V head g of batch bb, once per group
      pack_rows(kc + size_t(bb * ldk + g * d) * esz, b * ldk, kv_max, d, esz, Kp);
      pack_rows(vc + size_t(bb * ldv + g * d) * esz, b * ldv, kv_max, d, esz, Vp);
      for (int64_t hh = g * group; hh < (g + 1) * group; ++hh) {
        const std::byte* Qh = qc + size_t(bb * ldq + hh * d) * esz;  // [sq, d], row stride b*ldq
        float* Oh = out + bb * ldo + hh * d;                          // [sq, d], row stride b*ldo
        float* lse_h = lse + (bb * n + hh) * sh.sq;                   // [sq]
        for (int64_t i0 = 0; i0 < sh.sq; i0 += BQ) {
          const int64_t bq = std::min(BQ, sh.sq - i0);
          const int64_t kv_end = kv_end_for(sh, i0 + bq);
          pack_rows(Qh + size_t(i0 * b * ldq) * esz, b * ldq, bq, d, esz, Qp);
          std::fill(M, M + bq, kNegInf);
          for (int64_t j0 = 0; j0 < kv_end; j0 += BK) {
            const int64_t kb = std::min(BK, kv_end - j0);
            // S [bq, kb] = Q_blk [bq, d] * K_blk^T [d, kb]
            GemmDesc qk;
            qk.m = bq, qk.n = kb, qk.k = d, qk.tb = Trans::t, qk.in = in;
            gemm(qk, Qp, Kp + size_t(j0 * d) * esz, S, ctx);
            // online softmax: P = exp(S*scale - m_new); O, L rescaled by exp(m_old - m_new)
            for (int64_t r = 0; r < bq; ++r) {
              float* srow = S + r * kb;
              bf16* prow = Pb ? Pb + r * kb : nullptr;
              const int64_t nv = visible_in_block(sh, i0 + r, j0, kb);
              if (nv == 0) {  // key block entirely after this row's diagonal (j0 > 0 here): P row = 0
                exp_row(srow, 0, kb, scale, 0.0f, prow, nullptr);
                continue;
              }
              const float m_old = M[r];
              const float m_new = std::max(m_old, row_max(srow, nv) * scale);
              const float* mask = dropout_row(dr, b, bb, hh, shape.q_offset + i0 + r, shape.k_offset + j0, nv, Mk);
              const float sum = exp_row(srow, nv, kb, scale, m_new, prow, mask);
              float* orow = O + r * d;
              if (j0 == 0) {  // key 0 is visible to every row, so every row starts here
                L[r] = sum;
              } else {
                const float alpha = std::exp(m_old - m_new);
                L[r] = L[r] * alpha + sum;
                if (alpha != 1.0f)
                  for (int64_t dd = 0; dd < d; ++dd) orow[dd] *= alpha;
              }
              M[r] = m_new;
            }
            // O [bq, d] (+)= P [bq, kb] * V_blk [kb, d]; the first key block overwrites O
            GemmDesc pv;
            pv.m = bq, pv.n = d, pv.k = kb, pv.in = in, pv.accumulate = j0 > 0;
            gemm(pv, lowp ? static_cast<const void*>(Pb) : S, Vp + size_t(j0 * d) * esz, O, ctx);
          }
          for (int64_t r = 0; r < bq; ++r) {
            const float* orow = O + r * d;
            float* dst = Oh + (i0 + r) * b * ldo;
            const float part = M[r] + std::log(L[r]);
            if (!sh.merge) {
              const float inv = 1.0f / L[r];
              for (int64_t dd = 0; dd < d; ++dd) dst[dd] = orow[dd] * inv;
              lse_h[i0 + r] = part;
              continue;
            }
            // merge with the previous keys' normalised output: shares e^(lse_old - lse) and e^(part - lse)
            const float old = lse_h[i0 + r], hi = std::max(old, part);
            const float total = hi + std::log(std::exp(old - hi) + std::exp(part - hi));
            const float w_old = std::exp(old - total), w_new = std::exp(part - total) / L[r];
            for (int64_t dd = 0; dd < d; ++dd) dst[dd] = dst[dd] * w_old + orow[dd] * w_new;
            lse_h[i0 + r] = total;
          }
        }
      }
    }
  });
}

void attention_backward(const AttentionShape& shape, DType in, const float* dout, int64_t lddo, const void* q,
                        int64_t ldq, const void* k, int64_t ldk, const void* v, int64_t ldv, const float* out,
                        int64_t ldo, const float* lse, float* dq, int64_t lddq, float* dk_accum, int64_t lddk,
                        float* dv_accum, int64_t lddv, const AttentionBlocks& blocks, ComputeContext& ctx) {
  check_args(shape, in, ldq, ldk, ldv, blocks);
  const AttentionShape sh = relative(shape);
  const AttentionDropout& dr = shape.dropout;  // the forward's mask, regenerated
  const int64_t b = sh.b, n = sh.n, d = sh.d, h = n * d, hkv = sh.kv_heads() * d;
  AMPIPE_CHECK(lddo >= h && ldo >= h && lddq >= h && lddk >= hkv && lddv >= hkv,
               "attention backward row strides dout {} out {} dq {} dk {} dv {} below n*d = {}, g*d = {}", lddo, ldo,
               lddq, lddk, lddv, h, hkv);
  if (sh.sq == 0) return;
  // The forward's tiles; the `group` query heads of a K, V head sum their dK, dV in dKp, dVp.
  const auto [BQ, BK, kv_max, esz, lowp, scale, kvh, group] = tiling(sh, in, blocks);

  const auto [qc, kc, vc] = operand_bytes(q, k, v);

  // One unit of work per (batch, K/V head), as in the forward: its query heads in order, then its dK, dV added to
  // its own columns of dk_accum, dv_accum. Units touch disjoint outputs: the same bits on any thread.
  parallel_for(b * kvh, 1, [&](int64_t u0, int64_t u1) {
    Scratch& sc = ctx.state<Scratch>();
    float* S = grow(sc.s, BQ * BK);    // [bq, kb] logits, then fp32 P
    float* dP = grow(sc.dp, BQ * BK);  // [bq, kb] dO V^T, then fp32 dS * scale
    float* Dr = grow(sc.dd, BQ);       // rowsum(dout * out)
    float* dQp = grow(sc.o, BQ * d);   // [bq, d] dq of the block
    float* dKp = grow(sc.dkp, kv_max * d);  // [kv_max, d] this chunk's dk of the head, packed
    float* dVp = grow(sc.dvp, kv_max * d);
    bf16* Pb = lowp ? grow(sc.pb, BQ * BK) : nullptr;
    bf16* dSb = lowp ? grow(sc.dsb, BQ * BK) : nullptr;
    float* Mk = grow(sc.mask, BK);
    std::byte* Kp = grow(sc.kp, kv_max * d * int64_t(esz));
    std::byte* Vp = grow(sc.vp, kv_max * d * int64_t(esz));
    std::byte* Qp = grow(sc.qp, BQ * d * int64_t(esz));
    std::byte* dOp = grow(sc.dop, BQ * d * int64_t(esz));  // [bq, d] dout block in the input dtype
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t bb = u / kvh, g = u % kvh;
      pack_rows(kc + size_t(bb * ldk + g * d) * esz, b * ldk, kv_max, d, esz, Kp);
      pack_rows(vc + size_t(bb * ldv + g * d) * esz, b * ldv, kv_max, d, esz, Vp);
      std::fill(dKp, dKp + kv_max * d, 0.0f);
      std::fill(dVp, dVp + kv_max * d, 0.0f);
      for (int64_t hh = g * group; hh < (g + 1) * group; ++hh) {
        const std::byte* Qh = qc + size_t(bb * ldq + hh * d) * esz;  // [sq, d], row stride b*ldq
        const float* dout_h = dout + bb * lddo + hh * d;
        const float* out_h = out + bb * ldo + hh * d;
        float* dQh = dq + bb * lddq + hh * d;
        const float* lse_h = lse + (bb * n + hh) * sh.sq;
        for (int64_t i0 = 0; i0 < sh.sq; i0 += BQ) {
          const int64_t bq = std::min(BQ, sh.sq - i0);
          const int64_t kv_end = kv_end_for(sh, i0 + bq);
          pack_rows(Qh + size_t(i0 * b * ldq) * esz, b * ldq, bq, d, esz, Qp);
          for (int64_t r = 0; r < bq; ++r) {
            const float* a = dout_h + (i0 + r) * b * lddo;
            const float* o = out_h + (i0 + r) * b * ldo;
            float acc = 0;  // D_i = rowsum(dout_i * out_i), fp32 from the fp32 dout
            for (int64_t dd = 0; dd < d; ++dd) acc += a[dd] * o[dd];
            Dr[r] = acc;
            if (lowp)
              for (int64_t dd = 0; dd < d; ++dd) reinterpret_cast<bf16*>(dOp)[r * d + dd] = f32_to_bf16(a[dd]);
            else
              std::memcpy(dOp + size_t(r * d) * esz, a, size_t(d) * esz);
          }
          for (int64_t j0 = 0; j0 < kv_end; j0 += BK) {
            const int64_t kb = std::min(BK, kv_end - j0);
            const std::byte* Kblk = Kp + size_t(j0 * d) * esz;
            const std::byte* Vblk = Vp + size_t(j0 * d) * esz;
            // S = Q_blk K_blk^T, dP = dO_blk V_blk^T: [bq, kb]
            GemmDesc g;
            g.m = bq, g.n = kb, g.k = d, g.tb = Trans::t, g.in = in;
            gemm(g, Qp, Kblk, S, ctx);
            gemm(g, dOp, Vblk, dP, ctx);
            for (int64_t r = 0; r < bq; ++r) {
              const int64_t nv = visible_in_block(sh, i0 + r, j0, kb);
              const float* mask = dropout_row(dr, b, bb, hh, shape.q_offset + i0 + r, shape.k_offset + j0, nv, Mk);
              grad_row(S + r * kb, dP + r * kb, nv, kb, scale, lse_h[i0 + r], Dr[r], Pb ? Pb + r * kb : nullptr,
                       dSb ? dSb + r * kb : nullptr, mask);
            }
            const void* P = lowp ? static_cast<const void*>(Pb) : S;
            const void* dS = lowp ? static_cast<const void*>(dSb) : dP;  // already times scale
            // dV_blk [kb, d] += P^T [kb, bq] * dO_blk [bq, d];  dK_blk [kb, d] += dS^T [kb, bq] * Q_blk [bq, d]
            GemmDesc t;
            t.m = kb, t.n = d, t.k = bq, t.ta = Trans::t, t.in = in, t.accumulate = true;
            gemm(t, P, dOp, dVp + j0 * d, ctx);
            gemm(t, dS, Qp, dKp + j0 * d, ctx);
            // dQ_blk [bq, d] (+)= dS [bq, kb] * K_blk [kb, d]; the first key block overwrites
            GemmDesc dqd;
            dqd.m = bq, dqd.n = d, dqd.k = kb, dqd.in = in, dqd.accumulate = j0 > 0;
            gemm(dqd, dS, Kblk, dQp, ctx);
          }
          for (int64_t r = 0; r < bq; ++r) {  // dq overwritten, or accumulated over key blocks
            float* dst = dQh + (i0 + r) * b * lddq;
            if (sh.accumulate_dq)
              for (int64_t dd = 0; dd < d; ++dd) dst[dd] += dQp[r * d + dd];
            else
              std::memcpy(dst, dQp + r * d, size_t(d) * sizeof(float));
          }
        }
      }
      // dk_accum, dv_accum [skv, b, g*d] += packed [kv_max, d] of K, V head g, after its group's last query head
      for (int64_t j = 0; j < kv_max; ++j) {
        float* dk_row = dk_accum + (j * b + bb) * lddk + g * d;
        float* dv_row = dv_accum + (j * b + bb) * lddv + g * d;
        for (int64_t dd = 0; dd < d; ++dd) {
          dk_row[dd] += dKp[j * d + dd];
          dv_row[dd] += dVp[j * d + dd];
        }
      }
    }
  });
}

void attention_forward(const AttentionShape& sh, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& lse, const AttentionBlocks& blocks, ComputeContext& ctx) {
  constexpr const char* op = "attention_forward";
  const QkvArgs a = check_qkv(sh, q, k, v, op);
  const int64_t ldo = detail::check_matrix(out, op, "out", DType::f32, sh.sq * sh.b, sh.n * sh.d);
  check_lse(sh, lse, op);
  attention_forward(sh, a.in, q.raw(), a.ldq, k.raw(), a.ldk, v.raw(), a.ldv, out.data<float>(), ldo,
                    lse.data<float>(), blocks, ctx);
}

void attention_backward(const AttentionShape& sh, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk_accum,
                        Tensor& dv_accum, const AttentionBlocks& blocks, ComputeContext& ctx) {
  constexpr const char* op = "attention_backward";
  const QkvArgs a = check_qkv(sh, q, k, v, op);
  const int64_t h = sh.n * sh.d, hkv = sh.kv_heads() * sh.d, qrows = sh.sq * sh.b, kvrows = sh.skv * sh.b;
  const int64_t lddo = detail::check_matrix(dout, op, "dout", DType::f32, qrows, h);
  const int64_t ldo = detail::check_matrix(out, op, "out", DType::f32, qrows, h);
  const int64_t lddq = detail::check_matrix(dq, op, "dq", DType::f32, qrows, h);
  const int64_t lddk = detail::check_matrix(dk_accum, op, "dk_accum", DType::f32, kvrows, hkv);
  const int64_t lddv = detail::check_matrix(dv_accum, op, "dv_accum", DType::f32, kvrows, hkv);
  check_lse(sh, lse, op);
  attention_backward(sh, a.in, dout.data<float>(), lddo, q.raw(), a.ldq, k.raw(), a.ldk, v.raw(), a.ldv,
                     out.data<float>(), ldo, lse.data<float>(), dq.data<float>(), lddq, dk_accum.data<float>(),
                     lddk, dv_accum.data<float>(), lddv, blocks, ctx);
}

}  // namespace ampipe::kernels
