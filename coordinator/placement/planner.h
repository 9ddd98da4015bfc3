// Planner: decides where a model's layers run on a cluster: the tp of each
// pipeline stage, the stages' hosts and GPUs, their layer ranges, and how
// many replicas of the pipeline serve; and explains why.
//
// The coordinator calls a Planner with the workers' reports turned into a
// ClusterModel; `tessera plan` calls it on a topology file (a dry run).
// PlacementPlanner (coordinator/placement/placement_planner.h) is the topology-aware
// implementation; docs/planner.md describes its search and cost model.
//
// Thread-safety: implementations are stateless; Plan may be called
// concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/status.h"
#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "coordinator/placement/cluster_model.h"
#include "coordinator/placement/cost_model.h"

namespace tessera {

enum class Objective {
  kLatency,     // minimise the slowest replica's per-token decode latency (batch 1)
  kThroughput,  // maximise generated tokens/s over all replicas
};
const char* ObjectiveName(Objective objective);  // "latency", "throughput"
// Errors: kInvalidArgument naming the value and the accepted ones.
StatusOr<Objective> ParseObjective(const std::string& name);

struct PlanOptions {
  Objective objective = Objective::kLatency;
  // Longest sequence served (prompt + generated), tokens. 0: the model's
  // max_position_embeddings.
  int64_t max_context = 0;
  // KV cache every replica must hold, tokens (over all its sequences).
  // 0: max_context (one full-length sequence).
  int64_t min_kv_tokens = 0;
  // Share of each GPU's memory the plan may use (weights, KV, activations).
  double gpu_memory_fraction = 0.9;
  // Serving dtypes; unset: the checkpoint's torch_dtype (fp32 checkpoints
  // are served in fp32).
  std::optional<DType> weight_dtype;
  std::optional<DType> kv_dtype;
  // Whether the workers keep an FP8 model's projections in FP8 (the CUDA
  // backend at bf16/fp16, kernels::Backend::keeps_fp8_weights) or
  // dequantize them at load (the CPU backend; any backend at an fp32
  // weight_dtype): the weight bytes per GPU the placement counts follow.
  bool keeps_fp8 = true;
  // Throughput workload: requests of prompt_tokens in, output_tokens out
  // (clamped so their sum fits max_context); up to max_batch sequences per
  // replica.
  int64_t prompt_tokens = 512;
  int64_t output_tokens = 256;
  int64_t max_batch = 256;
  int64_t prefill_chunk_tokens = 512;  // activation reserve is sized for this chunk
  bool allow_pcie_tp = true;  // tp groups over PCIe when a host has no NVLink island big enough
  bool allow_cross_node_tp = false;  // tp groups over whole hosts joined by the network
  int max_pp = 0;                    // 0: up to the number of layers
  int top_candidates = 5;            // how many candidates the explanation lists
  CostConstants cost;
  // Constraints a serving coordinator adds (0 / empty / false: none).
  // Only this tp (the same on every stage) and this pp are considered; a
  // fixed layout the cluster cannot hold is rejected with the reason.
  int fixed_tp = 0;
  int fixed_pp = 0;
  // Decoder layers per stage instead of the planner's split (needs
  // fixed_pp entries summing to the model's layers; each stage must fit).
  std::vector<int> fixed_layers_per_stage;
  // At most this many replicas are placed; the other GPUs stay idle (the
  // coordinator serves one pipeline).
  int max_replicas = 0;
  // Every stage of a replica has the same tp (what ParallelConfig and the
  // serving runtime support); assignments giving host shapes different tps
  // are skipped.
  bool uniform_tp = false;
  // MoE models: how a stage's tp ranks split the experts
  // (ParallelConfig::expert_parallel); unset: the planner chooses at each tp
  // it costs (AutoExpertParallel, cost_model.h) and the note says which the
  // chosen layout takes and why.
  std::optional<bool> expert_parallel;
};

// A GPU of the cluster: host index into ClusterModel::nodes, GPU index into
// that host's report.
struct GpuRef {
  int node = 0;
  int gpu = 0;
  bool operator==(const GpuRef& o) const { return node == o.node && gpu == o.gpu; }
  bool operator<(const GpuRef& o) const { return node != o.node ? node < o.node : gpu < o.gpu; }
};

struct PlannedStage {
  std::vector<GpuRef> gpus;        // tp ranks in order (tp_rank i is gpus[i])
  std::vector<std::string> hosts;  // the hosts of gpus, in order of first use
  int tp = 1;
  int first_layer = 0;  // decoder layers [first_layer, end_layer)
  int end_layer = 0;
  bool embedding = false;  // holds model.embed_tokens
  bool lm_head = false;    // holds model.norm and lm_head
  std::string gpu_name;
  std::string tp_link;  // "NV18", "PIX", "SYS", "network", "-" (tp 1)
  // Predicted per-GPU memory, bytes: weights + KV + activations <= usable.
  int64_t weight_bytes = 0;
  int64_t kv_bytes = 0;  // the KV pool: what weights and activations leave
  int64_t activation_bytes = 0;
  int64_t usable_bytes = 0;   // memory x gpu_memory_fraction (or free memory when less)
  double decode_seconds = 0;  // tau_s at batch 1
  int layers() const { return end_layer - first_layer; }
};

struct PlannedReplica {
  std::vector<PlannedStage> stages;
  std::vector<double> hop_seconds;     // stage s -> s+1, batch 1
  std::vector<std::string> hop_links;  // "NV18", "PIX", "network", ...
  double decode_latency_s = 0;         // per token, batch 1
  double throughput_tokens_per_s = 0;  // at `batch` sequences in `micro_batches`
  int64_t kv_tokens = 0;               // KV capacity of the replica, tokens
  int64_t batch = 0;
  int micro_batches = 1;
  int pp() const { return static_cast<int>(stages.size()); }
};

struct PlacementPlan {
  Objective objective = Objective::kLatency;
  std::string
      layout;  // "tp=8 pp=2", or per host shape "tp=8 (H100 hosts) / tp=4 (A100 hosts), pp=2"
  std::vector<PlannedReplica> replicas;
  int gpus_used = 0;
  int gpus_total = 0;
  double decode_latency_s = 0;         // the slowest replica's
  double throughput_tokens_per_s = 0;  // all replicas together
  // How the weights are stored, QuantizationConfig::Describe ("none", or
  // "fp8 (e4m3, block 128x128 weight scales, dynamic activations)"): the
  // per-GPU weight bytes count FP8 projections at 1 byte plus scales.
  std::string quantization = "none";

