#include "worker/topology/nvml_probe.h"

#include <dlfcn.h>

#include <cstring>

namespace tessera {

namespace {

// The subset of nvml.h's C ABI used here.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// nvmlUtilization_t: percent of the last sample period the GPU (gpu) and
// its memory (memory) were busy.
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};

struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
  char slack[64];  // room should a later NVML grow the struct
};

// nvmlGpuTopologyLevel_t
constexpr int kTopoInternal = 0, kTopoSingle = 10, kTopoMultiple = 20, kTopoHostBridge = 30,
              kTopoNode = 40, kTopoSystem = 50;
// nvmlGpuP2PCapsIndex_t, nvmlGpuP2PStatus_t
constexpr int kP2pCapsRead = 0, kP2pCapsNvLink = 2, kP2pStatusOk = 0;
// nvmlIntNvLinkDeviceType_t
constexpr int kNvLinkRemoteGpu = 0, kNvLinkRemoteSwitch = 2;
// NVML_NVLINK_MAX_LINKS is 18 in current drivers; probe past it and stop at
// the first link index NVML rejects.
constexpr unsigned kMaxLinks = 32;
constexpr unsigned kNameBuffer = 96, kUuidBuffer = 96, kVersionBuffer = 96;

// CUDA driver API (cuda.h) subset.
using CUresult = int;
constexpr int kCuAttrMultiprocessorCount = 16;

}  // namespace

struct NvmlProbe::Api {
  nvmlReturn_t (*Init)() = nullptr;
  nvmlReturn_t (*Shutdown)() = nullptr;
  const char* (*ErrorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*SystemGetDriverVersion)(char*, unsigned) = nullptr;
  nvmlReturn_t (*DeviceGetCount)(unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetHandleByIndex)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*DeviceGetName)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*DeviceGetUUID)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*DeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*DeviceGetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*DeviceGetCudaComputeCapability)(nvmlDevice_t, int*, int*) = nullptr;
  nvmlReturn_t (*DeviceGetPciInfo)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*DeviceGetMaxPcieLinkGeneration)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetMaxPcieLinkWidth)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetNvLinkState)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*DeviceGetNvLinkVersion)(nvmlDevice_t, unsigned, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetNvLinkRemotePciInfo)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*DeviceGetNvLinkRemoteDeviceType)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*DeviceGetTopologyCommonAncestor)(nvmlDevice_t, nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*DeviceGetP2PStatus)(nvmlDevice_t, nvmlDevice_t, int, int*) = nullptr;

  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(int*, int) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, int) = nullptr;
  CUresult (*cuDeviceGetPCIBusId)(char*, int, int) = nullptr;
};

namespace {

template <typename F>
bool Resolve(void* lib, const char* name, F* fn) {
  void* sym = dlsym(lib, name);
  *fn = reinterpret_cast<F>(sym);
  return sym != nullptr;
}

}  // namespace

