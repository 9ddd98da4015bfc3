// The coordinator's view of its workers for the planner
// (coordinator/control/worker_cluster.h), what a worker registers
// (worker/daemon/worker_registration.h), and the planner's serving constraints
// (fixed layout, one replica, uniform tp).
#include "coordinator/control/worker_cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/net/endpoint.h"
#include "common/wire/control_codec.h"
#include "coordinator/placement/cluster_model.h"
#include "coordinator/placement/placement_planner.h"
#include "worker/daemon/worker_registration.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// A host with `n` H100s joined pairwise by NVLink (0-1, 2-3, ...), PCIe SYS
// otherwise.
TopologyReport GpuHost(const std::string& name, int n) {
  TopologyReport r;
  r.hostname = name;
  r.source = "nvml";
  r.host_memory_bytes = int64_t{512} << 30;
  for (int i = 0; i < n; ++i) {
    GpuInfo g;
    g.index = i;
    g.name = "NVIDIA H100 80GB HBM3";
    g.uuid = "GPU-" + std::to_string(i);
    g.memory_total_bytes = g.memory_free_bytes = int64_t{80} << 30;
    g.cc_major = 9;
    r.gpus.push_back(g);
  }
  r.links.assign(n, std::vector<GpuLink>(n));
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      GpuLink& l = r.links[a][b];
      if (a == b) {
        l.type = LinkType::kSelf;
      } else if (a / 2 == b / 2) {
        l.type = LinkType::kNvLink;
        l.nvlink_count = 4;
        l.bandwidth_gb_per_s = 100;
      } else {
        l.type = LinkType::kSys;
        l.bandwidth_gb_per_s = 12;
      }
    }
  }
  return r;
}

TopologyReport CpuHost(const std::string& name, int64_t memory) {
  TopologyReport r;
  r.hostname = name;
  r.source = "cpu-only";
  r.host_memory_bytes = memory;
  r.cpu.model = "Test CPU";
  return r;
}

ControlWorkerInfo Worker(const std::string& id, const TopologyReport& host, int device, bool cpu) {
  auto reg = BuildRegistration(host, {device, cpu, "", "10.0.0.1"});
  TESSERA_CHECK(reg.ok());
  ControlWorkerInfo w;
  w.worker_id = id;
  w.registration = std::make_shared<const control::Register>(*reg);
  return w;
}

TEST(WorkerRegistration, CpuAndGpuDevices) {
  auto cpu = BuildRegistration(CpuHost("box", 1 << 30), {3, true, "", "10.1.1.1"});
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ(cpu->host(), "box");
  EXPECT_EQ(cpu->data_address(), "10.1.1.1");
  ASSERT_EQ(cpu->devices_size(), 1);
  EXPECT_EQ(cpu->devices(0).kind(), control::DEVICE_KIND_CPU);
  EXPECT_EQ(cpu->devices(0).index(), 3u);
  EXPECT_EQ(cpu->devices(0).name(), "Test CPU");
  EXPECT_EQ(cpu->devices(0).total_memory_bytes(), uint64_t{1} << 30);
  auto back = TopologyReportFromJson(cpu->topology_json(), "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->hostname, "box");
  EXPECT_EQ(back->host_memory_bytes, 1 << 30);

  auto gpu = BuildRegistration(GpuHost("g", 4), {2, false, "renamed", ""});
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  EXPECT_EQ(gpu->host(), "renamed");
  EXPECT_EQ(gpu->devices(0).kind(), control::DEVICE_KIND_CUDA);
  EXPECT_EQ(gpu->devices(0).uuid(), "GPU-2");
  EXPECT_EQ(gpu->devices(0).compute_capability(), 90u);
  auto missing = BuildRegistration(GpuHost("g", 2), {5, false, "", ""});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("GPU 5 is not on host g (its GPUs: 0, 1)"));
}

// A worker's default id is its host and device: the same after a restart,
// whatever the order workers register in; always a valid worker id.
TEST(WorkerRegistration, DefaultIdIsTheHostAndTheDevice) {
  EXPECT_EQ(DefaultWorkerId("gpu-node-3", 5), "gpu-node-3:5");
  EXPECT_EQ(DefaultWorkerId("gpu-node-3", 5), DefaultWorkerId("gpu-node-3", 5));
  EXPECT_NE(DefaultWorkerId("gpu-node-3", 5), DefaultWorkerId("gpu-node-3", 4));
  EXPECT_NE(DefaultWorkerId("a", 1), DefaultWorkerId("b", 1));
  // Characters a worker id cannot hold become '-' (an IPv6 literal's ':'
  // too, so the device stays the only part after a ':').
  EXPECT_EQ(DefaultWorkerId("host name/x", 0), "host-name-x:0");
  EXPECT_EQ(DefaultWorkerId("fd00::2", 1), "fd00--2:1");
  EXPECT_TRUE(IsValidWorkerId(DefaultWorkerId("h\xc3\xa9 st", 12)));
  const std::string long_id = DefaultWorkerId(std::string(500, 'h'), 123);
  EXPECT_EQ(long_id.size(), kMaxWorkerIdBytes);
  EXPECT_TRUE(IsValidWorkerId(long_id));
  EXPECT_EQ(long_id.substr(long_id.size() - 4), ":123");
}

