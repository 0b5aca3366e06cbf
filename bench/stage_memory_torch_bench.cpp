// What one micro-batch really holds on one stage, against the analytic cost model's
// memory terms for the CPU (analytic:cpu). Prints one line per run:
//   stored  = resident bytes added by the forward (what autograd keeps until backward,
//             plus the stage's output)
//   peak    = the most resident bytes above the start during forward, then backward
// next to the model's stored_bytes and stored + peak_bytes. Large tensors are forced onto
// mmap (mallopt) so that resident memory follows live tensors; one run per process.
//
//   build/bench/stage_memory_torch_bench gpt-tiny 2 0 8 1024 [dec_seqlen]
//       (model, pipeline stages, stage, rows, seqlen; T5: decoder length)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <malloc.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "dynapipe/cost/cost_model.h"
#include "runtime/model/collate.h"
#include "runtime/model/model.h"
#include "runtime/process_memory.h"

namespace {

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  using namespace dynapipe;
  using namespace dynapipe::runtime;
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s MODEL PP STAGE ROWS SEQLEN [DEC_SEQLEN]\n", argv[0]);
    return 2;
  }
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  mallopt(M_TRIM_THRESHOLD, 64 * 1024);
  at::set_num_threads(1);
  const ModelSpec spec = load_model_spec(argv[1]);
  const int pp = std::stoi(argv[2]), stage = std::stoi(argv[3]);
  const std::int64_t rows = std::stoll(argv[4]), seqlen = std::stoll(argv[5]);
  const std::int64_t dec = argc > 6 ? std::stoll(argv[6]) : 0;
  const bool t5 = spec.kind == ModelKind::T5;

  const StageLayers layers = assign_layers_uniform(spec, pp).at(stage);
  auto model = make_stage_model(spec, layers, ModelOptions{.seed = 1});
  std::vector<Sample> samples;
  MicroBatch mb;
  for (std::int64_t r = 0; r < rows; ++r) {
    Sample s;
    s.id = static_cast<SampleId>(r);
    s.input_len = static_cast<std::int32_t>(t5 ? seqlen : seqlen / 2);
    s.target_len = static_cast<std::int32_t>(t5 ? dec : seqlen - seqlen / 2);
    samples.push_back(s);
    mb.sample_ids.push_back(s.id);
    mb.target_tokens += s.target_len;
  }
  mb.shape = {rows, seqlen, t5 ? dec : 0};
  SyntheticTokenSource tokens(samples, static_cast<int>(spec.vocab), 1);
  const MicroBatchTensors batch = collate(mb, tokens, spec.kind, AttentionMode::Padded, 1.0 / mb.target_tokens);
  const std::vector<std::int64_t> in_shape =
      stage == 0 ? std::vector<std::int64_t>{} : stage_output_shape(spec, assign_layers_uniform(spec, pp).at(stage - 1), mb.shape);

  auto step = [&](bool measure) {
    at::Tensor input;
    if (!in_shape.empty()) input = at::randn(in_shape).requires_grad_(true);
    const std::int64_t start = status_bytes("VmRSS:");
    reset_peak_rss();
    StageOutput out = model->forward(input, batch);
    const std::int64_t after_f = status_bytes("VmRSS:"), peak_f = status_bytes("VmHWM:");
    if (out.loss.defined()) {
      torch::autograd::backward({out.loss});
    } else {
      torch::autograd::backward({out.hidden}, {at::ones_like(out.hidden)});
    }
    const std::int64_t peak_b = status_bytes("VmHWM:");
    if (!measure) return;
    CostModelOptions options;
    options.num_stages = pp;
    auto cost = make_cost_model("analytic:cpu", spec, options);
    const StageCost c = cost->stage_cost(stage, mb.shape, {}, Recompute::None);
    std::printf("%s pp %d stage %d shape %lldx%lld+%lld | measured stored %.1f peak %.1f MiB | "
                "model stored %.1f stored+peak %.1f MiB\n",
                spec.name.c_str(), pp, stage, static_cast<long long>(rows), static_cast<long long>(seqlen),
                static_cast<long long>(dec), mib(static_cast<double>(after_f - start)),
                mib(static_cast<double>(std::max(peak_f, peak_b) - start)), mib(static_cast<double>(c.stored_bytes)),
                mib(static_cast<double>(c.stored_bytes + c.peak_bytes)));
  };
  step(false);  // gradients, lazily built state
  step(true);
  return 0;
}
