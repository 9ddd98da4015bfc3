#include "bench/fleet_sim/step_model.h"

#include <algorithm>

namespace tessera::fleet_sim {

StepModel::StepModel(const ModelConfig& model, StepModelOptions options)
    : sizes_(ModelSizes::From(model, DType::kBF16, DType::kBF16)), options_(std::move(options)) {}

StageShape StepModel::Stage(const control::AssignShard& assign, int stage) const {
  StageShape s;
  s.spec = options_.gpu;
  const int pp = static_cast<int>(std::max<uint32_t>(1, assign.pp()));
  s.tp = assign.tp_per_stage_size() > stage ? static_cast<int>(assign.tp_per_stage(stage))
                                            : static_cast<int>(std::max<uint32_t>(1, assign.tp()));
  s.layers = assign.layers_per_stage_size() > stage
                 ? static_cast<int>(assign.layers_per_stage(stage))
                 : static_cast<int>(sizes_.layers / pp);
  s.first = stage == 0;
  s.last = stage == pp - 1;
  s.single_stage = pp == 1;
  s.link_bytes_per_s = options_.nvlink_gb_per_s * 1e9;
  s.link_step_s = constants_.nvlink_step_s;
  return s;
}

double StepModel::ShardBytes(const control::AssignShard& assign) const {
  return WeightBytesPerGpu(sizes_, Stage(assign, static_cast<int>(assign.stage())));
}

double StepModel::LoadSeconds(const control::AssignShard& assign,
                              const control::AssignShard* held) const {
  double bytes = ShardBytes(assign);
  if (held && held->tp() == assign.tp() && held->tp_rank() == assign.tp_rank() &&
      held->model_path() == assign.model_path()) {
    const int64_t overlap = std::max<int64_t>(
        0, static_cast<int64_t>(std::min(held->end_layer(), assign.end_layer())) -
               static_cast<int64_t>(std::max(held->first_layer(), assign.first_layer())));
    StageShape layers = Stage(assign, static_cast<int>(assign.stage()));
    layers.layers = static_cast<int>(overlap);
    layers.first = layers.last = false;
    bytes -= WeightBytesPerGpu(sizes_, layers);
  }
  return options_.time_scale * std::max(0.0, bytes) / (options_.disk_gb_per_s * 1e9);
}

double StepModel::StepSeconds(const control::AssignShard& assign,
                              const control::StepBatch& batch) const {
  if (options_.time_scale == 0) return 0;
  const double tokens = static_cast<double>(std::max(1, batch.token_ids_size()));
  const double seqs = static_cast<double>(std::max(1, batch.seqs_size()));
  double context = 0;
  for (const control::SeqStep& s : batch.seqs()) context += s.start_pos();
  context /= seqs;
  const int pp = static_cast<int>(std::max<uint32_t>(1, assign.pp()));
  double t = 0;
  for (int stage = 0; stage < pp; ++stage)
    t += StageSeconds(sizes_, Stage(assign, stage), constants_, tokens, seqs, context);
  t += (pp - 1) * HopSeconds(tokens * static_cast<double>(sizes_.hidden) * sizes_.dtype_bytes,
                             options_.network_gb_per_s * 1e9, options_.network_latency_s,
                             constants_);
  return options_.time_scale * t;
}

}  // namespace tessera::fleet_sim
