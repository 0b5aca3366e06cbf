#include "dynapipe/planner/planner.h"

#include "planner_impl.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "dynapipe/core/error.h"
#include "dynapipe/core/parallel.h"
#include "dynapipe/core/rank_layout.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/core/units.h"
#include "dynapipe/plan/lowering.h"
#include "dynapipe/plan/replicate_stages.h"
#include "dynapipe/plan/verifier.h"
#include "dynapipe/schedule/schedule.h"
#include "dynapipe/schedule/simulator.h"

namespace dynapipe {

using namespace planner_detail;

namespace {

void validate_config(const PlanConfig& config) {
  config.model.validate();
  if (config.tp < 1) throw Error(ErrorKind::InvalidArgument, cat("--tp must be >= 1, got ", config.tp));
  check_tensor_parallel(config.model, config.tp);
  if (config.micro_batch_size < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--micro-batch-size must be >= 0, got ", config.micro_batch_size));
  }
  if (config.token_budget < 0) {
    throw Error(ErrorKind::InvalidArgument, cat("--token-budget must be >= 0, got ", config.token_budget));
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
  // Asynchronous schedules step per micro-batch on each stage: no replicas to reduce with.
  if (is_async_schedule(config.schedule) && config.dp != 1) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--schedule ", schedule_kind_name(config.schedule), " needs --dp 1, got ",
                    config.dp));
  }
  if (config.vertical_sync && config.schedule != ScheduleKind::PipeDream) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--vertical-sync needs --schedule pipedream, got ",
                    schedule_kind_name(config.schedule)));
  }
  if (!config.stage_replicas.empty()) {
    const auto& r = config.stage_replicas;
    if (static_cast<int>(r.size()) != config.pp || *std::min_element(r.begin(), r.end()) < 1) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("--replicas must have one count >= 1 per stage (--pp ", config.pp, "), got ",
                      join(r, ",")));
    }
    if (config.schedule == ScheduleKind::Interleaved) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("--schedule interleaved cannot run replicated stages (--replicas ",
                      join(r, ","), "); choose another --schedule"));
    }
    // Replicated stages reduce their gradients once per iteration.
    if (is_async_schedule(config.schedule)) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("--schedule ", schedule_kind_name(config.schedule),
                      " cannot run replicated stages (--replicas ", join(r, ","),
                      "); choose a schedule that flushes"));
    }
  }
}

// Replays the replica's programs (deadlock freedom, matching, buffers) and their memory
// in instruction order: static bytes, each micro-batch's stored activations from F to its
// B/W and every live message buffer together must stay within the memory limit. This is
// the plan's memory claim checked independently of the simulator's timeline, which
// chose the schedule.
void verify_replica(const ReplicaPlan& replica, const PipelineProblem& problem,
                    const CostModel& stage_model, std::int64_t memory_limit_bytes,
                    const std::vector<int>& stage_replicas) {
  VerifyOptions verify;
  verify.layout = problem.layout;
  verify.stage_replicas = stage_replicas;
  verify.num_microbatches = static_cast<int>(replica.microbatches.size());
  verify.static_bytes = problem.static_bytes;
  verify.weight_bytes = problem.weight_bytes;
  verify.memory_limit_bytes = memory_limit_bytes;
  verify.bytes_per_element = stage_model.device().bytes_per_element;
  for (const auto& per_stage : problem.costs) {
    std::vector<std::int64_t> stored;
    for (const StageCost& c : per_stage) stored.push_back(c.stored_bytes);
    verify.stored_bytes.push_back(std::move(stored));
  }
  verify_programs(replica.executors, verify);
}

// Replicated stages: the chosen order simulated with each stage-replica as a device of
// its own, running its stage's ops of its micro-batches (m mod r) in the stage's order, as
// replicate_stages() splits the programs. Orders of the pp-device search stay valid: a
// run of the stage order restricted to a stage-replica's ops is a run of the split one.
SimResult simulate_stage_replicas(const PipelineProblem& problem, const ScheduleOrder& order,
                                  const std::vector<int>& stage_replicas) {
  PipelineProblem replicated = problem;
  replicated.stage_replicas = stage_replicas;
  ScheduleOrder split;
  for (int d = 0; d < problem.layout.num_devices; ++d) {
    const int r = stage_replicas[static_cast<std::size_t>(d)];
    for (int a = 0; a < r; ++a) {
      auto& ops = split.device_ops.emplace_back();
      std::vector<int>* cycles = order.op_cycle.empty() ? nullptr : &split.op_cycle.emplace_back();
      for (std::size_t i = 0; i < order.device_ops[d].size(); ++i) {
        const PipelineOp& op = order.device_ops[d][i];
        if (op.mb % r != a) continue;
        ops.push_back(op);
        if (cycles != nullptr) cycles->push_back(order.op_cycle[d][i]);
      }
    }
  }
  return simulate(replicated, split, SimOptions{.record = false});
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = q * (values.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(rank));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (rank - lo) * (values[hi] - values[lo]);
}

