// Context parallelism in the trainer (mpirun -np 2 and 4): cp 2 with AMPipe degree 2 trains as cp 1 over 20
// iterations (losses, aux losses, gradient norms and final weights, fp32, relative 1e-5: only summation orders
// differ), with expert
// parallelism across the cp ranks, and on 4 ranks with data parallelism (cp 2 x dp 2), EP inside dp x cp, tensor
// parallelism with sequence parallelism (cp 2 x tp 2) and cp 4; a degree changed between steps re-shards the
// embedding and head rows; checkpoints load across cp sizes both ways (saved at cp 2, resumed at cp 1 with the
// losses of the uninterrupted run, and back). No token drops (capacity factor 8 covers every token): routing is per
// chunk of a rank's rows, so with drops the kept tokens would legitimately depend on the layout. Dropout on: its
// random numbers are keyed by the token's global index, so cp must not change them.
#include <gtest/gtest.h>

#include <filesystem>
#include <tuple>

#include "ampipe/comm/collectives.h"
#include "train/train_harness.h"

using namespace ampipe;
using namespace ampipe::testing;

namespace {

// Groups for every (tp, cp, ep) layout of the world, created together before the first operation.
const comm::Groups& groups_for(int tp, int cp, int ep) {
  static std::map<std::tuple<int, int, int>, comm::Groups> all;
  if (all.empty()) {
    comm::Runtime& rt = comm::Runtime::current();
    const int w = rt.size();
    for (int t = 1; t <= w; t *= 2)
      for (int c = 1; t * c <= w; c *= 2)
        for (int e = 1; e <= w / t; e *= 2)
          if ((w / t) % e == 0) all.emplace(std::tuple{t, c, e}, rt.make_groups(comm::Layout::make(w, t, c, e)));
  }
  return all.at({tp, cp, ep});
}

// s 32 (divisible by 2 x cp 4 x degree 2, and by 2 x cp 2 x degree 2 x tp 2), h 32; the global batch fixed (2
// sequences per rank of the world) so that every layout sees the same batches.
train::TrainConfig cp_config(int cp, int M, int iters, int tp = 1, int ep = 1) {
  train::TrainConfig c = tiny_config();
  model::LayerConfig& l = c.layer;
  l.seq_length = 32;
  l.hidden_size = 32;
  l.ffn_hidden_size = 32;
  l.num_attention_heads = 4;
  l.moe_train_capacity_factor = 8.0;
  l.context_parallel_size = cp;
  l.tensor_model_parallel_size = tp;
  l.sequence_parallel = tp > 1;
  l.ampipe_tp_sp_comm_overlap = tp > 1 && M > 1;
  l.expert_model_parallel_size = ep;
  c.ampipe_degree = M;
  c.train_iters = iters;
  c.global_batch_size = 2 * comm::Runtime::current().size();
  return c;
}

const comm::Groups& groups_of(const train::TrainConfig& c) {
  return groups_for(c.layer.tp(), c.layer.cp(), c.layer.expert_model_parallel_size);
}

// run_training's losses and weights, plus the aux loss and the gradient norm of every iteration (the aux loss is
// the whole sequence's on every cp rank, the norm must count every parameter once).
struct CpRun : RunResult {
  std::vector<double> aux, grad_norm;
};
CpRun run(const train::TrainConfig& c) {
  c.validate(groups_of(c).world.size());
  train::Trainer t(c, groups_of(c), corpus_data(c));
  t.maybe_load();
  CpRun out;
  for (const auto& it : t.train().iterations) {
    out.losses.push_back(it.lm_loss);
    out.aux.push_back(it.aux_loss);
    out.grad_norm.push_back(it.grad_norm);
  }
  out.weights = t.full_params();
  return out;
}

void expect_same_cp_run(const CpRun& got, const CpRun& ref, double tol) {
  expect_same_run(got, ref, tol);
  ASSERT_EQ(got.aux.size(), ref.aux.size());
  for (size_t i = 0; i < ref.aux.size(); ++i) {
    EXPECT_LE(std::abs(got.aux[i] - ref.aux[i]) / std::abs(ref.aux[i]), tol) << "aux loss of iteration " << i + 1;
    EXPECT_LE(std::abs(got.grad_norm[i] - ref.grad_norm[i]) / std::abs(ref.grad_norm[i]), tol)
        << "grad norm of iteration " << i + 1;
  }
}

}  // namespace

