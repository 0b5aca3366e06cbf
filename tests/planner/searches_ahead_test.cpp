// SearchesAhead (src/planner/searches_ahead.h): a search the caller asks for is answered
// with what running it would return, whichever thread ran it and whatever bar it ran with.
#include "searches_ahead.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <future>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace dynapipe::planner_detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A search of one replica of `samples` micro-batches (each with its own id).
SearchCall call(int samples, ReplicaSearch how = {}, ScheduleKind schedule = ScheduleKind::Auto) {
  std::vector<MicroBatch> replica(static_cast<std::size_t>(samples));
  for (int i = 0; i < samples; ++i) replica[static_cast<std::size_t>(i)].id = i;
  return {{replica}, schedule, how};
}

// What the stand-in search finds: est_ms, or nothing where est_ms is not below the bar.
Choice found(double est_ms, const SearchCall& s) {
  Choice c;
  c.schedule = s.schedule;
  if (!(est_ms < s.how.beat_ms)) {
    c.est_ms = kInf;
    return c;
  }
  c.replicas.emplace_back();
  c.est_ms = est_ms;
  return c;
}

// A stand-in search that counts its runs and finds est_ms.
auto counted(std::atomic<int>& runs, double est_ms) {
  return [&runs, est_ms](const SearchCall& s) {
    ++runs;
    return found(est_ms, s);
  };
}

TEST(SearchesAheadTest, ASearchNeverQueuedRunsOnTheCaller) {
  std::atomic<int> runs{0};
  std::thread::id ran_on;
  SearchesAhead ahead([&](const SearchCall& s) {
    ++runs;
    ran_on = std::this_thread::get_id();
    return found(5, s);
  }, true);
  const Choice c = ahead.search(call(3));
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(c.est_ms, 5);
}

// Without a helper (one thread) add() queues nothing: a search runs when asked for.
TEST(SearchesAheadTest, WithoutAHelperNothingIsQueued) {
  std::atomic<int> runs{0};
  SearchesAhead ahead(counted(runs, 5), false);
  EXPECT_FALSE(ahead.helped());
  ahead.add(call(3));
  std::thread helper([&] { ahead.serve(); });  // a serve() anyway finds nothing to run
  ahead.close();
  helper.join();
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(ahead.search(call(3)).est_ms, 5);
  EXPECT_EQ(runs, 1);
}

// Where no helper started it, a queued search runs once, on the caller, when asked for;
// serve() after close() starts nothing.
TEST(SearchesAheadTest, AQueuedSearchNoHelperStartedRunsOnTheCallerOnce) {
  std::atomic<int> runs{0};
  SearchesAhead ahead(counted(runs, 5), true);
  ahead.add(call(3));
  ahead.add(call(4));  // never asked for
  EXPECT_EQ(ahead.search(call(3)).est_ms, 5);
  EXPECT_EQ(runs, 1);
  ahead.close();
  ahead.serve();
  EXPECT_EQ(runs, 1);
}

// The helper runs queued searches in order; the caller gets the helper's result, once,
// and a repeat runs again.
TEST(SearchesAheadTest, TheHelpersResultServesTheCaller) {
  std::atomic<int> runs{0};
  std::promise<void> first_done;
  std::thread::id helper_id;
  SearchesAhead ahead([&](const SearchCall& s) {
    Choice c = found(static_cast<double>(s.replicas.front().size()), s);
    if (++runs == 1) {
      helper_id = std::this_thread::get_id();
      first_done.set_value();
    }
    return c;
  }, true);
  std::thread helper([&] { ahead.serve(); });
  ahead.add(call(3));
  first_done.get_future().wait();
  EXPECT_EQ(ahead.search(call(3)).est_ms, 3);
  EXPECT_EQ(runs, 1);
  EXPECT_NE(helper_id, std::this_thread::get_id());
  EXPECT_EQ(ahead.search(call(3)).est_ms, 3);  // taken already: run again
  EXPECT_EQ(runs, 2);
  ahead.close();
  helper.join();
}

