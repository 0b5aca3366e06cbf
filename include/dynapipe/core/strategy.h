// Strategy: how a global batch is cut into micro-batches, and its spelling on the
// command line (`--strategy`) and in plan configs.
//
//   std::optional<Strategy> s = parse_strategy("packing-varlen");
//   std::string_view name = strategy_name(Strategy::DynaPipe);  // "dynapipe"
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace dynapipe {

// Part of the CLI and plan-config contract: never rename the spellings.
enum class Strategy : std::uint8_t {
  DynaPipe,       // "dynapipe": ordered samples, exact DP over consecutive partitions
  Padding,        // "padding": data order, fixed micro-batch size, rows padded to max length
  Packing,        // "packing": first-fit rows of whole samples, dense attention over each row
  PackingVarlen,  // "packing-varlen": best-fit-decreasing rows, block-diagonal (varlen) attention
  TokenBased,     // "token-based": sorted order, fairseq-style padded-token budget per micro-batch
  PackingMegatron,  // "packing-megatron": the DynaPipe artifact's baseline: next-fit rows in data
                    // order padded to the max length, fixed rows per micro-batch, one recompute, 1F1B
};

std::string_view strategy_name(Strategy strategy);
std::optional<Strategy> parse_strategy(std::string_view name);
// Every spelling, in enum order (for CLI choices and docs).
std::vector<std::string_view> strategy_names();

}  // namespace dynapipe
