// `dynapipe data`: work on samples files without planning.
//
//   dynapipe data synth --out FILE [--samples N] [--seed N] [--mixture|--mix flan-like|flan-zsopt]
//   dynapipe data stats --samples FILE [--max-seqlen N] [--max-target-len N]
//                       [--model-kind gpt|t5] [--global-batch-tokens N]
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "dynapipe/core/model_kind.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/data/length_stats.h"
#include "dynapipe/data/synth.h"

namespace dynapipe::cli {

namespace {

struct SynthArgs {
  std::string out;
  std::int64_t num_samples = 20000;
  std::uint64_t seed = 0;
  std::string mixture = "flan-like";
};

struct StatsArgs {
  std::string samples;
  std::int64_t max_seqlen = 2048;
  std::int64_t max_target_len = 0;
  std::string model_kind = "gpt";
  std::int64_t global_batch_tokens = 0;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void run_synth(const SynthArgs& args) {
  const auto start = std::chrono::steady_clock::now();
  SynthOptions options;
  options.mixture = args.mixture;
  options.num_samples = args.num_samples;
  options.seed = args.seed;
  std::fprintf(stderr, "generating %lld samples (mixture %s, seed %llu)\n",
               static_cast<long long>(args.num_samples), args.mixture.c_str(),
               static_cast<unsigned long long>(args.seed));
  const SynthSamples samples = generate_synthetic_samples(options);
  write_synthetic_samples(args.out, samples);
  std::fprintf(stderr, "wrote %s in %.2f s\n", args.out.c_str(), seconds_since(start));
  std::fputs(format_length_stats(compute_length_stats(samples.samples, samples.task_names)).c_str(),
             stdout);
}

void run_stats(const StatsArgs& args) {
  const auto start = std::chrono::steady_clock::now();
  TruncationLimits limits;
  limits.kind = args.model_kind == "t5" ? ModelKind::T5 : ModelKind::Gpt;
  limits.max_seqlen = args.max_seqlen;
  limits.max_target_len = args.max_target_len;
  std::fprintf(stderr, "reading %s\n", args.samples.c_str());
  const Dataset data = Dataset::load(args.samples, limits);
  std::fprintf(stderr, "read %zu samples in %.2f s\n", data.samples().size(), seconds_since(start));

  std::int64_t tokens = 0;
  for (const Sample& s : data.samples()) tokens += s.input_len + s.target_len;
  std::printf("%s: %zu samples, %zu tasks, %lld tokens after truncation\n", args.samples.c_str(),
              data.samples().size(), data.task_names().size(), static_cast<long long>(tokens));
  std::printf("truncated: %lld samples (%s, max-seqlen %lld, max-target-len %lld)\n",
              static_cast<long long>(data.num_truncated()),
              std::string(model_kind_name(limits.kind)).c_str(),
              static_cast<long long>(limits.max_seqlen),
              static_cast<long long>(limits.effective_max_target_len()));
  if (args.global_batch_tokens > 0) {
    const auto batches = form_global_batches(data, args.global_batch_tokens);
    std::printf("global batches: %zu of at most %lld tokens\n", batches.size(),
                static_cast<long long>(args.global_batch_tokens));
  }
  std::printf("lengths after truncation:\n");
  std::fputs(format_length_stats(compute_length_stats(data.samples(), data.task_names())).c_str(),
             stdout);
}

void setup(CLI::App& app) {
  CLI::App* data = app.add_subcommand(
      "data", "Samples files: generate synthetic mixtures, print length statistics");
  data->require_subcommand(1);

  auto synth_args = std::make_shared<SynthArgs>();
  CLI::App* synth = data->add_subcommand(
      "synth", "Write a synthetic multi-task mixture as lengths-only JSONL (.gz compresses)");
  synth->add_option("--out", synth_args->out, "Output file (.jsonl or .jsonl.gz)")->required();
  synth->add_option("--samples", synth_args->num_samples, "Number of samples")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 31))
      ->capture_default_str();
  synth->add_option("--seed", synth_args->seed, "Seed of the lengths and the order")
      ->capture_default_str();
  synth->add_option("--mixture,--mix", synth_args->mixture, "Mixture preset (docs/data.md)")
      ->check(CLI::IsMember(synth_mixture_names()))
      ->capture_default_str();
  synth->callback([synth_args] { run_synth(*synth_args); });

  auto stats_args = std::make_shared<StatsArgs>();
  CLI::App* stats = data->add_subcommand(
      "stats", "Read a samples file and print per-task counts, length percentiles, truncation");
  stats->add_option("--samples", stats_args->samples, "Samples file (JSONL, optionally gzip)")
      ->required();
  stats->add_option("--max-seqlen", stats_args->max_seqlen,
                    "Truncation limit (GPT: input+target; T5: encoder)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24))
      ->capture_default_str();
  stats->add_option("--max-target-len", stats_args->max_target_len,
                    "Target truncation limit (default: --max-seqlen)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 24));
  stats->add_option("--model-kind", stats_args->model_kind, "Which truncation rules apply")
      ->check(CLI::IsMember({"gpt", "t5"}))
      ->capture_default_str();
  stats->add_option("--global-batch-tokens", stats_args->global_batch_tokens,
                    "Also count the global batches of this token budget")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  stats->callback([stats_args] { run_stats(*stats_args); });
}

const bool registered = register_command({"data", &setup});

}  // namespace

}  // namespace dynapipe::cli
