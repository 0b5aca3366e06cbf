// The real system behind `dynapipe train`: data/ global batches, planner/ Planner, and
// runtime/model/ stage models + collate. This is the one file that binds the executor to
// the modules it runs; each hook below is the single place to wire its module.
#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>

#include "dynapipe/core/error.h"
#include "dynapipe/cost/calibration.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/data/samples_cache.h"
#include "dynapipe/data/truncation.h"
#include "dynapipe/planner/planner.h"
#include "dynapipe/runtime/plan_store.h"
#include "runtime/exec/plan_codec.h"
#include "runtime/exec/trainer.h"
#include "runtime/model/collate.h"
#include "runtime/model/model.h"

namespace dynapipe::runtime {

namespace {

AttentionMode attention_mode(Strategy strategy) {
  switch (strategy) {
    case Strategy::DynaPipe:  // one block-diagonal row per micro-batch
    case Strategy::PackingVarlen: return AttentionMode::Varlen;
    case Strategy::Packing:
    case Strategy::PackingMegatron: return AttentionMode::Packed;  // rows of several samples
    case Strategy::Padding:
    case Strategy::TokenBased:
    case Strategy::DynaPipePadded: return AttentionMode::Padded;
  }
  return AttentionMode::Padded;
}

// Tokens of the samples file: the byte tokenizer's for text samples, the data module's
// deterministic synthetic pattern for lengths-only ones.
class DatasetTokenSource final : public TokenSource {
 public:
  explicit DatasetTokenSource(std::shared_ptr<const Dataset> dataset) : dataset_(std::move(dataset)) {}
  runtime::SampleTokens tokens(SampleId id) const override {
    const dynapipe::SampleTokens t = dataset_->tokens(id);
    return {std::vector<std::int32_t>(t.input.begin(), t.input.end()),
            std::vector<std::int32_t>(t.target.begin(), t.target.end())};
  }

 private:
  std::shared_ptr<const Dataset> dataset_;
};

// The calibration's memory factors each iteration was planned with: a plan's peak
// estimate is static + factor x the uncalibrated activations (the simulator sums stored
// and transient bytes, all scaled alike), so dividing by the factor recovers the
// uncalibrated estimate the measured peak is compared with.
class PlannedMemoryFactors {
 public:
  void record(std::int64_t iteration, const CostCalibration& calibration) {
    std::vector<double> factors;
    for (int s = 0; s < calibration.num_stages(); ++s) factors.push_back(calibration.memory_factor(s));
    std::lock_guard lock(mutex_);
    by_iteration_[iteration] = std::move(factors);
  }
  // The factors of `iteration` (forgotten afterwards, with every earlier one); empty if unknown.
  std::vector<double> take(std::int64_t iteration) {
    std::lock_guard lock(mutex_);
    std::vector<double> factors;
    if (auto it = by_iteration_.find(iteration); it != by_iteration_.end()) factors = std::move(it->second);
    by_iteration_.erase(by_iteration_.begin(), by_iteration_.upper_bound(iteration));
    return factors;
  }

 private:
  std::mutex mutex_;
  std::map<std::int64_t, std::vector<double>> by_iteration_;
};

// What the uncalibrated model estimated for the work each device measured (averaged over
// replicas, like the measurement), folded into the calibration; the same for peak memory,
// given the memory factors the plan was made with.
void refine(CostCalibration& calibration, const CostModel& base, const IterationPlan& plan,
            const std::vector<MeasuredStageTimes>& devices, const std::vector<double>& planned_memory_factors) {
  const double replicas = static_cast<double>(plan.replicas.size());
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const int stage = static_cast<int>(d);
    TimeObservation forward{.measured_ms = devices[d].forward_ms};
    TimeObservation backward{.measured_ms = devices[d].backward_ms};
    for (const ReplicaPlan& replica : plan.replicas) {
      for (const MicroBatch& mb : replica.microbatches) {
        const StageCost cost = base.stage_cost(stage, mb.shape, mb.density, recompute_of(mb, replica.recompute));
        forward.base_ms += cost.fwd_ms / replicas;
        backward.base_ms += cost.bwd_ms / replicas;
      }
    }
    calibration.observe(stage, forward, backward);
    if (d >= planned_memory_factors.size()) continue;
    double est_peak = 0;
    for (const ReplicaPlan& replica : plan.replicas) {
      if (d < replica.est_peak_memory_bytes.size())
        est_peak = std::max(est_peak, static_cast<double>(replica.est_peak_memory_bytes[d]));
    }
    const double static_bytes = static_cast<double>(base.static_bytes(stage));
    calibration.observe_memory(stage, {.measured_bytes = devices[d].peak_memory_bytes,
                                       .static_bytes = static_bytes,
                                       .activation_bytes = (est_peak - static_bytes) / planned_memory_factors[d]});
  }
}

}  // namespace

