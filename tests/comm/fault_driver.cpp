// comm_fault_driver MODE: a whole-job fault, run by CTest under mpirun (tests/CMakeLists.txt, "comm fault tests").
//   stuck     rank 1 stops participating (sleeps 60 s); the others' wait times out after --comm-timeout 3 s, prints
//             the op/group/rank and MPI_Aborts, so the job ends within seconds.
//   exit      rank 1 exits without MPI_Finalize; the job must end (mpirun or our timeout), never hang.
//   mismatch  ranks issue different collectives with --check-collectives; every rank reports the mismatch, then the
//             ranks confirm to each other that all of them saw it and rank 0 prints a summary.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <unistd.h>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"

using namespace ampipe;
using namespace ampipe::comm;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  RuntimeOptions opts;
  opts.comm_timeout = 3s;
  opts.check_collectives = mode == "mismatch";
  Runtime rt(&argc, &argv, opts);
  try {
    Groups g = rt.make_groups(Layout::make(rt.size(), 1, 1, 1));
    Tensor t = Tensor::zeros({1024});
    all_reduce(g.world, t, Reduce::sum, "warmup").wait();
    if (mode == "stuck" || mode == "exit") {
      if (rt.rank() == 1) {
        if (mode == "exit") _exit(0);
        std::this_thread::sleep_for(60s);
      }
      all_reduce(g.world, t, Reduce::sum, "L0.fwd.dispatch.c0").wait();
      std::printf("rank %d: unexpectedly completed\n", rt.rank());
      return 0;
    }
    if (mode == "mismatch") {
      Tensor big = Tensor::zeros({1024 * rt.size()});
      Event e = rt.rank() == rt.size() - 1 ? all_gather(g.world, t, big, "L2.bwd.combine.c1")
                                             : all_reduce(g.world, t, Reduce::sum, "L2.bwd.combine.c1");
      int saw = 0;
      try {
        e.wait();
      } catch (const CommError& err) {
        std::fprintf(stderr, "%s\n", err.what());
        saw = 1;
      }
      Tensor n = Tensor::from({float(saw)}, {1});
      all_reduce_sync(g.world, n, Reduce::sum, "confirm");
      if (rt.rank() == 0)
        std::fprintf(stderr, "%d of %d ranks reported the collective mismatch\n", int(n.get(0)), rt.size());
      return int(n.get(0)) == rt.size() ? 1 : 3;
    }
    std::fprintf(stderr, "usage: comm_fault_driver stuck|exit|mismatch\n");
    return 2;
  } catch (const CommError& e) {
    rt.abort(e.what());
  }
}
