// Causal flash attention (kernels/attention) against a plain-loop double reference.
//
// Notation: s sequence, b micro-batch, n heads, d head dim, h = n*d; a query chunk has sq rows starting at
// q_offset and sees the full skv = s keys. Activations are [s, b, h]; q, k, v are read from one fused qkv
// buffer [s*b, 3h] (row stride 3h), as the attention stage passes them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ampipe/core/dtype.h"
#include "ampipe/core/philox.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/kernels/dropout.h"

using namespace ampipe;
using namespace ampipe::kernels;

namespace {

using Vec = std::vector<double>;

// ---- double reference (packed [rows, b, h] operands) ------------------------------------------------------
// The attention-probability dropout's multiplier of (batch bb, local head hh, query position i, key position j),
// element by element from core::philox_uniform (the rule of kernels::AttentionDropout, written out again here);
// 1 without dropout.
double drop_mult(const AttentionDropout* dr, int64_t b, int64_t bb, int64_t hh, int64_t i, int64_t j) {
  if (dr == nullptr || dr->p == 0.0f) return 1.0;
  const float u = core::philox_uniform(dr->key, dr->token_base + uint64_t(i * b + bb), uint64_t((dr->head0 + hh) * dr->seq + j));
  return u >= dr->p ? double(1.0f / (1.0f - dr->p)) : 0.0;
}

struct Ref {
  Vec out;  // [sq, b, h]
  Vec lse;  // [b, n, sq]
};

// q: [sq, b, h], k, v: [skv, b, h].
Ref ref_forward(const AttentionShape& sh, const Vec& q, const Vec& k, const Vec& v,
                const AttentionDropout* dr = nullptr) {
  const int64_t b = sh.b, n = sh.n, d = sh.d, h = n * d;
  const double scale = 1.0 / std::sqrt(double(d));
  Ref r{Vec(size_t(sh.sq * b * h)), Vec(size_t(b * n * sh.sq))};
  Vec logit(size_t(sh.skv));
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t hh = 0; hh < n; ++hh)
      for (int64_t i = 0; i < sh.sq; ++i) {
        const int64_t nk = std::min(sh.skv, sh.q_offset + i + 1);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < nk; ++j) {
          double acc = 0;
          for (int64_t dd = 0; dd < d; ++dd)
            acc += q[size_t((i * b + bb) * h + hh * d + dd)] * k[size_t((j * b + bb) * h + hh * d + dd)];
          logit[size_t(j)] = acc * scale;
          mx = std::max(mx, logit[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < nk; ++j) sum += std::exp(logit[size_t(j)] - mx);
        for (int64_t dd = 0; dd < d; ++dd) {
          double acc = 0;
          for (int64_t j = 0; j < nk; ++j)
            acc += std::exp(logit[size_t(j)] - mx) / sum * drop_mult(dr, b, bb, hh, sh.q_offset + i, j) *
                   v[size_t((j * b + bb) * h + hh * d + dd)];
          r.out[size_t((i * b + bb) * h + hh * d + dd)] = acc;
        }
        r.lse[size_t((bb * n + hh) * sh.sq + i)] = mx + std::log(sum);
      }
  return r;
}

struct RefGrad {
  Vec dq, dk, dv;  // [sq, b, h], [skv, b, h], [skv, b, h]
};

// Textbook softmax-attention backward (not the flash form): P = softmax(S), dV = P^T dO, dP = dO V^T,
// dS = P * (dP - rowsum(P * dP)), dQ = dS K * scale, dK = dS^T Q * scale.
// With dropout (multiplier m_ij): out = (P * m) V, so dV = (P * m)^T dO and the gradient of P is (dO V^T) * m.
RefGrad ref_backward(const AttentionShape& sh, const Vec& q, const Vec& k, const Vec& v, const Vec& dout,
                     const AttentionDropout* dr = nullptr) {
  const int64_t b = sh.b, n = sh.n, d = sh.d, h = n * d;
  const double scale = 1.0 / std::sqrt(double(d));
  RefGrad g{Vec(q.size()), Vec(k.size()), Vec(v.size())};
  Vec p(size_t(sh.skv)), dp(size_t(sh.skv));
  auto at = [&](int64_t row, int64_t hh, int64_t dd, int64_t bb) { return size_t((row * b + bb) * h + hh * d + dd); };
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t hh = 0; hh < n; ++hh)
      for (int64_t i = 0; i < sh.sq; ++i) {
        const int64_t nk = std::min(sh.skv, sh.q_offset + i + 1);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < nk; ++j) {
          double acc = 0;
          for (int64_t dd = 0; dd < d; ++dd) acc += q[at(i, hh, dd, bb)] * k[at(j, hh, dd, bb)];
          p[size_t(j)] = acc * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < nk; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
        double pdp = 0;
        for (int64_t j = 0; j < nk; ++j) {
          p[size_t(j)] /= sum;
          double acc = 0;
          for (int64_t dd = 0; dd < d; ++dd) acc += dout[at(i, hh, dd, bb)] * v[at(j, hh, dd, bb)];
          dp[size_t(j)] = acc * drop_mult(dr, b, bb, hh, sh.q_offset + i, j);
          pdp += p[size_t(j)] * dp[size_t(j)];
        }
        for (int64_t j = 0; j < nk; ++j) {
          const double ds = p[size_t(j)] * (dp[size_t(j)] - pdp);
          for (int64_t dd = 0; dd < d; ++dd) {
            g.dv[at(j, hh, dd, bb)] += p[size_t(j)] * drop_mult(dr, b, bb, hh, sh.q_offset + i, j) * dout[at(i, hh, dd, bb)];
            g.dq[at(i, hh, dd, bb)] += ds * k[at(j, hh, dd, bb)] * scale;
            g.dk[at(j, hh, dd, bb)] += ds * q[at(i, hh, dd, bb)] * scale;
          }
        }
      }
  return g;
}

