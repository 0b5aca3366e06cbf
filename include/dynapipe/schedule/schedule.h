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
//   critical-path     memory-aware list schedule for unequal micro-batches: backward first,
//                     longest remaining chain first, forwards admitted while memory fits
//   pipedream         asynchronous PipeDream: the 1F1B order, a weight update after every
//                     backward, weight stashing (optionally vertical sync)
//   pipedream-2bw     PipeDream-2BW: the 1F1B order, an update per group of pp micro-batches
//                     computed on the version before, two weight buffers
//
// The two asynchronous schedules change the training semantics (docs/schedules.md,
// "Asynchronous schedules"), so the search (auto) never picks them: they are opt-in.
// A Schedule only orders ops; simulate() (simulator.h) says what the order costs.
// Schedules are stateless and thread-safe.
//
//   auto schedule = make_schedule(ScheduleKind::OneFOneB);
//   std::string why_not;
//   if (auto order = schedule->build(problem, &why_not)) SimResult r = simulate(problem, *order);
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dynapipe/schedule/pipeline.h"

namespace dynapipe {

// The `--schedule` choices. Auto = search every concrete schedule; the others are
// concrete schedules, in the order the search tries them. Part of the CLI and plan
// contract: never rename the spellings.
enum class ScheduleKind : std::uint8_t {
  Auto,            // "auto"
  GPipe,           // "gpipe"
  OneFOneB,        // "1f1b"
  Interleaved,     // "interleaved"
  Cyclic,          // "cyclic"
  WaitFreeCyclic,  // "wait-free-cyclic"
  Zb1p,            // "zb1p"
  PipeDream,       // "pipedream"
  PipeDream2BW,    // "pipedream-2bw"
  CriticalPath,    // "critical-path" (searched after zb1p; last here so no value moves)
};

std::string_view schedule_kind_name(ScheduleKind kind);
std::optional<ScheduleKind> parse_schedule_kind(std::string_view name);
// Every concrete schedule the search tries (no Auto, no asynchronous one), in order.
const std::vector<ScheduleKind>& schedule_kinds();
// True for pipedream and pipedream-2bw: weights change within an iteration.
bool is_async_schedule(ScheduleKind kind);
// Every spelling, "auto" first (for CLI choices and docs).
std::vector<std::string_view> schedule_kind_names();
// The spellings of schedule_kinds(), in the same order.
const std::vector<std::string>& schedule_names();

class Schedule {
 public:
  virtual ~Schedule() = default;
  Schedule(const Schedule&) = delete;
  Schedule& operator=(const Schedule&) = delete;

  virtual ScheduleKind kind() const = 0;
  // The `--schedule` spelling, e.g. "wait-free-cyclic".
  std::string_view name() const { return schedule_kind_name(kind()); }

  // The per-device op order for `problem` (already validated by the caller, or throws
  // InvalidArgument from PipelineProblem::validate()). Returns nullopt and sets
  // *why_not (when non-null) if this schedule does not apply to the problem, e.g.
  // "interleaved needs layout.chunks >= 2, got 1". Micro-batches are injected in id
  // order 0, 1, ...; reorder the problem to try other orders.
  std::optional<ScheduleOrder> build(const PipelineProblem& problem, std::string* why_not) const {
    return build(problem, why_not, BuildOptions{}, nullptr, nullptr);
  }

  static constexpr double kNoStop = std::numeric_limits<double>::infinity();
  // What a search's build may skip: where it gives up on an order it cannot use, and the
  // problem's validation (build() below).
  struct BuildOptions {
    double stop_at_ms = kNoStop;  // once the makespan cannot end below this
    // Once a device's memory, as Simulator::memory counts it, passes
    // problem.memory_limit_bytes: the order cannot fit. For a search that no longer needs
    // the peaks of orders that do not fit (something fits already).
    bool stop_over_memory = false;
    // The caller validated the problem (a search's reordered copies of one it validated).
    bool validated = false;
  };

  // build() with a search's early exits: the list schedules (zb1p, critical-path) time
  // their choices exactly as the simulator does, so once one of their ops ends at or
  // after options.stop_at_ms, or one's end plus its device's work left does, the order's
  // simulated makespan cannot be below it (SimOptions::stop_at_ms's rule); they give up
  // there, and with
  // options.stop_over_memory once a device's memory passes the limit, returning nullopt
  // with *stopped = true (`stopped` must then be non-null). The other schedules build in
  // full. *stopped is false whenever an order or a why_not comes back. With a returned
  // order a timed schedule also sets timing->makespan_ms and ->busy_ms (when non-null) to
  // what an unrecorded simulation of it reports, bit for bit; the rest is untouched.
  virtual std::optional<ScheduleOrder> build(const PipelineProblem& problem, std::string* why_not,
                                             const BuildOptions& options, bool* stopped,
                                             SimResult* timing) const = 0;

  // True when build() honours stop_at_ms and reports the order's timing (zb1p,
  // critical-path): an order it returns simulates to a makespan below stop_at_ms.
  virtual bool timed() const { return false; }

  // True when the order depends on the micro-batches' costs or memory (cyclic,
  // wait-free-cyclic, zb1p), so that trying other micro-batch orders can pay off.
  virtual bool adaptive() const = 0;

  // True when every backward runs as one B op, never as I and W: a device's last op is
  // then a backward, with its micro-batch's backwards below still to run
  // (makespan_lower_bound_ms()). zb1p splits the backward, critical-path where the cost
  // model gives the split.
  virtual bool whole_backward() const { return false; }

  // True when the schedule needs layout.chunks >= 2 (interleaved); every other
  // schedule is built on layout.chunks == 1 problems by the search helpers.
  virtual bool needs_virtual_stages() const { return false; }

 protected:
  Schedule() = default;
};

// Throws InvalidArgument for ScheduleKind::Auto (not a schedule of its own).
std::unique_ptr<Schedule> make_schedule(ScheduleKind kind);
// By spelling; throws InvalidArgument naming the known schedules for an unknown name.
std::unique_ptr<Schedule> make_schedule(std::string_view name);

}  // namespace dynapipe
