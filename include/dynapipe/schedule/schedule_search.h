// Schedule search: pick the schedule x recompute mode x micro-batch order with the
// shortest simulated makespan whose peak memory fits the limit; and the helpers that
// turn a CostModel and micro-batches into PipelineProblems.
//
// Each candidate is a (schedule name, recompute mode, PipelineProblem) triple: the
// problem carries that recompute mode's costs and that schedule's layout (chunks >= 2
// for interleaved). Adaptive schedules (cyclic, wait-free-cyclic, zb1p) are also tried
// on a few deterministic micro-batch orders (docs/schedules.md, "Search").
//
// Thread-safety: search_schedule() is reentrant.
//
//   auto candidates = make_search_candidates(ScheduleKind::Auto, *model, nullptr, microbatches,
//                                            /*num_devices=*/4, gib_to_bytes(40));
//   SearchResult best = search_schedule(candidates, {});   // throws Infeasible
//   // best.order / best.sim speak original micro-batch ids; best.mb_order is the
//   // injection order that was used.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dynapipe/core/microbatch.h"
#include "dynapipe/core/model_kind.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/schedule/pipeline.h"
#include "dynapipe/schedule/schedule.h"

namespace dynapipe {

struct SearchCandidate {
  ScheduleKind schedule = ScheduleKind::OneFOneB;  // a concrete schedule (not Auto)
  Recompute recompute = Recompute::None;  // the heaviest mode any micro-batch runs in
  // Costs under `modes`, layout for `schedule`; shared by the candidates of one problem
  // (every schedule kind searched on it), as candidates are copied with their choices.
  std::shared_ptr<const PipelineProblem> problem;
  // Per micro-batch (by id), where they differ from `recompute`: the mode each runs in
  // (lightest_fitting_modes()); empty: every micro-batch in `recompute`.
  std::vector<Recompute> modes;
};

struct SearchOptions {
  // Try other micro-batch orders for adaptive schedules (micro_batch_orders()). Default: on.
  bool permute = true;
  // Also permute the fixed schedules (gpipe, 1f1b, interleaved). Default: off.
  bool permute_fixed = false;
  // Extra seeded random orders per permuted candidate, >= 0. Default: 0.
  int random_orders = 0;
  std::uint64_t seed = 0;  // for random_orders
  // Upper bound on orders tried per candidate (the identity is always tried), >= 1.
  // Default: 8.
  int max_orders = 8;
  // A hint: these schedules' candidates are searched first, in this order (e.g. the kind
  // that won the last search: a good makespan found early stops the other builds and
  // simulations sooner). The result is the listed order's whatever is searched first.
  std::vector<ScheduleKind> search_first = {};
  // Record the winner's timeline and transfers in SearchResult::sim (one more simulation
  // and a sort). Off: when the winner ran in the given order, sim is that run unrecorded
  // (the same makespan, peaks and busy times, empty timeline), as a planner ranking many
  // micro-batchings by makespan needs. Default: on.
  bool record_winner = true;
  // Exact shortcuts, the same result either way (off only to test that): a list
  // schedule's build stops once it cannot beat the best so far (Schedule::build), as its
  // simulation would (SimOptions::stop_at_ms, always on), and needs no simulation;
  // wait-free-cyclic right after cyclic on an equal problem takes cyclic's orders without
  // the barriers instead of building them again; a finished zb1p or critical-path build
  // (Schedule::timed) is not simulated: its own clock gives the makespan and busy times,
  // a memory pass the peaks; a candidate with an earlier one's schedule and problem is
  // skipped (SearchResult::duplicates). Default: on.
  bool shortcuts = true;
  // A search that adds orders to an earlier one over the same candidates (random orders
  // after a full search): that search's max_orders (with no random orders), whose orders
  // this list starts with and which are not tried again, >= 0. Default: 0 (none).
  int searched_orders = 0;
  // The makespan the earlier search found: only a strictly shorter one counts, builds and
  // runs stop once they cannot beat it, and where nothing beats it the search returns
  // SearchResult::found false instead of throwing. Default: +inf (none).
  double beat_ms = std::numeric_limits<double>::infinity();
  // Where given: once another thread sets it, the search ends before its next order and
  // returns SearchResult::found false, meant to be dropped (a search run ahead that turned
  // out not to be needed). Default: none.
  const std::atomic<bool>* abandon = nullptr;
  void validate() const;  // throws InvalidArgument naming the field
};

// The micro-batch orders search_schedule() tries for one candidate (permute: the problem's
// schedule is adaptive or SearchOptions::permute_fixed), identity first, without repeats,
// at most options.max_orders: as given; the organ pipe (by Σ over stages of fwd + bwd,
// ascending to the longest in the middle, then descending); longest first; the smallest
// first, then the rest longest first; every order of k clusters (quantiles of the
// longest-first order, ids ascending inside a cluster; k = 3 for more than 20
// micro-batches, else 4; all m! orders when m <= k), as the reference's
// cluster-permutation search does with k-means; then options.random_orders seeded
// shuffles. Without permute: the identity alone.
std::vector<std::vector<int>> micro_batch_orders(const PipelineProblem& problem, bool permute,
                                                 const SearchOptions& options);

struct SearchResult {
  bool found = true;            // false only where nothing beat SearchOptions::beat_ms, or
                                // the search was abandoned (SearchOptions::abandon)
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  Recompute recompute = Recompute::None;
  std::vector<Recompute> modes;  // the winner's SearchCandidate::modes
  int candidate = 0;            // index into the candidates given
  // Injection order: position i ran micro-batch mb_order[i]. The order and the
  // simulation below already use the original ids (op.mb = the micro-batch id), so a
  // planner that keeps the ids needs nothing else; one that renumbers micro-batches in
  // execution order maps new id i -> old id mb_order[i] everywhere.
  std::vector<int> mb_order;
  ScheduleOrder order;
  SimResult sim;                // recorded (timeline + transfers), original ids
  int simulations = 0;          // how many simulations the search ran
  int stopped_builds = 0;       // builds given up: their ops already ran past the best
                                // (or, once something fits, a device past the memory limit)
  int over_memory = 0;          // built orders not run: once something fit, their memory
                                // pass showed them over the limit
  int reused_builds = 0;        // wait-free-cyclic orders taken from cyclic's
  int unsimulated = 0;          // finished timed builds, timed by their builder
  int pruned = 0;               // candidates skipped: their lower bound >= the best found
  int duplicates = 0;           // candidates skipped: an earlier one had their schedule and problem
  // One line per candidate that did not apply, or did not fit while nothing else had (a
  // repeat of an earlier candidate is skipped, `duplicates`, and not listed again).
  std::vector<std::string> rejected;
};

// Builds, simulates and compares every candidate (and orders, see SearchOptions).
// Ties keep the earlier candidate / order; a candidate whose makespan_lower_bound_ms is
// not below the best makespan found so far is skipped (it cannot win). Throws:
//  * InvalidArgument when `candidates` is empty, names an unknown schedule or a
//    problem is inconsistent; Unsupported when no candidate applies (naming why);
//  * Infeasible when none fits the memory limit, naming the smallest violation:
//    "--memory-limit 40 GiB: no schedule fits; micro-batch 3 needs 41.2 GiB on stage 0
//    (schedule 1f1b, recompute full)".
// With a finite SearchOptions::beat_ms nothing is thrown for a search that finds nothing
// below it (nothing fitting included): the result has found false.
SearchResult search_schedule(std::span<const SearchCandidate> candidates,
                             const SearchOptions& options = {});

// The problem for `microbatches` (ids 0..n-1 in order) under `recompute` on `layout`
// (a micro-batch with its own MicroBatch::recompute is costed in that mode): costs from
// model.stage_cost (model.num_stages() must equal layout.num_stages()),
// static bytes summed over each device's stages, links from model.device().
// Throws InvalidArgument on a stage-count mismatch or a micro-batch id out of place.
PipelineProblem make_pipeline_problem(const CostModel& model,
                                      std::span<const MicroBatch> microbatches,
                                      Recompute recompute, const PipelineLayout& layout,
                                      std::int64_t memory_limit_bytes);

// Per micro-batch (by id): the lightest mode up to `ceiling` in which its copies fit
// 1F1B's rule on every stage s of `model` (static bytes + (p − s) · held + its peak within
// `memory_limit_bytes`; 0: no limit), else `ceiling`. A lighter mode stores more and
// recomputes less: micro-batches small enough run faster in it beside heavier ones that
// need the ceiling's memory savings. The schedule's simulation, not this rule, decides
// whether a plan fits.
std::vector<Recompute> lightest_fitting_modes(const CostModel& model,
                                              std::span<const MicroBatch> microbatches,
                                              Recompute ceiling, std::int64_t memory_limit_bytes);

// The schedules `--schedule auto` searches for plans costed by `model`: schedule_kinds(),
// but on the CPU device (a cost model whose device is "cpu": analytic:cpu, a profile taken
// on this runtime) without critical-path. Its eager forwards keep more activations alive
// than any other schedule, which on the CPU runtime costs page faults and cache misses the
// cost model does not see: measured, gpt-tiny pp 2 trained at 4,758 tokens/s under it
// against 5,584 under wait-free-cyclic, though it was estimated faster (docs/RESULTS.md).
// `--schedule critical-path` still runs it there.
std::vector<ScheduleKind> auto_schedule_kinds(const CostModel& model);

// Candidates for `--schedule` `schedule` (Auto = auto_schedule_kinds(model)) x the three
// recompute modes; with `mixed`, for a mode in which some micro-batches fit a lighter one
// (lightest_fitting_modes()), each schedule also on that mix, before the mode's own.
// `model` is built for num_devices stages; `interleaved_model`, when non-null, for num_devices * chunks stages (chunks >= 2) and is used only for
// Interleaved. Interleaved without an interleaved_model is skipped under Auto and
// InvalidArgument when asked for by name.
std::vector<SearchCandidate> make_search_candidates(ScheduleKind schedule,
                                                    const CostModel& model,
                                                    const CostModel* interleaved_model,
                                                    std::span<const MicroBatch> microbatches,
                                                    int num_devices,
                                                    std::int64_t memory_limit_bytes,
                                                    bool mixed = false);

// make_search_candidates() for one recompute mode (with `mixed` its mix, then its own
// problem, or with mix_only the mix alone where there is one), without the argument
// checks; interleaved is skipped without an interleaved model.
std::vector<SearchCandidate> make_mode_candidates(ScheduleKind schedule, const CostModel& model,
                                                  const CostModel* interleaved_model,
                                                  std::span<const MicroBatch> microbatches,
                                                  Recompute recompute, int num_devices,
                                                  std::int64_t memory_limit_bytes, bool mixed,
                                                  bool mix_only);

}  // namespace dynapipe
