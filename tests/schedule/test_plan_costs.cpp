// The costs a Plan carries against the closed forms of docs/plan.md, recomputed here independently in double (no
// call to model::stage_flops, model::collective_bytes or model::gate_capacity): FLOPs per task and in total,
// all-to-all bytes per task and in total, lanes, and the planned memory of the capacity-dependent buffers.
// Plans are built from shapes alone: no MPI, no parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ampipe/schedule/plan.h"

using namespace ampipe;
using namespace ampipe::schedule;

namespace {

struct Case {
  int M = 1;
  int64_t s = 64, b = 1, h = 64, F = 256, n = 4, E = 4;
  int k = 2;
  int ep = 1;
  double cf = 1.0;
  int64_t min_cap = 4;
  bool bf16 = false, swiglu = false, no_drop = false;
  std::string label() const {
    return "M=" + std::to_string(M) + " s=" + std::to_string(s) + " b=" + std::to_string(b) + " h=" +
           std::to_string(h) + " E=" + std::to_string(E) + " k=" + std::to_string(k) + " ep=" + std::to_string(ep) +
           " cf=" + std::to_string(cf) + " min=" + std::to_string(min_cap) + (bf16 ? " bf16" : " fp32") +
           (swiglu ? " swiglu" : " gelu") + (no_drop ? " no-drop" : "");
  }
};

model::LayerConfig config(const Case& c) {
  model::LayerConfig cfg;
  cfg.seq_length = c.s;
  cfg.micro_batch_size = c.b;
  cfg.hidden_size = c.h;
  cfg.ffn_hidden_size = c.F;
  cfg.num_attention_heads = c.n;
  cfg.num_experts = c.E;
  cfg.moe_router_topk = c.k;
  cfg.moe_train_capacity_factor = c.cf;
  cfg.moe_min_capacity = c.min_cap;
  cfg.moe_no_drop = c.no_drop;
  cfg.bf16 = c.bf16;
  cfg.expert = c.swiglu ? model::ExpertKind::swiglu : model::ExpertKind::gelu;
  cfg.expert_model_parallel_size = c.ep;
  cfg.layer_index = 2;
  cfg.validate();
  return cfg;
}

// Capacity per chunk, docs/layer.md 6.4: C = ceil(fp32(fp32(S/E) * fp32(k*cf))), then max(C, min), then min(C, S).
// With --moe-no-drop the Plan is sized for the bound S_c.
int64_t expected_capacity(const Case& c, int64_t Sc) {
  if (c.no_drop) return Sc;
  const float a = static_cast<float>(static_cast<double>(Sc) / static_cast<double>(c.E));
  const float f = static_cast<float>(static_cast<double>(c.k) * c.cf);
  const float prod = a * f;  // one fp32 rounding of the product
  int64_t C = static_cast<int64_t>(std::ceil(static_cast<double>(prod)));
  if (C < c.min_cap) C = c.min_cap;
  if (C > Sc) C = Sc;
  return C;
}

// Causal pairs of chunk c: query row i (0 <= i < sq, position c*sq + i) sees keys [0, min(skv, c*sq + i + 1)),
// skv = (c+1)*sq. Summed by a loop, not a formula.
double causal_pairs(int64_t sq, int c) {
  const int64_t skv = (c + 1) * sq;
  double pairs = 0;
  for (int64_t i = 0; i < sq; ++i) pairs += double(std::min(skv, c * sq + i + 1));
  return pairs;
}

struct Expected {
  int64_t Sc = 0, C = 0;
  double esize = 4;
  // per chunk c, per direction (0 fwd, 1 bwd)
  std::vector<double> qkv[2], attention[2], out_proj[2], gate[2], experts[2];
  double attention_wgrad = 0;  // the QKV and out-projection weight gradients over all T rows (backward, chunk -1)
  double expert_wgrad = 0;     // the expert weight gradients over all chunks' slots (backward, chunk -1; 0: none)
  double a2a_bytes = 0;  // one all-to-all task
  double total = 0, total_non_expert = 0, total_experts = 0;
};

Expected expected(const Case& c) {
  Expected x;
  const double h = double(c.h), E = double(c.E), d = double(c.h / c.n);
  const int64_t sq = c.s / c.M;
  x.Sc = sq * c.b;
  x.C = expected_capacity(c, x.Sc);
  x.esize = c.bf16 ? 2 : 4;
  const double Sc = double(x.Sc), C = double(x.C), L = double(c.E / c.ep), ep = double(c.ep);
  const double F = double(c.F), F1 = c.swiglu ? 2 * F : F;
  // Backward per chunk: the input-gradient GEMM only; the weight gradients are one task over all chunks, except the
  // experts' with --moe-no-drop (slots not packed across chunks), whose per-chunk backward holds both. The gate's
  // backward has both (dx and dWg).
  for (int dir = 0; dir < 2; ++dir) {
    const double g = dir == 0 ? 1 : 2;
    const double ge = dir == 0 || !c.no_drop ? 1 : 2;
    for (int ch = 0; ch < c.M; ++ch) {
      x.qkv[dir].push_back(2 * Sc * h * 3 * h);
      x.attention[dir].push_back(causal_pairs(sq, ch) * double(c.b) * double(c.n) * d * (dir == 0 ? 4 : 10));
      x.out_proj[dir].push_back(2 * Sc * h * h);
      x.gate[dir].push_back(g * 2 * Sc * h * E);
      x.experts[dir].push_back(ge * 2 * L * ep * C * h * (F1 + F));
      const double non_expert =
          x.qkv[dir].back() + x.attention[dir].back() + x.out_proj[dir].back() + x.gate[dir].back();
      x.total_non_expert += non_expert;
      x.total_experts += x.experts[dir].back();
    }
  }
  const double T = double(c.s * c.b);
  x.attention_wgrad = 2 * T * h * 3 * h + 2 * T * h * h;
  x.expert_wgrad = c.no_drop ? 0 : double(c.M) * 2 * L * ep * C * h * (F1 + F);
  x.total_non_expert += x.attention_wgrad;
  x.total_experts += x.expert_wgrad;
  x.total = x.total_non_expert + x.total_experts;
  x.a2a_bytes = E * C * h * x.esize;  // E*C*h elements of the compute dtype, all ep blocks
  return x;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int M : {1, 2, 4, 8})
    for (int k : {1, 2})
      for (int ep : {1, 2, 4})
        for (double cf : {1.0, 0.6, 1.25, 3.0}) {
          Case c;
          c.M = M;
          c.k = k;
          c.ep = ep;
          c.cf = cf;
          c.min_cap = cf == 0.6 ? 1 : 4;
          c.bf16 = (M + k + ep) % 2 == 0;
          c.swiglu = cf == 1.25 || cf == 3.0;
          out.push_back(c);
        }
  // Larger and odd shapes: b > 1, E = 8, h not a power of two; a capacity clamped by S_c; capacities where fp32 and
  // double disagree (S_c = 25, 50, 100, 200 with E = 4, k*cf = 2.4: fp32 gives 16, 31, 61, 121, double 15, 30, 60,
  // 120); --moe-no-drop (C = S_c, and capacity all-gathers with ep > 1).
  Case big;
  big.s = 256, big.b = 2, big.h = 96, big.F = 160, big.n = 6, big.E = 8, big.k = 2, big.ep = 4, big.cf = 1.1;
  for (int M : {1, 2, 4, 8}) {
    big.M = M;
    for (bool bf : {false, true}) {
      big.bf16 = bf;
      big.swiglu = !bf;
      out.push_back(big);
    }
  }
  Case clamp;
  clamp.s = 16, clamp.E = 2, clamp.k = 2, clamp.cf = 8.0, clamp.min_cap = 0;
  for (int M : {1, 2, 4, 8}) {
    clamp.M = M;
    out.push_back(clamp);
  }
  Case round;
  round.s = 200, round.b = 1, round.E = 4, round.k = 2, round.cf = 1.2, round.min_cap = 0, round.ep = 2;
  for (int M : {1, 2, 4, 8}) {
    round.M = M;
    out.push_back(round);
  }
  Case nd;
  nd.no_drop = true;
  for (int ep : {1, 2, 4})
    for (int M : {1, 2, 4, 8}) {
      nd.ep = ep;
      nd.M = M;
      out.push_back(nd);
    }
  return out;
}

