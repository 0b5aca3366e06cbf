#include "dynapipe/planner/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "dynapipe/batching/batching.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"
#include "dynapipe/plan/lowering.h"
#include "dynapipe/plan/verifier.h"
#include "dynapipe/schedule/schedule.h"
#include "dynapipe/schedule/schedule_search.h"

namespace dynapipe {

namespace {

constexpr int kInterleavedChunks = 2;

void validate_config(const PlanConfig& config) {
  config.model.validate();
  if (config.tp < 1) throw Error(ErrorKind::InvalidArgument, cat("--tp must be >= 1, got ", config.tp));
  check_tensor_parallel(config.model, config.tp);
  if (config.micro_batch_size < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--micro-batch-size must be >= 0, got ", config.micro_batch_size));
  }
  if (config.pp < 1) throw Error(ErrorKind::InvalidArgument, cat("--pp must be >= 1, got ", config.pp));
  if (config.dp < 1) throw Error(ErrorKind::InvalidArgument, cat("--dp must be >= 1, got ", config.dp));
  if (config.zero != 0 && config.zero != 1) {
    throw Error(ErrorKind::InvalidArgument, cat("--zero must be 0 or 1, got ", config.zero));
  }
  if (config.pp > config.model.total_layers()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--pp must be at most the model's ", config.model.total_layers(),
                    " layers (", config.model.name, "), got ", config.pp));
  }
  if (config.max_seqlen < 1) {
    throw Error(ErrorKind::InvalidArgument, cat("--max-seqlen must be >= 1, got ", config.max_seqlen));
  }
  if (config.global_batch_tokens < 1) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--global-batch-tokens must be >= 1, got ", config.global_batch_tokens));
  }
  if (config.memory_limit_gib < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--memory-limit must be >= 0 GiB, got ", config.memory_limit_gib));
  }
}

// Replays the replica's programs (deadlock freedom, matching, buffers) and their memory
// in instruction order: static bytes, each micro-batch's stored activations from F to its
// B/W and every live message buffer together must stay within the memory limit. This is
// the plan's memory claim checked independently of the simulator's timeline, which
// chose the schedule.
void verify_replica(const ReplicaPlan& replica, const PipelineProblem& problem,
                    const CostModel& stage_model, std::int64_t memory_limit_bytes) {
  VerifyOptions verify;
  verify.layout = problem.layout;
  verify.num_microbatches = static_cast<int>(replica.microbatches.size());
  verify.static_bytes = problem.static_bytes;
  verify.memory_limit_bytes = memory_limit_bytes;
  verify.bytes_per_element = stage_model.device().bytes_per_element;
  for (const auto& per_stage : problem.costs) {
    std::vector<std::int64_t> stored;
    for (const StageCost& c : per_stage) stored.push_back(c.stored_bytes);
    verify.stored_bytes.push_back(std::move(stored));
  }
  verify_programs(replica.executors, verify);
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = q * (values.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(rank));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (rank - lo) * (values[hi] - values[lo]);
}

}  // namespace

namespace {

struct ReplicaChoice {
  std::vector<MicroBatch> microbatches;
  std::vector<SearchCandidate> candidates;
  SearchResult best;
};

struct Choice {
  std::vector<ReplicaChoice> replicas;
  double est_ms = 0;  // the slowest replica's simulated makespan
};

}  // namespace

struct Planner::Impl {
  PlanConfig config;
  PlannerOptions options;
  std::shared_ptr<const CostModel> base_cost;   // pp stages, as configured
  std::shared_ptr<const CostModel> cost;        // base_cost, calibrated when asked
  std::unique_ptr<CostModel> interleaved_cost;  // pp * chunks stages, when interleaving applies
  std::int64_t memory_limit_bytes = 0;
  std::int64_t max_static_bytes = 0;  // the largest stage's parameters, grads, optimizer
  BatchingOptions batching;
  // The schedule searched: config.schedule, except packing-megatron's "auto", which is
  // 1F1B (the baseline's own schedule).
  ScheduleKind schedule = ScheduleKind::Auto;

