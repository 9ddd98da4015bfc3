// ClusterState's exclusions (coordinator/serving/cluster_state.h): which
// ended exclusions a replica re-plans for (NextExclusionEnd, the deadline of
// its plan thread's wait, and ClaimEndedExclusions), and when a replica lacks
// workers (ReplicaPlan::NeedsWorkers). Issue #31: a single-worker replica
// stayed degraded after its worker's step_hung exclusion ended. And who wakes
// whom: a replica's own condition variable (NotifyReplica), or every waiter
// (NotifyAll); issue #33 asks for no fleet-wide wake per load message.
#include "coordinator/serving/cluster_state.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

std::vector<std::string> Ids(const std::vector<std::pair<std::string, WorkerExclusion>>& ended) {
  std::vector<std::string> ids;
  for (const auto& [id, e] : ended) ids.push_back(id);
  return ids;
}

class ClusterStateExclusions : public ::testing::Test {
 protected:
  ClusterStateExclusions() {
    MutexLock lock(&state_.mu);
    state_.SizeReplicas(2);
    Assignment a;
    a.worker_id = "r0";
    state_.SetAssignments(0, {a});
    a.worker_id = "r1";
    state_.SetAssignments(1, {a});
  }
  // Excludes `id` with its back-off ending at `until`.
  void ExcludeUntil(const std::string& id, Clock::time_point until) REQUIRES(state_.mu) {
    state_.Exclude(id, "step_hung", "worker " + id + " hung", 10.0);
    state_.excluded_workers[id].until = until;
  }

  ClusterState state_;
  const Clock::time_point t0_ = Clock::now();
};

TEST_F(ClusterStateExclusions, TheNextEndIsTheEarliestOfItsOwnWorkersAndTheSpares) {
  MutexLock lock(&state_.mu);
  EXPECT_FALSE(state_.NextExclusionEnd(0, t0_).has_value());
  ExcludeUntil("r0", t0_ + seconds(5));     // replica 0's own
  ExcludeUntil("spare", t0_ + seconds(3));  // no replica's
  ExcludeUntil("r1", t0_ + seconds(1));     // replica 1's: not replica 0's to use
  EXPECT_EQ(state_.NextExclusionEnd(0, t0_), t0_ + seconds(3));
  EXPECT_EQ(state_.NextExclusionEnd(1, t0_), t0_ + seconds(1));
  // A lost worker, or a drained one, re-plans when it registers or is
  // undrained, not when its exclusion ends.
  state_.failed_workers.push_back("spare");
  EXPECT_EQ(state_.NextExclusionEnd(0, t0_), t0_ + seconds(5));
  state_.drained_workers.push_back("r0");
  EXPECT_FALSE(state_.NextExclusionEnd(0, t0_).has_value());
}

TEST_F(ClusterStateExclusions, AnEndTheLastReplanSawDoesNotCount) {
  MutexLock lock(&state_.mu);
  ExcludeUntil("r0", t0_ + seconds(2));
  ExcludeUntil("spare", t0_ + seconds(4));
  // The last re-plan started at t0 + 3 s: r0 was usable to it.
  EXPECT_EQ(state_.NextExclusionEnd(0, t0_ + seconds(3)), t0_ + seconds(4));
  EXPECT_TRUE(state_.ClaimEndedExclusions(0, t0_ + seconds(3), t0_ + seconds(3)).empty());
  EXPECT_EQ(Ids(state_.ClaimEndedExclusions(0, t0_ + seconds(3), t0_ + seconds(5))),
            std::vector<std::string>{"spare"});
}

TEST_F(ClusterStateExclusions, AnEndedExclusionIsClaimedOnceUntilTheNextExclusion) {
  MutexLock lock(&state_.mu);
  ExcludeUntil("r0", t0_ + seconds(1));
  ExcludeUntil("spare", t0_ + seconds(2));
  ExcludeUntil("r1", t0_ + seconds(1));
  // At t0 + 1.5 s only r0's ended (r1's is replica 1's).
  const auto ended = state_.ClaimEndedExclusions(0, t0_, t0_ + std::chrono::milliseconds(1500));
  ASSERT_EQ(Ids(ended), std::vector<std::string>{"r0"});
  EXPECT_EQ(ended[0].second.kind, "step_hung");
  EXPECT_EQ(ended[0].second.count, 1);
  EXPECT_TRUE(state_.excluded_workers["r0"].end_claimed);
  // Claimed: no longer a deadline, nor claimed twice (by any replica).
  EXPECT_EQ(state_.NextExclusionEnd(0, t0_), t0_ + seconds(2));
  EXPECT_EQ(Ids(state_.ClaimEndedExclusions(0, t0_, t0_ + seconds(3))),
            std::vector<std::string>{"spare"});
  EXPECT_EQ(Ids(state_.ClaimEndedExclusions(1, t0_, t0_ + seconds(3))),
            std::vector<std::string>{"r1"});
  EXPECT_FALSE(state_.NextExclusionEnd(0, t0_).has_value());
  // Excluded again: a new back-off, twice as long, whose end counts again.
  const WorkerExclusion& again = state_.Exclude("r0", "load_timeout", "did not load", 10.0);
  EXPECT_EQ(again.count, 2);
  EXPECT_FALSE(again.end_claimed);
  const double backoff = std::chrono::duration<double>(again.until - Clock::now()).count();
  EXPECT_GT(backoff, 19.0);
  EXPECT_LE(backoff, 20.0);
  EXPECT_EQ(state_.NextExclusionEnd(0, t0_), again.until);
  EXPECT_TRUE(state_.IsExcluded("r0"));
}

