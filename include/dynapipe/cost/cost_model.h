// CostModel: what one micro-batch costs on one pipeline stage, in time and memory.
//
// The seam between the planner and the hardware. Two implementations:
//   analytic  ("analytic:<device>")  FLOPs and bytes at a shape-dependent efficiency;
//   profiled  (a profile JSON file)  measured per-layer tables, interpolated.
// Both are built for a fixed stage layout (num_stages, layer assignment), so
// stage_cost() answers per stage. Thread-safe for concurrent const calls.
//
//   CostModelOptions options{.num_stages = 4};
//   auto model = make_cost_model("analytic:a100-40g", spec, options);
//   StageCost c = model->stage_cost(0, {.batch = 4, .seqlen = 512}, {}, Recompute::None);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dynapipe/core/microbatch.h"
#include "dynapipe/core/model_kind.h"
#include "dynapipe/cost/device_spec.h"
#include "dynapipe/cost/model_spec.h"

namespace dynapipe {

struct StageCost {
  double fwd_ms = 0;            // forward
  double bwd_ms = 0;            // full backward, including any recomputation
  double bwd_input_ms = 0;      // backward to the input only (zero-bubble "I")
  double bwd_weight_ms = 0;     // backward to the weights only (zero-bubble "W")
  std::int64_t stored_bytes = 0;  // activations kept from F until B (I for split backward)
  std::int64_t peak_bytes = 0;    // transient working memory on top of stored, during F or B
  std::int64_t output_bytes = 0;  // activation sent to the next stage (= gradient sent back);
                                  // 0 on the last stage
  // What a micro-batch in flight keeps on its stage: the stored activations and the sent
  // output, which the lowered plan holds until the backward waits on its send (the
  // runtime's autograd graph keeps it anyway). The memory rules of the DP, the schedules
  // and the simulator count this, as the plan verifier does.
  std::int64_t held_bytes() const { return stored_bytes + output_bytes; }
  friend bool operator==(const StageCost&, const StageCost&) = default;
};

// A lower bound of each stage's time (fwd_ms + bwd_ms) that is affine in a micro-batch's
// tokens: for every micro-batch M with at least one encoder token (T5: and one decoder
// token), any rows, lengths and attention, stage s takes at least
//   enc_ms[s]·enc(M) + dec_ms[s]·dec(M) + fixed_ms[s]
//   + enc_sq_ms[s]·Σ enc(i)² + dec_sq_ms[s]·Σ dec(i)²,
// enc(M), dec(M) its encoder (GPT: all) and decoder tokens before rounding (T5's decoder
// reads target + 1 per sample), the squares summed over its samples i: attention within
// each sample, which every layout pays (varlen rows that much, padded and packed rows
// more). Every entry >= 0; the squares' may be empty (none known). Summed over a
// partition into K micro-batches it bounds Σ t by the fixed time K·fixed_ms[s] as well,
// which the varlen DP's "every sample in one micro-batch" bound lacks, and by the
// attention, which no partition can avoid (docs/batching.md).
struct AffineTimeBound {
  std::vector<double> enc_ms, dec_ms, fixed_ms;  // per stage
  std::vector<double> enc_sq_ms, dec_sq_ms;      // per stage, or both empty

  // The part on stage s that any partition pays in full, for `enc` encoder and `dec`
  // decoder tokens whose samples' squared lengths sum to `enc_sq` and `dec_sq`.
  double work_ms(std::size_t s, double enc, double dec, double enc_sq = 0,
                 double dec_sq = 0) const {
    const double squares = enc_sq_ms.empty() ? 0 : enc_sq_ms[s] * enc_sq + dec_sq_ms[s] * dec_sq;
    return enc_ms[s] * enc + dec_ms[s] * dec + squares;
  }
};

struct CostModelOptions {
  int num_stages = 1;     // pipeline stages the layers are split over (virtual stages when interleaved)
  int zero_shards = 1;    // ZeRO-1 shard factor for optimizer states (the data-parallel degree), >= 1
  int seqlen_multiple = 8;  // shapes are rounded up to this before costing; >= 1
  // Tensor-parallel degree: a stage spans tp devices (Megatron-style, no sequence
  // parallelism); every cost is per device. >= 1; must divide the model's heads.
  int tp = 1;
  // An explicit layer split (num_stages entries, a contiguous split as assign_layers()
  // makes); empty: assign_layers_uniform(num_stages).
  std::vector<StageLayers> layers = {};
  // Throws InvalidArgument naming the field.
  void validate() const;
  friend bool operator==(const CostModelOptions&, const CostModelOptions&) = default;
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  CostModel(const CostModel&) = delete;
  CostModel& operator=(const CostModel&) = delete;

