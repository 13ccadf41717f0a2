// Lanes: where a task or an operation runs. The compute lane is the rank's main thread; the communication lanes
// (ep, tp, cp, dp) are ordered queues served by the communication engine thread (engine.cpp). Every group has one
// duplicated MPI communicator per communication lane, so operations on different lanes never mix messages.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace ampipe::comm {

enum class Lane : uint8_t { compute, ep, tp, cp, dp };

inline constexpr int kNumLanes = 5;
inline constexpr std::array<Lane, 4> kCommLanes = {Lane::ep, Lane::tp, Lane::cp, Lane::dp};

constexpr int lane_index(Lane l) { return int(l); }

constexpr std::string_view lane_name(Lane l) {
  switch (l) {
    case Lane::compute: return "compute";
    case Lane::ep: return "ep";
    case Lane::tp: return "tp";
    case Lane::cp: return "cp";
    case Lane::dp: return "dp";
  }
  return "?";
}

}  // namespace ampipe::comm
