#include "ampipe/comm/runtime.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#include "ampipe/comm/mpi_detail.h"
#include "ampipe/comm/trace.h"
#include "ampipe/core/error.h"

namespace ampipe::comm {

namespace {
Runtime* g_runtime = nullptr;

Lane default_lane_for(GroupKind k) {
  switch (k) {
    case GroupKind::ep: return Lane::ep;
    case GroupKind::tp: return Lane::tp;
    case GroupKind::cp: return Lane::cp;
    default: return Lane::dp;
  }
}

// A group over `comm` (whose ranks are `members`, in order): duplicates one communicator per communication lane
// and a debug one; `comm` itself stays the caller's.
std::shared_ptr<GroupState> new_group(GroupKind kind, std::vector<int> members, MPI_Comm comm, int world_rank,
                                      Engine* engine) {
  AMPIPE_CHECK(!engine->running(),
               "rank {}: groups must be created before the first communication op starts the engine", world_rank);
  auto g = std::make_shared<GroupState>();
  g->kind = kind;
  g->label = group_label(kind, members);
  g->members = std::move(members);
  MPI_Comm_rank(comm, &g->rank);
  int sz = 0;
  MPI_Comm_size(comm, &sz);
  AMPIPE_CHECK(sz == int(g->members.size()), "group {}: communicator size {} vs {} members", g->label, sz,
               g->members.size());
  AMPIPE_CHECK(g->members[size_t(g->rank)] == world_rank, "group {}: rank {} at position {}", g->label, world_rank,
               g->rank);
  g->default_lane = default_lane_for(kind);
  g->comms = std::make_unique<GroupComms>();
  for (Lane l : kCommLanes) {
    MPI_Comm& c = g->comms->lane[size_t(lane_index(l))];
    MPI_Comm_dup(comm, &c);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  }
  MPI_Comm_dup(comm, &g->comms->debug);
  g->engine = engine;
  return g;
}
}  // namespace

std::chrono::milliseconds default_timeout() {
  return g_runtime ? g_runtime->options().comm_timeout : std::chrono::milliseconds(300'000);
}

Runtime& Runtime::current() {
  AMPIPE_CHECK(g_runtime != nullptr, "no comm::Runtime: construct one in main before using comm");
  return *g_runtime;
}
bool Runtime::exists() { return g_runtime != nullptr; }

Runtime::Runtime(int* argc, char*** argv, RuntimeOptions opts) : opts_(opts) {
  AMPIPE_CHECK(g_runtime == nullptr, "a comm::Runtime already exists");
  int inited = 0;
  MPI_Initialized(&inited);
  AMPIPE_CHECK(!inited, "MPI was initialised before comm::Runtime");
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw CommError(fmt::format(
        "MPI_Init_thread granted thread level {} but ampipe needs MPI_THREAD_MULTIPLE ({}): the communication "
        "engine thread calls MPI while the main thread runs; use an MPI built with thread support (OpenMPI 4.1 "
        "and MPICH 4.0 on these machines grant it)", provided, MPI_THREAD_MULTIPLE));
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  engine_ = std::make_unique<Engine>(rank_, EngineOptions{opts_.poll_interval, opts_.lane_depth});
  std::vector<int> all(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) all[size_t(r)] = r;
  groups_.push_back(new_group(GroupKind::world, all, MPI_COMM_WORLD, rank_, engine_.get()));
  world_ = Group(groups_.back());
  Trace::set_enabled(opts_.trace);
  MPI_Barrier(MPI_COMM_WORLD);
  Trace::set_origin(std::chrono::steady_clock::now());
  g_runtime = this;
}

Runtime::~Runtime() {
  bool drained = engine_->stop(opts_.comm_timeout);
  if (!drained) {
    std::fprintf(stderr, "rank %d: %zu communication ops still unfinished at shutdown after %lld ms; aborting\n",
                 rank_, engine_->pending(), static_cast<long long>(opts_.comm_timeout.count()));
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  g_runtime = nullptr;
  for (auto& g : groups_) {
    if (!g->comms) continue;
    for (MPI_Comm& c : g->comms->lane)
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    if (g->comms->debug != MPI_COMM_NULL) MPI_Comm_free(&g->comms->debug);
  }
  MPI_Finalize();
}

void Runtime::set_poll_interval(std::chrono::microseconds us) {
  opts_.poll_interval = us;
  engine_->set_poll_interval(us);
}

Groups Runtime::make_groups(const Layout& layout) {
  AMPIPE_CHECK(layout.world == size_, "layout for world {} on a world of {} ranks", layout.world, size_);
  // Ranks started with different parallel sizes would split the world into groups of different shapes: refused on
  // every rank with one line (MPI_Allgather is as blocking as the splits below; the engine has not started).
  const int mine[3] = {layout.tp, layout.cp, layout.ep};
  std::vector<int> all(size_t(3 * size_));
  MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, MPI_COMM_WORLD);
  static constexpr const char* kFlags[3] = {"--tensor-model-parallel-size", "--context-parallel-size",
                                            "--expert-model-parallel-size"};
  for (int r = 1; r < size_; ++r)
    for (int k = 0; k < 3; ++k)
      if (all[size_t(3 * r + k)] != all[size_t(k)])
        throw ConfigError(fmt::format("the ranks were started with different settings: {} (rank 0: {}, rank {}: {}); "
                                      "every rank must get the same flags and --config",
                                      kFlags[k], all[size_t(k)], r, all[size_t(3 * r + k)]));
  Groups out;
  out.layout = layout;
  out.world = world_;
  auto make = [&](GroupKind k) {
    MPI_Comm c;
    MPI_Comm_split(MPI_COMM_WORLD, layout.group_index(k, rank_), layout.position(k, rank_), &c);
    groups_.push_back(new_group(k, layout.members(k, rank_), c, rank_, engine_.get()));
    MPI_Comm_free(&c);
    return Group(groups_.back());
  };
  out.tp = make(GroupKind::tp);
  out.cp = make(GroupKind::cp);
  out.dp = make(GroupKind::dp);
  out.dp_cp = make(GroupKind::dp_cp);
  out.ep = make(GroupKind::ep);
  out.edp = make(GroupKind::edp);
  return out;
}

void Runtime::abort(const std::string& message, int code) {
  std::fprintf(stderr, "%s%s\n", message.rfind("rank ", 0) == 0 ? "" : fmt::format("rank {}: ", rank_).c_str(),
               message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace ampipe::comm
