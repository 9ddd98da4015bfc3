// NcclCommunicator: the Communicator of a group of ranks, one CUDA device
// each, over NCCL, on device buffers of that device (device() == kCUDA).
//
// Rendezvous: rank 0 of the group creates the NCCL unique id and publishes it
// in the Store under "<key_prefix>/<group>/nccl_unique_id"; the other ranks
// wait for it (bounded by connect_timeout_seconds). ncclCommInitRankConfig
// (blocking mode, connections made during init: NCCL_RUNTIME_CONNECT=0 unless
// set) runs on a helper thread, so a rank that never joins bounds it too.
//
// Ordering: collectives are enqueued on the backend's compute stream, in
// stream order with the kernels around them, so no host synchronisation is
// needed between a layer's GEMM, its all-reduce and the next kernel. A call
// returns once NCCL has enqueued the operation (with `blocking`, once it has
// completed on the device).
//
// Failures: every call is watched. A watchdog thread polls each enqueued
// operation's completion event and ncclCommGetAsyncError; an operation that
// has not completed within timeout_seconds, or an asynchronous NCCL error,
// aborts the communicator (ncclCommAbort, which also releases kernels stuck
// waiting for a dead peer) and every later call returns the first failure,
// e.g. "all_reduce on rank 1 of group tp.stage0: timed out after 5.0 s
// (ncclCommAbort called)" or naming the NCCL call and its error string.
// NCCL_NVLS_ENABLE is set to 0 when unset (NVLink multicast is not used).
// The host cost of a call is the kernel launch (a non-blocking NCCL
// communicator was measured at ~80 us per call, so it is not used).
//
// Thread-safety: one thread issues calls (the rank's owner thread); the
// watchdog thread is internal.
#pragma once

#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/net/store.h"
#include "kernels/backend.h"
#include "worker/comm/communicator.h"

namespace tessera {

struct NcclCommunicatorOptions {
  std::string group;                      // e.g. "tp.stage0"; part of the store key
  std::string key_prefix;                 // prepended as "<key_prefix>/" when not empty
  int rank = 0;                           // this rank in the group
  int size = 1;                           // ranks in the group
  double timeout_seconds = 30.0;          // bound of every operation
  double connect_timeout_seconds = 60.0;  // bound of the unique-id exchange and ncclCommInitRank
  bool blocking = false;                  // wait for each operation's completion on return
};

// Creates the communicator on `backend` (a CUDA backend, made current on the
// calling thread). Errors: kInvalidArgument for a CPU backend or rank/size
// out of range; kDeadlineExceeded naming the store key or the init when a
// peer does not arrive in time; kUnavailable when the build has no CUDA
// backend; NCCL errors naming the call, the rank and the group.
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    Store& store, const NcclCommunicatorOptions& options, kernels::Backend& backend);

}  // namespace tessera
