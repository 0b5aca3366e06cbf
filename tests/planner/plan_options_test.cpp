// plan_option_table(): the one declaration of the CLI's common flags and Python's
// Planner keywords; validate_plan_options() and to_plan_config().
#include "dynapipe/planner/plan_options.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <variant>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/planner/stage_replicas.h"
#include "dynapipe/schedule/schedule.h"

namespace dynapipe {
namespace {

std::string message_of(const PlanOptions& options) {
  try {
    validate_plan_options(options);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    return e.what();
  }
  return "";
}

TEST(PlanOptions, DefaultsAreValidAndResolve) {
  const PlanOptions defaults;
  EXPECT_EQ(message_of(defaults), "");
  const PlanConfig config = to_plan_config(defaults);
  EXPECT_EQ(config.model.name, "gpt-tiny");
  EXPECT_EQ(config.max_seqlen, 2048);
  EXPECT_EQ(config.max_target_len, 2048);  // 0 means "same as max_seqlen"
  EXPECT_EQ(config.global_batch_tokens, 65536);
  EXPECT_EQ(config.strategy, Strategy::DynaPipe);
  EXPECT_EQ(config.schedule, ScheduleKind::Auto);
}

TEST(PlanOptions, NamesAndFlagsAreUniqueAndSpelledAlike) {
  std::set<std::string> names, flags;
  for (const PlanOptionSpec& spec : plan_option_table()) {
    EXPECT_TRUE(names.insert(spec.name).second) << spec.name;
    EXPECT_TRUE(flags.insert(spec.flag).second) << spec.flag;
    ASSERT_EQ(spec.flag.rfind("--", 0), 0u) << spec.flag;
    std::string derived = spec.flag.substr(2);
    for (char& c : derived) c = c == '-' ? '_' : c;
    if (spec.flag != "--memory-limit") {
      EXPECT_EQ(spec.name, derived);
    }
  }
  EXPECT_EQ(names.count("memory_limit_gib"), 1u);
}

// Every numeric option accepts its bounds and rejects the values just outside them (and
// NaN), naming its flag; every choice option accepts its choices only.
TEST(PlanOptions, EveryRowChecksItsRange) {
  for (const PlanOptionSpec& spec : plan_option_table()) {
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(PlanOptions{}.*member)>;
          PlanOptions o;
          if constexpr (std::is_same_v<T, std::int64_t>) {
            o.*member = static_cast<std::int64_t>(spec.min);
            EXPECT_EQ(message_of(o), "") << spec.flag;
            o.*member = static_cast<std::int64_t>(spec.max);
            EXPECT_EQ(message_of(o), "") << spec.flag;
            o.*member = static_cast<std::int64_t>(spec.min) - 1;
            EXPECT_EQ(message_of(o).rfind(spec.flag + " must be an integer in [", 0), 0u) << spec.flag;
            o.*member = static_cast<std::int64_t>(spec.max) + 1;
            EXPECT_NE(message_of(o), "") << spec.flag;
          } else if constexpr (std::is_same_v<T, double>) {
            o.*member = spec.max;
            EXPECT_EQ(message_of(o), "") << spec.flag;
            for (double bad : {spec.min - 1e-9, spec.max * 2, std::nan(""),
                               std::numeric_limits<double>::infinity()}) {
              o.*member = bad;
              EXPECT_EQ(message_of(o).rfind(spec.flag + " must be a number in [", 0), 0u) << bad;
            }
          } else if constexpr (std::is_same_v<T, std::string>) {
            for (const std::string& choice : spec.choices) {
              o.*member = choice;
              EXPECT_EQ(message_of(o), "") << choice;
            }
            o.*member = "";
            EXPECT_EQ(message_of(o).rfind(spec.flag + " must ", 0), 0u) << spec.flag;
          }
        },
        spec.field);
  }
}

TEST(PlanOptions, MessagesNameValueAndExpectation) {
  PlanOptions o;
  o.pp = 0;
  EXPECT_EQ(message_of(o), "--pp must be an integer in [1, 1024], got 0");
  o = {};
  o.strategy = "magic";
  // The choices are the name table's, in its order (dynapipe, padding, packing, ...).
  EXPECT_EQ(message_of(o),
            cat("--strategy must be one of ", join(strategy_names(), ", "), ", got \"magic\""));
  EXPECT_EQ(message_of(o).rfind("--strategy must be one of dynapipe, padding, packing, packing-varlen, token-based", 0), 0u);
  o = {};
  o.memory_limit_gib = -0.5;
  EXPECT_EQ(message_of(o), "--memory-limit must be a number in [0, 1000000], got -0.5");
  o = {};
  o.global_batch_tokens = 0;
  EXPECT_EQ(message_of(o), "--global-batch-tokens must be an integer in [1, 1099511627776], got 0");
}

TEST(PlanOptions, ToPlanConfigValidatesFirst) {
  PlanOptions o;
  o.schedule = "gpipe2";
  EXPECT_THROW(to_plan_config(o), Error);
  o = {};
  o.model = "gpt-7b";
  try {
    to_plan_config(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
  }
}

}  // namespace
}  // namespace dynapipe

namespace dynapipe {
namespace {

std::string replicas_error(std::string_view value, int pp) {
  try {
    parse_stage_replicas(value, pp);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// --replicas: counts per stage, "1" for none, or the JSON `dynapipe partition --out` writes.
TEST(PlanOptions, ReplicasParseCountsAndPartitionFiles) {
  EXPECT_EQ(parse_stage_replicas("2,1", 2), (std::vector<int>{2, 1}));
  EXPECT_EQ(parse_stage_replicas("1", 3), std::vector<int>{});
  EXPECT_EQ(parse_stage_replicas("1,1", 2), std::vector<int>{});  // no replication: stored as none
  EXPECT_EQ(replicas_error("2,1,1", 2),
            "--replicas must have one count per stage (--pp 2), got 3 (2,1,1)");
  EXPECT_EQ(replicas_error("2,0", 2),
            "--replicas must be comma-separated integers in [1, 1024] or a partition JSON file, "
            "got \"2,0\"");
  EXPECT_EQ(replicas_error("2,,1", 3),
            "--replicas must be comma-separated integers in [1, 1024] or a partition JSON file, "
            "got \"2,,1\"");
  const auto file =
      std::filesystem::temp_directory_path() / cat("dynapipe_replicas_", ::getpid(), ".json");
  {
    std::ofstream out(file);
    out << R"({"time_per_stage": 0.5, "stages": [{"replicas": 3, "states": [0, 2]},)"
        << R"( {"replicas": 1, "states": [2, 4]}]})";
  }
  EXPECT_EQ(parse_stage_replicas(file.string(), 2), (std::vector<int>{3, 1}));
  EXPECT_NE(replicas_error(file.string(), 3)
                .find("--replicas must have one count per stage (--pp 3), got 2 "
                      "stages in "),
            std::string::npos);
  std::filesystem::remove(file);
  PlanOptions options;
  options.pp = 2;
  options.partition = "uniform";
  options.replicas = "1,2";
  EXPECT_EQ(to_plan_config(options).stage_replicas, (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace dynapipe