  // The ParallelConfig of replica `r`: its stages' tp (a uniform layout when
  // they are equal, else a per-stage one whose stages pair as
  // common/model/stage_handoff.h says) and its layer split. Errors: kOutOfRange
  // for a replica that does not exist; as ParallelConfig::MakePerStage,
  // prefixed "replica r".
  StatusOr<ParallelConfig> ParallelConfigOf(const ModelConfig& model, int r) const;
};

// One candidate layout, as the explanation lists it.
struct CandidateSummary {
  std::string layout;
  int pp = 0;
  int replicas = 0;
  int gpus_used = 0;
  double decode_latency_s = 0;
  double throughput_tokens_per_s = 0;
  int64_t peak_gpu_bytes = 0;  // largest predicted per-GPU use (weights + KV reserve + activations)
  int64_t usable_gpu_bytes = 0;  // of that GPU
  std::string note;              // why it lost to the chosen one, "" for the chosen one
};

struct Rejection {
  std::string what;  // "tp=3", "tp=8 pp=1"
  std::string why;
};

struct Explanation {
  Objective objective = Objective::kLatency;
  std::vector<CandidateSummary> top;  // best first; top[0] is the chosen plan
  std::vector<Rejection> rejected;    // layouts that are invalid or do not fit
  int candidates_evaluated = 0;
  int candidates_fitting = 0;
  std::vector<std::string> notes;  // cluster assumptions, option clamps
};

struct PlanResult {
  PlacementPlan plan;
  // MoE models: the expert split the plan was costed with (PlanOptions::
  // expert_parallel, or the planner's choice at the first stage's tp);
  // false for dense models.
  bool expert_parallel = false;
  Explanation explanation;
  // The placement (stage table per distinct replica, memory and speed
  // predictions) followed by the explanation, as `tessera plan` prints it.
  std::string ToText() const;
};

class Planner {
 public:
  virtual ~Planner() = default;
  // Errors: kInvalidArgument for bad options (fraction outside (0, 1],
  // negative sizes) or a model that fails validation; kResourceExhausted
  // when no layout fits, the message listing why each was rejected.
  virtual StatusOr<PlanResult> Plan(const ModelConfig& model, const ClusterModel& cluster,
                                    const PlanOptions& options) = 0;
};

}  // namespace tessera
