// The dependency rule of docs/architecture.md ("The dependency rule"),
// checked on every #include "..." of the source tree:
//
//   common/base        the standard library and third-party libraries only
//   other common/<L>   common/base, its own layer, and the layers listed
//                      before it in kCommonLayers
//   kernels/           common/base and kernels/
//   worker/            common/, kernels/ and worker/, never coordinator/
//   coordinator/       common/ and coordinator/ only; within coordinator/:
//     placement/, control/  common/ and their own layer (side by side)
//     serving/              and placement/, control/
//     api/                  and serving/ (HTTP and JSON live here only)
//     coordinator/*.{h,cc}  (the daemon, the composition root) every layer
//   cli/, tests/, bench/: anything
// and JSON stays at the coordinator's edge: placement/, control/ and
// serving/ include neither <nlohmann/...> nor common/base's JSON helpers
// (json_parse.h, json_ref.h); they return typed values that api/ renders.
//
// A failure names the file, the line and the forbidden include.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// The layers of common/, lowest first: a layer may include the ones before it.
const std::vector<std::string> kCommonLayers = {"base",    "format",   "model", "tokenizer",
                                                "grammar", "topology", "net",   "config",
                                                "metrics", "wire",     "engine"};

// The layers of coordinator/ and the other layers each may include, as
// their CMake libraries link (tessera_coordinator_<layer>). Files directly in
// coordinator/ (the composition root) may include every layer.
const std::map<std::string, std::set<std::string>> kCoordinatorLayers = {
    {"placement", {}},
    {"control", {}},
    {"serving", {"placement", "control"}},
    {"api", {"placement", "control", "serving"}},
};

std::string SourceDir() { return TESSERA_SOURCE_DIR; }

struct Include {
  std::string file;  // relative to the source dir
  int line;
  std::string target;  // what is between the quotes (or the angle brackets)
  bool angle = false;  // #include <...>
};

std::vector<Include> IncludesUnder(const std::string& top) {
  std::vector<Include> out;
  static const std::regex kInclude(R"(^\s*#\s*include\s*(["<])([^">]+)[">])");
  for (const auto& e : fs::recursive_directory_iterator(SourceDir() + "/" + top)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh") continue;
    std::ifstream in(e.path());
    std::string text;
    int n = 0;
    while (std::getline(in, text)) {
      ++n;
      std::smatch m;
      if (std::regex_search(text, m, kInclude)) {
        out.push_back({fs::relative(e.path(), SourceDir()).string(), n, m[2].str(), m[1] == "<"});
      }
    }
  }
  return out;
}

bool StartsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// The layer of common/<layer>/..., or "" for a path outside common/.
std::string CommonLayer(const std::string& path) {
  if (!StartsWith(path, "common/")) return "";
  const size_t slash = path.find('/', 7);
  return slash == std::string::npos ? "" : path.substr(7, slash - 7);
}

int LayerIndex(const std::string& layer) {
  auto it = std::find(kCommonLayers.begin(), kCommonLayers.end(), layer);
  return it == kCommonLayers.end() ? -1 : static_cast<int>(it - kCommonLayers.begin());
}

std::string AllowedList(const std::set<std::string>& layers) {
  std::string out;
  for (const std::string& l : layers) out += (out.empty() ? "coordinator/" : ", coordinator/") + l;
  return out;
}

// The layer of coordinator/<layer>/..., "" for a file directly in
// coordinator/ (the composition root).
std::string CoordinatorLayer(const std::string& path) {
  const size_t slash = path.find('/', 12);
  return slash == std::string::npos ? "" : path.substr(12, slash - 12);
}

// "" when coordinator/ file `from` may include coordinator/ file `to`.
std::string CoordinatorViolation(const std::string& from, const std::string& to) {
  const std::string layer = CoordinatorLayer(from);
  const std::string to_layer = CoordinatorLayer(to);
  if (!to_layer.empty() && !kCoordinatorLayers.count(to_layer))
    return "includes \"" + to + "\", outside the layers of coordinator/";
  if (layer.empty()) return "";  // the composition root wires every layer
  auto it = kCoordinatorLayers.find(layer);
  if (it == kCoordinatorLayers.end())
    return "is in coordinator/" + layer + "/, which is not a layer of the rule";
  if (to_layer.empty())
    return "is in coordinator/" + layer + " and includes the composition root \"" + to + "\"";
  if (to_layer == layer || it->second.count(to_layer)) return "";
  return "is in coordinator/" + layer + " and includes \"" + to + "\" (coordinator/" + layer +
         " may include " +
         (it->second.empty() ? std::string("no other coordinator layer")
                             : AllowedList(it->second)) +
         ")";
}