// ---- helpers -----------------------------------------------------------------------------------------------
Vec randn(size_t count, std::mt19937& rng) {
  std::normal_distribution<double> nd(0, 1);
  Vec x(count);
  for (double& e : x) e = nd(rng);
  return x;
}

// A whole-sequence problem: fused qkv [s*b, 3h] in fp32 and bf16, dout [s*b, h].
struct Problem {
  int64_t s, b, n, d, h;
  std::vector<float> qkv;  // fp32 values (already bf16-representable when bf16 is set)
  std::vector<bf16> qkv_bf16;
  std::vector<float> dout;
  Vec q, k, v;  // packed [s, b, h] doubles of the same values
  Vec dout_d;

  Problem(int64_t s_, int64_t b_, int64_t n_, int64_t d_, uint32_t seed, bool round_bf16 = false)
      : s(s_), b(b_), n(n_), d(d_), h(n_ * d_) {
    std::mt19937 rng(seed);
    const Vec x = randn(size_t(s * b * 3 * h), rng);
    const Vec g = randn(size_t(s * b * h), rng);
    qkv.resize(x.size());
    qkv_bf16.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      qkv_bf16[i] = f32_to_bf16(float(x[i]));
      qkv[i] = round_bf16 ? bf16_to_f32(qkv_bf16[i]) : float(x[i]);
    }
    dout.assign(g.begin(), g.end());
    q.resize(size_t(s * b * h)), k.resize(q.size()), v.resize(q.size());
    for (int64_t r = 0; r < s * b; ++r)
      for (int64_t c = 0; c < h; ++c) {
        q[size_t(r * h + c)] = qkv[size_t(r * 3 * h + c)];
        k[size_t(r * h + c)] = qkv[size_t(r * 3 * h + h + c)];
        v[size_t(r * h + c)] = qkv[size_t(r * 3 * h + 2 * h + c)];
      }
    dout_d.assign(dout.begin(), dout.end());
  }
  AttentionShape chunk(int64_t q_offset, int64_t sq) const { return {sq, s, b, n, d, q_offset}; }
  const void* qkv_ptr(DType in, int64_t row, int64_t col) const {
    const size_t off = size_t(row * b * 3 * h + col);
    return in == DType::f32 ? static_cast<const void*>(qkv.data() + off) : qkv_bf16.data() + off;
  }
  // Rows [q_offset, q_offset + sq) of a packed [s, b, h] double.
  Vec rows(const Vec& x, int64_t q_offset, int64_t sq) const {
    return Vec(x.begin() + q_offset * b * h, x.begin() + (q_offset + sq) * b * h);
  }
};

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

// Runs forward and backward of one chunk through the kernel. dk, dv start from `dkv0` (to check +=); dq
// starts as NaN (to check it is overwritten). out uses a padded row stride (h + 3) to exercise ldo.
Result run_chunk(const Problem& pb, DType in, int64_t q_offset, int64_t sq, const AttentionBlocks& blocks,
                 const std::vector<float>& dk0, const std::vector<float>& dv0, const AttentionDropout& drop = {}) {
  const int64_t h = pb.h, ld = 3 * h, ldo = h + 3;
  AttentionShape sh = pb.chunk(q_offset, sq);
  sh.dropout = drop;
  Result r;
  std::vector<float> out_padded(size_t(sq * pb.b * ldo), -1.0f);
  r.lse.assign(size_t(pb.b * pb.n * sq), 0.0f);
  attention_forward(sh, in, pb.qkv_ptr(in, q_offset, 0), ld, pb.qkv_ptr(in, 0, h), ld, pb.qkv_ptr(in, 0, 2 * h),
                    ld, out_padded.data(), ldo, r.lse.data(), blocks);
  r.out.resize(size_t(sq * pb.b * h));
  for (int64_t row = 0; row < sq * pb.b; ++row)
    for (int64_t c = 0; c < h; ++c) r.out[size_t(row * h + c)] = out_padded[size_t(row * ldo + c)];
  r.dq.assign(size_t(sq * pb.b * h), std::numeric_limits<float>::quiet_NaN());
  r.dk = dk0;
  r.dv = dv0;
  attention_backward(sh, in, pb.dout.data() + q_offset * pb.b * h, h, pb.qkv_ptr(in, q_offset, 0), ld,
                     pb.qkv_ptr(in, 0, h), ld, pb.qkv_ptr(in, 0, 2 * h), ld, out_padded.data(), ldo, r.lse.data(),
                     r.dq.data(), h, r.dk.data(), h, r.dv.data(), h, blocks);
  return r;
}

// max |got - (base + ref)| / max(1, max |ref|): error relative to the tensor's scale, so tiny entries that
// result from cancellation do not dominate.
double scaled_err(const std::vector<float>& got, const Vec& ref, const std::vector<float>* base = nullptr) {
  EXPECT_EQ(got.size(), ref.size());
  double err = 0, mag = 1;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double want = ref[i] + (base ? (*base)[i] : 0.0);
    err = std::max(err, std::isnan(got[i]) ? 1e30 : std::abs(got[i] - want));
    mag = std::max(mag, std::abs(ref[i]));
  }
  return err / mag;
}
// ||got - ref||_2 / ||ref||_2
double norm_err(const std::vector<float>& got, const Vec& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}
Vec to_double(const std::vector<float>& x) { return Vec(x.begin(), x.end()); }

double fd(const auto& loss, Vec x, size_t i, double step = 1e-6) {
  x[i] += step;
  const double up = loss(x);
  x[i] -= 2 * step;
  return (up - loss(x)) / (2 * step);
}

}  // namespace

