// The one list of every metric Tessera exports: name, type, help text,
// label names, histogram buckets, and which daemon serves it. The daemons
// create their families from it (MetricsRegistry::FromCatalog), the
// dashboards test checks every PromQL expression against it, and
// docs/operations.md lists it (a test keeps the two in step).
//
// Conventions (https://prometheus.io/docs/practices/naming/): prefix
// `tessera_`, base units in the name (`_bytes`, `_seconds`, `_ratio`),
// `_total` on counters.
//
// Labels, where they apply:
//   node     host name the worker registered with
//   gpu      device index on that host (CUDA ordinal; the slot number of a CPU rank)
//   uuid     NVML device UUID ("GPU-..."); "cpu" for CPU ranks
//   stage    pipeline stage of the rank
//   tp_rank  tensor-parallel rank inside the stage
//   replica  the coordinator's data-parallel replica (0, 1, ...) a
//            scheduler, KV pool or rank belongs to (coordinator/serving/
//            replica_set.h); request-level metrics are the whole fleet's
//
// Thread-safety: the catalog is immutable.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/metrics/metrics_registry.h"

namespace tessera {

struct MetricSpec {
  std::string name;
  MetricType type;
  std::string help;
  std::vector<std::string> labels;
  std::vector<double> buckets;  // histograms only
  std::string component;        // "coordinator" or "worker": the daemon that serves it
};

// Every metric, in the order the docs list them.
const std::vector<MetricSpec>& MetricCatalog();
// The spec named `name`, or null.
const MetricSpec* FindMetricSpec(std::string_view name);

// Names used from code (the catalog is the source of the rest).
namespace metric {
// Worker: per device / rank.
inline constexpr const char* kGpuMemoryUsedBytes = "tessera_gpu_memory_used_bytes";
inline constexpr const char* kGpuMemoryTotalBytes = "tessera_gpu_memory_total_bytes";
inline constexpr const char* kGpuWeightBytes = "tessera_gpu_weight_bytes";
inline constexpr const char* kGpuWeightQuantizedBytes = "tessera_gpu_weight_quantized_bytes";
inline constexpr const char* kGpuKvCacheCapacityBytes = "tessera_gpu_kv_cache_capacity_bytes";
inline constexpr const char* kGpuActivationBytes = "tessera_gpu_activation_bytes";
inline constexpr const char* kGpuUtilizationRatio = "tessera_gpu_utilization_ratio";
inline constexpr const char* kStepDurationSeconds = "tessera_step_duration_seconds";
inline constexpr const char* kStepTokensTotal = "tessera_step_tokens_total";
inline constexpr const char* kCommDurationSeconds = "tessera_comm_duration_seconds";
inline constexpr const char* kCommBytesTotal = "tessera_comm_bytes_total";
inline constexpr const char* kStageBusySecondsTotal = "tessera_stage_busy_seconds_total";
inline constexpr const char* kStageIdleSecondsTotal = "tessera_stage_idle_seconds_total";
inline constexpr const char* kPipelineBubbleRatio = "tessera_pipeline_bubble_ratio";
inline constexpr const char* kWorkerLoadBytes = "tessera_worker_load_bytes";
inline constexpr const char* kWorkerLoadTotalBytes = "tessera_worker_load_total_bytes";
inline constexpr const char* kWorkerLoadSeconds = "tessera_worker_load_seconds";
inline constexpr const char* kWorkerPlanVersion = "tessera_worker_plan_version";
inline constexpr const char* kMoeExpertTokensTotal = "tessera_moe_expert_tokens_total";
inline constexpr const char* kWorkerInfo = "tessera_worker_info";
// Coordinator: requests and scheduler.
inline constexpr const char* kRequestsTotal = "tessera_requests_total";
inline constexpr const char* kHttpStreamEventsTotal = "tessera_http_stream_events_total";
inline constexpr const char* kHttpStreamWritesTotal = "tessera_http_stream_writes_total";
inline constexpr const char* kNonfiniteLogitsTotal = "tessera_nonfinite_logits_total";
inline constexpr const char* kRequestTtftSeconds = "tessera_request_ttft_seconds";
inline constexpr const char* kRequestInterTokenSeconds =
    "tessera_request_inter_token_latency_seconds";
inline constexpr const char* kRequestE2eSeconds = "tessera_request_e2e_latency_seconds";
inline constexpr const char* kRequestQueueSeconds = "tessera_request_queue_time_seconds";
inline constexpr const char* kPromptTokensTotal = "tessera_prompt_tokens_total";
inline constexpr const char* kGenerationTokensTotal = "tessera_generation_tokens_total";
inline constexpr const char* kRunningSequences = "tessera_scheduler_running_sequences";
inline constexpr const char* kWaitingSequences = "tessera_scheduler_waiting_sequences";
inline constexpr const char* kQueueDepth = "tessera_scheduler_queue_depth";
inline constexpr const char* kPreemptionsTotal = "tessera_scheduler_preemptions_total";
inline constexpr const char* kKvCacheUsedBlocks = "tessera_kv_cache_used_blocks";
inline constexpr const char* kPrefixCacheQueriesTokensTotal =
    "tessera_prefix_cache_queries_tokens_total";
inline constexpr const char* kPrefixCacheHitsTokensTotal = "tessera_prefix_cache_hits_tokens_total";
inline constexpr const char* kKvCacheCapacityBlocks = "tessera_kv_cache_capacity_blocks";
inline constexpr const char* kKvCacheUsedBytes = "tessera_kv_cache_used_bytes";
// Coordinator: cluster.
inline constexpr const char* kWorkers = "tessera_workers";
inline constexpr const char* kReady = "tessera_ready";
inline constexpr const char* kPlanVersion = "tessera_plan_version";
inline constexpr const char* kPlanParallelSize = "tessera_plan_parallel_size";
inline constexpr const char* kReconfigurationsTotal = "tessera_reconfigurations_total";
inline constexpr const char* kFaultsTotal = "tessera_faults_total";
inline constexpr const char* kWorkerExclusionsTotal = "tessera_worker_exclusions_total";
inline constexpr const char* kRequeuedRequestsTotal = "tessera_requeued_requests_total";
inline constexpr const char* kControlMessagesDroppedTotal =
    "tessera_control_messages_dropped_total";
inline constexpr const char* kRankLoadSeconds = "tessera_rank_load_seconds";
inline constexpr const char* kRankLoadBytes = "tessera_rank_load_bytes";
inline constexpr const char* kBuildInfo = "tessera_build_info";
// Coordinator: the rendezvous store (common/net/tcp_store.h).
inline constexpr const char* kStoreConnections = "tessera_store_connections";
inline constexpr const char* kStoreKeys = "tessera_store_keys";
inline constexpr const char* kStoreBytes = "tessera_store_bytes";
inline constexpr const char* kStoreRefusalsTotal = "tessera_store_refusals_total";
}  // namespace metric

}  // namespace tessera