StatusOr<std::unique_ptr<NvmlProbe>> NvmlProbe::Load(const std::string& library) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    return Unavailable("NVML: cannot load " + library + ": " + (err ? err : "unknown error"));
  }
  std::unique_ptr<NvmlProbe> p(new NvmlProbe());
  p->lib_ = lib;
  p->api_ = std::make_unique<Api>();
  Api& a = *p->api_;
  // Required entry points; the rest are optional (older drivers).
  const bool ok = Resolve(lib, "nvmlInit_v2", &a.Init) &&
                  Resolve(lib, "nvmlShutdown", &a.Shutdown) &&
                  Resolve(lib, "nvmlErrorString", &a.ErrorString) &&
                  Resolve(lib, "nvmlDeviceGetCount_v2", &a.DeviceGetCount) &&
                  Resolve(lib, "nvmlDeviceGetHandleByIndex_v2", &a.DeviceGetHandleByIndex) &&
                  Resolve(lib, "nvmlDeviceGetName", &a.DeviceGetName) &&
                  Resolve(lib, "nvmlDeviceGetMemoryInfo", &a.DeviceGetMemoryInfo);
  if (!ok)
    return Unavailable("NVML: " + library + " lacks a required entry point (nvmlInit_v2, ...)");
  Resolve(lib, "nvmlSystemGetDriverVersion", &a.SystemGetDriverVersion);
  Resolve(lib, "nvmlDeviceGetUUID", &a.DeviceGetUUID);
  Resolve(lib, "nvmlDeviceGetUtilizationRates", &a.DeviceGetUtilizationRates);
  Resolve(lib, "nvmlDeviceGetCudaComputeCapability", &a.DeviceGetCudaComputeCapability);
  if (!Resolve(lib, "nvmlDeviceGetPciInfo_v3", &a.DeviceGetPciInfo))
    Resolve(lib, "nvmlDeviceGetPciInfo_v2", &a.DeviceGetPciInfo);
  Resolve(lib, "nvmlDeviceGetMaxPcieLinkGeneration", &a.DeviceGetMaxPcieLinkGeneration);
  Resolve(lib, "nvmlDeviceGetMaxPcieLinkWidth", &a.DeviceGetMaxPcieLinkWidth);
  Resolve(lib, "nvmlDeviceGetNvLinkState", &a.DeviceGetNvLinkState);
  Resolve(lib, "nvmlDeviceGetNvLinkVersion", &a.DeviceGetNvLinkVersion);
  if (!Resolve(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2", &a.DeviceGetNvLinkRemotePciInfo))
    Resolve(lib, "nvmlDeviceGetNvLinkRemotePciInfo", &a.DeviceGetNvLinkRemotePciInfo);
  Resolve(lib, "nvmlDeviceGetNvLinkRemoteDeviceType", &a.DeviceGetNvLinkRemoteDeviceType);
  Resolve(lib, "nvmlDeviceGetTopologyCommonAncestor", &a.DeviceGetTopologyCommonAncestor);
  Resolve(lib, "nvmlDeviceGetP2PStatus", &a.DeviceGetP2PStatus);
  const nvmlReturn_t rc = a.Init();
  if (rc != kNvmlSuccess) {
    const std::string msg = a.ErrorString ? a.ErrorString(rc) : "error " + std::to_string(rc);
    a.Shutdown = nullptr;  // not initialised: nothing to shut down
    return Unavailable("NVML: nvmlInit failed: " + msg);
  }
  unsigned count = 0;
  if (a.DeviceGetCount(&count) != kNvmlSuccess) count = 0;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t h = nullptr;
    p->handles_.push_back(a.DeviceGetHandleByIndex(i, &h) == kNvmlSuccess ? h : nullptr);
  }
  p->LoadCuda();
  return p;
}

NvmlProbe::~NvmlProbe() {
  if (api_ && api_->Shutdown) api_->Shutdown();
  if (lib_) dlclose(lib_);
  if (cuda_lib_) dlclose(cuda_lib_);
}

