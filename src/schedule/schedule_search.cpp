#include "dynapipe/schedule/schedule_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>

#include "dynapipe/core/error.h"
#include "dynapipe/core/rng.h"
#include "dynapipe/core/units.h"
#include "dynapipe/schedule/schedule.h"
#include "dynapipe/schedule/simulator.h"

namespace dynapipe {
namespace {

// "40", "41.2": a GiB count for messages, trailing zeros dropped (core's format_gib
// always prints one decimal).
std::string gib_text(double gib, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, gib);
  std::string text = buffer;
  // "40.0" -> "40": limits are usually whole GiB.
  if (text.find('.') != std::string::npos) {
    while (text.back() == '0') text.pop_back();
    if (text.back() == '.') text.pop_back();
  }
  return text;
}

// The smallest memory violation seen, for the Infeasible message.
struct Violation {
  std::int64_t excess_bytes = 0;
  std::int64_t peak_bytes = 0;
  int mb = 0;  // original id
  int stage = 0;
  int candidate = 0;
};

}  // namespace

std::vector<std::vector<int>> micro_batch_orders(const PipelineProblem& problem, bool permute,
                                                 const SearchOptions& options) {
  const int m = problem.num_microbatches();
  std::vector<std::vector<int>> orders;
  std::vector<int> identity(m);
  std::iota(identity.begin(), identity.end(), 0);
  auto add = [&](std::vector<int> order) {
    if (static_cast<int>(orders.size()) >= options.max_orders) return;
    if (std::find(orders.begin(), orders.end(), order) == orders.end()) {
      orders.push_back(std::move(order));
    }
  };
  add(identity);
  if (!permute || m < 2) return orders;

  std::vector<double> total(m, 0.0);
  for (int mb = 0; mb < m; ++mb) {
    for (const StageCost& c : problem.costs[mb]) total[mb] += c.fwd_ms + c.bwd_ms;
  }
  std::vector<int> longest = identity;
  std::stable_sort(longest.begin(), longest.end(),
                   [&](int a, int b) { return total[a] > total[b]; });
  // The organ pipe before the others: it wins most often (fill and drain run small
  // micro-batches), and a good makespan found early lets the later simulations stop early.
  std::vector<int> organ_pipe(m);
  for (int i = 0, front = 0, back = m - 1; i < m; ++i) {
    const int mb = longest[m - 1 - i];  // ascending
    if (i % 2 == 0) {
      organ_pipe[front++] = mb;
    } else {
      organ_pipe[back--] = mb;
    }
  }
  add(std::move(organ_pipe));
  add(longest);
  std::vector<int> smallest_first = longest;
  std::rotate(smallest_first.rbegin(), smallest_first.rbegin() + 1, smallest_first.rend());
  add(std::move(smallest_first));

  const int k = m > 20 ? 3 : 4;
  if (m <= k) {
    std::vector<int> order = identity;
    while (std::next_permutation(order.begin(), order.end())) add(order);
  } else {
    std::vector<std::vector<int>> clusters(k);
    for (int i = 0; i < m; ++i) clusters[static_cast<std::size_t>(i) * k / m].push_back(longest[i]);
    for (auto& cluster : clusters) std::sort(cluster.begin(), cluster.end());
    std::vector<int> cluster_order(k);
    std::iota(cluster_order.begin(), cluster_order.end(), 0);
    do {
      std::vector<int> order;
      order.reserve(m);
      for (int c : cluster_order) order.insert(order.end(), clusters[c].begin(), clusters[c].end());
      add(std::move(order));
    } while (std::next_permutation(cluster_order.begin(), cluster_order.end()));
  }

  Rng rng(options.seed);
  for (int r = 0; r < options.random_orders; ++r) {
    std::vector<int> order = identity;
    std::shuffle(order.begin(), order.end(), rng.engine());
    add(std::move(order));
  }
  return orders;
}

