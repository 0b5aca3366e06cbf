#include "runtime/exec/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "dynapipe/core/error.h"
#include "dynapipe/core/statistics.h"

namespace dynapipe::runtime {

namespace {
using nlohmann::json;

json to_json(const StepMetrics& m) {
  return {{"step", m.step},
          {"loss", m.loss},
          {"real_tokens", m.real_tokens},
          {"padded_tokens", m.padded_tokens},
          {"step_time_s", m.step_time_s},
          {"est_step_time_s", m.est_step_time_s},
          {"tokens_per_s", m.tokens_per_s},
          {"planning_ms", m.planning_ms},
          {"peak_memory_bytes", m.peak_memory_bytes},
          {"est_peak_memory_bytes", m.est_peak_memory_bytes},
          {"held_peak_bytes", m.held_peak_bytes},
          {"peak_memory_above_start_bytes", m.peak_memory_above_start_bytes},
          {"microbatches", m.microbatches},
          {"schedule", m.schedule},
          {"op_ms", m.op_ms}};
}

// Fields whose median the summary line reports (docs/cli.md, train metrics: "the run's medians of the
// same fields").
const std::vector<std::string> kMedianFields = {
    "loss", "real_tokens", "padded_tokens", "step_time_s", "est_step_time_s", "tokens_per_s",
    "planning_ms", "peak_memory_bytes", "est_peak_memory_bytes", "held_peak_bytes", "peak_memory_above_start_bytes", "microbatches"};
}  // namespace

std::string to_json_line(const StepMetrics& m) { return to_json(m).dump(); }

StepMetrics from_json_line(const std::string& line) {
  try {
    auto j = json::parse(line);
    StepMetrics m;
    m.step = j.at("step").get<std::int64_t>();
    m.loss = j.at("loss").get<double>();
    m.real_tokens = j.at("real_tokens").get<std::int64_t>();
    m.padded_tokens = j.at("padded_tokens").get<std::int64_t>();
    m.step_time_s = j.at("step_time_s").get<double>();
    m.est_step_time_s = j.at("est_step_time_s").get<double>();
    m.tokens_per_s = j.at("tokens_per_s").get<double>();
    m.planning_ms = j.at("planning_ms").get<double>();
    m.peak_memory_bytes = j.at("peak_memory_bytes").get<std::int64_t>();
    m.est_peak_memory_bytes = j.at("est_peak_memory_bytes").get<std::int64_t>();
    m.held_peak_bytes = j.value("held_peak_bytes", std::int64_t{0});
    m.peak_memory_above_start_bytes = j.value("peak_memory_above_start_bytes", std::int64_t{0});
    m.microbatches = j.value("microbatches", 0);
    m.schedule = j.value("schedule", std::string());
    m.op_ms = j.value("op_ms", std::map<std::string, double>{});
    return m;
  } catch (const std::exception& e) {
    throw Error(ErrorKind::ParseError, cat("metrics line must be a step object, got error: ", e.what()));
  }
}

std::string summary_json_line(const std::vector<StepMetrics>& rows) {
  json s = {{"summary", true}, {"steps", rows.size()}};
  std::vector<json> objects;
  for (const auto& r : rows) objects.push_back(to_json(r));
  for (const auto& field : kMedianFields) {
    std::vector<double> values;
    for (const auto& o : objects) values.push_back(o.at(field).get<double>());
    s[field] = median(values);
  }
  auto summary = summarize_steps(rows);
  s["final_loss"] = summary.final_loss;
  s["padding_efficiency"] = summary.padding_efficiency;
  return s.dump();
}

TrainSummary summarize_steps(const std::vector<StepMetrics>& rows) {
  TrainSummary s;
  s.steps = static_cast<std::int64_t>(rows.size());
  std::vector<double> tps, step, est, planning;
  double real = 0, padded = 0;
  for (const auto& r : rows) {
    s.losses.push_back(r.loss);
    tps.push_back(r.tokens_per_s);
    step.push_back(r.step_time_s);
    est.push_back(r.est_step_time_s);
    planning.push_back(r.planning_ms);
    real += static_cast<double>(r.real_tokens);
    padded += static_cast<double>(r.padded_tokens);
    s.peak_memory_bytes = std::max(s.peak_memory_bytes, r.peak_memory_bytes);
    s.peak_memory_above_start_bytes = std::max(s.peak_memory_above_start_bytes, r.peak_memory_above_start_bytes);
    s.est_peak_memory_bytes = std::max(s.est_peak_memory_bytes, r.est_peak_memory_bytes);
  }
  s.final_loss = rows.empty() ? 0 : rows.back().loss;
  s.median_loss = median(s.losses);
  s.median_tokens_per_s = median(tps);
  s.median_step_time_s = median(step);
  s.median_est_step_time_s = median(est);
  s.median_planning_ms = median(planning);
  s.padding_efficiency = padded > 0 ? real / padded : 0;
  return s;
}

std::string summary_to_json(const TrainSummary& s) {
  return json{{"steps", s.steps},
              {"final_loss", s.final_loss},
              {"median_loss", s.median_loss},
              {"median_tokens_per_s", s.median_tokens_per_s},
              {"median_step_time_s", s.median_step_time_s},
              {"median_est_step_time_s", s.median_est_step_time_s},
              {"median_planning_ms", s.median_planning_ms},
              {"padding_efficiency", s.padding_efficiency},
              {"peak_memory_bytes", s.peak_memory_bytes},
              {"peak_memory_above_start_bytes", s.peak_memory_above_start_bytes},
              {"est_peak_memory_bytes", s.est_peak_memory_bytes},
              {"losses", s.losses},
              {"cost_calibration", s.cost_calibration},
              {"freed_memory_kept", s.freed_memory_kept}}
      .dump();
}

TrainSummary summary_from_json(const std::string& text) {
  try {
    auto j = json::parse(text);
    TrainSummary s;
    s.steps = j.at("steps").get<std::int64_t>();
    s.final_loss = j.at("final_loss").get<double>();
    s.median_loss = j.at("median_loss").get<double>();
    s.median_tokens_per_s = j.at("median_tokens_per_s").get<double>();
    s.median_step_time_s = j.at("median_step_time_s").get<double>();
    s.median_est_step_time_s = j.at("median_est_step_time_s").get<double>();
    s.median_planning_ms = j.at("median_planning_ms").get<double>();
    s.padding_efficiency = j.at("padding_efficiency").get<double>();
    s.peak_memory_bytes = j.at("peak_memory_bytes").get<std::int64_t>();
    s.peak_memory_above_start_bytes = j.value("peak_memory_above_start_bytes", std::int64_t{0});
    s.est_peak_memory_bytes = j.at("est_peak_memory_bytes").get<std::int64_t>();
    s.losses = j.at("losses").get<std::vector<double>>();
    s.cost_calibration = j.value("cost_calibration", "");
    s.freed_memory_kept = j.value("freed_memory_kept", false);
    return s;
  } catch (const std::exception& e) {
    throw Error(ErrorKind::ParseError, cat("training summary must be JSON, got error: ", e.what()));
  }
}

std::string checkpoint_meta_to_json(const CheckpointMeta& meta) {
  json rows = json::array();
  for (const auto& r : meta.rows) rows.push_back(to_json(r));
  json j{{"next_step", meta.next_step}, {"world_size", meta.world_size}, {"pp", meta.pp},
         {"dp", meta.dp}, {"metrics", rows}};
  if (!meta.layers_per_stage.empty()) j["layers_per_stage"] = meta.layers_per_stage;
  return j.dump();
}

CheckpointMeta checkpoint_meta_from_json(const std::string& text, const std::string& where) {
  try {
    auto j = json::parse(text);
    CheckpointMeta meta;
    meta.next_step = j.at("next_step").get<std::int64_t>();
    meta.world_size = j.at("world_size").get<int>();
    meta.pp = j.at("pp").get<int>();
    meta.dp = j.at("dp").get<int>();
    if (j.contains("layers_per_stage")) meta.layers_per_stage = j.at("layers_per_stage").get<std::vector<int>>();
    for (const auto& row : j.at("metrics")) meta.rows.push_back(from_json_line(row.dump()));
    return meta;
  } catch (const Error& e) {
    throw Error(ErrorKind::ParseError, cat(where, ": ", e.what()));
  } catch (const std::exception& e) {
    throw Error(ErrorKind::ParseError, cat(where, ": checkpoint metadata must be JSON: ", e.what()));
  }
}

std::string format_summary(const TrainSummary& s) {
  char buffer[1024];
  std::snprintf(buffer, sizeof buffer,
                "steps                 %lld\n"
                "loss                  %.6f (final), %.6f (median)\n"
                "tokens/s              %.1f (median)\n"
                "padding efficiency    %.3f\n"
                "planning time         %.2f ms (median per iteration)\n"
                "step time             %.3f s measured, %.3f s estimated (medians)\n"
                "peak memory           %.1f MiB measured (RSS; %.1f MiB above the ranks' start), %.1f MiB estimated\n",
                static_cast<long long>(s.steps), s.final_loss, s.median_loss, s.median_tokens_per_s,
                s.padding_efficiency, s.median_planning_ms, s.median_step_time_s,
                s.median_est_step_time_s, static_cast<double>(s.peak_memory_bytes) / (1 << 20),
                static_cast<double>(s.peak_memory_above_start_bytes) / (1 << 20),
                static_cast<double>(s.est_peak_memory_bytes) / (1 << 20));
  std::string out = buffer;
  if (s.freed_memory_kept) {
    out += "                      (RSS includes freed pages the allocator keeps for reuse, bounded by "
           "--memory-limit; --release-freed-memory hands them back)\n";
  }
  if (!s.cost_calibration.empty()) out += "cost model refined    " + s.cost_calibration + "\n";
  return out;
}

MetricsFile::MetricsFile(const std::string& path, const std::vector<StepMetrics>& restored) : path_(path) {
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr)
    throw Error(ErrorKind::InvalidArgument,
                cat("--metrics ", path, ": cannot open for writing: ", std::strerror(errno)));
  for (const auto& m : restored) std::fprintf(file_, "%s\n", to_json_line(m).c_str());
  std::fflush(file_);
}
MetricsFile::~MetricsFile() {
  if (file_) std::fclose(file_);
}
void MetricsFile::append(const StepMetrics& m) {
  std::fprintf(file_, "%s\n", to_json_line(m).c_str());
  std::fflush(file_);
}
void MetricsFile::finish(const std::vector<StepMetrics>& rows) {
  std::fprintf(file_, "%s\n", summary_json_line(rows).c_str());
  std::fflush(file_);
}

Progress::Progress(std::int64_t total_steps, bool enabled) : total_(total_steps), enabled_(enabled) {
  const char* forced = std::getenv("DYNAPIPE_STDERR_TTY");
  tty_ = ::isatty(2) || (forced && std::string(forced) == "1");
}

void Progress::update(const StepMetrics& m) {
  if (!enabled_) return;
  auto done = m.step + 1;
  if (tty_) {
    constexpr int kWidth = 24;
    int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r[%s] step %lld/%lld  loss %.4f  %.0f tok/s  %.2f s/step   ", bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), m.loss, m.tokens_per_s,
                 m.step_time_s);
  } else {
    std::fprintf(stderr, "step %lld/%lld loss %.6f tokens/s %.1f step_time_s %.3f est_step_time_s %.3f\n",
                 static_cast<long long>(done), static_cast<long long>(total_), m.loss, m.tokens_per_s,
                 m.step_time_s, m.est_step_time_s);
  }
  std::fflush(stderr);
}

void Progress::done() {
  if (enabled_ && tty_) std::fprintf(stderr, "\n");
}

}  // namespace dynapipe::runtime