const std::vector<double>& per_chunk(const Expected& x, Stage s, Dir d) {
  const int i = d == Dir::fwd ? 0 : 1;
  switch (s) {
    case Stage::ln1_qkv: return x.qkv[i];
    case Stage::attention: return x.attention[i];
    case Stage::out_proj: return x.out_proj[i];
    case Stage::gate: return x.gate[i];
    case Stage::experts: return x.experts[i];
    default: break;
  }
  static const std::vector<double> none;
  return none;
}

// Exact, or within 1e-12 relative (the sums below are of integers < 2^53, so in practice exact).
void expect_close(double got, double want, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), 1e-12 * std::max(1.0, std::fabs(want))) << what << ": got " << got << " want "
                                                                            << want;
}

}  // namespace

TEST(PlanCosts, CapacityIsTheDocumentedFp32Formula) {
  // Hand-checked values (docs/layer.md 6.4, 12): ceil(fp32(16/4) * fp32(2*0.75)) = 6.
  Case c;
  c.E = 4, c.k = 2, c.cf = 0.75, c.min_cap = 1;
  EXPECT_EQ(expected_capacity(c, 16), 6);
  // 20/16 * 1.2 = 1.5 exactly; 10/16 * 1.2 = 0.75 -> 1; min capacity and the S bound.
  c.E = 16, c.k = 2, c.cf = 0.6, c.min_cap = 0;
  EXPECT_EQ(expected_capacity(c, 20), 2);
  EXPECT_EQ(expected_capacity(c, 10), 1);
  c.min_cap = 4;
  EXPECT_EQ(expected_capacity(c, 10), 4);
  EXPECT_EQ(expected_capacity(c, 3), 3);
  // fp32, not double: fp32(25/4) * fp32(2*1.2) = 15.000001 -> 16 (in double 6.25 * 2.4 = 15 -> 15).
  c.E = 4, c.k = 2, c.cf = 1.2, c.min_cap = 0;
  EXPECT_EQ(expected_capacity(c, 25), 16);
  EXPECT_EQ(expected_capacity(c, 50), 31);
  for (const Case& cc : cases()) {
    const Plan p = build_layer_plan(config(cc), cc.M);
    EXPECT_EQ(p.dims.C, expected(cc).C) << cc.label();
  }
}

