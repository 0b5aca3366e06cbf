#include "dynapipe/core/strategy.h"

#include <array>

namespace dynapipe {
namespace {

struct StrategyName {
  Strategy strategy;
  std::string_view name;
};

// The one table behind parse, print and the CLI choices.
constexpr std::array<StrategyName, 6> kStrategyNames{{
    {Strategy::DynaPipe, "dynapipe"},
    {Strategy::Padding, "padding"},
    {Strategy::Packing, "packing"},
    {Strategy::PackingVarlen, "packing-varlen"},
    {Strategy::TokenBased, "token-based"},
    {Strategy::PackingMegatron, "packing-megatron"},
}};

}  // namespace

std::string_view strategy_name(Strategy strategy) {
  for (const StrategyName& entry : kStrategyNames) {
    if (entry.strategy == strategy) return entry.name;
  }
  return "unknown";
}

std::optional<Strategy> parse_strategy(std::string_view name) {
  for (const StrategyName& entry : kStrategyNames) {
    if (entry.name == name) return entry.strategy;
  }
  return std::nullopt;
}

std::vector<std::string_view> strategy_names() {
  std::vector<std::string_view> names;
  for (const StrategyName& entry : kStrategyNames) names.push_back(entry.name);
  return names;
}

}  // namespace dynapipe
