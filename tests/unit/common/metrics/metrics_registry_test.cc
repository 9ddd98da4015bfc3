// MetricsRegistry (Prometheus text format 0.0.4), the metric catalog, and
// Debian's promtool on what the registry renders.
#include "common/metrics/metrics_registry.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <thread>

#include "common/metrics/metric_catalog.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using ::tessera::testing::CommandResult;
using ::tessera::testing::RunCommand;

TEST(MetricsRegistry, RendersCountersGaugesAndHistogramsWithLabels) {
  MetricsRegistry reg;
  auto c = reg.AddCounter("demo_requests_total", "Requests served.", {"status"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  (*c)->WithLabels({"ok"}).Inc();
  (*c)->WithLabels({"ok"}).Inc(2);
  (*c)->WithLabels({"error"}).Inc();
  (*c)->WithLabels({"error"}).Inc(-5);  // ignored: counters never go down
  auto g = reg.AddGauge("demo_memory_bytes", "Memory.");
  ASSERT_TRUE(g.ok());
  (*g)->WithLabels({}).Set(1.5e9);
  (*g)->WithLabels({}).Add(-0.5e9);
  auto h = reg.AddHistogram("demo_latency_seconds", "Latency.", {"phase"}, {0.1, 0.5, 1});
  ASSERT_TRUE(h.ok());
  Histogram& d = (*h)->WithLabels({"decode"});
  for (double v : {0.05, 0.1, 0.3, 0.7, 2.0}) d.Observe(v);
  d.Observe(std::nan(""));  // ignored
  EXPECT_EQ(reg.Render(),
            "# HELP demo_requests_total Requests served.\n"
            "# TYPE demo_requests_total counter\n"
            "demo_requests_total{status=\"error\"} 1\n"
            "demo_requests_total{status=\"ok\"} 3\n"
            "# HELP demo_memory_bytes Memory.\n"
            "# TYPE demo_memory_bytes gauge\n"
            "demo_memory_bytes 1000000000\n"
            "# HELP demo_latency_seconds Latency.\n"
            "# TYPE demo_latency_seconds histogram\n"
            "demo_latency_seconds_bucket{phase=\"decode\",le=\"0.1\"} 2\n"
            "demo_latency_seconds_bucket{phase=\"decode\",le=\"0.5\"} 3\n"
            "demo_latency_seconds_bucket{phase=\"decode\",le=\"1\"} 4\n"
            "demo_latency_seconds_bucket{phase=\"decode\",le=\"+Inf\"} 5\n"
            "demo_latency_seconds_sum{phase=\"decode\"} 3.15\n"
            "demo_latency_seconds_count{phase=\"decode\"} 5\n");
}

TEST(MetricsRegistry, EscapesHelpAndLabelValues) {
  EXPECT_EQ(EscapeHelp("a\\b\nc \"q\""), "a\\\\b\\nc \"q\"");
  EXPECT_EQ(EscapeLabelValue("a\\b\nc \"q\""), "a\\\\b\\nc \\\"q\\\"");
  MetricsRegistry reg;
  auto g = reg.AddGauge("demo_info", "Line one\nline two \\ end.", {"name"});
  ASSERT_TRUE(g.ok());
  (*g)->WithLabels({"say \"hi\"\\\n"}).Set(1);
  EXPECT_EQ(reg.Render(),
            "# HELP demo_info Line one\\nline two \\\\ end.\n"
            "# TYPE demo_info gauge\n"
            "demo_info{name=\"say \\\"hi\\\"\\\\\\n\"} 1\n");
}

TEST(MetricsRegistry, FormatsSpecialValues) {
  EXPECT_EQ(FormatMetricValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatMetricValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
  EXPECT_EQ(FormatMetricValue(42), "42");
  EXPECT_EQ(std::stod(FormatMetricValue(1.0 / 3)), 1.0 / 3);  // round-trips
}

TEST(MetricsRegistry, RejectsBadNamesAndBuckets) {
  MetricsRegistry reg;
  EXPECT_FALSE(reg.AddGauge("9lives", "x").ok());
  EXPECT_FALSE(reg.AddGauge("has-dash", "x").ok());
  EXPECT_FALSE(reg.AddCounter("demo_requests", "x").ok());  // no _total
  EXPECT_FALSE(reg.AddGauge("demo_a", "x", {"__reserved"}).ok());
  EXPECT_FALSE(reg.AddGauge("demo_b", "x", {"a", "a"}).ok());
  EXPECT_FALSE(reg.AddGauge("demo_c", "x", {"bad-label"}).ok());
  EXPECT_FALSE(reg.AddHistogram("demo_d", "x", {"le"}, {1}).ok());
  EXPECT_FALSE(reg.AddHistogram("demo_e", "x", {}, {}).ok());
  EXPECT_FALSE(reg.AddHistogram("demo_f", "x", {}, {1, 1}).ok());
  EXPECT_FALSE(reg.AddHistogram("demo_g", "x", {}, {1, INFINITY}).ok());
  ASSERT_TRUE(reg.AddHistogram("demo_h", "x", {}, {1}).ok());
  auto dup = reg.AddGauge("demo_h_count", "x");  // collides with the histogram's _count
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("demo_h"), std::string::npos);
  EXPECT_FALSE(reg.AddGauge("demo_h", "x").ok());
}

TEST(MetricsRegistry, CollectHooksRunBeforeRenderAndChildrenAreThreadSafe) {
  MetricsRegistry reg;
  auto g = reg.AddGauge("demo_sampled", "x");
  auto c = reg.AddCounter("demo_events_total", "x", {"worker"});
  ASSERT_TRUE(g.ok() && c.ok());
  int calls = 0;
  reg.AddCollectHook([&] { (*g)->WithLabels({}).Set(++calls); });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) (*c)->WithLabels({std::to_string(t % 2)}).Inc();
    });
  for (auto& t : threads) t.join();
  const std::string text = reg.Render();
  EXPECT_NE(text.find("demo_sampled 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("demo_events_total{worker=\"0\"} 2000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("demo_events_total{worker=\"1\"} 2000\n"), std::string::npos) << text;
  EXPECT_NE(reg.Render().find("demo_sampled 2\n"), std::string::npos);
}

TEST(MetricCatalog, FollowsPrometheusNamingAndRegisters) {
  std::set<std::string> names;
  for (const MetricSpec& s : MetricCatalog()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name << " listed twice";
    EXPECT_EQ(s.name.rfind("tessera_", 0), 0u) << s.name;
    EXPECT_FALSE(s.help.empty()) << s.name;
    EXPECT_TRUE(s.component == "coordinator" || s.component == "worker") << s.name;
    const bool unit = s.name.find("_bytes") != std::string::npos ||
                      s.name.find("_seconds") != std::string::npos ||
                      s.name.find("_ratio") != std::string::npos;
    if (s.type == MetricType::kHistogram) {
      EXPECT_TRUE(unit) << s.name << ": histograms have a unit";
    }
    EXPECT_EQ(s.name.find("_milli"), std::string::npos) << s.name << ": base units only";
    EXPECT_EQ(s.name.find("_kb"), std::string::npos) << s.name;
  }
  MetricsRegistry coordinator, worker;
  ASSERT_TRUE(coordinator.FromCatalog("coordinator").ok());
  ASSERT_TRUE(worker.FromCatalog("worker").ok());
  EXPECT_EQ(FindMetricSpec(metric::kStepDurationSeconds)->type, MetricType::kHistogram);
  EXPECT_EQ(FindMetricSpec("tessera_no_such_metric"), nullptr);
}

TEST(MetricCatalog, DocsListEveryMetric) {
  const std::string docs = ::tessera::testing::ReadFileOrDie(
      ::tessera::testing::FixturePath("../../docs/operations.md"));
  for (const MetricSpec& s : MetricCatalog())
    EXPECT_NE(docs.find("`" + s.name + "`"), std::string::npos)
        << s.name << " is missing from docs/operations.md";
}

// Every catalog metric with a sample child (labels filled in, one
// observation per histogram), rendered and checked by promtool.
TEST(MetricCatalog, PromtoolAcceptsTheWholeCatalog) {
  MetricsRegistry reg;
  ASSERT_TRUE(reg.FromCatalog("coordinator").ok());
  ASSERT_TRUE(reg.FromCatalog("worker").ok());
  for (const MetricSpec& s : MetricCatalog()) {
    std::vector<std::string> values;
    for (const std::string& l : s.labels) values.push_back(l == "node" ? "host \"a\"" : "0");
    if (s.type == MetricType::kCounter) reg.Counter(s.name).WithLabels(values).Inc(3);
    if (s.type == MetricType::kGauge) reg.Gauge(s.name).WithLabels(values).Set(0.5);
    if (s.type == MetricType::kHistogram) reg.Histogram(s.name).WithLabels(values).Observe(0.02);
  }
  const std::string path = ::tessera::testing::MakeTempDir("tessera-metrics") + "/metrics.txt";
  std::ofstream(path) << reg.Render();
  const CommandResult r = RunCommand("promtool check metrics < " + path);
  EXPECT_EQ(r.rc, 0) << "promtool check metrics (Debian package prometheus, installed by "
                        "scripts/setup):\n"
                     << r.output;
  EXPECT_EQ(r.output, "") << r.output;  // no lint warnings either
}

}  // namespace
}  // namespace tessera
