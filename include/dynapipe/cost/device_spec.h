// DeviceSpec: what the analytic cost model and the simulator know about one executor's
// device and its links. Presets: a100-40g, a100-80g, h100-80g, cpu (sources and
// assumptions in docs/cost-model.md).
//
//   DeviceSpec gpu = device_preset("a100-40g");
//   double ms = flops / (gpu.peak_tflops * 1e9);   // at 100% efficiency
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

  // Calibration of the analytic model (docs/cost-model.md). A matmul with m rows runs at
  // efficiency matmul_efficiency * m / (m + matmul_half_rows) of peak_tflops, so its time
  // is linear in m with an intercept: small micro-batches are not free.
  double matmul_efficiency = 0.7;
  double matmul_half_rows = 256;
  // The batched attention matmuls (QK^T, AV) run at this fraction of the efficiency above:
  // 1 on GPUs; far less in LibTorch's CPU bmm.
  double attention_efficiency = 1.0;
  // Backward matmuls run this much faster per FLOP than forward ones (larger reductions;
  // the reference profile's bw/fw ratio is 1.5-1.8, not 2).
  double backward_speedup = 1.0;
  // Fixed time per elementary op (kernel launch / framework dispatch), charged per op a
  // layer runs. Matters on CPU, where a tiny layer is dominated by it.
  double op_overhead_ms = 0;
  // Fused (flash) attention: the scores are never written to memory, so no activation,
  // softmax or dropout bytes per score, and backward recomputes QK^T (its attention
  // matmuls are 2.5x the forward's, not 2x). Off: Megatron's unfused attention, as the
  // A100 reference tables measured it.
  bool flash_attention = false;

  friend bool operator==(const DeviceSpec&, const DeviceSpec&) = default;
};

std::vector<std::string> device_preset_names();
// Throws NotFound naming the known presets.
DeviceSpec device_preset(const std::string& name);

}  // namespace dynapipe