  virtual const ModelSpec& model() const = 0;
  virtual const DeviceSpec& device() const = 0;
  virtual const std::vector<StageLayers>& stages() const = 0;
  int num_stages() const { return static_cast<int>(stages().size()); }

  // Cost of one micro-batch of `shape` on `stage`. Never throws for valid shapes; a
  // shape outside a profile's grid is extrapolated (see docs/profile-format.md).
  virtual StageCost stage_cost(int stage, const MicroBatchShape& shape,
                               const AttentionDensity& density, Recompute recompute) const = 0;
  // stage_cost() of every stage, into out[0, num_stages()), equal to the per-stage calls.
  // The planner costs each micro-batch on all stages; a model whose stages repeat the
  // same layers overrides this to cost each layer once. Default: stage_cost() per stage.
  virtual void stage_costs(const MicroBatchShape& shape, const AttentionDensity& density,
                           Recompute recompute, std::span<StageCost> out) const;
  // What the batching's segment scans read of stage_costs(), equal to it: returns the
  // bottleneck time (max over stages of fwd_ms + bwd_ms) and writes every stage's
  // held_bytes() into bytes[0, p), then its peak_bytes into bytes[p, 2p). `scratch`
  // (p slots) is the default's room for stage_costs(); a model overrides this to skip
  // what the scans do not need (the analytic one costs each distinct stage once).
  virtual double bottleneck_ms_and_bytes(const MicroBatchShape& shape,
                                         const AttentionDensity& density, Recompute recompute,
                                         std::span<StageCost> scratch,
                                         std::span<std::int64_t> bytes) const;
  // bottleneck_ms_and_bytes() for several recompute modes of one micro-batch: times[k]
  // and bytes[2p·k, 2p·(k + 1)) are its results for modes[k], equal to them. The default
  // calls it once per mode; the analytic model shares what the modes have in common
  // (every layer's terms but what is kept and recomputed), so the varlen scans cost
  // none and selective for about the price of one.
  virtual void bottleneck_ms_and_bytes_modes(const MicroBatchShape& shape,
                                             const AttentionDensity& density,
                                             std::span<const Recompute> modes,
                                             std::span<StageCost> scratch,
                                             std::span<double> times,
                                             std::span<std::int64_t> bytes) const;
  // bottleneck_ms_and_bytes_modes() for several micro-batches, by mode: micro-batch j's
  // results for modes[k] are times[J·k + j] and bytes[2p·(J·k + j), 2p·(J·k + j + 1))
  // (J micro-batches), equal to one call per micro-batch and mode, which the default makes.
  // A mode's results lie together, as a varlen row keeps them. The analytic model costs
  // costing_lanes() micro-batches at a time in vector lanes.
  virtual void bottleneck_ms_and_bytes_many(std::span<const MicroBatchShape> shapes,
                                            std::span<const AttentionDensity> densities,
                                            std::span<const Recompute> modes,
                                            std::span<StageCost> scratch, std::span<double> times,
                                            std::span<std::int64_t> bytes) const;
  // How many micro-batches bottleneck_ms_and_bytes_many() costs for about the price of
  // one: a varlen scan costs that many segments of a row ahead. 1 (the default): none
  // shared, so a scan costs only the segments it reads.
  virtual int costing_lanes() const { return 1; }
  // The model's AffineTimeBound under `recompute`; nullopt (the default): none known.
  virtual std::optional<AffineTimeBound> affine_time_bound(Recompute recompute) const;
  // Whether one varlen micro-batch of two micro-batches' samples never takes longer than
  // the two did, so that all of a batch's samples in one micro-batch bound Σ t from below
  // (the DPs' pruning). True of the analytic model by its form (affine work plus Σ L²
  // attention, fixed overheads paid once); false (the default) where that is not
  // promised: measured tables interpolate between and extrapolate past their shapes, and
  // one row of every sample lies far past them (T5-11B, 65,536 tokens: ~4x the true Σ t).
  virtual bool subadditive() const { return false; }
  // Whether a micro-batch's time never falls when it gains a sample (more rows, tokens or
  // Σ L²), so that a segment scan may stop at the first segment over a time cap and no
  // micro-batch is faster than its slowest sample alone. True of the analytic model;
  // false (the default) for measured tables, whose noise and attention split make a
  // segment up to ~18% faster than one sample shorter (A100 tables, T5-11B). Memory is
  // assumed non-decreasing either way.
  virtual bool monotone() const { return false; }
  // Whether rows run through the varlen kernels can cost more than the same rows dense (a
  // profile's varlen_fixed_ms): a micro-batch of padded rows run dense can then beat its
  // varlen form. False (the default) where the density rule alone prices varlen rows, which
  // then never cost more than dense ones.
  virtual bool varlen_costs_extra() const { return false; }
  // Whether a micro-batch of one sample is made as one dense row rather than one varlen
  // row (the same computation: a lone sample attends only to itself; the dense row pads
  // it to the seqlen multiple). True for measured profiles: their varlen price reads the
  // table at the same tokens in dense rows of the mean-square length (b/ρ rows of ρ·s),
  // for one sample padded by a few tokens a shape far from the one it is (T5-11B on the
  // H100 profile: an 8192-token sample with a 5-token target, its decoder read at 1.33
  // rows of 6144 tokens, 40.7 ms last-stage forward against its dense row's 30.2), and
  // they may add a fixed varlen cost. False (the default) where a lone varlen row costs
  // its dense row less the padding's attention (the analytic model).
  virtual bool lone_samples_dense() const { return false; }
  // Parameters + gradients + optimizer states held by `stage` for the whole run.
  virtual std::int64_t static_bytes(int stage) const = 0;
  // One copy of the stage's parameters at the device's element size: what a gradient
  // all-reduce sends and what an asynchronous schedule's stashed weight version holds.
  // Not derivable from static_bytes(), which may shard optimizer states (ZeRO) or add
  // the runtime's own bytes (a measured profile).
  virtual std::int64_t weight_bytes(int stage) const = 0;
  // One point-to-point message of `bytes` between neighbouring stages.
  virtual double p2p_ms(std::int64_t bytes) const;
  // Ring all-reduce of `bytes` over `replicas` data-parallel replicas (0 for 1 replica).
  virtual double allreduce_ms(std::int64_t bytes, int replicas) const;
  // "analytic:a100-40g" or "profile:<path>", for plan configs and reports.
  virtual std::string describe() const = 0;
  // One line when micro-batches up to these lengths (T5: encoder, decoder; GPT: dec 0)
  // lie past the lengths the model measured, so their costs are extrapolated; empty when
  // every length is covered (always, for the analytic model).
  virtual std::string extrapolation_warning(std::int64_t max_seqlen, std::int64_t max_dec_seqlen) const;

