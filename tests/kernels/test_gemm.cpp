#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ampipe/kernels/gemm.h"

using namespace ampipe;
using namespace ampipe::kernels;

namespace {
// Naive double reference of C = alpha * op(A) op(B) (+ C0).
std::vector<double> ref_gemm(const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m, int64_t n,
                             int64_t k, double alpha, const std::vector<float>* c0) {
  std::vector<double> c(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta == Trans::n ? a.get(i * a.size(1) + p) : a.get(p * a.size(1) + i);
        const double bv = tb == Trans::n ? b.get(p * b.size(1) + j) : b.get(j * b.size(1) + p);
        acc += av * bv;
      }
      c[size_t(i * n + j)] = alpha * acc + (c0 ? (*c0)[size_t(i * n + j)] : 0.0);
    }
  return c;
}

Tensor random_tensor(Shape s, DType dt, std::mt19937& rng) {
  std::normal_distribution<float> nd(0, 1);
  Tensor t = Tensor::empty(s, dt);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, nd(rng));
  return t;
}
}  // namespace

// Every transposition, odd sizes, accumulate and alpha; fp32 against double.
TEST(Gemm, MatchesDoubleReferenceAllTranspositions) {
  std::mt19937 rng(1);
  for (DType in : {DType::f32, DType::bf16}) {
    for (Trans ta : {Trans::n, Trans::t})
      for (Trans tb : {Trans::n, Trans::t})
        for (bool acc : {false, true}) {
          const int64_t m = 37, n = 19, k = 53;
          Tensor a = random_tensor(ta == Trans::n ? Shape{m, k} : Shape{k, m}, in, rng);
          Tensor b = random_tensor(tb == Trans::n ? Shape{k, n} : Shape{n, k}, in, rng);
          Tensor c = random_tensor({m, n}, DType::f32, rng);
          const std::vector<float> c0 = c.to_vector();
          gemm(a, ta, b, tb, c, acc, 0.5f);
          // Inputs are exactly representable in their dtype; accumulation is fp32 over k = 53 terms of
          // O(1): error ~ sqrt(k) * 2^-24 * |terms|, far below 1e-4 relative to the row norm.
          const auto ref = ref_gemm(a, ta, b, tb, m, n, k, 0.5, acc ? &c0 : nullptr);
          for (int64_t i = 0; i < m * n; ++i)
            ASSERT_NEAR(c.get(i), ref[size_t(i)], 1e-4 * std::sqrt(double(k)))
                << "in=" << int(in) << " ta=" << int(ta) << " tb=" << int(tb) << " acc=" << acc << " i=" << i;
        }
  }
}

// A block of rows and a column range inside a bigger matrix (leading dimensions), as attention uses.
TEST(Gemm, StridedSubmatrices) {
  std::mt19937 rng(2);
  Tensor big_a = random_tensor({10, 24}, DType::f32, rng);
  Tensor big_b = random_tensor({16, 24}, DType::f32, rng);
  Tensor c = Tensor::zeros({10, 16});
  GemmDesc d;
  d.m = 10;
  d.n = 16;
  d.k = 8;
  d.tb = Trans::t;
  d.lda = 24;
  d.ldb = 24;
  d.ldc = 16;
  gemm(d, big_a.data<float>() + 8, big_b.data<float>() + 8, c.data<float>());
  for (int64_t i = 0; i < 10; ++i)
    for (int64_t j = 0; j < 16; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < 8; ++p) acc += double(big_a.get(i * 24 + 8 + p)) * big_b.get(j * 24 + 8 + p);
      ASSERT_NEAR(c.get(i * 16 + j), acc, 1e-4);
    }
}

TEST(Gemm, Bf16UsesAmxWhereAvailable) {
  GemmDesc d;
  d.m = d.n = d.k = 256;
  d.in = DType::bf16;
  const std::string impl = gemm_impl_name(d);
  EXPECT_FALSE(impl.empty());
  std::printf("bf16 impl: %s\n", impl.c_str());
}

