#include "ampipe/schedule/executor.h"

#include <cstring>

#include "ampipe/comm/trace.h"

namespace ampipe::schedule {

namespace {
// A one-rank group: every collective's result is its input.
void run_locally(const CollectiveSpec& c, const Tensor& send, Tensor& recv, const std::string& tag) {
  switch (c.kind) {
    case CollKind::all_reduce: return;  // in place
    case CollKind::all_to_all:
    case CollKind::all_gather:
    case CollKind::reduce_scatter:
    case CollKind::send_recv:
      AMPIPE_CHECK(send.nbytes() == recv.nbytes(), "{}: send {} recv {} bytes on one rank", tag, send.nbytes(),
                   recv.nbytes());
      std::memcpy(recv.raw(), send.raw(), send.nbytes());
      return;
  }
}
}  // namespace

comm::Event Executor::issue(const Task& t, model::Layer& layer, std::vector<comm::Event> after,
                            const std::string& tag) {
  AMPIPE_CHECK(t.is_collective(), "{} is not a communication task", tag);
  const CollectiveSpec& c = *t.collective;
  auto slot = [&](Buf b, int s) {
    const Tensor v = layer.buffer_slot(b, s);
    return c.slot_rows >= 0 ? v.rows(c.slot_row0, c.slot_row0 + c.slot_rows) : v;
  };
  const Tensor send = c.send_slot >= 0 ? slot(c.send, c.send_slot) : layer.buffer(c.send, t.chunk, t.piece);
  Tensor recv = c.recv_slot >= 0 ? slot(c.recv, c.recv_slot) : layer.buffer(c.recv, t.chunk, t.piece);
  const comm::Group* g = groups_ ? &groups_->get(c.group) : nullptr;
  if (g == nullptr || !g->valid() || g->size() == 1) {
    // A one-rank collective is a copy; what it reads must be complete. Its producers on other lanes (e.g. a
    // one-rank EP all-to-all after a tensor-parallel reduction) may still run: then the copy is deferred.
    bool ready = true;
    for (const comm::Event& e : after) ready = ready && e.ready();
    if (ready) {
      for (const comm::Event& e : after) e.wait();  // rethrows a failed producer
      run_locally(c, send, recv, tag);
      return {};
    }
    Deferred d{c, send, recv, std::move(after), std::make_shared<comm::EventState>(), tag};
    d.state->info.tag = tag;
    d.state->info.lane = t.lane;
    d.state->info.chunk = t.chunk;
    deferred_.push_back(std::move(d));
    return comm::Event(deferred_.back().state);
  }
  comm::Issue how;
  how.after = std::move(after);
  how.lane = t.lane;
  how.chunk = t.chunk;
  switch (c.kind) {
    case CollKind::all_to_all: {  // equal blocks: block j of send goes to group rank j
      comm::SplitCounts counts;
      counts.send.assign(size_t(g->size()), send.numel() / g->size());
      counts.recv.assign(size_t(g->size()), recv.numel() / g->size());
      return comm::all_to_all(*g, send, recv, counts, tag, how);
    }
    case CollKind::all_gather: return comm::all_gather(*g, send, recv, tag, how);
    case CollKind::reduce_scatter: return comm::reduce_scatter(*g, send, recv, comm::Reduce::sum, tag, how);
    case CollKind::all_reduce: return comm::all_reduce(*g, recv, comm::Reduce::sum, tag, how);
    case CollKind::send_recv: return comm::ring_shift(*g, send, recv, tag, how);  // to rank r+1, from r-1
  }
  AMPIPE_CHECK(false, "{}: unknown collective kind", tag);
  return {};
}

void Executor::finish(Deferred& d) {
  for (const comm::Event& e : d.after) e.wait();  // blocks only for a task that needs the copy now
  run_locally(d.spec, d.send, d.recv, d.tag);
  d.state->complete();
}

void Executor::poll_deferred() {
  for (size_t i = 0; i < deferred_.size();) {
    bool ready = true;
    for (const comm::Event& e : deferred_[i].after) ready = ready && e.ready();
    if (!ready) {
      ++i;
      continue;
    }
    finish(deferred_[i]);
    deferred_.erase(deferred_.begin() + std::ptrdiff_t(i));
  }
}

void Executor::run(const Plan& plan, Dir dir, model::Layer& layer) {
  done_.assign(plan.tasks.size(), comm::Event());  // this Plan's tasks only: nothing left from the last run
  std::vector<uint32_t> issued;  // collectives of this direction, all waited for before returning
  for (const Task& t : plan.tasks) {
    if (t.dir != dir) continue;
    if (!t.is_collective()) {
      const int64_t w0 = comm::Trace::now_us();
      poll_deferred();
      for (uint32_t d : t.deps) {
        for (size_t i = 0; i < deferred_.size(); ++i)  // a deferred local copy this task reads: made now
          if (deferred_[i].state == done_[d].state()) {
            finish(deferred_[i]);
            deferred_.erase(deferred_.begin() + std::ptrdiff_t(i));
            break;
          }
        done_[d].wait();  // the only place compute blocks
      }
      const int64_t t0 = comm::Trace::now_us();
      stats_.blocked_us += t0 - w0;
      layer.run(t.stage, t.dir, t.chunk, t.piece);
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
  while (!deferred_.empty()) {
    finish(deferred_.front());
    deferred_.erase(deferred_.begin());
  }
  for (uint32_t id : issued)
    if (!done_[id].ready() || done_[id].failed()) done_[id].wait();  // a failure throws here
  stats_.blocked_us += comm::Trace::now_us() - w0;
}

}  // namespace ampipe::schedule
