// --replicas: "R0,R1,..." or a `dynapipe partition --out` JSON file.
#include "dynapipe/planner/stage_replicas.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <string>

#include "dynapipe/core/error.h"
#include "dynapipe/core/json_reader.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {
namespace {

constexpr int kMaxReplicas = 1024;

[[noreturn]] void bad(std::string_view value, const std::string& expected) {
  throw Error(ErrorKind::InvalidArgument,
              cat("--replicas must be ", expected, ", got \"", value, "\""));
}

bool looks_like_counts(std::string_view value) {
  return !value.empty() && std::all_of(value.begin(), value.end(),
                                       [](char c) { return (c >= '0' && c <= '9') || c == ','; });
}

std::vector<int> counts_from_list(std::string_view value) {
  std::vector<int> counts;
  for (const std::string& item : split(value, ',')) {
    int count = 0;
    auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), count);
    if (item.empty() || error != std::errc() || end != item.data() + item.size() || count < 1 ||
        count > kMaxReplicas) {
      bad(value,
          cat("comma-separated integers in [1, ", kMaxReplicas, "] or a partition JSON file"));
    }
    counts.push_back(count);
  }
  return counts;
}

std::vector<int> counts_from_partition(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::NotFound, cat("--replicas ", path, ": cannot open file"));
  std::ostringstream text;
  text << in.rdbuf();
  JsonDocument doc(text.str(), path, "the partition");
  return doc.root()["stages"].list<int>(
      [](const JsonValue& stage) { return stage["replicas"].int32(1, kMaxReplicas); });
}

}  // namespace

std::vector<int> parse_stage_replicas(std::string_view value, int pp) {
  const bool list = looks_like_counts(value);
  std::vector<int> counts =
      list ? counts_from_list(value) : counts_from_partition(std::string(value));
  if (list && counts.size() == 1 && counts[0] == 1) return {};
  if (static_cast<int>(counts.size()) != pp) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--replicas must have one count per stage (--pp ", pp, "), got ", counts.size(),
                    list ? "" : " stages in ", list ? "" : std::string(value), " (",
                    join(counts, ","), ")"));
  }
  if (std::all_of(counts.begin(), counts.end(), [](int r) { return r == 1; })) return {};
  return counts;
}

}  // namespace dynapipe
