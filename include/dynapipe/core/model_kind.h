// The two model families the planner knows, and the enums every stage speaks.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace dynapipe {

enum class ModelKind : std::uint8_t {
  Gpt,  // decoder-only: one sequence input ++ target, loss on target tokens
  T5,   // encoder-decoder: encoder reads input, decoder reads target
};

// Activation recomputation mode. Part of plan format v1: never renumber.
enum class Recompute : std::uint8_t {
  None = 0,       // store every activation
  Selective = 1,  // recompute attention scores/softmax only (Korthikanti et al.)
  Full = 2,       // store only each layer's input, recompute the layer in backward
};

// Every mode, lightest first.
inline constexpr std::array<Recompute, 3> kRecomputeModes{Recompute::None, Recompute::Selective,
                                                          Recompute::Full};

std::string_view model_kind_name(ModelKind kind);  // "gpt", "t5"
std::optional<ModelKind> parse_model_kind(std::string_view name);
std::string_view recompute_name(Recompute mode);    // "none", "selective", "full"
std::optional<Recompute> parse_recompute(std::string_view name);

}  // namespace dynapipe
