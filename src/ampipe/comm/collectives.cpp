#include "ampipe/comm/collectives.h"

#include <fmt/format.h>

#include <climits>
#include <memory>
#include <numeric>

#include "ampipe/comm/mpi_detail.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"

namespace ampipe::comm {

namespace {

constexpr uint32_t kI64 = 2, kBytes = 3;

uint32_t dtype_code(DType t) { return t == DType::f32 ? 0u : 1u; }
MPI_Datatype move_type(DType t) { return t == DType::f32 ? MPI_FLOAT : MPI_UINT16_T; }

void check_rc(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  AMPIPE_CHECK(false, "{} failed: {}", what, std::string(buf, size_t(len)));
}

int to_int(int64_t v, const std::string& tag) {
  AMPIPE_CHECK(v >= 0 && v <= INT_MAX, "{}: count {} does not fit an MPI int", tag, v);
  return int(v);
}

void require(const Tensor& t, const std::string& what, const std::string& tag) {
  AMPIPE_CHECK(t.defined(), "{}: {} tensor is undefined", tag, what);
  AMPIPE_CHECK(t.is_contiguous(), "{}: {} tensor {} must be contiguous", tag, what, shape_str(t.shape()));
}

std::unique_ptr<Op> make_op(const Group& g, OpKind kind, size_t bytes, std::string tag, const Issue& how,
                            bool collective) {
  AMPIPE_CHECK(g.valid(), "{}: invalid group", tag);
  auto op = std::make_unique<Op>();
  auto ev = std::make_shared<EventState>();
  Lane lane = how.lane.value_or(g.default_lane());
  AMPIPE_CHECK(lane != Lane::compute, "{}: collectives run on a communication lane, not compute", tag);
  ev->info.group = g.label();
  ev->info.kind = kind;
  ev->info.bytes = bytes;
  ev->info.tag = std::move(tag);
  ev->info.lane = lane;
  ev->info.chunk = how.chunk;
  ev->group = g.state();
  Runtime& rt = Runtime::current();
  ev->world_rank = rt.rank();
  op->ev = std::move(ev);
  op->group = g.state();
  op->collective = collective;
  op->check = collective && rt.options().check_collectives;
  op->after = how.after;
  return op;
}

Event submit(std::unique_ptr<Op> op) { return op->group->engine->submit(std::move(op)); }

std::shared_ptr<std::vector<float>> to_f32(const Tensor& t) {
  auto v = std::make_shared<std::vector<float>>(size_t(t.numel()));
  const bf16* p = t.data<bf16>();
  for (size_t i = 0; i < v->size(); ++i) (*v)[i] = bf16_to_f32(p[i]);
  return v;
}

void from_f32(const std::vector<float>& v, Tensor& t, float scale) {
  bf16* p = t.data<bf16>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = f32_to_bf16(v[i] * scale);
}

void scale_f32(Tensor& t, float scale) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] *= scale;
}

}  // namespace

Event all_to_all(const Group& g, Tensor send, Tensor recv, const SplitCounts& counts, std::string tag,
                 const Issue& how) {
  require(send, "send", tag);
  require(recv, "recv", tag);
  AMPIPE_CHECK(send.dtype() == recv.dtype(), "{}: send {} vs recv {}", tag, dtype_name(send.dtype()),
               dtype_name(recv.dtype()));
  const size_t n = size_t(g.size());
  AMPIPE_CHECK(counts.send.size() == n && counts.recv.size() == n,
               "{}: {} send / {} recv counts for group {} of size {}", tag, counts.send.size(), counts.recv.size(),
               g.label(), n);
  auto sc = std::make_shared<std::vector<int>>(n), sd = std::make_shared<std::vector<int>>(n);
  auto rc = std::make_shared<std::vector<int>>(n), rd = std::make_shared<std::vector<int>>(n);
  int64_t stot = 0, rtot = 0;
  for (size_t i = 0; i < n; ++i) {
    (*sc)[i] = to_int(counts.send[i], tag);
    (*rc)[i] = to_int(counts.recv[i], tag);
    (*sd)[i] = to_int(stot, tag);
    (*rd)[i] = to_int(rtot, tag);
    stot += counts.send[i];
    rtot += counts.recv[i];
  }
  AMPIPE_CHECK(stot <= send.numel(), "{}: send counts sum to {} > send tensor {} elements", tag, stot, send.numel());
  AMPIPE_CHECK(rtot <= recv.numel(), "{}: recv counts sum to {} > recv tensor {} elements", tag, rtot, recv.numel());
  auto op = make_op(g, OpKind::all_to_all, size_t(stot) * dtype_size(send.dtype()), std::move(tag), how, true);
  op->dtype_code = dtype_code(send.dtype());
  op->check_bytes = 0;
  op->check_counts = counts.send;
  op->check_counts.insert(op->check_counts.end(), counts.recv.begin(), counts.recv.end());
  op->start = [send, recv, sc, sd, rc, rd](Op& o, MPI_Comm comm) mutable {
    MPI_Datatype t = move_type(send.dtype());
    o.reqs.emplace_back();
    check_rc(MPI_Ialltoallv(send.raw(), sc->data(), sd->data(), t, recv.raw(), rc->data(), rd->data(), t, comm,
                            &o.reqs.back()),
             "MPI_Ialltoallv");
  };
  return submit(std::move(op));
}

