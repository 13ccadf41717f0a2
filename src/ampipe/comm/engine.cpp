// The communication engine; declared in the private mpi_detail.h (see there for how it schedules lanes).
#include "ampipe/comm/mpi_detail.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "ampipe/comm/trace.h"
#include "ampipe/core/error.h"

namespace ampipe::comm {

namespace {

void mpi_check(int rc, const char* what, int rank) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  AMPIPE_CHECK(false, "rank {}: {} failed: {}", rank, what, std::string(buf, size_t(len)));
}

std::string describe(const CheckRecord& r) {
  return fmt::format("{} seq={} elements={} bytes={} dtype={} tag \"{}\"", op_kind_name(OpKind(r.kind)), r.seq,
                     r.elements, r.bytes, r.dtype == 0 ? "f32" : r.dtype == 1 ? "bf16" : r.dtype == 2 ? "i64" : "bytes",
                     r.tag);
}

uint64_t dtype_bytes(uint32_t code) { return code == 0 ? 4 : code == 1 ? 2 : code == 2 ? 8 : 1; }

CheckRecord record_at(const std::vector<unsigned char>& all, size_t stride, size_t r) {
  CheckRecord rec;
  std::memcpy(&rec, all.data() + r * stride, sizeof rec);
  return rec;
}

int64_t count_at(const std::vector<unsigned char>& all, size_t stride, size_t r, size_t i) {
  int64_t v;
  std::memcpy(&v, all.data() + r * stride + sizeof(CheckRecord) + i * sizeof(int64_t), sizeof v);
  return v;
}

}  // namespace

uint64_t fingerprint(const std::string& group, uint64_t seq, OpKind kind, uint32_t dtype, uint64_t bytes,
                     uint64_t elements, const std::string& tag) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  };
  mix(group.data(), group.size());
  mix(&seq, sizeof seq);
  uint32_t k = uint32_t(kind);
  mix(&k, sizeof k);
  mix(&dtype, sizeof dtype);
  mix(&bytes, sizeof bytes);
  mix(&elements, sizeof elements);
  mix(tag.data(), tag.size());
  return h;
}

Engine::Engine(int world_rank, EngineOptions opts)
    : world_rank_(world_rank), opts_(opts), poll_us_(opts.poll_interval.count()) {
  AMPIPE_CHECK(opts_.lane_depth >= 1, "lane_depth {}", opts_.lane_depth);
}

