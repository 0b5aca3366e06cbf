#include "cli/run_planner.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "dynapipe/batching/megatron_packing.h"
#include "dynapipe/core/parallel.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/data/truncation.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/planner/plan_many.h"
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

std::vector<PlanJobResult> plan_jobs(const std::vector<PlanJob>& jobs, int threads,
                                     const char* label) {
  std::vector<PlanJobResult> results(jobs.size());
  // The planners first, in order: their errors and warnings come as a run in order gives them.
  std::vector<std::unique_ptr<const Planner>> planners(jobs.size());
  // Once per process: plan and simulate plan several strategies with one cost model.
  static std::set<std::string> warned;
  std::vector<PlanRequest> requests;
  std::vector<std::size_t> job_of;  // per request
  std::size_t iterations = 0;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    try {
      planners[j] = std::make_unique<const Planner>(jobs[j].config);
    } catch (...) {
      results[j].error = std::current_exception();
      continue;
    }
    const std::string warning = planners[j]->extrapolation_warning();
    if (!warning.empty() && warned.insert(warning).second) {
      std::fprintf(stderr, "%s\n", warning.c_str());
    }
    requests.push_back({planners[j].get(), *jobs[j].batches});
    job_of.push_back(j);
    iterations += jobs[j].batches->size();
  }

  const bool interactive = isatty(fileno(stderr));
  std::size_t done = 0;
  auto last_report = std::chrono::steady_clock::now();
  PlanProgress progress;
  if (interactive) {
    progress = [&](std::size_t, std::size_t) {
      ++done;
      const auto now = std::chrono::steady_clock::now();
      if (now - last_report > std::chrono::milliseconds(200)) {
        std::fprintf(stderr, "\r%s: planned %zu/%zu iterations", label, done, iterations);
        last_report = now;
      }
    };
  }
  std::vector<PlannedIterations> planned = plan_many(requests, threads, progress);
  if (interactive) std::fprintf(stderr, "\r\033[K");
  for (std::size_t r = 0; r < requests.size(); ++r) {
    PlanJobResult& result = results[job_of[r]];
    result.error = planned[r].error;
    if (result.error) continue;
    result.run.iterations = std::move(planned[r].iterations);
    result.run.summary = summarize(result.run.iterations);
  }
  return results;
}

PlannedRun plan_batches(const PlanConfig& config, const std::vector<GlobalBatch>& batches,
                        const char* label, int threads) {
  std::vector<PlanJobResult> results = plan_jobs({{config, &batches}}, threads, label);
  if (results.front().error) std::rethrow_exception(results.front().error);
  return std::move(results.front().run);
}

std::vector<std::exception_ptr> choose_layer_splits(
    const PlanOptions& options, const PlanConfig& base, std::vector<PlanConfig>& configs,
    int threads, const std::function<bool(const PlanConfig&)>& wanted) {
  const std::vector<GlobalBatch> batches = partition_batches(options, base);
  const bool interactive = isatty(fileno(stderr)) && !batches.empty();
  std::mutex progress_mutex;
  std::size_t done = 0;
  auto last_report = std::chrono::steady_clock::now();
  const std::vector<std::exception_ptr> errors = run_indexed(configs.size(), threads, [&](std::size_t i) {
    if (!wanted || wanted(configs[i])) configs[i].stage_layers = stage_layers_for(options, configs[i], batches);
    if (!interactive) return;
    const std::lock_guard lock(progress_mutex);
    ++done;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_report > std::chrono::milliseconds(200)) {
      std::fprintf(stderr, "\rchoosing layer splits: %zu/%zu", done, configs.size());
      last_report = now;
    }
  });
  if (interactive) std::fprintf(stderr, "\r\033[K");
  return errors;
}

}  // namespace dynapipe::cli
