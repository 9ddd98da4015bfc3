// TopologyReport JSON round trip and validation, link cells, the nvidia-smi
// style table, and topology files (TOML): every shipped configs/topologies
// file, the TOML round trip, and errors that name the file, line and key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/topology/report.h"
#include "common/topology/topology_file.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::string ConfigPath(const std::string& rel) {
  return std::string(TESSERA_FIXTURES_DIR) + "/../../configs/" + rel;
}

// A two-GPU host with a bonded NVLink pair, one NIC and explicit fields
// everywhere, as discovery would produce it.
TopologyReport SampleReport() {
  TopologyReport r;
  r.hostname = "node-a";
  r.source = "nvml";
  r.driver_version = "580.159";
  r.cpu_source = "hwloc";
  r.host_memory_bytes = 256LL << 30;
  r.cpu.model = "Fake CPU";
  r.cpu.sockets = 2;
  r.cpu.cores = 32;
  r.cpu.pus = 64;
  r.cpu.numa_nodes = {{0, "0-15,32-47", 128LL << 30}, {1, "16-31,48-63", 128LL << 30}};
  for (int i = 0; i < 2; ++i) {
    GpuInfo g;
    g.index = i;
    g.name = "NVIDIA H200";
    g.uuid = "GPU-" + std::to_string(i);
    g.memory_total_bytes = 150121594880;
    g.memory_free_bytes = 149000000000 - i;
    g.cc_major = 9;
    g.cc_minor = 0;
    g.sm_count = 132;
    g.pci_bus_id = i == 0 ? "0000:18:00.0" : "0000:2a:00.0";
    g.numa_node = i;
    g.cpu_affinity = i == 0 ? "0-15" : "16-31";
    g.pcie_gen = 5;
    g.pcie_width = 16;
    g.nvlink_gb_per_s_per_link = 26.562;
    for (int l = 0; l < 3; ++l)
      g.nvlinks.push_back({l, i == 0 ? "0000:2a:00.0" : "0000:18:00.0", "gpu", 4});
    r.gpus.push_back(g);
  }
  r.links.assign(2, std::vector<GpuLink>(2));
  r.links[0][0].type = r.links[1][1].type = LinkType::kSelf;
  r.links[0][1] = r.links[1][0] = {LinkType::kNvLink, 3, 79.686, true};
  NicInfo n;
  n.name = "mlx5_0";
  n.netdev = "ib0";
  n.type = "infiniband";
  n.speed_gbit_per_s = 400;
  n.numa_node = 0;
  n.pci_bus_id = "0000:19:00.0";
  n.cpu_affinity = "0-15";
  n.up = true;
  r.nics.push_back(n);
  r.gpu_nic = {{LinkType::kPix}, {LinkType::kSys}};
  r.notes = {"a note"};
  return r;
}

void ExpectSameReport(const TopologyReport& a, const TopologyReport& b) {
  // The JSON form is complete, so equal JSON means equal reports.
  EXPECT_EQ(TopologyReportToJson(a), TopologyReportToJson(b));
}

TEST(Topology, JsonRoundTrip) {
  const TopologyReport r = SampleReport();
  ASSERT_TRUE(ValidateTopologyReport(r).ok());
  const std::string json = TopologyReportToJson(r);
  auto back = TopologyReportFromJson(json, "report.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameReport(r, *back);
  EXPECT_EQ(back->links[0][1].nvlink_count, 3);
  EXPECT_EQ(back->gpus[1].nvlinks[2].remote_pci_bus_id, "0000:18:00.0");
  EXPECT_EQ(back->gpu_nic[1][0], LinkType::kSys);
}

TEST(Topology, JsonErrorsNameTheKey) {
  std::string json = TopologyReportToJson(SampleReport());
  const size_t at = json.find("\"sm_count\"");
  ASSERT_NE(at, std::string::npos);
  json.replace(at, 10, "\"sm_kount\"");
  auto r = TopologyReportFromJson(json, "reg");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("gpus[0]"));
  EXPECT_THAT(r.status().message(), HasSubstr("'sm_count'"));
  auto bad = TopologyReportFromJson("{\"hostname\": 3", "reg");
  EXPECT_THAT(bad.status().message(), HasSubstr("malformed JSON"));
}

