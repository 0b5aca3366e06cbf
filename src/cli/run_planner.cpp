#include "cli/run_planner.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <string>

#include "dynapipe/batching/megatron_packing.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/data/truncation.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/planner/planner.h"

namespace dynapipe::cli {

MegatronRows megatron_rows(const PlanConfig& config) {
  return {.kind = config.model.kind,
          .max_seqlen = config.max_seqlen,
          .max_target_len = config.max_target_len > 0 ? config.max_target_len : config.max_seqlen};
}

std::vector<GlobalBatch> load_global_batches(const PlanConfig& config) {
  const TruncationLimits options = truncation_limits(config);
  const Dataset dataset = Dataset::load(config.samples_path, options);
  // packing-megatron's global batch is a number of padded rows (its token budget counts
  // padding); every other strategy shares the token-budget batches.
  std::vector<GlobalBatch> batches =
      config.strategy == Strategy::PackingMegatron
          ? form_megatron_global_batches(dataset.samples(), dataset.truncated_ids(), megatron_rows(config),
                                         config.global_batch_tokens, config.iterations)
          : form_global_batches(dataset.samples(), dataset.truncated_ids(), config.global_batch_tokens,
                                config.iterations);
  std::fprintf(stderr, "%s: %zu samples (%lld truncated), %zu global batches\n",
               config.samples_path.c_str(), dataset.samples().size(),
               static_cast<long long>(dataset.truncated_ids().size()), batches.size());
  return batches;
}

PlannedRun plan_batches(const PlanConfig& config, const std::vector<GlobalBatch>& batches,
                        const char* label) {
  const Planner planner(config);
  // Once per process: plan and simulate plan several strategies with one cost model.
  static std::set<std::string> warned;
  if (const std::string warning = planner.extrapolation_warning(); !warning.empty() && warned.insert(warning).second)
    std::fprintf(stderr, "%s\n", warning.c_str());
  PlannedRun run;
  run.iterations.reserve(batches.size());
  const bool interactive = isatty(fileno(stderr));
  auto last_report = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < batches.size(); ++i) {
    run.iterations.push_back(planner.plan_iteration(batches[i]));
    const auto now = std::chrono::steady_clock::now();
    if (interactive && now - last_report > std::chrono::milliseconds(200)) {
      std::fprintf(stderr, "\r%s: planned %zu/%zu iterations", label, i + 1, batches.size());
      last_report = now;
    }
  }
  if (interactive) std::fprintf(stderr, "\r\033[K");
  run.summary = summarize(run.iterations);
  return run;
}

}  // namespace dynapipe::cli
