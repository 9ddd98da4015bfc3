// StepModel: how long a simulated worker takes to load its shard and to run
// one micro-batch, from the placement planner's cost model
// (coordinator/placement/cost_model.h, formulas in docs/planner.md).
//
//  load      = (shard bytes - reused bytes) / disk bandwidth, shard bytes =
//              WeightBytesPerGpu of the rank's stage (its layers, tp,
//              first/last), reused = the layers the previous shard held at
//              the same tp and tp rank;
//  one step  = sum over the stages s of tau_s(tokens, seqs, context)
//              + (pp - 1) hops of tokens x hidden x dtype bytes,
//              tokens = the batch's token count, seqs = its sequences,
//              context = their mean start position.
// Both are multiplied by `time_scale` (0: no modeled time at all, so a run
// measures only the coordinator's own cost per step).
//
// Thread-safety: immutable after construction; safe from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/format/model_config.h"
#include "common/topology/gpu_specs.h"
#include "common/wire/control.pb.h"
#include "coordinator/placement/cost_model.h"

namespace tessera::fleet_sim {

struct StepModelOptions {
  GpuSpec gpu;                      // the simulated GPU's speeds
  double nvlink_gb_per_s = 450;     // a tp group's link, GB/s per direction
  double network_gb_per_s = 50;     // a pipeline hop between hosts, GB/s
  double network_latency_s = 5e-6;  // one hop's latency
  double disk_gb_per_s = 5;         // checkpoint read speed of one worker
  double time_scale = 1.0;          // multiplies every modeled time (>= 0)
};

class StepModel {
 public:
  StepModel(const ModelConfig& model, StepModelOptions options);

  // Bytes of weights the rank `assign` describes holds (its stage's layers
  // at its tp).
  double ShardBytes(const control::AssignShard& assign) const;
  // Modeled seconds to load that shard when the worker still holds `held`
  // (its previous shard, or null): the layers both hold at the same tp and
  // tp rank are reused, as a real worker reuses its held slices.
  double LoadSeconds(const control::AssignShard& assign, const control::AssignShard* held) const;
  // Modeled seconds of one micro-batch of `batch` through the pipeline that
  // `assign` (any rank of it) belongs to.
  double StepSeconds(const control::AssignShard& assign, const control::StepBatch& batch) const;

 private:
  StageShape Stage(const control::AssignShard& assign, int stage) const;

  ModelSizes sizes_;
  StepModelOptions options_;
  CostConstants constants_;
};

}  // namespace tessera::fleet_sim
