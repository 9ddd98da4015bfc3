// SimLeader: a simulated worker acting as its replica's leader
// ([scheduler] runs_on = "leader"; AssignShard.leader set): it runs the
// worker's real ReplicaLeader (worker/daemon/replica_leader.h: the
// Scheduler, KV block allocator and OutputProcessor with the model's
// tokenizer) over a simulated stage that samples the fleet's deterministic
// tokens (SimTokenAt) after StepModel::StepSeconds. So a fleet of leaders
// measures the coordinator of the leader design, not a shortcut.
//
// Threading: its own thread steps the ReplicaLeader and takes the
// Generate / CancelRequests messages Post hands it; what it sends goes
// through `send`, which must be safe from that thread (the fleet posts it to
// the socket's owner shard).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "bench/fleet_sim/step_model.h"
#include "common/base/status.h"
#include "common/wire/control.pb.h"

namespace tessera::fleet_sim {

// The deterministic token for position `pos` of sequence `seq_id`, in
// [lo, hi).
int32_t SimTokenAt(int64_t seq_id, int64_t pos, int32_t lo, int32_t hi);

class SimLeader {
 public:
  using SendFn = std::function<void(control::Envelope)>;
  // Loads the model's config and tokenizer from `assign.model_path()`.
  // `steps` and `tokens` (outliving the leader) count the micro-batches
  // run and the tokens sampled. Errors: the config or the tokenizer's.
  static StatusOr<std::unique_ptr<SimLeader>> Start(const control::AssignShard& assign,
                                                    const StepModel* model, int32_t token_lo,
                                                    int32_t token_hi, SendFn send,
                                                    std::atomic<int64_t>* steps,
                                                    std::atomic<int64_t>* tokens);
  ~SimLeader();  // stops the thread; what is running is dropped
  SimLeader(const SimLeader&) = delete;
  SimLeader& operator=(const SimLeader&) = delete;

  void Post(control::Envelope envelope);

 private:
  struct State;
  explicit SimLeader(std::unique_ptr<State> state);
  void Loop();

  std::unique_ptr<State> state_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<control::Envelope> inbox_;  // guarded by mu_
  bool stop_ = false;                    // guarded by mu_
  std::thread thread_;
};

}  // namespace tessera::fleet_sim
