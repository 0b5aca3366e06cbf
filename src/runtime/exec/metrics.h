// Per-step metrics, the --metrics JSONL lines, the summary, and progress output.
// Torch-free.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "dynapipe/runtime/train.h"

namespace dynapipe::runtime {

struct StepMetrics {
  std::int64_t step = 0;
  double loss = 0;
  std::int64_t real_tokens = 0;
  std::int64_t padded_tokens = 0;
  double step_time_s = 0;            // slowest rank's executor wall time
  double est_step_time_s = 0;        // the plan's estimate
  double tokens_per_s = 0;           // real tokens / step time
  double planning_ms = 0;
  std::int64_t peak_memory_bytes = 0;       // largest over ranks: RSS high-water mark
  std::int64_t est_peak_memory_bytes = 0;   // the plan's largest estimate
  std::int64_t held_peak_bytes = 0;         // largest over ranks: executor-held tensors
  std::int64_t peak_memory_above_start_bytes = 0;  // largest over ranks: peak RSS minus the
                                                   // RSS before the rank built its models
  int microbatches = 0;                     // over all replicas
  std::string schedule;
  std::map<std::string, double> op_ms;      // per instruction op: largest over ranks
};

// One JSON object, no newline.
std::string to_json_line(const StepMetrics& m);
StepMetrics from_json_line(const std::string& line);  // throws ParseError
// {"summary": true, "steps": n, <medians of every numeric field>, "padding_efficiency": ...}
std::string summary_json_line(const std::vector<StepMetrics>& rows);
TrainSummary summarize_steps(const std::vector<StepMetrics>& rows);
std::string summary_to_json(const TrainSummary& s);
TrainSummary summary_from_json(const std::string& text);  // throws ParseError

// meta.json of a checkpoint (train.cpp): where to continue, the job's shape, the metrics
// rows so far.
struct CheckpointMeta {
  std::int64_t next_step = 0;
  int world_size = 1, pp = 1, dp = 1;
  std::vector<int> layers_per_stage;  // --partition's split; empty: uniform (and older checkpoints)
  std::vector<StepMetrics> rows;
};
std::string checkpoint_meta_to_json(const CheckpointMeta& meta);
CheckpointMeta checkpoint_meta_from_json(const std::string& text, const std::string& where);  // ParseError

// Writes the metrics file: rewrites it with the given rows at open (a resumed run keeps
// what it had at the checkpoint), then appends and flushes one line per step.
class MetricsFile {
 public:
  MetricsFile(const std::string& path, const std::vector<StepMetrics>& restored);
  ~MetricsFile();
  void append(const StepMetrics& m);
  void finish(const std::vector<StepMetrics>& rows);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Progress on stderr: a rewritten line on a terminal (or DYNAPIPE_STDERR_TTY=1, which
// the launcher sets when its own stderr is one), otherwise one plain line per step.
class Progress {
 public:
  Progress(std::int64_t total_steps, bool enabled);
  void update(const StepMetrics& m);
  void done();

 private:
  std::int64_t total_;
  bool enabled_;
  bool tty_;
};

}  // namespace dynapipe::runtime
