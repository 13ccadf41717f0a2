// Lanes: where a task or an operation runs. The compute lane is the rank's main thread; the communication lanes
// (ep, tp, cp, dp, etp, pp_fwd, pp_bwd) are ordered queues served by the communication engine thread (engine.cpp). Every group has one
// duplicated MPI communicator per communication lane, so operations on different lanes never mix messages.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace ampipe::comm {

// etp: the experts' tensor-parallel collectives (on the tp group), a queue of their own so that an expert all-gather
// waiting for its dispatch never holds up the attention side's tp collectives, nor the other way round.
// pp_fwd, pp_bwd: pipeline parallelism's sends and receives of activations (downstream) and of their gradients
// (upstream), one queue per direction, so that a send waiting for its receiver never holds up a message flowing the
// other way; their ops start at once, in issue order (engine.cpp), so a receive posted ahead never holds up a send
// (docs/training.md, "Pipeline parallelism").
enum class Lane : uint8_t { compute, ep, tp, cp, dp, etp, pp_fwd, pp_bwd };

inline constexpr int kNumLanes = 8;
inline constexpr std::array<Lane, 7> kCommLanes = {Lane::ep,  Lane::tp,     Lane::cp,    Lane::dp,
                                                   Lane::etp, Lane::pp_fwd, Lane::pp_bwd};

constexpr int lane_index(Lane l) { return int(l); }

constexpr std::string_view lane_name(Lane l) {
  switch (l) {
    case Lane::compute: return "compute";
    case Lane::ep: return "ep";
    case Lane::tp: return "tp";
    case Lane::cp: return "cp";
    case Lane::dp: return "dp";
    case Lane::etp: return "etp";
    case Lane::pp_fwd: return "pp_fwd";
    case Lane::pp_bwd: return "pp_bwd";
  }
  return "?";
}

}  // namespace ampipe::comm
