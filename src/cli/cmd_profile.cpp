// `dynapipe profile`: measures this machine with the runtime's own layers and writes a
// profile (docs/profile-format.md) that `--cost-model PROFILE.json` plans with. The
// runtime does the work (dynapipe/runtime/profiler.h); this file maps flags and draws
// the progress bar.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/output_file.h"
#include "cli/torch_commands.h"
#include "cli/transformer_graph.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/cost/profile.h"
#include "dynapipe/runtime/profiler.h"

namespace dynapipe::cli {

namespace {

struct ProfileArgs {
  std::string model = "gpt-tiny";
  std::string out;
  std::string graph_txt;  // also write the layers as a PipeDream graph.txt
  double memory_limit_gib = 0;
  std::int64_t max_seqlen = 2048;     // train's default --max-seqlen
  std::int64_t max_target_len = 0;   // 0: max_seqlen
  bool no_progress = false;
  bool no_split_backward = false;
  runtime::ProfilerOptions options;
  bool stages = false;  // whole-stage mode (measure_stage_profile)
  runtime::StageProfilerOptions stage;
  std::vector<std::string> stage_recompute{"none"};
};

// A bar redrawn in place on a terminal; elsewhere (logs, CI) a line per tenth.
std::function<void(const runtime::ProfileProgress&)> progress_printer() {
  const bool tty = isatty(fileno(stderr)) != 0;
  auto last_tenth = std::make_shared<int>(-1);
  return [tty, last_tenth](const runtime::ProfileProgress& p) {
    if (tty) {
      constexpr int kWidth = 30;
      const int filled = p.total > 0 ? p.done * kWidth / p.total : kWidth;
      std::fprintf(stderr, "\r[%s%s] %d/%d %-48s", std::string(filled, '#').c_str(),
                   std::string(kWidth - filled, ' ').c_str(), p.done, p.total, p.what.c_str());
      if (p.done == p.total) std::fputc('\n', stderr);
    } else {
      const int tenth = p.total > 0 ? p.done * 10 / p.total : 10;
      if (tenth == *last_tenth) return;
      *last_tenth = tenth;
      std::fprintf(stderr, "profile: %d/%d shapes (%s)\n", p.done, p.total, p.what.c_str());
    }
    std::fflush(stderr);
  };
}

void setup_profile(CLI::App& app) {
  auto args = std::make_shared<ProfileArgs>();
  auto& o = args->options;
  auto* cmd =
      app.add_subcommand(std::string(kProfileCommand.name), std::string(kProfileCommand.description));
  cmd->add_option("--model", args->model, "Model preset or JSON file")->capture_default_str();
  cmd->add_option("--out", args->out, "The profile to write")->required();
  cmd->add_option("--graph-txt", args->graph_txt,
                  "Also write the per-layer profile in PipeDream's graph.txt format (largest grid shape), "
                  "for dynapipe partition");
  cmd->add_option("--max-seqlen", args->max_seqlen,
                  "Longest sequence (T5: encoder) train will use: the default --seqlens double from 64 up to it")
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--max-target-len", args->max_target_len,
                  "T5: longest decoder sequence train will use (default: --max-seqlen): the default --dec-seqlens "
                  "double from 8 up to it")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));
  cmd->add_option("--batch-sizes", o.grid.batches, "Micro-batch sizes, comma-separated")
      ->delimiter(',')->capture_default_str();
  auto* seqlens = cmd->add_option("--seqlens", o.grid.seqlens,
                                  "Sequence lengths (T5: encoder), comma-separated (default: 64, 128, ... --max-seqlen)")
                      ->delimiter(',');
  auto* dec_seqlens = cmd->add_option("--dec-seqlens", o.grid.dec_seqlens,
                                      "T5 decoder lengths, comma-separated (default: 8, 16, ... --max-target-len)")
                          ->delimiter(',');
  cmd->add_option("--warmup", o.warmup, "Untimed runs per shape")->capture_default_str();
  cmd->add_option("--repeats", o.repeats, "Timed runs per shape (the median is kept)")
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "LibTorch intra-op threads (as --threads-per-rank)")
      ->capture_default_str();
  cmd->add_option("--memory-limit", args->memory_limit_gib,
                  "GiB; skip shapes whose stored + peak bytes exceed it (default: the cpu preset's)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--seed", o.seed, "Seed of parameters and token ids")->capture_default_str();
  cmd->add_flag("--no-split-backward", args->no_split_backward,
                "Do not time backward_input/flush (bwd_input_ms, bwd_weight_ms are left out)");
  cmd->add_flag("--no-progress", args->no_progress, "No progress output on stderr");
  cmd->add_flag("--stages", args->stages,
                "Time whole stages as train runs them (collate, varlen forward + backward, AdamW; "
                "at --pp > 1 the stages together) and scale the analytic cpu tables to them");
  cmd->add_option("--pp", args->stage.pp, "--stages: pipeline stages run together (as train --pp)")
      ->capture_default_str();
  cmd->add_option("--max-tokens", args->stage.max_tokens,
                  "--stages: tokens per measured micro-batch at most (rows 1, 4, 16, ... and the most "
                  "that fit)")
      ->capture_default_str();
  cmd->add_option("--stage-recompute", args->stage_recompute,
                  "--stages: recompute modes measured, comma-separated (others scale as none)")
      ->delimiter(',')->capture_default_str();
  auto* warmup = cmd->get_option("--warmup");
  auto* repeats = cmd->get_option("--repeats");
  cmd->callback([args, seqlens, dec_seqlens, warmup, repeats] {
    auto& options = args->options;
    // The grid covers every length train will ask about, so plans interpolate instead of
    // extrapolating the quadratic attention linearly.
    auto lengths_up_to = [](std::int64_t first, std::int64_t last) {
      return doubling_lengths(std::min(first, last / 2), last);
    };
    if (seqlens->count() == 0) options.grid.seqlens = lengths_up_to(64, args->max_seqlen);
    const std::int64_t max_target_len = args->max_target_len > 0 ? args->max_target_len : args->max_seqlen;
    // T5 decoder lengths from 8 (a --seqlen-multiple): multi-task targets are mostly short
    // (the bundled data's: median 3 tokens, 86% under 32), and below the grid a table extrapolates
    // linearly, dropping the per-row cost a short decoder row still pays (t5-tiny pp 2 on a
    // whole-stage profile from 32: varlen micro-batches of many samples ran 1.3-1.65x
    // their decoder stage's estimate; docs/RESULTS.md, "Short targets in the profile grid").
    if (dec_seqlens->count() == 0) options.grid.dec_seqlens = lengths_up_to(8, std::max<std::int64_t>(2, max_target_len));
    const ModelSpec spec = load_model_spec(args->model);
    options.memory_limit_bytes = gib_to_bytes(args->memory_limit_gib);
    options.split_backward = !args->no_split_backward;
    if (!args->no_progress) options.progress = progress_printer();
    const auto start = std::chrono::steady_clock::now();
    Profile profile;
    if (args->stages) {
      runtime::StageProfilerOptions& stage = args->stage;
      stage.seqlens = options.grid.seqlens;
      stage.dec_seqlens = options.grid.dec_seqlens;
      // A whole stage costs several layers: fewer rounds than the per-layer default.
      if (warmup->count() > 0) stage.warmup = options.warmup;
      if (repeats->count() > 0) stage.repeats = options.repeats;
      stage.threads = options.threads;
      stage.seed = options.seed;
      stage.progress = options.progress;
      stage.modes.clear();
      for (const std::string& name : args->stage_recompute) {
        const auto mode = parse_recompute(name);
        if (!mode) {
          throw Error(ErrorKind::InvalidArgument,
                      cat("--stage-recompute values must be none, selective or full, got '", name,
                          "'"));
        }
        stage.modes.push_back(*mode);
      }
      profile = runtime::measure_stage_profile(spec, stage).profile;
    } else {
      profile = runtime::measure_profile(spec, options);
    }
    std::string graph_text;  // made first, so a failure writes neither file
    if (!args->graph_txt.empty()) {
      CostModelOptions per_layer;
      per_layer.num_stages = spec.total_layers();
      const auto cost = make_profiled_cost_model(profile, per_layer, args->out);
      auto largest = [](const std::vector<std::int64_t>& values) {
        return values.empty() ? std::int64_t{0} : *std::max_element(values.begin(), values.end());
      };
      const MicroBatchShape shape{.batch = largest(options.grid.batches),
                                  .seqlen = largest(options.grid.seqlens),
                                  .dec_seqlen = spec.kind == ModelKind::T5 ? largest(options.grid.dec_seqlens) : 0};
      graph_text = format_graph_txt(transformer_graph(*cost, shape));
    }
    write_file_atomically(args->out, profile_to_json(profile));
    if (!args->graph_txt.empty()) write_file_atomically(args->graph_txt, graph_text);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::size_t points = 0;
    for (const auto& layer : profile.layers) {
      for (const auto& table : layer.points) points += table.size();
    }
    std::printf("profiled %s: %zu points in %.1f s -> %s\n", spec.name.c_str(), points, seconds,
                args->out.c_str());
  });
}

const bool registered = register_command({"profile", &setup_profile});

}  // namespace

}  // namespace dynapipe::cli
