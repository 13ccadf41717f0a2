// overlap_bench: does the communication engine hide an all-to-all behind GEMMs? Run on 2 ranks, ideally across a
// rate-limited link (bench/overlap/run_overlap.sh); on shared memory the copy is CPU work and cannot hide.
//
// Per trial (all in one run, docs/design.md "How we measure"):
//   a2a alone      R all_to_alls (uneven counts, half the payload to the peer) issued on the ep lane, then waited
//   gemm alone     the GEMM loop with the engine idle
//   gemm + poll    the GEMM loop while the engine polls an outstanding recv (cost of MPI_Test + sleep polling)
//   together       issue the R all_to_alls, run the GEMM loop, wait for them
// Prints medians over trials and the ratios: together / max(alone) (target <= 1.1) and gemm+poll / gemm alone
// (target <= 1.10).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/parallel.h"
#include "ampipe/kernels/gemm.h"

using namespace ampipe;
using namespace ampipe::comm;
using Clock = std::chrono::steady_clock;

namespace {
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 8, iters = 8, trials = 3, poll_us = 100, m = 256, n = 1024, k = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int64_t v = std::atoll(argv[i + 1]);
    if (a == "--mib") mib = v;
    else if (a == "--iters") iters = v;
    else if (a == "--trials") trials = v;
    else if (a == "--poll-us") poll_us = v;
    else if (a == "--m") m = v;
    else { std::fprintf(stderr, "unknown flag %s (--mib --iters --trials --poll-us --m)\n", a.c_str()); return 2; }
  }
  RuntimeOptions opts;
  opts.poll_interval = std::chrono::microseconds(poll_us);
  opts.comm_timeout = std::chrono::seconds(600);
  opts.trace = false;
  Runtime rt(&argc, &argv, opts);
  try {
    Groups g = rt.make_groups(Layout::make(rt.size(), 1, 1, rt.size()));
    const Group& ep = g.ep;
    const int P = ep.size(), me = ep.rank();
    set_num_threads(1);

    // all_to_all payload: mib MiB fp32 per rank, uneven: 1/3 kept, the rest split over the peers (+-20%).
    const int64_t total = mib * (1 << 20) / 4;
    SplitCounts c;
    for (int j = 0; j < P; ++j) {
      auto cnt = [&](int s, int d) -> int64_t {
        if (s == d) return total / 3;
        int64_t off = total - total / 3;
        return off / (P - 1) * (10 + (s + d) % 3 - 1) / 10;
      };
      c.send.push_back(cnt(me, j));
      c.recv.push_back(cnt(j, me));
    }
    int64_t ssum = 0, rsum = 0, offrank = 0;
    for (int j = 0; j < P; ++j) {
      ssum += c.send[size_t(j)];
      rsum += c.recv[size_t(j)];
      if (j != me) offrank += c.send[size_t(j)];
    }
    std::vector<Tensor> sends, recvs;
    for (int64_t i = 0; i < iters; ++i) {
      sends.push_back(Tensor::empty({ssum}));
      sends.back().fill(1.0f);
      recvs.push_back(Tensor::empty({rsum}));
    }
    auto a2a_issue = [&]() {
      std::vector<Event> ev;
      for (int64_t i = 0; i < iters; ++i)
        ev.push_back(all_to_all(ep, sends[size_t(i)], recvs[size_t(i)], c, fmt::format("a2a.{}", i), {.chunk = int(i)}));
      return ev;
    };

    Tensor A = Tensor::empty({m, k}), B = Tensor::empty({k, n}), C = Tensor::empty({m, n});
    A.fill(0.5f);
    B.fill(0.25f);
    auto gemm_loop = [&](int64_t reps) {
      auto t0 = Clock::now();
      for (int64_t r = 0; r < reps; ++r) kernels::gemm(A, kernels::Trans::n, B, kernels::Trans::n, C);
      return secs(t0, Clock::now());
    };

    // Calibrate: GEMM repetitions so that the GEMM loop takes about as long as the all-to-alls alone.
    gemm_loop(3);
    barrier_sync(g.world);
    auto t0 = Clock::now();
    wait_all(a2a_issue());
    double a2a_probe = secs(t0, Clock::now());
    double one = gemm_loop(5) / 5;
    int64_t reps = all_reduce_max(g.world, std::max<int64_t>(1, int64_t(a2a_probe / one)), "calibrate");

    std::vector<double> t_a2a, t_gemm, t_poll, t_tog, t_tog_gemm, t_exposed;
    for (int64_t trial = 0; trial < trials; ++trial) {
      barrier_sync(g.world);
      t0 = Clock::now();
      wait_all(a2a_issue());
      t_a2a.push_back(secs(t0, Clock::now()));

      barrier_sync(g.world);
      t_gemm.push_back(gemm_loop(reps));

      // Polling cost: a recv the peer satisfies only after its own GEMM loop (one lane per direction).
      barrier_sync(g.world);
      {
        const int peer = (me + 1) % P, from = (me + P - 1) % P;
        Tensor in = Tensor::zeros({16}), out = Tensor::zeros({16});
        Lane rl = me == 0 ? Lane::tp : Lane::cp, sl = me == 0 ? Lane::cp : Lane::tp;
        if (P != 2) rl = sl = Lane::tp;  // ring on one lane for P > 2 would block; P == 2 is the benchmark
        Event r = recv(ep, in, from, "poll.recv", {.lane = rl});
        t_poll.push_back(gemm_loop(reps));
        Event s = send(ep, out, peer, "poll.send", {.lane = sl});
        r.wait();
        s.wait();
      }

      barrier_sync(g.world);
      t0 = Clock::now();
      auto ev = a2a_issue();
      t_tog_gemm.push_back(gemm_loop(reps));
      auto tw = Clock::now();
      wait_all(ev);
      auto t1 = Clock::now();
      t_tog.push_back(secs(t0, t1));
      t_exposed.push_back(secs(tw, t1));
    }
    double a = median(t_a2a), gm = median(t_gemm), gp = median(t_poll), tg = median(t_tog),
           tgg = median(t_tog_gemm), ex = median(t_exposed);
    // Rank 0's view plus the max over ranks of the key times.
    auto worst = [&](double v) {
      return double(all_reduce_max(g.world, int64_t(v * 1e6), "max")) / 1e6;
    };
    double A_ = worst(a), G_ = worst(gm), P_ = worst(gp), T_ = worst(tg), TG_ = worst(tgg), E_ = worst(ex);
    if (rt.rank() == 0) {
      double mb = double(offrank) * 4 * double(iters) / 1e6;
      std::printf("overlap_bench: %d ranks, %lld x all_to_all of %lld MiB/rank (%.1f MB off-rank per rank), "
                  "%lld x GEMM %lldx%lldx%lld fp32 (1 thread), poll %lld us, median of %lld trials, max over ranks\n",
                  rt.size(), (long long)iters, (long long)mib, mb, (long long)reps, (long long)m, (long long)n,
                  (long long)k, (long long)poll_us, (long long)trials);
      std::printf("  %-28s %9.3f s  (%.1f MB/s off-rank per rank)\n", "all_to_all alone", A_, mb / A_);
      std::printf("  %-28s %9.3f s  (%.1f GFLOP/s)\n", "gemm alone", G_, 2.0 * m * n * k * reps / G_ / 1e9);
      std::printf("  %-28s %9.3f s\n", "gemm while engine polls", P_);
      std::printf("  %-28s %9.3f s  (gemm part %.3f s, exposed wait %.3f s)\n", "together", T_, TG_, E_);
      std::printf("  %-28s %9.3f s\n", "serial (a2a + gemm)", A_ + G_);
      double ratio = T_ / std::max(A_, G_);
      double slow = P_ / G_ - 1.0;
      double hidden = (A_ + G_ - T_) / std::min(A_, G_);
      std::printf("  together / max(alone)   = %.3f  (target <= 1.10) %s\n", ratio, ratio <= 1.10 ? "OK" : "MISSED");
      std::printf("  gemm slowdown (polling) = %+.1f%% (target <= 10%%) %s\n", 100 * slow, slow <= 0.10 ? "OK" : "MISSED");
      std::printf("  gemm slowdown (together)= %+.1f%%\n", 100 * (TG_ / G_ - 1.0));
      std::printf("  hidden fraction         = %.2f\n", hidden);
    }
  } catch (const std::exception& e) {
    rt.abort(e.what());
  }
  return 0;
}