  Choice search(const GlobalBatch& batch, const BatchingOptions& options) const;
};

// Micro-batches under `options`, then the best schedule x recompute of every replica.
Choice Planner::Impl::search(const GlobalBatch& batch, const BatchingOptions& options) const {
  const Impl& m = *this;
  const BatchingResult batching = make_microbatches(batch, *m.cost, options);
  Choice choice;
  for (std::size_t r = 0; r < batching.replicas.size(); ++r) {
    ReplicaChoice replica;
    replica.microbatches = batching.replicas[r];
    if (replica.microbatches.empty()) {
      throw Error(ErrorKind::Infeasible,
                  cat("iteration ", batch.index, ": ", batch.samples.size(),
                      " samples cannot feed --dp ", m.config.dp,
                      " replicas; raise --global-batch-tokens or lower --dp"));
    }
    replica.candidates = make_search_candidates(m.schedule, *m.cost, m.interleaved_cost.get(),
                                                replica.microbatches, m.config.pp, m.memory_limit_bytes);
    if (options.recompute) {
      // One mode for the whole run: the schedule search keeps the batching's.
      std::erase_if(replica.candidates,
                    [&](const SearchCandidate& c) { return c.recompute != *options.recompute; });
    }
    SearchOptions search_options;
    search_options.seed = m.config.seed;
    try {
      replica.best = search_schedule(replica.candidates, search_options);
    } catch (const Error& e) {
      throw Error(e.kind(), cat("iteration ", batch.index, " replica ", r, ": ", e.what()));
    }
    choice.est_ms = std::max(choice.est_ms, replica.best.sim.makespan_ms);
    choice.replicas.push_back(std::move(replica));
  }
  return choice;
}


Planner::Planner(const PlanConfig& config, const PlannerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  validate_config(config);
  for (double share : options.activation_budget_shares) {
    if (!(share > 0 && share < 1)) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("activation budget share must be in (0, 1), got ", share));
    }
  }
  Impl& m = *impl_;
  m.config = config;
  m.options = options;
  m.schedule = config.schedule;
  if (config.strategy == Strategy::PackingMegatron && config.schedule == ScheduleKind::Auto) {
    m.schedule = ScheduleKind::OneFOneB;
  }
  CostModelOptions cost_options;
  cost_options.num_stages = config.pp;
  cost_options.tp = config.tp;
  cost_options.seqlen_multiple = config.seqlen_multiple;
  cost_options.layers = config.stage_layers;
  cost_options.zero_shards = config.zero == 1 ? config.dp : 1;
  m.base_cost = make_cost_model(config.cost_model, config.model, cost_options);
  m.cost = options.calibration ? make_calibrated_cost_model(m.base_cost, options.calibration)
                               : m.base_cost;

  // A chosen (non-uniform) split has no interleaved counterpart: virtual stages place
  // layers uniformly.
  const bool interleaving_possible = config.pp > 1 && config.stage_layers.empty() &&
                                     config.model.total_layers() >= config.pp * kInterleavedChunks;
  const bool wants_interleaved =
      m.schedule == ScheduleKind::Interleaved ||
      (m.schedule == ScheduleKind::Auto && !options.fixed_layout);
  if (m.schedule == ScheduleKind::Interleaved && !config.stage_layers.empty()) {
    throw Error(ErrorKind::InvalidArgument,
                "--schedule interleaved places layers uniformly over virtual stages; it needs --partition uniform "
                "(or a balanced split that came out uniform)");
  }
  if (config.schedule == ScheduleKind::Interleaved && !interleaving_possible) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--schedule interleaved needs --pp >= 2 and at least ", kInterleavedChunks,
                    " layers per stage (", config.model.name, " has ", config.model.total_layers(),
                    " layers), got --pp ", config.pp));
  }
  m.config.chunks = 1;
  if (wants_interleaved && interleaving_possible) {
    CostModelOptions interleaved_options = cost_options;
    interleaved_options.num_stages = config.pp * kInterleavedChunks;
    m.interleaved_cost = make_cost_model(config.cost_model, config.model, interleaved_options);
    if (config.schedule == ScheduleKind::Interleaved) m.config.chunks = kInterleavedChunks;
  }

  m.memory_limit_bytes = config.memory_limit_gib > 0 ? gib_to_bytes(config.memory_limit_gib)
                                                     : m.cost->device().memory_bytes;
  if (config.memory_limit_gib <= 0) m.config.memory_limit_gib = bytes_to_gib(m.memory_limit_bytes);
  for (int stage = 0; stage < m.cost->num_stages(); ++stage) {
    const std::int64_t static_bytes = m.cost->static_bytes(stage);
    m.max_static_bytes = std::max(m.max_static_bytes, static_bytes);
    if (static_bytes >= m.memory_limit_bytes) {
      throw Error(ErrorKind::Infeasible,
                  cat("--memory-limit ", format_gib(m.memory_limit_bytes),
                      " must exceed the static memory of stage ", stage, " (",
                      format_gib(static_bytes),
                      " of parameters, gradients and optimizer states), got ",
                      format_gib(m.memory_limit_bytes)));
    }
  }

  BatchingOptions& b = m.batching;
  b.strategy = config.strategy;
  b.kind = config.model.kind;
  b.num_stages = config.pp;
  b.dp = config.dp;
  b.memory_limit_bytes = m.memory_limit_bytes;
  b.max_seqlen = config.max_seqlen;
  b.max_target_len = config.max_target_len > 0 ? config.max_target_len : config.max_seqlen;
  b.seqlen_multiple = config.seqlen_multiple;
  b.fixed_batch = config.micro_batch_size;
  b.recompute = config.recompute;
  b.validate();
}

