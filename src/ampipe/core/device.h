// Where a tensor's storage lives. Only the CPU exists today; this is the seam a later accelerator backend
// (its own allocator, its own kernels) plugs into: storage is allocated per device (core/tensor.cpp) and
// kernels can check the device of their operands.
#pragma once

#include <cstdint>
#include <string_view>

namespace ampipe {

enum class Device : uint8_t { cpu };

constexpr std::string_view device_name(Device d) {
  switch (d) {
    case Device::cpu:
      return "cpu";
  }
  return "?";
}

}  // namespace ampipe
