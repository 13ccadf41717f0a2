// Collectives on Tensors, issued through the communication engine. Each returns an Event at once; the engine
// starts the MPI call when the op's lane, its `after` events and (in --check-collectives mode) the fingerprint
// exchange allow, and completes the Event. Tensors are passed by value: the op shares their storage until it
// completed. All tensors must be contiguous; sizes are in elements; peers are group ranks.
//
//   Event d0 = comm::all_to_all(g.ep, send, recv, {send_counts, recv_counts}, "L3.fwd.dispatch.c0",
//                               {.chunk = 0});
//   Event d1 = comm::all_to_all(g.ep, send1, recv1, counts1, "L3.fwd.dispatch.c1", {.after = {d0}, .chunk = 1});
//   model::attention_forward(...);           // compute overlaps d0
//   d0.wait();                               // blocked time = exposed communication
//
// dtypes: fp32 and bf16. Data movement (all_to_all, all_gather, send/recv) copies bf16 as 16-bit words.
// Reductions of bf16 accumulate in fp32: the engine converts the input to an fp32 buffer, reduces it as
// fp32 (sum), divides by the group size for Reduce::avg, and rounds the result back to bf16 once (so a
// bf16 sum has a single rounding, not one per hop). fp32 averages divide the fp32 sum by the group size.
//
// Seq and checking: each collective takes its group's next seq (group.h). Fingerprints cover (group, seq, op,
// dtype, bytes, tag); for all_to_all the per-rank byte counts legitimately differ, so its fingerprint carries
// bytes = 0 (op, dtype and tag are still compared). Point-to-point ops are neither numbered nor checked.
//
// Lanes: an op runs on how.lane, else on the group's default lane (ep group -> ep, tp -> tp, cp -> cp, others ->
// dp). With lane depth 1 a lane runs one op at a time: a ring step that sends and receives must use send_recv
// (one op), or put its send and its recv on different lanes.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ampipe/comm/event.h"
#include "ampipe/comm/group.h"
#include "ampipe/comm/lane.h"
#include "ampipe/core/tensor.h"

namespace ampipe::comm {

struct SplitCounts {
  std::vector<int64_t> send;  // elements sent to each group rank
  std::vector<int64_t> recv;  // elements received from each group rank
};

enum class Reduce { sum, avg };

struct Issue {
  // (Every member has a default initializer, so a partial designated initializer such as {.lane = Lane::ep}
  // does not trip -Wmissing-field-initializers.)
  std::vector<Event> after{};  // start only when these are done (a failed one fails this op)
  std::optional<Lane> lane{};  // default: the group's lane
  int chunk = -1;              // for the trace
};

// send[sum(counts.send)] -> recv[sum(counts.recv)], packed in group-rank order (displacements are prefix sums).
Event all_to_all(const Group& g, Tensor send, Tensor recv, const SplitCounts& counts, std::string tag,
                 const Issue& how = {});
// recv = concat over group ranks of send (recv.numel() == size * send.numel()). In place: send may be recv's block
// `rank` (its own contribution already there).
Event all_gather(const Group& g, Tensor send, Tensor recv, std::string tag, const Issue& how = {});
// recv = block `rank` of the reduction of send over the group (send.numel() == size * recv.numel()). In place: recv
// may be send's block `rank` (only the other blocks are sent; the sum is written after they arrived).
Event reduce_scatter(const Group& g, Tensor send, Tensor recv, Reduce op, std::string tag, const Issue& how = {});
// In place: data = reduction of data over the group.
Event all_reduce(const Group& g, Tensor data, Reduce op, std::string tag, const Issue& how = {});
Event barrier(const Group& g, std::string tag, const Issue& how = {});

// Point to point (group ranks). A send matches only a recv on the same lane (each lane has its own communicator);
// messages between a pair on one lane match in issue order.
Event send(const Group& g, Tensor t, int peer, std::string tag, const Issue& how = {});
Event recv(const Group& g, Tensor t, int peer, std::string tag, const Issue& how = {});
// One op: send `out` to dst and receive `in` from src.
Event send_recv(const Group& g, Tensor out, int dst, Tensor in, int src, std::string tag, const Issue& how = {});
// A ring step, collective over the group: every rank sends `out` to group rank r+1 and receives `in` from r-1
// (mod size), posted as one sparse all-to-all-v (one non-empty block each way). Measured over a rate-limited TCP
// link (two ranks in two network namespaces, 16 MiB each way): the pair of Isend/Irecv that send_recv posts from
// the engine thread took 1.75-2x the line time in about half of the transfers, the sparse all-to-all-v never
// (docs/communication.md).
Event ring_shift(const Group& g, Tensor out, Tensor in, std::string tag, const Issue& how = {});

// Blocking conveniences for setup code: issue, then wait with the runtime's timeout.
void wait_all(const std::vector<Event>& events);
void all_reduce_sync(const Group& g, Tensor data, Reduce op, std::string tag);
void all_gather_sync(const Group& g, Tensor send, Tensor recv, std::string tag);
void barrier_sync(const Group& g, std::string tag = "barrier");
// Max of an int64 over the group (e.g. agreeing on an expert capacity).
int64_t all_reduce_max(const Group& g, int64_t value, std::string tag = "all_reduce_max");
// Every member's string, in group-rank order (used to gather traces).
std::vector<std::string> all_gather_strings(const Group& g, const std::string& mine, std::string tag);

}  // namespace ampipe::comm
