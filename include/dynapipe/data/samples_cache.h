// SamplesCache: each samples file read once per command. `plan` and `simulate` need one
// file's samples for the layer split, the global batches and packing-megatron's rows-based
// batches, `tune` for the split and its grid; reading 500,000 samples takes ~1.5 s on a
// 2-vCPU VM, so a cache serves every later load of the same path under the same limits.
//
// A file that changes on disk while a command runs is not read again: one command plans
// on one snapshot of its samples.
//
// Thread-safety: load() may be called concurrently; the datasets are immutable.
//
//   SamplesCache samples;
//   std::shared_ptr<const Dataset> data = samples.load(config.samples_path, limits);
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dynapipe/data/dataset.h"
#include "dynapipe/data/truncation.h"

namespace dynapipe {

class SamplesCache {
 public:
  // Dataset::load(path, limits) on the first call for this path and these limits, the same
  // dataset after that. Throws what Dataset::load() throws (and reads again next time).
  std::shared_ptr<const Dataset> load(const std::string& path, const TruncationLimits& limits);

  // How many files were read (distinct path and limits).
  std::size_t reads() const;

 private:
  struct Entry {
    std::string path;
    TruncationLimits limits;
    std::shared_ptr<const Dataset> dataset;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
};

// Dataset::load() through `cache`, or straight from the file when it is null.
std::shared_ptr<const Dataset> load_samples(SamplesCache* cache, const std::string& path,
                                            const TruncationLimits& limits);

}  // namespace dynapipe
