// ReplicaRouter: which replica a request goes to (coordinator/serving/
// replica_set.h routes every API request through it).
//
// Load: each replica's outstanding tokens (the prompt tokens still to
// prefill and the tokens still to generate of every request routed to it
// and not finished: queued plus running) and its free KV blocks. A request
// goes to the replica with the fewest outstanding tokens (ties: the most
// free KV blocks, then in turn: each decision starts the tie order one
// replica further, so requests arriving one at a time onto idle replicas
// are spread round-robin).
//
// Prefix affinity: a request whose first full KV block (options.block_size
// prompt tokens) has the same prefix-cache key as an earlier request's
// (common/engine/block_key.h: ChainBlockKey of that block, plan version 0)
// prefers the replica that earlier request went to, where the prefix cache
// may hold its blocks, unless that replica's outstanding tokens exceed the
// least loaded one's by more than options.affinity_slack_tokens. Bound:
// every routing decision sends a request to a replica within
// affinity_slack_tokens of the least loaded one, so (with requests of at most
// R tokens) the outstanding tokens of two accepting replicas differ by at
// most affinity_slack_tokens + R after any decision when loads only grow
// (without affinity: R). The key table keeps the options.affinity_entries
// most recent prefixes.
//
// Order lists the replicas to try, best first: the ready and accepting ones;
// when none is ready, those that merely accept (a re-planning replica queues
// requests until it serves again). The caller submits to the first, and to
// the next when its queue is full (429 only when every one is). Only the
// first kSortedHead are in order of load; the rest follow unordered (a
// fleet's hundreds of replicas are not sorted per request).
//
// Thread-safety: Order and Routed are thread-safe (one mutex, a leaf: no
// call out while it is held).
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/thread_annotations.h"
#include "common/engine/block_key.h"

namespace tessera {

// How many of Order's replicas are sorted by load.
inline constexpr int kSortedHead = 8;

// One replica's load as the router sees it.
struct ReplicaLoad {
  bool ready = false;      // its plan serves
  bool accepting = false;  // started and not drained by the admin
  int64_t outstanding_tokens = 0;
  int64_t free_kv_blocks = 0;
};

struct RouterOptions {
  int64_t block_size = 16;  // tokens per KV block: the affinity key covers the first one
  std::string model_id;     // part of the key (ChainBlockKey)
  // How far above the least loaded replica an affine one may be and still
  // be chosen, tokens. 0: no affinity.
  int64_t affinity_slack_tokens = 2048;
  size_t affinity_entries = 4096;
};

class ReplicaRouter {
 public:
  explicit ReplicaRouter(RouterOptions options) : options_(std::move(options)) {}

  // The affinity key of `prompt` (its first block's; none when the prompt
  // is shorter than a block or affinity is off), for OrderFor and
  // RoutedFor: a request computes it once.
  std::optional<BlockKey> Key(const std::vector<int32_t>& prompt) const;
  // The replicas to try for a request with `prompt`, best first (see the
  // header comment); empty when no replica accepts.
  std::vector<int> Order(const std::vector<int32_t>& prompt, const std::vector<ReplicaLoad>& loads)
      EXCLUDES(mu_) {
    return OrderFor(Key(prompt), loads);
  }
  // Order, for a request whose affinity key is `key` (Key).
  std::vector<int> OrderFor(const std::optional<BlockKey>& key,
                            const std::vector<ReplicaLoad>& loads) EXCLUDES(mu_);
  // `prompt`'s request went to `replica`: later requests with its first
  // block prefer it.
  void Routed(const std::vector<int32_t>& prompt, int replica) EXCLUDES(mu_) {
    RoutedFor(Key(prompt), replica);
  }
  // Routed, for a request whose affinity key is `key` (Key).
  void RoutedFor(const std::optional<BlockKey>& key, int replica) EXCLUDES(mu_);
  // Forgets the prefixes routed to `replica` (its plan changed: its prefix
  // cache is empty).
  void Forget(int replica) EXCLUDES(mu_);

  const RouterOptions& options() const { return options_; }

 private:
  const RouterOptions options_;
  std::atomic<uint64_t> turn_{0};  // where the tie order starts next
  Mutex mu_;
  // Most recent first; the map points into the list.
  std::list<std::pair<BlockKey, int>> lru_ GUARDED_BY(mu_);
  std::unordered_map<BlockKey, std::list<std::pair<BlockKey, int>>::iterator, BlockKeyHash> index_
      GUARDED_BY(mu_);
};

}  // namespace tessera
