// Each planned micro-batch timed on this machine against the plan's estimate: reads plan
// files (`dynapipe plan --out`), builds the stages as `train` does, and runs every
// micro-batch of the first iterations through them -- all stages at once, one thread each,
// as pipelined ranks run -- forward and backward, the median of a few rounds. One line per
// micro-batch (rows, tokens, samples, estimated and measured F+B per stage), and per plan
// the measured ÷ estimated ratio of the sums: where two strategies' plans are priced alike
// but run unlike, this says which micro-batches differ.
//
//   build/dynapipe plan --model t5-tiny --pp 2 --strategy dynapipe --cost-model analytic:cpu
//       --samples assets/flan_like_mix.jsonl.gz --max-seqlen 2048 --global-batch-tokens 16384 --iterations 4 --out dyn.json
//   build/bench/microbatch_time_torch_bench assets/flan_like_mix.jsonl.gz 4 3 dyn.json pv.json
//
// Arguments: samples file, iterations (from the first), rounds per micro-batch (the median
// is kept; one warm-up round more), plan files. Within each iteration the plans take
// turns, so the machine's drift hits every plan alike.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/plan/execution_plan.h"
#include "dynapipe/plan/plan_json.h"
#include "runtime/exec/host_allocator.h"
#include "runtime/exec/trainer.h"
#include "runtime/model/collate.h"
#include "runtime/model/model.h"

namespace dynapipe::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// F+B of `mb` on every stage at once, `rounds` timed after one warm-up; per stage medians.
std::vector<double> time_microbatch(const PlanConfig& config, const std::vector<std::shared_ptr<StageModel>>& stages,
                                    const MicroBatch& mb, const TokenSource& source, Recompute mode, int rounds) {
  const std::size_t n = stages.size();
  const MicroBatchTensors batch = collate(mb, source, config.model.kind, trained_attention_mode(config.strategy, mb), 1e-4);
  std::barrier sync(static_cast<std::ptrdiff_t>(n));
  std::vector<std::vector<double>> ms(n);
  auto body = [&](std::size_t i) {
    at::set_num_threads(1);
    StageModel& stage = *stages[i];
    stage.set_recompute(mode);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7 + i);
    at::Tensor input;
    if (i > 0) {
      const std::vector<std::int64_t> shape = stage_output_shape(config.model, config.stage_layers[i - 1], mb.shape);
      input = at::randn(shape, gen).requires_grad_(true);
    }
    at::Tensor grad;
    for (int r = 0; r <= rounds; ++r) {
      sync.arrive_and_wait();
      const auto start = Clock::now();
      StageOutput out = stage.forward(input, batch);
      const bool last = out.loss.defined();
      at::Tensor y = last ? out.loss : out.hidden;
      if (!last && !grad.defined()) grad = at::randn(y.sizes(), gen);
      if (last) {
        torch::autograd::backward({y});
      } else {
        torch::autograd::backward({y}, {grad});
      }
      if (r > 0) ms[i].push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      if (input.defined()) input.mutable_grad().reset();
      stage.zero_grad();
    }
  };
  {
    std::vector<std::jthread> workers;
    for (std::size_t i = 0; i < n; ++i) workers.emplace_back(body, i);
  }
  std::vector<double> out;
  for (auto& v : ms) out.push_back(median(v));
  return out;
}

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
  TruncationLimits limits;
  limits.max_seqlen = plans[0].config.max_seqlen;
  const auto data = std::make_shared<const Dataset>(Dataset::load(argv[1], limits));
  const std::shared_ptr<const TokenSource> tokens = make_dataset_token_source(data);
  const TokenSource& source = *tokens;
  std::vector<std::vector<std::shared_ptr<StageModel>>> models;
  for (const ExecutionPlan& p : plans) {
    std::vector<std::shared_ptr<StageModel>> stages;
    for (const StageLayers& l : p.config.stage_layers) stages.push_back(make_stage_model(p.config.model, l, {}));
    models.push_back(std::move(stages));
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
        const std::vector<double> measured =
            time_microbatch(plans[p].config, models[p], mb, source, recompute_of(mb, replica.recompute), rounds);
        std::string est_text, measured_text;
        double est_max = 0, measured_max = 0;
        for (std::size_t s = 0; s < measured.size(); ++s) {
          const double e = est.fwd_ms[s] + est.bwd_ms[s];
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
