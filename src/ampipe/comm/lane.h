// Lanes: where a task or an operation runs. The compute lane is the rank's main thread; the communication lanes
// (ep, tp, cp, dp, etp) are ordered queues served by the communication engine thread (engine.cpp). Every group has one
// duplicated MPI communicator per communication lane, so operations on different lanes never mix messages.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace ampipe::comm {

// etp: the experts' tensor-parallel collectives (on the tp group), a queue of their own so that an expert all-gather
// waiting for its dispatch never holds up the attention side's tp collectives, nor the other way round.
enum class Lane : uint8_t { compute, ep, tp, cp, dp, etp };

inline constexpr int kNumLanes = 6;
inline constexpr std::array<Lane, 5> kCommLanes = {Lane::ep, Lane::tp, Lane::cp, Lane::dp, Lane::etp};

constexpr int lane_index(Lane l) { return int(l); }

constexpr std::string_view lane_name(Lane l) {
  switch (l) {
    case Lane::compute: return "compute";
    case Lane::ep: return "ep";
    case Lane::tp: return "tp";
    case Lane::cp: return "cp";
    case Lane::dp: return "dp";
    case Lane::etp: return "etp";
  }
  return "?";
}

}  // namespace ampipe::comm
