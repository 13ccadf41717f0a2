#include "ampipe/comm/backend.h"

#include <cstring>

#include "ampipe/core/error.h"
#include "ampipe/core/parallel.h"

namespace ampipe::comm {

const char* coll_kind_name(CollKind k) {
  switch (k) {
    case CollKind::all_to_all: return "all_to_all";
    case CollKind::all_gather: return "all_gather";
    case CollKind::reduce_scatter: return "reduce_scatter";
    case CollKind::all_reduce: return "all_reduce";
    case CollKind::send_recv: return "send_recv";
  }
  return "?";
}

Event MpiBackend::issue(CollKind kind, const Tensor& send, const Tensor& recv, const std::string& tag, Issue how) {
  switch (kind) {
    case CollKind::all_to_all: {
      SplitCounts counts;
      counts.send.assign(size_t(g_.size()), send.numel() / g_.size());
      counts.recv.assign(size_t(g_.size()), recv.numel() / g_.size());
      return all_to_all(g_, send, recv, counts, tag, how);
    }
    case CollKind::all_gather: return all_gather(g_, send, recv, tag, how);
    case CollKind::reduce_scatter: return reduce_scatter(g_, send, recv, Reduce::sum, tag, how);
    case CollKind::all_reduce: return all_reduce(g_, recv, Reduce::sum, tag, how);
    case CollKind::send_recv: return ring_shift(g_, send, recv, tag, how);
  }
  AMPIPE_CHECK(false, "{}: unknown collective kind", tag);
  return {};
}

namespace {
void copy_locally(CollKind kind, const Tensor& send, Tensor recv, const std::string& tag) {
  if (kind == CollKind::all_reduce) return;  // in place
  AMPIPE_CHECK(send.nbytes() == recv.nbytes(), "{}: send {} recv {} bytes on one rank", tag, send.nbytes(),
               recv.nbytes());
  // On the compute thread (issued, or deferred and made in poll): spread over its OpenMP threads, 1 MiB a piece.
  const auto* src = static_cast<const std::byte*>(send.raw());
  auto* dst = static_cast<std::byte*>(recv.raw());
  parallel_for(int64_t(send.nbytes()), int64_t(1) << 20, [&](int64_t b0, int64_t b1) {
    std::memcpy(dst + b0, src + b0, size_t(b1 - b0));
  });
}
bool all_ready(const std::vector<Event>& es) {
  for (const Event& e : es)
    if (!e.ready()) return false;
  return true;
}
}  // namespace

Event LocalBackend::issue(CollKind kind, const Tensor& send, const Tensor& recv, const std::string& tag, Issue how) {
  if (all_ready(how.after)) {
    for (const Event& e : how.after) e.wait();  // rethrows a failed producer
    copy_locally(kind, send, recv, tag);
    return {};
  }
  Deferred d{kind, send, recv, std::move(how.after), std::make_shared<EventState>(), tag};
  d.state->info.tag = tag;
  if (how.lane) d.state->info.lane = *how.lane;
  d.state->info.chunk = how.chunk;
  deferred_.push_back(std::move(d));
  return Event(deferred_.back().state);
}

void LocalBackend::finish(Deferred& d) {
  for (const Event& e : d.after) e.wait();  // blocks only for a task that needs the copy now
  copy_locally(d.kind, d.send, d.recv, d.tag);
  d.state->complete();
}

void LocalBackend::poll() {
  for (size_t i = 0; i < deferred_.size();) {
    if (!all_ready(deferred_[i].after)) {
      ++i;
      continue;
    }
    finish(deferred_[i]);
    deferred_.erase(deferred_.begin() + std::ptrdiff_t(i));
  }
}

void LocalBackend::prepare_wait(const Event& e) {
  if (!e.state()) return;
  for (size_t i = 0; i < deferred_.size(); ++i)
    if (deferred_[i].state == e.state()) {
      finish(deferred_[i]);
      deferred_.erase(deferred_.begin() + std::ptrdiff_t(i));
      return;
    }
}

void LocalBackend::drain() {
  while (!deferred_.empty()) {
    finish(deferred_.front());
    deferred_.erase(deferred_.begin());
  }
}

}  // namespace ampipe::comm