Event all_gather(const Group& g, Tensor send, Tensor recv, std::string tag, const Issue& how) {
  require(send, "send", tag);
  require(recv, "recv", tag);
  AMPIPE_CHECK(send.dtype() == recv.dtype(), "{}: dtype mismatch", tag);
  AMPIPE_CHECK(recv.numel() == send.numel() * g.size(), "{}: recv {} elements != {} ranks x send {}", tag,
               recv.numel(), g.size(), send.numel());
  int cnt = to_int(send.numel(), tag);
  auto op = make_op(g, OpKind::all_gather, send.nbytes(), std::move(tag), how, true);
  op->dtype_code = dtype_code(send.dtype());
  op->check_bytes = send.nbytes();
  // in place: `send` is this rank's own block of `recv` (MPI_IN_PLACE; MPI forbids overlapping buffers otherwise)
  const bool in_place =
      static_cast<const unsigned char*>(send.raw()) ==
      static_cast<const unsigned char*>(recv.raw()) + size_t(g.rank()) * send.nbytes();
  op->start = [send, recv, cnt, in_place](Op& o, MPI_Comm comm) mutable {
    MPI_Datatype t = move_type(send.dtype());
    o.reqs.emplace_back();
    check_rc(MPI_Iallgather(in_place ? MPI_IN_PLACE : send.raw(), cnt, t, recv.raw(), cnt, t, comm, &o.reqs.back()),
             "MPI_Iallgather");
  };
  return submit(std::move(op));
}

// Reductions (docs/communication.md, "Reductions"). Open MPI's non-blocking reduce-scatter and all-reduce (libnbc)
// moved 2.8x and 1.9x as long as the bandwidth-optimal volume over a shaped link between two ranks, so the
// reductions are built from an all-to-all instead: every rank sends block j of its input to rank j (in the input's
// own dtype) and adds the g blocks it receives, in rank order and in fp32; the all-reduce then all-gathers the
// reduced blocks. Each rank moves (g-1)/g of the data per round, and every rank ends with the same bits (each block
// is rounded once, by its owner). The sums run on the engine thread.
namespace {

// Block j of n elements over g ranks: the first n % g blocks have one element more.
int64_t block_count(int64_t n, int g, int j) { return n / g + (j < n % g ? 1 : 0); }
int64_t block_offset(int64_t n, int g, int j) { return j * (n / g) + std::min<int64_t>(j, n % g); }

float load(const unsigned char* base, DType dt, int64_t i) {
  return dt == DType::f32 ? reinterpret_cast<const float*>(base)[i]
                          : bf16_to_f32(reinterpret_cast<const bf16*>(base)[i]);
}

// Where rank j's block lands among the other ranks' blocks (this rank, r, keeps its own in place).
int other_slot(int j, int r) { return j < r ? j : j - 1; }

// out[i] = scale * sum over ranks j in order of rank j's block `r`, in fp32, rounded once to dt: this rank's own
// block is `own`, the others' are `others` (g - 1 blocks of cnt, in rank order without r). out may be own.
void sum_blocks(const unsigned char* own, const std::vector<unsigned char>& others, DType dt, int g, int r,
                int64_t cnt, unsigned char* out, float scale) {
  for (int64_t i = 0; i < cnt; ++i) {
    float acc = 0;
    for (int j = 0; j < g; ++j)
      acc += j == r ? load(own, dt, i) : load(others.data(), dt, int64_t(other_slot(j, r)) * cnt + i);
    acc *= scale;
    if (dt == DType::f32)
      reinterpret_cast<float*>(out)[i] = acc;
    else
      reinterpret_cast<bf16*>(out)[i] = f32_to_bf16(acc);
  }
}

// Below this many elements an all-reduce is latency-bound: one MPI_Iallreduce round beats two.
constexpr int64_t kSmallAllReduce = 16384;

// The all-to-all-v counts and displacements (elements) that send block j (count[j] at offset[j]) to rank j and
// receive rank j's block `r` (mine elements each) into other_slot(j, r): nothing to or from itself.
struct BlockExchange {
  std::vector<int> send_count, send_offset, recv_count, recv_offset;
  BlockExchange(const std::vector<int>& count, const std::vector<int>& offset, int r, int mine) {
    for (int j = 0; j < int(count.size()); ++j) {
      send_count.push_back(j == r ? 0 : count[size_t(j)]);
      send_offset.push_back(offset[size_t(j)]);
      recv_count.push_back(j == r ? 0 : mine);
      recv_offset.push_back(j == r ? 0 : other_slot(j, r) * mine);
    }
  }
};

}  // namespace

