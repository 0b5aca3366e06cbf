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
                                  const std::vector<double>& weights) {
  if (shapes.empty() || shapes.size() != weights.size()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("layer costs need one weight per micro-batch shape, got ", shapes.size(), " shapes and ",
                    weights.size(), " weights"));
  }
  CostModelOptions per_layer = options;
  per_layer.num_stages = model.total_layers();
  per_layer.layers.clear();
  const auto cost = make_cost_model(cost_spec, model, per_layer);
  std::vector<double> units(per_layer.num_stages, 0.0);
  for (int unit = 0; unit < per_layer.num_stages; ++unit) {
    for (std::size_t s = 0; s < shapes.size(); ++s) {
      const StageCost c = cost->stage_cost(unit, shapes[s], {}, Recompute::None);
      units[unit] += weights[s] * (c.fwd_ms + c.bwd_ms);
    }
  }
  return units;
}

std::vector<int> balance_layer_counts(const std::vector<double>& unit_ms, int num_stages) {
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
        if (before.cut < 0) continue;
        const double stage = prefix[i] - prefix[cut];
        const double max = std::max(before.max, stage);
        const double squares = before.squares + stage * stage;
        if (better(max, squares, best[k][i])) best[k][i] = {max, squares, cut};
      }
    }
  }
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

}  // namespace dynapipe