// ZB-H1 fills 1F1B's bubble with deferred W passes: its fill/drain costs about
// (p − 1)·(F + I − W) instead of (p − 1)·(F + I + W) (Qi et al., "Zero Bubble Pipeline
// Parallelism", 2023). The ratio on the bottleneck stage of a max-length sample.
double zero_bubble_weight(const CostModel& cost, const BatchingOptions& batching) {
  const MicroBatchShape shape{.batch = 1,
                              .seqlen = batching.max_seqlen,
                              .dec_seqlen = batching.kind == ModelKind::T5 ? batching.max_target_len + 1 : 0};
  double worst = -1, weight = 1;
  for (int s = 0; s < cost.num_stages(); ++s) {
    const StageCost c = cost.stage_cost(s, shape, {}, Recompute::None);
    const double total = c.fwd_ms + c.bwd_ms;
    if (total > worst && total > 0) {
      worst = total;
      weight = (c.fwd_ms + c.bwd_input_ms - c.bwd_weight_ms) / total;
    }
  }
  return std::clamp(weight, 0.05, 1.0);
}

// Interleaved 1F1B with C chunks: device d warms up with 2(D − d − 1) + (C − 1)·D chunk
// forwards and holds one more in the steady state, each 1/C of its layers' activations.
std::vector<int> interleaved_in_flight(int pp, int chunks) {
  std::vector<int> k;
  for (int d = 0; d < pp; ++d) {
    const int chunk_forwards = 2 * (pp - d - 1) + (chunks - 1) * pp + 1;
    k.push_back((chunk_forwards + chunks - 1) / chunks);
  }
  return k;
}

}  // namespace

Planner::Planner(const PlanConfig& config, const PlannerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  validate_config(config);
  for (double share : options.activation_budget_shares) {
    if (!(share > 0 && share < 1)) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("activation budget share must be in (0, 1), got ", share));
    }
  }
  if (options.random_orders < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("random orders must be >= 0, got ", options.random_orders));
  }
  checked_thread_count(options.threads, "PlannerOptions::threads");
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

  // Interleaving keeps the chosen split: each device's layers are cut into chunks
  // (assign_layers_interleaved), so every device holds what the split gives it. The uniform
  // split keeps its uniform virtual stages.
  const std::vector<int> device_layers = layers_per_stage(m.base_cost->stages());
  const bool interleaving_possible =
      config.pp > 1 && *std::min_element(device_layers.begin(), device_layers.end()) >= kInterleavedChunks;
  // Replicated stages split each device's program by micro-batch (replicate_stages.h),
  // which interleaved chunks do not support.
  const bool wants_interleaved =
      m.schedule == ScheduleKind::Interleaved ||
      (m.schedule == ScheduleKind::Auto && !options.fixed_layout && config.stage_replicas.empty());
  if (config.schedule == ScheduleKind::Interleaved && !interleaving_possible) {
    throw Error(ErrorKind::Unsupported,
                cat("--schedule interleaved needs --pp >= 2 and at least ", kInterleavedChunks,
                    " layers on every stage (", config.model.name, " split ", join(device_layers, ","),
                    "), got --pp ", config.pp));
  }
  m.config.chunks = 1;
  if (wants_interleaved && interleaving_possible) {
    CostModelOptions interleaved_options = cost_options;
    interleaved_options.num_stages = config.pp * kInterleavedChunks;
    if (!config.stage_layers.empty()) {
      interleaved_options.layers = assign_layers_interleaved(config.model, device_layers, kInterleavedChunks);
    }
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
  b.token_budget = config.token_budget;
  b.recompute = config.recompute;
  b.mixed_recompute = config.mixed_recompute;
  b.validate();

  // DP strategies plan their cuts for the schedule: one DP per schedule family, each
  // searched with that schedule (the 1F1B rule with every schedule under auto).
  if (is_dp_strategy(b.strategy) && options.schedule_aware_dp && config.pp > 1) {
    const DpTarget zb{ScheduleKind::Zb1p, std::vector<int>(static_cast<std::size_t>(config.pp), config.pp),
                      zero_bubble_weight(*m.cost, b)};
    const bool interleaved = m.interleaved_cost != nullptr;
    const DpTarget il{ScheduleKind::Interleaved, interleaved_in_flight(config.pp, kInterleavedChunks),
                      1.0 / kInterleavedChunks};
    if (config.schedule == ScheduleKind::Zb1p) {
      b.in_flight = zb.in_flight;
      b.bubble_weight = zb.bubble_weight;
    } else if (config.schedule == ScheduleKind::Interleaved) {
      b.in_flight = il.in_flight;
      b.bubble_weight = il.bubble_weight;
    } else if (config.schedule == ScheduleKind::Auto) {
      m.more_targets.push_back(zb);
      if (interleaved) m.more_targets.push_back(il);
    }
  }
}

Planner::~Planner() = default;