void NvmlProbe::LoadCuda() {
  cuda_lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cuda_lib_) {
    notes_.push_back("CUDA driver (libcuda.so.1) not loadable: no SM counts, no cross-check");
    return;
  }
  Api& a = *api_;
  if (!Resolve(cuda_lib_, "cuInit", &a.cuInit) ||
      !Resolve(cuda_lib_, "cuDeviceGetCount", &a.cuDeviceGetCount) ||
      !Resolve(cuda_lib_, "cuDeviceGet", &a.cuDeviceGet) ||
      !Resolve(cuda_lib_, "cuDeviceGetAttribute", &a.cuDeviceGetAttribute) ||
      !Resolve(cuda_lib_, "cuDeviceGetPCIBusId", &a.cuDeviceGetPCIBusId)) {
    notes_.push_back("CUDA driver lacks cuDeviceGetAttribute or cuDeviceGetPCIBusId");
    return;
  }
  if (a.cuInit(0) != 0) {
    notes_.push_back("CUDA driver: cuInit failed (CUDA_VISIBLE_DEVICES empty or no device)");
    return;
  }
  int count = 0;
  if (a.cuDeviceGetCount(&count) != 0) count = 0;
  for (int i = 0; i < count; ++i) {
    int dev = 0, sms = 0;
    char bus[64] = {0};
    if (a.cuDeviceGet(&dev, i) != 0) continue;
    if (a.cuDeviceGetAttribute(&sms, kCuAttrMultiprocessorCount, dev) != 0) sms = 0;
    if (a.cuDeviceGetPCIBusId(bus, sizeof bus, dev) != 0) continue;
    cuda_sms_.push_back({CanonicalPciBusId(bus), sms});
  }
  if (static_cast<size_t>(count) != handles_.size()) {
    notes_.push_back("CUDA sees " + std::to_string(count) + " device(s), NVML " +
                     std::to_string(handles_.size()) + " (CUDA_VISIBLE_DEVICES?)");
  }
}

void* NvmlProbe::Handle(int index) {
  return index >= 0 && static_cast<size_t>(index) < handles_.size() ? handles_[index] : nullptr;
}

std::string NvmlProbe::DriverVersion() {
  char buf[kVersionBuffer] = {0};
  if (!api_->SystemGetDriverVersion ||
      api_->SystemGetDriverVersion(buf, sizeof buf) != kNvmlSuccess)
    return "";
  return buf;
}

int NvmlProbe::DeviceCount() { return static_cast<int>(handles_.size()); }

StatusOr<NvmlProbe::Usage> NvmlProbe::CurrentUsage(int index) {
  Api& a = *api_;
  nvmlDevice_t h = Handle(index);
  if (!h) return Unavailable("NVML: no handle for GPU " + std::to_string(index));
  nvmlMemory_t mem{};
  const nvmlReturn_t rc = a.DeviceGetMemoryInfo(h, &mem);
  if (rc != kNvmlSuccess)
    return Unavailable("NVML: nvmlDeviceGetMemoryInfo(GPU " + std::to_string(index) +
                       "): " + a.ErrorString(rc));
  Usage u;
  u.used_bytes = static_cast<int64_t>(mem.used);
  u.total_bytes = static_cast<int64_t>(mem.total);
  nvmlUtilization_t util{};
  if (a.DeviceGetUtilizationRates && a.DeviceGetUtilizationRates(h, &util) == kNvmlSuccess)
    u.utilization = util.gpu / 100.0;
  return u;
}