void SearchOptions::validate() const {
  if (random_orders < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("search options: random_orders must be >= 0, got ", random_orders));
  }
  if (max_orders < 1) {
    throw Error(ErrorKind::InvalidArgument,
                cat("search options: max_orders must be >= 1, got ", max_orders));
  }
  if (searched_orders < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("search options: searched_orders must be >= 0, got ", searched_orders));
  }
  if (!(beat_ms > 0)) {
    throw Error(ErrorKind::InvalidArgument,
                cat("search options: beat_ms must be > 0, got ", beat_ms));
  }
}

SearchResult search_schedule(std::span<const SearchCandidate> candidates,
                             const SearchOptions& options) {
  options.validate();
  if (candidates.empty()) {
    throw Error(ErrorKind::InvalidArgument,
                "schedule search: candidates must not be empty, got none");
  }
  std::map<ScheduleKind, std::unique_ptr<Schedule>> schedules;
  Simulator simulator;
  SimResult scratch;
  SimResult timing;  // a timed build's makespan and busy times
  SearchResult result;
  std::optional<Violation> smallest;
  bool any_applies = false;
  double best_ms = 0;
  int best = -1;
  std::vector<int> best_order;
  ScheduleOrder best_schedule;
  SimResult best_sim;  // the winner's unrecorded run (!options.record_winner)
  // SearchOptions::search_first's candidates are searched first, in its order. The result
  // is the one the listed order gives: ties go to the candidate listed first, so one listed
  // before the best so far must only equal it (to_beat()), and the rejections and the
  // smallest violation are told in the listed order.
  std::vector<int> evaluation(candidates.size());
  std::iota(evaluation.begin(), evaluation.end(), 0);
  if (!options.search_first.empty()) {
    auto rank = [&](int ci) {
      return std::find(options.search_first.begin(), options.search_first.end(), candidates[ci].schedule) -
             options.search_first.begin();
    };
    std::stable_sort(evaluation.begin(), evaluation.end(), [&](int a, int b) { return rank(a) < rank(b); });
  }
  // What candidate ci's result must beat: the best so far (equal it, where ci is listed
  // before the best), else SearchOptions::beat_ms (+inf: none).
  auto to_beat = [&](int ci) {
    if (best < 0) return options.beat_ms;
    return ci < best ? std::nextafter(best_ms, std::numeric_limits<double>::infinity()) : best_ms;
  };
  std::vector<std::pair<int, std::string>> rejected;  // by candidate, told in the listed order
  // Per problem the candidates share: validated once, its makespan bounds taken once.
  std::vector<std::pair<const PipelineProblem*, MakespanLowerBounds>> seen_problems;
  // The peaks of orders that do not fit matter only while nothing fits and nothing bounds
  // the search: they name the smallest violation in the Infeasible error and make the
  // `rejected` lines. After that an order is given up as soon as it shows it cannot fit.
  auto violations_matter = [&] {
    return best < 0 && options.beat_ms == std::numeric_limits<double>::infinity();
  };
  // The last cyclic candidate's index, micro-batch orders and built orders (wait-free-cyclic
  // builds the same orders without the barriers).
  int cyclic_candidate = -1;
  std::vector<std::vector<int>> cyclic_mb_orders;
  std::vector<ScheduleOrder> cyclic_orders;

  for (const int ci : evaluation) {
    const SearchCandidate& candidate = candidates[ci];
    if (candidate.problem == nullptr) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("schedule search: candidate ", ci, " must have a problem, got none"));
    }
    auto known = std::find_if(seen_problems.begin(), seen_problems.end(),
                              [&](const auto& v) { return v.first == candidate.problem.get(); });
    if (known == seen_problems.end()) {
      candidate.problem->validate();
      known = seen_problems.insert(seen_problems.end(),
                               {candidate.problem.get(), makespan_lower_bounds_ms(*candidate.problem)});
    }
    const MakespanLowerBounds& bounds = known->second;
    auto it = schedules.find(candidate.schedule);
    if (it == schedules.end()) {
      it = schedules.emplace(candidate.schedule, make_schedule(candidate.schedule)).first;
    }
    const Schedule& schedule = *it->second;
    // The same schedule on the same problem as an earlier candidate (per-micro-batch
    // recompute's mixes often equal a lighter mode's: every micro-batch fits it) ends as
    // that one did, and ties keep the earlier one.
    const auto same_problem = [&](const SearchCandidate& other) {
      return other.problem == candidate.problem || *other.problem == *candidate.problem;
    };
    const auto same = [&](const SearchCandidate& other) {
      return other.schedule == candidate.schedule && same_problem(other);
    };
    if (options.shortcuts && std::any_of(candidates.begin(), candidates.begin() + ci, same)) {
      ++result.duplicates;
      continue;
    }
    // No order of this candidate can beat the best so far (ties keep the earlier one).
    // The fill and drain make the bound exact for some orders (1F1B on equal
    // micro-batches), so it must clear the best by more than its sums' rounding. Where
    // they prune (GPT-6.7B pp 4 short256: 35 of 155 candidates) the plan takes 4.5% fewer
    // instructions.
    if ((schedule.whole_backward() ? bounds.whole_ms : bounds.split_ms) >= to_beat(ci) * (1 + 1e-9)) {
      ++result.pruned;
      continue;
    }
    // Only a rejected candidate is named (a string per candidate was ~0.5% of a plan).
    const auto label = [&] {
      return cat(schedule_kind_name(candidate.schedule), ", recompute ", recompute_name(candidate.recompute));
    };
    const bool permute = options.permute && (schedule.adaptive() || options.permute_fixed);
    std::vector<std::vector<int>> orders = micro_batch_orders(*candidate.problem, permute, options);
    if (options.searched_orders > 0) {  // the earlier search's orders lead the list
      SearchOptions earlier = options;
      earlier.max_orders = options.searched_orders;
      earlier.random_orders = 0;
      const std::size_t searched = micro_batch_orders(*candidate.problem, permute, earlier).size();
      orders.erase(orders.begin(), orders.begin() + static_cast<std::ptrdiff_t>(searched));
    }
    // wait-free-cyclic right after cyclic on an equal problem (make_search_candidates'
    // order) takes cyclic's orders, barriers dropped, rather than building them again.
    const bool keep_cyclic = options.shortcuts && candidate.schedule == ScheduleKind::Cyclic;
    const bool reuse_cyclic = options.shortcuts &&
                              candidate.schedule == ScheduleKind::WaitFreeCyclic && ci > 0 &&
                              cyclic_candidate == ci - 1 && cyclic_mb_orders == orders &&
                              same_problem(candidates[ci - 1]);
    if (keep_cyclic) {
      cyclic_candidate = ci;
      cyclic_mb_orders = orders;
      cyclic_orders.clear();
    }

    // The given order alone (quick searches, fixed schedules): no permuted copy.
    const bool given_only =
        orders.size() == 1 && std::is_sorted(orders.front().begin(), orders.front().end());
    PipelineProblem permuted = given_only ? PipelineProblem{} : *candidate.problem;
    const PipelineProblem& problem = given_only ? *candidate.problem : permuted;
    bool fitted = false;
    std::int64_t candidate_excess = -1;
    for (const std::vector<int>& mb_order : orders) {
      if (options.abandon != nullptr && options.abandon->load(std::memory_order_relaxed)) {
        result.found = false;
        return result;
      }
      if (!given_only) {
        for (std::size_t i = 0; i < mb_order.size(); ++i) {
          permuted.costs[i] = candidate.problem->costs[mb_order[i]];
        }
      }
      // Once something fits, a build or run stops where it can no longer beat it.
      const double stop_at_ms = to_beat(ci);
      std::string why_not;
      bool stopped = false;
      std::optional<ScheduleOrder> order;
      // The builders make one op list per pipeline device: a problem with replicated
      // stages wants more, and its run is checked (and throws, as it always did).
      const bool builders_fit = problem.stage_replicas.empty();
      const bool memory_exit = options.shortcuts && builders_fit && !violations_matter();
      const std::size_t k = static_cast<std::size_t>(&mb_order - orders.data());
      if (reuse_cyclic && k < cyclic_orders.size()) {
        order = std::move(cyclic_orders[k]);
        order->op_cycle.clear();
        ++result.reused_builds;
      } else {
        // The problem is the candidate's (validated above) or a reordering of it.
        const Schedule::BuildOptions build_options{
            .stop_at_ms = options.shortcuts ? stop_at_ms : Schedule::kNoStop,
            .stop_over_memory = memory_exit,
            .validated = true};
        order = schedule.build(problem, &why_not, build_options, &stopped, &timing);
      }
      if (stopped) {
        any_applies = true;
        ++result.stopped_builds;
        continue;
      }
      if (!order) {
        rejected.emplace_back(ci, cat(label(), ": ", why_not));
        break;
      }
      any_applies = true;
      const ScheduleOrder* built = &*order;
      if (keep_cyclic) built = &cyclic_orders.emplace_back(std::move(*order));
      // A finished timed build is its own unrecorded run: every op ended below stop_at_ms
      // at the simulator's times (so the run would not stop) and the builder summed the
      // makespan and busy times as the simulator does; the peaks depend on the order only.
      if (options.shortcuts && schedule.timed() && builders_fit) {
        simulator.memory(problem, *built, &scratch);
        scratch.makespan_ms = timing.makespan_ms;
        std::swap(scratch.busy_ms, timing.busy_ms);
        scratch.timeline.clear();
        scratch.transfers.clear();
        scratch.stopped = false;
        ++result.unsimulated;
      } else {
        if (memory_exit) {  // the peaks depend on the order alone: one that cannot fit
          simulator.memory(problem, *built, &scratch);  // is not run
          if (!scratch.fits_memory) {
            ++result.over_memory;
            continue;
          }
        }
        // The problem is a reordering of a validated one and the order is a builder's: the
        // winner's order is checked below.
        const SimOptions sim_options{
            .record = false, .stop_at_ms = stop_at_ms, .check = !builders_fit};
        simulator.run(problem, *built, sim_options, &scratch);
        ++result.simulations;
        if (scratch.stopped) continue;
      }
      if (!scratch.fits_memory) {
        if (!violations_matter()) continue;
        for (int d = 0; d < problem.layout.num_devices; ++d) {
          const std::int64_t excess = scratch.peak_memory_bytes[d] - problem.memory_limit_bytes;
          if (excess <= 0) continue;
          if (candidate_excess < 0 || excess < candidate_excess) candidate_excess = excess;
          if (!smallest || excess < smallest->excess_bytes ||
              (excess == smallest->excess_bytes && ci < smallest->candidate)) {
            smallest = Violation{excess, scratch.peak_memory_bytes[d],
                                 mb_order[scratch.peak_op[d].mb], scratch.peak_op[d].stage, ci};
          }
        }
        continue;
      }
      fitted = true;
      if (scratch.makespan_ms < to_beat(ci)) {
        best = ci;
        best_ms = scratch.makespan_ms;
        best_order = mb_order;
        best_schedule = keep_cyclic ? *built : std::move(*order);
        if (!options.record_winner) best_sim = scratch;
      }
    }
    if (!fitted && candidate_excess >= 0) {
      rejected.emplace_back(ci, cat(label(), ": needs ", gib_text(bytes_to_gib(candidate_excess), 3),
                                    " GiB more than the memory limit"));
    }
  }

  std::stable_sort(rejected.begin(), rejected.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [ci, text] : rejected) result.rejected.push_back(std::move(text));
  if (best < 0 && options.beat_ms < std::numeric_limits<double>::infinity()) {
    result.found = false;  // nothing beat the earlier search
    return result;
  }
  if (best < 0) {
    if (!any_applies) {
      throw Error(ErrorKind::Unsupported,
                  cat("schedule search: no candidate schedule applies: ",
                      join(result.rejected, "; ")));
    }
    DYNAPIPE_CHECK(smallest.has_value(), "schedule search: nothing fits but no violation recorded");
    const SearchCandidate& worst = candidates[smallest->candidate];
    const double limit_gib = bytes_to_gib(worst.problem->memory_limit_bytes);
    const double need_gib = bytes_to_gib(smallest->peak_bytes);
    // One decimal unless that would print the need as the limit itself.
    const int decimals = need_gib - limit_gib < 0.1 ? 3 : 1;
    throw Error(ErrorKind::Infeasible,
                cat("--memory-limit ", gib_text(limit_gib, 3), " GiB: no schedule fits; micro-batch ",
                    smallest->mb, " needs ", gib_text(need_gib, decimals), " GiB on stage ",
                    smallest->stage, " (schedule ", schedule_kind_name(worst.schedule), ", recompute ",
                    recompute_name(worst.recompute), ")"));
  }

  // Speak the original micro-batch ids, then record the winner's timeline.
  const SearchCandidate& winner = candidates[best];
  for (auto& ops : best_schedule.device_ops) {
    for (PipelineOp& op : ops) op.mb = best_order[op.mb];
  }
  const bool given_order = std::is_sorted(best_order.begin(), best_order.end());
  if (!options.record_winner && given_order) {
    // The same problem and order as the recording run would simulate: the same result
    // but for the timeline and transfers. It ran unchecked: check it now.
    simulator.check(*winner.problem, best_schedule);
    result.sim = std::move(best_sim);
  } else {
    simulator.run(*winner.problem, best_schedule, SimOptions{.record = options.record_winner},
                  &result.sim);
    ++result.simulations;
  }
  DYNAPIPE_CHECK(std::abs(result.sim.makespan_ms - best_ms) <= 1e-9 * std::max(1.0, best_ms),
                 cat("schedule search: relabelled order simulates to ", result.sim.makespan_ms,
                     " ms, expected ", best_ms, " ms"));
  result.schedule = winner.schedule;
  result.recompute = winner.recompute;
  result.modes = winner.modes;
  result.candidate = best;
  result.mb_order = std::move(best_order);
  result.order = std::move(best_schedule);
  return result;
}

