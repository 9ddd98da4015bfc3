// WorkerRegistration: what a tessera-worker tells the coordinator about
// itself when it registers (control::Register), built from this host's
// TopologyReport (worker/topology/topology_discovery.h, or a topology file), and the
// address its data plane (Gloo) binds and advertises.
//
// A worker offers one device:
//  - a CPU rank (backend cpu, or no GPU): DEVICE_KIND_CPU, index = its slot
//    number (--device), name = the CPU model, memory = the host's memory
//    (the coordinator divides it among the CPU ranks of one host);
//  - a GPU (backend cuda): DEVICE_KIND_CUDA, the report's GPU whose index is
//    --device, with its name, UUID, memory, compute capability, PCI bus id
//    and NUMA node.
// The whole report travels as JSON in Register.topology_json, so the
// coordinator's planner sees the host's links, islands and NICs.
//
// Thread-safety: pure function.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/topology/report.h"
#include "common/wire/control.pb.h"

namespace tessera {

struct WorkerRegistrationOptions {
  int device = 0;            // --device: GPU ordinal, or the CPU rank's slot number
  bool cpu = true;           // offer a CPU rank (else the GPU `device`)
  std::string host;          // host name to report; "" = report.hostname
  std::string data_address;  // the Gloo address (common/net/endpoint.h LocalAddressToward)
};

// Register for this worker: host, pid, build version, its one device, the
// report as JSON and the data address.
// Errors: kNotFound when a GPU worker's `device` is not a GPU index of the
// report (naming the indices it has); kInvalidArgument when the report has
// no host name and none is given.
StatusOr<control::Register> BuildRegistration(const TopologyReport& report,
                                              const WorkerRegistrationOptions& options);

// The id a worker asks for when given no --id: "<host>:<device>" (e.g.
// "gpu-node-3:5"), so one host's device keeps its id across restarts of its
// worker (its drain mark and exclusions, keyed by id, stay with it) and ids
// name what they run on. Characters a worker id may not hold
// (common/wire/control_codec.h IsValidWorkerId: [A-Za-z0-9._:@-]) become
// '-', and the host is cut so the id fits kMaxWorkerIdBytes.
// `host`: Register.host (worker.host, or the report's host name).
std::string DefaultWorkerId(const std::string& host, int device);

}  // namespace tessera
