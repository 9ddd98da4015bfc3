#include "worker/worker_registration.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

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

StatusOr<std::string> EndpointHost(const std::string& endpoint) {
  const std::string bad = "endpoint '" + endpoint + "' is not tcp://HOST:PORT";
  if (endpoint.rfind("tcp://", 0) != 0) return InvalidArgument(bad);
  const std::string rest = endpoint.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return InvalidArgument(bad);
  std::string host = rest.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty()) return InvalidArgument(bad);
  return host;
}

StatusOr<std::string> LocalAddressToward(const std::string& endpoint) {
  TESSERA_ASSIGN_OR_RETURN(std::string host, EndpointHost(endpoint));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &res); rc != 0)
    return Unavailable("cannot resolve the coordinator host '" + host + "': " + gai_strerror(rc));
  std::string out, err = "no address";
  for (addrinfo* a = res; a && out.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {0};
      const void* src =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, src, buf, sizeof buf)) out = buf;
    } else {
      err = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(res);
  if (out.empty()) return Unavailable("no route to the coordinator host '" + host + "': " + err);
  return out;
}

}  // namespace tessera
