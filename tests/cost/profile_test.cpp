#include "dynapipe/cost/model_spec.h"

#include <gtest/gtest.h>

namespace dynapipe {
namespace {
TEST(Placeholder, Nothing) {}
}  // namespace
}  // namespace dynapipe