TEST(Topology, ValidateRejectsAsymmetricLinks) {
  TopologyReport r = SampleReport();
  r.links[1][0].nvlink_count = 2;
  Status s = ValidateTopologyReport(r);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("GPU0-GPU1"));
  r = SampleReport();
  r.links[0][0].type = LinkType::kPix;
  EXPECT_THAT(ValidateTopologyReport(r).message(), HasSubstr("diagonal"));
}

TEST(Topology, LinkCellsAndPciIds) {
  EXPECT_EQ(LinkCell({LinkType::kNvLink, 18, 0, true}), "NV18");
  auto nv = ParseLinkCell("NV12");
  ASSERT_TRUE(nv.ok());
  EXPECT_EQ(nv->type, LinkType::kNvLink);
  EXPECT_EQ(nv->nvlink_count, 12);
  EXPECT_EQ(ParseLinkCell("pxb")->type, LinkType::kPxb);
  EXPECT_FALSE(ParseLinkCell("NV").ok());
  EXPECT_FALSE(ParseLinkCell("NV0").ok());
  EXPECT_FALSE(ParseLinkCell("QPI").ok());
  EXPECT_EQ(CanonicalPciBusId("00000000:18:00.0"), "0000:18:00.0");
  EXPECT_EQ(CanonicalPciBusId("0000:AB:1F.7"), "0000:ab:1f.7");
  EXPECT_EQ(CanonicalPciBusId("virtual"), "virtual");
  auto cpus = ParseCpuList("0-2,8, 10-11");
  ASSERT_TRUE(cpus.ok());
  EXPECT_EQ(*cpus, (std::vector<int>{0, 1, 2, 8, 10, 11}));
  EXPECT_FALSE(ParseCpuList("3-1").ok());
}

TEST(Topology, BandwidthsFromLinksAndPcie) {
  EXPECT_DOUBLE_EQ(NvLinkGbPerSPerLink(9), 26.562);
  EXPECT_DOUBLE_EQ(NvLinkGbPerSPerLink(8), 25.0);
  EXPECT_NEAR(PcieGbPerS(4, 16), 31.504, 1e-9);
  EXPECT_EQ(PcieGbPerS(0, 16), 0.0);
  TopologyReport r = SampleReport();
  r.gpus[0].nvlink_gb_per_s_per_link = 0;  // falls back to the sm_90 table value
  FillLinkBandwidths(&r, 25);
  EXPECT_NEAR(r.links[0][1].bandwidth_gb_per_s, 3 * 26.562, 1e-9);
  r.links[0][1].type = r.links[1][0].type = LinkType::kSys;
  FillLinkBandwidths(&r, 25);
  EXPECT_NEAR(r.links[0][1].bandwidth_gb_per_s, PcieGbPerS(5, 16) / 2, 1e-9);
}

TEST(Topology, FormatLooksLikeNvidiaSmi) {
  const std::string text = FormatTopology(SampleReport());
  EXPECT_THAT(text, HasSubstr("GPU0    GPU1    NIC0    CPU Affinity"));
  EXPECT_THAT(text, HasSubstr("GPU0    X       NV3     PIX     0-15"));
  EXPECT_THAT(text, HasSubstr("NIC0: mlx5_0 (ib0)  infiniband  400 Gb/s  up"));
  EXPECT_THAT(text, HasSubstr("NV#  = Connection traversing a bonded set of # NVLinks"));
}

// --- topology files --------------------------------------------------------