TEST(Attention, CausalPairsAndFlops) {
  for (int64_t skv : {1, 7, 37})
    for (int64_t off = 0; off < skv; off += 3)
      for (int64_t sq = 0; off + sq <= skv + 2; ++sq) {
        const AttentionShape sh{sq, skv, 2, 3, 8, off};
        int64_t pairs = 0;
        for (int64_t i = 0; i < sq; ++i)
          for (int64_t j = 0; j < skv; ++j) pairs += j <= off + i;
        ASSERT_EQ(causal_attention_pairs(sh), pairs) << skv << " " << off << " " << sq;
        EXPECT_EQ(causal_attention_flops(sh, false), double(pairs) * 2 * 3 * 8 * 4);
        EXPECT_EQ(causal_attention_flops(sh, true), double(pairs) * 2 * 3 * 8 * 10);
      }
}

// The double reference's backward against central differences of loss = <r, out(q, k, v)>, with a query
// chunk (q_offset = 2 of s = 6) so the causal cut and the keys no query sees are both covered.
TEST(Attention, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t s = 6, b = 2, n = 2, d = 4, h = n * d, off = 2, sq = 3;
  const AttentionShape sh{sq, s, b, n, d, off};
  std::mt19937 rng(11);
  const Vec q = randn(size_t(sq * b * h), rng), k = randn(size_t(s * b * h), rng), v = randn(size_t(s * b * h), rng);
  const Vec r = randn(size_t(sq * b * h), rng);
  auto dot = [&](const Vec& out) {
    double acc = 0;
    for (size_t i = 0; i < out.size(); ++i) acc += r[i] * out[i];
    return acc;
  };
  const RefGrad g = ref_backward(sh, q, k, v, r);
  // step 1e-6 in double: truncation ~1e-12 * |f'''|, rounding ~1e-16 / 1e-6 = 1e-10; 1e-6 is far above both.
  for (size_t i = 0; i < q.size(); ++i)
    EXPECT_NEAR(g.dq[i], fd([&](const Vec& x) { return dot(ref_forward(sh, x, k, v).out); }, q, i), 1e-6) << i;
  for (size_t i = 0; i < k.size(); ++i)
    EXPECT_NEAR(g.dk[i], fd([&](const Vec& x) { return dot(ref_forward(sh, q, x, v).out); }, k, i), 1e-6) << i;
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_NEAR(g.dv[i], fd([&](const Vec& x) { return dot(ref_forward(sh, q, k, x).out); }, v, i), 1e-6) << i;
}

// fp32 kernel forward and backward against the double reference, for whole sequences and query chunks (with
// and without q_offset; chunks that end before skv so some keys are never seen), and block sizes that do
// and do not divide the shapes (single block, many blocks, blocks of 5 x 7).
TEST(Attention, Fp32MatchesDoubleReference) {
  const Problem pb(37, 2, 3, 24, 21);
  struct Case {
    int64_t q_offset, sq;
    AttentionBlocks blocks;
  };
  const Case cases[] = {{0, 37, {}},      {0, 37, {16, 8}},  {0, 37, {5, 7}},  {17, 20, {}},
                        {17, 20, {8, 16}}, {5, 13, {4, 8}},  {36, 1, {16, 8}}, {0, 1, {}}};
  std::mt19937 rng(3);
  const Vec dk_base = randn(size_t(pb.s * pb.b * pb.h), rng), dv_base = randn(dk_base.size(), rng);
  const std::vector<float> dk0(dk_base.begin(), dk_base.end()), dv0(dv_base.begin(), dv_base.end());
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "q_offset=" << c.q_offset << " sq=" << c.sq << " blocks=" << c.blocks.q
                                    << "x" << c.blocks.k);
    const AttentionShape sh = pb.chunk(c.q_offset, c.sq);
    const Vec qc = pb.rows(pb.q, c.q_offset, c.sq);
    const Ref ref = ref_forward(sh, qc, pb.k, pb.v);
    const RefGrad rg = ref_backward(sh, qc, pb.k, pb.v, pb.rows(pb.dout_d, c.q_offset, c.sq));
    const Result got = run_chunk(pb, DType::f32, c.q_offset, c.sq, c.blocks, dk0, dv0);
    // fp32 GEMMs over d = 24 and up to 37 keys, an exp with ~2 ulp error, and an online softmax: a few
    // hundred roundings of 6e-8 on O(1) values, ~1e-6 relative to the tensor's scale; 2e-5 leaves margin
    // without hiding indexing errors (which are O(1)).
    EXPECT_LT(scaled_err(got.out, ref.out), 2e-5);
    EXPECT_LT(scaled_err(got.lse, ref.lse), 2e-5);
    EXPECT_LT(scaled_err(got.dq, rg.dq), 2e-5);
    // dk, dv accumulate onto dk0, dv0 (rows no query of this chunk sees must stay exactly dk0, dv0).
    EXPECT_LT(scaled_err(got.dk, rg.dk, &dk0), 2e-5);
    EXPECT_LT(scaled_err(got.dv, rg.dv, &dv0), 2e-5);
    for (int64_t row = (c.q_offset + c.sq) * pb.b; row < pb.s * pb.b; ++row)
      for (int64_t col = 0; col < pb.h; ++col) {
        ASSERT_EQ(got.dk[size_t(row * pb.h + col)], dk0[size_t(row * pb.h + col)]);
        ASSERT_EQ(got.dv[size_t(row * pb.h + col)], dv0[size_t(row * pb.h + col)]);
      }
  }
}

