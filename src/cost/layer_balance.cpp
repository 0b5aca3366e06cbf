// Balanced layer splits; see include/dynapipe/cost/layer_balance.h.
#include "dynapipe/cost/layer_balance.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {

std::vector<double> layer_unit_ms(const std::string& cost_spec, const ModelSpec& model,
                                  const CostModelOptions& options, const std::vector<MicroBatchShape>& shapes,
                                  const std::vector<double>& weights,
                                  const std::vector<AttentionDensity>& densities) {
  if (shapes.empty() || shapes.size() != weights.size() || (!densities.empty() && densities.size() != shapes.size())) {
    throw Error(ErrorKind::InvalidArgument,
                cat("layer costs need one weight (and none or one attention density) per micro-batch shape, got ",
                    shapes.size(), " shapes, ", weights.size(), " weights and ", densities.size(), " densities"));
  }
  CostModelOptions per_layer = options;
  per_layer.num_stages = model.total_layers();
  per_layer.layers.clear();
  const auto cost = make_cost_model(cost_spec, model, per_layer);
  std::vector<double> units(per_layer.num_stages, 0.0);
  for (int unit = 0; unit < per_layer.num_stages; ++unit) {
    for (std::size_t s = 0; s < shapes.size(); ++s) {
      const AttentionDensity density = densities.empty() ? AttentionDensity{} : densities[s];
      const StageCost c = cost->stage_cost(unit, shapes[s], density, Recompute::None);
      units[unit] += weights[s] * (c.fwd_ms + c.bwd_ms);
    }
  }
  return units;
}

namespace {

// The exact min-max split of `unit_ms` into num_stages contiguous stages, stage k over units
// [begin, end) allowed only when fits(k, begin, end); empty when none is.
template <typename Fits>
std::vector<int> min_max_split(const std::vector<double>& unit_ms, int num_stages, const Fits& fits) {
  const int n = static_cast<int>(unit_ms.size());
  if (num_stages < 1 || num_stages > n) {
    throw Error(ErrorKind::InvalidArgument,
                cat("pipeline stages must be in [1, ", n, "] to split ", n, " layers, got ", num_stages));
  }
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + unit_ms[i];
  struct Best {
    double max = std::numeric_limits<double>::infinity();
    double squares = std::numeric_limits<double>::infinity();
    int cut = -1;  // start of the last stage
  };
  auto better = [](double max, double squares, const Best& b) {
    const double tolerance = 1e-9 * std::max(std::abs(max), std::abs(b.max));
    if (max < b.max - tolerance) return true;
    return max <= b.max + tolerance && squares < b.squares;
  };
  // best[k][i]: the first i units on k stages.
  std::vector<std::vector<Best>> best(num_stages + 1, std::vector<Best>(n + 1));
  best[0][0] = {0.0, 0.0, 0};
  for (int k = 1; k <= num_stages; ++k) {
    for (int i = k; i <= n - (num_stages - k); ++i) {
      for (int cut = k - 1; cut < i; ++cut) {
        const Best& before = best[k - 1][cut];
        if (before.cut < 0 || !fits(k - 1, cut, i)) continue;
        const double stage = prefix[i] - prefix[cut];
        const double max = std::max(before.max, stage);
        const double squares = before.squares + stage * stage;
        if (better(max, squares, best[k][i])) best[k][i] = {max, squares, cut};
      }
    }
  }
  if (best[num_stages][n].cut < 0) return {};
  std::vector<int> counts(num_stages);
  int end = n;
  for (int k = num_stages; k >= 1; --k) {
    const int cut = best[k][end].cut;
    DYNAPIPE_CHECK(cut >= 0 && cut < end, cat("balanced split lost stage ", k));
    counts[k - 1] = end - cut;
    end = cut;
  }
  return counts;
}

}  // namespace

std::vector<int> balance_layer_counts(const std::vector<double>& unit_ms, int num_stages) {
  return min_max_split(unit_ms, num_stages, [](int, int, int) { return true; });
}

UnitMemory layer_unit_memory(const std::string& cost_spec, const ModelSpec& model, const CostModelOptions& options,
                             const MicroBatchShape& shape, Recompute recompute) {
  CostModelOptions per_layer = options;
  per_layer.num_stages = model.total_layers();
  per_layer.layers.clear();
  const auto cost = make_cost_model(cost_spec, model, per_layer);
  UnitMemory memory;
  for (int unit = 0; unit < per_layer.num_stages; ++unit) {
    const StageCost c = cost->stage_cost(unit, shape, {}, recompute);
    memory.static_bytes.push_back(cost->static_bytes(unit));
    memory.stored_bytes.push_back(c.stored_bytes);
    memory.peak_bytes.push_back(c.peak_bytes);
    memory.output_bytes.push_back(c.output_bytes);
  }
  return memory;
}

std::optional<std::vector<int>> balance_layer_counts(const std::vector<double>& unit_ms, int num_stages,
                                                     const StageMemoryRule& rule) {
  const std::size_t n = unit_ms.size();
  const UnitMemory& u = rule.units;
  if (u.static_bytes.size() != n || u.stored_bytes.size() != n || u.peak_bytes.size() != n ||
      (!u.output_bytes.empty() && u.output_bytes.size() != n) ||
      rule.in_flight.size() != static_cast<std::size_t>(std::max(num_stages, 0))) {
    throw Error(ErrorKind::InvalidArgument,
                cat("stage memory rule: need one static, stored and peak size (and none or one output size) per unit (",
                    n, ") and one in-flight count per stage (", num_stages, "), got ", u.static_bytes.size(), ", ",
                    u.stored_bytes.size(), ", ", u.peak_bytes.size(), ", ", u.output_bytes.size(), " and ",
                    rule.in_flight.size()));
  }
  std::vector<std::int64_t> static_prefix(n + 1, 0), stored_prefix(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) {
    static_prefix[i + 1] = static_prefix[i] + u.static_bytes[i];
    stored_prefix[i + 1] = stored_prefix[i] + u.stored_bytes[i];
  }
  auto fits = [&](int stage, int begin, int end) {
    const std::int64_t peak = *std::max_element(u.peak_bytes.begin() + begin, u.peak_bytes.begin() + end);
    // What a stage sends on is held until its backward, as its stored activations are.
    const std::int64_t sent = stage + 1 < num_stages && !u.output_bytes.empty() ? u.output_bytes[end - 1] : 0;
    const std::int64_t bytes = static_prefix[end] - static_prefix[begin] +
                               rule.in_flight[stage] * (stored_prefix[end] - stored_prefix[begin] + sent) + peak;
    return bytes < rule.limit_bytes;
  };
  std::vector<int> counts = min_max_split(unit_ms, num_stages, fits);
  if (counts.empty()) return std::nullopt;
  return counts;
}

}  // namespace dynapipe
