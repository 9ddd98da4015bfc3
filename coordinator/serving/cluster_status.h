// ClusterStatus: what the health endpoints and the admin API read of the
// cluster, as typed documents: /readyz's reason when not ready
// (NotReadyStatus), one page of GET /admin/cluster (ClusterDocument) and GET
// /admin/plan (PlanDocument). The cluster view
// (coordinator/serving/cluster_view.h) implements it; coordinator/api/
// (cluster_json.h) renders the documents as JSON, the shapes of
// docs/operations.md. Every document is a snapshot taken under the cluster
// state's mutex, a value the caller owns.
//
// Units: bytes, seconds; counters count since the coordinator started.
//
// Thread-safety: every method is safe from any thread (the HTTP threads).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/config/daemon_config.h"
#include "common/format/kv_cache_dtype.h"
#include "common/model/parallel_config.h"
#include "coordinator/placement/planner.h"
#include "coordinator/serving/cluster_state.h"
#include "coordinator/serving/plan_report.h"
#include "coordinator/serving/replica_set.h"

namespace tessera {

// One page of GET /admin/cluster: the workers (in registration order) and
// the replicas (by index) numbered [page * page_size, (page + 1) *
// page_size); the document's "pages" says how many there are.
inline constexpr int64_t kDefaultClusterPageSize = 1024;
inline constexpr int64_t kMaxClusterPageSize = 4096;
struct ClusterPage {
  int64_t page = 0;                             // >= 0
  int64_t page_size = kDefaultClusterPageSize;  // 1..kMaxClusterPageSize
};

// /readyz's 503 reason.
struct NotReadyStatus {
  // A replica lacks workers ("degraded"), else the coordinator waits for a
  // plan ("not_ready").
  bool degraded = false;
  std::string reason;  // the placement's failure, the degradation, or what it waits for
};

// --- GET /admin/cluster -------------------------------------------------

// A device a worker registered.
struct WorkerDeviceStatus {
  uint32_t index = 0;
  std::string name;
  bool cpu = false;  // a CPU device, else a CUDA one
  uint64_t memory_bytes = 0;
};

// The coordinator's view of a worker: whether placement may use it.
enum class WorkerHealth {
  kAlive,     // usable
  kFailed,    // declared lost, or failed
  kDrained,   // taken out by POST /admin/workers/<id>/drain
  kExcluded,  // backed off after a failed load or a hung step
};

// What the worker last reported of itself.
enum class WorkerReportedState {
  kLost,        // declared lost: its last report is stale
  kRegistered,  // registered, no heartbeat state yet
  kIdle,
  kLoading,
  kReady,
  kDraining,
  kFailed,
  kUnknown,  // a state this coordinator does not know
};

// A worker's last exclusion, kept (with the count) after its back-off ended.
struct WorkerExclusionStatus {
  bool excluded = false;    // the back-off still runs
  std::string reason;       // what the worker did
  std::string kind;         // load_timeout, load_error, loaded_mismatch, step_hung
  int count = 0;            // exclusions of this worker so far
  double seconds_left = 0;  // of the back-off, >= 0
};

// A worker's rank in its replica's plan.
struct WorkerRankStatus {
  int world_rank = 0, stage = 0, tp_rank = 0;
  int replica = 0;
};

struct WorkerStatus {
  std::string id;
  std::string host;
  uint32_t pid = 0;
  std::string data_address;  // its Gloo address
  std::vector<WorkerDeviceStatus> devices;
  std::string curve_public_key;  // Z85; "" without CURVE
  WorkerHealth health = WorkerHealth::kAlive;
  std::optional<WorkerExclusionStatus> exclusion;  // none: never excluded
  WorkerReportedState reported = WorkerReportedState::kRegistered;
  std::optional<WorkerRankStatus> rank;  // none: in no replica's plan
  bool in_plan = false;                  // in a plan and alive
  std::optional<int> replica;            // the replica whose plan it is in
  double seconds_since_last_message = 0;
};

// A replica on the page, with its router load when the replica set has it.
struct ReplicaStatus {
  size_t replica = 0;
  bool ready = false;
  std::string degraded;  // why no plan runs; "" = not degraded
  uint64_t plan_version = 0;
  ParallelConfig layout;             // the running layout
  std::vector<std::string> workers;  // one per world rank
  int64_t reconfigurations_total = 0, faults_total = 0, requeued_requests_total = 0;
  // From the replica set; absent for a replica it does not run yet.
  struct Live {
    bool reconfiguring = false;
    ReplicaLoadInfo load;
  };
  std::optional<Live> live;
};

struct ClusterDocument {
  std::vector<WorkerStatus> workers;  // this page's
  bool ready = false;                 // a plan serves (/readyz)
  std::string degraded;               // replica 0's; "" = not degraded
  uint64_t plan_version = 0;          // replica 0's
  struct Queue {
    size_t waiting = 0, running = 0;
  };
  std::optional<Queue> queue;  // none before a plan serves
  bool reconfiguring = false;  // some replica re-plans
  // Summed over every replica.
  int64_t reconfigurations_total = 0, faults_total = 0, requeued_requests_total = 0;
  std::vector<ReplicaStatus> replicas;  // this page's
  size_t workers_total = 0;
  size_t replicas_total = 0;
  int64_t replicas_ready = 0;
  ClusterPage page;
  size_t pages = 1;  // >= 1
};

// --- GET /admin/plan ----------------------------------------------------

// A rank of a replica's plan with its load results.
struct PlanRankStatus {
  Assignment assignment;               // loaded_weight_bytes and kv_bytes are -1 until Loaded
  int first_layer = 0, end_layer = 0;  // decoder layers [first_layer, end_layer)
  // An MoE model's experts on the rank, [begin, end): whole experts under
  // expert parallelism (expert_split_tp == 0), else a 1/expert_split_tp
  // slice of every one. Absent for a dense model.
  std::optional<ExpertRange> experts;
  int expert_split_tp = 0;
};

// One replica's plan document.
struct ReplicaPlanStatus {
  uint64_t plan_version = 0;
  size_t replica = 0;
  bool ready = false;
  std::vector<PlanRankStatus> ranks;
  std::string error;     // the initial placement's failure; "" = none
  std::string degraded;  // "" = not degraded
  // Not placed yet (no ranks): the workers the first placement waits for
  // (absent when it failed: `error`).
  std::optional<int> waiting_for_workers;
  // The fields below are set only when placed (ranks not empty).
  std::string quantization;  // QuantizationConfig::Describe
  ParallelConfig parallel;   // the running layout
  bool moe = false;
  bool expert_parallel = false;                       // moe only
  int64_t kv_blocks = 0;                              // per rank
  int kv_block_size = 0;                              // tokens per block
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;  // kv_cache.dtype as configured
  ParallelConfig wanted;
  std::vector<PlanChangeReport> history;  // oldest first
  // The planner's result that placed it (null: an explicit layout, no
  // planner run), which of its replicas this one is, and the workers of
  // each of its stages (stage_workers[s], in rank order).
  std::shared_ptr<const PlanResult> planner;
  size_t planner_replica = 0;
  std::vector<std::vector<std::string>> stage_workers;
};

struct PlanDocument {
  ParallelMode mode = ParallelMode::kExplicit;  // parallel.mode of the config
  // No replica yet: the placement's failure, or the workers it waits for.
  std::string error;
  int waiting_for_workers = 0;
  std::vector<ReplicaPlanStatus> replicas;  // by index; the top level is replica 0's
};

class ClusterStatus {
 public:
  virtual ~ClusterStatus() = default;
  // A plan is loaded and served.
  virtual bool ready() const = 0;
  // Why not (meaningful when ready() is false).
  virtual NotReadyStatus NotReady() const = 0;
  // One page of GET /admin/cluster, and GET /admin/plan.
  virtual ClusterDocument Cluster(const ClusterPage& page) const = 0;
  virtual PlanDocument Plan() const = 0;
};

}  // namespace tessera