TEST(TopologyFile, EveryShippedTopologyParses) {
  struct Expect {
    const char* file;
    size_t hosts;
    size_t gpus_per_host;
    const char* cell01;  // link between GPU0 and GPU1
  };
  const Expect expects[] = {
      {"dgx_h100_x1.toml", 1, 8, "NV18"},     {"dgx_h100_x2.toml", 2, 8, "NV18"},
      {"dgx_h100_x4.toml", 4, 8, "NV18"},     {"dgx_h100_x128.toml", 128, 8, "NV18"},
      {"l40s_pcie_x4.toml", 4, 4, "PIX"},     {"a100_nvlink_pairs_x2.toml", 2, 4, "NV12"},
      {"mixed_a100_h100.toml", 4, 8, "NV12"}, {"h200_x2.toml", 1, 2, "NV18"},
  };
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ConfigPath("topologies"))) {
    if (entry.path().extension() == ".toml") ++files;
  }
  EXPECT_EQ(files, std::size(expects)) << "a topology file without a test expectation";
  for (const Expect& e : expects) {
    auto t = LoadTopologyFile(ConfigPath(std::string("topologies/") + e.file));
    ASSERT_TRUE(t.ok()) << e.file << ": " << t.status().ToString();
    ASSERT_EQ(t->nodes.size(), e.hosts) << e.file;
    for (const TopologyReport& r : t->nodes) {
      ASSERT_EQ(r.gpus.size(), e.gpus_per_host) << e.file;
      EXPECT_TRUE(ValidateTopologyReport(r).ok()) << e.file;
    }
    EXPECT_EQ(LinkCell(t->nodes[0].links[0][1]), e.cell01) << e.file;
    EXPECT_GT(t->nodes[0].links[0][1].bandwidth_gb_per_s, 0) << e.file;
  }
  // Spot checks: host naming, NICs, the L40S matrix and the pair layout.
  auto dgx = LoadTopologyFile(ConfigPath("topologies/dgx_h100_x4.toml"));
  EXPECT_EQ(dgx->nodes[3].hostname, "dgx-h100-3");
  ASSERT_EQ(dgx->nodes[0].nics.size(), 8u);
  EXPECT_EQ(dgx->nodes[0].nics[7].name, "mlx5_7");
  EXPECT_EQ(dgx->nodes[0].nics[7].numa_node, 1);
  EXPECT_NEAR(dgx->nodes[0].links[2][5].bandwidth_gb_per_s, 18 * 26.562, 1e-6);
  EXPECT_EQ(dgx->nodes[0].gpu_nic[5][5], LinkType::kPix);
  auto l40s = LoadTopologyFile(ConfigPath("topologies/l40s_pcie_x4.toml"));
  EXPECT_EQ(LinkCell(l40s->nodes[0].links[1][2]), "SYS");
  EXPECT_FALSE(l40s->nodes[0].links[1][2].p2p);
  EXPECT_TRUE(l40s->nodes[0].links[2][3].p2p);
  auto pairs = LoadTopologyFile(ConfigPath("topologies/a100_nvlink_pairs_x2.toml"));
  EXPECT_EQ(LinkCell(pairs->nodes[0].links[2][3]), "NV12");
  EXPECT_EQ(LinkCell(pairs->nodes[0].links[1][2]), "SYS");
  auto h200 = LoadTopologyFile(ConfigPath("topologies/h200_x2.toml"));
  EXPECT_NEAR(static_cast<double>(h200->nodes[0].gpus[0].memory_total_bytes) / (1 << 30), 139.8,
              1e-6);
}