Event reduce_scatter(const Group& g, Tensor send, Tensor recv, Reduce rop, std::string tag, const Issue& how) {
  require(send, "send", tag);
  require(recv, "recv", tag);
  AMPIPE_CHECK(send.dtype() == recv.dtype(), "{}: dtype mismatch", tag);
  AMPIPE_CHECK(send.numel() == recv.numel() * g.size(), "{}: send {} elements != {} ranks x recv {}", tag,
               send.numel(), g.size(), recv.numel());
  const int cnt = to_int(recv.numel(), tag), n = g.size();
  const float scale = rop == Reduce::avg ? 1.0f / float(n) : 1.0f;
  const DType dt = send.dtype();
  auto op = make_op(g, OpKind::reduce_scatter, send.nbytes(), std::move(tag), how, true);
  op->dtype_code = dtype_code(dt);
  op->check_bytes = send.nbytes();
  const int r = g.rank();
  auto blocks = std::make_shared<std::vector<unsigned char>>();  // the other ranks' block `r`, in rank order
  std::vector<int> count(size_t(n), cnt), offset;
  for (int j = 0; j < n; ++j) offset.push_back(j * cnt);
  auto ex = std::make_shared<BlockExchange>(count, offset, r, cnt);
  op->start = [send, cnt, n, blocks, ex](Op& o, MPI_Comm comm) mutable {
    blocks->resize(size_t(n - 1) * size_t(cnt) * dtype_size(send.dtype()));
    const MPI_Datatype t = move_type(send.dtype());
    o.reqs.emplace_back();
    check_rc(MPI_Ialltoallv(send.raw(), ex->send_count.data(), ex->send_offset.data(), t, blocks->data(),
                            ex->recv_count.data(), ex->recv_offset.data(), t, comm, &o.reqs.back()),
             "MPI_Ialltoallv");
  };
  op->finish = [send, recv, blocks, ex, dt, n, r, cnt, scale](Op&) mutable {
    const unsigned char* own = static_cast<const unsigned char*>(send.raw()) + size_t(r) * size_t(cnt) * dtype_size(dt);
    sum_blocks(own, *blocks, dt, n, r, cnt, static_cast<unsigned char*>(recv.raw()), scale);
    blocks.reset();
    ex.reset();
  };
  return submit(std::move(op));
}

