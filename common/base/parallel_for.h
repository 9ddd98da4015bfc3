// ParallelFor: splits [0, n) into contiguous ranges run on short-lived
// threads, for bulk element loops at load time (FP8 quantization and
// dequantization of a weight slice, worker/model/quantized_weight.cc).
//
// Thread-safety: `fn` runs concurrently on disjoint ranges; it must not
// throw. ParallelFor returns once every range has run.
#pragma once

#include <cstdint>
#include <functional>

namespace tessera {

// Runs fn(begin, end) over disjoint ranges covering [0, n), on at most
// std::thread::hardware_concurrency() threads (the caller's among them) and
// with at least `min_per_thread` items per thread; inline when one thread
// suffices.
void ParallelFor(int64_t n, int64_t min_per_thread,
                 const std::function<void(int64_t begin, int64_t end)>& fn);

}  // namespace tessera