Planner::~Planner() = default;

const PlanConfig& Planner::config() const { return impl_->config; }
const CostModel& Planner::cost_model() const { return *impl_->cost; }
const CostModel& Planner::base_cost_model() const { return *impl_->base_cost; }
const std::vector<StageLayers>& Planner::stage_layers() const {
  return impl_->config.chunks > 1 ? impl_->interleaved_cost->stages() : impl_->base_cost->stages();
}

IterationPlan Planner::plan_iteration(const GlobalBatch& batch) const {
  const Impl& m = *impl_;
  const auto start = std::chrono::steady_clock::now();
  IterationPlan iteration;
  iteration.index = batch.index;
  iteration.truncated_ids = batch.truncated_ids;
  iteration.sample_ids.reserve(batch.samples.size());
  for (const Sample& s : batch.samples) iteration.sample_ids.push_back(s.id);

  Choice choice = m.search(batch, m.batching);
  if (m.batching.strategy == Strategy::DynaPipe) {
    // The DP sizes micro-batches to the 1F1B memory rule; schedules that keep more in
    // flight (zb1p, cyclic) may only fit smaller ones. Also try the DP under a tighter
    // activation budget and keep whichever simulates faster.
    for (double share : m.options.activation_budget_shares) {
      BatchingOptions tighter = m.batching;
      tighter.memory_limit_bytes =
          m.max_static_bytes +
          static_cast<std::int64_t>(share * static_cast<double>(m.memory_limit_bytes - m.max_static_bytes));
      try {
        Choice other = m.search(batch, tighter);
        if (other.est_ms < choice.est_ms) choice = std::move(other);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::Infeasible) throw;  // a sample alone no longer fits: skip
      }
    }
  }
  std::int64_t real_tokens = 0, computed_tokens = 0;
  for (std::size_t r = 0; r < choice.replicas.size(); ++r) {
    const std::vector<MicroBatch>& microbatches = choice.replicas[r].microbatches;
    const std::vector<SearchCandidate>& candidates = choice.replicas[r].candidates;
    const SearchResult& best = choice.replicas[r].best;
    const SearchCandidate& chosen = candidates[best.candidate];
    const CostModel& stage_model =
        chosen.problem.layout.chunks > 1 ? *m.interleaved_cost : *m.cost;

    ReplicaPlan replica;
    replica.microbatches = microbatches;
    replica.schedule = best.schedule;
    replica.recompute = best.recompute;
    replica.est_iteration_ms = best.sim.makespan_ms;
    replica.est_peak_memory_bytes = best.sim.peak_memory_bytes;
    replica.timeline = best.sim.timeline;
    for (const MicroBatch& mb : microbatches) {
      MicroBatchEstimate estimate;
      for (const StageCost& c : chosen.problem.costs[mb.id]) {
        estimate.fwd_ms.push_back(c.fwd_ms);
        estimate.bwd_ms.push_back(c.bwd_ms);
        estimate.activation_bytes.push_back(c.stored_bytes);
      }
      replica.estimates.push_back(std::move(estimate));
      real_tokens += mb.real_tokens;
      computed_tokens += mb.shape.tokens();
    }

    LoweringInput lowering;
    lowering.model = m.config.model.kind;
    lowering.hidden = m.config.model.hidden;
    lowering.layout = chosen.problem.layout;
    for (const MicroBatch& mb : microbatches) lowering.microbatches.push_back(mb.shape);
    lowering.stages = stage_model.stages();
    lowering.replica = static_cast<int>(r);
    lowering.dp = m.config.dp;
    lowering.order = &best.order;
    lowering.sim = &best.sim;
    replica.executors = lower_to_programs(lowering);
    if (m.options.verify) verify_replica(replica, chosen.problem, stage_model, m.memory_limit_bytes);
    iteration.est_iteration_ms = std::max(iteration.est_iteration_ms, replica.est_iteration_ms);
    iteration.replicas.push_back(std::move(replica));
  }
  if (m.config.dp > 1) {
    // Gradient all-reduce after the last backward: fp16/bf16 gradients of the largest stage.
    std::int64_t largest = 0;
    for (int s = 0; s < m.cost->num_stages(); ++s) largest = std::max(largest, m.cost->static_bytes(s));
    const std::int64_t grad_bytes = largest / 16 * m.cost->device().bytes_per_element;
    iteration.est_iteration_ms += m.cost->allreduce_ms(grad_bytes, m.config.dp);
  }
  iteration.padding_efficiency =
      computed_tokens > 0 ? static_cast<double>(real_tokens) / computed_tokens : 0.0;
  iteration.planning_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return iteration;
}

