// MicroBatchShape and MicroBatch: the shared data model between batching, cost,
// schedule, plan and runtime.
//
// A micro-batch is a set of samples computed together as one padded tensor of
// shape [batch, seqlen] (GPT) or [batch, enc_seqlen] + [batch, dec_seqlen] (T5).
// Packing strategies put several samples in one row; `rows` then lists them.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dynapipe/core/model_kind.h"
#include "dynapipe/core/sample.h"

namespace dynapipe {

struct MicroBatchShape {
  std::int64_t batch = 0;       // rows
  std::int64_t seqlen = 0;      // GPT: tokens per row; T5: encoder tokens per row
  std::int64_t dec_seqlen = 0;  // T5: decoder tokens per row; GPT: 0

  std::int64_t tokens() const { return batch * (seqlen + dec_seqlen); }
  friend bool operator==(const MicroBatchShape&, const MicroBatchShape&) = default;
};

// What a micro-batch costs beyond its tensor shape. Packed rows computed with
// block-diagonal (varlen) attention do only Σ L_i² of the batch·seqlen² attention
// work; the densities say which fraction. 1.0 = dense attention over the padded shape.
struct AttentionDensity {
  double enc = 1.0;  // GPT: the only one used
  double dec = 1.0;  // T5 decoder self-attention (cross-attention uses sqrt(enc*dec))
  friend bool operator==(const AttentionDensity&, const AttentionDensity&) = default;
};

struct MicroBatch {
  int id = 0;                                 // index within its replica, 0-based
  std::vector<SampleId> sample_ids;           // every sample in this micro-batch
  std::vector<std::vector<SampleId>> rows;    // packing strategies only: samples per row
  MicroBatchShape shape;
  AttentionDensity density;
  std::int64_t real_tokens = 0;               // Σ truncated input_len + target_len
  std::int64_t target_tokens = 0;             // Σ target_len (loss tokens)
  // This micro-batch's activation recompute where it differs from its replica's mode
  // (ReplicaPlan::recompute); unset: the replica's. See recompute_of().
  std::optional<Recompute> recompute;
  friend bool operator==(const MicroBatch&, const MicroBatch&) = default;
};

// The recompute mode `mb` runs in, within a replica planned in `replica_mode`.
inline Recompute recompute_of(const MicroBatch& mb, Recompute replica_mode) {
  return mb.recompute.value_or(replica_mode);
}

}  // namespace dynapipe