TEST(WorkerRegistration, EndpointsAndLocalAddress) {
  EXPECT_EQ(*EndpointHost("tcp://10.0.0.1:5555"), "10.0.0.1");
  EXPECT_EQ(*EndpointHost("tcp://[::1]:5555"), "::1");
  EXPECT_FALSE(EndpointHost("udp://x:1").ok());
  EXPECT_FALSE(EndpointHost("tcp://:1").ok());
  auto local = LocalAddressToward("tcp://127.0.0.1:5555");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_EQ(*local, "127.0.0.1");
  EXPECT_EQ(LocalAddressToward("tcp://no-such-host.invalid:1").status().code(),
            StatusCode::kUnavailable);
}

TEST(WorkerCluster, CpuRanksShareTheirHostsMemory) {
  const TopologyReport a = CpuHost("a", int64_t{6} << 30), b = CpuHost("b", int64_t{2} << 30);
  auto wc = BuildWorkerCluster({Worker("w0", a, 0, true), Worker("w1", b, 0, true),
                                Worker("w2", a, 1, true), Worker("w3", a, 2, true)});
  ASSERT_TRUE(wc.ok()) << wc.status().ToString();
  EXPECT_TRUE(wc->cpu);
  ASSERT_EQ(wc->topology.nodes.size(), 2u);  // hosts in order of first registration
  EXPECT_EQ(wc->topology.nodes[0].hostname, "a");
  EXPECT_EQ(wc->workers[0], (std::vector<std::string>{"w0", "w2", "w3"}));
  EXPECT_EQ(wc->workers[1], (std::vector<std::string>{"w1"}));
  const TopologyReport& na = wc->topology.nodes[0];
  ASSERT_EQ(na.gpus.size(), 3u);
  EXPECT_EQ(na.gpus[1].memory_total_bytes, (int64_t{6} << 30) / 3);
  EXPECT_EQ(na.gpus[1].name, "CPU rank (Test CPU)");
  EXPECT_EQ(na.links[0][1].type, LinkType::kNode);
  EXPECT_EQ(wc->topology.nodes[1].gpus[0].memory_total_bytes, int64_t{2} << 30);
  // The cost model knows a CPU rank (no "unknown GPU" note).
  auto cm = BuildClusterModel(wc->topology);
  ASSERT_TRUE(cm.ok()) << cm.status().ToString();
  EXPECT_TRUE(cm->nodes[0].gpus[0].spec_known);
  EXPECT_EQ(cm->nodes[0].gpus[0].spec.hbm_gb_per_s,
            WorkerClusterOptions{}.cpu_rank_spec.hbm_gb_per_s);
}

TEST(WorkerCluster, GpuWorkersTakeTheirGpusAndLinksFromTheReport) {
  const TopologyReport h = GpuHost("dgx", 4);
  // Registered out of order: the node lists GPUs by index.
  auto wc = BuildWorkerCluster(
      {Worker("w3", h, 3, false), Worker("w0", h, 0, false), Worker("w2", h, 2, false)});
  ASSERT_TRUE(wc.ok()) << wc.status().ToString();
  EXPECT_FALSE(wc->cpu);
  const TopologyReport& n = wc->topology.nodes[0];
  ASSERT_EQ(n.gpus.size(), 3u);
  EXPECT_EQ(n.gpus[0].index, 0);
  EXPECT_EQ(n.gpus[2].index, 3);
  EXPECT_EQ(wc->workers[0], (std::vector<std::string>{"w0", "w2", "w3"}));
  EXPECT_EQ(n.links[1][2].type, LinkType::kNvLink);  // GPUs 2 and 3
  EXPECT_EQ(n.links[0][1].type, LinkType::kSys);     // GPUs 0 and 2
  auto cm = BuildClusterModel(wc->topology);
  ASSERT_TRUE(cm.ok());
  EXPECT_EQ(cm->nodes[0].nvlink_islands[0], (std::vector<int>{1, 2}));

  auto twice = BuildWorkerCluster({Worker("x", h, 1, false), Worker("y", h, 1, false)});
  EXPECT_THAT(twice.status().message(), HasSubstr("both offer GPU 1 of host dgx"));
  auto mixed =
      BuildWorkerCluster({Worker("x", h, 1, false), Worker("c", CpuHost("c", 1 << 30), 0, true)});
  EXPECT_THAT(mixed.status().message(), HasSubstr("run different backends"));
  ControlWorkerInfo lying = Worker("z", h, 1, false);
  auto edited = std::make_shared<control::Register>(*lying.registration);
  edited->mutable_devices(0)->set_index(7);
  lying.registration = edited;
  auto bad = BuildWorkerCluster({lying});
  EXPECT_THAT(bad.status().message(),
              HasSubstr("offers GPU 7 that the topology report of host dgx does not list"));
  EXPECT_FALSE(BuildWorkerCluster({}).ok());
}