TEST(PlanCosts, AllToAllBytesMatchTheClosedForm) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label());
    const Plan p = build_layer_plan(config(c), c.M);
    const Expected x = expected(c);
    int a2a = 0, gathers = 0;
    for (const Task& t : p.tasks) {
      if (!t.is_collective()) continue;
      const CollectiveSpec& cs = *t.collective;
      EXPECT_EQ(t.bytes, cs.bytes) << t.name();
      EXPECT_EQ(cs.group, comm::GroupKind::ep) << t.name();
      if (cs.kind == CollKind::all_to_all) {
        ++a2a;
        expect_close(cs.bytes, x.a2a_bytes, t.name());
        // The buffers hold exactly what is sent: one chunk slot of E*C*h elements of the compute dtype.
        for (model::Buf b : {cs.send, cs.recv}) {
          const model::BufferSpec* spec = p.memory.spec(b);
          ASSERT_NE(spec, nullptr) << t.name() << " " << model::buf_name(b);
          EXPECT_EQ(double(spec->slot_bytes()), x.a2a_bytes) << t.name() << " " << model::buf_name(b);
          EXPECT_EQ(spec->chunks, c.M) << t.name() << " " << model::buf_name(b);
        }
      } else if (cs.kind == CollKind::all_gather) {
        ++gathers;
        EXPECT_EQ(t.stage, CommStage::capacity);
        EXPECT_EQ(cs.bytes, t.dir == Dir::fwd ? 4.0 : 0.0) << t.name();
      } else {
        ADD_FAILURE() << t.name() << ": unexpected collective " << coll_kind_name(cs.kind);
      }
    }
    // dispatch and combine, forward and backward, per chunk
    EXPECT_EQ(a2a, 4 * c.M);
    expect_close(p.collective_bytes(CollKind::all_to_all), 4.0 * c.M * x.a2a_bytes, "all_to_all total");
    // --moe-no-drop with ep > 1: one capacity all-gather per forward chunk
    EXPECT_EQ(gathers, c.no_drop && c.ep > 1 ? c.M : 0);
    expect_close(p.collective_bytes(CollKind::all_gather), 4.0 * gathers, "all_gather total");
    EXPECT_EQ(p.collective_bytes(CollKind::all_reduce), 0.0);
  }
}