TEST(TopologyFile, TomlRoundTrip) {
  // Every shipped file and a discovered-style report survive TOML -> parse.
  std::vector<ClusterTopology> inputs;
  for (const char* f : {"mixed_a100_h100.toml", "l40s_pcie_x4.toml", "h200_x2.toml"}) {
    auto t = LoadTopologyFile(ConfigPath(std::string("topologies/") + f));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    inputs.push_back(*t);
  }
  ClusterTopology sample;
  sample.name = "sample \"quoted\"";
  sample.description = "one host";
  sample.network.inter_node_gbit_per_s = 123.5;
  sample.network.latency_us = 3;
  sample.gpu_specs.push_back({"H200", 4800, 989});
  sample.nodes.push_back(SampleReport());
  inputs.push_back(sample);
  for (const ClusterTopology& in : inputs) {
    const std::string toml = ClusterTopologyToToml(in);
    auto out = ParseTopologyToml(toml, "roundtrip.toml");
    ASSERT_TRUE(out.ok()) << out.status().ToString() << "\n" << toml.substr(0, 2000);
    EXPECT_EQ(out->name, in.name);
    EXPECT_EQ(out->description, in.description);
    EXPECT_EQ(out->network.inter_node_gbit_per_s, in.network.inter_node_gbit_per_s);
    EXPECT_EQ(out->network.latency_us, in.network.latency_us);
    ASSERT_EQ(out->gpu_specs.size(), in.gpu_specs.size());
    ASSERT_EQ(out->nodes.size(), in.nodes.size());
    for (size_t i = 0; i < in.nodes.size(); ++i) ExpectSameReport(in.nodes[i], out->nodes[i]);
  }
}

TEST(TopologyFile, JsonReportsFromWorkers) {
  const std::string dir = ::tessera::testing::MakeTempDir("topo-json");
  const TopologyReport r = SampleReport();
  std::ofstream(dir + "/one.json") << TopologyReportToJson(r);
  std::ofstream(dir + "/two.json")
      << "[" << TopologyReportToJson(r) << "," << TopologyReportToJson(r) << "]";
  auto one = LoadTopologyFile(dir + "/one.json");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->nodes.size(), 1u);
  auto two = LoadTopologyFile(dir + "/two.json");
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->nodes.size(), 2u);
  EXPECT_EQ(LoadTopologyFile(dir + "/missing.toml").status().code(), StatusCode::kNotFound);
}

TEST(TopologyFile, ErrorsNameFileLineAndKey) {
  auto parse = [](const std::string& text) { return ParseTopologyToml(text, "t.toml"); };
  const std::string gpu =
      "[[nodes]]\nhostname = \"h\"\n[[nodes.gpus]]\ncount = 2\nname = \"NVIDIA H100\"\nmemory_gib "
      "= 80\n";
  ASSERT_TRUE(parse(gpu).ok());
  auto typo = parse(gpu + "sm_cont = 4\n");
  ASSERT_FALSE(typo.ok());
  EXPECT_THAT(typo.status().message(), HasSubstr("t.toml:7:"));
  EXPECT_THAT(typo.status().message(), HasSubstr("unknown key 'sm_cont'"));
  auto matrix = parse(gpu + "[nodes.links]\nmatrix = [\"X NV4\", \"NV4\"]\n");
  EXPECT_THAT(matrix.status().message(), HasSubstr("matrix row 1 has 1 cells for 2 GPUs"));
  auto asym = parse(gpu + "[nodes.links]\nmatrix = [\"X NV4\", \"NV2 X\"]\n");
  EXPECT_THAT(asym.status().message(), HasSubstr("NV4 one way and NV2 the other"));
  auto group = parse(gpu + "[nodes.links]\nnvlink_groups = [[0, 2]]\nnvlink_links = 4\n");
  EXPECT_THAT(group.status().message(), HasSubstr("names GPU 2 but the host has 2 GPUs"));
  auto nomem = parse("[[nodes]]\nhostname = \"h\"\n[[nodes.gpus]]\nname = \"X\"\n");
  EXPECT_THAT(nomem.status().message(), HasSubstr("memory_gib, memory_bytes"));
  auto syntax = parse("[[nodes]\n");
  ASSERT_FALSE(syntax.ok());
  EXPECT_THAT(syntax.status().message(), HasSubstr("t.toml:1:"));
  EXPECT_THAT(parse("name = \"x\"\n").status().message(), HasSubstr("no [[nodes]]"));
}

}  // namespace
}  // namespace tessera
