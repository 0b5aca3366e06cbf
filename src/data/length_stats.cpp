#include "dynapipe/data/length_stats.h"

#include <algorithm>
#include <cstdio>

namespace dynapipe {

namespace {

std::int64_t nearest_rank(const std::vector<std::int64_t>& sorted, int percent) {
  const std::size_t n = sorted.size();
  const std::size_t rank = (n * static_cast<std::size_t>(percent) + 99) / 100;  // ceil
  return sorted[std::max<std::size_t>(rank, 1) - 1];
}

LengthSummary summarize(std::vector<std::int64_t> values) {
  LengthSummary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (const std::int64_t v : values) sum += static_cast<double>(v);
  s.mean = sum / static_cast<double>(values.size());
  s.min = values.front();
  s.p50 = nearest_rank(values, 50);
  s.p90 = nearest_rank(values, 90);
  s.p99 = nearest_rank(values, 99);
  s.max = values.back();
  return s;
}

TaskLengthStats task_stats(std::string name, const std::vector<const Sample*>& samples) {
  std::vector<std::int64_t> inputs;
  std::vector<std::int64_t> targets;
  inputs.reserve(samples.size());
  targets.reserve(samples.size());
  for (const Sample* s : samples) {
    inputs.push_back(s->input_len);
    targets.push_back(s->target_len);
  }
  TaskLengthStats stats;
  stats.task = std::move(name);
  stats.count = static_cast<std::int64_t>(samples.size());
  stats.input = summarize(std::move(inputs));
  stats.target = summarize(std::move(targets));
  return stats;
}

}  // namespace

LengthStats compute_length_stats(const std::vector<Sample>& samples,
                                 const std::vector<std::string>& task_names) {
  // Bucket task_names.size() holds samples without a (known) task.
  std::vector<std::vector<const Sample*>> by_task(task_names.size() + 1);
  std::vector<const Sample*> all;
  all.reserve(samples.size());
  for (const Sample& s : samples) {
    const bool known = s.task >= 0 && s.task < static_cast<std::int32_t>(task_names.size());
    by_task[known ? static_cast<std::size_t>(s.task) : task_names.size()].push_back(&s);
    all.push_back(&s);
  }
  LengthStats stats;
  for (std::size_t t = 0; t < by_task.size(); ++t) {
    if (by_task[t].empty()) continue;
    stats.tasks.push_back(
        task_stats(t < task_names.size() ? task_names[t] : "(none)", by_task[t]));
  }
  stats.all = task_stats("all", all);
  return stats;
}

std::string format_length_stats(const LengthStats& stats) {
  std::size_t name_width = 4;
  for (const TaskLengthStats& t : stats.tasks) name_width = std::max(name_width, t.task.size());
  const int w = static_cast<int>(name_width);
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-*s %8s %7s | %8s %6s %6s %6s %6s | %6s %5s %5s %5s %5s\n", w,
                "task", "samples", "share", "in mean", "p50", "p90", "p99", "max", "tg mean", "p50",
                "p90", "p99", "max");
  out += line;
  const double total = static_cast<double>(std::max<std::int64_t>(stats.all.count, 1));
  auto row = [&](const TaskLengthStats& t) {
    std::snprintf(line, sizeof line,
                  "%-*s %8lld %6.1f%% | %8.1f %6lld %6lld %6lld %6lld | %6.1f %5lld %5lld %5lld %5lld\n",
                  w, t.task.c_str(), static_cast<long long>(t.count),
                  100.0 * static_cast<double>(t.count) / total, t.input.mean,
                  static_cast<long long>(t.input.p50), static_cast<long long>(t.input.p90),
                  static_cast<long long>(t.input.p99), static_cast<long long>(t.input.max),
                  t.target.mean, static_cast<long long>(t.target.p50),
                  static_cast<long long>(t.target.p90), static_cast<long long>(t.target.p99),
                  static_cast<long long>(t.target.max));
    out += line;
  };
  for (const TaskLengthStats& t : stats.tasks) row(t);
  row(stats.all);
  return out;
}

}  // namespace dynapipe