TruncationLimits truncation_limits(const PlanConfig& config) {
  TruncationLimits limits;
  limits.kind = config.model.kind;
  limits.max_seqlen = config.max_seqlen;
  limits.max_target_len = config.max_target_len;
  return limits;
}

PlanSummary summarize(const std::vector<IterationPlan>& iterations) {
  PlanSummary summary;
  summary.iterations = static_cast<std::int64_t>(iterations.size());
  if (iterations.empty()) return summary;
  double total_ms = 0, planning_ms = 0;
  std::int64_t real_tokens = 0, computed_tokens = 0;
  std::vector<double> planning;
  for (const IterationPlan& it : iterations) {
    total_ms += it.est_iteration_ms;
    planning_ms += it.planning_ms;
    planning.push_back(it.planning_ms);
    for (const ReplicaPlan& r : it.replicas) {
      for (const MicroBatch& mb : r.microbatches) {
        real_tokens += mb.real_tokens;
        computed_tokens += mb.shape.tokens();
      }
    }
  }
  summary.mean_est_iteration_ms = total_ms / iterations.size();
  summary.est_tokens_per_s = total_ms > 0 ? real_tokens / (total_ms / 1000.0) : 0.0;
  summary.padding_efficiency =
      computed_tokens > 0 ? static_cast<double>(real_tokens) / computed_tokens : 0.0;
  summary.mean_planning_ms = planning_ms / iterations.size();
  summary.p99_planning_ms = percentile(planning, 0.99);
  return summary;
}

}  // namespace dynapipe
