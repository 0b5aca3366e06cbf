// Sample and GlobalBatch: what the data module hands to the planner.
//
// A Sample carries lengths after truncation (the planner never sees text). A
// GlobalBatch is the same for every strategy: the training math depends only on it.
#pragma once

#include <cstdint>
#include <vector>

namespace dynapipe {

using SampleId = std::int64_t;

struct Sample {
  SampleId id = 0;
  std::int32_t input_len = 0;   // tokens, after truncation
  std::int32_t target_len = 0;  // tokens, after truncation
  std::int32_t task = -1;       // index into the samples file's task table; -1 = none
};

struct GlobalBatch {
  std::int64_t index = 0;              // 0-based iteration index
  std::vector<Sample> samples;         // in file order
  std::vector<SampleId> truncated_ids; // samples whose input or target was truncated
};

}  // namespace dynapipe
