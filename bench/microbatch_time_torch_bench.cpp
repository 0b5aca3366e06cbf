// Each planned micro-batch timed on this machine against the plan's estimate: reads plan
// files (`dynapipe plan --out`), builds the stages as `train` does, and runs every
// micro-batch of the first iterations through them -- all stages at once, one thread each,
// as pipelined ranks run (the whole-stage profiler's StageRunner) -- forward and backward,
// medians of a few rounds. One line per
// micro-batch (rows, tokens, samples, estimated and measured F+B per stage), and per plan
// the measured ÷ estimated ratio of the sums: where two strategies' plans are priced alike
// but run unlike, this says which micro-batches differ.
//
//   build/dynapipe plan --model t5-tiny --pp 2 --strategy dynapipe --cost-model analytic:cpu
//       --samples assets/flan_like_mix.jsonl.gz --max-seqlen 2048 --global-batch-tokens 16384 --iterations 4 --out dyn.json
//   build/bench/microbatch_time_torch_bench assets/flan_like_mix.jsonl.gz 4 3 dyn.json pv.json
//
// Arguments: samples file, iterations (from the first), rounds per micro-batch (medians of
// forward and of backward are kept; one warm-up round more), plan files. Within each iteration the plans take
// turns, so the machine's drift hits every plan alike.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/plan/execution_plan.h"
#include "dynapipe/plan/plan_json.h"
#include "dynapipe/planner/planner.h"
#include "runtime/exec/host_allocator.h"
#include "runtime/exec/trainer.h"
#include "runtime/model/collate.h"
#include "runtime/profile/stage_runner.h"

namespace dynapipe::runtime {
namespace {

int run(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s SAMPLES ITERATIONS ROUNDS PLAN.json...\n", argv[0]);
    return 2;
  }
  keep_freed_host_memory(true);
  const std::int64_t iterations = std::stoll(argv[2]);
  const int rounds = std::stoi(argv[3]);
  std::vector<ExecutionPlan> plans;
  for (int a = 4; a < argc; ++a) {
    std::ifstream in(argv[a]);
    if (!in) throw Error(ErrorKind::NotFound, cat(argv[a], ": cannot open the plan file"));
    std::stringstream text;
    text << in.rdbuf();
    plans.push_back(plan_from_json(text.str(), argv[a]));
    if (plans.back().config.stage_layers.empty()) {
      plans.back().config.stage_layers = assign_layers_uniform(plans.back().config.model, plans.back().config.pp);
    }
  }
  // The samples truncated as the plans were (train's limits).
  const TruncationLimits limits = truncation_limits(plans[0].config);
  auto bounds = [](const TruncationLimits& l) {
    return std::tuple{l.kind, l.max_seqlen, l.effective_max_target_len()};
  };
  for (const ExecutionPlan& p : plans) {
    if (bounds(truncation_limits(p.config)) != bounds(limits)) {
      throw Error(ErrorKind::InvalidArgument,
                  "the plan files truncate samples differently (their model, --max-seqlen or --max-target-len)");
    }
  }
  const auto data = std::make_shared<const Dataset>(Dataset::load(argv[1], limits));
  const std::shared_ptr<const TokenSource> tokens = make_dataset_token_source(data);
  const TokenSource& source = *tokens;
  // Each plan's stages as train builds them, run together as the whole-stage profiler runs
  // them (one thread each, AdamW between rounds).
  std::vector<std::unique_ptr<profile::StageRunner>> runners;
  for (const ExecutionPlan& p : plans) {
    runners.push_back(std::make_unique<profile::StageRunner>(p.config.model, p.config.stage_layers, /*seed=*/0,
                                                             /*threads=*/1));
  }
  std::vector<double> est_sum(plans.size()), measured_sum(plans.size());
  std::printf("plan iter mb rows seqlen dec tokens samples density est_ms[stage] measured_ms[stage] ratio\n");
  for (std::int64_t it = 0; it < iterations; ++it) {
    for (std::size_t p = 0; p < plans.size(); ++p) {
      if (it >= static_cast<std::int64_t>(plans[p].iterations.size())) continue;
      const ReplicaPlan& replica = plans[p].iterations[it].replicas[0];
      for (std::size_t k = 0; k < replica.microbatches.size(); ++k) {
        const MicroBatch& mb = replica.microbatches[k];
        const MicroBatchEstimate& est = replica.estimates[k];
        const MicroBatchTensors batch = collate(mb, source, plans[p].config.model.kind,
                                                trained_attention_mode(plans[p].config.strategy, mb), 1e-4);
        const profile::StageRoundTimes t =
            runners[p]->run(batch, mb.shape, recompute_of(mb, replica.recompute), /*warmup=*/1, rounds);
        std::vector<double> measured;
        for (std::size_t s = 0; s < t.fwd_ms.size(); ++s) measured.push_back(t.fwd_ms[s] + t.bwd_ms[s]);
        std::string est_text, measured_text;
        double est_max = 0, measured_max = 0;
        // Per device: an interleaved plan estimates each of its virtual stages, which
        // run on device v % pp (PipelineLayout::device_of).
        std::vector<double> est_device(measured.size(), 0.0);
        for (std::size_t v = 0; v < est.fwd_ms.size(); ++v) {
          est_device[v % measured.size()] += est.fwd_ms[v] + est.bwd_ms[v];
        }
        for (std::size_t s = 0; s < measured.size(); ++s) {
          const double e = est_device[s];
          char buf[64];
          std::snprintf(buf, sizeof buf, "%s%.2f", s ? "/" : "", e);
          est_text += buf;
          std::snprintf(buf, sizeof buf, "%s%.2f", s ? "/" : "", measured[s]);
          measured_text += buf;
          est_sum[p] += e;
          measured_sum[p] += measured[s];
          est_max = std::max(est_max, e);
          measured_max = std::max(measured_max, measured[s]);
        }
        std::printf("%zu %lld %zu %lld %lld %lld %lld %zu %.2f/%.2f %s %s %.3f\n", p, static_cast<long long>(it), k,
                    static_cast<long long>(mb.shape.batch), static_cast<long long>(mb.shape.seqlen),
                    static_cast<long long>(mb.shape.dec_seqlen), static_cast<long long>(mb.real_tokens),
                    mb.sample_ids.size(), mb.density.enc, mb.density.dec, est_text.c_str(), measured_text.c_str(),
                    measured_max / est_max);
        std::fflush(stdout);
      }
    }
  }
  for (std::size_t p = 0; p < plans.size(); ++p) {
    std::printf("plan %zu (%s): est %.1f ms, measured %.1f ms, ratio %.3f\n", p, argv[4 + p], est_sum[p],
                measured_sum[p], measured_sum[p] / est_sum[p]);
  }
  return 0;
}

}  // namespace
}  // namespace dynapipe::runtime

int main(int argc, char** argv) {
  try {
    return dynapipe::runtime::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
