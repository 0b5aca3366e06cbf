// The DynaPipe artifact's packing baseline ("MLM+DS", `--strategy packing-megatron`),
// as its Megatron-LM fork packs (docs/batching.md, "packing-megatron"):
//   * next-fit in data order: samples fill the open row until the next one does not fit,
//     which closes the row for good (no looking back, unlike first-fit);
//   * every row is padded to the full length: max_seqlen (T5: encoder max_seqlen, decoder
//     max_target_len), dense attention over the row;
//   * a global batch is a number of rows: global_batch_tokens / (encoder + decoder row
//     length), so it counts padded tokens;
//   * a fixed number of rows per micro-batch and one recompute mode for the whole run, 1F1B.
//
//   MegatronRows rows{.kind = ModelKind::Gpt, .max_seqlen = 2048};
//   auto batches = form_megatron_global_batches(samples, truncated, rows, 65536);  // 32 rows each
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dynapipe/core/model_kind.h"
#include "dynapipe/core/sample.h"

namespace dynapipe {

struct MegatronRows {
  ModelKind kind = ModelKind::Gpt;
  std::int64_t max_seqlen = 2048;   // row length (GPT: input + target; T5: encoder)
  std::int64_t max_target_len = 0;  // T5 decoder row length, >= 1; GPT: unused
  // Tokens one padded row costs: max_seqlen (+ max_target_len for T5).
  std::int64_t row_tokens() const { return max_seqlen + (kind == ModelKind::T5 ? max_target_len : 0); }
};

// Next-fit rows over `samples` in order: indices into `samples`, one vector per row. A
// sample's length is input + target (GPT) or input and target + 1 (T5, bos ++ target;
// the decoder part capped at max_target_len, as Megatron truncates to the decoder
// length). Throws InvalidArgument for a sample longer than a row (truncate first).
std::vector<std::vector<std::size_t>> pack_next_fit(std::span<const Sample> samples, const MegatronRows& rows);

// Global batches of global_batch_tokens / rows.row_tokens() next-fit rows each (at least
// one), in file order; the last one may hold fewer rows. `truncated` as in
// form_global_batches(). Throws InvalidArgument for global_batch_tokens < 1 or
// max_batches < 0, and as pack_next_fit().
std::vector<GlobalBatch> form_megatron_global_batches(const std::vector<Sample>& samples,
                                                      const std::vector<SampleId>& truncated,
                                                      const MegatronRows& rows,
                                                      std::int64_t global_batch_tokens,
                                                      std::int64_t max_batches = 0);

}  // namespace dynapipe
