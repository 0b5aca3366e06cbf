// The Schedule registry: one small class per `--schedule` name over the builders.
#include "dynapipe/schedule/schedule.h"

#include <array>
#include <functional>

#include "dynapipe/core/error.h"
#include "schedule/builders.h"

namespace dynapipe {
namespace {

// What a schedule accepts of the layout.
enum class Layouts { Any, SingleChunk, Interleaved };

class BuilderSchedule final : public Schedule {
 public:
  using Builder = std::function<ScheduleOrder(const PipelineProblem&)>;
  // A list schedule that can give up early (nullopt, Schedule::build's stops) and
  // reports its order's timing (makespan, busy).
  using StoppingBuilder = std::function<std::optional<ScheduleOrder>(
      const PipelineProblem&, const BuildOptions& options, SimResult* timing)>;
  BuilderSchedule(ScheduleKind kind, Layouts layouts, bool adaptive, bool split_backward,
                  Builder builder)
      : BuilderSchedule(kind, layouts, adaptive, split_backward, /*timed=*/false,
                        [builder = std::move(builder)](const PipelineProblem& p,
                                                       const BuildOptions&, SimResult*) {
                          return std::optional<ScheduleOrder>(builder(p));
                        }) {}
  BuilderSchedule(ScheduleKind kind, Layouts layouts, bool adaptive, bool split_backward,
                  StoppingBuilder builder)
      : BuilderSchedule(kind, layouts, adaptive, split_backward, /*timed=*/true,
                        std::move(builder)) {}

  ScheduleKind kind() const override { return kind_; }
  bool adaptive() const override { return adaptive_; }
  bool timed() const override { return timed_; }
  bool needs_virtual_stages() const override { return layouts_ == Layouts::Interleaved; }
  // (The other builders emit only F and B.)
  bool whole_backward() const override {
    return kind_ != ScheduleKind::Zb1p && kind_ != ScheduleKind::CriticalPath;
  }

  using Schedule::build;
  std::optional<ScheduleOrder> build(const PipelineProblem& problem, std::string* why_not,
                                     const BuildOptions& options, bool* stopped,
                                     SimResult* timing) const override {
    if (stopped != nullptr) *stopped = false;
    if (!options.validated) problem.validate();
    const int chunks = problem.layout.chunks;
    std::string reason;
    if (layouts_ == Layouts::SingleChunk && chunks != 1) {
      reason = cat(name(), " needs layout.chunks == 1, got ", chunks);
    } else if (layouts_ == Layouts::Interleaved && chunks < 2) {
      reason = cat(name(), " needs layout.chunks >= 2, got ", chunks);
    } else if (split_backward_ && !has_split_backward(problem)) {
      reason = cat(name(), " needs the cost model's split backward (bwd_input_ms, "
                          "bwd_weight_ms), got 0 for both with bwd_ms > 0");
    }
    if (!reason.empty()) {
      if (why_not != nullptr) *why_not = std::move(reason);
      return std::nullopt;
    }
    std::optional<ScheduleOrder> order = builder_(problem, options, timing);
    if (!order) {
      DYNAPIPE_CHECK(stopped != nullptr,
                     cat(name(), ": stopped (", options.stop_at_ms, " ms) with nowhere to say so"));
      *stopped = true;
    }
    return order;
  }

 private:
  // Zero-bubble needs the cost model to say what I and W cost; a model that leaves both
  // at 0 while B costs something would make zb1p look free.
  static bool has_split_backward(const PipelineProblem& problem) {
    for (const auto& per_stage : problem.costs) {
      for (const StageCost& c : per_stage) {
        if (c.bwd_ms > 0 && c.bwd_input_ms == 0 && c.bwd_weight_ms == 0) return false;
      }
    }
    return true;
  }

  BuilderSchedule(ScheduleKind kind, Layouts layouts, bool adaptive, bool split_backward,
                  bool timed, StoppingBuilder builder)
      : kind_(kind),
        layouts_(layouts),
        adaptive_(adaptive),
        split_backward_(split_backward),
        timed_(timed),
        builder_(std::move(builder)) {}