PipelineProblem make_pipeline_problem(const CostModel& model,
                                      std::span<const MicroBatch> microbatches,
                                      Recompute recompute, const PipelineLayout& layout,
                                      std::int64_t memory_limit_bytes) {
  if (model.num_stages() != layout.num_stages()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("pipeline problem: the cost model's stages must equal layout.num_stages() (",
                    layout.num_stages(), "), got ", model.num_stages()));
  }
  PipelineProblem problem;
  problem.layout = layout;
  problem.memory_limit_bytes = memory_limit_bytes;
  problem.link_latency_ms = model.device().link_latency_ms;
  problem.link_bandwidth_gbs = model.device().link_bandwidth_gbs;
  // Per device, its stages' model states and one copy of their weights (what an
  // asynchronous schedule's stashed version costs).
  problem.static_bytes.assign(layout.num_devices, 0);
  problem.weight_bytes.assign(layout.num_devices, 0);
  for (int s = 0; s < layout.num_stages(); ++s) {
    problem.static_bytes[layout.device_of(s)] += model.static_bytes(s);
    problem.weight_bytes[layout.device_of(s)] += model.weight_bytes(s);
  }
  problem.costs.resize(microbatches.size());
  for (std::size_t i = 0; i < microbatches.size(); ++i) {
    const MicroBatch& mb = microbatches[i];
    if (mb.id != static_cast<int>(i)) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("pipeline problem: micro-batch ", i, " must have id ", i, ", got ", mb.id));
    }
    problem.costs[i].resize(static_cast<std::size_t>(layout.num_stages()));
    model.stage_costs(mb.shape, mb.density, recompute_of(mb, recompute), problem.costs[i]);
  }
  // Not validated here: search_schedule() validates each candidate's problem once (twice
  // was ~0.5% of a T5-11B pp 8 plan's instructions).
  return problem;
}