// The Tensor form with column-range views (row stride != columns) for A, B and C, e.g. q / k / v slices of a
// fused [T, 3h] buffer: the product matches the double reference, and C's columns outside the view stay
// untouched. (fp32 inputs with a bf16 C are not a oneDNN 2.6 matmul, so out = bf16 only with bf16 inputs.)
TEST(Gemm, TensorFormTakesColumnViews) {
  std::mt19937 rng(3);
  for (auto [in, out] : {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::f32},
                         std::pair{DType::bf16, DType::bf16}})
    for (Trans ta : {Trans::n, Trans::t})
      for (Trans tb : {Trans::n, Trans::t})
        for (bool acc : {false, true}) {
          SCOPED_TRACE(testing::Message() << "in=" << dtype_name(in) << " out=" << dtype_name(out)
                                          << " ta=" << int(ta) << " tb=" << int(tb) << " acc=" << acc);
          const int64_t m = 13, n = 11, k = 17, ldc = n + 7;
          const Shape sa = ta == Trans::n ? Shape{m, k} : Shape{k, m};
          const Shape sb = tb == Trans::n ? Shape{k, n} : Shape{n, k};
          // A: columns [5, 5 + cols) of a wider buffer; B: the last columns of one; C: the middle of one.
          Tensor big_a = random_tensor({sa[0], sa[1] + 9}, in, rng);
          Tensor big_b = random_tensor({sb[0], sb[1] + 4}, in, rng);
          Tensor big_c = random_tensor({m, ldc}, out, rng);
          Tensor a = big_a.cols(5, 5 + sa[1]);
          Tensor b = big_b.cols(4, 4 + sb[1]);
          Tensor c = big_c.cols(3, 3 + n);
          ASSERT_FALSE(a.is_contiguous());
          ASSERT_FALSE(b.is_contiguous());
          ASSERT_FALSE(c.is_contiguous());
          const std::vector<float> before = big_c.to_vector();
          gemm(a, ta, b, tb, c, acc, 0.75f);
          const std::vector<float> after = big_c.to_vector();
          const auto ref = ref_gemm(a, ta, b, tb, m, n, k, 0.75, nullptr);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              const size_t at = size_t(i * ldc + j);
              if (j < 3 || j >= 3 + n) {  // outside the view
                ASSERT_EQ(after[at], before[at]) << i << " " << j;
                continue;
              }
              const double want = ref[size_t(i * n + j - 3)] + (acc ? double(before[at]) : 0.0);
              // fp32 C: as in MatchesDoubleReferenceAllTranspositions; bf16 C: one rounding, 2^-9 relative.
              const double tol = out == DType::f32 ? 1e-4 * std::sqrt(double(k)) : 1e-4 + std::abs(want) / 256;
              ASSERT_NEAR(after[at], want, tol) << i << " " << j;
            }
        }
}

TEST(Gemm, TensorFormRejectsBadOperands) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor a = Tensor::zeros({4, 6}), b = Tensor::zeros({6, 5}), c = Tensor::zeros({4, 5});
  Tensor a3 = Tensor::zeros({4, 6, 1});
  EXPECT_DEATH(gemm(a3, Trans::n, b, Trans::n, c), "gemm: A must be a defined 2-D tensor");
  Tensor wrong_c = Tensor::zeros({4, 4});
  EXPECT_DEATH(gemm(a, Trans::n, b, Trans::n, wrong_c), "gemm shapes");
  Tensor b16 = b.to(DType::bf16);
  EXPECT_DEATH(gemm(a, Trans::n, b16, Trans::n, c), "dtypes differ");
}

// A batch of GEMMs in one call (--moe-grouped-gemm): each matrix of the batch equals the double reference of its own
// product, with strided row blocks (as the expert-major buffers hold them), transposed operands, accumulation, and
// bf16 inputs (which on CPUs without bf16 instructions run matrix by matrix).
TEST(Gemm, BatchedEqualsEachMatrixsReference) {
  std::mt19937 rng(3);
  const int64_t B = 3, m = 5, n = 7, k = 9, pad = 4;  // matrix i's rows start (m + pad) rows after matrix i-1's
  for (DType in : {DType::f32, DType::bf16})
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(in)) + (accumulate ? " accumulate" : ""));
      const Tensor a = random_tensor({B * (k + pad), m}, in, rng);  // A^T blocks: [k, m] each, op(A) = A^T
      const Tensor b = random_tensor({B * n, k}, in, rng);          // B blocks [n, k], op(B) = B^T
      Tensor c = random_tensor({B * (m + pad), n}, DType::f32, rng);
      const std::vector<float> c0 = c.to_vector();
      Tensor c_first = c.rows(0, m);
      gemm_batched(a.rows(0, k), Trans::t, b.rows(0, n), Trans::t, c_first, B, (k + pad) * m, n * k, (m + pad) * n,
                   accumulate);
      for (int64_t i = 0; i < B; ++i) {
        const Tensor ai = a.rows(i * (k + pad), i * (k + pad) + k).clone(), bi = b.rows(i * n, (i + 1) * n).clone();
        std::vector<float> c0i;
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < n; ++j) c0i.push_back(c0[size_t((i * (m + pad) + r) * n + j)]);
        const std::vector<double> want = ref_gemm(ai, Trans::t, bi, Trans::t, m, n, k, 1.0, accumulate ? &c0i : nullptr);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < n; ++j)
            EXPECT_NEAR(c.get((i * (m + pad) + r) * n + j), want[size_t(r * n + j)], 1e-4)
                << "matrix " << i << " (" << r << ", " << j << ")";
        for (int64_t r = m; r < m + pad && i + 1 < B; ++r)  // the rows between the blocks are untouched
          for (int64_t j = 0; j < n; ++j)
            EXPECT_EQ(c.get((i * (m + pad) + r) * n + j), c0[size_t((i * (m + pad) + r) * n + j)]);
      }
    }
}
