// Searches run ahead on a helper thread (searches_ahead.h).
#include "searches_ahead.h"

#include <algorithm>
#include <utility>

namespace dynapipe::planner_detail {

namespace {

// Every option but the bar (and the abandon flag, which only the helper sets).
bool same_but_bar(ReplicaSearch a, ReplicaSearch b) {
  a.beat_ms = b.beat_ms = 0;
  a.abandon = b.abandon = nullptr;
  return a == b;
}

}  // namespace

bool SearchesAhead::serves(const Search& queued, const Search& wanted) {
  if (queued.schedule != wanted.schedule || !same_but_bar(queued.how, wanted.how)) return false;
  // A higher bar serves (a quick search's only where its result shows no fall-back:
  // search()).
  const bool bar_serves = queued.how.beat_ms >= wanted.how.beat_ms;
  return bar_serves && queued.replicas == wanted.replicas;
}

void SearchesAhead::add(Search search) {
  {
    const std::lock_guard lock(mutex_);
    if (!helped_ || closed_) return;
    entries_.push_back({std::move(search), State::Queued, std::nullopt});
  }
  changed_.notify_all();
}

Choice SearchesAhead::search(const Search& wanted) {
  std::unique_lock lock(mutex_);
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].state == State::Taken || !serves(entries_[i].search, wanted)) continue;
    if (entries_[i].state == State::Queued) {  // not started: run it here, as one thread would
      entries_[i].state = State::Taken;
      break;
    }
    // Running on the helper: meanwhile the queued searches (the helper's next), in order.
    while (entries_[i].state != State::Done) {
      if (!run_next(lock)) changed_.wait(lock);
    }
    entries_[i].state = State::Taken;
    if (!entries_[i].result) break;  // it threw: run here, which throws as one thread would
    Choice found = std::move(*entries_[i].result);
    lock.unlock();
    // A quick search's finite bar also ends it where its own mode fits nothing (no
    // fall-back to the other modes): a result with a higher bar serves only where it ran
    // in that mode on every replica, which then fits.
    const bool fell_back = std::ranges::any_of(
        found.replicas, [&](const ReplicaChoice& r) { return r.best.recompute != wanted.how.recompute; });
    if (wanted.how.quick && entries_[i].search.how.beat_ms != wanted.how.beat_ms && fell_back) {
      return run_(wanted);
    }
    // Nothing below the caller's bar: what search_replicas() returns for that.
    if (found.replicas.empty() || found.est_ms >= wanted.how.beat_ms) return nothing_found(wanted.schedule);
    return found;
  }
  lock.unlock();
  return run_(wanted);
}

bool SearchesAhead::run_next(std::unique_lock<std::mutex>& lock) {
  const auto queued = std::ranges::find_if(entries_, [](const Entry& e) { return e.state == State::Queued; });
  if (queued == entries_.end()) return false;
  const std::size_t index = static_cast<std::size_t>(queued - entries_.begin());
  queued->state = State::Running;
  Search search = queued->search;
  search.how.abandon = &closed_;  // dropped at close(): ends early then
  lock.unlock();
  std::optional<Choice> result;
  try {
    result = run_(search);
  } catch (...) {
    // Whoever asks for it runs it again and meets the error itself.
  }
  lock.lock();
  // entries_ may have grown (and moved) meanwhile: the entry by its index. An abandoned
  // search's result is no result.
  if (closed_) result.reset();
  entries_[index].result = std::move(result);
  entries_[index].state = State::Done;
  changed_.notify_all();
  return true;
}

void SearchesAhead::serve() {
  std::unique_lock lock(mutex_);
  while (!closed_) {
    if (!run_next(lock)) changed_.wait(lock);
  }
}

void SearchesAhead::serve_queued(const std::function<bool()>& keep_going) {
  std::unique_lock lock(mutex_);
  while (!closed_ && keep_going() && run_next(lock)) {
  }
}

void SearchesAhead::drop_queued() {
  {
    const std::lock_guard lock(mutex_);
    for (Entry& e : entries_) {
      if (e.state == State::Queued) e.state = State::Taken;
    }
  }
  changed_.notify_all();
}

void SearchesAhead::close() {
  {
    const std::lock_guard lock(mutex_);
    closed_ = true;
  }
  changed_.notify_all();
}

}  // namespace dynapipe::planner_detail
