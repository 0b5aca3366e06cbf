// Profiler: `dynapipe profile` as a library call. Torch-free (the measurement lives in
// src/runtime/profile/). Measures this machine with the runtime's own stage models: for
// each layer kind of the model (embedding, layer | encoder, decoder, head), each shape of
// the grid and each recompute mode, the forward, backward and split backward times
// (medians after warm-up) and the stored and peak activation bytes, and returns them as
// a Profile (profile format v1, docs/profile-format.md, "How dynapipe profile measures").
//
//   ProfilerOptions options;
//   options.grid = {{1, 2, 4}, {64, 128}, {32, 64}};
//   Profile p = measure_profile(load_model_spec("gpt-tiny"), options);
//   write_file_atomically("gpt-tiny.json", profile_to_json(p));
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dynapipe/cost/model_spec.h"
#include "dynapipe/cost/profile.h"

namespace dynapipe::runtime {

// Reported after every measured or skipped shape.
struct ProfileProgress {
  int done = 0;          // shapes finished so far (measured or skipped)
  int total = 0;         // shapes in the whole run
  std::string what;      // e.g. "layer selective b=4 s=256"
};

struct ProfilerOptions {
  ProfileGrid grid{{1, 2, 4, 8}, {64, 128, 256}, {32, 64}};  // dec_seqlens: T5 only
  int warmup = 2;        // untimed runs per shape. >= 0
  int repeats = 5;       // timed runs per shape; the median is kept. >= 1
  int threads = 1;       // torch::set_num_threads (training's threads-per-rank default). >= 1
  // A shape whose stored + peak bytes (measured, or extrapolated from the row's previous
  // two batches) exceed this is skipped with every larger batch of its row. 0: the device's.
  std::int64_t memory_limit_bytes = 0;
  bool split_backward = true;   // also time backward_input + flush (bwd_input/bwd_weight_ms)
  std::uint64_t seed = 0;       // parameters and token ids
  std::function<void(const ProfileProgress&)> progress;  // optional

  // Throws InvalidArgument naming the flag, e.g. "--seqlens must hold at least two
  // distinct lengths, got 64".
  void validate(const ModelSpec& spec) const;
};

// Throws InvalidArgument for bad options or a model whose kinds cannot be measured
// separately (T5 with one decoder layer), and when the memory limit leaves a table
// with too few shapes to be a valid profile.
Profile measure_profile(const ModelSpec& spec, const ProfilerOptions& options);

// `dynapipe profile --stages`: times what training runs instead of one layer in a loop.
// The stages of a pp-stage layout, built as the trainer builds them, run together (one
// thread per stage, started in step as pipelined ranks are busy at once), each shape
// collated by the executor's collate() into varlen micro-batches and run forward +
// backward, with an AdamW step after each round. The per-layer tables are the analytic
// `cpu` model's (build_profile), with every point's times scaled by the measured / estimated
// ratio of the whole pipeline at that shape, so a plan's stage sums are the measured stage
// times at the measured shapes (docs/profile-format.md, "Whole-stage profiles").
struct StageProfilerOptions {
  int pp = 1;                        // stages run together, as train --pp. >= 1, <= layers
  std::vector<std::int64_t> seqlens{64, 128, 256, 512, 1024, 2048};  // GPT; T5: encoder
  std::vector<std::int64_t> dec_seqlens{8, 16, 32, 64, 128, 256, 512, 1024, 2048};  // T5 only
  // Tokens per measured micro-batch at most (b * (seqlen + dec_seqlen)); each length is
  // measured at 1, 4, 16, ... rows and the most rows that fit (at least one). >= 1
  std::int64_t max_tokens = 4096;
  std::vector<Recompute> modes{Recompute::None};  // measured; the others scale as None
  int warmup = 1;
  int repeats = 2;
  int threads = 1;  // LibTorch intra-op threads per stage (train's --threads-per-rank)
  std::uint64_t seed = 0;
  std::function<void(const ProfileProgress&)> progress;  // optional

  // Throws InvalidArgument naming the flag.
  void validate(const ModelSpec& spec) const;
};

// One measured shape: per stage, medians of forward (collate included) and backward ms,
// and the analytic estimate the profile's tables were scaled from.
struct StageMeasurement {
  Recompute mode = Recompute::None;
  std::int64_t batch = 0, seqlen = 0, dec_seqlen = 0;
  std::vector<double> fwd_ms, bwd_ms;          // measured, one per stage
  std::vector<double> est_fwd_ms, est_bwd_ms;  // analytic cpu, one per stage
  double optimizer_ms = 0;                     // the slowest stage's AdamW step + zero_grad
};

struct StageProfile {
  Profile profile;
  std::vector<StageMeasurement> measurements;
};

StageProfile measure_stage_profile(const ModelSpec& spec, const StageProfilerOptions& options);

}  // namespace dynapipe::runtime
