// Shared by the comm MPI tests: this rank's groups for the layout tp = 1, cp = 1, ep = 2 (world 2 or 4), created
// on first use, which every test does before its first op (groups must exist before the engine starts).
#pragma once

#include "ampipe/comm/runtime.h"

namespace ampipe::comm::testing {

inline const Groups& groups() {
  static Groups g = [] {
    Runtime& rt = Runtime::current();
    return rt.make_groups(Layout::make(rt.size(), 1, 1, rt.size() % 2 == 0 ? 2 : 1));
  }();
  return g;
}

}  // namespace ampipe::comm::testing
