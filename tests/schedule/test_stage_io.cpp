// The stage input/output table (model/stage_io.h) and the seams (model/seams.h) against the code and the Plan:
//   - the whole test suite runs with the check on, under which a stage that takes a buffer outside its table stops
//     (a stage taking one here shows the check can fail);
//   - on every layout, every collective of the layer Plan sends a buffer that a task it depends on wrote (a compute
//     stage by its table, or a collective by its receive buffer), and receives into a buffer that a task depending
//     on it reads: the data flow the tables describe is the one the Plan orders.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "ampipe/model/layer_state.h"
#include "ampipe/model/stage_io.h"
#include "ampipe/schedule/plan.h"

using namespace ampipe;
using model::Buf;
using model::Dir;
using model::Stage;
using schedule::Plan;
using schedule::Task;

namespace {

struct Layout {
  std::string name;
  std::function<void(model::LayerConfig&)> set;
};

std::vector<Layout> layouts() {
  return {
      {"plain", [](model::LayerConfig&) {}},
      {"tp2", [](model::LayerConfig& c) { c.tensor_model_parallel_size = 2; }},
      {"tp2 sp", [](model::LayerConfig& c) { c.tensor_model_parallel_size = 2, c.sequence_parallel = true; }},
      {"tp2 sp overlap",
       [](model::LayerConfig& c) {
         c.tensor_model_parallel_size = 2, c.sequence_parallel = true, c.ampipe_tp_sp_comm_overlap = true;
       }},
      {"cp2", [](model::LayerConfig& c) { c.context_parallel_size = 2; }},
      {"cp2 tp2 sp",
       [](model::LayerConfig& c) {
         c.context_parallel_size = 2, c.tensor_model_parallel_size = 2, c.sequence_parallel = true;
       }},
      {"pipe-experts", [](model::LayerConfig& c) { c.use_pipe_experts = true, c.pipe_experts_multi_data = 4; }},
      {"no-drop ep2", [](model::LayerConfig& c) { c.moe_no_drop = true, c.expert_model_parallel_size = 2; }},
      {"dropless tp2 sp ep2",
       [](model::LayerConfig& c) {
         c.moe_router = model::Router::megatron, c.tensor_model_parallel_size = 2, c.sequence_parallel = true,
         c.expert_model_parallel_size = 2;
       }},
      {"shared expert tp2 sp",
       [](model::LayerConfig& c) {
         c.mlp_ffn_hidden_size = 64, c.moe_shared_expert_gate = true, c.tensor_model_parallel_size = 2,
         c.sequence_parallel = true;
       }},
      {"dense tp2",
       [](model::LayerConfig& c) { c.num_experts = 0, c.mlp_ffn_hidden_size = 128, c.tensor_model_parallel_size = 2; }},
      {"recompute attention, qk norm",
       [](model::LayerConfig& c) { c.recompute_attention = true, c.qk_layernorm = true; }},
  };
}

model::LayerConfig config(const Layout& l, bool bf16) {
  model::LayerConfig c;
  c.seq_length = 32;
  c.hidden_size = 32;
  c.ffn_hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_experts = 4;
  c.bf16 = bf16;
  l.set(c);
  return c;
}

// Every task that `id` depends on, transitively.
std::set<uint32_t> ancestors(const Plan& p, uint32_t id) {
  std::set<uint32_t> seen;
  std::vector<uint32_t> todo = p.tasks[id].deps;
  while (!todo.empty()) {
    const uint32_t t = todo.back();
    todo.pop_back();
    if (!seen.insert(t).second) continue;
    todo.insert(todo.end(), p.tasks[t].deps.begin(), p.tasks[t].deps.end());
  }
  return seen;
}

bool in(const std::vector<Buf>& v, Buf b) { return std::find(v.begin(), v.end(), b) != v.end(); }

// What a task writes / reads: a compute stage's table, a collective's receive / send buffer.
bool writes(const Plan& p, const Task& t, Buf b) {
  if (t.is_collective()) return t.collective->recv == b;
  return in(model::stage_io(p.dims, t.stage.compute(), t.dir).writes, b);
}
bool reads(const Plan& p, const Task& t, Buf b) {
  if (t.is_collective()) return t.collective->send == b;
  return in(model::stage_io(p.dims, t.stage.compute(), t.dir).reads, b);
}

}  // namespace

TEST(StageIO, TheSuiteRunsWithTheCheckOn) { EXPECT_TRUE(model::stage_io_checking()); }

TEST(StageIODeathTest, AStageThatTakesABufferOutsideItsTableStops) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ASSERT_TRUE(model::stage_io_checking());
  const model::LayerDims d = model::LayerDims::make(config(layouts()[0], false), 2);
  const model::BufferLayout layout = model::BufferLayout::make(d);
  model::Arena arena;
  arena.reserve(layout.saved_bytes + layout.shared_bytes);
  model::LayerMemory mem(d, layout, arena, 0, layout.saved_bytes);
  mem.enter_stage(Stage::attention, Dir::fwd);
  (void)mem.get(Buf::lse, 0);  // in attention's table
  EXPECT_DEATH((void)mem.get(Buf::y), "stage attention.fwd took buffer y, which is not in its input/output table");
  mem.leave_stage();
  (void)mem.get(Buf::y);  // outside a stage: the executor's collectives, the layer's begin_* and its output
}

TEST(StageIO, EveryCollectiveMovesWhatAnEarlierTaskWroteToWhatALaterTaskReads) {
  int collectives = 0;
  for (const Layout& l : layouts())
    for (bool bf16 : {false, true})
      for (int M : {1, 2}) {
        const Plan p = schedule::build_layer_plan(config(l, bf16), M);
        SCOPED_TRACE(l.name + (bf16 ? " bf16" : " fp32") + " M " + std::to_string(M));
        for (const Task& t : p.tasks) {
          if (!t.is_collective()) continue;
          ++collectives;
          const Buf send = t.collective->send, recv = t.collective->recv;
          bool produced = false, consumed = false;
          for (uint32_t a : ancestors(p, t.id)) produced = produced || writes(p, p.tasks[a], send);
          for (const Task& u : p.tasks)
            if (u.id != t.id && ancestors(p, u.id).count(t.id)) consumed = consumed || reads(p, u, recv);
          EXPECT_TRUE(produced) << t.name() << " sends " << model::buf_name(send) << ", which nothing before it wrote";
          EXPECT_TRUE(consumed) << t.name() << " receives " << model::buf_name(recv) << ", which nothing after reads";
        }
      }
  EXPECT_GT(collectives, 500);
}