namespace {

struct TrainingData {
  std::shared_ptr<const Dataset> dataset;
  std::shared_ptr<const std::vector<GlobalBatch>> batches;
};

// Positions restart with every sample (model/collate.cpp), so a sample longer than the
// model's learned position table is the one thing that cannot embed; the runtime would
// stop at its micro-batch, maybe hours in. Checked before any rank starts.
void check_positions(const Dataset& dataset, const PlanConfig& config) {
  const ModelSpec& model = config.model;
  const bool gpt = model.kind == ModelKind::Gpt;
  for (const Sample& s : dataset.samples()) {
    // GPT embeds input + target as one sequence; T5 each side on its own.
    const bool input_side = gpt || s.input_len >= s.target_len;
    const std::int64_t longest = gpt ? std::int64_t{s.input_len} + s.target_len
                                     : std::max<std::int64_t>(s.input_len, s.target_len);
    if (longest <= model.max_positions) continue;
    const char* what = gpt ? " tokens (input + target)" : input_side ? " input tokens" : " target tokens";
    throw Error(ErrorKind::InvalidArgument,
                cat(config.samples_path, ": sample ", s.id, " has ", longest, what, " after truncation, past the ",
                    model.max_positions, " learned positions of ", model.name, " (max_positions); lower ",
                    input_side ? "--max-seqlen" : "--max-target-len", " to at most ", model.max_positions,
                    " or raise max_positions"));
  }
}

TrainingData load_training_data(const PlanConfig& config, SamplesCache* samples) {
  TrainingData data;
  data.dataset = load_samples(samples, config.samples_path, truncation_limits(config));
  check_positions(*data.dataset, config);
  data.batches = std::make_shared<const std::vector<GlobalBatch>>(
      form_global_batches(data.dataset->samples(), data.dataset->truncated_ids(),
                          config.global_batch_tokens, config.iterations));
  if (data.batches->empty()) {
    throw Error(ErrorKind::InvalidArgument, cat(config.samples_path, ": no global batches"));
  }
  return data;
}

PlannerOptions training_planner_options() {
  PlannerOptions options;
  options.fixed_layout = true;
  return options;
}

}  // namespace

void check_training_inputs(const TrainOptions& options) {
  parse_plan_store_url(options.plan_store);
  const Planner planner(options.plan, training_planner_options());
  load_training_data(options.plan, options.samples.get());
}

AttentionMode trained_attention_mode(Strategy strategy, const MicroBatch& mb) {
  const AttentionMode mode = attention_mode(strategy);
  // A dense micro-batch of a varlen plan (no density: dynapipe-padded's cut ranked as it
  // runs) runs padded attention, as it was priced; but a lone sample (one dense row, as
  // measured profiles price it) runs as one varlen span: the same attention, without the
  // s x s masks the padded path builds and applies, which cost this CPU runtime more than
  // the stage profiles measure (t5-tiny pp 2 on its whole-stage profile: dynapipe's plans,
  // the same cuts as packing-varlen's but for lone samples dense, ran 0.91x its speed).
  const bool lone_sample = mb.sample_ids.size() == 1;
  return mode == AttentionMode::Varlen && mb.density == AttentionDensity{} && !lone_sample ? AttentionMode::Padded
                                                                                          : mode;
}

std::shared_ptr<const TokenSource> make_dataset_token_source(std::shared_ptr<const Dataset> dataset) {
  return std::make_shared<DatasetTokenSource>(std::move(dataset));
}

TrainHooks make_default_hooks(const TrainOptions& options, int rank) {
  TrainHooks hooks;
  const PlanConfig& config = options.plan;
  const TrainingData data = load_training_data(config, options.samples.get());
  const std::shared_ptr<const Dataset>& dataset = data.dataset;
  // Every rank builds the planner (cheap: cost models only) for the stage layout; only
  // rank 0 plans. With fixed_layout, every iteration keeps one layout: one stage per
  // device, or pp x chunks virtual stages when --schedule interleaved asks for them.
  PlannerOptions planner_options = training_planner_options();
  std::shared_ptr<CostCalibration> calibration;
  if (rank == 0 && options.refine_cost_model) {
    calibration = std::make_shared<CostCalibration>(config.pp);
    planner_options.calibration = calibration;
  }
  auto planner = std::make_shared<const Planner>(config, planner_options);
  const std::vector<StageLayers> layers = planner->stage_layers();
  hooks.num_stages = static_cast<int>(layers.size());

  if (rank == 0) {
    if (const std::string warning = planner->extrapolation_warning(); !warning.empty())
      std::fprintf(stderr, "%s\n", warning.c_str());
    const std::shared_ptr<const std::vector<GlobalBatch>>& batches = data.batches;
    auto planned = std::make_shared<PlannedMemoryFactors>();
    if (calibration) {
      // The first step this process runs pays one-off costs (first allocations, lazy
      // initialisation): it would teach the calibration a factor no later step has.
      auto warmed_up = std::make_shared<bool>(false);
      hooks.observe_step = [planner, calibration, warmed_up, planned](
                               const IterationPlan& plan, const std::vector<MeasuredStageTimes>& devices) {
        const std::vector<double> factors = planned->take(plan.index);
        if (!*warmed_up) {
          *warmed_up = true;
          return;
        }
        refine(*calibration, planner->base_cost_model(), plan, devices, factors);
      };
      hooks.describe_refinement = [calibration] { return calibration->describe(); };
    }
    hooks.produce_plan = [batches, planner, calibration, planned](std::int64_t i) {
      if (calibration) planned->record(i, *calibration);
      GlobalBatch batch = (*batches)[i % batches->size()];
      batch.index = i;  // data position i, cycling through the data
      return encode_plan(planner->plan_iteration(batch));
    };
  }
  ModelOptions model_options;
  model_options.dropout = options.dropout;
  model_options.seed = config.seed;
  const ModelSpec model = config.model;
  hooks.make_stage = [model, layers, model_options](int stage) {
    return make_stage_model(model, layers.at(stage), model_options);
  };
  auto source = make_dataset_token_source(dataset);
  const Strategy strategy = config.strategy;
  const ModelKind kind = config.model.kind;
  hooks.collate = [source, strategy, kind](const MicroBatch& mb) {
    return collate(mb, *source, kind, trained_attention_mode(strategy, mb), /*loss_scale: set by the executor*/ 1.0);
  };
  return hooks;
}

}  // namespace dynapipe::runtime
