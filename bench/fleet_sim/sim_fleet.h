// SimFleet: thousands of simulated workers in one process, each speaking the
// real control protocol (common/wire/control.proto) to a real coordinator
// over its own ZeroMQ DEALER socket, with its own routing id and, when keys
// are given, its own CURVE key pair.
//
// Each simulated worker:
//  - registers as GPU `gpu` of host `sim-NNNN` (the node's TopologyReport as
//    Register.topology_json), asking for the id "sim-NNNN-gG"; an unanswered
//    Register is sent again after register_retry, doubling up to
//    register_retry_max, with +-25% jitter (a registration storm must not be
//    answered by a storm of retries);
//  - heartbeats at the interval its RegisterAck gives;
//  - on AssignShard "loads" in StepModel::LoadSeconds, then reports
//    LoadProgress and Loaded (weights = the modeled shard bytes, KV = the
//    blocks it was assigned) and heartbeats READY;
//  - on a Step, as tp rank 0 of stage 0, has the pipeline's sampler (tp rank
//    0 of the last stage, found by plan version) answer with a StepResult
//    after StepModel::StepSeconds, in micro-batch order. The tokens are
//    deterministic: token(seq_id, position) in [token_lo, token_hi).
//  - Drain: heartbeats DRAINING; Shutdown: closes its socket.
// KillNode closes the sockets of one node's workers at once, with no
// goodbye, as a crashed host would: the coordinator sees only the silence.
//
// Threading: the workers are spread over `shards` owner threads
// (bench/fleet_sim/epoll_shard_loop.h: epoll over the sockets' ZMQ_FD), each
// the one owner of its workers' sockets and timers; one thread posts to
// another (a sampler on another shard) through EpollShardLoop::Post. The
// public methods are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench/fleet_sim/step_model.h"
#include "common/base/status.h"
#include "common/topology/report.h"

namespace tessera::fleet_sim {

struct FleetOptions {
  std::string coordinator_endpoint;  // "tcp://127.0.0.1:PORT"
  // CURVE: the coordinator's public key and one secret key per worker (node
  // major: worker n * gpus + g); both empty = plain TCP.
  std::string coordinator_public_key;
  std::vector<std::string> worker_secret_keys;
  TopologyReport node;  // every node's report; its hostname is replaced
  int nodes = 1;
  int shards = 4;  // owner threads (each waits in epoll on its sockets' ZMQ_FD)
  std::chrono::milliseconds register_retry{1000};
  std::chrono::milliseconds register_retry_max{16000};
  int32_t token_lo = 1000, token_hi = 30000;  // the deterministic tokens' range
  const StepModel* model = nullptr;           // required; outlives the fleet
};

// Counters since Start (monotonic).
struct FleetStats {
  int64_t workers = 0;
  int64_t registered = 0;      // accepted RegisterAcks (re-registrations too)
  int64_t refused = 0;         // refusing RegisterAcks, "register again" excluded
  int64_t registers_sent = 0;  // first Registers and retries
  int64_t heartbeats_sent = 0;
  int64_t assigned = 0;                   // AssignShards taken
  int64_t loaded = 0;                     // Loaded sent
  int64_t steps = 0;                      // micro-batches answered
  int64_t tokens = 0;                     // tokens in the answers
  int64_t killed = 0;                     // workers of killed nodes
  double seconds_to_all_registered = -1;  // from Start; -1 until every worker registered once
};

class SimFleet {
 public:
  // Creates the sockets, connects them and starts registering.
  // Errors: kInvalidArgument (no model, nodes < 1, key count != workers,
  // a key that is not Z85), kIoError (ZeroMQ refused a socket).
  static StatusOr<std::unique_ptr<SimFleet>> Start(FleetOptions options);
  ~SimFleet();

  FleetStats stats() const;
  int gpus_per_node() const;
  // Host name of node n ("sim-0007").
  static std::string NodeName(int n);
  // Closes every socket of node n's workers, without a message.
  void KillNode(int n);
  // Stops every owner thread and closes the sockets. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit SimFleet(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::fleet_sim