const PlanConfig& Planner::config() const { return impl_->config; }
const CostModel& Planner::cost_model() const { return *impl_->cost; }
const CostModel& Planner::base_cost_model() const { return *impl_->base_cost; }

std::string Planner::extrapolation_warning() const {
  const PlanConfig& c = impl_->config;
  return impl_->base_cost->extrapolation_warning(c.max_seqlen, c.max_target_len > 0 ? c.max_target_len : c.max_seqlen);
}
const std::vector<StageLayers>& Planner::stage_layers() const {
  return impl_->config.chunks > 1 ? impl_->interleaved_cost->stages() : impl_->base_cost->stages();
}

IterationPlan Planner::plan_iteration(const GlobalBatch& batch) const {
  return plan_iteration(batch, impl_->options.threads);
}

IterationPlan Planner::plan_iteration(const GlobalBatch& batch, int threads) const {
  const Impl& m = *impl_;
  const auto start = std::chrono::steady_clock::now();
  IterationPlan iteration;
  iteration.index = batch.index;
  iteration.truncated_ids = batch.truncated_ids;
  iteration.sample_ids.reserve(batch.samples.size());
  for (const Sample& s : batch.samples) iteration.sample_ids.push_back(s.id);

  Choice choice = m.choose(batch, resolve_thread_count(checked_thread_count(threads, "plan_iteration threads")));
  std::int64_t real_tokens = 0, computed_tokens = 0;
  for (std::size_t r = 0; r < choice.replicas.size(); ++r) {
    const std::vector<MicroBatch>& microbatches = choice.replicas[r].microbatches;
    const std::vector<SearchCandidate>& candidates = choice.replicas[r].candidates;
    const SearchResult& best = choice.replicas[r].best;
    const PipelineProblem& chosen = *candidates[best.candidate].problem;
    const CostModel& stage_model = chosen.layout.chunks > 1 ? *m.interleaved_cost : *m.cost;

    DYNAPIPE_CHECK(!m.config.recompute || best.recompute == *m.config.recompute,
                   cat("iteration ", batch.index, " planned recompute ", recompute_name(best.recompute),
                       " under --recompute ", recompute_name(*m.config.recompute)));
    ReplicaPlan replica;
    replica.microbatches = microbatches;
    for (std::size_t i = 0; i < best.modes.size(); ++i) {  // a mix of modes won
      if (best.modes[i] != best.recompute) replica.microbatches[i].recompute = best.modes[i];
    }
    replica.schedule = best.schedule;
    replica.recompute = best.recompute;
    replica.est_iteration_ms = best.sim.makespan_ms;
    replica.est_peak_memory_bytes = best.sim.peak_memory_bytes;
    replica.timeline = best.sim.timeline;
    for (const MicroBatch& mb : microbatches) {
      MicroBatchEstimate estimate;
      for (const StageCost& c : chosen.costs[mb.id]) {
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
    lowering.layout = chosen.layout;
    for (const MicroBatch& mb : microbatches) lowering.microbatches.push_back(mb.shape);
    lowering.stages = stage_model.stages();
    lowering.replica = static_cast<int>(r);
    lowering.dp = m.config.dp;
    lowering.order = &best.order;
    lowering.sim = &best.sim;
    replica.executors = lower_to_programs(lowering);
    if (best.order.weight_update != WeightUpdate::PerIteration) {
      add_weight_versions(replica.executors, best.order);
    }
    if (!m.config.stage_replicas.empty()) {
      // Estimates of the ranks as they run: makespan, and per stage its largest
      // stage-replica peak (est_peak_memory_bytes stays [device]).
      const SimResult ranks_sim =
          simulate_stage_replicas(chosen, best.order, m.config.stage_replicas);
      replica.est_iteration_ms = ranks_sim.makespan_ms;
      std::size_t rank = 0;
      for (int d = 0; d < m.config.pp; ++d) {
        std::int64_t& peak = replica.est_peak_memory_bytes[static_cast<std::size_t>(d)];
        peak = 0;
        for (int a = 0; a < m.config.stage_replicas[d]; ++a) {
          peak = std::max(peak, ranks_sim.peak_memory_bytes[rank++]);
        }
      }
      replica.executors = replicate_stages(
          replica.executors,
          RankLayout{
              .pp = m.config.pp, .dp = m.config.dp, .stage_replicas = m.config.stage_replicas});
    }
    if (m.options.verify) {
      verify_replica(replica, chosen, stage_model, m.memory_limit_bytes, m.config.stage_replicas);
    }
    iteration.est_iteration_ms = std::max(iteration.est_iteration_ms, replica.est_iteration_ms);
    iteration.replicas.push_back(std::move(replica));
  }
  if (m.config.dp > 1) {
    // Gradient all-reduce after the last backward: the gradients of the largest stage.
    std::int64_t grad_bytes = 0;
    for (int s = 0; s < m.cost->num_stages(); ++s) grad_bytes = std::max(grad_bytes, m.cost->weight_bytes(s));
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