// "" when `inc` is allowed, else why not.
std::string Violation(const Include& inc) {
  const std::string& from = inc.file;
  const std::string& to = inc.target;
  // A project include names its top folder; anything else must be local to
  // the including folder (kernels' .cuh helpers, generated files).
  const bool project = StartsWith(to, "common/") || StartsWith(to, "kernels/") ||
                       StartsWith(to, "worker/") || StartsWith(to, "coordinator/") ||
                       StartsWith(to, "cli/");
  if (!project) return "includes \"" + to + "\", which does not name its folder";
  if (StartsWith(from, "common/")) {
    const std::string layer = CommonLayer(from);
    const int index = LayerIndex(layer);
    if (index < 0) return "is in common/" + layer + "/, which is not a layer of the rule";
    if (!StartsWith(to, "common/")) return "is in common/ and includes \"" + to + "\"";
    const std::string to_layer = CommonLayer(to);
    const int to_index = LayerIndex(to_layer);
    if (to_index < 0) return "includes \"" + to + "\", outside the layers of common/";
    if (to_index > index) {
      return "is in common/" + layer + " and includes the higher layer common/" + to_layer;
    }
    return "";
  }
  if (StartsWith(from, "kernels/")) {
    if (StartsWith(to, "kernels/") || StartsWith(to, "common/base/")) return "";
    return "is in kernels/ and includes \"" + to + "\" (kernels/ may include common/base only)";
  }
  if (StartsWith(from, "worker/")) {
    if (StartsWith(to, "common/") || StartsWith(to, "kernels/") || StartsWith(to, "worker/"))
      return "";
    return "is in worker/ and includes \"" + to + "\"";
  }
  if (StartsWith(from, "coordinator/")) {
    if (StartsWith(to, "common/")) return "";
    if (!StartsWith(to, "coordinator/"))
      return "is in coordinator/ and includes \"" + to +
             "\" (coordinator/ may include common/ only)";
    return CoordinatorViolation(from, to);
  }
  return "";
}

// "" unless `inc` brings JSON below coordinator/api/.
std::string JsonViolation(const Include& inc) {
  if (!StartsWith(inc.file, "coordinator/")) return "";
  const std::string layer = CoordinatorLayer(inc.file);
  if (layer != "placement" && layer != "control" && layer != "serving") return "";
  const bool json =
      inc.angle ? StartsWith(inc.target, "nlohmann/") : StartsWith(inc.target, "common/base/json_");
  if (!json) return "";
  return "is in coordinator/" + layer + " and includes " +
         (inc.angle ? "<" + inc.target + ">" : "\"" + inc.target + "\"") +
         " (JSON belongs to coordinator/api/: return a typed value and render it there)";
}

TEST(IncludeRule, JsonStaysInTheCoordinatorsApiLayer) {
  std::vector<std::string> bad;
  size_t checked = 0;
  for (const Include& inc : IncludesUnder("coordinator")) {
    ++checked;
    const std::string why = JsonViolation(inc);
    if (!why.empty()) bad.push_back(inc.file + ":" + std::to_string(inc.line) + ": " + why);
  }
  EXPECT_GT(checked, 100u) << "the scan found too few includes: is TESSERA_SOURCE_DIR right?";
  std::string all;
  for (const auto& b : bad) all += b + "\n";
  EXPECT_TRUE(bad.empty()) << bad.size() << " JSON includes below coordinator/api/:\n" << all;
  // The rule refuses what it forbids.
  EXPECT_NE(JsonViolation({"coordinator/serving/x.cc", 1, "nlohmann/json.hpp", true}), "");
  EXPECT_NE(JsonViolation({"coordinator/placement/x.h", 1, "nlohmann/json_fwd.hpp", true}), "");
  EXPECT_NE(JsonViolation({"coordinator/control/x.cc", 1, "common/base/json_parse.h"}), "");
  EXPECT_EQ(JsonViolation({"coordinator/api/x.cc", 1, "nlohmann/json.hpp", true}), "");
  EXPECT_EQ(JsonViolation({"coordinator/serving/x.cc", 1, "common/base/status.h"}), "");
  EXPECT_EQ(JsonViolation({"coordinator/serving/x.cc", 1, "vector", true}), "");
}