TEST(PlanCosts, FlopsMatchTheClosedFormPerTaskAndInTotal) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label());
    const Plan p = build_layer_plan(config(c), c.M);
    const Expected x = expected(c);
    int wgrads = 0;
    for (const Task& t : p.tasks) {
      if (t.stage == Stage::attention_wgrad || t.stage == Stage::expert_wgrad) {
        ++wgrads;
        EXPECT_EQ(t.dir, Dir::bwd) << t.name();
        EXPECT_EQ(t.chunk, -1) << t.name();
        expect_close(t.flops, t.stage == Stage::attention_wgrad ? x.attention_wgrad : x.expert_wgrad, t.name());
        continue;
      }
      if (t.is_collective()) {
        EXPECT_EQ(t.flops, 0.0) << t.name();  // collectives count no FLOPs
        continue;
      }
      const std::vector<double>& want = per_chunk(x, t.stage.compute(), t.dir);
      if (want.empty()) {
        EXPECT_EQ(t.flops, 0.0) << t.name();  // element-wise stages count no FLOPs
        continue;
      }
      ASSERT_GE(t.chunk, 0) << t.name();
      ASSERT_LT(t.chunk, c.M) << t.name();
      expect_close(t.flops, want[size_t(t.chunk)], t.name());
    }
    EXPECT_EQ(wgrads, c.no_drop ? 1 : 2);
    expect_close(p.flops(), x.total, "Plan::flops()");
    // Every chunk of every FLOP-carrying stage appears once per direction.
    for (Dir d : {Dir::fwd, Dir::bwd})
      for (Stage s : {Stage::ln1_qkv, Stage::attention, Stage::out_proj, Stage::gate, Stage::experts})
        for (int ch = 0; ch < c.M; ++ch) {
          int n = 0;
          for (const Task& t : p.tasks) n += t.dir == d && t.stage == s && t.chunk == ch;
          EXPECT_EQ(n, 1) << model::dir_name(d) << "." << model::stage_name(s) << ".c" << ch;
        }
  }
}

TEST(PlanCosts, ChunkingDoesNotChangeTheWorkOutsideTheExperts) {
  for (const Case& c : cases()) {
    if (c.M == 1) continue;
    SCOPED_TRACE(c.label());
    Case one = c;
    one.M = 1;
    const Plan pm = build_layer_plan(config(c), c.M), p1 = build_layer_plan(config(one), 1);
    auto non_expert = [](const Plan& p) {
      double f = 0;
      for (const Task& t : p.tasks)
        if (t.stage != Stage::experts && t.stage != Stage::expert_wgrad) f += t.flops;
      return f;
    };
    auto experts = [](const Plan& p) {
      double f = 0;
      for (const Task& t : p.tasks)
        if (t.stage == Stage::experts || t.stage == Stage::expert_wgrad) f += t.flops;
      return f;
    };
    expect_close(non_expert(pm), non_expert(p1), "non-expert FLOPs, degree M vs 1");
    // Attention alone: the chunks' causal pairs add up to the whole sequence's s(s+1)/2.
    double att = 0;
    for (const Task& t : pm.tasks)
      if (t.stage == Stage::attention && t.dir == Dir::fwd) att += t.flops;
    expect_close(att, double(c.s) * double(c.s + 1) / 2 * double(c.b * c.n) * double(c.h / c.n) * 4,
                 "forward attention");
    // The experts scale with the planned slots M*C_c (vs C_1 of degree 1).
    const double ratio = double(c.M) * double(expected(c).C) / double(expected(one).C);
    expect_close(experts(pm), experts(p1) * ratio, "expert FLOPs scale with M*C");
  }
}

TEST(PlanCosts, CollectivesRunOnTheEpLaneAndComputeOnTheComputeLane) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label());
    const Plan p = build_layer_plan(config(c), c.M);
    for (const Task& t : p.tasks) {
      const bool comm_stage =
          t.stage == CommStage::dispatch || t.stage == CommStage::combine || t.stage == CommStage::capacity;
      EXPECT_EQ(t.is_collective(), comm_stage) << t.name();
      EXPECT_EQ(t.lane, comm_stage ? Lane::ep : Lane::compute) << t.name();
      EXPECT_EQ(t.lane, lane_of(t.stage)) << t.name();
      EXPECT_EQ(t.layer, 2) << t.name();
    }
  }
}