// Chunk identity: M query chunks (q_offset = start of the chunk, full K/V) concatenate to the whole-sequence
// output, lse and dq, and their dk, dv contributions accumulate to the whole's. Equal chunks for s = 36 and
// M = 2, 3, 4; uneven chunks for s = 37.
TEST(Attention, ChunksEqualWholeSequence) {
  struct Case {
    int64_t s;
    std::vector<int64_t> sizes;
    AttentionBlocks blocks;
  };
  const Case cases[] = {{36, {18, 18}, {8, 8}},         {36, {12, 12, 12}, {}},    {36, {9, 9, 9, 9}, {4, 16}},
                        {37, {13, 12, 12}, {8, 8}},     {37, {10, 9, 9, 9}, {}},   {37, {1, 20, 16}, {16, 8}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "s=" << c.s << " M=" << c.sizes.size() << " blocks=" << c.blocks.q << "x"
                                    << c.blocks.k);
    const Problem pb(c.s, 2, 2, 16, 5);
    const std::vector<float> zeros(size_t(c.s * pb.b * pb.h), 0.0f);
    const Result whole = run_chunk(pb, DType::f32, 0, c.s, c.blocks, zeros, zeros);
    std::vector<float> out, dq, dk = zeros, dv = zeros;
    std::vector<float> lse(whole.lse.size());
    int64_t off = 0;
    for (int64_t sq : c.sizes) {
      Result part = run_chunk(pb, DType::f32, off, sq, c.blocks, dk, dv);
      out.insert(out.end(), part.out.begin(), part.out.end());
      dq.insert(dq.end(), part.dq.begin(), part.dq.end());
      for (int64_t bn = 0; bn < pb.b * pb.n; ++bn)
        for (int64_t i = 0; i < sq; ++i) lse[size_t(bn * c.s + off + i)] = part.lse[size_t(bn * sq + i)];
      dk = std::move(part.dk);
      dv = std::move(part.dv);
      off += sq;
    }
    ASSERT_EQ(off, c.s);
    // fp32 both ways; only GEMM shapes (hence summation order) and the order dk, dv are summed differ:
    // 1e-5 relative to the tensor's scale (docs/design.md, "Numerics and determinism").
    EXPECT_LT(scaled_err(out, to_double(whole.out)), 1e-5);
    EXPECT_LT(scaled_err(lse, to_double(whole.lse)), 1e-5);
    EXPECT_LT(scaled_err(dq, to_double(whole.dq)), 1e-5);
    EXPECT_LT(scaled_err(dk, to_double(whole.dk)), 1e-5);
    EXPECT_LT(scaled_err(dv, to_double(whole.dv)), 1e-5);
  }
}

// bf16 inputs: the reference runs in double on the same bf16-rounded q, k, v and the unrounded fp32 dout, so
// the only errors are the kernel's own roundings: P and dS (and dout, for the GEMMs) to bf16, relative error
// <= 2^-9 = 2e-3 per element, partly averaging out over the sums. Expected norm-relative error ~2e-3 for out,
// a few 1e-3 for the gradients (two rounded factors each); we allow 1e-2. lse comes from fp32 logits of
// exactly representable products and an fp32 sum of unrounded exp: 2e-5 as in fp32.
TEST(Attention, Bf16MatchesDoubleReference) {
  const Problem pb(37, 2, 3, 24, 9, /*round_bf16=*/true);
  const std::vector<float> zeros(size_t(pb.s * pb.b * pb.h), 0.0f);
  for (auto [off, sq, blocks] : {std::tuple{int64_t(0), int64_t(37), AttentionBlocks{16, 16}},
                                 std::tuple{int64_t(11), int64_t(19), AttentionBlocks{}},
                                 std::tuple{int64_t(0), int64_t(37), AttentionBlocks{5, 7}}}) {
    SCOPED_TRACE(testing::Message() << "q_offset=" << off << " sq=" << sq);
    const AttentionShape sh = pb.chunk(off, sq);
    const Vec qc = pb.rows(pb.q, off, sq);
    const Ref ref = ref_forward(sh, qc, pb.k, pb.v);
    const RefGrad rg = ref_backward(sh, qc, pb.k, pb.v, pb.rows(pb.dout_d, off, sq));
    const Result got = run_chunk(pb, DType::bf16, off, sq, blocks, zeros, zeros);
    EXPECT_LT(norm_err(got.out, ref.out), 1e-2);
    EXPECT_LT(scaled_err(got.lse, ref.lse), 2e-5);
    EXPECT_LT(norm_err(got.dq, rg.dq), 1e-2);
    EXPECT_LT(norm_err(got.dk, rg.dk), 1e-2);
    EXPECT_LT(norm_err(got.dv, rg.dv), 1e-2);
    // and it is not accidentally exact-fp32: the roundings must show (guards against a silent f32 path)
    EXPECT_GT(norm_err(got.out, ref.out), 1e-5);
  }
}

