// ReplicaRouter: least-load routing stays balanced under skewed load (the
// bound of replica_router.h), prefix affinity keeps a shared first block on
// one replica within its slack, and replicas that do not serve get nothing.
#include "coordinator/serving/replica_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace tessera {
namespace {

constexpr int64_t kBlock = 4;

std::vector<ReplicaLoad> Ready(int n) {
  std::vector<ReplicaLoad> loads(static_cast<size_t>(n));
  for (ReplicaLoad& l : loads) l.ready = l.accepting = true;
  return loads;
}

int64_t Spread(const std::vector<ReplicaLoad>& loads) {
  auto [lo, hi] = std::minmax_element(loads.begin(), loads.end(),
                                      [](const ReplicaLoad& a, const ReplicaLoad& b) {
                                        return a.outstanding_tokens < b.outstanding_tokens;
                                      });
  return hi->outstanding_tokens - lo->outstanding_tokens;
}

// Requests of 1..kMaxCost tokens arrive faster than 4 replicas serving at
// 1x, 2x, 4x and 8x drain them; after every decision the outstanding tokens
// of any two replicas differ by at most the largest request plus the largest
// drain between two arrivals (the router's bound with no affinity: R).
TEST(ReplicaRouter, SkewedLoadStaysBalancedWithinTheLargestRequest) {
  RouterOptions o;
  o.block_size = kBlock;
  o.affinity_slack_tokens = 0;  // no affinity: the bound is R
  ReplicaRouter router(o);
  std::vector<ReplicaLoad> loads = Ready(4);
  const int64_t rates[] = {1, 2, 4, 8};
  constexpr int64_t kMaxCost = 64;
  constexpr int64_t kTicks = 3;  // drain steps per arrival
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> cost(1, kMaxCost);
  std::vector<int> routed(4, 0);
  int64_t worst = 0;
  for (int step = 0; step < 20000; ++step) {
    const int64_t c = cost(rng);
    const std::vector<int32_t> prompt(static_cast<size_t>(c % 7 + 1), static_cast<int32_t>(step));
    const std::vector<int> order = router.Order(prompt, loads);
    ASSERT_EQ(order.size(), 4u);
    loads[static_cast<size_t>(order[0])].outstanding_tokens += c;
    ++routed[static_cast<size_t>(order[0])];
    worst = std::max(worst, Spread(loads));
    ASSERT_LE(Spread(loads), kMaxCost + kTicks * rates[3]) << "step " << step;
    for (size_t r = 0; r < 4; ++r)
      loads[r].outstanding_tokens =
          std::max<int64_t>(0, loads[r].outstanding_tokens - rates[r] * kTicks);
  }
  // The fast replicas take more of the requests, the slow one still some.
  EXPECT_GT(routed[3], routed[0]);
  EXPECT_GT(routed[0], 0);
  std::printf("worst spread %lld tokens (bound %lld); routed %d %d %d %d\n",
              static_cast<long long>(worst), static_cast<long long>(kMaxCost + kTicks * rates[3]),
              routed[0], routed[1], routed[2], routed[3]);
}

TEST(ReplicaRouter, TiesGoToTheMostFreeKvBlocksThenInTurn) {
  ReplicaRouter router(RouterOptions{});
  std::vector<ReplicaLoad> loads = Ready(3);
  loads[0].free_kv_blocks = 5;
  loads[1].free_kv_blocks = 9;
  loads[2].free_kv_blocks = 9;
  EXPECT_EQ(router.Order({1, 2, 3}, loads), (std::vector<int>{1, 2, 0}));  // turn starts at 0
  EXPECT_EQ(router.Order({1, 2, 3}, loads), (std::vector<int>{1, 2, 0}));  // at 1
  EXPECT_EQ(router.Order({1, 2, 3}, loads), (std::vector<int>{2, 1, 0}));  // at 2
  loads[1].outstanding_tokens = 1;
  EXPECT_EQ(router.Order({1, 2, 3}, loads), (std::vector<int>{2, 0, 1}));
  // Equal loads: one request at a time goes round-robin.
  std::vector<ReplicaLoad> idle = Ready(3);
  std::vector<int> count(3, 0);
  for (int i = 0; i < 30; ++i) ++count[static_cast<size_t>(router.Order({1}, idle)[0])];
  EXPECT_EQ(count, (std::vector<int>{10, 10, 10}));
}

TEST(ReplicaRouter, OnlyServingAcceptingReplicasUnlessNoneServes) {
  ReplicaRouter router(RouterOptions{});
  std::vector<ReplicaLoad> loads = Ready(3);
  loads[0].ready = false;      // re-planning
  loads[2].accepting = false;  // drained by the admin
  EXPECT_EQ(router.Order({1}, loads), (std::vector<int>{1}));
  loads[1].ready = false;  // nobody serves: those that accept queue the request
  std::vector<int> order = router.Order({1}, loads);
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
  loads[0].accepting = loads[1].accepting = false;
  EXPECT_TRUE(router.Order({1}, loads).empty());
}

// Requests sharing their first block go to the replica the first went to
// while it is within the slack of the least loaded; beyond it, to the least
// loaded (and the spread stays within slack + R); a group moves only when
// its replica runs past the slack.
TEST(ReplicaRouter, PrefixAffinityWithinTheSlack) {
  RouterOptions o;
  o.block_size = kBlock;
  o.model_id = "m";
  o.affinity_slack_tokens = 100;
  ReplicaRouter router(o);
  std::vector<ReplicaLoad> loads = Ready(3);
  const std::vector<int32_t> a = {1, 2, 3, 4, 50, 51};  // first block 1 2 3 4
  const std::vector<int32_t> a2 = {1, 2, 3, 4, 60};     // same first block
  const std::vector<int32_t> b = {9, 9, 9, 9, 1};
  const std::vector<int32_t> short_prompt = {1, 2, 3};  // less than a block: no affinity

  loads[0].outstanding_tokens = 10;
  loads[1].outstanding_tokens = 0;
  loads[2].outstanding_tokens = 5;
  int first = router.Order(a, loads)[0];
  EXPECT_EQ(first, 1);
  router.Routed(a, first);
  loads[1].outstanding_tokens += 60;  // replica 1 now 55 above the least loaded (5)
  EXPECT_EQ(router.Order(a2, loads)[0], 1) << "within the slack: affinity";
  EXPECT_EQ(router.Order(b, loads)[0], 2) << "another prefix: least loaded";
  EXPECT_EQ(router.Order(short_prompt, loads)[0], 2);
  loads[1].outstanding_tokens += 60;  // 115 above: beyond the slack
  EXPECT_EQ(router.Order(a2, loads)[0], 2) << "affinity must not unbalance the load";
  router.Forget(1);
  loads[1].outstanding_tokens = 6;
  EXPECT_EQ(router.Order(a2, loads)[0], 2) << "forgotten: least loaded";

  // A request's key computed once (ReplicaSet::Submit) routes as its prompt
  // does: the same key for the same first block, none below a block.
  EXPECT_EQ(router.Key(a), router.Key(a2));
  EXPECT_NE(router.Key(a), router.Key(b));
  EXPECT_FALSE(router.Key(short_prompt).has_value());
  router.RoutedFor(router.Key(b), 0);
  loads[0].outstanding_tokens = 7;  // 2 above the least loaded (replica 2: 5)
  EXPECT_EQ(router.OrderFor(router.Key(b), loads)[0], 0) << "affinity through the key";
  EXPECT_EQ(router.Order(b, loads), router.OrderFor(router.Key(b), loads));
  RouterOptions off = o;
  off.affinity_slack_tokens = 0;
  EXPECT_FALSE(ReplicaRouter(off).Key(a).has_value()) << "no affinity: no key to compute";

  // Under a stream of requests from 5 prefix groups the spread stays within
  // slack + R, and most requests of a group land on one replica.
  ReplicaRouter r2(o);
  std::vector<ReplicaLoad> l2 = Ready(3);
  std::mt19937 rng(3);
  constexpr int64_t kCost = 20;
  std::vector<int> last(5, -1);  // each group's previous replica
  int stayed = 0, repeats = 0;
  for (int step = 0; step < 5000; ++step) {
    const int g = static_cast<int>(rng() % 5);
    const std::vector<int32_t> p = {g, g, g, g, step};
    const int r = r2.Order(p, l2)[0];
    r2.Routed(p, r);
    l2[static_cast<size_t>(r)].outstanding_tokens += kCost;
    ASSERT_LE(Spread(l2), o.affinity_slack_tokens + kCost) << "step " << step;
    if (last[static_cast<size_t>(g)] >= 0) {
      ++repeats;
      stayed += last[static_cast<size_t>(g)] == r;
    }
    last[static_cast<size_t>(g)] = r;
    for (ReplicaLoad& l : l2) l.outstanding_tokens = std::max<int64_t>(0, l.outstanding_tokens - 7);
  }
  // A group moves only when its replica runs past the slack: most requests
  // follow the previous one of their group (without affinity about a third).
  EXPECT_GT(stayed, repeats * 9 / 10) << stayed << " of " << repeats;
  std::printf("%d of %d requests stayed on their prefix's replica\n", stayed, repeats);
}

// A fleet's hundreds of replicas: the head of the order (kSortedHead) is the
// least loaded ones, best first, and every accepting replica is listed once.
TEST(ReplicaRouter, ManyReplicasHeadSortedAndEveryReplicaListed) {
  RouterOptions o;
  o.block_size = kBlock;
  ReplicaRouter router(o);
  std::vector<ReplicaLoad> loads = Ready(512);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> tokens(0, 100000);
  for (ReplicaLoad& l : loads) l.outstanding_tokens = tokens(rng);
  loads[77].accepting = false;
  const std::vector<int> order = router.Order({1, 2, 3}, loads);
  ASSERT_EQ(order.size(), 511u);
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  EXPECT_EQ(std::count(order.begin(), order.end(), 77), 0);
  std::vector<int64_t> all;
  for (int r : order) all.push_back(loads[static_cast<size_t>(r)].outstanding_tokens);
  std::vector<int64_t> best = all;
  std::sort(best.begin(), best.end());
  for (int i = 0; i < kSortedHead; ++i)
    EXPECT_EQ(all[static_cast<size_t>(i)], best[static_cast<size_t>(i)]) << i;
}

}  // namespace
}  // namespace tessera
