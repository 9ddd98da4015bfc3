// The fleet simulator (bench/fleet_sim/) at a CI-sized fleet: a real
// tessera-coordinator and 16 simulated DGX H100 nodes (128 workers, each with
// its own CURVE key) on the real control plane, serving Llama-2-70B shapes at
// tp8 x pp2: 8 replicas. Under request load one node is killed; only the
// replica it served re-plans, it serves again within the heartbeat timeout +
// 2 s, and no request is lost or cut short. bench/fleet_sim.sh runs the same
// program at 1,024 nodes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::BinaryDir;
using ::testing::ElementsAreArray;
using testing::FixturePath;
using testing::MakeTempDir;
using testing::ReadFileOrDie;
using testing::RunCommand;

TEST(FleetSim, NodeLossUnderLoadReplansOnlyItsReplicaAndLosesNoRequest) {
  const std::string dir = MakeTempDir("fleet-sim");
  const double timeout = 2.0;
  const std::string cmd =
      BinaryDir() + "/tessera-fleet-sim --coordinator " + BinaryDir() +
      "/tessera-coordinator --topology " + std::string(TESSERA_SOURCE_DIR) +
      "/configs/topologies/dgx_h100_x1.toml --model-config " + std::string(TESSERA_SOURCE_DIR) +
      "/configs/models/llama-2-70b.json --tokenizer " + FixturePath("models/llama_gqa_f32") +
      " --work-dir " + dir + " --json " + dir +
      "/result.json --nodes 16 --tp 8 --pp 2 --shards 2 --heartbeat 0.25 --heartbeat-timeout " +
      std::to_string(timeout) +
      // Reloads modeled at 100 GB/s: the bound below is the coordinator's
      // detection and re-plan, not a disk.
      " --disk-gbps 100 --clients 16 --max-tokens 4 --idle-seconds 2 --load-seconds 10 "
      "--kill-node 3 "
      "--kill-after 2 --admin-page-size 16 --ready-timeout 120";
  const testing::CommandResult run = RunCommand(cmd + " >/dev/null");
  const json r = json::parse(ReadFileOrDie(dir + "/result.json"), nullptr, false);
  ASSERT_TRUE(r.is_object()) << cmd << "\n" << run.output;
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2) << "\n" << run.output;
  EXPECT_EQ(run.rc, 0);

  EXPECT_EQ(r["workers"], 128);
  EXPECT_GE(r["registration_seconds"].get<double>(), 0);
  EXPECT_EQ(r["replicas"], 8);
  EXPECT_EQ(r["replicas_ready"], 8);
  // Every worker's socket was read: its RegisterAck (registration_seconds
  // is set only once all 128 registered) and its AssignShard (ranks_assigned
  // counts the AssignShards read); under load, see latency_max_s below.
  EXPECT_EQ(r["ranks_assigned"], 128);
  // /admin/cluster read in pages of 16: every worker, every replica.
  EXPECT_EQ(r["admin_cluster_pages"], 8);
  EXPECT_EQ(r["admin_cluster_workers"], 128);
  EXPECT_EQ(r["admin_cluster_replicas"], 8);
  // Heartbeats flowed while idle: 128 workers at 4 Hz.
  EXPECT_GT(r["idle_heartbeats_per_second"].get<double>(), 128 * 4 * 0.5);

  const json& load = r["load"];
  EXPECT_GT(load["ok"].get<int64_t>(), 0) << load.dump(2);
  EXPECT_EQ(load["failed"], 0) << load.dump(2);
  EXPECT_EQ(load["short"], 0) << load.dump(2);
  EXPECT_EQ(load["sent"], load["ok"]);
  // No request waited on a Step its worker left unread. A simulator thread
  // that stops serving a socket (a lost ZMQ_FD edge: bench/fleet_sim/
  // epoll_shard_loop.h) leaves the Step there until the coordinator's step
  // timeout (heartbeat.step_timeout_seconds, 30 s) faults the replica; the
  // requests the lost node held waited for its re-plan, a few seconds.
  EXPECT_LT(load["latency_max_s"].get<double>(), 10.0) << load.dump(2);
  EXPECT_GT(load["steps"].get<int64_t>(), 0);
  // The timers kept firing while the sockets were busy (the simulator's
  // threads wait in epoll until their next timer): the 120 live workers
  // heartbeat at 4 Hz under load too.
  EXPECT_GT(load["heartbeats_per_second"].get<double>(), 120 * 4 * 0.5) << load.dump(2);

  // The node's 8 GPUs were half of one replica's; that replica alone
  // re-planned, and served again within the heartbeat timeout + 2 s.
  const json& loss = r["node_loss"];
  ASSERT_TRUE(loss.is_object()) << r.dump(2);
  ASSERT_EQ(loss["replicas_of_node"].size(), 1u) << loss.dump();
  EXPECT_THAT(loss["replanned_replicas"].get<std::vector<int>>(),
              ElementsAreArray(loss["replicas_of_node"].get<std::vector<int>>()));
  const double back = loss["serving_again_seconds"].get<double>();
  EXPECT_GE(back, 0);
  EXPECT_LT(back, timeout + 2.0) << loss.dump();
}