// A full search run ahead with a higher bar answers a lower one: a result at or above the
// lower bar is "nothing found", as the search with that bar returns.
TEST(SearchesAheadTest, AFullSearchWithAHigherBarServesALowerOne) {
  for (const double est_ms : {3.0, 5.0, 7.0, 12.0}) {
    std::atomic<int> runs{0};
    std::promise<void> done;
    SearchesAhead ahead([&](const SearchCall& s) {
      ++runs;
      Choice c = found(est_ms, s);
      if (runs == 1) done.set_value();
      return c;
    }, true);
    std::thread helper([&] { ahead.serve(); });
    ahead.add(call(3, {.beat_ms = 10}));
    done.get_future().wait();
    const Choice c = ahead.search(call(3, {.beat_ms = 5}));
    const Choice direct = found(est_ms, call(3, {.beat_ms = 5}));
    EXPECT_EQ(runs, 1) << est_ms;
    EXPECT_EQ(c.est_ms, direct.est_ms) << est_ms;
    EXPECT_EQ(c.replicas.size(), direct.replicas.size()) << est_ms;
    EXPECT_EQ(c.schedule, direct.schedule) << est_ms;
    ahead.close();
    helper.join();
  }
}

// A quick search run ahead with a higher bar answers a lower one only where it ran in the
// mode asked for on every replica: a finite bar also ends a quick search where that mode fits
// nothing, so a result that fell back to another mode is not what the caller's search
// returns, and the caller runs it.
TEST(SearchesAheadTest, AQuickSearchWithAHigherBarServesOnlyInItsOwnMode) {
  for (const Recompute ran_in : {Recompute::Selective, Recompute::Full}) {
    std::atomic<int> runs{0};
    std::promise<void> done;
    SearchesAhead ahead([&](const SearchCall& s) {
      Choice c = found(++runs == 1 ? 3 : 4, s);
      for (ReplicaChoice& r : c.replicas) r.best.recompute = ran_in;
      if (runs == 1) done.set_value();
      return c;
    }, true);
    std::thread helper([&] { ahead.serve(); });
    ahead.add(call(3, {.quick = true, .recompute = Recompute::Selective}));
    done.get_future().wait();
    const Choice c = ahead.search(call(3, {.quick = true, .recompute = Recompute::Selective, .beat_ms = 5}));
    const bool own_mode = ran_in == Recompute::Selective;
    EXPECT_EQ(runs, own_mode ? 1 : 2) << recompute_name(ran_in);
    EXPECT_EQ(c.est_ms, own_mode ? 3 : 4) << recompute_name(ran_in);
    ahead.close();
    helper.join();
  }
}

// Not served by a search whose result may differ: a lower bar, other options,
// micro-batches or schedule.
TEST(SearchesAheadTest, OnlyASearchWithTheSameResultServes) {
  const SearchCall queued_full = call(3, {.beat_ms = 5});
  const SearchCall queued_quick = call(3, {.quick = true, .beat_ms = 10});
  const std::vector<std::pair<SearchCall, SearchCall>> cases = {
      {queued_full, call(3, {.beat_ms = 6})},
      {queued_quick, call(3, {.quick = true, .beat_ms = 11})},
      {queued_quick, call(3, {.quick = true, .permute = true, .beat_ms = 10})},
      {queued_full, call(4, {.beat_ms = 5})},
      {queued_full, call(3, {.beat_ms = 5}, ScheduleKind::Zb1p)},
  };
  for (std::size_t k = 0; k < cases.size(); ++k) {
    std::atomic<int> runs{0};
    std::promise<void> done;
    SearchesAhead ahead([&](const SearchCall& s) {
      if (++runs == 1) {
        Choice c = found(1, s);
        done.set_value();
        return c;
      }
      return found(2, s);
    }, true);
    std::thread helper([&] { ahead.serve(); });
    ahead.add(cases[k].first);
    done.get_future().wait();
    EXPECT_EQ(ahead.search(cases[k].second).est_ms, 2) << "case " << k;
    EXPECT_EQ(runs, 2) << "case " << k;
    ahead.close();
    helper.join();
  }
}

// A search that threw on the helper runs again on the caller, whose error it then is.
TEST(SearchesAheadTest, AnErrorOnTheHelperIsTheCallersOwn) {
  std::atomic<int> runs{0};
  std::promise<void> done;
  SearchesAhead ahead([&](const SearchCall&) -> Choice {
    const int run = ++runs;
    if (run == 1) done.set_value();
    throw std::runtime_error("run " + std::to_string(run));
  }, true);
  std::thread helper([&] { ahead.serve(); });
  ahead.add(call(3));
  done.get_future().wait();
  try {
    ahead.search(call(3));
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "run 2");
  }
  ahead.close();
  helper.join();
}