TEST(PlanCosts, PlannedMemoryHoldsTheCapacityDependentBuffers) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label());
    const Plan p = build_layer_plan(config(c), c.M);
    const Expected x = expected(c);
    const double e = x.esize, C = double(x.C), h = double(c.h), L = double(c.E / c.ep), R = double(c.ep) * C;
    const double F = double(c.F), F1 = c.swiglu ? 2 * F : F, T = double(c.s * c.b), M = double(c.M);
    // Saved per layer, sized by the planned capacity (docs/plan.md, "Memory"): expert_y one slot per chunk; the
    // expert-major buffers one slot holding every chunk ([L, M*R, *]), so a weight gradient reads all chunks at once.
    struct Want {
      model::Buf b;
      double slot;
      int chunks;
    };
    std::vector<Want> saved = {{model::Buf::expert_in, M * L * R * h * e, 1},
                               {model::Buf::fc1_out, M * L * R * F1 * 4, 1},
                               {model::Buf::expert_y, double(c.E) * C * h * 4, c.M}};
    if (c.bf16)
      saved.push_back({model::Buf::act_bf16, M * L * R * F * 2, 1});
    else
      saved.push_back({model::Buf::act, M * L * R * F * 4, 1});
    double expert_saved = 0;
    for (const Want& w : saved) {
      const model::BufferSpec* s = p.memory.spec(w.b);
      ASSERT_NE(s, nullptr) << model::buf_name(w.b);
      EXPECT_EQ(s->scope, model::Scope::saved) << model::buf_name(w.b);
      EXPECT_EQ(s->chunks, w.chunks) << model::buf_name(w.b);
      EXPECT_EQ(double(s->slot_bytes()), w.slot) << model::buf_name(w.b);
      expert_saved += double(w.chunks) * w.slot;
    }
    // A lower bound of the saved region: those, plus what the backward must read in any mode (fp32 [T, h]
    // activations ln_in, ln2_out, attn, the layer output y and input gradient dx, the gate probabilities and the
    // attention's log-sum-exp), plus the qkv the attention backward reads (in the compute dtype).
    const double minimum = expert_saved + 5 * T * h * 4 + T * double(c.E) * 4 + T * double(c.n) * 4 + T * 3 * h * e;
    EXPECT_GE(double(p.memory.saved_bytes), minimum);
    // Chunking changes the saved region only through the capacity-dependent expert buffers (up to the 64-byte
    // alignment of each slot).
    if (c.M > 1) {
      Case one = c;
      one.M = 1;
      const Plan p1 = build_layer_plan(config(one), 1);
      double expert_saved1 = 0;
      for (const Want& w : saved) expert_saved1 += double(p1.memory.spec(w.b)->bytes());
      size_t slots = 0;
      for (const model::BufferSpec& s : p.memory.specs) slots += size_t(s.chunks);
      const double rest_m = double(p.memory.saved_bytes) - expert_saved;
      const double rest_1 = double(p1.memory.saved_bytes) - expert_saved1;
      EXPECT_LE(std::fabs(rest_m - rest_1), 64.0 * double(slots)) << rest_m << " vs " << rest_1;
    }
    // Every all-to-all buffer is a per-chunk slot, so a chunk's buffers stay untouched while later chunks compute.
    for (model::Buf b : {model::Buf::dispatch_send, model::Buf::dispatch_recv, model::Buf::combine_send,
                         model::Buf::combine_bwd_send, model::Buf::combine_bwd_recv, model::Buf::dispatch_bwd_send,
                         model::Buf::dispatch_bwd_recv}) {
      const model::BufferSpec* s = p.memory.spec(b);
      ASSERT_NE(s, nullptr) << model::buf_name(b);
      EXPECT_EQ(double(s->bytes()), M * x.a2a_bytes) << model::buf_name(b);
    }
    // A stack: each layer its saved region, one shared region.
    EXPECT_EQ(p.planned_bytes(3), 3 * p.memory.saved_bytes + p.memory.shared_bytes);
    // Slots are 64-byte aligned and do not overlap.
    for (const model::BufferSpec& s : p.memory.specs) {
      const std::vector<size_t>& off = p.memory.offset[size_t(s.id)];
      ASSERT_EQ(off.size(), size_t(s.chunks)) << s.name;
      for (size_t i = 0; i < off.size(); ++i) {
        EXPECT_EQ(off[i] % 64, 0u) << s.name;
        EXPECT_LE(off[i] + s.slot_bytes(),
                  s.scope == model::Scope::saved ? p.memory.saved_bytes : p.memory.shared_bytes)
            << s.name;
        if (i > 0) {
          EXPECT_GE(off[i], off[i - 1] + s.slot_bytes()) << s.name;
        }
      }
    }
  }
}
