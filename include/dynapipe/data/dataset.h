// Dataset: the samples of one samples file (docs/data.md "Samples file"), validated,
// truncated and indexed by id, plus the tokens the runtime trains on.
//
// A file is JSON Lines, plain or gzip-compressed (detected by content). Each line is
//   lengths only: {"id": 17, "task": "nli", "input_len": 312, "target_len": 4}
//   text:         {"id": 17, "task": "nli", "input": "...", "target": "..."}
// and the two forms may be mixed. docs/data.md has the full rules; in short: `id` is
// optional (default: the 0-based line number) and unique; `task` is an optional string;
// lengths are integers >= 1; text is non-empty; unknown fields are ignored; blank lines
// are skipped. Lengths above the limits are truncated (data/truncation.h), never dropped.
//
// Tokens: text samples use the byte tokenizer (data/tokenizer.h), cut to the truncated
// lengths keeping the beginning of input and target. Lengths-only samples get
// deterministic synthetic tokens (synthetic_tokens() below) that a model can learn.
// Neither includes BOS/EOS: special tokens are the model's business.
//
// Thread-safety: immutable after construction; const methods may be called concurrently.
//
//   Dataset data = Dataset::load("assets/flan_like_mix.jsonl.gz",
//                                {.kind = ModelKind::T5, .max_seqlen = 1024, .max_target_len = 256});
//   for (const Sample& s : data.samples()) total += s.input_len + s.target_len;
//   SampleTokens t = data.tokens(data.samples().front().id);
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "dynapipe/core/sample.h"
#include "dynapipe/data/tokenizer.h"
#include "dynapipe/data/truncation.h"

namespace dynapipe {

struct SampleTokens {
  std::vector<Token> input;   // input_len tokens (after truncation)
  std::vector<Token> target;  // target_len tokens (after truncation)
};

class Dataset {
 public:
  // Reads, validates and truncates a samples file. Throws Error: NotFound (missing or
  // unreadable file), ParseError ("<path>:<line>: <problem>" for a bad line, a duplicate
  // id naming both lines, a corrupt gzip stream, or a file without samples),
  // InvalidArgument (limits out of range). Nothing is returned half-way.
  static Dataset load(const std::string& path, const TruncationLimits& limits);

  // Builds a dataset from samples with untruncated lengths, e.g. from
  // generate_synthetic_samples(), without a file. Same checks as load(); errors are
  // InvalidArgument naming the sample index.
  static Dataset from_lengths(std::vector<Sample> samples, std::vector<std::string> task_names,
                              const TruncationLimits& limits);

  // In file order; lengths are after truncation.
  const std::vector<Sample>& samples() const { return samples_; }
  // Task names in order of first appearance; Sample::task indexes this table.
  const std::vector<std::string>& task_names() const { return task_names_; }
  // Name of a task index, or "" for -1 (no task).
  const std::string& task_name(std::int32_t task) const;
  // Ids of truncated samples, in file order.
  const std::vector<SampleId>& truncated_ids() const { return truncated_ids_; }
  std::int64_t num_truncated() const { return static_cast<std::int64_t>(truncated_ids_.size()); }
  const TruncationLimits& limits() const { return limits_; }

  bool contains(SampleId id) const { return index_.count(id) != 0; }
  // Throws Error(NotFound) for an unknown id.
  const Sample& sample(SampleId id) const;
  // Tokens of a sample: byte tokens for text samples, synthetic_tokens() otherwise.
  // Throws Error(NotFound) for an unknown id.
  SampleTokens tokens(SampleId id) const;
  // Whether the sample came from a text line. Throws Error(NotFound) for an unknown id.
  bool is_text(SampleId id) const;

 private:
  struct Text {
    std::string input;   // truncated to input_len bytes
    std::string target;  // truncated to target_len bytes
  };
  friend class DatasetBuilder;
  Dataset() = default;
  std::size_t index_of(SampleId id) const;

  TruncationLimits limits_;
  std::vector<Sample> samples_;
  std::vector<std::string> task_names_;
  std::vector<SampleId> truncated_ids_;
  std::vector<Text> text_;  // parallel to samples_; empty when no sample has text
  std::unordered_map<SampleId, std::size_t> index_;
};

// The synthetic tokens of a lengths-only sample. Each sample is one arithmetic
// progression over the 256 byte tokens, running through input ++ target:
//   token(p) = kByteTokenOffset + (start + step * p) mod 256,  p = 0 .. input_len+target_len-1
// where start is a hash of the sample id and step an odd number chosen by the task
// (1 for no task). A model learns the per-task step and continues the input's last token
// into the target, so loss falls on lengths-only data as it would on real text.
// Deterministic: depends only on (id, task, input_len, target_len).
SampleTokens synthetic_tokens(const Sample& sample);

}  // namespace dynapipe
