// Which workers a failed plan load is the fault of (issue #31): a plan's
// ranks load together, so one worker that never takes its assignment (a
// stale key's process, a host whose disk hangs) makes its peers' rendezvous
// fail too, and the peer that reports the failure first is not the one at
// fault.
//
// Each rank of the plan being loaded is at one of these stages, in order:
//   0  nothing yet: it has not authenticated to the rendezvous store;
//   1  joined: it authenticated to the store (it is joining its groups; a
//      rank cannot start loading weights before every peer of its groups
//      joined);
//   2  loading: it sent a LoadProgress;
//   3  loaded: it sent Loaded.
// The culprits are the ranks not loaded that are at the lowest stage among
// those not loaded: the peers further on wait for them. When a worker
// reported a load error (`reporter`), it is the culprit unless some rank is
// at a lower stage than it (it failed because they never joined).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

namespace tessera {

struct RankLoadStage {
  std::string worker_id;
  int world_rank = 0;
  int stage = 0;  // 0..3, see the header comment
};

// The workers at fault, in rank order, each once; never empty when some
// rank is not loaded or `reporter` is given. `reporter`: the worker whose
// Error ended the load ("" at the load deadline).
std::vector<std::string> LoadCulprits(const std::vector<RankLoadStage>& ranks,
                                      const std::string& reporter);

// What a rank at `stage` had not done, for the error and /admin/cluster:
// "did not join its groups", "did not finish loading", ...
const char* LoadStageShortfall(int stage);

}  // namespace tessera
