// Observability end to end: a local cluster (tessera-coordinator and four
// tessera-worker processes, tp=2 x pp=2, on loopback) with every worker's
// /metrics on, a real Prometheus server (Debian's prometheus) scraping it
// with deploy/prometheus/prometheus.yml, promtool on every endpoint, and the
// Grafana dashboards' PromQL run against that Prometheus.
//
// Bounded: the cluster gets 40 s to become ready, Prometheus 15 s, and the
// scrapes 15 s; on a quiet machine the suite takes about 10 s.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "common/metrics/metric_catalog.h"
#include "common/net/http_client.h"
#include "support/daemon_cluster.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string SourcePath(const std::string& rel) {
  return ::tessera::testing::FixturePath("../../" + rel);
}

using ::tessera::testing::Spawn;

using ::tessera::testing::CommandResult;
using ::tessera::testing::RunCommand;

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

void Replace(std::string& s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
    s.replace(p, from.size(), to);
}

class Observability : public ::testing::Test {
 protected:
  static constexpr int kWorkers = 4;

  static void SetUpTestSuite() {
    ::tessera::testing::DaemonClusterOptions o;
    o.temp_prefix = "tessera-observability";
    o.model_toml = "";
    o.admin_toml = "port = 0\n";
    o.heartbeat_toml = "interval_seconds = 0.2\ntimeout_seconds = 5.0\n";
    o.kv_cache_toml = "max_blocks = 128\nblock_size = 4\n";
    o.scheduler_toml = "max_context = 128\n";
    o.extra_toml = "[logging]\nformat = \"json\"\n";  // the coordinator's; workers log text
    o.workers = kWorkers;
    o.workers_read_config = true;
    o.worker_metrics = true;
    o.worker_timeout_seconds = 0;
    o.worker_args = {"--log-format", "text"};
    o.ready_timeout_seconds = 40;
    cluster_ = new ::tessera::testing::DaemonCluster(std::move(o));
    dir_ = &cluster_->dir();
    const Status started = cluster_->Start();
    if (!started.ok()) {
      setup_error_ = new std::string(started.ToString());
      return;
    }
    api_port_ = cluster_->api_port();
    for (int i = 0; i < kWorkers; ++i) worker_ports_.push_back(cluster_->metrics_port(i));
    StartPrometheus();
  }