TEST(IncludeRule, EveryIncludeFollowsTheDependencyRule) {
  std::vector<std::string> bad;
  size_t checked = 0;
  for (const char* top : {"common", "kernels", "worker", "coordinator"}) {
    for (const Include& inc : IncludesUnder(top)) {
      if (inc.angle) continue;  // system and third-party headers
      ++checked;
      const std::string why = Violation(inc);
      if (!why.empty()) bad.push_back(inc.file + ":" + std::to_string(inc.line) + ": " + why);
    }
  }
  EXPECT_GT(checked, 500u) << "the scan found too few includes: is TESSERA_SOURCE_DIR right?";
  std::string all;
  for (const auto& b : bad) all += b + "\n";
  EXPECT_TRUE(bad.empty()) << bad.size() << " forbidden includes:\n" << all;
}

// The rule itself catches what it forbids (so the test above cannot pass by
// checking nothing).
TEST(IncludeRule, TheRuleRefusesEachForbiddenEdge) {
  EXPECT_NE(Violation({"coordinator/x.cc", 1, "worker/model/sampler.h"}), "");
  EXPECT_NE(Violation({"coordinator/x.cc", 1, "kernels/backend.h"}), "");
  EXPECT_NE(Violation({"worker/daemon/main.cc", 1, "coordinator/api/openai_api.h"}), "");
  EXPECT_NE(Violation({"kernels/linear.h", 1, "common/format/model_config.h"}), "");
  EXPECT_NE(Violation({"common/base/status.h", 1, "common/format/dtype.h"}), "");
  EXPECT_NE(Violation({"common/format/checkpoint.h", 1, "common/engine/scheduler.h"}), "");
  EXPECT_NE(Violation({"common/engine/scheduler.h", 1, "worker/model/kv_cache.h"}), "");
  EXPECT_NE(Violation({"common/wire/control_codec.h", 1, "control.pb.h"}), "");
  EXPECT_EQ(Violation({"common/engine/scheduler.h", 1, "common/wire/step_batch.h"}), "");
  EXPECT_EQ(Violation({"worker/exec/rank_runner.h", 1, "common/engine/engine.h"}), "");
  EXPECT_EQ(Violation({"coordinator/api/openai_api.h", 1, "common/engine/scheduler.h"}), "");
  EXPECT_EQ(Violation({"kernels/linear.h", 1, "common/base/tensor.h"}), "");
  // The coordinator's layers: JSON and HTTP (api/) sit above serving.
  EXPECT_NE(Violation({"coordinator/serving/plan_apply.cc", 1, "coordinator/api/openai_api.h"}),
            "");
  EXPECT_NE(Violation({"coordinator/placement/planner.h", 1, "coordinator/serving/replica_set.h"}),
            "");
  EXPECT_NE(
      Violation({"coordinator/placement/planner.h", 1, "coordinator/control/worker_cluster.h"}),
      "");
  EXPECT_NE(
      Violation({"coordinator/control/control_server.h", 1, "coordinator/placement/planner.h"}),
      "");
  EXPECT_NE(Violation({"coordinator/api/admin_api.cc", 1, "coordinator/coordinator_daemon.h"}), "");
  EXPECT_NE(Violation({"coordinator/router/x.cc", 1, "coordinator/placement/planner.h"}), "");
  EXPECT_NE(Violation({"coordinator/api/admin_api.cc", 1, "coordinator/router/x.h"}), "");
  EXPECT_EQ(Violation({"coordinator/api/admin_api.cc", 1, "coordinator/serving/plan_control.h"}),
            "");
  EXPECT_EQ(
      Violation({"coordinator/serving/plan_runner.h", 1, "coordinator/control/remote_executor.h"}),
      "");
  EXPECT_EQ(Violation({"coordinator/coordinator_daemon.h", 1, "coordinator/api/openai_frontend.h"}),
            "");
}

}  // namespace
