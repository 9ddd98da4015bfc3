#include <cblas.h>

#include <algorithm>
#include <thread>

#include "kernels/blas_threads.h"

namespace tessera::kernels {

void SetBlasThreads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

int BlasThreadsForRanks(int ranks_on_host) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, hw / std::max(1, ranks_on_host));
}

}  // namespace tessera::kernels
