#include "ampipe/kernels/context.h"

#include <omp.h>

#include <atomic>

namespace ampipe::kernels {

ComputeContext::ComputeContext(Device device) : device_(device) {}
ComputeContext::~ComputeContext() = default;

ComputeContext& ComputeContext::host() {
  thread_local ComputeContext ctx;
  return ctx;
}

int ComputeContext::new_kind() {
  static std::atomic<int> next{0};
  return next++;
}

std::shared_ptr<void>& ComputeContext::slot_state(int kind) {
  const size_t t = omp_in_parallel() ? size_t(omp_get_thread_num()) : 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (t >= slots_.size()) slots_.resize(t + 1);
  if (!slots_[t]) slots_[t] = std::make_unique<Slot>();
  std::vector<std::shared_ptr<void>>& v = slots_[t]->by_kind;
  if (size_t(kind) >= v.size()) v.resize(size_t(kind) + 1);
  return v[size_t(kind)];
}

}  // namespace ampipe::kernels