// While the helper runs the search the caller asked for, the caller runs the queued ones;
// after close() nothing more is run ahead.
TEST(SearchesAheadTest, TheCallerRunsQueuedSearchesWhileItWaits) {
  std::promise<void> helper_started, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> runs{0};
  std::thread::id second_ran_on;
  SearchesAhead ahead([&](const SearchCall& s) {
    ++runs;
    const std::size_t n = s.replicas.front().size();
    if (n == 3) {
      helper_started.set_value();
      released.wait();
    }
    if (n == 4) {
      second_ran_on = std::this_thread::get_id();
      release.set_value();  // the helper's search ends once the caller has run this one
    }
    return found(static_cast<double>(n), s);
  }, true);
  std::thread helper([&] { ahead.serve(); });
  ahead.add(call(3));
  helper_started.get_future().wait();
  ahead.add(call(4));
  EXPECT_EQ(ahead.search(call(3)).est_ms, 3);
  EXPECT_EQ(second_ran_on, std::this_thread::get_id());
  EXPECT_EQ(ahead.search(call(4)).est_ms, 4);  // the caller's run served it
  EXPECT_EQ(runs, 2);
  ahead.close();
  helper.join();
  ahead.add(call(5));  // after close(): never run ahead
  ahead.serve();       // returns at once
  EXPECT_EQ(runs, 2);
}

// serve_queued() runs what is queued, in queue order, on its thread, and returns when
// nothing is: its results serve the caller as serve()'s do.
TEST(SearchesAheadTest, ServeQueuedRunsTheQueueAndReturns) {
  std::vector<std::size_t> order;
  std::thread::id ran_on;
  SearchesAhead ahead([&](const SearchCall& s) {
    order.push_back(s.replicas.front().size());
    ran_on = std::this_thread::get_id();
    return found(static_cast<double>(s.replicas.front().size()), s);
  }, true);
  ahead.add(call(4));
  ahead.add(call(3));
  std::thread gap([&] { ahead.serve_queued([] { return true; }); });
  gap.join();
  EXPECT_EQ(order, (std::vector<std::size_t>{4, 3}));
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_EQ(ahead.search(call(3)).est_ms, 3);  // the result from the gap, not run again
  EXPECT_EQ(ahead.search(call(4, {.beat_ms = 2})).replicas.size(), 0u);  // 4 is not below 2
  EXPECT_EQ(order.size(), 2u);
  ahead.close();
}

// drop_queued(): a search not yet started is no longer run ahead (serve() starts with the
// ones queued later); the caller who asks for it runs it, once.
TEST(SearchesAheadTest, ADroppedSearchRunsOnlyOnTheCaller) {
  std::vector<std::size_t> order;
  std::mutex order_mutex;
  std::promise<void> later_ran;
  SearchesAhead ahead([&](const SearchCall& s) {
    const std::size_t n = s.replicas.front().size();
    {
      const std::lock_guard lock(order_mutex);
      order.push_back(n);
    }
    if (n == 5) later_ran.set_value();
    return found(static_cast<double>(n), s);
  }, true);
  ahead.add(call(3));
  ahead.drop_queued();
  ahead.add(call(5));
  std::thread helper([&] { ahead.serve(); });
  later_ran.get_future().wait();
  ahead.close();
  helper.join();
  EXPECT_EQ(order, (std::vector<std::size_t>{5}));
  EXPECT_EQ(ahead.search(call(3)).est_ms, 3);
  EXPECT_EQ(order, (std::vector<std::size_t>{5, 3}));
}

// serve_queued() asks keep_going() before each search: once it says no, what is left stays
// queued (and runs on the caller when asked for).
TEST(SearchesAheadTest, ServeQueuedStopsWhenKeepGoingSaysNo) {
  std::atomic<int> runs{0};
  SearchesAhead ahead(counted(runs, 5), true);
  ahead.add(call(3));
  ahead.add(call(4));
  int asked = 0;
  std::thread gap([&] { ahead.serve_queued([&] { return asked++ == 0; }); });
  gap.join();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(ahead.search(call(4)).est_ms, 5);  // still queued: run here
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(ahead.search(call(3)).est_ms, 5);  // the gap's result
  EXPECT_EQ(runs, 2);
  ahead.close();
}

}  // namespace
}  // namespace dynapipe::planner_detail