// The Tensor form on views of one fused qkv buffer [s*b, 3h] (q = a chunk's rows of qkv.cols(0, h), k, v =
// qkv.cols(h, 2h), qkv.cols(2h, 3h)), with out a column range of a padded buffer and dq, dk, dv column ranges of
// one fused dqkv buffer, gives bit for bit what the raw form gives (same kernel, same packed block GEMMs; only
// the row strides differ), fp32 and bf16. Elements outside the output views are untouched.
TEST(Attention, TensorFormMatchesRawForm) {
  const Problem pb(29, 2, 3, 16, 17);
  const int64_t s = pb.s, b = pb.b, h = pb.h;
  std::mt19937 rng(4);
  const Vec dk_base = randn(size_t(s * b * h), rng), dv_base = randn(dk_base.size(), rng);
  const std::vector<float> dk0(dk_base.begin(), dk_base.end()), dv0(dv_base.begin(), dv_base.end());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType in : {DType::f32, DType::bf16})
    for (auto [off, sq, blocks] : {std::tuple{int64_t(0), int64_t(29), AttentionBlocks{8, 8}},
                                   std::tuple{int64_t(11), int64_t(9), AttentionBlocks{4, 8}},
                                   std::tuple{int64_t(28), int64_t(1), AttentionBlocks{}}}) {
      SCOPED_TRACE(testing::Message() << dtype_name(in) << " q_offset=" << off << " sq=" << sq);
      const AttentionShape sh = pb.chunk(off, sq);
      const Result raw = run_chunk(pb, in, off, sq, blocks, dk0, dv0);

      const Tensor qkv = Tensor::from(pb.qkv, {s * b, 3 * h}, in);  // bf16: the same rounding as qkv_bf16
      const Tensor q = qkv.rows(off * b, (off + sq) * b).cols(0, h);
      const Tensor k = qkv.cols(h, 2 * h), v = qkv.cols(2 * h, 3 * h);
      Tensor out_buf = Tensor::empty({sq * b, h + 5});
      out_buf.fill(-1.0f);
      Tensor out = out_buf.cols(2, 2 + h);
      Tensor lse = Tensor::empty({b, pb.n, sq});
      attention_forward(sh, q, k, v, out, lse, blocks);
      EXPECT_EQ(out.to_vector(), raw.out);
      EXPECT_EQ(lse.to_vector(), raw.lse);
      for (int64_t c : {int64_t(0), int64_t(1), h + 2, h + 3, h + 4})
        for (int64_t r = 0; r < sq * b; ++r) ASSERT_EQ(out_buf.get(r * (h + 5) + c), -1.0f);

      Tensor dqkv = Tensor::empty({s * b, 3 * h});
      dqkv.cols(0, h).fill(nan);
      dqkv.cols(h, 2 * h).copy_from(Tensor::from(dk0, {s * b, h}));
      dqkv.cols(2 * h, 3 * h).copy_from(Tensor::from(dv0, {s * b, h}));
      Tensor dq = dqkv.rows(off * b, (off + sq) * b).cols(0, h);
      Tensor dk = dqkv.cols(h, 2 * h), dv = dqkv.cols(2 * h, 3 * h);
      const Tensor dout = Tensor::from(pb.dout, {s * b, h}).rows(off * b, (off + sq) * b);
      attention_backward(sh, dout, q, k, v, out, lse, dq, dk, dv, blocks);
      EXPECT_EQ(dq.to_vector(), raw.dq);
      EXPECT_EQ(dk.to_vector(), raw.dk);
      EXPECT_EQ(dv.to_vector(), raw.dv);
      for (int64_t r = 0; r < s * b; ++r) {  // dq of rows outside the chunk: untouched
        if (r >= off * b && r < (off + sq) * b) continue;
        for (int64_t c = 0; c < h; ++c) ASSERT_TRUE(std::isnan(dqkv.get(r * 3 * h + c))) << r << " " << c;
      }
    }
}

TEST(Attention, TensorFormChecksShapesAndDtypes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int64_t s = 6, b = 2, n = 2, d = 4, h = n * d;
  const AttentionShape sh{s, s, b, n, d, 0};
  Tensor qkv = Tensor::zeros({s * b, 3 * h});
  Tensor q = qkv.cols(0, h), k = qkv.cols(h, 2 * h), v = qkv.cols(2 * h, 3 * h);
  Tensor out = Tensor::zeros({s * b, h}), lse = Tensor::zeros({b * n * s});
  Tensor k16 = k.to(DType::bf16);
  EXPECT_DEATH(attention_forward(sh, q, k16, v, out, lse), "attention_forward: k \\(dtype of q\\) must be a f32");
  Tensor q_short = q.rows(0, s * b - 1);
  EXPECT_DEATH(attention_forward(sh, q_short, k, v, out, lse),
               "attention_forward: q must be a f32 tensor of shape \\[12, 8\\]");
  Tensor out16 = out.to(DType::bf16);
  EXPECT_DEATH(attention_forward(sh, q, k, v, out16, lse), "attention_forward: out must be a f32");
  Tensor lse_short = Tensor::zeros({b * n * s - 1});
  EXPECT_DEATH(attention_forward(sh, q, k, v, out, lse_short),
               "lse must be a contiguous f32 tensor of b\\*n\\*sq = 24");
  Tensor dq_wide = Tensor::zeros({s * b, h + 1});
  EXPECT_DEATH(attention_backward(sh, out, q, k, v, out, lse, dq_wide, k, v), "attention_backward: dq must be");
}