// Replicas that schedule themselves (--runs-on leader): 2 nodes of 8 tp1
// replicas, each simulated leader running the worker's real ReplicaLeader
// (scheduler, KV blocks, output processing with the tokenizer). Every
// request is served, none lost or cut short, spread over all 16 replicas.
TEST(FleetSim, LeadersScheduleTheirReplicasUnderLoad) {
  const std::string dir = MakeTempDir("fleet-sim-leader");
  const std::string cmd =
      BinaryDir() + "/tessera-fleet-sim --coordinator " + BinaryDir() +
      "/tessera-coordinator --topology " + std::string(TESSERA_SOURCE_DIR) +
      "/configs/topologies/dgx_h100_x1.toml --model-config " + std::string(TESSERA_SOURCE_DIR) +
      "/configs/models/llama-2-7b.json --tokenizer " + FixturePath("models/llama_gqa_f32") +
      " --work-dir " + dir + " --json " + dir +
      "/result.json --nodes 2 --tp 1 --pp 1 --runs-on leader --time-scale 0 --clients 32 "
      "--max-tokens 16 --idle-seconds 1 --load-seconds 4 --ready-timeout 120";
  const testing::CommandResult run = RunCommand(cmd + " >/dev/null");
  const json r = json::parse(ReadFileOrDie(dir + "/result.json"), nullptr, false);
  ASSERT_TRUE(r.is_object()) << cmd << "\n" << run.output;
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2) << "\n" << run.output;
  EXPECT_EQ(run.rc, 0);
  EXPECT_EQ(r["runs_on"], "leader");
  EXPECT_EQ(r["replicas_ready"], 16);
  const json& load = r["load"];
  EXPECT_GT(load["ok"].get<int64_t>(), 0) << load.dump(2);
  EXPECT_EQ(load["failed"], 0) << load.dump(2);
  EXPECT_EQ(load["short"], 0) << load.dump(2);
  EXPECT_EQ(load["sent"], load["ok"]);
  // The leaders ran the steps (the simulator counts theirs).
  EXPECT_GT(load["steps"].get<int64_t>(), 0) << load.dump(2);
  EXPECT_GT(load["routed_per_replica"]["min"].get<int64_t>(), 0) << load.dump(2);
}

TEST(FleetSim, BadArgumentsAreRefusedByName) {
  const testing::CommandResult run =
      RunCommand(BinaryDir() + "/tessera-fleet-sim --nodes 2 --kill-node 5 2>&1");
  EXPECT_NE(run.rc, 0);
  EXPECT_THAT(run.output, ::testing::HasSubstr("--kill-node 5: there are only 2 nodes"));
  const testing::CommandResult replicas = RunCommand(
      BinaryDir() + "/tessera-fleet-sim --nodes 4 --replicas 1 --topology " +
      std::string(TESSERA_SOURCE_DIR) + "/configs/topologies/dgx_h100_x1.toml --model-config " +
      std::string(TESSERA_SOURCE_DIR) + "/configs/models/llama-2-70b.json --tokenizer " +
      FixturePath("models/llama_gqa_f32") + " 2>&1");
  EXPECT_NE(replicas.rc, 0);
  EXPECT_THAT(replicas.output,
              ::testing::HasSubstr("--replicas 1 x --tp 8 x --pp 2 = 16 workers, but --nodes 4 x "
                                   "8 GPUs = 32; give --replicas 0 (as many as fit) or 2"));
  const testing::CommandResult zero = RunCommand(BinaryDir() + "/tessera-fleet-sim --nodes 0 2>&1");
  EXPECT_NE(zero.rc, 0);
  EXPECT_THAT(zero.output, ::testing::HasSubstr("--nodes"));
}

}  // namespace
}  // namespace tessera