ModelConfig Llama(int layers, int heads, int kv_heads) {
  ModelConfig m;
  m.hidden_size = 64 * heads;
  m.intermediate_size = 4 * m.hidden_size;
  m.num_hidden_layers = layers;
  m.num_attention_heads = heads;
  m.num_key_value_heads = kv_heads;
  m.head_dim = 64;
  m.vocab_size = 1000;
  m.max_position_embeddings = 256;
  m.torch_dtype = DType::kF32;
  return m;
}

TEST(PlannerServingConstraints, FixedLayoutOneReplicaUniformTp) {
  const TopologyReport h = GpuHost("dgx", 4);
  auto wc = BuildWorkerCluster({Worker("a", h, 0, false), Worker("b", h, 1, false),
                                Worker("c", h, 2, false), Worker("d", h, 3, false)});
  ASSERT_TRUE(wc.ok());
  auto cm = BuildClusterModel(wc->topology);
  ASSERT_TRUE(cm.ok());
  const ModelConfig m = Llama(6, 4, 2);
  PlacementPlanner planner;
  PlanOptions o;
  // Free choice: several replicas; with max_replicas one.
  auto free = planner.Plan(m, *cm, o);
  ASSERT_TRUE(free.ok()) << free.status().ToString();
  EXPECT_GT(free->plan.replicas.size(), 1u);
  o.max_replicas = 1;
  auto one = planner.Plan(m, *cm, o);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->plan.replicas.size(), 1u);
  // A fixed layout with a fixed split.
  o.fixed_tp = 2;
  o.fixed_pp = 2;
  o.fixed_layers_per_stage = {4, 2};
  auto fixed = planner.Plan(m, *cm, o);
  ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
  const PlannedReplica& r = fixed->plan.replicas[0];
  ASSERT_EQ(r.pp(), 2);
  EXPECT_EQ(r.stages[0].tp, 2);
  EXPECT_EQ(r.stages[0].layers(), 4);
  EXPECT_EQ(r.stages[1].layers(), 2);
  EXPECT_EQ(r.stages[0].tp_link, "NV4");  // the NVLink pair
  auto pc = fixed->plan.ParallelConfigOf(m, 0);
  ASSERT_TRUE(pc.ok());
  EXPECT_EQ(pc->layers_per_stage, (std::vector<int>{4, 2}));
  // Invalid fixed layouts are refused with the rule they break.
  o.fixed_layers_per_stage.clear();
  o.fixed_tp = 3;
  o.fixed_pp = 1;
  auto bad_tp = planner.Plan(m, *cm, o);
  EXPECT_EQ(bad_tp.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(bad_tp.status().message(), HasSubstr("tp=3"));
  EXPECT_THAT(bad_tp.status().message(), HasSubstr("num_attention_heads"));
  o.fixed_tp = 2;
  o.fixed_pp = 3;  // 4 GPUs make two tp=2 groups
  auto bad_pp = planner.Plan(m, *cm, o);
  EXPECT_THAT(bad_pp.status().message(),
              HasSubstr("needs 3 stages but the cluster has 2 group(s)"));
  o.fixed_tp = 8;
  o.fixed_pp = 1;
  o.allow_cross_node_tp = false;
  auto wide = planner.Plan(m, *cm, o);
  EXPECT_THAT(wide.status().message(), HasSubstr("would span hosts"));
  // A fixed split a stage cannot hold is rejected with the stage's limit.
  ModelConfig big = Llama(4, 4, 2);
  big.hidden_size = 8192;
  big.head_dim = 2048;
  big.intermediate_size = 4 * 8192;
  o.fixed_tp = 1;
  o.fixed_pp = 2;
  o.fixed_layers_per_stage = {3, 1};
  o.gpu_memory_fraction = 0.11;  // 9.4 GB per GPU: two 4 GB layers fit, three do not
  auto split = planner.Plan(big, *cm, o);
  ASSERT_FALSE(split.ok());
  EXPECT_THAT(split.status().message(), HasSubstr("is given 3 layers but holds at most"));
}

}  // namespace
}  // namespace tessera
