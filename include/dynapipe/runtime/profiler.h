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

}  // namespace dynapipe::runtime
