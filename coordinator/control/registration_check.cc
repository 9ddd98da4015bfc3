#include "coordinator/control/registration_check.h"

#include <fmt/format.h>

#include <string>

namespace tessera {

namespace {

std::string Gib(uint64_t bytes) {
  return fmt::format("{} bytes ({:.1f} GiB)", bytes, static_cast<double>(bytes) / (1 << 30));
}

Status CheckDevices(const control::Register& reg, WorkerBackend backend) {
  if (reg.devices_size() > kMaxDevicesPerHost)
    return InvalidArgument(fmt::format("devices: {} devices; no host has more than {}",
                                       reg.devices_size(), kMaxDevicesPerHost));
  for (int i = 0; i < reg.devices_size(); ++i) {
    const control::Device& d = reg.devices(i);
    const std::string at = fmt::format("devices[{}]", i);
    const bool cuda = d.kind() == control::DEVICE_KIND_CUDA;
    const uint64_t bound = cuda ? kMaxGpuMemoryBytes : kMaxHostMemoryBytes;
    if (d.total_memory_bytes() > bound)
      return InvalidArgument(fmt::format("{}.total_memory_bytes: {} is more than any {} has ({})",
                                         at, Gib(d.total_memory_bytes()), cuda ? "GPU" : "host",
                                         Gib(bound)));
    if (backend == WorkerBackend::kCpu && cuda)
      return InvalidArgument(
          at + ".kind: a CUDA device, but this deployment runs worker.backend = \"cpu\"");
    if (backend == WorkerBackend::kCuda && !cuda)
      return InvalidArgument(
          at + ".kind: a CPU device, but this deployment runs worker.backend = \"cuda\"");
  }
  return Status::Ok();
}

Status CheckTopology(const TopologyReport& t) {
  if (static_cast<int64_t>(t.gpus.size()) > kMaxDevicesPerHost)
    return InvalidArgument(fmt::format("topology_json.gpus: {} GPUs; no host has more than {}",
                                       t.gpus.size(), kMaxDevicesPerHost));
  if (t.host_memory_bytes > 0 && static_cast<uint64_t>(t.host_memory_bytes) > kMaxHostMemoryBytes)
    return InvalidArgument(
        fmt::format("topology_json.host_memory_bytes: {} is more than any host has ({})",
                    Gib(static_cast<uint64_t>(t.host_memory_bytes)), Gib(kMaxHostMemoryBytes)));
  for (size_t i = 0; i < t.gpus.size(); ++i) {
    const int64_t m = t.gpus[i].memory_total_bytes;
    if (m > 0 && static_cast<uint64_t>(m) > kMaxGpuMemoryBytes)
      return InvalidArgument(
          fmt::format("topology_json.gpus[{}].memory_total_bytes: {} is more than any GPU has ({})",
                      i, Gib(static_cast<uint64_t>(m)), Gib(kMaxGpuMemoryBytes)));
  }
  return Status::Ok();
}

}  // namespace

Status CheckRegistrationPlausible(const control::Register& reg, WorkerBackend backend,
                                  const TopologyReport* topology) {
  TESSERA_RETURN_IF_ERROR(CheckDevices(reg, backend));
  if (topology) TESSERA_RETURN_IF_ERROR(CheckTopology(*topology));
  return Status::Ok();
}

}  // namespace tessera