// Context parallelism's partial attention: the keys a query block sees are split into key blocks at uneven
// positions (each a call with its own k_offset, as a ring step delivers them, in any order), the first call writes
// out and lse and the others merge into them; the backward runs once per key block with the final out and lse,
// dq accumulated. Everything must equal one call over all keys, and the double reference.
TEST(Attention, PartialKeyBlocksMergeToFullAttention) {
  const Problem pb(41, 2, 2, 16, 29);
  struct Case {
    int64_t q_offset, sq;
    std::vector<std::pair<int64_t, int64_t>> key_blocks;  // [k0, k1) in the order they are computed
    AttentionBlocks blocks;
  };
  const Case cases[] = {
      {30, 11, {{0, 7}, {7, 19}, {19, 41}}, {4, 8}},       // diagonal block last, uneven blocks
      {30, 11, {{19, 41}, {0, 7}, {7, 19}}, {}},           // diagonal first, then the earlier blocks
      {12, 9, {{12, 21}, {3, 12}, {0, 3}}, {8, 4}},        // a query block in the middle; keys after it unused
      {20, 10, {{20, 30}, {10, 20}, {0, 5}, {5, 10}}, {}}, // the causal block at the query's own start
  };
  const int64_t b = pb.b, h = pb.h, ld = 3 * h;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "q_offset=" << c.q_offset << " sq=" << c.sq);
    const float* q = pb.qkv.data() + c.q_offset * b * ld;
    std::vector<float> out(size_t(c.sq * b * h)), lse(size_t(b * pb.n * c.sq));
    bool first = true;
    for (auto [k0, k1] : c.key_blocks) {
      AttentionShape sh{c.sq, k1 - k0, b, pb.n, pb.d, c.q_offset};
      sh.k_offset = k0;
      sh.merge = !first;
      first = false;
      attention_forward(sh, DType::f32, q, ld, pb.qkv.data() + k0 * b * ld + h, ld, pb.qkv.data() + k0 * b * ld + 2 * h,
                        ld, out.data(), h, lse.data(), c.blocks);
    }
    // the reference sees every key [0, q_offset + sq)
    const AttentionShape whole = pb.chunk(c.q_offset, c.sq);
    const Vec qc = pb.rows(pb.q, c.q_offset, c.sq), dout = pb.rows(pb.dout_d, c.q_offset, c.sq);
    const Ref ref = ref_forward(whole, qc, pb.k, pb.v);
    const RefGrad rg = ref_backward(whole, qc, pb.k, pb.v, dout);
    EXPECT_LT(scaled_err(out, ref.out), 2e-5);
    EXPECT_LT(scaled_err(lse, ref.lse), 2e-5);
    std::vector<float> dq(out.size(), 0.0f), dk(size_t(pb.s * b * h), 0.0f), dv(dk.size(), 0.0f);
    for (auto [k0, k1] : c.key_blocks) {
      AttentionShape sh{c.sq, k1 - k0, b, pb.n, pb.d, c.q_offset};
      sh.k_offset = k0;
      sh.accumulate_dq = true;
      attention_backward(sh, DType::f32, pb.dout.data() + c.q_offset * b * h, h, q, ld,
                         pb.qkv.data() + k0 * b * ld + h, ld, pb.qkv.data() + k0 * b * ld + 2 * h, ld, out.data(), h,
                         lse.data(), dq.data(), h, dk.data() + k0 * b * h, h, dv.data() + k0 * b * h, h, c.blocks);
    }
    EXPECT_LT(scaled_err(dq, rg.dq), 2e-5);
    EXPECT_LT(scaled_err(dk, rg.dk), 2e-5);
    EXPECT_LT(scaled_err(dv, rg.dv), 2e-5);
  }
}

TEST(Attention, KeyOffsetAfterQueriesIsRefused) {
  AttentionShape sh{4, 4, 1, 1, 8, 2};
  sh.k_offset = 3;  // key row 0 would be invisible to query row 0
  std::vector<float> x(64), out(32), lse(4);
  EXPECT_DEATH(attention_forward(sh, DType::f32, x.data(), 8, x.data(), 8, x.data(), 8, out.data(), 8, lse.data()),
               "k_offset must be <= q_offset");
}

// ---- attention-probability dropout (AttentionDropout) ------------------------------------------------------

namespace {
// p 0.3, a micro-batch whose token 0 is global token 1000, local heads starting at global head 3 (a tp rank's).
AttentionDropout test_dropout(int64_t seq) {
  AttentionDropout dr;
  dr.p = 0.3f;
  dr.key = {77, 5, core::RngPurpose::attn_prob_dropout};
  dr.token_base = 1000;
  dr.head0 = 3;
  dr.seq = seq;
  return dr;
}
}  // namespace

// dropout_mask's runs (one Philox call per 4 features, any start) are philox_uniform's element decisions, and drop
// about p of them.
TEST(Attention, DropoutMaskIsTheElementRule) {
  const AttentionDropout dr = test_dropout(37);
  std::vector<float> m(301);
  int64_t dropped = 0, total = 0;
  for (uint64_t f0 : {uint64_t(0), uint64_t(1), uint64_t(6), uint64_t(111)}) {
    dropout_mask(dr.key, 4242, f0, int64_t(m.size()), dr.p, m.data());
    for (size_t i = 0; i < m.size(); ++i) {
      const bool keep = core::philox_uniform(dr.key, 4242, f0 + i) >= dr.p;
      ASSERT_EQ(m[i], keep ? 1.0f / (1.0f - dr.p) : 0.0f) << "feature " << f0 + i;
      dropped += !keep;
      ++total;
    }
  }
  const double share = double(dropped) / double(total), sigma = std::sqrt(0.3 * 0.7 / double(total));
  EXPECT_NEAR(share, 0.3, 4 * sigma);
}

// The kernel with dropout against the double reference (the mask written out element by element), fp32: chunks at
// offsets, small and uneven tiles (key blocks start at unaligned features), two batches, three heads.
TEST(Attention, DropoutFp32MatchesDoubleReference) {
  const Problem pb(37, 2, 3, 24, 21);
  const AttentionDropout dr = test_dropout(pb.s);
  const std::vector<float> zeros(size_t(pb.s * pb.b * pb.h), 0.0f);
  for (auto [off, sq, blocks] : {std::tuple{int64_t(0), int64_t(37), AttentionBlocks{}},
                                 std::tuple{int64_t(0), int64_t(37), AttentionBlocks{5, 7}},
                                 std::tuple{int64_t(17), int64_t(20), AttentionBlocks{8, 16}},
                                 std::tuple{int64_t(5), int64_t(13), AttentionBlocks{4, 8}}}) {
    SCOPED_TRACE(testing::Message() << "q_offset=" << off << " sq=" << sq << " blocks=" << blocks.q << "x" << blocks.k);
    const AttentionShape sh = pb.chunk(off, sq);
    const Vec qc = pb.rows(pb.q, off, sq);
    const Ref ref = ref_forward(sh, qc, pb.k, pb.v, &dr);
    const RefGrad rg = ref_backward(sh, qc, pb.k, pb.v, pb.rows(pb.dout_d, off, sq), &dr);
    const Result got = run_chunk(pb, DType::f32, off, sq, blocks, zeros, zeros, dr);
    EXPECT_LT(scaled_err(got.out, ref.out), 2e-5);
    EXPECT_LT(scaled_err(got.lse, ref.lse), 2e-5);  // the undropped normaliser
    EXPECT_LT(scaled_err(got.dq, rg.dq), 2e-5);
    EXPECT_LT(scaled_err(got.dk, rg.dk), 2e-5);
    EXPECT_LT(scaled_err(got.dv, rg.dv), 2e-5);
    // and the dropout acted: without it the output is another one
    const Ref plain = ref_forward(sh, qc, pb.k, pb.v);
    EXPECT_GT(scaled_err(got.out, plain.out), 1e-2);
  }
}

