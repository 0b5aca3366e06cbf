// DeviceSpec: what the analytic cost model and the simulator know about one executor's
// device and its links. Presets: a100-40g, a100-80g, h100-80g, cpu.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dynapipe {

struct DeviceSpec {
  std::string name;
  double peak_tflops = 0;          // dense half-precision matmul peak (fp32 for cpu)
  double memory_bandwidth_gbs = 0; // device memory bandwidth, GB/s
  std::int64_t memory_bytes = 0;   // device memory
  double link_bandwidth_gbs = 0;   // point-to-point bandwidth between pipeline stages, GB/s
  double link_latency_ms = 0;      // per-message latency
  double allreduce_bandwidth_gbs = 0;  // data-parallel gradient all-reduce bus bandwidth, GB/s
  int bytes_per_element = 2;       // activation/parameter element size (2 = bf16/fp16, 4 = fp32)
};

std::vector<std::string> device_preset_names();
// Throws NotFound naming the known presets.
DeviceSpec device_preset(const std::string& name);

}  // namespace dynapipe
