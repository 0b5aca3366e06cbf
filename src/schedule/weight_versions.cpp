#include "dynapipe/schedule/weight_versions.h"

#include <algorithm>
#include <map>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {
namespace {

bool steps_within(WeightUpdate rule) { return rule != WeightUpdate::PerIteration; }

// Position of each micro-batch in device 0's forward order (the injection order).
std::map<int, int> injection_positions(const ScheduleOrder& order) {
  std::map<int, int> position;
  if (order.device_ops.empty()) return position;
  for (const PipelineOp& op : order.device_ops[0]) {
    if (op.kind == OpKind::F) position.emplace(op.mb, static_cast<int>(position.size()));
  }
  return position;
}

void check_op(const PipelineOp& op, int device) {
  if ((op.kind != OpKind::F && op.kind != OpKind::B) || op.stage != device) {
    throw Error(ErrorKind::InvalidArgument,
                cat("weight versions: every op of device ", device, " must be F or B on stage ",
                    device, ", got ", op_name(op)));
  }
}

// Versions of the ops of one device, and its step points, under `rule`; `first_device`
// gives the versions device 0 chose (vertical sync).
DeviceVersions versions_of_device(const ScheduleOrder& order, int device,
                                  const std::map<int, int>& position,
                                  const std::map<int, int>& first_device_version) {
  const WeightUpdate rule = order.weight_update;
  const auto& ops = order.device_ops[static_cast<std::size_t>(device)];
  const int group_size = static_cast<int>(order.device_ops.size());
  DeviceVersions result;
  result.ops.resize(ops.size());
  std::map<int, int> fwd_version;    // mb -> version its F used here
  std::map<int, int> group_left;     // group -> backwards still to run here
  for (const auto& [mb, pos] : position) group_left[pos / group_size] += 1;
  int current = 0;
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const PipelineOp& op = ops[k];
    check_op(op, device);
    int version = 0;
    if (op.kind == OpKind::F) {
      if (rule == WeightUpdate::PerMicroBatch) version = current;
      if (rule == WeightUpdate::VerticalSync) {
        version = device == 0 ? current : first_device_version.at(op.mb);  // device 0 chooses
      }
      if (rule == WeightUpdate::TwoBuffer) {
        version = std::max(0, position.at(op.mb) / group_size - 1);
      }
      if (version > current) {
        throw Error(ErrorKind::Internal,
                    cat("weight versions: ", op_name(op), " needs version ", version,
                        ", device ", device, " is at version ", current));
      }
      fwd_version[op.mb] = version;
    } else {
      auto it = fwd_version.find(op.mb);
      if (it == fwd_version.end()) {
        throw Error(ErrorKind::InvalidArgument,
                    cat("weight versions: ", op_name(op), " must follow its F"));
      }
      version = it->second;
      if (rule == WeightUpdate::PerMicroBatch || rule == WeightUpdate::VerticalSync) {
        result.ops[k].step_after = true;
      } else if (rule == WeightUpdate::TwoBuffer) {
        result.ops[k].step_after = --group_left[position.at(op.mb) / group_size] == 0;
      }
    }
    result.ops[k].version = version;
    if (result.ops[k].step_after) ++current;
  }
  result.steps = current;
  // Stash and free: a version left behind by a step is kept while a later op uses it.
  std::vector<int> last_use(static_cast<std::size_t>(current) + 1, -1);
  for (std::size_t k = 0; k < ops.size(); ++k) {
    last_use[static_cast<std::size_t>(result.ops[k].version)] = static_cast<int>(k);
  }
  current = 0;
  int stashed = 0;
  for (std::size_t k = 0; k < ops.size(); ++k) {
    VersionedOp& v = result.ops[k];
    const int here = static_cast<int>(k);
    v.stashed_during = stashed;
    // A stashed copy (not the live weights) whose last use this op was: freed before the
    // step's stash, so that pipedream-2bw never holds more than one stashed copy.
    if (v.version != current && last_use[static_cast<std::size_t>(v.version)] == here) {
      v.free_after.push_back(v.version);
      --stashed;
    }
    if (v.step_after) {
      v.stash_before = last_use[static_cast<std::size_t>(current)] > here;
      if (v.stash_before) ++stashed;
      ++current;
    }
    result.max_stashed = std::max(result.max_stashed, stashed);
  }
  return result;
}

}  // namespace

WeightVersionPlan weight_versions(const ScheduleOrder& order) {
  WeightVersionPlan plan;
  const int num_devices = static_cast<int>(order.device_ops.size());
  plan.devices.resize(static_cast<std::size_t>(num_devices));
  if (!steps_within(order.weight_update)) {
    for (std::size_t d = 0; d < order.device_ops.size(); ++d) {
      plan.devices[d].ops.resize(order.device_ops[d].size());
    }
    return plan;
  }
  const std::map<int, int> position = injection_positions(order);
  std::map<int, int> first_device_version;
  for (int d = 0; d < num_devices; ++d) {
    plan.devices[static_cast<std::size_t>(d)] =
        versions_of_device(order, d, position, first_device_version);
    if (d == 0) {
      const auto& ops = order.device_ops[0];
      for (std::size_t k = 0; k < ops.size(); ++k) {
        if (ops[k].kind == OpKind::F) {
          first_device_version[ops[k].mb] = plan.devices[0].ops[k].version;
        }
      }
    }
  }
  return plan;
}

}  // namespace dynapipe
