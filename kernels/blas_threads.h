// Sizes OpenBLAS's thread pool. Several rank processes on one host share its
// cores, so each rank should use cores / ranks_on_host threads.
// Thread-safety: call before the first GEMM of the process.
#pragma once

namespace tessera::kernels {

void SetBlasThreads(int threads);
// max(1, hardware threads / ranks_on_host).
int BlasThreadsForRanks(int ranks_on_host);

}  // namespace tessera::kernels
