#include "dynapipe/data/synth.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "data/gz_io.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/rng.h"

namespace dynapipe {

namespace {

constexpr std::int64_t kMaxLength = std::numeric_limits<std::int32_t>::max();

// Assumptions, not FLAN statistics (docs/data.md explains each group). Medians in tokens.
// name, weight, input median/sigma/min/max, target median/sigma/min/max
const std::vector<SynthTask>& flan_like_tasks() {
  static const std::vector<SynthTask> tasks = {
      // Classification and QA: inputs of a paragraph, answers of a few tokens.
      {"nli", 0.10, 120, 0.45, 16, 2048, 2.0, 0.35, 1, 8},
      {"sentiment", 0.08, 90, 0.60, 8, 2048, 1.5, 0.30, 1, 4},
      {"paraphrase", 0.06, 100, 0.40, 16, 1024, 1.5, 0.30, 1, 4},
      {"topic_classification", 0.06, 200, 0.50, 16, 4096, 2.5, 0.40, 1, 8},
      {"boolean_qa", 0.06, 250, 0.50, 32, 4096, 1.2, 0.20, 1, 2},
      {"extractive_qa", 0.08, 300, 0.55, 32, 8192, 4.0, 0.60, 1, 8},
      {"closed_book_qa", 0.06, 60, 0.50, 8, 1024, 3.0, 0.60, 1, 8},
      {"multiple_choice", 0.06, 160, 0.50, 16, 4096, 2.0, 0.50, 1, 8},
      {"commonsense", 0.05, 70, 0.45, 8, 1024, 2.0, 0.50, 1, 8},
      {"coreference", 0.04, 65, 0.40, 8, 1024, 2.0, 0.50, 1, 8},
      // Short generation: a sentence or two out.
      {"dialogue_response", 0.05, 220, 0.60, 16, 4096, 25, 0.50, 10, 60},
      {"data_to_text", 0.04, 90, 0.45, 16, 1024, 30, 0.40, 10, 60},
      {"question_generation", 0.03, 250, 0.50, 32, 4096, 15, 0.35, 10, 60},
      {"translation", 0.04, 45, 0.50, 8, 512, 40, 0.50, 10, 60},
      // Summarisation: long documents in, a paragraph out.
      {"news_summarization", 0.05, 1200, 0.45, 256, 16384, 90, 0.45, 50, 300},
      {"long_summarization", 0.03, 2800, 0.45, 512, 16384, 180, 0.45, 50, 300},
      // Few-shot: exemplars make inputs long, answers stay short.
      {"fewshot_classification", 0.05, 1400, 0.40, 512, 16384, 2.0, 0.40, 1, 8},
      {"fewshot_qa", 0.04, 2000, 0.45, 512, 16384, 4.0, 0.60, 1, 16},
      // The long tail.
      {"long_document_qa", 0.02, 6000, 0.55, 2048, 16384, 6.0, 0.60, 1, 32},
  };
  return tasks;
}

// Zero-shot FLAN ("flan_zsopt", the DynaPipe experiments' data): instructions without
// exemplars, so inputs are mostly a few hundred tokens; the export cut inputs and targets
// at 4096. Shaped after its task families (T0-SF, Flan 2021, NIv2, CoT, dialog);
// assumptions, not measured statistics (docs/data.md).
const std::vector<SynthTask>& flan_zsopt_tasks() {
  static const std::vector<SynthTask> tasks = {
      // Classification and QA with answer options: a paragraph in, a word or two out.
      {"nli", 0.12, 90, 0.45, 16, 1024, 2.0, 0.35, 1, 8},
      {"sentiment", 0.08, 110, 0.60, 8, 2048, 1.5, 0.30, 1, 4},
      {"paraphrase", 0.06, 80, 0.40, 16, 512, 1.5, 0.30, 1, 4},
      {"topic_classification", 0.06, 150, 0.50, 16, 2048, 2.5, 0.40, 1, 8},
      {"reading_comprehension_qa", 0.10, 260, 0.55, 32, 4096, 4.0, 0.70, 1, 32},
      {"closed_book_qa", 0.07, 40, 0.50, 8, 512, 4.0, 0.70, 1, 32},
      {"multiple_choice", 0.08, 130, 0.50, 16, 2048, 3.0, 0.60, 1, 16},
      {"commonsense", 0.07, 60, 0.45, 8, 512, 3.0, 0.60, 1, 16},
      // Natural Instructions: a task definition before every input; mixed outputs.
      {"natural_instructions", 0.10, 350, 0.70, 32, 4096, 8.0, 1.00, 1, 256},
      // Short generation.
      {"struct_to_text", 0.04, 80, 0.45, 16, 1024, 25, 0.45, 8, 128},
      {"translation", 0.05, 50, 0.50, 8, 512, 45, 0.50, 8, 256},
      {"dialog_response", 0.06, 300, 0.70, 16, 4096, 20, 0.60, 4, 128},
      {"chain_of_thought", 0.04, 120, 0.50, 16, 1024, 60, 0.50, 16, 256},
      // Summarisation: the long inputs of the mix.
      {"news_summarization", 0.04, 700, 0.50, 128, 4096, 60, 0.45, 16, 256},
      {"long_summarization", 0.03, 1800, 0.50, 512, 4096, 200, 0.45, 32, 512},
  };
  return tasks;
}

struct Preset {
  const char* name;
  const std::vector<SynthTask>& (*tasks)();
};
constexpr Preset kPresets[] = {{"flan-like", &flan_like_tasks}, {"flan-zsopt", &flan_zsopt_tasks}};

void validate_task(const SynthTask& t, std::size_t i) {
  const std::string where = cat("synth task ", i, " (\"", t.name, "\"): ");
  auto fail = [&](const char* field, const char* expected, auto actual) {
    throw Error(ErrorKind::InvalidArgument, cat(where, field, " must be ", expected, ", got ", actual));
  };
  if (t.name.empty()) fail("name", "non-empty", "\"\"");
  if (!(t.weight > 0) || !std::isfinite(t.weight)) fail("weight", "> 0", t.weight);
  if (!(t.input_median > 0) || !std::isfinite(t.input_median)) fail("input_median", "> 0", t.input_median);
  if (!(t.input_sigma >= 0) || !std::isfinite(t.input_sigma)) fail("input_sigma", ">= 0", t.input_sigma);
  if (t.input_min < 1) fail("input_min", ">= 1", t.input_min);
  if (t.input_max < t.input_min || t.input_max > kMaxLength) {
    fail("input_max", "in [input_min, 2^31)", t.input_max);
  }
  if (!(t.target_median > 0) || !std::isfinite(t.target_median)) fail("target_median", "> 0", t.target_median);
  if (!(t.target_sigma >= 0) || !std::isfinite(t.target_sigma)) fail("target_sigma", ">= 0", t.target_sigma);
  if (t.target_min < 1) fail("target_min", ">= 1", t.target_min);
  if (t.target_max < t.target_min || t.target_max > kMaxLength) {
    fail("target_max", "in [target_min, 2^31)", t.target_max);
  }
}

std::int64_t draw_length(Rng& rng, double median, double sigma, std::int64_t lo, std::int64_t hi) {
  const double value = std::round(std::exp(rng.normal(std::log(median), sigma)));
  // Compare in double first: exp() of a wild draw can exceed int64.
  if (!(value < static_cast<double>(hi))) return hi;
  return std::max(lo, static_cast<std::int64_t>(value));
}

// Per-task counts: floor of each share, then the remaining samples to the largest
// remainders (ties to the earlier task), so counts sum to n and follow the weights.
std::vector<std::int64_t> task_counts(const std::vector<SynthTask>& tasks, std::int64_t n) {
  double total_weight = 0;
  for (const SynthTask& t : tasks) total_weight += t.weight;
  std::vector<std::int64_t> counts(tasks.size());
  std::vector<double> remainders(tasks.size());
  std::int64_t assigned = 0;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const double share = static_cast<double>(n) * tasks[i].weight / total_weight;
    counts[i] = static_cast<std::int64_t>(std::floor(share));
    remainders[i] = share - static_cast<double>(counts[i]);
    assigned += counts[i];
  }
  std::vector<std::size_t> order(tasks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return remainders[a] > remainders[b]; });
  for (std::size_t k = 0; assigned < n; k = (k + 1) % order.size(), ++assigned) {
    ++counts[order[k]];
  }
  return counts;
}

}  // namespace

