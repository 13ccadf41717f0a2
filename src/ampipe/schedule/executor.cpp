#include "ampipe/schedule/executor.h"

#include "ampipe/comm/trace.h"

namespace ampipe::schedule {

comm::Backend& Executor::backend_for(comm::GroupKind k) {
  const comm::Group* g = groups_ ? &groups_->get(k) : nullptr;
  if (g == nullptr || !g->valid() || g->size() == 1) return local_;
  auto& b = mpi_[k];
  if (!b) b = std::make_unique<comm::MpiBackend>(*g);
  return *b;
}

comm::Event Executor::issue(const Task& t, model::Layer& layer, std::vector<comm::Event> after,
                            const std::string& tag) {
  AMPIPE_CHECK(t.is_collective(), "{} is not a communication task", tag);
  const CollectiveSpec& c = *t.collective;
  auto slot = [&](Buf b, int s) {
    const Tensor v = layer.buffer_slot(b, s);
    return c.slot_rows >= 0 ? v.rows(c.slot_row0, c.slot_row0 + c.slot_rows) : v;
  };
  const Tensor send = c.send_slot >= 0 ? slot(c.send, c.send_slot) : layer.buffer(c.send, t.chunk, t.piece);
  const Tensor recv = c.recv_slot >= 0 ? slot(c.recv, c.recv_slot) : layer.buffer(c.recv, t.chunk, t.piece);
  comm::Issue how;
  how.after = std::move(after);
  how.lane = t.lane;
  how.chunk = t.chunk;
  return backend_for(c.group).issue(c.kind, send, recv, tag, std::move(how));
}

void Executor::run(const Plan& plan, Dir dir, model::Layer& layer) {
  done_.assign(plan.tasks.size(), comm::Event());  // this Plan's tasks only: nothing left from the last run
  std::vector<uint32_t> issued;  // collectives of this direction, all waited for before returning
  for (const Task& t : plan.tasks) {
    if (t.dir != dir) continue;
    if (!t.is_collective()) {
      const int64_t w0 = comm::Trace::now_us();
      local_.poll();
      for (uint32_t d : t.deps) {
        local_.prepare_wait(done_[d]);  // a deferred local copy this task reads: made now
        done_[d].wait();                // the only place compute blocks
      }
      const int64_t t0 = comm::Trace::now_us();
      stats_.blocked_us += t0 - w0;
      layer.run(t.stage.compute(), t.dir, t.chunk, t.piece);
      const int64_t t1 = comm::Trace::now_us();
      stats_.compute_us += t1 - t0;
      comm::Trace::record(Lane::compute, t.name(), t.chunk, t0, t1);
      done_[t.id] = comm::Event();
    } else {
      std::vector<comm::Event> after;
      for (uint32_t d : t.deps)
        if (plan.tasks[d].is_collective()) after.push_back(done_[d]);
      done_[t.id] = issue(t, layer, std::move(after), t.name());
      issued.push_back(t.id);
    }
  }
  // Every collective of a layer step has a consumer in the same step, so these waits are normally free; they make
  // the promise that the shared buffers are idle when the next layer starts.
  const int64_t w0 = comm::Trace::now_us();
  local_.drain();
  for (uint32_t id : issued)
    if (!done_[id].ready() || done_[id].failed()) done_[id].wait();  // a failure throws here
  stats_.blocked_us += comm::Trace::now_us() - w0;
}

}  // namespace ampipe::schedule
