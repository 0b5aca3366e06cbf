// Golden planner cases: small hand-sized inputs (tests/planner/golden/*.golden) with the
// exact plan they produce: cuts, shapes, schedule, recompute and every executor's
// instruction list, one per line. A change to batching, scheduling or lowering shows up
// as a readable diff of these files. After an intended change, regenerate with
//   DYNAPIPE_UPDATE_GOLDEN=1 build/tests/planner/dynapipe_planner_tests --gtest_filter='Golden*'
// and review the diff like code.
//
// File format: `key value...` lines (model, cost-model, pp, dp, strategy, schedule,
// max-seqlen, max-target-len, memory-limit, samples: input/target pairs), then a line
// `--- expected`, then the rendered plan.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/planner/planner.h"

namespace dynapipe {
namespace {

namespace fs = std::filesystem;
constexpr std::string_view kSeparator = "--- expected";

struct GoldenCase {
  std::string header;    // everything up to and including the separator line
  std::string expected;  // the rendered plan
  PlanConfig config;
  GlobalBatch batch;
};

GoldenCase read_case(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::NotFound, cat(path.string(), ": cannot open"));
  GoldenCase c;
  c.config.cost_model = "analytic:cpu";
  std::string line;
  bool in_expected = false;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (in_expected) {
      c.expected += line + "\n";
      continue;
    }
    c.header += line + "\n";
    if (line == kSeparator) {
      in_expected = true;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string key;
    words >> key;
    auto bad = [&](const std::string& what) {
      throw Error(ErrorKind::ParseError, cat(path.string(), ":", line_no, ": ", what));
    };
    std::string value;
    if (key == "samples") {
      SampleId id = 0;
      while (words >> value) {
        const auto slash = value.find('/');
        if (slash == std::string::npos) bad(cat("samples must be input/target pairs, got ", value));
        c.batch.samples.push_back({.id = id++,
                                   .input_len = std::stoi(value.substr(0, slash)),
                                   .target_len = std::stoi(value.substr(slash + 1))});
      }
      continue;
    }
    if (!(words >> value)) bad(cat(key, " needs a value"));
    if (key == "model") c.config.model = load_model_spec(value);
    else if (key == "cost-model") c.config.cost_model = value;
    else if (key == "pp") c.config.pp = std::stoi(value);
    else if (key == "dp") c.config.dp = std::stoi(value);
    else if (key == "strategy") c.config.strategy = *parse_strategy(value);
    else if (key == "schedule") c.config.schedule = *parse_schedule_kind(value);
    else if (key == "max-seqlen") c.config.max_seqlen = std::stoll(value);
    else if (key == "max-target-len") c.config.max_target_len = std::stoll(value);
    else if (key == "memory-limit") c.config.memory_limit_gib = std::stod(value);
    else bad(cat("unknown key ", key));
  }
  if (!in_expected) throw Error(ErrorKind::ParseError, cat(path.string(), ": no '", kSeparator, "' line"));
  std::int64_t tokens = 0;
  for (const Sample& s : c.batch.samples) tokens += s.input_len + s.target_len;
  c.config.global_batch_tokens = tokens;
  return c;
}

std::string render(const IterationPlan& plan) {
  std::ostringstream out;
  for (std::size_t r = 0; r < plan.replicas.size(); ++r) {
    const ReplicaPlan& replica = plan.replicas[r];
    out << "replica " << r << ": schedule " << schedule_kind_name(replica.schedule)
        << ", recompute " << recompute_name(replica.recompute) << "\n";
    for (const MicroBatch& mb : replica.microbatches) {
      out << "  mb " << mb.id << ": samples " << join(mb.sample_ids, " ") << "; shape "
          << mb.shape.batch << "x" << mb.shape.seqlen;
      if (mb.shape.dec_seqlen > 0) out << "+" << mb.shape.dec_seqlen;
      if (!mb.rows.empty()) out << "; rows " << mb.rows.size();
      out << "\n";
    }
    for (const ExecutorProgram& program : replica.executors) {
      out << "  rank " << program.rank << " (device " << program.device << "):\n";
      for (const Instruction& in : program.instructions) out << "    " << to_string(in) << "\n";
    }
  }
  return out.str();
}

TEST(GoldenTest, PlansMatchTheRecordedOnes) {
  const fs::path dir = fs::path(DYNAPIPE_SOURCE_DIR) / "tests/planner/golden";
  const bool update = std::getenv("DYNAPIPE_UPDATE_GOLDEN") != nullptr;
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".golden") continue;
    ++cases;
    SCOPED_TRACE(entry.path().filename().string());
    const GoldenCase c = read_case(entry.path());
    PlannerOptions options;
    options.fixed_layout = true;
    const Planner planner(c.config, options);
    const std::string actual = render(planner.plan_iteration(c.batch));
    if (update) {
      std::ofstream(entry.path()) << c.header << actual;
      continue;
    }
    EXPECT_EQ(actual, c.expected) << "regenerate with DYNAPIPE_UPDATE_GOLDEN=1 if intended";
  }
  EXPECT_GE(cases, 4);
}

}  // namespace
}  // namespace dynapipe
