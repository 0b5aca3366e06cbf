// Collation: a MicroBatch's sample ids -> the int64 tensors a StageModel consumes.
//
//   SyntheticTokenSource tokens(samples, spec.vocab, /*seed=*/1);
//   MicroBatchTensors t = collate(mb, tokens, ModelKind::Gpt, AttentionMode::Packed,
//                                 1.0 / global_batch_target_tokens);
//
// Conventions (docs/models-runtime.md):
//   GPT row  : [in_1 ++ tg_1][in_2 ++ tg_2]...[pad]; label at token j = token j+1 when
//              token j+1 is a target token of the same sample, else -100. A sample with
//              input_len >= 1 has exactly target_len loss tokens.
//   T5 enc   : [in_1][in_2]...[pad]
//   T5 dec   : [bos ++ tg_1[:-1]][bos ++ tg_2[:-1]]...[pad]; labels = tg_k: exactly
//              target_len loss tokens per sample, and dec length target_len <= dec_seqlen.
//   Every token carries segment k (k-th sample of its row, from 1; 0 = pad) and its
//   position within its sample (from 0). The tensors have exactly mb.shape's sizes.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "dynapipe/core/microbatch.h"
#include "dynapipe/core/model_kind.h"
#include "dynapipe/core/sample.h"
#include "runtime/stage_model.h"

namespace dynapipe::runtime {

inline constexpr std::int64_t kPadToken = 0;        // fills padding; never attended to
inline constexpr std::int64_t kIgnoreLabel = -100;  // no loss at this token

struct SampleTokens {
  std::vector<std::int32_t> input;   // truncated input tokens
  std::vector<std::int32_t> target;  // truncated target tokens
};

// Where collate() gets token ids. The data module's dataset adapts to this.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Throws NotFound for an unknown id.
  virtual SampleTokens tokens(SampleId id) const = 0;
  // First decoder input token of T5 (the decoder's "start" token).
  virtual std::int64_t bos_token() const { return 1; }
};

// Deterministic pseudo-random tokens in [3, vocab) with the samples' lengths; for tests,
// benchmarks and `train` on lengths-only data.
class SyntheticTokenSource : public TokenSource {
 public:
  SyntheticTokenSource(const std::vector<Sample>& samples, int vocab, std::uint64_t seed);
  SampleTokens tokens(SampleId id) const override;

 private:
  std::unordered_map<SampleId, Sample> samples_;
  int vocab_;
  std::uint64_t seed_;
};

// Throws InvalidArgument if a row does not fit mb.shape, rows and sample_ids disagree, or
// shape.batch differs from the number of rows.
MicroBatchTensors collate(const MicroBatch& mb, const TokenSource& source, ModelKind kind,
                          AttentionMode mode, double loss_scale);

// Tokens with a loss for this sample (the denominator of the token-mean loss): target_len,
// except a GPT sample without input, whose first target token has no predecessor.
std::int64_t loss_tokens(const Sample& sample, ModelKind kind);

}  // namespace dynapipe::runtime
