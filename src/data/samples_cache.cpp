#include "dynapipe/data/samples_cache.h"

namespace dynapipe {
namespace {

bool same_limits(const TruncationLimits& a, const TruncationLimits& b) {
  return a.kind == b.kind && a.max_seqlen == b.max_seqlen &&
         a.effective_max_target_len() == b.effective_max_target_len();
}

}  // namespace

std::shared_ptr<const Dataset> SamplesCache::load(const std::string& path,
                                                  const TruncationLimits& limits) {
  // Held while reading: two threads asking for one file wait for one read.
  const std::lock_guard lock(mutex_);
  for (const Entry& entry : entries_) {
    if (entry.path == path && same_limits(entry.limits, limits)) return entry.dataset;
  }
  auto dataset = std::make_shared<const Dataset>(Dataset::load(path, limits));
  entries_.push_back({path, limits, dataset});
  return dataset;
}

std::size_t SamplesCache::reads() const {
  const std::lock_guard lock(mutex_);
  return entries_.size();
}

std::shared_ptr<const Dataset> load_samples(SamplesCache* cache, const std::string& path,
                                            const TruncationLimits& limits) {
  if (cache != nullptr) return cache->load(path, limits);
  return std::make_shared<const Dataset>(Dataset::load(path, limits));
}

}  // namespace dynapipe
