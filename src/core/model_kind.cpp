#include "dynapipe/core/model_kind.h"

namespace dynapipe {

std::string_view model_kind_name(ModelKind kind) {
  return kind == ModelKind::Gpt ? "gpt" : "t5";
}

std::optional<ModelKind> parse_model_kind(std::string_view name) {
  for (ModelKind kind : {ModelKind::Gpt, ModelKind::T5}) {
    if (model_kind_name(kind) == name) return kind;
  }
  return std::nullopt;
}

std::string_view recompute_name(Recompute mode) {
  switch (mode) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "none";
}

std::optional<Recompute> parse_recompute(std::string_view name) {
  for (Recompute mode : kRecomputeModes) {
    if (recompute_name(mode) == name) return mode;
  }
  return std::nullopt;
}

}  // namespace dynapipe