TEST(MpiTrainerContextParallel, Cp2TrainsAsOneCpRank) {
  const int world = comm::Runtime::current().size();
  groups_for(1, 1, 1);
  const CpRun ref = run(cp_config(1, 1, 20));
  {
    SCOPED_TRACE("cp 2, degree 2");
    expect_same_cp_run(run(cp_config(2, 2, 20)), ref, 1e-5);
  }
  if (world == 2) {
    SCOPED_TRACE("cp 2 x ep 2 (the experts across the cp ranks), degree 2");
    expect_same_cp_run(run(cp_config(2, 2, 20, 1, 2)), ref, 1e-5);
  }
  if (world >= 4) {
    {
      SCOPED_TRACE("cp 2 x dp 2 x ep 2, degree 2");
      expect_same_cp_run(run(cp_config(2, 2, 20, 1, 2)), ref, 1e-5);
    }
    {
      SCOPED_TRACE("cp 2 x tp 2, sequence parallel, degree 2, tp overlap");
      expect_same_cp_run(run(cp_config(2, 2, 20, 2, 1)), ref, 1e-5);
    }
    {
      SCOPED_TRACE("cp 4, degree 2");
      expect_same_cp_run(run(cp_config(4, 2, 20)), ref, 1e-5);
    }
  }
}

TEST(MpiTrainerContextParallel, DegreeChangedBetweenStepsReshardsTheRows) {
  // The cp rows of the embedding and head follow the stack's degree: 3 steps at degree 2, then degree 1 and 4.
  if (comm::Runtime::current().size() != 2) GTEST_SKIP() << "the 2-rank run covers it (cp 2)";
  groups_for(1, 1, 1);
  const CpRun ref = run(cp_config(1, 1, 9));
  const train::TrainConfig c = cp_config(2, 2, 9);
  c.validate(2);
  train::Trainer t(c, groups_of(c), corpus_data(c));
  CpRun got;
  for (int M : {2, 1, 4}) {
    t.model().set_degree(M);
    for (const auto& it : t.train(nullptr, 3).iterations) {
      got.losses.push_back(it.lm_loss);
      got.aux.push_back(it.aux_loss);
      got.grad_norm.push_back(it.grad_norm);
    }
  }
  got.weights = t.full_params();
  expect_same_cp_run(got, ref, 1e-5);
}

TEST(MpiTrainerContextParallel, CheckpointsLoadAcrossContextParallelSizes) {
  comm::Runtime& rt = comm::Runtime::current();
  if (rt.size() != 2) GTEST_SKIP() << "the 2-rank run covers it (cp 2 and cp 1 x dp 2)";
  groups_for(1, 1, 1);
  const CpRun full = run(cp_config(1, 1, 6));
  for (const auto& [save_cp, load_cp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    SCOPED_TRACE(fmt::format("saved at cp {}, resumed at cp {}", save_cp, load_cp));
    const std::string dir = (std::filesystem::temp_directory_path() / "ampipe_mpi_train_cp_ckpt").string();
    if (rt.rank() == 0) std::filesystem::remove_all(dir);
    comm::barrier_sync(groups_for(1, 1, 1).world);
    train::TrainConfig first = cp_config(save_cp, 2, 6);
    first.save = dir;
    first.exit_interval = 3;
    run(first);
    train::TrainConfig second = cp_config(load_cp, 2, 6);
    second.load = dir;
    const CpRun tail = run(second);
    ASSERT_EQ(tail.losses.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_LE(std::abs(tail.losses[i] - full.losses[3 + i]) / full.losses[3 + i], 1e-5) << "iteration " << 4 + i;
    for (const auto& [name, w] : full.weights) EXPECT_LE(rel_err(tail.weights.at(name), w), 1e-5) << name;
    comm::barrier_sync(groups_for(1, 1, 1).world);
    if (rt.rank() == 0) std::filesystem::remove_all(dir);
  }
}