TEST(ReplicaPlanNeedsWorkers, DegradedOrServingSmallerThanWanted) {
  ReplicaPlan p;
  p.wanted.tp = 2;
  p.wanted.pp = 2;
  p.parallel = p.wanted;
  EXPECT_FALSE(p.NeedsWorkers());  // its first placement runs
  p.degraded = "first placement failed: worker w0 did not join its groups";
  EXPECT_TRUE(p.NeedsWorkers());  // not serving yet: its first placement failed
  p.parallel.pp = 1;
  p.degraded.clear();
  EXPECT_FALSE(p.NeedsWorkers());  // not serving, not degraded: nothing to re-plan
  p.parallel.pp = 2;
  p.serving = true;
  p.degraded = "no layout of the model fits 0 usable worker(s)";
  EXPECT_TRUE(p.NeedsWorkers());
  p.degraded.clear();
  EXPECT_FALSE(p.NeedsWorkers());
  p.parallel.pp = 1;
  EXPECT_TRUE(p.NeedsWorkers());  // serves tp=2 x pp=1 of the tp=2 x pp=2 wanted
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Three waiters on a ClusterState's condition variables: replica 0's,
// replica 1's (twice) and the daemon's. Each says it waits (`waiting`, then
// `entered`, under `mu`, so it is inside its wait once the test holds `mu`
// again), then waits up to 30 s for its flag.
struct Waiters {
  ClusterState state;
  std::condition_variable_any entered;
  int waiting GUARDED_BY(state.mu) = 0;
  bool flags[4] GUARDED_BY(state.mu) = {false, false, false, false};
  bool woke[4] = {false, false, false, false};

  bool Await(std::condition_variable_any& cv, int i) REQUIRES(state.mu) {
    ++waiting;
    entered.notify_all();
    return cv.wait_for(state.mu, seconds(30), [&]() REQUIRES(state.mu) { return flags[i]; });
  }
  // Returns with `mu` held once `n` waits have begun.
  void AwaitWaiting(int n) REQUIRES(state.mu) {
    entered.wait(state.mu, [&]() REQUIRES(state.mu) { return waiting >= n; });
  }
};

TEST(ClusterStateWakes, AReplicasOwnNotifyWakesItsWaiterAndNotifyAllWakesEveryone) {
  Waiters w;
  {
    MutexLock lock(&w.state.mu);
    w.state.SizeReplicas(2);
  }
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    MutexLock lock(&w.state.mu);
    w.woke[0] = w.Await(w.state.ReplicaCv(0), 0);
  });
  threads.emplace_back([&] {
    MutexLock lock(&w.state.mu);
    w.woke[1] = w.Await(w.state.ReplicaCv(1), 1);
    w.woke[3] = w.Await(w.state.ReplicaCv(1), 3);
  });
  threads.emplace_back([&] {
    MutexLock lock(&w.state.mu);
    w.woke[2] = w.Await(w.state.cv, 2);
  });
  {
    MutexLock lock(&w.state.mu);
    w.AwaitWaiting(3);
    w.flags[0] = w.flags[1] = true;
    w.state.NotifyReplica(2);   // out of range: nobody
    w.state.NotifyReplica(-1);  // likewise
    w.state.NotifyReplica(0);
    w.state.NotifyReplica(1);
  }
  {
    MutexLock lock(&w.state.mu);
    w.AwaitWaiting(4);  // replica 1's second wait
    w.flags[2] = w.flags[3] = true;
    w.state.NotifyAll();
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(w.woke[0]) << "NotifyReplica(0) did not wake replica 0's waiter";
  EXPECT_TRUE(w.woke[1]) << "NotifyReplica(1) did not wake replica 1's waiter";
  EXPECT_TRUE(w.woke[2]) << "NotifyAll did not wake the daemon's waiter";
  EXPECT_TRUE(w.woke[3]) << "NotifyAll did not wake replica 1's waiter";
}

TEST(ClusterStateReady, TheLockFreeCopyFollowsEachReplicasReadyFlag) {
  ClusterState state;
  EXPECT_FALSE(state.ReplicaReady(0, 0));  // before sizing: nothing to read
  MutexLock lock(&state.mu);
  state.SizeReplicas(2);
  EXPECT_FALSE(state.ReplicaReady(0, 2));
  state.SetReplicaReady(1, true);
  EXPECT_FALSE(state.ReplicaReady(0, 2));
  EXPECT_TRUE(state.ReplicaReady(1, 2));
  EXPECT_TRUE(state.replicas[1].ready);
  EXPECT_TRUE(state.ready.load());
  EXPECT_FALSE(state.all_ready.load());
  state.SetReplicaReady(0, true);
  EXPECT_TRUE(state.all_ready.load());
  state.SetReplicaReady(1, false);
  EXPECT_FALSE(state.ReplicaReady(1, 2));
  EXPECT_FALSE(state.replicas[1].ready);
  EXPECT_FALSE(state.all_ready.load());
  EXPECT_FALSE(state.ReplicaReady(2, 2));   // out of range
  EXPECT_FALSE(state.ReplicaReady(-1, 2));  // likewise
}

}  // namespace
}  // namespace tessera