 protected:
  CostModel() = default;
};

// `spec` is "analytic:<device preset>", "a100-measured" (the DynaPipe authors' A100-40GB
// measurements of gpt-6.7b and t5-11b at tp 1, 2, 4, 8; docs/cost-model.md) or the path of
// a profile JSON (optionally written "profile:<path>"). Throws NotFound (unknown device,
// missing file), ParseError (malformed profile) or InvalidArgument (bad options; a profile
// of a different model or tensor-parallel degree; a100-measured with another model),
// naming the spec.
std::unique_ptr<CostModel> make_cost_model(const std::string& spec, const ModelSpec& model,
                                           const CostModelOptions& options);

// Throws InvalidArgument ("--tp must divide ...") unless tp >= 1 divides the model's heads
// and ffn width (Megatron splits both tp ways).
void check_tensor_parallel(const ModelSpec& model, int tp);
// The layer split `options` describe for `model`: options.layers, checked to be a contiguous
// split over options.num_stages stages, or the uniform one. Throws InvalidArgument.
std::vector<StageLayers> resolve_stage_layers(const ModelSpec& model, const CostModelOptions& options);

// Bytes of training state for `parameters` parameters: mixed precision (element size 2)
// holds 2-byte params and grads + 12 bytes of fp32 master copy and Adam m, v; fp32
// training (element size 4) holds 4 + 4 + 8 bytes of Adam m, v. The optimizer part is
// divided by zero_shards (ZeRO-1), rounded up.
std::int64_t model_state_bytes(std::int64_t parameters, int bytes_per_element, int zero_shards);

// The analytic model on an explicit device (e.g. a preset with changed calibration).
std::unique_ptr<CostModel> make_analytic_cost_model(const ModelSpec& model,
                                                    const DeviceSpec& device,
                                                    const CostModelOptions& options);

}  // namespace dynapipe
