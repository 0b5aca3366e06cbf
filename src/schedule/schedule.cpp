// The Schedule registry: one small class per `--schedule` name over the builders.
#include "dynapipe/schedule/schedule.h"

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
  BuilderSchedule(std::string_view name, Layouts layouts, bool adaptive, bool split_backward,
                  Builder builder)
      : name_(name),
        layouts_(layouts),
        adaptive_(adaptive),
        split_backward_(split_backward),
        builder_(std::move(builder)) {}

  std::string_view name() const override { return name_; }
  bool adaptive() const override { return adaptive_; }
  bool needs_virtual_stages() const override { return layouts_ == Layouts::Interleaved; }

  std::optional<ScheduleOrder> build(const PipelineProblem& problem,
                                     std::string* why_not) const override {
    problem.validate();
    const int chunks = problem.layout.chunks;
    std::string reason;
    if (layouts_ == Layouts::SingleChunk && chunks != 1) {
      reason = cat(name_, " needs layout.chunks == 1, got ", chunks);
    } else if (layouts_ == Layouts::Interleaved && chunks < 2) {
      reason = cat(name_, " needs layout.chunks >= 2, got ", chunks);
    } else if (split_backward_ && !has_split_backward(problem)) {
      reason = cat(name_, " needs the cost model's split backward (bwd_input_ms, "
                          "bwd_weight_ms), got 0 for both with bwd_ms > 0");
    }
    if (!reason.empty()) {
      if (why_not != nullptr) *why_not = std::move(reason);
      return std::nullopt;
    }
    return builder_(problem);
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

  std::string_view name_;
  Layouts layouts_;
  bool adaptive_;
  bool split_backward_;
  Builder builder_;
};

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> kNames = {"gpipe",  "1f1b",             "interleaved",
                                                  "cyclic", "wait-free-cyclic", "zb1p"};
  return kNames;
}

std::unique_ptr<Schedule> make_schedule(std::string_view name) {
  using detail::build_cyclic;
  if (name == "gpipe") {
    return std::make_unique<BuilderSchedule>("gpipe", Layouts::Any, false, false,
                                             detail::build_gpipe);
  }
  if (name == "1f1b") {
    return std::make_unique<BuilderSchedule>("1f1b", Layouts::SingleChunk, false, false,
                                             detail::build_1f1b);
  }
  if (name == "interleaved") {
    return std::make_unique<BuilderSchedule>("interleaved", Layouts::Interleaved, false, false,
                                             detail::build_interleaved);
  }
  if (name == "cyclic") {
    return std::make_unique<BuilderSchedule>(
        "cyclic", Layouts::Any, true, false,
        [](const PipelineProblem& p) { return build_cyclic(p, /*barriers=*/true); });
  }
  if (name == "wait-free-cyclic") {
    return std::make_unique<BuilderSchedule>(
        "wait-free-cyclic", Layouts::Any, true, false,
        [](const PipelineProblem& p) { return build_cyclic(p, /*barriers=*/false); });
  }
  if (name == "zb1p") {
    return std::make_unique<BuilderSchedule>("zb1p", Layouts::SingleChunk, true, true,
                                             detail::build_zb1p);
  }
  throw Error(ErrorKind::InvalidArgument,
              cat("schedule must be one of ", join(schedule_names(), ", "), ", got \"", name,
                  "\""));
}

}  // namespace dynapipe
