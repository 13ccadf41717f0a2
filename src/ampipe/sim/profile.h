// A hardware profile: what the simulator (sim/simulator.h) needs to cost a Plan on some machine, as plain numbers
// with their sources. Stored as JSON (profiles/*.json); `ampipe calibrate` measures one for the machine it runs on.
//
//   {
//     "name": "atlas-800t-a2 (910B2)",            "source": "where the numbers come from (free text)",
//     "devices_per_node": 8,
//     "compute": {                                  per device, per compute dtype ("bf16", "fp32")
//       "bf16": {"gemm_peak_tflops": 250.0,          the rate large GEMMs reach
//                "gemm_half_rate_dim": 256,          the smallest GEMM dimension at which the rate is half of peak:
//                                                    rate(d) = peak * d / (d + half)  (d = min(m, n, k))
//                "attention_fwd_tflops": 180.0,      causal attention forward, counted on visible pairs
//                "attention_bwd_tflops": 150.0},
//       "fp32": {...}                                the same keys (the gate's GEMM is fp32 in every mode)
//     },
//     "elementwise_gbps": 1300.0,                   memory bandwidth element-wise stages reach (GB/s, 1e9 B/s)
//     "task_overhead_us": 20.0,                     fixed cost of every compute task (launch, bookkeeping)
//     "compute_slowdown_during_comm": 0.0,          compute runs this fraction slower while a collective is in flight
//     "device_memory_gib": 64.0,                    memory of one device (GiB, 2^30 B) that a training process can use
//     "memory_reserve_gib": 2.0,                    of which the framework keeps for itself (runtime context, the
//                                                   collectives' buffers, the allocator's fragmentation)
//     "links": {                                    per link class, per device and direction
//       "intra": {"latency_us": 5.0, "gbps": 130.0},  between devices of one node
//       "inter": {"latency_us": 20.0, "gbps": 17.5}   between nodes
//     }
//   }
//
// Every number is required (a missing or non-positive one is a ConfigError naming the file and the field), except
// compute_slowdown_during_comm (default 0, may be 0), device_memory_gib (absent: memory is not checked),
// memory_reserve_gib (default 0, may be 0), "links.inter" (a one-node machine) and "fp32" (default:
// "bf16" with its three rates scaled by "compute.fp32_over_bf16", when that is given). Other keys ("source",
// "_sources", comments) are ignored.
#pragma once

#include <map>
#include <string>

#include "ampipe/core/dtype.h"

namespace ampipe::sim {

struct ComputeRates {
  double gemm_peak_tflops = 0;
  double gemm_half_rate_dim = 0;
  double attention_fwd_tflops = 0;
  double attention_bwd_tflops = 0;
};

struct LinkClass {
  double latency_us = 0;
  double gbps = 0;  // GB/s per direction (1e9 B/s)
};

struct Profile {
  std::string name;
  std::string source;
  int devices_per_node = 1;
  ComputeRates bf16, fp32;
  double elementwise_gbps = 0;
  double task_overhead_us = 0;
  double compute_slowdown_during_comm = 0;
  double device_memory_gib = 0;   // 0: not given (the simulator then does not check memory)
  double memory_reserve_gib = 0;  // the framework's own share of it
  std::map<std::string, LinkClass> links;  // "intra", "inter" (a one-node machine may give only "intra")

  const ComputeRates& rates(DType dt) const { return dt == DType::bf16 ? bf16 : fp32; }
  // The link class collectives of a group use: "inter" when the group spans nodes and the profile has it, else
  // "intra" (a ConfigError naming links.intra when that is missing too).
  const LinkClass& link(bool spans_nodes) const;
  const std::string& link_name(bool spans_nodes) const;  // "inter" or "intra", as link() chooses
};

// The profile with every compute rate (GEMM peaks, attention rates of bf16 and fp32, element-wise bandwidth)
// multiplied by `efficiency`: `ampipe simulate --compute-efficiency`, one constant for what the profile's rates do
// not capture. Links, latencies and overheads are unchanged.
Profile scale_compute(Profile p, double efficiency);

// Reads and checks a profile (throws ConfigError: "--profile PATH: <field> <problem>").
Profile load_profile(const std::string& path, const std::string& flag = "--profile");
// Writes it as JSON (atomically: a temp file renamed into place).
void save_profile(const Profile& p, const std::string& path);
// The same from and to JSON text; `where` starts every error message (load_profile passes "--profile PATH").
Profile parse_profile(const std::string& json_text, const std::string& where);
std::string profile_json(const Profile& p);

}  // namespace ampipe::sim