StatusOr<GpuInfo> NvmlProbe::Device(int index) {
  Api& a = *api_;
  nvmlDevice_t h = Handle(index);
  if (!h) return Unavailable("NVML: no handle for GPU " + std::to_string(index));
  GpuInfo g;
  g.index = index;
  char buf[kNameBuffer] = {0};
  nvmlReturn_t rc = a.DeviceGetName(h, buf, sizeof buf);
  if (rc != kNvmlSuccess)
    return Unavailable("NVML: nvmlDeviceGetName(GPU " + std::to_string(index) +
                       "): " + a.ErrorString(rc));
  g.name = buf;
  char uuid[kUuidBuffer] = {0};
  if (a.DeviceGetUUID && a.DeviceGetUUID(h, uuid, sizeof uuid) == kNvmlSuccess) g.uuid = uuid;
  nvmlMemory_t mem{};
  rc = a.DeviceGetMemoryInfo(h, &mem);
  if (rc != kNvmlSuccess)
    return Unavailable("NVML: nvmlDeviceGetMemoryInfo(GPU " + std::to_string(index) +
                       "): " + a.ErrorString(rc));
  g.memory_total_bytes = static_cast<int64_t>(mem.total);
  g.memory_free_bytes = static_cast<int64_t>(mem.free);
  if (a.DeviceGetCudaComputeCapability)
    a.DeviceGetCudaComputeCapability(h, &g.cc_major, &g.cc_minor);
  nvmlPciInfo_t pci{};
  if (a.DeviceGetPciInfo && a.DeviceGetPciInfo(h, &pci) == kNvmlSuccess) {
    pci.busId[sizeof pci.busId - 1] = '\0';
    g.pci_bus_id = CanonicalPciBusId(pci.busId);
  }
  unsigned v = 0;
  if (a.DeviceGetMaxPcieLinkGeneration && a.DeviceGetMaxPcieLinkGeneration(h, &v) == kNvmlSuccess)
    g.pcie_gen = static_cast<int>(v);
  if (a.DeviceGetMaxPcieLinkWidth && a.DeviceGetMaxPcieLinkWidth(h, &v) == kNvmlSuccess)
    g.pcie_width = static_cast<int>(v);
  for (const auto& [bus, sms] : cuda_sms_)
    if (bus == g.pci_bus_id) g.sm_count = sms;
  if (a.DeviceGetNvLinkState) {
    for (unsigned link = 0; link < kMaxLinks; ++link) {
      int active = 0;
      if (a.DeviceGetNvLinkState(h, link, &active) != kNvmlSuccess) break;  // past the last link
      if (!active) continue;
      NvLinkInfo l;
      l.link = static_cast<int>(link);
      unsigned ver = 0;
      if (a.DeviceGetNvLinkVersion && a.DeviceGetNvLinkVersion(h, link, &ver) == kNvmlSuccess)
        l.version = static_cast<int>(ver);
      nvmlPciInfo_t remote{};
      if (a.DeviceGetNvLinkRemotePciInfo &&
          a.DeviceGetNvLinkRemotePciInfo(h, link, &remote) == kNvmlSuccess) {
        remote.busId[sizeof remote.busId - 1] = '\0';
        l.remote_pci_bus_id = CanonicalPciBusId(remote.busId);
      }
      int type = -1;
      l.remote_type = "unknown";
      if (a.DeviceGetNvLinkRemoteDeviceType &&
          a.DeviceGetNvLinkRemoteDeviceType(h, link, &type) == kNvmlSuccess) {
        if (type == kNvLinkRemoteGpu) l.remote_type = "gpu";
        if (type == kNvLinkRemoteSwitch) l.remote_type = "switch";
      }
      g.nvlinks.push_back(l);
    }
  }
  return g;
}

LinkType NvmlProbe::CommonAncestor(int a, int b) {
  int level = -1;
  if (!api_->DeviceGetTopologyCommonAncestor || !Handle(a) || !Handle(b) ||
      api_->DeviceGetTopologyCommonAncestor(Handle(a), Handle(b), &level) != kNvmlSuccess)
    return LinkType::kUnknown;
  switch (level) {
    case kTopoInternal:  // two GPUs on one board: nvidia-smi prints PIX
    case kTopoSingle:
      return LinkType::kPix;
    case kTopoMultiple:
      return LinkType::kPxb;
    case kTopoHostBridge:
      return LinkType::kPhb;
    case kTopoNode:
      return LinkType::kNode;
    case kTopoSystem:
      return LinkType::kSys;
    default:
      return LinkType::kUnknown;
  }
}

bool NvmlProbe::P2pRead(int a, int b) {
  int status = -1;
  return api_->DeviceGetP2PStatus && Handle(a) && Handle(b) &&
         api_->DeviceGetP2PStatus(Handle(a), Handle(b), kP2pCapsRead, &status) == kNvmlSuccess &&
         status == kP2pStatusOk;
}

bool NvmlProbe::P2pNvLink(int a, int b) {
  int status = -1;
  if (!api_->DeviceGetP2PStatus || !Handle(a) || !Handle(b))
    return true;  // cannot tell: trust the links
  if (api_->DeviceGetP2PStatus(Handle(a), Handle(b), kP2pCapsNvLink, &status) != kNvmlSuccess)
    return true;
  return status == kP2pStatusOk;
}

}  // namespace tessera