// AMPipe's chunks draw the numbers of the whole sequence: M chunks with dropout concatenate to the whole's result.
TEST(Attention, DropoutChunksEqualWholeSequence) {
  const Problem pb(36, 2, 2, 16, 5);
  const AttentionDropout dr = test_dropout(pb.s);
  const std::vector<float> zeros(size_t(pb.s * pb.b * pb.h), 0.0f);
  const Result whole = run_chunk(pb, DType::f32, 0, pb.s, {8, 8}, zeros, zeros, dr);
  for (int M : {2, 3, 4}) {
    SCOPED_TRACE(testing::Message() << "M=" << M);
    std::vector<float> out, dq, dk = zeros, dv = zeros;
    const int64_t sq = pb.s / M;
    for (int c = 0; c < M; ++c) {
      Result part = run_chunk(pb, DType::f32, c * sq, sq, {8, 8}, dk, dv, dr);
      out.insert(out.end(), part.out.begin(), part.out.end());
      dq.insert(dq.end(), part.dq.begin(), part.dq.end());
      dk = std::move(part.dk);
      dv = std::move(part.dv);
    }
    EXPECT_LT(scaled_err(out, to_double(whole.out)), 1e-5);
    EXPECT_LT(scaled_err(dq, to_double(whole.dq)), 1e-5);
    EXPECT_LT(scaled_err(dk, to_double(whole.dk)), 1e-5);
    EXPECT_LT(scaled_err(dv, to_double(whole.dv)), 1e-5);
  }
}

// bf16 operands with dropout: the dropped probabilities are rounded once, as without dropout.
TEST(Attention, DropoutBf16MatchesDoubleReference) {
  const Problem pb(37, 2, 3, 24, 9, /*round_bf16=*/true);
  const AttentionDropout dr = test_dropout(pb.s);
  const std::vector<float> zeros(size_t(pb.s * pb.b * pb.h), 0.0f);
  const AttentionShape sh = pb.chunk(11, 19);
  const Vec qc = pb.rows(pb.q, 11, 19);
  const Ref ref = ref_forward(sh, qc, pb.k, pb.v, &dr);
  const RefGrad rg = ref_backward(sh, qc, pb.k, pb.v, pb.rows(pb.dout_d, 11, 19), &dr);
  const Result got = run_chunk(pb, DType::bf16, 11, 19, {16, 16}, zeros, zeros, dr);
  EXPECT_LT(norm_err(got.out, ref.out), 1e-2);
  EXPECT_LT(norm_err(got.dq, rg.dq), 1e-2);
  EXPECT_LT(norm_err(got.dk, rg.dk), 1e-2);
  EXPECT_LT(norm_err(got.dv, rg.dv), 1e-2);
}

// Context parallelism's key blocks (k_offset > 0, merged by log-sum-exp) with dropout: the mask follows the global
// key position, so the blocks merge to the whole attention's dropped result.
TEST(Attention, DropoutPartialKeyBlocksMergeToFullAttention) {
  const Problem pb(41, 2, 2, 16, 29);
  const AttentionDropout dr = test_dropout(pb.s);
  const int64_t b = pb.b, h = pb.h, ld = 3 * h, q_offset = 30, sq = 11;
  const std::vector<std::pair<int64_t, int64_t>> key_blocks = {{19, 41}, {0, 7}, {7, 19}};
  const float* q = pb.qkv.data() + q_offset * b * ld;
  std::vector<float> out(size_t(sq * b * h)), lse(size_t(b * pb.n * sq));
  bool first = true;
  for (auto [k0, k1] : key_blocks) {
    AttentionShape sh{sq, k1 - k0, b, pb.n, pb.d, q_offset};
    sh.k_offset = k0;
    sh.merge = !first;
    sh.dropout = dr;
    first = false;
    attention_forward(sh, DType::f32, q, ld, pb.qkv.data() + k0 * b * ld + h, ld, pb.qkv.data() + k0 * b * ld + 2 * h,
                      ld, out.data(), h, lse.data(), {4, 8});
  }
  const AttentionShape whole = pb.chunk(q_offset, sq);
  const Vec qc = pb.rows(pb.q, q_offset, sq), dout = pb.rows(pb.dout_d, q_offset, sq);
  const Ref ref = ref_forward(whole, qc, pb.k, pb.v, &dr);
  const RefGrad rg = ref_backward(whole, qc, pb.k, pb.v, dout, &dr);
  EXPECT_LT(scaled_err(out, ref.out), 2e-5);
  std::vector<float> dq(out.size(), 0.0f), dk(size_t(pb.s * b * h), 0.0f), dv(dk.size(), 0.0f);
  for (auto [k0, k1] : key_blocks) {
    AttentionShape sh{sq, k1 - k0, b, pb.n, pb.d, q_offset};
    sh.k_offset = k0;
    sh.accumulate_dq = true;
    sh.dropout = dr;
    attention_backward(sh, DType::f32, pb.dout.data() + q_offset * b * h, h, q, ld, pb.qkv.data() + k0 * b * ld + h,
                       ld, pb.qkv.data() + k0 * b * ld + 2 * h, ld, out.data(), h, lse.data(), dq.data(), h,
                       dk.data() + k0 * b * h, h, dv.data() + k0 * b * h, h, {4, 8});
  }
  EXPECT_LT(scaled_err(dq, rg.dq), 2e-5);
  EXPECT_LT(scaled_err(dk, rg.dk), 2e-5);
  EXPECT_LT(scaled_err(dv, rg.dv), 2e-5);
}

