// parallel.replica_override: per-replica explicit layouts. Parsing (the
// array of tables, inline tables through --set), where each entry and key was
// given, the worker count they imply, formatting back, and every check
// naming the entry's key with file:line:col.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/config/daemon_config.h"
#include "tests/unit/common/config/config_test_util.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Replica 0 runs [parallel]'s tp 1 x pp 2; replica 1 tp 2 x pp 1; replica 2
// a tp per stage, [2, 1] over two stages.
constexpr const char* kThreeReplicas =
    "[parallel]\n"
    "tp = 1\n"
    "pp = 2\n"
    "replicas = 3\n"
    "[[parallel.replica_override]]\n"
    "replica = 1\n"
    "tp = 2\n"
    "[[parallel.replica_override]]\n"
    "replica = 2\n"
    "tp = [2, 1]\n"
    "pp = 2\n"
    "layers_per_stage = [1, 1]\n";

TEST(ReplicaOverride, ParsesEachReplicasLayoutAndWhereItWasGiven) {
  StatusOr<DaemonConfig> c = ParseDaemonConfig(kThreeReplicas, "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const ParallelSection& p = c->parallel;
  EXPECT_EQ(p.mode, ParallelMode::kExplicit);
  ASSERT_EQ(p.replica_overrides.size(), 2u);
  EXPECT_EQ(p.replica_overrides[0].replica, 1);
  EXPECT_EQ(p.replica_overrides[0].layout.tp, 2);
  EXPECT_EQ(p.replica_overrides[0].layout.pp, 1);  // left out: the default, not [parallel]'s 2
  EXPECT_TRUE(p.replica_overrides[0].layout.layers_per_stage.empty());
  EXPECT_THAT(p.replica_overrides[1].layout.tp_per_stage, ElementsAre(2, 1));
  EXPECT_EQ(p.LayoutOfReplica(0).world_size(), 2);
  EXPECT_EQ(p.LayoutOfReplica(0).pp, 2);
  EXPECT_EQ(p.LayoutOfReplica(1).world_size(), 2);
  EXPECT_EQ(p.LayoutOfReplica(2).world_size(), 3);
  EXPECT_EQ(p.ReplicasWorldSize(), 7);
  EXPECT_EQ(p.ExpectedWorkers(), 7);  // 2 + 2 + 3
  EXPECT_EQ(c->sources.at("parallel.replica_override[0].replica"), "x.toml:6:11");
  EXPECT_EQ(c->sources.at("parallel.replica_override[1].tp"), "x.toml:10:6");
  EXPECT_EQ(ConfigKeyContext(*c, "parallel.replica_override[1].layers_per_stage"),
            "x.toml:12:20: parallel.replica_override[1].layers_per_stage");
  EXPECT_TRUE(c->sources.count("parallel.replica_override[0]"));
  // Formats back as inline tables and parses to the same config.
  const std::string text = FormatDaemonConfig(*c, false);
  EXPECT_THAT(text, HasSubstr("replica_override = [{replica = 1, tp = 2, pp = 1, "
                              "layers_per_stage = []}, {replica = 2, tp = [2, 1], pp = 2, "
                              "layers_per_stage = [1, 1]}]\n"));
  StatusOr<DaemonConfig> again = ParseDaemonConfig(text, "again.toml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
  EXPECT_EQ(FormatDaemonConfig(*again, false), text);
  // No override: the key formats as [] and every replica runs [parallel]'s.
  StatusOr<DaemonConfig> plain = ParseDaemonConfig("[parallel]\ntp = 2\nreplicas = 2\n", "p.toml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_THAT(FormatDaemonConfig(*plain, false), HasSubstr("replica_override = []\n"));
  EXPECT_EQ(plain->parallel.ExpectedWorkers(), 4);
  // Auto mode writes none of the explicit layout keys.
  EXPECT_THAT(FormatDaemonConfig(DaemonConfig{}, false),
              ::testing::Not(HasSubstr("replica_override")));
}

TEST(ReplicaOverride, SetReplacesTheEntriesAndModeAutoClearsThem) {
  StatusOr<DaemonConfig> c = ParseDaemonConfig(kThreeReplicas, "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::string flag = "[{replica = 0, tp = 2, pp = 1}]";
  ASSERT_TRUE(ApplyOverride(*c, "parallel.replica_override", flag).ok());
  ASSERT_EQ(c->parallel.replica_overrides.size(), 1u);
  EXPECT_EQ(c->parallel.replica_overrides[0].replica, 0);
  EXPECT_EQ(c->parallel.ExpectedWorkers(), 2 + 2 + 2);
  EXPECT_EQ(c->sources.at("parallel.replica_override[0].tp"),
            "--set parallel.replica_override=" + flag);
  EXPECT_FALSE(c->sources.count("parallel.replica_override[1]")) << "the old entries' places";
  // An error leaves the config unchanged.
  EXPECT_EQ(ApplyOverride(*c, "parallel.replica_override", "[{replica = 5}]").message(),
            "--set parallel.replica_override=[{replica = 5}]: parallel.replica_override[0]."
            "replica: must be a replica index in 0..2 (parallel.replicas = 3), got 5");
  EXPECT_EQ(c->parallel.replica_overrides[0].replica, 0);
  // Overrides alone select explicit mode; "auto" clears them.
  StatusOr<DaemonConfig> only = ParseDaemonConfig(
      "[parallel]\nreplicas = 2\n[[parallel.replica_override]]\nreplica = 1\ntp = 2\n", "o.toml");
  ASSERT_TRUE(only.ok()) << only.status().ToString();
  EXPECT_EQ(only->parallel.mode, ParallelMode::kExplicit);
  EXPECT_EQ(only->parallel.ExpectedWorkers(), 1 + 2);
  ASSERT_TRUE(ApplyOverride(*only, "parallel.mode", "auto").ok());
  EXPECT_TRUE(only->parallel.replica_overrides.empty());
  EXPECT_FALSE(only->sources.count("parallel.replica_override[0].tp"));
}

struct BadCase {
  const char* toml;
  const char* message;  // the exact message
};

TEST(ReplicaOverride, EachCheckNamesTheEntrysKeyWithFileLineCol) {
  const std::string head = "[parallel]\ntp = 1\npp = 2\nreplicas = 2\n";
  const BadCase cases[] = {
      // An index out of range, and given twice.
      {"[[parallel.replica_override]]\nreplica = 2\ntp = 2\n",
       "x.toml:6:11: parallel.replica_override[0].replica: must be a replica index in 0..1 "
       "(parallel.replicas = 2), got 2"},
      {"[[parallel.replica_override]]\nreplica = -1\n",
       "x.toml:6:11: parallel.replica_override[0].replica: must be a replica index in 0..1 "
       "(parallel.replicas = 2), got -1"},
      {"[[parallel.replica_override]]\nreplica = 1\ntp = 2\n"
       "[[parallel.replica_override]]\nreplica = 1\npp = 1\n",
       "x.toml:9:11: parallel.replica_override[1].replica: replica 1 has an override already: "
       "parallel.replica_override[0] (at x.toml:5:1); give one per replica"},
      // The entry's own shape.
      {"[[parallel.replica_override]]\ntp = 2\n",
       "x.toml:5:1: parallel.replica_override[0]: needs `replica`, the index of the replica "
       "whose layout it gives"},
      {"[[parallel.replica_override]]\nreplica = 1\ntpp = 2\n",
       "x.toml:7:7: parallel.replica_override[0].tpp: unknown key; valid keys of a replica "
       "override: replica, tp, pp, layers_per_stage"},
      {"[[parallel.replica_override]]\nreplica = 1\ntp = \"2\"\n",
       "x.toml:7:6: parallel.replica_override[0].tp: expected an integer or an array of "
       "integers (one per stage), got string \"2\""},
      {"[[parallel.replica_override]]\nreplica = 1\nlayers_per_stage = [1, \"1\"]\n",
       "x.toml:7:24: parallel.replica_override[0].layers_per_stage[1]: expected an integer, got "
       "string \"1\""},
      // Its layout, checked as [parallel]'s.
      {"[[parallel.replica_override]]\nreplica = 1\ntp = 0\n",
       "x.toml:7:6: parallel.replica_override[0].tp: must be >= 1, got 0"},
      {"[[parallel.replica_override]]\nreplica = 1\npp = 0\n",
       "x.toml:7:6: parallel.replica_override[0].pp: must be >= 1, got 0"},
      {"[[parallel.replica_override]]\nreplica = 1\ntp = [2, 1]\n",
       "x.toml:7:6: parallel.replica_override[0].tp: must have one entry per stage "
       "(parallel.replica_override[0].pp = 1), got 2 entries [2, 1]"},
      {"[[parallel.replica_override]]\nreplica = 1\npp = 2\nlayers_per_stage = [2]\n",
       "x.toml:8:20: parallel.replica_override[0].layers_per_stage: must have one entry per "
       "stage (parallel.replica_override[0].pp = 2), got 1 entries [2]"},
      {"[[parallel.replica_override]]\nreplica = 1\npp = 2\nlayers_per_stage = [2, 0]\n",
       "x.toml:8:20: parallel.replica_override[0].layers_per_stage: entry 1 (stage 1) must be "
       ">= 1, got 0"},
      {"[[parallel.replica_override]]\nreplica = 1\ntp = 65537\n",
       "x.toml:7:6: parallel.replica_override[0].tp: must be at most 65536, got 65537"},
  };
  for (const BadCase& bad : cases) {
    SCOPED_TRACE(bad.toml);
    EXPECT_EQ(ParseError(head + bad.toml), bad.message);
  }
  // parallel.workers must count every replica's own layout.
  EXPECT_EQ(ParseError("[parallel]\ntp = 1\npp = 2\nreplicas = 2\nworkers = 4\n"
                       "[[parallel.replica_override]]\nreplica = 1\ntp = [2, 1]\npp = 2\n"),
            "x.toml:5:11: parallel.workers: must be 0 or the sum of every replica's worker count "
            "(tp * pp, parallel.replica_override included) 2 + 3 = 5 in explicit mode, got 4");
  EXPECT_EQ(ParseError("[parallel]\ntp = 1\npp = 2\nreplicas = 2\nworkers = 5\n"
                       "[[parallel.replica_override]]\nreplica = 1\ntp = [2, 1]\npp = 2\n"),
            "");
  // Replica indices need a replica count, and auto mode takes no layout.
  EXPECT_EQ(ParseError("[parallel]\ntp = 1\nreplicas = 0\nworkers = 4\n"
                       "[[parallel.replica_override]]\nreplica = 0\ntp = 2\n"),
            "x.toml:5:1: parallel.replica_override[0]: needs parallel.replicas >= 1: with 0 (as "
            "many as fit) no replica index is known in advance");
  EXPECT_EQ(ParseError("[parallel]\nmode = \"auto\"\nreplicas = 2\n"
                       "[[parallel.replica_override]]\nreplica = 0\ntp = 2\n"),
            "x.toml:4:1: parallel.replica_override: is set but parallel.mode = \"auto\" (at "
            "x.toml:2:8); remove it, or set parallel.mode = \"explicit\"");
  EXPECT_EQ(ParseError("[parallel]\nreplica_override = 3\n"),
            "x.toml:2:20: parallel.replica_override: expected an array of tables "
            "([[parallel.replica_override]]), got integer 3");
  EXPECT_EQ(ParseError("[parallel]\nreplica_override = [3]\n"),
            "x.toml:2:21: parallel.replica_override[0]: expected a table, got integer 3");
  // server.max_workers bounds the sum too.
  EXPECT_THAT(ParseError("[parallel]\nreplicas = 2\n[server]\nmax_workers = 3\n"
                         "[[parallel.replica_override]]\nreplica = 1\ntp = 2\npp = 2\n"),
              HasSubstr("server.max_workers: must be >= the tp * pp workers the coordinator "
                        "waits for (5), got 3"));
}

}  // namespace
}  // namespace tessera
