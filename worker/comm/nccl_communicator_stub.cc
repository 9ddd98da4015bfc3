// Builds without the CUDA backend have no NCCL.
#ifndef TESSERA_WITH_CUDA
#include "worker/comm/nccl_communicator.h"

namespace tessera {

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    Store&, const NcclCommunicatorOptions& options, kernels::Backend&) {
  return Unavailable("nccl group " + options.group + ": this build has no CUDA backend");
}

}  // namespace tessera
#endif
