// measure_profile() (dynapipe/runtime/profiler.h): walks the kinds, recompute modes and
// grid shapes, times each shape (warm-up, then medians) and measures its memory in one
// extra tracked run, skipping rows that outgrow the memory limit.
#include "dynapipe/runtime/profiler.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "dynapipe/core/error.h"
#include "dynapipe/core/statistics.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/device_spec.h"
#include "runtime/exec/host_allocator.h"
#include "runtime/profile/memory_tracker.h"
#include "runtime/profile/piece.h"
#include "runtime/stage_model.h"

namespace dynapipe::runtime {

void ProfilerOptions::validate(const ModelSpec& spec) const {
  auto lengths = [](const char* flag, const std::vector<std::int64_t>& values, std::int64_t max) {
    for (std::int64_t v : values) {
      if (v < 1 || v > max) {
        throw Error(ErrorKind::InvalidArgument,
                    cat(flag, " values must be in [1, ", max, "], got ", v));
      }
    }
    // The profile format needs two points per axis to interpolate.
    if (std::set<std::int64_t>(values.begin(), values.end()).size() < 2) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(flag, " must hold at least two distinct values, got '", join(values, ","), "'"));
    }
  };
  lengths("--batch-sizes", grid.batches, std::int64_t{1} << 20);
  lengths("--seqlens", grid.seqlens, spec.max_positions);
  if (spec.kind == ModelKind::T5) lengths("--dec-seqlens", grid.dec_seqlens, spec.max_positions);
  if (warmup < 0) throw Error(ErrorKind::InvalidArgument, cat("--warmup must be >= 0, got ", warmup));
  if (repeats < 1) throw Error(ErrorKind::InvalidArgument, cat("--repeats must be >= 1, got ", repeats));
  if (threads < 1) throw Error(ErrorKind::InvalidArgument, cat("--threads must be >= 1, got ", threads));
  if (memory_limit_bytes < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--memory-limit must be >= 0, got ", memory_limit_bytes, " bytes"));
  }
}

namespace profile {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// 0.1 µs: below timer noise, and keeps the JSON short.
double round_ms(double ms) { return std::round(ms * 1e4) / 1e4; }

// The shapes of one table, grouped in rows of equal (seqlen, dec_seqlen), batches rising.
using Row = std::pair<std::int64_t, std::int64_t>;
std::map<Row, std::vector<std::int64_t>> table_rows(ProfileLayerKind kind, const ModelSpec& spec,
                                                    const ProfileGrid& grid) {
  const bool t5 = spec.kind == ModelKind::T5;
  std::vector<std::int64_t> seqlens = grid.seqlens;
  std::vector<std::int64_t> decs{0};
  if (kind == ProfileLayerKind::Embedding && t5) {
    // The decoder embedding runs at dec_seqlen: one table covers both.
    seqlens.insert(seqlens.end(), grid.dec_seqlens.begin(), grid.dec_seqlens.end());
  } else if (kind == ProfileLayerKind::Head && t5) {
    seqlens = grid.dec_seqlens;  // keyed by the decoder length, written as seqlen
  } else if (kind == ProfileLayerKind::Decoder) {
    decs = grid.dec_seqlens;
  }
  std::set<std::int64_t> batches(grid.batches.begin(), grid.batches.end());
  std::map<Row, std::vector<std::int64_t>> rows;
  for (std::int64_t s : std::set<std::int64_t>(seqlens.begin(), seqlens.end())) {
    for (std::int64_t d : std::set<std::int64_t>(decs.begin(), decs.end())) {
      rows[{s, d}].assign(batches.begin(), batches.end());
    }
  }
  return rows;
}

std::vector<ProfileLayerKind> kinds_of(const ModelSpec& spec) {
  if (spec.kind == ModelKind::T5) {
    return {ProfileLayerKind::Embedding, ProfileLayerKind::Encoder, ProfileLayerKind::Decoder,
            ProfileLayerKind::Head};
  }
  return {ProfileLayerKind::Embedding, ProfileLayerKind::Layer, ProfileLayerKind::Head};
}

std::vector<Recompute> modes_of(ProfileLayerKind kind) {
  if (kind == ProfileLayerKind::Embedding || kind == ProfileLayerKind::Head) return {Recompute::None};
  return {Recompute::None, Recompute::Selective, Recompute::Full};
}

class Profiler {
 public:
  Profiler(const ModelSpec& spec, const ProfilerOptions& options, std::int64_t limit)
      : spec_(spec), options_(options), limit_(limit) {
    for (ProfileLayerKind kind : kinds_of(spec)) {
      std::size_t shapes = 0;
      for (const auto& [row, batches] : table_rows(kind, spec, options.grid)) shapes += batches.size();
      total_ += static_cast<int>(shapes * modes_of(kind).size());
    }
  }

