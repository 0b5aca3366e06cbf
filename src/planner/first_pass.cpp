// The first pass of rank_dp_plans(): one DP per planned rule and varlen order, on one
// thread or side by side, with the same result.
#include "planner_impl.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <future>
#include <limits>

#include "dynapipe/core/parallel.h"

namespace dynapipe {

using namespace planner_detail;

namespace {

// The interleaved rule is cut in the later varlen orders only where its sorted-order cut's
// quick estimate came within this factor of that order's best.
constexpr double kInterleavedWindow = 1.02;

}  // namespace

// The DPs share segment costs by sequence (the sorted order's rules one cache, the packed
// rows' with and without the row capacity another), so on several threads the two groups
// run side by side, `beside` as a third task (on the thread that ends its group first); the
// results are assembled in plan order, as one thread makes them, so the plan is the same
// for any thread count. The packed group's cache then joins `cache`, which the later steps
// use. `then` takes the results on the thread that ended the second group, while `beside`
// may still run.
void Planner::Impl::first_dp_pass(const GlobalBatch& batch,
                                  const std::vector<std::pair<BatchingOptions, ScheduleKind>>& plans,
                                  int threads, BatchingCache& cache, const std::function<void()>& beside,
                                  const std::function<void(planner_detail::FirstPass)>& then) const {
  const Impl& m = *this;
  const std::size_t rules = 1 + m.more_targets.size();
  // On one thread both groups share one cache and one list, as the DPs ran before.
  const bool side_by_side = threads > 1;
  // Per group, its cuts in plan order (a group's searches find its own repeats, as
  // same_quick_search() does over `ranked`); per plan, its entry, if it ran and fit.
  std::array<std::vector<Choice>, 2> found;
  auto found_list = [&](std::size_t group) -> std::vector<Choice>& { return found[side_by_side ? group : 0]; };
  std::vector<std::optional<std::size_t>> found_at(plans.size());
  // Quick estimates of the sorted order's cuts, one per rule (plans[0 .. rules)).
  std::vector<double> sorted_ms(rules, std::numeric_limits<double>::infinity());
  std::vector<bool> sorted_own_mode(rules, true);
  BatchingCache packed_cache;
  auto run_plan = [&](std::size_t k, std::size_t group, BatchingCache* group_cache) {
    std::vector<Choice>& mine = found_list(group);
    std::optional<Choice> c;
    if (k == 0) {  // the first plan's errors are the planner's (e.g. a sample that fits nowhere)
      c = m.search(batch, plans[0].first, plans[0].second, true, group_cache, &mine);
    } else {
      c = unless_ruled_out(
          [&] { return m.search(batch, plans[k].first, plans[k].second, true, group_cache, &mine); });
    }
    if (!c) return;
    found_at[k] = mine.size();
    mine.push_back(std::move(*c));
  };
  std::promise<void> sorted_done;
  const std::shared_future<void> sorted_ready = sorted_done.get_future().share();
  auto sorted_group = [&] {
    struct Done {  // set however the group ends: the other group may wait for it
      std::promise<void>& done;
      ~Done() { done.set_value(); }
    } done{sorted_done};
    for (std::size_t k = 0; k < std::min(rules, plans.size()); ++k) {
      run_plan(k, 0, &cache);
      if (found_at[k]) {
        const Choice& c = found_list(0)[*found_at[k]];
        sorted_ms[k] = c.est_ms;
        sorted_own_mode[k] = runs_in_own_mode(c);
      }
    }
  };
  auto interleaved_later = [&](std::size_t k) {
    return k % rules != 0 && plans[k].second == ScheduleKind::Interleaved;
  };
  // The packed group's DPs; side by side the interleaved rule's last, so that its wait for
  // the sorted group's estimates comes when there is least left to do.
  std::vector<std::size_t> packed_plans;
  for (std::size_t k = rules; k < plans.size(); ++k) {
    if (!side_by_side || !interleaved_later(k)) packed_plans.push_back(k);
  }
  for (std::size_t k = rules; k < plans.size(); ++k) {
    if (side_by_side && interleaved_later(k)) packed_plans.push_back(k);
  }
  auto packed_group = [&] {
    for (std::size_t k : packed_plans) {
      if (interleaved_later(k)) {
        // The interleaved rule's DPs cost the most of the later ones (a memory rule of its
        // own: T5-11B pp 8 short256, ~15% of a plan). Where interleaving lost clearly on
        // the sorted order, skipping them left every issue-8 point's plan as it was. (Not
        // where that cut's own mode fit no schedule: its estimate in a heavier mode says
        // little of what its head-and-tail form, below, runs.)
        sorted_ready.wait();
        const double best_sorted = *std::min_element(sorted_ms.begin(), sorted_ms.end());
        if (sorted_own_mode[k % rules] && !(sorted_ms[k % rules] <= best_sorted * kInterleavedWindow)) {
          continue;  // left out: found_at[k] stays empty
        }
      }
      run_plan(k, 1, side_by_side ? &packed_cache : &cache);
    }
  };
  // Assembles the results in plan order and hands them to `then`.
  auto finish = [&] {
    if (side_by_side) cache.absorb(std::move(packed_cache));
    FirstPass out;
    out.rules = rules;
    std::vector<Choice>& ranked = out.ranked;
    std::vector<std::size_t>& best_of_order = out.best_of_order;
    std::vector<std::size_t>& rule_of = out.rule_of;
    std::vector<std::size_t>& order_of = out.order_of;
    ranked.push_back(std::move(found[0][*found_at[0]]));
    best_of_order = rule_of = order_of = {0};
    for (std::size_t k = 1; k < plans.size(); ++k) {
      if (!found_at[k]) continue;  // skipped or ruled out
      const bool new_order = plans[k].first.varlen_order != plans[k - 1].first.varlen_order ||
                             plans[k].first.varlen_row_capacity != plans[k - 1].first.varlen_row_capacity;
      ranked.push_back(std::move(found_list(k < rules ? 0 : 1)[*found_at[k]]));
      rule_of.push_back(k % rules);
      if (new_order) {
        best_of_order.push_back(ranked.size() - 1);
      } else if (ranked.back().est_ms < ranked[best_of_order.back()].est_ms) {
        best_of_order.back() = ranked.size() - 1;
      }
      order_of.push_back(best_of_order.size() - 1);
    }
    then(std::move(out));
  };
  if (!side_by_side) {  // in order: the groups, then the steps, then `beside`
    sorted_group();
    packed_group();
    finish();
    if (beside) beside();
    return;
  }
  // The group that ends second finishes, where neither failed.
  std::atomic<int> groups_left{2};
  std::atomic<bool> group_failed{false};
  auto group = [&](const std::function<void()>& run) {
    try {
      run();
    } catch (...) {
      group_failed = true;
      --groups_left;
      throw;
    }
    if (--groups_left == 0 && !group_failed) finish();
  };
  const std::vector<std::exception_ptr> errors = run_indexed(beside ? 3 : 2, threads, [&](std::size_t g) {
    if (g == 0) group(sorted_group);
    if (g == 1) group(packed_group);
    if (g == 2) beside();
  });
  // The groups' errors first (the first plan's are the planner's), then the steps', then
  // `beside`'s, as one thread meets them.
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace dynapipe
