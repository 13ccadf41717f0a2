// What a kernel call needs besides its operands (docs/design.md, "The device seam"): the device it runs on, and the
// state the kernels keep between calls on it (the GEMM's oneDNN primitives, stream and staging buffers; attention's
// scratch). A compute lane owns one (schedule::LayerStack owns its layers' context) and passes it to every kernel
// it calls; callers outside a stack (tests, benchmarks, the head of the model, calibration) use
// ComputeContext::host(), the calling thread's own.
//
// One compute thread uses a context at a time. Inside a kernel's parallel loop each OpenMP thread of the team gets
// a slot of its own (state() keys the slot by omp_get_thread_num()), so no two threads ever share a primitive or a
// scratch buffer, and a primitive made for one thread count is never run with another (gemm.cpp keys them by it).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "ampipe/core/device.h"

namespace ampipe::kernels {

class ComputeContext {
 public:
  explicit ComputeContext(Device device = Device::cpu);
  ~ComputeContext();
  ComputeContext(const ComputeContext&) = delete;
  ComputeContext& operator=(const ComputeContext&) = delete;

  Device device() const { return device_; }
  // The calling thread's own host context: the default of every kernel that takes a context.
  static ComputeContext& host();

  // The calling OpenMP thread's T in this context (the compute thread's own outside a parallel region), made on
  // first use. Each kernel file keeps its state in a type of its own.
  template <typename T> T& state() {
    std::shared_ptr<void>& p = slot_state(kind_of<T>());
    if (!p) p = std::make_shared<T>();
    return *static_cast<T*>(p.get());
  }

 private:
  struct Slot {
    std::vector<std::shared_ptr<void>> by_kind;
  };
  static int new_kind();
  template <typename T> static int kind_of() {
    static const int k = new_kind();
    return k;
  }
  std::shared_ptr<void>& slot_state(int kind);

  Device device_;
  std::mutex mu_;                             // guards slots_ (the threads of a team find their slots at once)
  std::vector<std::unique_ptr<Slot>> slots_;  // [OpenMP thread number]
};

}  // namespace ampipe::kernels
