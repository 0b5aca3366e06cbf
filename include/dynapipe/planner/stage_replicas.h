// Replicated pipeline stages (PipeDream's hybrid of pipeline and data parallelism): how
// many ranks run each stage, from `--replicas` (docs/cli.md). The value is either one
// count per stage, "R0,R1,...", or the JSON file `dynapipe partition --out` writes (its
// stages[].replicas, docs/partition.md).
//
//   parse_stage_replicas("2,1", 2) == {2, 1}
//   parse_stage_replicas("1", 3) == {}          // all 1: no replication
//   parse_stage_replicas("p.json", 2)           // {r per stage} of the partition
//
// Thread-safety: pure (reads the file when given one).
#pragma once

#include <string_view>
#include <vector>

namespace dynapipe {

// [stage] replication for `pp` stages; empty when every stage has 1. A lone "1" means
// every stage once. Throws Error(InvalidArgument) naming the value and what was expected
// when a count is not an integer in [1, 1024] or the number of stages is not `pp`;
// Error(NotFound/ParseError) for an unreadable or malformed partition file.
std::vector<int> parse_stage_replicas(std::string_view value, int pp);

}  // namespace dynapipe
