// main() of every tests/<module>/mpi_*.cpp binary (run by CTest under mpirun -np 2 and -np 4).
//
// Initialises comm::Runtime (MPI_THREAD_MULTIPLE), runs every test on every rank, keeps gtest's output on rank 0
// only (other ranks print just their failures, prefixed with the rank), and makes the exit code non-zero on every
// rank when any rank failed (the results are all-reduced with MAX through the engine).
// Extra flags: --check-collectives, --comm-timeout SECONDS (as the CLI will have them).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ampipe::comm::RuntimeOptions opts;
  std::unique_ptr<ampipe::comm::Runtime> rt;
  try {
    rt = std::make_unique<ampipe::comm::Runtime>(&argc, &argv, opts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--check-collectives") == 0) rt->set_check_collectives(true);
    if (std::strcmp(argv[i], "--comm-timeout") == 0 && i + 1 < argc)
      rt->set_comm_timeout(std::chrono::milliseconds(int64_t(std::atof(argv[++i]) * 1000)));
  }
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rt->rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rt->rank()));
  }
  int failed = 0;
  try {
    failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    failed = int(ampipe::comm::all_reduce_max(rt->world(), failed, "gtest.result"));
  } catch (const std::exception& e) {
    rt->abort(e.what());
  }
  if (failed && rt->rank() == 0) std::fprintf(stderr, "some rank failed a test (see [rank N] lines above)\n");
  rt.reset();
  return failed;
}