  static void StartPrometheus() {
    const std::string& dir = *dir_;
    std::filesystem::create_directories(dir + "/prom/targets");
    std::string config =
        ::tessera::testing::ReadFileOrDie(SourcePath("deploy/prometheus/prometheus.yml"));
    // Only the intervals change: one scrape a second.
    Replace(config, "scrape_interval: 5s", "scrape_interval: 1s");
    Replace(config, "evaluation_interval: 5s", "evaluation_interval: 1s");
    if (config.find("scrape_interval: 1s") == std::string::npos) {
      setup_error_ =
          new std::string("deploy/prometheus/prometheus.yml has no 5s intervals to shorten");
      return;
    }
    std::ofstream(dir + "/prom/prometheus.yml") << config;
    std::filesystem::copy_file(SourcePath("deploy/prometheus/rules.yml"), dir + "/prom/rules.yml");
    std::ofstream(dir + "/prom/targets/coordinator.json")
        << json::array({{{"targets", {"127.0.0.1:" + std::to_string(api_port_)}}}}).dump();
    json workers = json::array();
    for (int p : worker_ports_) workers.push_back("127.0.0.1:" + std::to_string(p));
    std::ofstream(dir + "/prom/targets/workers.json")
        << json::array({{{"targets", workers}}}).dump();
    pids_.push_back(
        Spawn({"prometheus", "--config.file=" + dir + "/prom/prometheus.yml",
               "--storage.tsdb.path=" + dir + "/prom/data", "--web.listen-address=127.0.0.1:0"},
              dir + "/prometheus.log"));
    const auto t0 = Clock::now();
    bool ready = false;
    // Prometheus logs the address it bound: msg="Listening on"
    // address=127.0.0.1:PORT.
    const std::regex listening(R"re(msg="Listening on" address=127\.0\.0\.1:([0-9]+))re");
    while (Clock::now() - t0 < std::chrono::seconds(15)) {
      if (prom_port_ == 0 && std::filesystem::exists(dir + "/prometheus.log")) {
        std::smatch m;
        const std::string log = ::tessera::testing::ReadFileOrDie(dir + "/prometheus.log");
        if (std::regex_search(log, m, listening)) prom_port_ = std::stoi(m[1].str());
      }
      if (prom_port_ != 0 && HttpCall(prom_port_, "GET", "/-/ready").status == 200) {
        ready = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!ready) {
      setup_error_ = new std::string("prometheus not ready in 15 s: " +
                                     ::tessera::testing::ReadFileOrDie(dir + "/prometheus.log"));
      return;
    }
    // One scrape of every target before the traffic, two after: rate() then
    // sees the counters rise.
    int base = 0;
    if (!WaitForScrapes(1, &base)) return;
    for (int i = 0; i < 6; ++i) {
      json req = {{"model", "llama_gqa_f32"}, {"prompt", std::vector<int>{5 + i, 17, 42, 7}},
                  {"max_tokens", 8},          {"temperature", 0},
                  {"ignore_eos", true},       {"stream", i % 2 == 0}};
      HttpReply r = HttpCall(api_port_, "POST", "/v1/completions", req.dump());
      if (r.status != 200) {
        setup_error_ = new std::string("completion failed: " + r.body);
        return;
      }
    }
    // Two more scrapes from now: the last one began after the traffic ended.
    if (!WaitForScrapes(1, &base)) return;
    WaitForScrapes(base + 2, nullptr);
  }

  // Waits until every one of the 1 + kWorkers targets is up and has at least
  // `n` scrapes; `*count` gets the smallest count seen.
  static bool WaitForScrapes(int n, int* count) {
    const auto t0 = Clock::now();
    std::string last;
    while (Clock::now() - t0 < std::chrono::seconds(15)) {
      const json r = Query("count_over_time(up[5m]) and on (instance) up == 1");
      if (r.value("status", "") == "success" &&
          r["data"]["result"].size() == static_cast<size_t>(1 + kWorkers)) {
        int lo = 1 << 30;
        for (const json& s : r["data"]["result"])
          lo = std::min(lo, std::stoi(s["value"][1].get<std::string>()));
        if (lo >= n) {
          if (count) *count = lo;
          return true;
        }
      }
      last = r.dump();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    setup_error_ =
        new std::string("targets not scraped " + std::to_string(n) + " times in 15 s: " + last);
    return false;
  }

  static void TearDownTestSuite() {
    ::tessera::testing::StopProcesses(pids_);
    pids_.clear();
    delete cluster_;  // stops the daemons
    cluster_ = nullptr;
  }

  void SetUp() override {
    if (setup_error_) FAIL() << *setup_error_;
  }

  static json Query(const std::string& promql) {
    HttpReply r = HttpCall(prom_port_, "GET", "/api/v1/query?query=" + UrlEncode(promql));
    json j = json::parse(r.body, nullptr, false);
    if (j.is_discarded())
      return json{{"status", "http " + std::to_string(r.status)}, {"body", r.body}};
    return j;
  }

  // The checks, run in one test so that the cluster and Prometheus start
  // once (ctest runs every test in its own process).
  void PromtoolAcceptsEveryEndpoint();
  void PrometheusHasPerGpuMemoryAndDecodeLatency();
  void DaemonLogsAreTaggedAndJsonWhenAsked();
  void DashboardQueriesNameExportedMetricsAndLabelsAndReturnData();

  static inline ::tessera::testing::DaemonCluster* cluster_ = nullptr;
  static inline const std::string* dir_ = nullptr;  // the cluster's
  static inline std::string* setup_error_ = nullptr;
  static inline int api_port_ = 0, prom_port_ = 0;
  static inline std::vector<int> worker_ports_;
  static inline std::vector<pid_t> pids_;  // Prometheus
};

void Observability::PromtoolAcceptsEveryEndpoint() {
  std::vector<std::pair<std::string, int>> endpoints = {{"coordinator", api_port_}};
  for (int i = 0; i < kWorkers; ++i)
    endpoints.push_back({"worker " + std::to_string(i), worker_ports_[i]});
  for (const auto& [name, port] : endpoints) {
    HttpReply r = HttpCall(port, "GET", "/metrics");
    ASSERT_EQ(r.status, 200) << name;
    const std::string path = *dir_ + "/scrape-" + std::to_string(port) + ".txt";
    std::ofstream(path) << r.body;
    const CommandResult c = RunCommand("promtool check metrics < " + path);
    EXPECT_EQ(c.rc, 0) << name << ": promtool check metrics:\n" << c.output;
    EXPECT_EQ(c.output, "") << name;
    // Every metric the endpoint serves is in the catalog, from its component.
    std::regex type_line("# TYPE (\\S+) ");
    for (auto it = std::sregex_iterator(r.body.begin(), r.body.end(), type_line);
         it != std::sregex_iterator(); ++it) {
      const MetricSpec* spec = FindMetricSpec((*it)[1].str());
      ASSERT_NE(spec, nullptr) << (*it)[1].str();
      EXPECT_EQ(spec->component, name == "coordinator" ? "coordinator" : "worker");
    }
  }
}

void Observability::PrometheusHasPerGpuMemoryAndDecodeLatency() {
  // Per-device memory: one series per worker, labelled with its rank.
  json mem = Query("tessera_gpu_memory_used_bytes");
  ASSERT_EQ(mem["status"], "success") << mem.dump();
  const json& series = mem["data"]["result"];
  ASSERT_EQ(series.size(), static_cast<size_t>(kWorkers)) << mem.dump();
  std::set<std::pair<std::string, std::string>> ranks;
  std::set<std::string> gpus;
  for (const json& s : series) {
    const json& m = s["metric"];
    EXPECT_EQ(m["job"], "tessera-worker");
    EXPECT_EQ(m["uuid"], "cpu");
    EXPECT_EQ(m["replica"], "0") << "one replica: " << m.dump();
    EXPECT_FALSE(m["node"].get<std::string>().empty());
    ranks.insert({m["stage"].get<std::string>(), m["tp_rank"].get<std::string>()});
    gpus.insert(m["gpu"].get<std::string>());
    const double used = std::stod(s["value"][1].get<std::string>());
    EXPECT_GT(used, 1e6) << "a worker's resident set is more than 1 MB";
  }
  EXPECT_EQ(ranks.size(), 4u) << "stages x tp ranks: " << mem.dump();
  EXPECT_EQ(gpus, (std::set<std::string>{"0", "1", "2", "3"}));
  // Weights + KV + activations stack up to the used memory on each device.
  json stack = Query(
      "sum by (gpu) (tessera_gpu_weight_bytes + tessera_gpu_kv_cache_capacity_bytes + "
      "tessera_gpu_activation_bytes) - sum by (gpu) (tessera_gpu_memory_used_bytes)");
  ASSERT_EQ(stack["data"]["result"].size(), 4u) << stack.dump();
  for (const json& s : stack["data"]["result"])  // activations are floored at 0
    EXPECT_GE(std::stod(s["value"][1].get<std::string>()), 0) << stack.dump();
  json weights = Query("tessera_gpu_weight_bytes > 0");
  EXPECT_EQ(weights["data"]["result"].size(), 4u) << weights.dump();

  // p90 decode step latency per replica and stage, from the histogram's rate.
  json q = Query(
      "histogram_quantile(0.9, sum by (le, replica, stage) "
      "(rate(tessera_step_duration_seconds_bucket{phase=\"decode\"}[1m])))");
  ASSERT_EQ(q["status"], "success") << q.dump();
  ASSERT_EQ(q["data"]["result"].size(), 2u) << "one per stage: " << q.dump();
  for (const json& s : q["data"]["result"]) {
    const double v = std::stod(s["value"][1].get<std::string>());
    EXPECT_TRUE(std::isfinite(v)) << q.dump();
    EXPECT_GT(v, 0);
    EXPECT_LT(v, 16.0) << "within the histogram's buckets";
  }
  // The coordinator's view: TTFT quantile and 6 finished requests.
  json ttft =
      Query("histogram_quantile(0.5, sum by (le) (rate(tessera_request_ttft_seconds_bucket[1m])))");
  ASSERT_EQ(ttft["data"]["result"].size(), 1u) << ttft.dump();
  EXPECT_GT(std::stod(ttft["data"]["result"][0]["value"][1].get<std::string>()), 0);
  json done = Query("sum(tessera_requests_total{status=\"length\"})");
  ASSERT_EQ(done["data"]["result"].size(), 1u) << done.dump();
  EXPECT_EQ(done["data"]["result"][0]["value"][1], "6");
  json tokens = Query("tessera_generation_tokens_total");
  EXPECT_EQ(tokens["data"]["result"][0]["value"][1], "48") << tokens.dump();
  // Communication: all_reduce inside each tp group, send/recv between stages.
  json comm = Query("sum by (op) (tessera_comm_bytes_total) > 0");
  std::set<std::string> ops;
  for (const json& s : comm["data"]["result"]) ops.insert(s["metric"]["op"].get<std::string>());
  for (const char* op : {"all_reduce", "send", "recv"})
    EXPECT_TRUE(ops.count(op)) << op << " missing: " << comm.dump();
  json bubble = Query("tessera_pipeline_bubble_ratio >= 0 <= 1");
  EXPECT_EQ(bubble["data"]["result"].size(), 4u) << bubble.dump();
  json workers = Query("tessera_workers{state=\"serving\"}");
  EXPECT_EQ(workers["data"]["result"][0]["value"][1], "4") << workers.dump();
}

void Observability::DaemonLogsAreTaggedAndJsonWhenAsked() {
  // The coordinator runs with logging.format = "json": every line an object.
  std::istringstream coordinator(::tessera::testing::ReadFileOrDie(*dir_ + "/coordinator.log"));
  int lines = 0;
  for (std::string line; std::getline(coordinator, line); ++lines) {
    const json j = json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    for (const char* key : {"time", "level", "node", "subsystem", "message"})
      EXPECT_TRUE(j.contains(key)) << key << " missing: " << line;
  }
  EXPECT_GT(lines, 2);
  // Workers run with --log-format text: rank tags once assigned, and the
  // shard load progress line.
  for (int i = 0; i < kWorkers; ++i) {
    const std::string log =
        ::tessera::testing::ReadFileOrDie(*dir_ + "/worker" + std::to_string(i) + ".log");
    EXPECT_NE(log.find("[node="), std::string::npos) << log;
    EXPECT_NE(log.find(" stage="), std::string::npos) << log;
    EXPECT_NE(log.find(" tp_rank="), std::string::npos) << log;
    EXPECT_NE(log.find("[load] loading worker"), std::string::npos) << log;
    EXPECT_NE(log.find("(100.0%)"), std::string::npos) << log;
  }
}

// --- Dashboards ------------------------------------------------------------

struct PanelQuery {
  std::string where;  // "dashboard.json: panel title"
  std::string expr;
};

void CollectQueries(const json& panels, const std::string& file, std::vector<PanelQuery>& out) {
  for (const json& p : panels) {
    if (p.contains("panels")) CollectQueries(p["panels"], file, out);  // rows
    if (!p.contains("targets")) continue;
    for (const json& t : p["targets"])
      if (t.contains("expr"))
        out.push_back({file + ": " + p.value("title", "?"), t["expr"].get<std::string>()});
  }
}

std::vector<PanelQuery> DashboardQueries() {
  std::vector<PanelQuery> out;
  for (const auto& e : std::filesystem::directory_iterator(SourcePath("dashboards"))) {
    if (e.path().extension() != ".json") continue;
    const json d = json::parse(::tessera::testing::ReadFileOrDie(e.path().string()));
    CollectQueries(d["panels"], e.path().filename().string(), out);
    for (const json& v : d["templating"]["list"])
      if (v.value("type", "") == "query") {
        const json& q = v["query"];
        out.push_back({e.path().filename().string() + ": variable " + v["name"].get<std::string>(),
                       q.is_object() ? q.value("query", "") : q.get<std::string>()});
      }
  }
  return out;
}

// Grafana's variables, as the "All" choice and a small interval.
std::string Substitute(std::string expr) {
  for (const char* v :
       {"$replica", "$node", "$gpu", "$stage", "${replica}", "${node}", "${gpu}", "${stage}"})
    Replace(expr, v, ".*");
  for (const char* v : {"$__rate_interval", "$__interval", "$__range"}) Replace(expr, v, "1m");
  return expr;
}

void Observability::DashboardQueriesNameExportedMetricsAndLabelsAndReturnData() {
  const std::vector<PanelQuery> queries = DashboardQueries();
  ASSERT_GE(queries.size(), 20u) << "dashboards/*.json";
  const std::regex metric_re("\\btessera_[a-z0-9_]+");
  const std::regex matcher_re("([a-zA-Z_][a-zA-Z0-9_]*)\\s*(=~|!~|!=|=)\\s*\"");
  const std::regex grouping_re(
      "\\b(?:by|without|on|ignoring|group_left|group_right)\\s*\\(([^)]*)\\)");
  const std::regex label_values_re("label_values\\(\\s*([a-z0-9_]+)\\s*,\\s*([a-z_]+)\\s*\\)");
  for (const PanelQuery& q : queries) {
    SCOPED_TRACE(q.where + ": " + q.expr);
    // Grafana's label_values(metric, label) variable queries.
    std::smatch lv;
    if (std::regex_search(q.expr, lv, label_values_re)) {
      const MetricSpec* spec = FindMetricSpec(lv[1].str());
      ASSERT_NE(spec, nullptr);
      EXPECT_NE(std::find(spec->labels.begin(), spec->labels.end(), lv[2].str()),
                spec->labels.end());
      json r = Query("count by (" + lv[2].str() + ") (" + lv[1].str() + ")");
      EXPECT_FALSE(r["data"]["result"].empty()) << r.dump();
      continue;
    }
    // 1. Every metric is exported, every label exists on one of them.
    std::set<std::string> labels = {"job", "instance", "deployment"};
    std::vector<std::string> metrics;
    bool unknown = false;
    for (auto it = std::sregex_iterator(q.expr.begin(), q.expr.end(), metric_re);
         it != std::sregex_iterator(); ++it) {
      std::string name = it->str();
      const MetricSpec* spec = FindMetricSpec(name);
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        if (spec) break;
        const std::string s = suffix;
        if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
          spec = FindMetricSpec(name.substr(0, name.size() - s.size()));
          if (spec && spec->type != MetricType::kHistogram) spec = nullptr;
          if (spec && s == "_bucket") labels.insert("le");
        }
      }
      if (!spec) {
        ADD_FAILURE() << name << " is not an exported metric";
        unknown = true;
        continue;
      }
      metrics.push_back(spec->name);
      labels.insert(spec->labels.begin(), spec->labels.end());
    }
    if (unknown) continue;  // reported; every other expression is still checked
    if (metrics.empty()) {
      ADD_FAILURE() << "no tessera metric in the expression";
      continue;
    }
    for (auto it = std::sregex_iterator(q.expr.begin(), q.expr.end(), matcher_re);
         it != std::sregex_iterator(); ++it)
      EXPECT_TRUE(labels.count((*it)[1].str())) << "label " << (*it)[1].str() << " does not exist";
    for (auto it = std::sregex_iterator(q.expr.begin(), q.expr.end(), grouping_re);
         it != std::sregex_iterator(); ++it) {
      std::string list = (*it)[1].str();
      std::regex word("[a-zA-Z_][a-zA-Z0-9_]*");
      for (auto w = std::sregex_iterator(list.begin(), list.end(), word);
           w != std::sregex_iterator(); ++w)
        EXPECT_TRUE(labels.count(w->str())) << "label " << w->str() << " does not exist";
    }
    // 2. Prometheus parses it and, when every metric it names has series,
    //    returns data.
    json r = Query(Substitute(q.expr));
    if (r["status"] != "success") {
      ADD_FAILURE() << "Prometheus refused it: " << r.dump();
      continue;
    }
    bool have_data = true;
    for (const std::string& m : metrics)
      have_data &=
          !Query("count(" + m +
                 (FindMetricSpec(m)->type == MetricType::kHistogram ? "_count)"
                                                                    : ")"))["data"]["result"]
               .empty();
    if (have_data) {
      EXPECT_FALSE(r["data"]["result"].empty()) << "no data: " << r.dump();
    }
  }
}

TEST_F(Observability, LocalClusterScrapedByPrometheus) {
  {
    SCOPED_TRACE("PromtoolAcceptsEveryEndpoint");
    PromtoolAcceptsEveryEndpoint();
  }
  {
    SCOPED_TRACE("PrometheusHasPerGpuMemoryAndDecodeLatency");
    PrometheusHasPerGpuMemoryAndDecodeLatency();
  }
  {
    SCOPED_TRACE("DaemonLogsAreTaggedAndJsonWhenAsked");
    DaemonLogsAreTaggedAndJsonWhenAsked();
  }
  {
    SCOPED_TRACE("DashboardQueriesNameExportedMetricsAndLabelsAndReturnData");
    DashboardQueriesNameExportedMetricsAndLabelsAndReturnData();
  }
}

}  // namespace
}  // namespace tessera
