// Schedule searches that choose() will likely need later, run ahead on a thread that would
// otherwise idle: after rank_dp_plans() choose() runs its steps one after another, each
// step's bar set by the steps before it, while the second core waits. Some of its later
// searches do not depend on those steps (a baseline cut's search in its own mode has no
// bar) or only through the plan so far, which mostly stays (its random orders, and its
// critical-path search, whose bar can only fall): those are queued here when choose() can
// tell it will likely need them, and a helper thread runs them in queue order while
// choose() goes on.
//
// The plan is the same for any thread count: a search choose() asks for is answered with
// exactly what search_replicas() returns for it. Where no helper has started the queued
// search, the caller runs it itself, as on one thread; where the helper ran it with a
// higher bar (SearchOptions::beat_ms), a result at or above the caller's bar is the "found
// nothing" result the caller's own search returns (schedule_search.h: below the bar the
// winner is the same). A quick search's finite bar also stops its fall-back to other modes:
// its result serves a lower bar only where it ran in the mode asked for. A queued search
// that threw is run again by the caller.
//
// rank_dp_plans() queues the first two already, for the thread that ranked the
// baselines' cuts, which runs them with serve_queued() when that work ends; what no thread
// started by the end of the ranking is dropped (drop_queued()) and left to the steps.
//
//   SearchesAhead ahead([&](const SearchesAhead::Search& s) { return run(s); }, threads > 1);
//   run_indexed(2, threads, [&](std::size_t i) { i == 0 ? steps(ahead) : ahead.serve(); });
//   // steps(): ahead.add(s) where s will likely be needed; later ahead.search(s); and
//   // ahead.close() before returning (SearchesAhead::Closer), else serve() never returns.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "planner_impl.h"

namespace dynapipe::planner_detail {

class SearchesAhead {
 public:
  using Search = SearchCall;
  // run: the search itself (search_replicas()); called on the caller's or the helper's
  // thread, so it must be safe to call from two threads at once. helped: whether a helper
  // will serve(); without one add() queues nothing (and search() just runs).
  SearchesAhead(std::function<Choice(const Search&)> run, bool helped)
      : run_(std::move(run)), helped_(helped) {}

  bool helped() const { return helped_; }
  // Queues `search` for the helper. Only an add()ed search is ever run ahead.
  void add(Search search);
  // The result of run(search): the helper's, where it started a queued search that serves
  // this one (waiting for it to end), else run here.
  Choice search(const Search& search);
  // The helper's loop: runs queued searches in queue order until close().
  void serve();
  // Runs the queued searches, in queue order, while keep_going() holds before each and
  // one is queued, and returns: for a thread that has a gap before serve() starts
  // (rank_dp_plans()' baseline task).
  void serve_queued(const std::function<bool()>& keep_going);
  // Leaves every search not yet started to whoever asks for it (who runs it then, as
  // search() does with any queued one), so that serve() starts with later ones.
  void drop_queued();
  // No queued search starts from now on; serve() returns once the one it runs ends.
  void close();

  // Closes `ahead` when it goes out of scope, however the scope ends.
  struct Closer {
    SearchesAhead& ahead;
    ~Closer() { ahead.close(); }
  };

 private:
  enum class State { Queued, Running, Done, Taken };
  struct Entry {
    Search search;
    State state = State::Queued;
    std::optional<Choice> result;  // Done: the result, or none where it threw
  };

  // Whether `queued`'s result gives `wanted`'s (see the file comment).
  static bool serves(const Search& queued, const Search& wanted);
  // Runs the first queued search, if any (the lock released meanwhile); false: none queued.
  bool run_next(std::unique_lock<std::mutex>& lock);

  std::function<Choice(const Search&)> run_;
  const bool helped_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Entry> entries_;  // in queue order; never shrinks while serve() runs
  // Atomic: the searches running ahead read it without the lock, to end early at close()
  // (SearchOptions::abandon).
  std::atomic<bool> closed_{false};
};

}  // namespace dynapipe::planner_detail
