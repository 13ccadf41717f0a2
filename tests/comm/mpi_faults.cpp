// Collective safety inside one job: --check-collectives mismatches fail on every rank with the same message,
// a failed op fails the ops that come `after` it, and a timed-out wait names the op and leaves the job usable.
// (A dead or stuck peer ending the whole job is tested by comm_fault_driver, registered in tests/CMakeLists.txt.)
#include <gtest/gtest.h>

#include <thread>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "comm/comm_fixture.h"

using namespace ampipe;
using namespace ampipe::comm;
using ampipe::comm::testing::groups;
using namespace std::chrono_literals;

namespace {
struct CheckMode {
  CheckMode() { Runtime::current().set_check_collectives(true); }
  ~CheckMode() { Runtime::current().set_check_collectives(false); }
};

std::string error_of(const Event& e) {
  try {
    e.wait(30s);
  } catch (const CommError& err) {
    return err.what();
  }
  return "no error";
}
}  // namespace

TEST(Faults, MismatchedOpFailsOnEveryRank) {
  const Group& g = groups().world;
  CheckMode on;
  Tensor t = Tensor::zeros({8}), big = Tensor::zeros({8 * g.size()});
  Event e = g.rank() == 0 ? all_reduce(g, t, Reduce::sum, "L0.fwd.x") : all_gather(g, t, big, "L0.fwd.x");
  std::string m = error_of(e);
  EXPECT_NE(m.find("collective mismatch on group " + g.label()), std::string::npos) << m;
  EXPECT_NE(m.find("seq=" + std::to_string(e.info().seq)), std::string::npos) << m;
  EXPECT_NE(m.find("(world 0): all_reduce"), std::string::npos) << m;
  EXPECT_NE(m.find("(world 1): all_gather"), std::string::npos) << m;
  std::string differ = "world ranks [1";
  EXPECT_NE(m.find(differ), std::string::npos) << m;
  EXPECT_TRUE(e.failed());
  // The mismatched op started nowhere, so the group stays usable.
  t.fill(1.0f);
  all_reduce(g, t, Reduce::sum, "after.mismatch").wait(30s);
  EXPECT_EQ(t.get(0), float(g.size()));
}

TEST(Faults, MismatchedTagOrSizeIsCaught) {
  const Group& g = groups().ep;
  CheckMode on;
  Tensor t = Tensor::zeros({g.rank() == 0 ? 8 : 9});
  std::string m = error_of(all_reduce(g, t, Reduce::sum, "tag"));
  EXPECT_NE(m.find("collective mismatch on group ep["), std::string::npos) << m;
  EXPECT_NE(m.find("bytes=32"), std::string::npos) << m;
  EXPECT_NE(m.find("bytes=36"), std::string::npos) << m;
  Tensor u = Tensor::zeros({4});
  m = error_of(all_reduce(g, u, Reduce::sum, g.rank() == 0 ? "L1.bwd.a" : "L1.bwd.b"));
  EXPECT_NE(m.find("tag \"L1.bwd.a\""), std::string::npos) << m;
  EXPECT_NE(m.find("tag \"L1.bwd.b\""), std::string::npos) << m;
}

// --check-collectives compares element counts and dtypes; for an all_to_all, whose per-rank sizes legitimately
// differ, what each rank sends must be what its peer expects (ranks with different shapes used to reach MPI's
// truncation error).
TEST(Faults, MismatchedCountsOrDtypesAreCaught) {
  const Group& g = groups().ep;
  CheckMode on;
  const int n = g.size();
  SplitCounts c{std::vector<int64_t>(size_t(n), 2), std::vector<int64_t>(size_t(n), 2)};
  if (g.rank() == 0) c.recv[1] = 3;  // rank 0 expects 3 elements from group rank 1, which sends 2
  Tensor send = Tensor::zeros({2 * n}), recv = Tensor::zeros({2 * n + 1});
  std::string m = error_of(all_to_all(g, send, recv, c, "L0.fwd.dispatch.c0"));
  const std::string expect = fmt::format("all_to_all counts disagree on group {} at seq=", g.label());
  EXPECT_NE(m.find(expect), std::string::npos) << m;
  EXPECT_NE(m.find(fmt::format("world rank {} sends 2 elements to world rank {}, which expects 3 from it",
                               g.members()[1], g.members()[0])),
            std::string::npos)
      << m;
  // Same bytes, other dtype and element count: 8 f32 against 16 bf16.
  Tensor t = g.rank() == 0 ? Tensor::zeros({8}) : Tensor::zeros({16}, DType::bf16);
  m = error_of(all_reduce(g, t, Reduce::sum, "dtype"));
  EXPECT_NE(m.find("elements=8 bytes=32 dtype=f32"), std::string::npos) << m;
  EXPECT_NE(m.find("elements=16 bytes=32 dtype=bf16"), std::string::npos) << m;
  // Agreeing counts still run.
  SplitCounts ok{std::vector<int64_t>(size_t(n), 2), std::vector<int64_t>(size_t(n), 2)};
  Tensor s2 = Tensor::zeros({2 * n}), r2 = Tensor::zeros({2 * n});
  s2.fill(1.0f);
  all_to_all(g, s2, r2, ok, "L0.fwd.dispatch.ok").wait(30s);
  EXPECT_EQ(r2.get(2 * n - 1), 1.0f);
}

TEST(Faults, FailedAfterEventFailsTheDependentOp) {
  const Group& g = groups().world;
  CheckMode on;
  Tensor t = Tensor::zeros({4});
  Event bad = all_reduce(g, t, g.rank() == 0 ? Reduce::sum : Reduce::sum, g.rank() == 0 ? "x" : "y");
  Tensor u = Tensor::zeros({4});
  Event dep = all_reduce(g, u, Reduce::sum, "dependent", {.after = {bad}, .lane = Lane::ep});
  std::string m = error_of(dep);
  EXPECT_NE(m.find("not started: its `after` event all_reduce"), std::string::npos) << m;
  EXPECT_TRUE(bad.failed());
}

TEST(Faults, TimedOutWaitNamesTheOpAndTheJobGoesOn) {
  const Group& g = groups().ep;
  const int peer = 1 - g.rank();
  Tensor t = Tensor::zeros({16});
  if (g.rank() == 0) {
    Event r = recv(g, t, peer, "late.msg", {.lane = Lane::tp});
    std::string m;
    try {
      r.wait(200ms);
    } catch (const CommError& e) {
      m = e.what();
    }
    EXPECT_NE(m.find("rank " + std::to_string(Runtime::current().rank()) +
                     ": timed out after 200 ms waiting for recv seq="),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("on group " + g.label() + " peer 1 (64 B), tag late.msg, lane tp"), std::string::npos) << m;
    EXPECT_NE(m.find("last completed on this group: "), std::string::npos) << m;
    r.wait(30s);  // the sender arrives later; the same event completes
    EXPECT_TRUE(r.ready());
  } else {
    std::this_thread::sleep_for(600ms);
    t.fill(3.0f);
    send(g, t, peer, "late.msg", {.lane = Lane::tp}).wait(30s);
  }
}
