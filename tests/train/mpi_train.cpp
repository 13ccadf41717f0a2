// Multi-rank trainer tests (mpirun -np 2 and 4): expert parallelism (EP = 2, and 4 where there are 4 ranks) equals
// EP = 1 with the same data-parallel ranks, with AMPipe degree 1 and 2 (losses and final weights, fp32,
// tensor-norm relative error 1e-5: only summation orders differ); a checkpoint saved with EP = 2 resumes with
// EP = 1 (and degree 1) as the uninterrupted run.
#include <gtest/gtest.h>

#include <filesystem>

#include "ampipe/comm/collectives.h"
#include "train/train_harness.h"

using namespace ampipe;
using namespace ampipe::testing;

namespace {

// Groups for every EP size, created together before the first operation.
const comm::Groups& groups_for(int ep) {
  static std::map<int, comm::Groups> all;
  if (all.empty()) {
    comm::Runtime& rt = comm::Runtime::current();
    for (int e = 1; e <= rt.size(); e *= 2) all.emplace(e, rt.make_groups(comm::Layout::make(rt.size(), 1, 1, e)));
  }
  return all.at(ep);
}

train::TrainConfig mpi_config(int ep, int M) {
  train::TrainConfig c = tiny_config();
  c.train_iters = 6;
  c.layer.expert_model_parallel_size = ep;
  c.ampipe_degree = M;
  return c;
}

}  // namespace

TEST(MpiTrainer, ExpertParallelEqualsOneExpertRank) {
  const int world = comm::Runtime::current().size();
  groups_for(1);
  const RunResult ref = run_training(mpi_config(1, 1), groups_for(1));
  for (int ep = 2; ep <= world; ep *= 2)
    for (int M : ep == 2 ? std::vector<int>{1, 2} : std::vector<int>{2}) {
      SCOPED_TRACE("ep " + std::to_string(ep) + " ampipe degree " + std::to_string(M));
      expect_same_run(run_training(mpi_config(ep, M), groups_for(ep)), ref, 1e-5);
    }
}

TEST(MpiTrainer, CheckpointOfEp2ResumesWithEp1) {
  const std::string dir = (std::filesystem::temp_directory_path() / "ampipe_mpi_train_ckpt").string();
  comm::Runtime& rt = comm::Runtime::current();
  if (rt.rank() == 0) std::filesystem::remove_all(dir);
  comm::barrier_sync(groups_for(1).world);
  const RunResult full = run_training(mpi_config(1, 1), groups_for(1));
  train::TrainConfig first = mpi_config(2, 2);
  first.save = dir;
  first.exit_interval = 3;
  run_training(first, groups_for(2));
  train::TrainConfig second = mpi_config(1, 1);
  second.load = dir;
  const RunResult tail = run_training(second, groups_for(1));
  ASSERT_EQ(tail.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE(std::abs(tail.losses[i] - full.losses[3 + i]) / full.losses[3 + i], 1e-5) << "iteration " << 4 + i;
  for (const auto& [name, w] : full.weights) EXPECT_LE(rel_err(tail.weights.at(name), w), 1e-5) << name;
  comm::barrier_sync(groups_for(1).world);
  if (rt.rank() == 0) std::filesystem::remove_all(dir);
}