Event all_reduce(const Group& g, Tensor data, Reduce rop, std::string tag, const Issue& how) {
  require(data, "data", tag);
  const int cnt = to_int(data.numel(), tag), n = g.size();
  const float scale = rop == Reduce::avg ? 1.0f / float(n) : 1.0f;
  const DType dt = data.dtype();
  auto op = make_op(g, OpKind::all_reduce, data.nbytes(), std::move(tag), how, true);
  op->dtype_code = dtype_code(dt);
  op->check_bytes = data.nbytes();
  if (n == 1 || cnt < kSmallAllReduce) {  // one MPI round, in fp32
    auto buf = std::make_shared<std::shared_ptr<std::vector<float>>>();
    op->start = [data, cnt, buf](Op& o, MPI_Comm comm) mutable {
      float* p = data.dtype() == DType::f32 ? data.data<float>() : (*buf = to_f32(data))->data();
      o.reqs.emplace_back();
      check_rc(MPI_Iallreduce(MPI_IN_PLACE, p, cnt, MPI_FLOAT, MPI_SUM, comm, &o.reqs.back()), "MPI_Iallreduce");
    };
    op->finish = [data, buf, scale](Op&) mutable {
      if (data.dtype() == DType::f32) {
        if (scale != 1.0f) scale_f32(data, scale);
      } else {
        from_f32(**buf, data, scale);
        buf->reset();
      }
    };
    return submit(std::move(op));
  }
  // Round 1: block j to rank j. Round 2 (then): this rank's block summed in place, then every block all-gathered.
  struct Layout {
    std::vector<int> count, offset;  // block j: elements and element offset in data
    std::unique_ptr<BlockExchange> ex;
    std::vector<unsigned char> blocks;  // the other ranks' block `r`, in rank order
  };
  auto lay = std::make_shared<Layout>();
  const int r = g.rank();
  for (int j = 0; j < n; ++j) {
    lay->count.push_back(int(block_count(cnt, n, j)));
    lay->offset.push_back(int(block_offset(cnt, n, j)));
  }
  const int mine = lay->count[size_t(r)];
  lay->ex = std::make_unique<BlockExchange>(lay->count, lay->offset, r, mine);
  op->start = [data, lay, n, mine](Op& o, MPI_Comm comm) mutable {
    const MPI_Datatype t = move_type(data.dtype());
    lay->blocks.resize(size_t(n - 1) * size_t(mine) * dtype_size(data.dtype()));
    o.reqs.emplace_back();
    const BlockExchange& ex = *lay->ex;
    check_rc(MPI_Ialltoallv(data.raw(), ex.send_count.data(), ex.send_offset.data(), t, lay->blocks.data(),
                            ex.recv_count.data(), ex.recv_offset.data(), t, comm, &o.reqs.back()),
             "MPI_Ialltoallv");
  };
  op->then = [data, lay, dt, n, r, mine, scale](Op& o, MPI_Comm comm) mutable {
    unsigned char* own = static_cast<unsigned char*>(data.raw()) + size_t(lay->offset[size_t(r)]) * dtype_size(dt);
    sum_blocks(own, lay->blocks, dt, n, r, mine, own, scale);
    lay->blocks = {};
    const MPI_Datatype t = move_type(dt);
    o.reqs.emplace_back();
    check_rc(MPI_Iallgatherv(MPI_IN_PLACE, 0, t, data.raw(), lay->count.data(), lay->offset.data(), t, comm,
                             &o.reqs.back()),
             "MPI_Iallgatherv");
  };
  op->finish = [data, lay](Op&) mutable { lay.reset(); };
  return submit(std::move(op));
}

Event barrier(const Group& g, std::string tag, const Issue& how) {
  auto op = make_op(g, OpKind::barrier, 0, std::move(tag), how, true);
  op->dtype_code = kBytes;
  op->start = [](Op& o, MPI_Comm comm) {
    o.reqs.emplace_back();
    check_rc(MPI_Ibarrier(comm, &o.reqs.back()), "MPI_Ibarrier");
  };
  return submit(std::move(op));
}

namespace {
void check_peer(const Group& g, int peer, const std::string& tag) {
  AMPIPE_CHECK(peer >= 0 && peer < g.size() && peer != g.rank(), "{}: peer {} on group {} (own rank {})", tag,
               peer, g.label(), g.rank());
}
constexpr int kP2PTag = 7;

// send and recv: one message of t to or from `peer`, the same checks and op either way.
Event point_to_point(OpKind kind, const Group& g, Tensor t, int peer, std::string tag, const Issue& how) {
  const bool is_send = kind == OpKind::send;
  require(t, is_send ? "send" : "recv", tag);
  check_peer(g, peer, tag);
  int cnt = to_int(t.numel(), tag);
  auto op = make_op(g, kind, t.nbytes(), std::move(tag), how, false);
  op->ev->info.peer = peer;
  op->start = [t, cnt, peer, is_send](Op& o, MPI_Comm comm) mutable {
    o.reqs.emplace_back();
    if (is_send)
      check_rc(MPI_Isend(t.raw(), cnt, move_type(t.dtype()), peer, kP2PTag, comm, &o.reqs.back()), "MPI_Isend");
    else
      check_rc(MPI_Irecv(t.raw(), cnt, move_type(t.dtype()), peer, kP2PTag, comm, &o.reqs.back()), "MPI_Irecv");
  };
  return submit(std::move(op));
}
}  // namespace

Event send(const Group& g, Tensor t, int peer, std::string tag, const Issue& how) {
  return point_to_point(OpKind::send, g, std::move(t), peer, std::move(tag), how);
}

Event recv(const Group& g, Tensor t, int peer, std::string tag, const Issue& how) {
  return point_to_point(OpKind::recv, g, std::move(t), peer, std::move(tag), how);
}