std::vector<ScheduleKind> auto_schedule_kinds(const CostModel& model) {
  std::vector<ScheduleKind> kinds = schedule_kinds();
  if (model.device().name == "cpu") std::erase(kinds, ScheduleKind::CriticalPath);
  return kinds;
}

std::vector<Recompute> lightest_fitting_modes(const CostModel& model,
                                              std::span<const MicroBatch> microbatches,
                                              Recompute ceiling, std::int64_t memory_limit_bytes) {
  const int p = model.num_stages();
  std::vector<Recompute> modes(microbatches.size(), ceiling);
  std::vector<StageCost> costs(static_cast<std::size_t>(p));
  for (std::size_t i = 0; i < microbatches.size(); ++i) {
    const MicroBatch& mb = microbatches[i];
    for (Recompute mode : kRecomputeModes) {
      if (mode >= ceiling) break;  // lightest first
      model.stage_costs(mb.shape, mb.density, mode, costs);
      bool fits = true;
      for (int s = 0; s < p && fits && memory_limit_bytes > 0; ++s) {
        const StageCost& c = costs[static_cast<std::size_t>(s)];
        fits = model.static_bytes(s) + (p - s) * (c.stored_bytes + c.output_bytes) + c.peak_bytes <=
               memory_limit_bytes;
      }
      if (fits) {
        modes[i] = mode;
        break;
      }
    }
  }
  return modes;
}