  ScheduleKind kind_;
  Layouts layouts_;
  bool adaptive_;
  bool split_backward_;
  bool timed_;  // builder_ keeps the simulator's clock (a StoppingBuilder was given)
  StoppingBuilder builder_;
};

struct ScheduleKindName {
  ScheduleKind kind;
  std::string_view name;
};

// The one table behind parse, print, the CLI choices and the search order.
constexpr std::array<ScheduleKindName, 10> kScheduleKindNames{{
    {ScheduleKind::Auto, "auto"},
    {ScheduleKind::GPipe, "gpipe"},
    {ScheduleKind::OneFOneB, "1f1b"},
    {ScheduleKind::Interleaved, "interleaved"},
    {ScheduleKind::Cyclic, "cyclic"},
    {ScheduleKind::WaitFreeCyclic, "wait-free-cyclic"},
    {ScheduleKind::Zb1p, "zb1p"},
    {ScheduleKind::CriticalPath, "critical-path"},
    {ScheduleKind::PipeDream, "pipedream"},
    {ScheduleKind::PipeDream2BW, "pipedream-2bw"},
}};

// Every spelling but "auto" (asynchronous schedules included), for messages.
std::vector<std::string_view> concrete_names() {
  std::vector<std::string_view> names;
  for (const ScheduleKindName& entry : kScheduleKindNames) {
    if (entry.kind != ScheduleKind::Auto) names.push_back(entry.name);
  }
  return names;
}

}  // namespace

std::string_view schedule_kind_name(ScheduleKind kind) {
  for (const ScheduleKindName& entry : kScheduleKindNames) {
    if (entry.kind == kind) return entry.name;
  }
  return "unknown";
}

std::optional<ScheduleKind> parse_schedule_kind(std::string_view name) {
  for (const ScheduleKindName& entry : kScheduleKindNames) {
    if (entry.name == name) return entry.kind;
  }
  return std::nullopt;
}

const std::vector<ScheduleKind>& schedule_kinds() {
  static const std::vector<ScheduleKind> kKinds = [] {
    std::vector<ScheduleKind> kinds;
    for (const ScheduleKindName& entry : kScheduleKindNames) {
      if (entry.kind != ScheduleKind::Auto && !is_async_schedule(entry.kind)) {
        kinds.push_back(entry.kind);
      }
    }
    return kinds;
  }();
  return kKinds;
}

bool is_async_schedule(ScheduleKind kind) {
  return kind == ScheduleKind::PipeDream || kind == ScheduleKind::PipeDream2BW;
}

std::vector<std::string_view> schedule_kind_names() {
  std::vector<std::string_view> names;
  for (const ScheduleKindName& entry : kScheduleKindNames) names.push_back(entry.name);
  return names;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (ScheduleKind kind : schedule_kinds()) names.emplace_back(schedule_kind_name(kind));
    return names;
  }();
  return kNames;
}

std::unique_ptr<Schedule> make_schedule(ScheduleKind kind) {
  using detail::build_cyclic;
  switch (kind) {
    case ScheduleKind::GPipe:
      return std::make_unique<BuilderSchedule>(kind, Layouts::Any, false, false,
                                               detail::build_gpipe);
    case ScheduleKind::OneFOneB:
      return std::make_unique<BuilderSchedule>(kind, Layouts::SingleChunk, false, false,
                                               detail::build_1f1b);
    case ScheduleKind::Interleaved:
      return std::make_unique<BuilderSchedule>(kind, Layouts::Interleaved, false, false,
                                               detail::build_interleaved);
    case ScheduleKind::Cyclic:
      return std::make_unique<BuilderSchedule>(
          kind, Layouts::Any, true, false,
          [](const PipelineProblem& p) { return build_cyclic(p, /*barriers=*/true); });
    case ScheduleKind::WaitFreeCyclic:
      return std::make_unique<BuilderSchedule>(
          kind, Layouts::Any, true, false,
          [](const PipelineProblem& p) { return build_cyclic(p, /*barriers=*/false); });
    case ScheduleKind::Zb1p:
      return std::make_unique<BuilderSchedule>(
          kind, Layouts::SingleChunk, true, true,
          BuilderSchedule::StoppingBuilder(detail::build_zb1p));
    case ScheduleKind::CriticalPath:
      return std::make_unique<BuilderSchedule>(
          kind, Layouts::SingleChunk, true, false,
          BuilderSchedule::StoppingBuilder(detail::build_critical_path));
    case ScheduleKind::PipeDream:
    case ScheduleKind::PipeDream2BW:
      // The 1F1B order; the weight update rule rides on the order (weight_versions.h).
      return std::make_unique<BuilderSchedule>(
          kind, Layouts::SingleChunk, false, false, [kind](const PipelineProblem& p) {
            ScheduleOrder order = detail::build_1f1b(p);
            order.weight_update = kind == ScheduleKind::PipeDream2BW ? WeightUpdate::TwoBuffer
                                  : p.vertical_sync ? WeightUpdate::VerticalSync
                                                    : WeightUpdate::PerMicroBatch;
            return order;
          });
    case ScheduleKind::Auto:
      break;
  }
  throw Error(ErrorKind::InvalidArgument,
              "make_schedule: auto is a search over schedules, not a schedule");
}

std::unique_ptr<Schedule> make_schedule(std::string_view name) {
  const std::optional<ScheduleKind> kind = parse_schedule_kind(name);
  if (!kind || *kind == ScheduleKind::Auto) {
    throw Error(ErrorKind::InvalidArgument,
                cat("schedule must be one of ", join(concrete_names(), ", "), ", got \"", name,
                    "\""));
  }
  return make_schedule(*kind);
}

}  // namespace dynapipe