// Grouped-query attention (n_kv = g < n, query heads [j*n/g, (j+1)*n/g) read K, V head j): the kernel on k, v of
// g heads equals the double reference of ordinary attention on K, V repeated n/g times per head, with dK, dV of a
// K, V head the sum over its group's query heads. fp32 and bf16 (on bf16-representable values), chunks with an
// offset, blocks that do not divide, dropout on (its mask is keyed by the query head), and dK, dV accumulated.
TEST(Attention, GroupedQueryMatchesRepeatedKeysReference) {
  const int64_t s = 23, b = 2, n = 6, d = 8, h = n * d;
  for (const int64_t g : {int64_t(1), int64_t(2), int64_t(3)}) {
    for (const DType in : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(testing::Message() << "groups=" << g << " " << dtype_name(in));
      const int64_t hkv = g * d, group = n / g, ld = h + 2 * hkv;
      std::mt19937 rng(uint32_t(40 + g));
      Vec x = randn(size_t(s * b * ld), rng);
      for (double& e : x) e = double(bf16_to_f32(f32_to_bf16(float(e))));  // exact in either dtype
      std::vector<float> qkv(x.begin(), x.end());
      std::vector<bf16> qkv_b(x.size());
      for (size_t i = 0; i < x.size(); ++i) qkv_b[i] = f32_to_bf16(qkv[i]);
      const Vec dout_d = randn(size_t(s * b * h), rng);
      const std::vector<float> dout(dout_d.begin(), dout_d.end());
      // packed doubles: q [s, b, h]; K, V repeated to n heads [s, b, h]
      Vec q(size_t(s * b * h)), k(q.size()), v(q.size());
      for (int64_t r = 0; r < s * b; ++r)
        for (int64_t hh = 0; hh < n; ++hh)
          for (int64_t dd = 0; dd < d; ++dd) {
            const size_t at = size_t(r * h + hh * d + dd);
            q[at] = x[size_t(r * ld + hh * d + dd)];
            k[at] = x[size_t(r * ld + h + (hh / group) * d + dd)];
            v[at] = x[size_t(r * ld + h + hkv + (hh / group) * d + dd)];
          }
      AttentionDropout dr;
      dr.p = 0.25f, dr.key = {5, 1, core::RngPurpose::attn_prob_dropout}, dr.seq = s, dr.head0 = 6;
      for (auto [off, sq] : {std::pair{int64_t(0), s}, std::pair{int64_t(9), int64_t(14)}}) {
        AttentionShape sh{sq, s, b, n, d, off};
        sh.n_kv = g;
        sh.dropout = dr;
        const Vec qc(q.begin() + off * b * h, q.begin() + (off + sq) * b * h);
        const Vec dc(dout_d.begin() + off * b * h, dout_d.begin() + (off + sq) * b * h);
        const Ref ref = ref_forward(sh, qc, k, v, &dr);
        const RefGrad rg = ref_backward(sh, qc, k, v, dc, &dr);
        Vec dk_ref(size_t(s * b * hkv)), dv_ref(dk_ref.size());  // the group sums, onto the starting values
        std::vector<float> dk(dk_ref.size()), dv(dk_ref.size());
        for (size_t i = 0; i < dk.size(); ++i) dk[i] = float(i % 7) * 0.5f, dv[i] = -float(i % 5);
        for (int64_t r = 0; r < s * b; ++r)
          for (int64_t hh = 0; hh < n; ++hh)
            for (int64_t dd = 0; dd < d; ++dd) {
              dk_ref[size_t(r * hkv + (hh / group) * d + dd)] += rg.dk[size_t(r * h + hh * d + dd)];
              dv_ref[size_t(r * hkv + (hh / group) * d + dd)] += rg.dv[size_t(r * h + hh * d + dd)];
            }
        const std::vector<float> dk0 = dk, dv0 = dv;
        std::vector<float> out(size_t(sq * b * h)), lse(size_t(b * n * sq)), dq(out.size());
        const void* base = in == DType::f32 ? static_cast<const void*>(qkv.data()) : qkv_b.data();
        const size_t esz = dtype_size(in);
        auto at = [&](int64_t row, int64_t col) { return static_cast<const std::byte*>(base) + size_t(row * b * ld + col) * esz; };
        const AttentionBlocks blocks{5, 7};
        attention_forward(sh, in, at(off, 0), ld, at(0, h), ld, at(0, h + hkv), ld, out.data(), h, lse.data(), blocks);
        attention_backward(sh, in, dout.data() + off * b * h, h, at(off, 0), ld, at(0, h), ld, at(0, h + hkv), ld,
                           out.data(), h, lse.data(), dq.data(), h, dk.data(), hkv, dv.data(), hkv, blocks);
        const double tol = in == DType::f32 ? 2e-5 : 2e-2;  // bf16: P, dS and dout rounded before the GEMMs
        EXPECT_LT(scaled_err(out, ref.out), tol);
        EXPECT_LT(scaled_err(lse, ref.lse), 2e-5);
        EXPECT_LT(scaled_err(dq, rg.dq), tol);
        EXPECT_LT(scaled_err(dk, dk_ref, &dk0), tol);
        EXPECT_LT(scaled_err(dv, dv_ref, &dv0), tol);
      }
    }
  }
}
