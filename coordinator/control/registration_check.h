// Plausibility of a worker's Register (issue #31): the planner trusts what a
// worker reports (its device, the host's topology), so a report no real
// host can make (a GPU with more memory than any made, more devices than a
// host holds, a device of a backend this deployment does not run) is
// refused at registration, naming the field, instead of steering placement
// until a load shows it false.
//
// Bounds, above every device sold (2026: the largest GPU has 288 GB of
// HBM; the largest hosts 16 GPUs and a few tens of TiB of RAM), with margin:
//   - a CUDA device or a topology GPU: memory <= kMaxGpuMemoryBytes (1 TiB
//     excluded: at most 768 GiB);
//   - a CPU device or the host: memory <= kMaxHostMemoryBytes (64 TiB);
//   - devices and topology GPUs: at most kMaxDevicesPerHost (64) each;
//   - worker.backend "cpu": no CUDA device; "cuda": no CPU device ("auto"
//     takes either).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "common/base/status.h"
#include "common/config/daemon_config.h"
#include "common/topology/report.h"
#include "common/wire/control.pb.h"

namespace tessera {

inline constexpr uint64_t kMaxGpuMemoryBytes = uint64_t{768} << 30;
inline constexpr uint64_t kMaxHostMemoryBytes = uint64_t{64} << 40;
inline constexpr int kMaxDevicesPerHost = 64;

// OK, or kInvalidArgument naming the field ("devices[0].total_memory_bytes:
// ...", "topology_json.gpus[3].memory_total_bytes: ...", "devices[0].kind:
// ..."). `topology`: the parsed Register.topology_json, or null when it had
// none.
Status CheckRegistrationPlausible(const control::Register& reg, WorkerBackend backend,
                                  const TopologyReport* topology);

}  // namespace tessera
