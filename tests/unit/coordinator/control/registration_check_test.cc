// CheckRegistrationPlausible (coordinator/control/registration_check.h):
// registrations no real host makes are refused naming the field.
#include "coordinator/control/registration_check.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera {
namespace {

control::Register OneDevice(control::DeviceKind kind, uint64_t memory_bytes) {
  control::Register r;
  r.set_host("h");
  control::Device* d = r.add_devices();
  d->set_kind(kind);
  d->set_total_memory_bytes(memory_bytes);
  d->set_free_memory_bytes(memory_bytes);
  return r;
}

std::string Message(const Status& s) { return s.ok() ? "OK" : s.message(); }

TEST(RegistrationCheck, RealDevicesPass) {
  EXPECT_TRUE(CheckRegistrationPlausible(OneDevice(control::DEVICE_KIND_CUDA, uint64_t{141} << 30),
                                         WorkerBackend::kAuto, nullptr)
                  .ok());
  EXPECT_TRUE(CheckRegistrationPlausible(OneDevice(control::DEVICE_KIND_CPU, uint64_t{2} << 40),
                                         WorkerBackend::kCpu, nullptr)
                  .ok());
  TopologyReport t;
  t.host_memory_bytes = int64_t{2} << 40;
  t.gpus.resize(8);
  for (GpuInfo& g : t.gpus) g.memory_total_bytes = int64_t{80} << 30;
  EXPECT_TRUE(CheckRegistrationPlausible(OneDevice(control::DEVICE_KIND_CUDA, uint64_t{80} << 30),
                                         WorkerBackend::kCuda, &t)
                  .ok());
}

TEST(RegistrationCheck, ImpossibleMemoryNamesTheField) {
  EXPECT_NE(
      Message(CheckRegistrationPlausible(OneDevice(control::DEVICE_KIND_CUDA, uint64_t{1} << 40),
                                         WorkerBackend::kAuto, nullptr))
          .find("devices[0].total_memory_bytes"),
      std::string::npos);
  EXPECT_NE(
      Message(CheckRegistrationPlausible(OneDevice(control::DEVICE_KIND_CPU, uint64_t{65} << 40),
                                         WorkerBackend::kAuto, nullptr))
          .find("devices[0].total_memory_bytes"),
      std::string::npos);
  TopologyReport t;
  t.gpus.resize(2);
  t.gpus[1].memory_total_bytes = int64_t{1} << 40;
  EXPECT_NE(Message(CheckRegistrationPlausible(OneDevice(control::DEVICE_KIND_CPU, 1 << 30),
                                               WorkerBackend::kAuto, &t))
                .find("topology_json.gpus[1].memory_total_bytes"),
            std::string::npos);
  t.gpus.assign(65, GpuInfo{});
  EXPECT_NE(Message(CheckRegistrationPlausible(OneDevice(control::DEVICE_KIND_CPU, 1 << 30),
                                               WorkerBackend::kAuto, &t))
                .find("topology_json.gpus: 65 GPUs"),
            std::string::npos);
}

TEST(RegistrationCheck, ABackendTheDeploymentDoesNotRunIsRefused) {
  EXPECT_EQ(
      Message(CheckRegistrationPlausible(OneDevice(control::DEVICE_KIND_CUDA, uint64_t{80} << 30),
                                         WorkerBackend::kCpu, nullptr)),
      "devices[0].kind: a CUDA device, but this deployment runs worker.backend = \"cpu\"");
  EXPECT_EQ(Message(CheckRegistrationPlausible(OneDevice(control::DEVICE_KIND_CPU, 1 << 30),
                                               WorkerBackend::kCuda, nullptr)),
            "devices[0].kind: a CPU device, but this deployment runs worker.backend = \"cuda\"");
}

}  // namespace
}  // namespace tessera
