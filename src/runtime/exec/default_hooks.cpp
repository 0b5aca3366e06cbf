// The real system behind `dynapipe train`: data/ global batches, planner/ Planner, and
// runtime/model/ stage models + collate. This is the one file that binds the executor to
// modules that land separately; each hook below is the single place to wire its module.
#include "dynapipe/core/error.h"
#include "runtime/exec/plan_codec.h"
#include "runtime/exec/trainer.h"

namespace dynapipe::runtime {

namespace {

[[noreturn]] void pending(const char* what) {
  throw Error(ErrorKind::Unsupported, cat("dynapipe train: ", what, " is not wired into the runtime yet"));
}

}  // namespace

TrainHooks make_default_hooks(const TrainOptions& options, int rank) {
  TrainHooks hooks;
  // PlannerOptions{.fixed_layout = true} never picks the interleaved schedule, so every
  // iteration keeps one virtual stage per device.
  hooks.num_stages = options.plan.pp;

  if (rank == 0) {
    // TODO(#wire-planner): with data/ and planner/ linked into runtime:
    //   auto batches = std::make_shared<std::vector<GlobalBatch>>(form_global_batches(...));
    //   auto planner = std::make_shared<Planner>(options.plan, PlannerOptions{.fixed_layout = true});
    //   hooks.produce_plan = [=](std::int64_t i) {
    //     GlobalBatch batch = (*batches)[i % batches->size()];
    //     batch.index = i;                        // data position i, cycling through the data
    //     return encode_plan(planner->plan_iteration(batch));
    //   };
    hooks.produce_plan = [](std::int64_t) -> std::string { pending("planning (data/ + planner/)"); };
  }
  // TODO(#wire-model): with runtime/model/ merged (model.h, collate.h):
  //   auto layers = assign_layers_uniform(options.plan.model, hooks.num_stages);
  //   hooks.make_stage = [=](int s) {
  //     return make_stage_model(options.plan.model, layers[s],
  //                             ModelOptions{.dropout = options.dropout, .seed = options.plan.seed});
  //   };
  //   auto source = std::make_shared<SyntheticTokenSource>(all_samples, options.plan.model.vocab,
  //                                                        options.plan.seed);  // or the text file's
  //   auto mode = options.plan.strategy == "packing-varlen" ? AttentionMode::Varlen
  //             : options.plan.strategy == "packing"        ? AttentionMode::Packed
  //                                                         : AttentionMode::Padded;
  //   hooks.collate = [=](const MicroBatch& mb) {
  //     return collate(mb, *source, options.plan.model.kind, mode, /*loss_scale set by the executor*/ 1.0);
  //   };
  hooks.make_stage = [](int) -> std::shared_ptr<StageModel> { pending("the GPT/T5 stage models (runtime/model/)"); };
  hooks.collate = [](const MicroBatch&) -> MicroBatchTensors { pending("collate (runtime/model/)"); };
  return hooks;
}

}  // namespace dynapipe::runtime
