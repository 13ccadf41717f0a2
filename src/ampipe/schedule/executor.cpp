#include "ampipe/schedule/executor.h"

#include <cstring>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/trace.h"

namespace ampipe::schedule {

void Executor::run_stage(const Task& t, model::LayerStep& step) {
  const int c = t.chunk;
  switch (t.stage) {
    case Stage::ln1_qkv: step.ln1_qkv(c); break;
    case Stage::attention: step.attention(c); break;
    case Stage::out_proj: step.out_proj(c); break;
    case Stage::bdal: step.bdal(c); break;
    case Stage::gate: step.gate(c); break;
    case Stage::gate_assign: step.gate_assign(c); break;
    case Stage::experts: step.experts(c); break;
    case Stage::combine: step.combine(c); break;
    case Stage::aux_loss: step.aux_loss(); break;
    case Stage::aux_loss_bwd: step.aux_loss_backward(); break;
    case Stage::combine_bwd: step.combine_backward(c); break;
    case Stage::experts_bwd: step.experts_backward(c); break;
    case Stage::gate_bwd: step.gate_backward(c); break;
    case Stage::bdal_bwd: step.bdal_backward(c); break;
    case Stage::out_proj_bwd: step.out_proj_backward(c); break;
    case Stage::attention_bwd: step.attention_backward(c); break;
    case Stage::ln1_qkv_bwd: step.ln1_qkv_backward(c); break;
    case Stage::dispatch:
    case Stage::capacity:
    case Stage::combine_a2a:
    case Stage::combine_a2a_bwd:
    case Stage::dispatch_bwd: AMPIPE_CHECK(false, "{} is a collective, not a compute stage", t.name());
  }
}

std::optional<model::A2a> a2a_of(Stage s) {
  switch (s) {
    case Stage::dispatch: return model::A2a::dispatch;
    case Stage::combine_a2a: return model::A2a::combine;
    case Stage::combine_a2a_bwd: return model::A2a::combine_bwd;
    case Stage::dispatch_bwd: return model::A2a::dispatch_bwd;
    default: return std::nullopt;
  }
}

comm::Event Executor::issue_collective(const Task& t, model::LayerStep& step, std::vector<comm::Event> after) {
  if (t.stage == Stage::capacity) {  // all-gather of each EP rank's required capacity
    Tensor mine = step.capacity_need(t.chunk), all = step.capacity_all(t.chunk);
    if (ep_ == nullptr || ep_->size() == 1) {
      all.copy_from(mine);
      return {};
    }
    comm::Issue how;
    how.after = std::move(after);
    how.lane = t.lane;
    how.chunk = t.chunk;
    return comm::all_gather(*ep_, mine, all, t.name(), how);
  }
  const std::optional<model::A2a> which = a2a_of(t.stage);
  AMPIPE_CHECK(which.has_value(), "{} is not an all-to-all", t.name());
  model::A2aBuffers buf = step.a2a_buffers(*which, t.chunk);
  if (ep_ == nullptr || ep_->size() == 1) {  // a single EP rank sends everything to itself
    AMPIPE_CHECK(buf.send.nbytes() == buf.recv.nbytes(), "{}: send {} recv {} bytes", t.name(), buf.send.nbytes(),
                 buf.recv.nbytes());
    std::memcpy(buf.recv.raw(), buf.send.raw(), buf.send.nbytes());
    return {};
  }
  comm::SplitCounts counts;
  counts.send.assign(size_t(ep_->size()), buf.elems_per_peer);
  counts.recv = counts.send;
  comm::Issue how;
  how.after = std::move(after);
  how.lane = t.lane;
  how.chunk = t.chunk;
  return comm::all_to_all(*ep_, buf.send, buf.recv, counts, t.name(), how);
}

void Executor::run(const Plan& plan, model::LayerStep& step, Dir dir) {
  if (done_.size() != plan.tasks.size()) done_.assign(plan.tasks.size(), comm::Event());
  for (const Task& t : plan.tasks) {
    if (stage_dir(t.stage) != dir) continue;
    if (t.lane == Lane::compute) {
      const int64_t w0 = comm::Trace::now_us();
      for (uint32_t d : t.deps) done_[d].wait();  // the only place compute blocks
      const int64_t t0 = comm::Trace::now_us();
      stats_.blocked_us += t0 - w0;
      run_stage(t, step);
      const int64_t t1 = comm::Trace::now_us();
      stats_.compute_us += t1 - t0;
      comm::Trace::record(Lane::compute, t.name(), t.chunk, t0, t1);
      done_[t.id] = comm::Event();
    } else {
      std::vector<comm::Event> after;
      for (uint32_t d : t.deps)
        if (plan.tasks[d].lane != Lane::compute) after.push_back(done_[d]);
      done_[t.id] = issue_collective(t, step, std::move(after));
    }
  }
}

}  // namespace ampipe::schedule
