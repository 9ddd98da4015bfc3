// The deployment files, checked with the tools operators run
// (scripts/check-deploy): shellcheck on every script, yamllint, the
// Kubernetes manifests' structure, systemd-analyze verify on the units,
// promtool on the Prometheus config and rules, and the dashboards' freshness.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "support/test_util.h"

namespace tessera {
namespace {

std::string SourceDir() { return ::tessera::testing::FixturePath("../.."); }

using ::tessera::testing::CommandResult;
using ::tessera::testing::RunCommand;

CommandResult CheckDeploy(const std::string& check) {
  return RunCommand("BUILD_DIR='" + ::tessera::testing::BinaryDir() + "' bash '" + SourceDir() +
                    "/scripts/check-deploy' " + check);
}

TEST(Deploy, ShellcheckPassesOnEveryScript) {
  const CommandResult r = CheckDeploy("shellcheck");
  EXPECT_EQ(r.rc, 0) << r.output;
  // scripts/setup, scripts/test, scripts/check-deploy, .ci/run, the Slurm
  // script and the worker entrypoint at least.
  EXPECT_NE(r.output.find("shellcheck: "), std::string::npos) << r.output;
  const int n = std::stoi(r.output.substr(r.output.find("shellcheck: ") + 12));
  EXPECT_GE(n, 6) << r.output;
}

TEST(Deploy, YamllintPasses) {
  const CommandResult r = CheckDeploy("yaml");
  EXPECT_EQ(r.rc, 0) << r.output;
}

TEST(Deploy, KubernetesManifestsAreConsistent) {
  const CommandResult r = CheckDeploy("kubernetes");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("0 problem(s)"), std::string::npos) << r.output;
}

TEST(Deploy, KubernetesCheckCatchesBrokenReferences) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-k8s");
  std::filesystem::copy(SourceDir() + "/deploy/kubernetes", dir);
  // A Service whose targetPort names no container port, and a ServiceMonitor
  // scraping a port the Service lacks.
  std::string svc = ::tessera::testing::ReadFileOrDie(dir + "/coordinator.yaml");
  svc.replace(svc.find("targetPort: http"), 16, "targetPort: htp");
  std::ofstream(dir + "/coordinator.yaml") << svc;
  std::string mon = ::tessera::testing::ReadFileOrDie(dir + "/servicemonitor.yaml");
  mon.replace(mon.find("port: metrics-7"), 15, "port: metrics-9");
  std::ofstream(dir + "/servicemonitor.yaml") << mon;
  const CommandResult r =
      RunCommand("python3 '" + SourceDir() + "/tools/check_k8s_manifests.py' '" + dir + "'");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("targets 'htp', not a container port"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'metrics-9' is not a port of the selected Service"), std::string::npos)
      << r.output;
}

TEST(Deploy, SystemdUnitsVerify) {
  const CommandResult r = CheckDeploy("systemd");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("systemd-analyze verify: ok"), std::string::npos) << r.output;
}

TEST(Deploy, PrometheusConfigAndRulesPassPromtool) {
  const CommandResult r = CheckDeploy("prometheus");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("SUCCESS: 4 rules found"), std::string::npos) << r.output;
}

TEST(Deploy, DashboardsAreGeneratedFromTheirSource) {
  const CommandResult r = CheckDeploy("dashboards");
  EXPECT_EQ(r.rc, 0) << r.output;
}

}  // namespace
}  // namespace tessera
