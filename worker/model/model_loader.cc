#include "worker/model/model_loader.h"

#include <chrono>

namespace tessera {

StatusOr<LoadedModel> LoadModel(const std::string& model_dir, const ParallelConfig& parallel,
                                int rank, Communicator* tp_comm, const LoadProgressFn& progress,
                                kernels::Backend* backend, const HeldWeights* held,
                                QuantMethod online) {
  if (backend == nullptr) backend = &kernels::CpuBackend();
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel out;
  TESSERA_ASSIGN_OR_RETURN(out.config, LoadModelConfig(model_dir));
  if (online == QuantMethod::kOnlineFp8 && !out.config.quantization.quantized())
    out.config.quantization = OnlineFp8Quantization();
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(model_dir));
  TESSERA_ASSIGN_OR_RETURN(ShardSpec spec, ShardSpec::Make(out.config, parallel, rank));
  TESSERA_ASSIGN_OR_RETURN(StageWeights weights, LoadStageWeights(*checkpoint, out.config, parallel,
                                                                  spec, progress, backend, held));
  TESSERA_RETURN_IF_ERROR_CTX(backend->Synchronize(), model_dir);
  out.weight_bytes = weights.weight_bytes;
  out.reused_bytes = weights.reused_bytes;
  out.reused_tensors = weights.reused_tensors;
  out.quantized_bytes = weights.quantized_bytes;
  out.backend = backend;
  TESSERA_ASSIGN_OR_RETURN(out.held, HoldWeights(weights, spec));
  out.model = std::make_unique<LlamaModel>(out.config, std::move(weights), tp_comm, backend);
  out.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tessera
