// LoadCulprits (coordinator/serving/load_culprits.h): the workers a failed
// plan load is blamed on, from each rank's stage (0 nothing, 1 joined the
// store, 2 loading, 3 loaded) and the worker that reported an error.
#include "coordinator/serving/load_culprits.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera {
namespace {

using Ids = std::vector<std::string>;

std::vector<RankLoadStage> Ranks(const std::vector<int>& stages) {
  std::vector<RankLoadStage> out;
  for (size_t r = 0; r < stages.size(); ++r)
    out.push_back({"w" + std::to_string(r), static_cast<int>(r), stages[r]});
  return out;
}

TEST(LoadCulprits, AtTheDeadlineTheRanksFurthestBehind) {
  // The stale worker never reached the store; its peers joined and wait.
  EXPECT_EQ(LoadCulprits(Ranks({1, 1, 1, 0}), ""), Ids{"w3"});
  // A slow disk: one rank still loading while the others loaded.
  EXPECT_EQ(LoadCulprits(Ranks({3, 2, 3, 3}), ""), Ids{"w1"});
  // Two that never joined are both named, in rank order.
  EXPECT_EQ(LoadCulprits(Ranks({0, 1, 0, 1}), ""), (Ids{"w0", "w2"}));
  // Everyone equally stuck: every rank not loaded.
  EXPECT_EQ(LoadCulprits(Ranks({2, 2, 3}), ""), (Ids{"w0", "w1"}));
}

TEST(LoadCulprits, AReporterBehindNobodyIsItsOwnCulprit) {
  // Its own failure (a bad shard, out of memory) while the others are no
  // further back than it.
  EXPECT_EQ(LoadCulprits(Ranks({2, 2, 2, 2}), "w1"), Ids{"w1"});
  EXPECT_EQ(LoadCulprits(Ranks({1, 2, 3, 3}), "w0"), Ids{"w0"});
  // Everyone loaded (a Loaded that contradicts the registration).
  EXPECT_EQ(LoadCulprits(Ranks({3, 3}), "w1"), Ids{"w1"});
  // A worker outside the plan's ranks is still the one named.
  EXPECT_EQ(LoadCulprits(Ranks({3, 3}), "w9"), Ids{"w9"});
}

TEST(LoadCulprits, AReporterWhosePeersNeverJoinedIsNotBlamed) {
  // Its rendezvous timed out ("rank 3 never joined"): rank 3 is at fault.
  EXPECT_EQ(LoadCulprits(Ranks({1, 1, 1, 0}), "w0"), Ids{"w3"});
  EXPECT_EQ(LoadCulprits(Ranks({2, 2, 1, 2}), "w0"), Ids{"w2"});
}

TEST(LoadCulprits, ShortfallNamesTheStage) {
  EXPECT_NE(std::string(LoadStageShortfall(0)).find("did not join its groups"), std::string::npos);
  EXPECT_NE(std::string(LoadStageShortfall(2)).find("did not finish loading"), std::string::npos);
}

}  // namespace
}  // namespace tessera