Engine::~Engine() {
  if (thread_.joinable()) {
    {
      std::lock_guard lk(mu_);
      stop_requested_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
}

Event Engine::submit(std::unique_ptr<Op> op) {
  AMPIPE_CHECK(op && op->ev && op->group, "incomplete op");
  Event ev(op->ev);
  {
    std::lock_guard lk(mu_);
    AMPIPE_CHECK(!stop_requested_, "rank {}: {} issued after the communication engine stopped", world_rank_,
                 op->ev->info.tag);
    GroupState& g = *op->group;
    op->ev->info.seq = op->collective ? g.next_seq++ : g.next_p2p++;
    op->ev->issued = std::chrono::steady_clock::now();
    incoming_.push_back(std::move(op));
    pending_++;
    if (!running_) {
      running_ = true;
      thread_ = std::thread([this] { loop(); });
    }
  }
  cv_.notify_one();
  return ev;
}

size_t Engine::pending() const { return pending_.load(); }

bool Engine::stop(std::chrono::milliseconds timeout) {
  if (!running_) return true;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pending_.load() != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  bool drained = pending_.load() == 0;
  {
    std::lock_guard lk(mu_);
    stop_requested_ = true;
  }
  cv_.notify_all();
  if (drained) {
    thread_.join();
  } else {
    thread_.detach();  // it may be inside MPI_Test on a request that will never complete; MPI_Abort follows
  }
  running_ = false;
  return drained;
}

void Engine::admit(std::unique_ptr<Op> op) {
  Op& o = *op;
  if (o.collective && o.check) {
    // Post the fingerprint exchange now, in submit order, so every member's n-th exchange on the debug
    // communicator is its n-th collective on the group, whatever lane it runs on.
    const OpInfo& in = o.ev->info;
    const size_t n = o.group->members.size(), stride = sizeof(CheckRecord) + 2 * n * sizeof(int64_t);
    CheckRecord rec;
    rec.seq = in.seq;
    rec.kind = uint32_t(in.kind);
    rec.dtype = o.dtype_code;
    rec.bytes = o.check_bytes;
    rec.elements = o.check_bytes / dtype_bytes(o.dtype_code);
    std::strncpy(rec.tag, in.tag.c_str(), sizeof rec.tag - 1);
    rec.fingerprint = fingerprint(o.group->label, in.seq, in.kind, o.dtype_code, rec.bytes, rec.elements,
                                  std::string(rec.tag));
    o.check_mine.assign(stride, 0);
    std::memcpy(o.check_mine.data(), &rec, sizeof rec);
    AMPIPE_CHECK(o.check_counts.empty() || o.check_counts.size() == 2 * n, "{}: {} check counts for {} ranks",
                 in.tag, o.check_counts.size(), n);
    if (!o.check_counts.empty())
      std::memcpy(o.check_mine.data() + sizeof rec, o.check_counts.data(), 2 * n * sizeof(int64_t));
    o.check_all.assign(stride * n, 0);
    mpi_check(MPI_Iallgather(o.check_mine.data(), int(stride), MPI_BYTE, o.check_all.data(), int(stride), MPI_BYTE,
                             o.group->comms->debug, &o.check_req),
              "MPI_Iallgather (check)", world_rank_);
    o.check_pending = true;
    o.ev->stage = int(OpStage::checking);
  }
  lanes_[size_t(lane_index(o.ev->info.lane))].push_back(std::move(op));
}

void Engine::finish_op(Op& op) {
  if (op.finish) op.finish(op);
  op.finish = nullptr;
  op.then = nullptr;
  op.start = nullptr;  // drops the captured tensors (keep-alive ends here)
  auto& ev = *op.ev;
  ev.finished = std::chrono::steady_clock::now();
  {
    std::lock_guard lk(op.group->mu);
    if (op.collective) {
      op.group->any_completed = true;
      op.group->last_seq = ev.info.seq;
      op.group->last_tag = ev.info.tag;
      op.group->last_kind = ev.info.kind;
    }
  }
  if (Trace::enabled()) {
    TraceRecord r;
    r.lane = ev.info.lane;
    r.name = ev.info.tag;
    r.chunk = ev.info.chunk;
    r.start_us = Trace::to_us(ev.started);
    r.issued_us = Trace::to_us(ev.issued);
    r.end_us = Trace::to_us(ev.finished);
    r.bytes = ev.info.bytes;
    r.cat = std::string(op_kind_name(ev.info.kind));
    r.group = ev.info.group;
    r.seq = int64_t(ev.info.seq);
    Trace::record(std::move(r));
  }
  ev.complete();
}

void Engine::fail_op(Op& op, std::string message, bool peer_stopped) {
  op.finish = nullptr;
  op.then = nullptr;
  op.start = nullptr;
  op.ev->finished = std::chrono::steady_clock::now();
  op.ev->fail(std::move(message), peer_stopped);
}

bool Engine::fail_for_peer() {
  if (control_ == nullptr) return false;
  if (peer_left_.empty()) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_poll_ >= std::chrono::milliseconds(1)) {
      control_->poll();
      last_poll_ = now;
    }
    const int who = control_->first_exit.load();
    if (who < 0 || now - control_->first_exit_at < kPeerGrace) return false;
    peer_left_ = control_->left_line(who);
  }
  bool any = false;
  for (auto& q : lanes_) {
    for (auto& op : q) {
      if (op->started || op->check_pending) abandoned_ = true;
      const OpInfo& in = op->ev->info;
      fail_op(*op, fmt::format("{}, while rank {} waited for {} seq={} on group {} (tag {})", peer_left_, world_rank_,
                               op_kind_name(in.kind), in.seq, in.group, in.tag),
              true);
      pending_--;
      any = true;
    }
    q.clear();
  }
  return any;
}