std::vector<std::string> synth_mixture_names() {
  std::vector<std::string> names;
  for (const Preset& preset : kPresets) names.emplace_back(preset.name);
  return names;
}

std::vector<SynthTask> synth_mixture(std::string_view name) {
  for (const Preset& preset : kPresets) {
    if (name == preset.name) return preset.tasks();
  }
  throw Error(ErrorKind::NotFound, cat("mixture must be one of ", join(synth_mixture_names(), ", "),
                                       ", got \"", name, "\""));
}

void SynthOptions::validate() const {
  if (num_samples < 1) {
    throw Error(ErrorKind::InvalidArgument, cat("num_samples must be >= 1, got ", num_samples));
  }
  const std::vector<SynthTask> table = tasks.empty() ? synth_mixture(mixture) : tasks;
  for (std::size_t i = 0; i < table.size(); ++i) validate_task(table[i], i);
}

SynthSamples generate_synthetic_samples(const SynthOptions& options) {
  options.validate();
  const std::vector<SynthTask> tasks =
      options.tasks.empty() ? synth_mixture(options.mixture) : options.tasks;
  SynthSamples out;
  for (const SynthTask& t : tasks) out.task_names.push_back(t.name);

  const std::vector<std::int64_t> counts = task_counts(tasks, options.num_samples);
  std::vector<std::int32_t> order;
  order.reserve(static_cast<std::size_t>(options.num_samples));
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    order.insert(order.end(), static_cast<std::size_t>(counts[t]), static_cast<std::int32_t>(t));
  }
  Rng rng(options.seed);
  // Fisher-Yates spelled out: std::shuffle's draw sequence is implementation-defined.
  for (std::size_t i = order.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(rng.uniform_int(0, static_cast<std::int64_t>(i) - 1));
    std::swap(order[i - 1], order[j]);
  }

  out.samples.reserve(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    const SynthTask& t = tasks[static_cast<std::size_t>(order[i])];
    Sample s;
    s.id = static_cast<SampleId>(i);
    s.task = order[i];
    s.input_len = static_cast<std::int32_t>(
        draw_length(rng, t.input_median, t.input_sigma, t.input_min, t.input_max));
    s.target_len = static_cast<std::int32_t>(
        draw_length(rng, t.target_median, t.target_sigma, t.target_min, t.target_max));
    out.samples.push_back(s);
  }
  return out;
}

void write_synthetic_samples(const std::string& path, const SynthSamples& samples) {
  std::vector<std::string> quoted;  // JSON string literals of the task names
  for (const std::string& name : samples.task_names) quoted.push_back(nlohmann::json(name).dump());
  std::string text;
  text.reserve(samples.samples.size() * 72);
  for (const Sample& s : samples.samples) {
    DYNAPIPE_CHECK(s.task >= -1 && s.task < static_cast<std::int32_t>(quoted.size()),
                   cat("sample ", s.id, " task ", s.task, " outside the task table"));
    text += cat("{\"id\":", s.id);
    if (s.task >= 0) text += cat(",\"task\":", quoted[static_cast<std::size_t>(s.task)]);
    text += cat(",\"input_len\":", s.input_len, ",\"target_len\":", s.target_len, "}\n");
  }
  data_detail::write_text_file(path, text);
}

}  // namespace dynapipe