  ProfileLayer measure_kind(ProfileLayerKind kind) {
    Piece piece(kind, spec_, options_.seed);
    ProfileLayer layer;
    layer.kind = kind;
    layer.parameter_bytes = piece.parameter_bytes();
    for (Recompute mode : modes_of(kind)) {
      auto& points = layer.points[static_cast<int>(mode)];
      for (const auto& [row, batches] : table_rows(kind, spec_, options_.grid)) {
        measure_row(piece, kind, mode, row, batches, points);
      }
    }
    return layer;
  }

 private:
  // Batches rise along a row; once one does not fit, the larger ones are skipped (the
  // profiled model treats a row's missing tail as out of memory).
  void measure_row(Piece& piece, ProfileLayerKind kind, Recompute mode, const Row& row,
                   const std::vector<std::int64_t>& batches, std::vector<ProfilePoint>& points) {
    // The row's last two measured points: memory is about linear in the batch, with an
    // intercept (e.g. the embedding's dense table gradient), so one point predicts nothing.
    std::optional<ProfilePoint> prev, last;
    bool out_of_memory = false;
    for (std::int64_t b : batches) {
      const Shape shape{b, row.first, row.second};
      const std::string what =
          cat(profile_layer_kind_name(kind), " ", recompute_name(mode), " b=", b, " s=", row.first,
              row.second > 0 ? cat(" d=", row.second) : std::string());
      if (!out_of_memory && prev && last) {
        auto total = [](const ProfilePoint& p) { return static_cast<double>(p.stored_bytes + p.peak_bytes); };
        const double slope = (total(*last) - total(*prev)) / static_cast<double>(last->batch - prev->batch);
        const double predicted = total(*last) + slope * static_cast<double>(b - last->batch);
        out_of_memory = predicted > static_cast<double>(limit_);
      }
      if (!out_of_memory) {
        ProfilePoint p = measure_shape(piece, shape, mode);
        if (p.stored_bytes + p.peak_bytes > limit_) {
          out_of_memory = true;
        } else {
          points.push_back(p);
          prev = std::exchange(last, p);
        }
      }
      ++done_;
      if (options_.progress) {
        options_.progress({done_, total_, out_of_memory ? what + " (over the memory limit, skipped)" : what});
      }
    }
  }

  ProfilePoint measure_shape(Piece& piece, const Shape& shape, Recompute mode) {
    piece.prepare(shape, mode);
    std::vector<double> fwd, bwd, bwd_input, bwd_weight;
    for (int i = 0; i < options_.warmup + options_.repeats; ++i) {
      const bool timed = i >= options_.warmup;
      piece.clear_input_grad();
      auto start = Clock::now();
      at::Tensor out = piece.forward();
      if (timed) fwd.push_back(ms_since(start));
      start = Clock::now();
      backward(out, piece.grad());
      if (timed) bwd.push_back(ms_since(start));
      out.reset();
      if (!options_.split_backward) continue;
      piece.clear_input_grad();
      start = Clock::now();
      out = piece.forward();
      if (timed) fwd.push_back(ms_since(start));
      start = Clock::now();
      DeferredWeightGrads deferred = backward_input(out, piece.grad());
      if (timed) bwd_input.push_back(ms_since(start));
      start = Clock::now();
      deferred.flush();
      if (timed) bwd_weight.push_back(ms_since(start));
    }
    ProfilePoint p;
    p.batch = shape.batch;
    p.seqlen = shape.seqlen;
    p.dec_seqlen = shape.dec_seqlen;
    p.fwd_ms = round_ms(median(fwd));
    p.bwd_ms = round_ms(median(bwd));
    if (options_.split_backward) {
      p.bwd_input_ms = round_ms(median(bwd_input));
      p.bwd_weight_ms = round_ms(median(bwd_weight));
    }
    measure_memory(piece, p);
    return p;
  }

