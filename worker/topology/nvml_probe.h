// NvmlProbe: GpuProbe over NVIDIA's management library, loaded at run time
// with dlopen("libnvidia-ml.so.1") so Tessera has no build-time dependency on
// the driver; a host without it is reported CPU-only.
//
// Declares only the NVML entry points and structs it calls (their layout is
// NVML's stable C ABI, nvml.h). SM counts, which NVML does not report, come
// from the CUDA driver (libcuda.so.1, also dlopen'ed) when it is present;
// that also cross-checks the device count (a mismatch is noted in the
// report).
//
// Thread-safety: not thread-safe; one probe per discovery.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "worker/topology/gpu_probe.h"

namespace tessera {

class NvmlProbe : public GpuProbe {
 public:
  // Loads `library` (default "libnvidia-ml.so.1") and calls nvmlInit_v2.
  // Errors: kUnavailable naming the library when dlopen fails, a required
  // symbol is missing or nvmlInit fails (no driver loaded).
  static StatusOr<std::unique_ptr<NvmlProbe>> Load(
      const std::string& library = "libnvidia-ml.so.1");
  ~NvmlProbe() override;

  std::string DriverVersion() override;
  int DeviceCount() override;
  StatusOr<GpuInfo> Device(int index) override;
  LinkType CommonAncestor(int a, int b) override;
  bool P2pRead(int a, int b) override;
  bool P2pNvLink(int a, int b) override;

  // Memory and utilisation of GPU `index` now (for metrics).
  struct Usage {
    int64_t used_bytes = 0;
    int64_t total_bytes = 0;
    double utilization = -1;  // GPU busy fraction over NVML's last sample period; -1 unknown
  };
  // Errors: kUnavailable naming the device and NVML's message.
  StatusOr<Usage> CurrentUsage(int index);

  // Notes gathered while probing (CUDA cross-check results).
  const std::vector<std::string>& notes() const { return notes_; }

  struct Api;  // resolved NVML and CUDA driver entry points

 private:
  NvmlProbe() = default;
  void* Handle(int index);
  void LoadCuda();

  void* lib_ = nullptr;
  void* cuda_lib_ = nullptr;
  std::unique_ptr<Api> api_;
  std::vector<void*> handles_;  // nvmlDevice_t per index
  // PCI bus id (canonical) -> SM count, from the CUDA driver.
  std::vector<std::pair<std::string, int>> cuda_sms_;
  std::vector<std::string> notes_;
};

}  // namespace tessera
