// kernels::ComputeContext (kernels/context.h): the state the GEMM and attention keep between calls lives in a
// context, one slot per OpenMP thread; two contexts share nothing, and a kernel gives the same bits in any context.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "ampipe/core/parallel.h"
#include "ampipe/core/philox.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/kernels/context.h"
#include "ampipe/kernels/gemm.h"

using namespace ampipe;
using kernels::ComputeContext;

namespace {
struct Counter {
  int calls = 0;
};

Tensor random(Shape shape, uint64_t key, DType dt = DType::f32) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = core::philox_uniform({key, 0, core::RngPurpose::init}, 0, uint64_t(i)) - 0.5f;
  if (dt == DType::f32) return t;
  Tensor b = Tensor::empty(std::move(shape), dt);
  b.copy_from(t);
  return b;
}

bool same_bits(const Tensor& a, const Tensor& b) { return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0; }
}  // namespace

TEST(ComputeContext, StateIsPerContextAndPerThread) {
  ComputeContext a, b;
  EXPECT_EQ(a.device(), Device::cpu);
  Counter& ca = a.state<Counter>();
  ca.calls = 7;
  EXPECT_EQ(&a.state<Counter>(), &ca);  // made once, then found
  EXPECT_EQ(a.state<Counter>().calls, 7);
  EXPECT_NE(&b.state<Counter>(), &ca);  // another context: its own
  EXPECT_EQ(b.state<Counter>().calls, 0);
  EXPECT_EQ(&ComputeContext::host(), &ComputeContext::host());
  // Inside a parallel loop every thread of the team has a slot of its own (and thread 0, the compute thread, the
  // slot it has outside).
  set_num_threads(2);
  std::vector<Counter*> slot(8, nullptr);
  std::vector<std::thread::id> owner(8);
  parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      slot[size_t(i)] = &a.state<Counter>();
      owner[size_t(i)] = std::this_thread::get_id();
    }
  });
  set_num_threads(1);
  std::set<Counter*> slots(slot.begin(), slot.end());
  std::set<std::thread::id> threads(owner.begin(), owner.end());
  ASSERT_EQ(threads.size(), 2u) << "the loop did not run on two threads";
  EXPECT_EQ(slots.size(), 2u);  // one slot per thread
  EXPECT_TRUE(slots.count(&ca));
  for (size_t i = 0; i < 8; ++i)
    for (size_t j = 0; j < 8; ++j) EXPECT_EQ(owner[i] == owner[j], slot[i] == slot[j]);
}

TEST(ComputeContext, GemmAndAttentionGiveTheSameBitsInAnyContext) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = random({64, 96}, 1, dt), w = random({80, 96}, 2, dt);
    Tensor y0 = Tensor::zeros({64, 80}), y1 = Tensor::zeros({64, 80});
    ComputeContext ctx;
    kernels::gemm(x, kernels::Trans::n, w, kernels::Trans::t, y0);  // the host context
    kernels::gemm(x, kernels::Trans::n, w, kernels::Trans::t, y1, false, 1.0f, ctx);
    EXPECT_TRUE(same_bits(y0, y1));

    const kernels::AttentionShape sh{32, 32, 2, 4, 16, 0};
    const Tensor q = random({64, 64}, 3, dt), k = random({64, 64}, 4, dt), v = random({64, 64}, 5, dt);
    Tensor o0 = Tensor::empty({64, 64}), o1 = Tensor::empty({64, 64});
    Tensor l0 = Tensor::empty({2 * 4 * 32}), l1 = Tensor::empty({2 * 4 * 32});
    kernels::attention_forward(sh, q, k, v, o0, l0);
    for (int threads : {1, 2}) {  // the context's per-thread slots at 1 and 2 threads
      set_num_threads(threads);
      kernels::attention_forward(sh, q, k, v, o1, l1, {}, ctx);
      EXPECT_TRUE(same_bits(o0, o1)) << threads << " threads";
      EXPECT_TRUE(same_bits(l0, l1)) << threads << " threads";
    }
    set_num_threads(1);
  }
}
