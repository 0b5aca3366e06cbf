// Synthetic multi-task mixtures: lengths-only samples drawn from per-task log-normal
// input and target length distributions, for planning and training without real data.
//
// No FLAN length statistics could be confirmed (shared research §8); the "flan-like"
// preset encodes *assumptions* shaped after its description: many short classification
// and QA tasks, some short generation tasks, a minority of summarisation and few-shot
// tasks with 1-4k inputs, and a thin tail up to 16k. docs/data.md lists every number.
//
// Thread-safety: pure functions; each call owns its Rng.
//
//   SynthOptions options{.num_samples = 20000, .seed = 0};
//   SynthSamples mix = generate_synthetic_samples(options);
//   write_synthetic_samples("assets/flan_like_mix.jsonl.gz", mix);
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dynapipe/core/sample.h"

namespace dynapipe {

// One task of a mixture. A length is round(exp(N(ln(median), sigma))) clamped to
// [min, max]; sigma 0 gives the median exactly.
struct SynthTask {
  std::string name;                  // task name written to the file; non-empty
  double weight = 1.0;               // relative share of samples; > 0
  double input_median = 100;         // tokens, = e^mu of the input log-normal; > 0
  double input_sigma = 0.5;          // sigma of ln(input_len); >= 0
  std::int64_t input_min = 1;        // clamp; >= 1
  std::int64_t input_max = 16384;    // clamp; >= input_min, < 2^31
  double target_median = 4;          // tokens, = e^mu of the target log-normal; > 0
  double target_sigma = 0.5;         // sigma of ln(target_len); >= 0
  std::int64_t target_min = 1;       // clamp; >= 1
  std::int64_t target_max = 8;       // clamp; >= target_min, < 2^31
};

struct SynthOptions {
  // Named preset (synth_mixture_names()). Default "flan-like". Ignored if `tasks` is set.
  std::string mixture = "flan-like";
  // Explicit task table; overrides `mixture` when non-empty.
  std::vector<SynthTask> tasks;
  // Number of samples; >= 1. Default 20000.
  std::int64_t num_samples = 20000;
  // Seed of the one Rng that draws the order and every length. Default 0.
  std::uint64_t seed = 0;

  // Throws Error(InvalidArgument) naming the field (NotFound for an unknown mixture).
  void validate() const;
};

// Untruncated lengths-only samples with ids 0..n-1 and the task table they index.
struct SynthSamples {
  std::vector<std::string> task_names;
  std::vector<Sample> samples;
};

// Names of the built-in presets.
std::vector<std::string> synth_mixture_names();

// The task table of a preset. Throws Error(NotFound) naming the known presets.
std::vector<SynthTask> synth_mixture(std::string_view name);

// Draws the samples: task counts are the weights' shares of num_samples (largest
// remainder), the task order is a uniform shuffle (tasks interleave), then each sample
// draws its input and then its target length. Same options, same samples.
SynthSamples generate_synthetic_samples(const SynthOptions& options);

// Writes lengths-only JSON Lines, `{"id":0,"task":"nli","input_len":97,"target_len":2}`,
// gzip-compressed when `path` ends in ".gz". Byte-for-byte deterministic. Throws
// Error(NotFound) if the path cannot be written; no half-written file is left behind.
void write_synthetic_samples(const std::string& path, const SynthSamples& samples);

}  // namespace dynapipe