  // One untimed forward + backward with the allocator tracked: stored = bytes still
  // allocated when forward returns (everything autograd keeps, plus the output); peak =
  // the most allocated at any moment of forward or backward, minus stored. Parameter
  // gradients exist already (warm-up), so only this run's temporaries count.
  void measure_memory(Piece& piece, ProfilePoint& p) {
    piece.clear_input_grad();
    tracker_.start();
    {
      at::Tensor out = piece.forward();
      p.stored_bytes = tracker_.current();
      backward(out, piece.grad());
      out.reset();
      piece.clear_input_grad();
    }
    tracker_.stop();
    p.peak_bytes = std::max<std::int64_t>(0, tracker_.peak() - p.stored_bytes);
  }

  const ModelSpec& spec_;
  const ProfilerOptions& options_;
  std::int64_t limit_;
  MemoryTracker tracker_;
  int done_ = 0, total_ = 0;
};

// Restores LibTorch's intra-op thread count when the measurement ends.
class ThreadsGuard {
 public:
  explicit ThreadsGuard(int threads) : previous_(at::get_num_threads()) { at::set_num_threads(threads); }
  ~ThreadsGuard() { at::set_num_threads(previous_); }
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;

 private:
  int previous_;
};

}  // namespace
}  // namespace profile

Profile measure_profile(const ModelSpec& spec, const ProfilerOptions& options) {
  options.validate(spec);
  Profile result;
  result.model = spec;
  DeviceSpec cpu = device_preset("cpu");
  // Only what the format stores; the analytic calibration is not a measurement.
  result.device.name = cpu.name;
  result.device.memory_bytes = options.memory_limit_bytes > 0 ? options.memory_limit_bytes : cpu.memory_bytes;
  result.device.link_bandwidth_gbs = cpu.link_bandwidth_gbs;
  result.device.link_latency_ms = cpu.link_latency_ms;
  result.device.allreduce_bandwidth_gbs = cpu.allreduce_bandwidth_gbs;
  result.device.bytes_per_element = 4;  // the runtime trains in fp32
  // As train keeps freed pages by default: time what it runs, not page faults (memory is
  // counted by the allocator hook, which this does not change).
  keep_freed_host_memory(true);
  {
    profile::ThreadsGuard threads(options.threads);
    profile::Profiler profiler(spec, options, result.device.memory_bytes);
    for (ProfileLayerKind kind : profile::kinds_of(spec)) result.layers.push_back(profiler.measure_kind(kind));
  }
  // What the memory limit left must still be a valid profile (two points per axis, ...).
  for (const ProfileLayer& layer : result.layers) {
    for (Recompute mode : profile::modes_of(layer.kind)) {
      const auto& points = layer.points[static_cast<int>(mode)];
      std::set<std::int64_t> batches, lengths;
      for (const ProfilePoint& p : points) {
        batches.insert(p.batch);
        lengths.insert(p.seqlen);
      }
      if (batches.size() < 2 || lengths.size() < 2) {
        throw Error(ErrorKind::InvalidArgument,
                    cat("--memory-limit ", bytes_to_gib(result.device.memory_bytes), " GiB leaves ",
                        profile_layer_kind_name(layer.kind), " (", recompute_name(mode), ") ",
                        points.size(), " shapes, too few for a profile (need two batch sizes and two "
                        "lengths that fit): raise it or shrink the grid"));
      }
    }
  }
  try {
    (void)parse_profile(profile_to_json(result), "measured profile");
  } catch (const Error& e) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--memory-limit ", bytes_to_gib(result.device.memory_bytes),
                    " GiB skips too many shapes for a usable profile (raise it or shrink the grid): ",
                    e.what()));
  }
  return result;
}

}  // namespace dynapipe::runtime