Event send_recv(const Group& g, Tensor out, int dst, Tensor in, int src, std::string tag, const Issue& how) {
  require(out, "send", tag);
  require(in, "recv", tag);
  check_peer(g, dst, tag);
  check_peer(g, src, tag);
  int scnt = to_int(out.numel(), tag), rcnt = to_int(in.numel(), tag);
  auto op = make_op(g, OpKind::send_recv, out.nbytes(), std::move(tag), how, false);
  op->ev->info.peer = dst;
  op->start = [out, in, scnt, rcnt, dst, src](Op& o, MPI_Comm comm) mutable {
    o.reqs.resize(2);
    check_rc(MPI_Irecv(in.raw(), rcnt, move_type(in.dtype()), src, kP2PTag, comm, &o.reqs[0]), "MPI_Irecv");
    check_rc(MPI_Isend(out.raw(), scnt, move_type(out.dtype()), dst, kP2PTag, comm, &o.reqs[1]), "MPI_Isend");
  };
  return submit(std::move(op));
}

Event ring_shift(const Group& g, Tensor out, Tensor in, std::string tag, const Issue& how) {
  require(out, "send", tag);
  require(in, "recv", tag);
  const int n = g.size(), r = g.rank();
  SplitCounts counts;
  counts.send.assign(size_t(n), 0);
  counts.recv.assign(size_t(n), 0);
  counts.send[size_t((r + 1) % n)] = out.numel();
  counts.recv[size_t((r + n - 1) % n)] = in.numel();
  return all_to_all(g, std::move(out), std::move(in), counts, std::move(tag), how);
}

void wait_all(const std::vector<Event>& events) {
  for (const Event& e : events) e.wait();
}

void all_reduce_sync(const Group& g, Tensor data, Reduce op, std::string tag) {
  all_reduce(g, std::move(data), op, std::move(tag)).wait();
}

void all_gather_sync(const Group& g, Tensor send, Tensor recv, std::string tag) {
  all_gather(g, std::move(send), std::move(recv), std::move(tag)).wait();
}

void barrier_sync(const Group& g, std::string tag) { barrier(g, std::move(tag)).wait(); }

int64_t all_reduce_max(const Group& g, int64_t value, std::string tag) {
  auto buf = std::make_shared<int64_t>(value);
  auto op = make_op(g, OpKind::all_reduce, sizeof(int64_t), std::move(tag), {}, true);
  op->dtype_code = kI64;
  op->check_bytes = sizeof(int64_t);
  op->start = [buf](Op& o, MPI_Comm comm) {
    o.reqs.emplace_back();
    check_rc(MPI_Iallreduce(MPI_IN_PLACE, buf.get(), 1, MPI_INT64_T, MPI_MAX, comm, &o.reqs.back()),
             "MPI_Iallreduce");
  };
  submit(std::move(op)).wait();
  return *buf;
}

std::vector<std::string> all_gather_strings(const Group& g, const std::string& mine, std::string tag) {
  const size_t n = size_t(g.size());
  auto lens = std::make_shared<std::vector<int64_t>>(n);
  auto my_len = std::make_shared<int64_t>(int64_t(mine.size()));
  auto op = make_op(g, OpKind::all_gather, sizeof(int64_t), tag + ".sizes", {}, true);
  op->dtype_code = kI64;
  op->check_bytes = sizeof(int64_t);
  op->start = [lens, my_len](Op& o, MPI_Comm comm) {
    o.reqs.emplace_back();
    check_rc(MPI_Iallgather(my_len.get(), 1, MPI_INT64_T, lens->data(), 1, MPI_INT64_T, comm, &o.reqs.back()),
             "MPI_Iallgather");
  };
  submit(std::move(op)).wait();
  auto counts = std::make_shared<std::vector<int>>(n), displs = std::make_shared<std::vector<int>>(n);
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    (*counts)[i] = to_int((*lens)[i], tag);
    (*displs)[i] = to_int(total, tag);
    total += (*lens)[i];
  }
  auto all = std::make_shared<std::string>(size_t(total), '\0');
  auto src = std::make_shared<std::string>(mine);
  auto op2 = make_op(g, OpKind::all_gather, mine.size(), tag, {}, true);
  op2->dtype_code = kBytes;
  op2->check_bytes = 0;  // per-rank sizes differ
  op2->start = [all, src, counts, displs](Op& o, MPI_Comm comm) {
    o.reqs.emplace_back();
    check_rc(MPI_Iallgatherv(src->data(), int(src->size()), MPI_CHAR, all->data(), counts->data(), displs->data(),
                             MPI_CHAR, comm, &o.reqs.back()),
             "MPI_Iallgatherv");
  };
  submit(std::move(op2)).wait();
  std::vector<std::string> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = all->substr(size_t((*displs)[i]), size_t((*counts)[i]));
  return out;
}

}  // namespace ampipe::comm