namespace {

// Each of `kinds` on the problem of `microbatches` (each in recompute_of(mb, recompute));
// `modes` is the candidates' SearchCandidate::modes. Kinds that need virtual stages are
// skipped without an interleaved model.
void add_kinds(std::vector<SearchCandidate>& out, std::span<const ScheduleKind> kinds,
               const CostModel& model, const CostModel* interleaved_model,
               std::span<const MicroBatch> microbatches, Recompute recompute, int num_devices,
               std::int64_t memory_limit_bytes, const std::vector<Recompute>& modes) {
  std::shared_ptr<const PipelineProblem> plain, interleaved;
  for (ScheduleKind kind : kinds) {
    if (make_schedule(kind)->needs_virtual_stages()) {
      if (interleaved_model == nullptr) continue;
      if (!interleaved) {
        const int chunks = interleaved_model->num_stages() / num_devices;
        interleaved = std::make_shared<const PipelineProblem>(
            make_pipeline_problem(*interleaved_model, microbatches, recompute,
                                  {num_devices, chunks}, memory_limit_bytes));
      }
      out.push_back({kind, recompute, interleaved, modes});
    } else {
      if (!plain) {
        plain = std::make_shared<const PipelineProblem>(make_pipeline_problem(
            model, microbatches, recompute, {num_devices, 1}, memory_limit_bytes));
      }
      out.push_back({kind, recompute, plain, modes});
    }
  }
}

// make_search_candidates() for one recompute mode: with `mix`, where some micro-batch fits
// a lighter mode (lightest_fitting_modes()), each kind on the problem of those modes; then
// (unless mix_only and there was a mix) each kind on the problem of every micro-batch in
// `recompute`.
void add_mode_candidates(std::vector<SearchCandidate>& out, std::span<const ScheduleKind> kinds,
                         const CostModel& model, const CostModel* interleaved_model,
                         std::span<const MicroBatch> microbatches, Recompute recompute,
                         int num_devices, std::int64_t memory_limit_bytes, bool mix,
                         bool mix_only) {
  if (mix) {
    const std::vector<Recompute> lightest =
        lightest_fitting_modes(model, microbatches, recompute, memory_limit_bytes);
    if (std::ranges::any_of(lightest, [&](Recompute m) { return m != recompute; })) {
      std::vector<MicroBatch> mixed(microbatches.begin(), microbatches.end());
      for (std::size_t i = 0; i < mixed.size(); ++i) {
        mixed[i].recompute = lightest[i];
        if (lightest[i] == recompute) mixed[i].recompute.reset();
      }
      // The mix first: where it fits, the one mode's problem (more work on every device)
      // is mostly pruned by its lower bound.
      add_kinds(out, kinds, model, interleaved_model, mixed, recompute, num_devices,
                memory_limit_bytes, lightest);
      if (mix_only) return;
    }
  }
  // Every micro-batch in `recompute`: modes the micro-batches carry (a plan's) are dropped.
  const auto carries_mode = [](const MicroBatch& mb) { return mb.recompute.has_value(); };
  if (std::ranges::any_of(microbatches, carries_mode)) {
    std::vector<MicroBatch> own(microbatches.begin(), microbatches.end());
    for (MicroBatch& mb : own) mb.recompute.reset();
    add_kinds(out, kinds, model, interleaved_model, own, recompute, num_devices,
              memory_limit_bytes, {});
  } else {
    add_kinds(out, kinds, model, interleaved_model, microbatches, recompute, num_devices,
              memory_limit_bytes, {});
  }
}

}  // namespace

