// Schedule: a rule that orders the compute ops of a PipelineProblem on each device, and
// the registry of the schedules named by `--schedule` (docs/schedules.md):
//
//   gpipe             all forwards, then all backwards (reverse micro-batch order)
//   1f1b              PipeDream-Flush / Megatron non-interleaved one-forward-one-backward
//   interleaved       Megatron interleaved 1F1B over layout.chunks >= 2 virtual stages per device
//   cyclic            DynaPipe's adaptive cyclic schedule with memory-aware injection,
//                     timed with cycle barriers
//   wait-free-cyclic  the cyclic order replayed without barriers (DynaPipe's schedule)
//   zb1p              zero-bubble ZB-H1: backward split into I (critical) and W (fills bubbles)
//
// A Schedule only orders ops; simulate() (simulator.h) says what the order costs.
// Schedules are stateless and thread-safe.
//
//   auto schedule = make_schedule("1f1b");
//   std::string why_not;
//   if (auto order = schedule->build(problem, &why_not)) SimResult r = simulate(problem, *order);
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dynapipe/schedule/pipeline.h"

namespace dynapipe {

class Schedule {
 public:
  virtual ~Schedule() = default;
  Schedule(const Schedule&) = delete;
  Schedule& operator=(const Schedule&) = delete;

  // The `--schedule` spelling, e.g. "wait-free-cyclic".
  virtual std::string_view name() const = 0;

  // The per-device op order for `problem` (already validated by the caller, or throws
  // InvalidArgument from PipelineProblem::validate()). Returns nullopt and sets
  // *why_not (when non-null) if this schedule does not apply to the problem, e.g.
  // "interleaved needs layout.chunks >= 2, got 1". Micro-batches are injected in id
  // order 0, 1, ...; reorder the problem to try other orders.
  virtual std::optional<ScheduleOrder> build(const PipelineProblem& problem,
                                             std::string* why_not) const = 0;

  // True when the order depends on the micro-batches' costs or memory (cyclic,
  // wait-free-cyclic, zb1p), so that trying other micro-batch orders can pay off.
  virtual bool adaptive() const = 0;

  // True when the schedule needs layout.chunks >= 2 (interleaved); every other
  // schedule is built on layout.chunks == 1 problems by the search helpers.
  virtual bool needs_virtual_stages() const { return false; }

 protected:
  Schedule() = default;
};

// Every `--schedule` name except "auto", in the order the search tries them.
const std::vector<std::string>& schedule_names();

// Throws InvalidArgument naming the known schedules for an unknown name.
std::unique_ptr<Schedule> make_schedule(std::string_view name);

}  // namespace dynapipe
