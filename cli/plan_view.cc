#include "cli/plan_view.h"

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/net/endpoint.h"

namespace tessera::cli {

namespace {

using nlohmann::json;

std::string Mb(const json& v) {
  if (!v.is_number() || v.get<double>() < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v.get<double>() / 1e6);
  return buf;
}

// One replica's plan document: its placement line and rank table, each
// line of the table indented; `label` ("replica 1: ") starts the first line.
std::string FormatReplicaPlan(const json& plan, const std::string& label) {
  // tp_per_stage lists every stage's tp; shown when the stages differ (tp 0).
  std::string tp = std::to_string(plan.value("tp", 0));
  if (plan.value("tp", 0) == 0 && plan.contains("tp_per_stage")) tp = plan["tp_per_stage"].dump();
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%splacement: tp=%s pp=%d (plan %llu, %s), KV cache %lld blocks of %d tokens\n",
                label.c_str(), tp.c_str(), plan.value("pp", 0),
                static_cast<unsigned long long>(plan.value("plan_version", 0)),
                plan.value("mode", "").c_str(), static_cast<long long>(plan.value("kv_blocks", 0)),
                plan.value("kv_block_size", 0));
  out += buf;
  std::snprintf(buf, sizeof buf, "  %-5s %-5s %-7s %-10s %-13s %-13s %-13s %-13s %s\n", "rank",
                "stage", "tp_rank", "layers", "weights MB", "(predicted)", "KV MB", "(predicted)",
                "worker (host)");
  out += buf;
  for (const json& r : plan["ranks"]) {
    const json& layers = r["layers"];
    const std::string range = "[" + layers[0].dump() + ", " + layers[1].dump() + ")";
    std::snprintf(buf, sizeof buf, "  %-5d %-5d %-7d %-10s %-13s %-13s %-13s %-13s %s (%s)\n",
                  r.value("world_rank", 0), r.value("stage", 0), r.value("tp_rank", 0),
                  range.c_str(), Mb(r["weight_bytes"]).c_str(),
                  Mb(r["predicted_weight_bytes"]).c_str(), Mb(r["kv_bytes"]).c_str(),
                  Mb(r["predicted_kv_bytes"]).c_str(), r.value("worker", "").c_str(),
                  r.value("host", "").c_str());
    out += buf;
  }
  return out;
}

}  // namespace

std::string FormatServingPlan(const std::string& plan_json, bool with_explanation) {
  const json plan = json::parse(plan_json, nullptr, false);
  if (plan.is_discarded() || !plan.is_object() || !plan.contains("ranks"))
    return "placement: unavailable (" + plan_json + ")\n";
  std::string out;
  if (plan.contains("error") && plan["error"].is_string())
    out += "placement failed: " + plan["error"].get<std::string>() + "\n";
  if (!plan.contains("planner") && !plan.contains("tp_per_stage")) {
    if (plan.contains("waiting_for_workers"))
      out += "placement: waiting for " + plan["waiting_for_workers"].dump() + " worker(s)\n";
    return out;
  }
  // Several replicas: each one's table (their layouts may differ:
  // parallel.replica_override), and each distinct planner explanation once.
  std::vector<json> replicas;
  if (plan.contains("replicas") && plan["replicas"].is_array() && plan["replicas"].size() > 1)
    for (const json& r : plan["replicas"])
      if (r.is_object() && r.contains("ranks") && r.contains("tp_per_stage")) replicas.push_back(r);
  if (replicas.empty()) replicas.push_back(plan);
  std::string last_text;
  for (const json& r : replicas) {
    if (with_explanation && r.contains("planner")) {
      const std::string text = r["planner"].value("text", "");
      if (text != last_text) out += text + "\n";
      last_text = text;
    }
    out += FormatReplicaPlan(
        r, replicas.size() > 1 ? "replica " + std::to_string(r.value("replica", 0)) + ": " : "");
  }
  return out;
}

Status ParseHttpUrl(const std::string& url, std::string* host, int* port) {
  std::string rest = url;
  if (rest.rfind("https://", 0) == 0)
    return InvalidArgument("--cluster " + url + ": https is not supported by this client");
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos)
    return InvalidArgument("--cluster " + url + ": expected http://HOST:PORT without a path");
  // "PORT" and ":PORT" name this host.
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0)
    rest = "127.0.0.1:" + rest.substr(colon == 0 ? 1 : 0);
  StatusOr<TcpEndpoint> parsed = ParseHostPort(rest, EndpointUse::kConnect);
  if (!parsed.ok())
    return InvalidArgument("--cluster " + url +
                           ": expected http://HOST:PORT: " + parsed.status().message());
  *host = parsed->host;
  *port = parsed->port;
  return Status::Ok();
}

}  // namespace tessera::cli
