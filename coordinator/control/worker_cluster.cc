#include "coordinator/control/worker_cluster.h"

#include <algorithm>
#include <map>
#include <optional>

namespace tessera {

namespace {

struct HostWorkers {
  std::string host;
  std::vector<const ControlWorkerInfo*> workers;
};

GpuLink SelfLink() {
  GpuLink l;
  l.type = LinkType::kSelf;
  return l;
}

}  // namespace

StatusOr<WorkerCluster> BuildWorkerCluster(const std::vector<ControlWorkerInfo>& workers,
                                           const WorkerClusterOptions& options) {
  if (workers.empty()) return InvalidArgument("no worker has registered");
  const ControlWorkerInfo* a_cpu = nullptr;
  const ControlWorkerInfo* a_gpu = nullptr;
  for (const ControlWorkerInfo& w : workers) {
    if (w.registration->devices_size() == 0)
      return InvalidArgument("worker " + w.worker_id + " offers no device");
    (w.registration->devices(0).kind() == control::DEVICE_KIND_CPU ? a_cpu : a_gpu) = &w;
  }
  if (a_cpu && a_gpu)
    return InvalidArgument("workers " + a_cpu->worker_id + " (cpu) and " + a_gpu->worker_id + " (" +
                           a_gpu->registration->devices(0).name() +
                           ") run different backends; a pipeline runs on one backend");
  WorkerCluster out;
  out.cpu = a_cpu != nullptr;
  out.topology.name = "registered workers";
  out.topology.description = std::to_string(workers.size()) + " worker(s)";
  if (out.cpu) out.topology.gpu_specs.push_back(options.cpu_rank_spec);

  std::vector<HostWorkers> hosts;
  std::map<std::string, size_t> host_index;
  for (const ControlWorkerInfo& w : workers) {
    const std::string& h = w.registration->host();
    auto it = host_index.find(h);
    if (it == host_index.end()) {
      it = host_index.emplace(h, hosts.size()).first;
      hosts.push_back({h, {}});
    }
    hosts[it->second].workers.push_back(&w);
  }

  for (HostWorkers& hw : hosts) {
    // The host's report: the first worker's that has one.
    std::optional<TopologyReport> report;
    for (const ControlWorkerInfo* w : hw.workers) {
      if (w->registration->topology_json().empty()) continue;
      auto r = TopologyReportFromJson(w->registration->topology_json(),
                                      "the registration of worker " + w->worker_id);
      if (!r.ok()) return r.status();
      report = std::move(*r);
      break;
    }
    TopologyReport node;
    node.hostname = hw.host;
    node.source = report ? report->source : "registration";
    if (report) {
      node.driver_version = report->driver_version;
      node.cpu_source = report->cpu_source;
      node.cpu = report->cpu;
      node.host_memory_bytes = report->host_memory_bytes;
      node.nics = report->nics;
    } else {
      out.notes.push_back("host " + hw.host +
                          ": no topology report; devices as registered, links unknown");
    }
    std::vector<std::string> ids;
    if (out.cpu) {
      const int n = static_cast<int>(hw.workers.size());
      int64_t memory = node.host_memory_bytes;
      if (memory <= 0)
        memory = static_cast<int64_t>(hw.workers[0]->registration->devices(0).total_memory_bytes());
      const std::string cpu_name =
          node.cpu.model.empty() ? hw.workers[0]->registration->devices(0).name() : node.cpu.model;
      for (int i = 0; i < n; ++i) {
        GpuInfo g;
        g.index = i;
        g.name = "CPU rank (" + cpu_name + ")";
        g.memory_total_bytes = g.memory_free_bytes = memory / n;
        node.gpus.push_back(g);
        ids.push_back(hw.workers[i]->worker_id);
      }
      node.links.assign(n, std::vector<GpuLink>(n));
      for (int a = 0; a < n; ++a) {
        for (int b = 0; b < n; ++b) {
          if (a == b) {
            node.links[a][b] = SelfLink();
          } else {
            node.links[a][b].type = LinkType::kNode;
            node.links[a][b].bandwidth_gb_per_s = options.cpu_link_gb_per_s;
          }
        }
      }
      if (n > 1)
        out.notes.push_back("host " + hw.host + ": " + std::to_string(n) +
                            " CPU ranks share its memory (" +
                            std::to_string(memory / n / (1 << 20)) + " MiB each)");
    } else {
      // GPU workers in device-index order.
      std::vector<const ControlWorkerInfo*> ws = hw.workers;
      std::stable_sort(ws.begin(), ws.end(), [](const auto* x, const auto* y) {
        return x->registration->devices(0).index() < y->registration->devices(0).index();
      });
      std::vector<int> src;  // index into report->gpus, -1: from the Device
      for (size_t i = 0; i < ws.size(); ++i) {
        const control::Device& d = ws[i]->registration->devices(0);
        if (i > 0 && ws[i - 1]->registration->devices(0).index() == d.index())
          return InvalidArgument("workers " + ws[i - 1]->worker_id + " and " + ws[i]->worker_id +
                                 " both offer GPU " + std::to_string(d.index()) + " of host " +
                                 hw.host);
        int found = -1;
        if (report) {
          for (size_t g = 0; g < report->gpus.size(); ++g)
            if (report->gpus[g].index == static_cast<int>(d.index())) found = static_cast<int>(g);
          if (found < 0)
            return InvalidArgument(
                "worker " + ws[i]->worker_id + " offers GPU " + std::to_string(d.index()) +
                " that the topology report of host " + hw.host + " does not list");
          node.gpus.push_back(report->gpus[found]);
        } else {
          GpuInfo g;
          g.index = static_cast<int>(d.index());
          g.name = d.name();
          g.uuid = d.uuid();
          g.memory_total_bytes = static_cast<int64_t>(d.total_memory_bytes());
          g.memory_free_bytes = static_cast<int64_t>(d.free_memory_bytes());
          node.gpus.push_back(g);
        }
        src.push_back(found);
        ids.push_back(ws[i]->worker_id);
      }
      const size_t n = ws.size();
      node.links.assign(n, std::vector<GpuLink>(n));
      for (size_t a = 0; a < n; ++a) {
        for (size_t b = 0; b < n; ++b) {
          if (a == b) {
            node.links[a][b] = SelfLink();
          } else if (src[a] >= 0 && src[b] >= 0) {
            node.links[a][b] = report->links[src[a]][src[b]];
          } else {
            node.links[a][b].type = LinkType::kSys;
          }
        }
      }
      if (report && !report->gpu_nic.empty() &&
          std::all_of(src.begin(), src.end(), [](int s) { return s >= 0; })) {
        for (int s : src) node.gpu_nic.push_back(report->gpu_nic[s]);
      }
    }
    if (Status s = ValidateTopologyReport(node); !s.ok())
      return InvalidArgument("host " + hw.host + ": " + s.message());
    out.topology.nodes.push_back(std::move(node));
    out.workers.push_back(std::move(ids));
  }
  return out;
}

}  // namespace tessera
