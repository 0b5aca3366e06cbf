// Length statistics of a set of samples, per task and overall: what `dynapipe data
// stats` and `dynapipe data synth` print, and what tests check mixtures against.
//
// Percentiles are nearest-rank: p-th = the ceil(p/100 * n)-th smallest value.
// Thread-safety: pure functions.
//
//   LengthStats stats = compute_length_stats(data.samples(), data.task_names());
//   std::cout << format_length_stats(stats);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dynapipe/core/sample.h"

namespace dynapipe {

struct LengthSummary {
  double mean = 0;
  std::int64_t min = 0;
  std::int64_t p50 = 0;
  std::int64_t p90 = 0;
  std::int64_t p99 = 0;
  std::int64_t max = 0;
};

struct TaskLengthStats {
  std::string task;         // task name; "(none)" for samples without a task; "all" overall
  std::int64_t count = 0;   // samples
  LengthSummary input;      // input_len
  LengthSummary target;     // target_len
};

struct LengthStats {
  std::vector<TaskLengthStats> tasks;  // task table order, tasks without samples left out
  TaskLengthStats all;
};

// `task_names` is the table Sample::task indexes.
LengthStats compute_length_stats(const std::vector<Sample>& samples,
                                 const std::vector<std::string>& task_names);

// A fixed-width text table, one row per task and a last "all" row, ending in '\n'.
std::string format_length_stats(const LengthStats& stats);

}  // namespace dynapipe
