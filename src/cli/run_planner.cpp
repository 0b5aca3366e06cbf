#include "cli/run_planner.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "dynapipe/batching/megatron_packing.h"
#include "dynapipe/core/parallel.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/data/truncation.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/planner/plan_many.h"
#include "dynapipe/planner/planner.h"

namespace dynapipe::cli {
namespace {

// A progress line on an interactive stderr: "\r" + format(done), at most every 200 ms, cleared
// when it goes out of scope. advance() may be called from any thread.
class ProgressLine {
 public:
  ProgressLine(bool wanted, std::function<std::string(std::size_t done)> format)
      : enabled_(wanted && isatty(fileno(stderr))), format_(std::move(format)) {}
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  ~ProgressLine() {
    if (enabled_) std::fprintf(stderr, "\r\033[K");
  }

  bool enabled() const { return enabled_; }
  void advance() { update(1); }
  // Shows the line again without advancing it (its format may read other counters).
  void refresh() { update(0); }

 private:
  void update(std::size_t step) {
    if (!enabled_) return;
    const std::lock_guard lock(mutex_);
    done_ += step;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_report_ > std::chrono::milliseconds(200)) {
      std::fprintf(stderr, "\r%s", format_(done_).c_str());
      last_report_ = now;
    }
  }

  bool enabled_;
  std::function<std::string(std::size_t)> format_;
  std::mutex mutex_;
  std::size_t done_ = 0;
  std::chrono::steady_clock::time_point last_report_ = std::chrono::steady_clock::now();
};

}  // namespace

MegatronRows megatron_rows(const PlanConfig& config) {
  return {.kind = config.model.kind,
          .max_seqlen = config.max_seqlen,
          .max_target_len = config.max_target_len > 0 ? config.max_target_len : config.max_seqlen};
}

std::vector<GlobalBatch> load_global_batches(const PlanConfig& config, SamplesCache& samples) {
  const std::shared_ptr<const Dataset> loaded = samples.load(config.samples_path, truncation_limits(config));
  const Dataset& dataset = *loaded;
  // packing-megatron's global batch is a number of padded rows (its token budget counts
  // padding); every other strategy shares the token-budget batches.
  std::vector<GlobalBatch> batches =
      config.strategy == Strategy::PackingMegatron
          ? form_megatron_global_batches(dataset.samples(), dataset.truncated_ids(), megatron_rows(config),
                                         config.global_batch_tokens, config.iterations)
          : form_global_batches(dataset.samples(), dataset.truncated_ids(), config.global_batch_tokens,
                                config.iterations);
  std::fprintf(stderr, "%s: %zu samples (%lld truncated), %zu global batches%s\n",
               config.samples_path.c_str(), dataset.samples().size(),
               static_cast<long long>(dataset.truncated_ids().size()), batches.size(),
               config.strategy == Strategy::PackingMegatron ? " of packing-megatron's padded rows" : "");
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

  std::vector<PlannedIterations> planned;
  {
    ProgressLine line(true, [&](std::size_t done) {
      return cat(label, ": planned ", done, "/", iterations, " iterations");
    });
    PlanProgress progress;
    if (line.enabled()) progress = [&](std::size_t, std::size_t) { line.advance(); };
    planned = plan_many(requests, threads, progress);
  }
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

std::string layers_per_stage_text(const PlanConfig& config) {
  return join(layers_per_stage(config.stage_layers.empty() ? assign_layers_uniform(config.model, config.pp)
                                                           : config.stage_layers),
              ",");
}

PlanConfig to_plan_config_with_progress(const PlanOptions& options, int threads, SamplesCache& samples) {
  std::atomic<std::size_t> splits{0};
  ProgressLine line(true, [&](std::size_t) { return cat("choosing the layer split: ", splits.load(), " splits planned"); });
  return to_plan_config(options, threads, &samples, [&] {
    ++splits;
    line.refresh();
  });
}

std::vector<std::exception_ptr> choose_layer_splits(const PlanOptions& options, const PlanConfig& base,
                                                    std::vector<PlanConfig>& configs, int threads,
                                                    SamplesCache& samples) {
  const std::vector<GlobalBatch> batches = partition_batches(options, base, &samples);
  // Splits read no batches where they are instant (uniform): no line then.
  std::atomic<std::size_t> splits{0};
  ProgressLine line(!batches.empty(), [&](std::size_t done) {
    return cat("choosing layer splits: ", done, "/", configs.size(), " (", splits.load(), " splits planned)");
  });
  return run_indexed(configs.size(), threads, [&](std::size_t i) {
    configs[i].stage_layers = stage_layers_for(options, configs[i], batches, 1, [&] {
      ++splits;
      line.refresh();
    });
    line.advance();
  });
}

}  // namespace dynapipe::cli
