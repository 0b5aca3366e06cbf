// The real system behind `dynapipe train`: data/ global batches, planner/ Planner, and
// runtime/model/ stage models + collate. This is the one file that binds the executor to
// the modules it runs; each hook below is the single place to wire its module.
#include "dynapipe/core/error.h"
#include "dynapipe/cost/calibration.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/data/truncation.h"
#include "dynapipe/planner/planner.h"
#include "runtime/exec/plan_codec.h"
#include "runtime/exec/trainer.h"
#include "runtime/model/collate.h"
#include "runtime/model/model.h"

namespace dynapipe::runtime {

namespace {

AttentionMode attention_mode(const std::string& strategy) {
  if (strategy == "packing-varlen" || strategy == "dynapipe") return AttentionMode::Varlen;
  if (strategy == "packing") return AttentionMode::Packed;
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

// What the uncalibrated model estimated for the work each device measured (averaged over
// replicas, like the measurement), folded into the calibration.
void refine(CostCalibration& calibration, const CostModel& base, const IterationPlan& plan,
            const std::vector<MeasuredStageTimes>& devices) {
  const double replicas = static_cast<double>(plan.replicas.size());
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const int stage = static_cast<int>(d);
    TimeObservation forward{.measured_ms = devices[d].forward_ms};
    TimeObservation backward{.measured_ms = devices[d].backward_ms};
    for (const ReplicaPlan& replica : plan.replicas) {
      for (const MicroBatch& mb : replica.microbatches) {
        const StageCost cost = base.stage_cost(stage, mb.shape, mb.density, replica.recompute);
        forward.base_ms += cost.fwd_ms / replicas;
        backward.base_ms += cost.bwd_ms / replicas;
      }
    }
    calibration.observe(stage, forward, backward);
  }
}

}  // namespace

std::shared_ptr<const TokenSource> make_dataset_token_source(std::shared_ptr<const Dataset> dataset) {
  return std::make_shared<DatasetTokenSource>(std::move(dataset));
}

TrainHooks make_default_hooks(const TrainOptions& options, int rank) {
  TrainHooks hooks;
  // PlannerOptions{.fixed_layout = true} never picks the interleaved schedule, so every
  // iteration keeps one virtual stage per device.
  hooks.num_stages = options.plan.pp;
  const PlanConfig& config = options.plan;
  const TruncationLimits limits = truncation_limits(config);
  auto dataset = std::make_shared<const Dataset>(Dataset::load(config.samples_path, limits));

  if (rank == 0) {
    auto batches = std::make_shared<const std::vector<GlobalBatch>>(form_global_batches(
        dataset->samples(), dataset->truncated_ids(), config.global_batch_tokens, config.iterations));
    if (batches->empty()) {
      throw Error(ErrorKind::InvalidArgument, cat(config.samples_path, ": no global batches"));
    }
    PlannerOptions planner_options;
    planner_options.fixed_layout = true;
    std::shared_ptr<CostCalibration> calibration;
    if (options.refine_cost_model) {
      calibration = std::make_shared<CostCalibration>(config.pp);
      planner_options.calibration = calibration;
    }
    auto planner = std::make_shared<const Planner>(config, planner_options);
    if (calibration) {
      // The first step this process runs pays one-off costs (first allocations, lazy
      // initialisation): it would teach the calibration a factor no later step has.
      auto warmed_up = std::make_shared<bool>(false);
      hooks.observe_step = [planner, calibration, warmed_up](
                               const IterationPlan& plan, const std::vector<MeasuredStageTimes>& devices) {
        if (!*warmed_up) {
          *warmed_up = true;
          return;
        }
        refine(*calibration, planner->base_cost_model(), plan, devices);
      };
      hooks.describe_refinement = [calibration] { return calibration->describe(); };
    }
    hooks.produce_plan = [batches, planner](std::int64_t i) {
      GlobalBatch batch = (*batches)[i % batches->size()];
      batch.index = i;  // data position i, cycling through the data
      return encode_plan(planner->plan_iteration(batch));
    };
  }
  const std::vector<StageLayers> layers = assign_layers_uniform(config.model, hooks.num_stages);
  ModelOptions model_options;
  model_options.dropout = options.dropout;
  model_options.seed = config.seed;
  const ModelSpec model = config.model;
  hooks.make_stage = [model, layers, model_options](int stage) {
    return make_stage_model(model, layers.at(stage), model_options);
  };
  auto source = make_dataset_token_source(dataset);
  const AttentionMode mode = attention_mode(config.strategy);
  const ModelKind kind = config.model.kind;
  hooks.collate = [source, mode, kind](const MicroBatch& mb) {
    return collate(mb, *source, kind, mode, /*loss_scale: set by the executor*/ 1.0);
  };
  return hooks;
}

}  // namespace dynapipe::runtime
