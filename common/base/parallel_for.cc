#include "common/base/parallel_for.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace tessera {

void ParallelFor(int64_t n, int64_t min_per_thread,
                 const std::function<void(int64_t begin, int64_t end)>& fn) {
  if (n <= 0) return;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t threads = std::clamp<int64_t>(n / std::max<int64_t>(1, min_per_thread), 1, hw);
  if (threads == 1) {
    fn(0, n);
    return;
  }
  const int64_t per = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t begin = t * per, end = std::min(n, begin + per);
    if (begin < end) pool.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  fn(0, std::min(n, per));
  for (std::thread& th : pool) th.join();
}

}  // namespace tessera
