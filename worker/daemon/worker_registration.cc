#include "worker/daemon/worker_registration.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/wire/control_codec.h"

namespace tessera {

StatusOr<control::Register> BuildRegistration(const TopologyReport& report,
                                              const WorkerRegistrationOptions& options) {
  control::Register reg;
  const std::string host = options.host.empty() ? report.hostname : options.host;
  if (host.empty())
    return InvalidArgument("the topology report has no hostname and worker.host is not set");
  reg.set_host(host);
  reg.set_pid(static_cast<uint32_t>(getpid()));
  reg.set_build_version(TESSERA_VERSION);
  reg.set_data_address(options.data_address);
  control::Device* dev = reg.add_devices();
  dev->set_index(static_cast<uint32_t>(options.device));
  dev->set_numa_node(-1);
  if (options.cpu) {
    dev->set_kind(control::DEVICE_KIND_CPU);
    dev->set_name(report.cpu.model.empty() ? "cpu" : report.cpu.model);
    dev->set_total_memory_bytes(
        static_cast<uint64_t>(std::max<int64_t>(0, report.host_memory_bytes)));
    dev->set_free_memory_bytes(dev->total_memory_bytes());
  } else {
    const GpuInfo* gpu = nullptr;
    std::string have;
    for (const GpuInfo& g : report.gpus) {
      if (g.index == options.device) gpu = &g;
      have += (have.empty() ? "" : ", ") + std::to_string(g.index);
    }
    if (!gpu)
      return NotFound("GPU " + std::to_string(options.device) + " is not on host " + host +
                      " (its GPUs: " + (have.empty() ? "none" : have) + ")");
    dev->set_kind(control::DEVICE_KIND_CUDA);
    dev->set_name(gpu->name);
    dev->set_uuid(gpu->uuid);
    dev->set_total_memory_bytes(
        static_cast<uint64_t>(std::max<int64_t>(0, gpu->memory_total_bytes)));
    dev->set_free_memory_bytes(
        std::min<uint64_t>(dev->total_memory_bytes(),
                           static_cast<uint64_t>(std::max<int64_t>(0, gpu->memory_free_bytes))));
    dev->set_compute_capability(static_cast<uint32_t>(gpu->cc_major * 10 + gpu->cc_minor));
    dev->set_pci_bus_id(gpu->pci_bus_id);
    dev->set_numa_node(gpu->numa_node);
  }
  control::TopologyReport* topo = reg.mutable_topology();
  topo->set_source(report.source);
  reg.set_topology_json(TopologyReportToJson(report, -1));
  return reg;
}

std::string DefaultWorkerId(const std::string& host, int device) {
  const std::string suffix = ":" + std::to_string(device);
  std::string id = host.substr(0, kMaxWorkerIdBytes - suffix.size());
  for (char& c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '@' || c == '-';
    if (!ok) c = '-';
  }
  return id + suffix;
}

}  // namespace tessera