std::vector<SearchCandidate> make_mode_candidates(ScheduleKind schedule, const CostModel& model,
                                                  const CostModel* interleaved_model,
                                                  std::span<const MicroBatch> microbatches,
                                                  Recompute recompute, int num_devices,
                                                  std::int64_t memory_limit_bytes, bool mixed,
                                                  bool mix_only) {
  const std::vector<ScheduleKind> kinds = schedule == ScheduleKind::Auto
                                              ? auto_schedule_kinds(model)
                                              : std::vector<ScheduleKind>{schedule};
  std::vector<SearchCandidate> candidates;
  add_mode_candidates(candidates, kinds, model, interleaved_model, microbatches, recompute,
                      num_devices, memory_limit_bytes, mixed, mix_only);
  return candidates;
}

std::vector<SearchCandidate> make_search_candidates(ScheduleKind schedule,
                                                    const CostModel& model,
                                                    const CostModel* interleaved_model,
                                                    std::span<const MicroBatch> microbatches,
                                                    int num_devices,
                                                    std::int64_t memory_limit_bytes, bool mixed) {
  if (num_devices < 1) {
    throw Error(ErrorKind::InvalidArgument,
                cat("schedule candidates: num_devices must be >= 1, got ", num_devices));
  }
  const bool everything = schedule == ScheduleKind::Auto;
  const std::vector<ScheduleKind> kinds =
      everything ? auto_schedule_kinds(model) : std::vector<ScheduleKind>{schedule};
  if (interleaved_model != nullptr) {
    const int chunks = interleaved_model->num_stages() / num_devices;
    if (chunks < 2 || chunks * num_devices != interleaved_model->num_stages()) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("schedule candidates: the interleaved cost model's stages must be a "
                      "multiple >= 2 of the ", num_devices, " devices, got ",
                      interleaved_model->num_stages()));
    }
  } else if (!everything && make_schedule(schedule)->needs_virtual_stages()) {
    throw Error(ErrorKind::InvalidArgument,
                "--schedule interleaved needs virtual stages (chunks >= 2), got none");
  }
  std::vector<SearchCandidate> candidates;
  for (Recompute recompute : kRecomputeModes) {
    add_mode_candidates(candidates, kinds, model, interleaved_model, microbatches, recompute,
                        num_devices, memory_limit_bytes, mixed, /*mix_only=*/false);
  }
  return candidates;
}

}  // namespace dynapipe
