#include "dynapipe/schedule/pipeline.h"

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {

char op_kind_letter(OpKind kind) {
  switch (kind) {
    case OpKind::F: return 'F';
    case OpKind::B: return 'B';
    case OpKind::I: return 'I';
    case OpKind::W: return 'W';
  }
  return '?';
}

std::string op_name(const PipelineOp& op) {
  return cat(op_kind_letter(op.kind), "(mb ", op.mb, ", stage ", op.stage, ")");
}

int PipelineProblem::num_sim_devices() const {
  if (stage_replicas.empty()) return layout.num_devices;
  int total = 0;
  for (int r : stage_replicas) total += r;
  return total;
}

void PipelineProblem::validate() const {
  constexpr const char* kWhere = "pipeline problem";
  if (layout.num_devices < 1) {
    throw Error(ErrorKind::InvalidArgument,
                cat(kWhere, ": layout.num_devices must be >= 1, got ", layout.num_devices));
  }
  if (layout.chunks < 1) {
    throw Error(ErrorKind::InvalidArgument,
                cat(kWhere, ": layout.chunks must be >= 1, got ", layout.chunks));
  }
  // Bytes per device: one entry >= 0 each (or, where `may_be_empty`, none at all).
  auto check_per_device = [&](const char* name, const std::vector<std::int64_t>& bytes,
                              bool may_be_empty) {
    if (may_be_empty && bytes.empty()) return;
    if (static_cast<int>(bytes.size()) != layout.num_devices) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(kWhere, ": ", name, " must ", may_be_empty ? "be empty or " : "",
                      "have one entry per device (", layout.num_devices, "), got ",
                      bytes.size()));
    }
    for (std::size_t d = 0; d < bytes.size(); ++d) {
      if (bytes[d] < 0) {
        throw Error(ErrorKind::InvalidArgument,
                    cat(kWhere, ": ", name, "[", d, "] must be >= 0, got ", bytes[d]));
      }
    }
  };
  check_per_device("static_bytes", static_bytes, false);
  check_per_device("weight_bytes", weight_bytes, true);
  if (memory_limit_bytes < 0 || link_latency_ms < 0 || link_bandwidth_gbs < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat(kWhere, ": memory_limit_bytes, link_latency_ms and link_bandwidth_gbs must be "
                            ">= 0, got ",
                    memory_limit_bytes, ", ", link_latency_ms, ", ", link_bandwidth_gbs));
  }
  if (!stage_replicas.empty()) {
    bool ok = static_cast<int>(stage_replicas.size()) == layout.num_devices && layout.chunks == 1;
    for (int r : stage_replicas) ok = ok && r >= 1;
    if (!ok) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(kWhere, ": stage_replicas must be empty or one count >= 1 per device (",
                      layout.num_devices, ") with chunks 1, got ", join(stage_replicas, ","),
                      " with chunks ", layout.chunks));
    }
  }
  const int stages = num_stages();
  for (std::size_t mb = 0; mb < costs.size(); ++mb) {
    if (static_cast<int>(costs[mb].size()) != stages) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(kWhere, ": costs[", mb, "] must have one entry per virtual stage (", stages,
                      "), got ", costs[mb].size()));
    }
    for (int s = 0; s < stages; ++s) {
      const StageCost& c = costs[mb][s];
      // `!(x >= 0)` also rejects NaN.
      if (!(c.fwd_ms >= 0) || !(c.bwd_ms >= 0) || !(c.bwd_input_ms >= 0) ||
          !(c.bwd_weight_ms >= 0) || c.stored_bytes < 0 || c.peak_bytes < 0 ||
          c.output_bytes < 0) {
        throw Error(ErrorKind::InvalidArgument,
                    cat(kWhere, ": costs[", mb, "][", s,
                        "] must have non-negative times and bytes, got fwd_ms ", c.fwd_ms,
                        ", bwd_ms ", c.bwd_ms, ", bwd_input_ms ", c.bwd_input_ms,
                        ", bwd_weight_ms ", c.bwd_weight_ms, ", stored_bytes ", c.stored_bytes,
                        ", peak_bytes ", c.peak_bytes, ", output_bytes ", c.output_bytes));
      }
    }
  }
}

}  // namespace dynapipe
