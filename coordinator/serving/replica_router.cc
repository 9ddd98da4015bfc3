#include "coordinator/serving/replica_router.h"

#include <algorithm>
#include <span>

namespace tessera {

std::optional<BlockKey> ReplicaRouter::Key(const std::vector<int32_t>& prompt) const {
  if (options_.affinity_slack_tokens <= 0 || options_.block_size <= 0 ||
      static_cast<int64_t>(prompt.size()) < options_.block_size)
    return std::nullopt;
  return ChainBlockKey(
      nullptr, options_.model_id, 0,
      std::span<const int32_t>(prompt.data(), static_cast<size_t>(options_.block_size)));
}

std::vector<int> ReplicaRouter::OrderFor(const std::optional<BlockKey>& key,
                                         const std::vector<ReplicaLoad>& loads) {
  std::vector<int> order;
  bool any_ready = false;
  for (const ReplicaLoad& l : loads) any_ready |= l.ready && l.accepting;
  for (size_t i = 0; i < loads.size(); ++i)
    if (loads[i].accepting && (loads[i].ready || !any_ready)) order.push_back(static_cast<int>(i));
  if (order.empty()) return order;
  // Ties rotate: requests arriving one at a time onto idle replicas take
  // turns instead of all landing on the lowest index.
  const int n = static_cast<int>(loads.size());
  const int start =
      static_cast<int>(turn_.fetch_add(1, std::memory_order_relaxed) % static_cast<uint64_t>(n));
  auto turn = [&](int i) { return (i - start + n) % n; };
  // Only the head is sorted: the caller takes the first replica that
  // accepts, and a fleet has hundreds (the tail keeps every replica listed,
  // in no particular order, for when the head's queues are full).
  const auto head = order.begin() + std::min<std::ptrdiff_t>(kSortedHead, std::ssize(order));
  std::partial_sort(order.begin(), head, order.end(), [&](int a, int b) {
    const ReplicaLoad& x = loads[static_cast<size_t>(a)];
    const ReplicaLoad& y = loads[static_cast<size_t>(b)];
    if (x.outstanding_tokens != y.outstanding_tokens)
      return x.outstanding_tokens < y.outstanding_tokens;
    if (x.free_kv_blocks != y.free_kv_blocks) return x.free_kv_blocks > y.free_kv_blocks;
    return turn(a) < turn(b);
  });
  if (!key) return order;
  int affine = -1;
  {
    MutexLock lock(&mu_);
    auto it = index_.find(*key);
    if (it != index_.end()) affine = it->second->second;
  }
  auto pos = std::find(order.begin(), order.end(), affine);
  if (pos == order.end() || pos == order.begin()) return order;
  const int64_t least = loads[static_cast<size_t>(order.front())].outstanding_tokens;
  if (loads[static_cast<size_t>(affine)].outstanding_tokens - least >
      options_.affinity_slack_tokens)
    return order;  // affinity would unbalance the load
  order.erase(pos);
  order.insert(order.begin(), affine);
  return order;
}

void ReplicaRouter::RoutedFor(const std::optional<BlockKey>& key, int replica) {
  if (!key) return;
  MutexLock lock(&mu_);
  auto it = index_.find(*key);
  if (it != index_.end()) {
    it->second->second = replica;
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.emplace_front(*key, replica);
  index_[*key] = lru_.begin();
  while (lru_.size() > options_.affinity_entries) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

void ReplicaRouter::Forget(int replica) {
  MutexLock lock(&mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->second == replica) {
      index_.erase(it->first);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace tessera
