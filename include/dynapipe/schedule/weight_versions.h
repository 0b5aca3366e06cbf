// Weight versions of the asynchronous schedules (pipedream, pipedream-2bw): which version
// of its stage's weights each op uses, where a device steps its optimizer, and which
// versions it must stash (keep a copy of) and when it may free them. One pure function
// that the simulator (stash memory), lowering (StashWeights / FreeWeights / version
// fields) and the tests share, so the rule has one implementation (docs/schedules.md,
// "Asynchronous schedules").
//
// Versions are counted per device and per iteration: version 0 is the weights the
// iteration starts with, version k those after the device's k-th optimizer step.
//
//   WeightVersionPlan plan = weight_versions(order);   // order.weight_update != PerIteration
//   int v = plan.devices[d].ops[k].version;
#pragma once

#include <vector>

#include "dynapipe/schedule/pipeline.h"

namespace dynapipe {

struct VersionedOp {
  int version = 0;            // the weight version F / B of this op uses
  // After the op, in this order: free_after, then (stash_before) StashWeights of the
  // current version, then (step_after) the optimizer step.
  std::vector<int> free_after;  // stashed versions no later op uses (at most one)
  bool stash_before = false;  // stash the current version right before this op's step
  bool step_after = false;    // an optimizer step follows this op
  int stashed_during = 0;     // stashed versions held while this op runs
};

struct DeviceVersions {
  std::vector<VersionedOp> ops;  // parallel to ScheduleOrder::device_ops[device]
  int steps = 0;                 // optimizer steps of the device in the iteration
  int max_stashed = 0;           // most stashed versions held at once
};

struct WeightVersionPlan {
  std::vector<DeviceVersions> devices;  // [device]
};

// The version rule of `order.weight_update` applied to `order` (layout.chunks == 1,
// F and B ops only, stage == device; throws InvalidArgument naming the op otherwise):
//   PerMicroBatch  F uses the device's current version; a step after every B.
//   VerticalSync   F(mb) uses the version F(mb) used on device 0; a step after every B.
//   TwoBuffer      micro-batch at injection position i (device 0's F order) is in group
//                  g = i / D (D devices); F uses version max(0, g - 1); a step after the
//                  B that completes a group on the device.
//   PerIteration   every op uses version 0 and no step is placed (the synchronous rule).
// B uses the version of its F. A version is stashed at the step that leaves it behind if
// a later op still uses it, and freed after its last use (before that op's own stash).
// Throws Internal when an op would need a version the device has not reached yet.
WeightVersionPlan weight_versions(const ScheduleOrder& order);

}  // namespace dynapipe