bool Engine::step() {
  bool progressed = false;
  {
    std::deque<std::unique_ptr<Op>> in;
    {
      std::lock_guard lk(mu_);
      in.swap(incoming_);
    }
    for (auto& op : in) admit(std::move(op));
    if (!in.empty()) progressed = true;
  }
  if (fail_for_peer()) return true;  // a peer that left never completes them
  for (size_t lane = 0; lane < lanes_.size(); ++lane) {
    auto& q = lanes_[lane];
    // The pipeline's lanes start every op at once: their sends and receives go to different peers or are matched in
    // order by MPI, and a receive posted ahead must never hold up a send behind it (a model chunk's activation on
    // the last rank is sent to the first while the first waits for it).
    const bool p2p = lane == size_t(lane_index(Lane::pp_fwd)) || lane == size_t(lane_index(Lane::pp_bwd));
    const int depth = p2p ? std::numeric_limits<int>::max() : opts_.lane_depth;
    int seen = 0;
    for (auto it = q.begin(); it != q.end();) {
      Op& op = **it;
      bool remove = false;
      // Fingerprint exchanges run independently of the lane order (they were posted in submit order).
      if (op.check_pending) {
        int flag = 0;
        mpi_check(MPI_Test(&op.check_req, &flag, MPI_STATUS_IGNORE), "MPI_Test (check)", world_rank_);
        if (flag) {
          op.check_pending = false;
          progressed = true;
          const size_t n = op.group->members.size(), stride = op.check_all.size() / n;
          std::vector<CheckRecord> all;
          for (size_t r = 0; r < n; ++r) all.push_back(record_at(op.check_all, stride, r));
          std::vector<int> differ;
          for (size_t r = 1; r < all.size(); ++r)
            if (all[r].fingerprint != all[0].fingerprint) differ.push_back(int(r));
          // Same op everywhere: for an all_to_all, what r sends to q must be what q receives from r.
          std::string counts_error;
          if (differ.empty() && OpKind(all[0].kind) == OpKind::all_to_all)
            for (size_t r = 0; r < n && counts_error.empty(); ++r)
              for (size_t q = 0; q < n; ++q) {
                const int64_t sent = count_at(op.check_all, stride, r, q), expected = count_at(op.check_all, stride, q, n + r);
                if (sent == expected) continue;
                counts_error = fmt::format(
                    "rank {}: all_to_all counts disagree on group {} at seq={} tag \"{}\" (--check-collectives): "
                    "world rank {} sends {} elements to world rank {}, which expects {} from it. The op was not "
                    "started on any member.",
                    world_rank_, op.group->label, op.ev->info.seq, all[0].tag, op.group->members[r], sent,
                    op.group->members[q], expected);
                break;
              }
          if (!counts_error.empty()) {
            fail_op(op, counts_error);
            remove = true;
          } else if (!differ.empty()) {
            std::string ops;
            for (size_t r = 0; r < all.size(); ++r)
              ops += fmt::format("{}  group rank {} (world {}): {}", r ? ";" : "", r, op.group->members[r],
                                 describe(all[r]));
            std::vector<int> differ_world;
            for (int r : differ) differ_world.push_back(op.group->members[size_t(r)]);
            fail_op(op, fmt::format(
                            "rank {}: collective mismatch on group {} at seq={} (--check-collectives): world "
                            "ranks [{}] differ from world rank {}; ops:{}. The op was not started on any member.",
                            world_rank_, op.group->label, op.ev->info.seq, fmt::join(differ_world, ","),
                            op.group->members[0], ops));
            remove = true;
          } else {
            op.ev->stage = int(OpStage::queued);
          }
        }
      }
      if (!remove && seen < depth) {
        if (!op.started && !op.check_pending) {
          bool deps_done = true;
          std::string dep_error;
          for (const Event& a : op.after) {
            if (!a.ready()) {
              deps_done = false;
              break;
            }
            if (a.failed() && dep_error.empty())
              dep_error = fmt::format("{} seq={} on {} (tag {})", op_kind_name(a.info().kind), a.info().seq,
                                      a.info().group, a.info().tag);
          }
          if (deps_done && !dep_error.empty()) {
            fail_op(op, fmt::format("rank {}: {} seq={} on group {} (tag {}) not started: its `after` event {} "
                                    "failed",
                                    world_rank_, op_kind_name(op.ev->info.kind), op.ev->info.seq,
                                    op.group->label, op.ev->info.tag, dep_error));
            remove = true;
            progressed = true;
          } else if (deps_done) {
            op.after.clear();
            op.ev->started = std::chrono::steady_clock::now();
            op.ev->stage = int(OpStage::in_flight);
            op.start(op, op.group->comms->lane[size_t(lane_index(op.ev->info.lane))]);
            op.started = true;
            progressed = true;
          }
        }
        if (!remove && op.started) {
          int flag = 1;
          if (!op.reqs.empty())
            mpi_check(MPI_Testall(int(op.reqs.size()), op.reqs.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall",
                      world_rank_);
          if (flag && op.then) {  // the second round, on the same communicator
            auto then = std::move(op.then);
            op.then = nullptr;
            op.reqs.clear();
            then(op, op.group->comms->lane[size_t(lane_index(op.ev->info.lane))]);
            progressed = true;
          } else if (flag) {
            finish_op(op);
            remove = true;
            progressed = true;
          }
        }
      }
      if (remove) {
        it = q.erase(it);
        pending_--;
      } else {
        ++seen;  // an unfinished op, started or not, holds its place in the lane's issue order
        ++it;
      }
    }
  }
  return progressed;
}

void Engine::loop() {
  for (;;) {
    bool progressed = step();
    if (progressed) continue;
    std::unique_lock lk(mu_);
    if (!incoming_.empty()) continue;
    bool busy = std::any_of(lanes_.begin(), lanes_.end(), [](const auto& q) { return !q.empty(); });
    if (!busy) {
      if (stop_requested_) return;
      cv_.wait(lk, [&] { return stop_requested_ || !incoming_.empty(); });
      if (stop_requested_ && incoming_.empty()) return;
    } else {
      // (If stop() gave up with work outstanding it detached this thread; it keeps polling until MPI_Abort.)
      cv_.wait_for(lk, std::chrono::microseconds(poll_us_.load()));
    }
  }
}

}  // namespace ampipe::comm
