#include "dynapipe/cost/device_spec.h"

#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"

namespace dynapipe {
namespace {

// Figures are public datasheet numbers; the calibration fields were fitted to the
// DynaPipe reference's A100 profile of GPT-6.7B (docs/cost-model.md shows the fit).
// Links: NVLink per-direction bandwidth for pipeline p2p, NCCL intra-node all-reduce
// bus bandwidth for data parallelism.
const std::vector<DeviceSpec>& presets() {
  static const std::vector<DeviceSpec> kPresets = [] {
    std::vector<DeviceSpec> v;

    DeviceSpec a100;  // A100 SXM4 40 GB: 312 TFLOP/s bf16 dense, HBM2 1555 GB/s, NVLink3
    a100.name = "a100-40g";
    a100.peak_tflops = 312;
    a100.memory_bandwidth_gbs = 1555;
    a100.memory_bytes = 40 * kGiB;
    a100.link_bandwidth_gbs = 300;       // NVLink3: 600 GB/s both directions
    a100.link_latency_ms = 0.005;
    a100.allreduce_bandwidth_gbs = 230;  // nccl-tests all_reduce busbw on DGX A100
    a100.bytes_per_element = 2;
    // Fitted to the DynaPipe artifact's measured GPT-6.7B layers at tp 1 (every measured
    // (seqlen, mbs) x recompute mode; docs/cost-model.md, "Accuracy"): Megatron's eager
    // kernels cost ~40 us each, its non-flash attention runs at 0.6 of the matmul rate.
    a100.matmul_efficiency = 0.70;
    a100.matmul_half_rows = 16;
    a100.attention_efficiency = 0.6;
    a100.backward_speedup = 1.10;
    a100.op_overhead_ms = 0.04;
    v.push_back(a100);

    DeviceSpec a100_80 = a100;  // A100 SXM4 80 GB: HBM2e 2039 GB/s
    a100_80.name = "a100-80g";
    a100_80.memory_bandwidth_gbs = 2039;
    a100_80.memory_bytes = 80 * kGiB;
    v.push_back(a100_80);

    DeviceSpec h100;  // H100 SXM5 80 GB: 989 TFLOP/s bf16 dense, HBM3 3350 GB/s, NVLink4
    h100.name = "h100-80g";
    h100.peak_tflops = 989;
    h100.memory_bandwidth_gbs = 3350;
    h100.memory_bytes = 80 * kGiB;
    h100.link_bandwidth_gbs = 450;       // NVLink4: 900 GB/s both directions
    h100.link_latency_ms = 0.005;
    h100.allreduce_bandwidth_gbs = 360;
    h100.bytes_per_element = 2;
    // Megatron-class training reaches a smaller fraction of H100 peak, and needs larger
    // shapes to get there, than on A100 (assumption). Flash attention and its efficiency
    // checked against GPT-6.7B and T5-11B measured on an H100 (docs/cost-model.md).
    h100.matmul_efficiency = 0.62;
    h100.matmul_half_rows = 900;
    h100.backward_speedup = 1.15;
    h100.op_overhead_ms = 0.002;
    h100.flash_attention = true;
    h100.attention_efficiency = 0.6;
    v.push_back(h100);

    // This machine: a 2-core AVX-512 EPYC VM, 24 GiB, running Debian's LibTorch 1.13 with
    // one thread per executor and the allocator keeping freed pages (runtime.md). Time
    // terms fitted to whole-stage profiles of gpt-tiny and t5-tiny, then scaled to train's
    // measured steps (bench/fit_device, docs/cost-model.md "Device presets"): ~73 GFLOP/s
    // in linear layers, the attention bmm at 0.6 of that, elementwise ops at 6.7 GB/s,
    // 22 us per op. Loopback Gloo ~2.5 GB/s, ~0.1 ms. fp32.
    DeviceSpec cpu;
    cpu.name = "cpu";
    cpu.peak_tflops = 0.086;
    cpu.memory_bandwidth_gbs = 6.7;
    cpu.memory_bytes = 24 * kGiB;
    cpu.link_bandwidth_gbs = 2.5;
    cpu.link_latency_ms = 0.1;
    cpu.allreduce_bandwidth_gbs = 2.5;
    cpu.bytes_per_element = 4;
    cpu.matmul_efficiency = 0.85;
    cpu.matmul_half_rows = 22;
    cpu.attention_efficiency = 0.6;
    cpu.backward_speedup = 1.2;
    cpu.op_overhead_ms = 0.022;  // LibTorch eager dispatch per op
    v.push_back(cpu);
    return v;
  }();
  return kPresets;
}

}  // namespace

std::vector<std::string> device_preset_names() {
  std::vector<std::string> names;
  for (const auto& d : presets()) names.push_back(d.name);
  return names;
}

DeviceSpec device_preset(const std::string& name) {
  for (const auto& d : presets()) {
    if (d.name == name) return d;
  }
  throw Error(ErrorKind::NotFound,
              cat("device preset must be one of ", join(device_preset_names(), ", "), ", got '", name, "'"));
}

}  // namespace dynapipe
