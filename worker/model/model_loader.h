// Opens a Hugging Face model directory and builds the LlamaModel of one rank:
// config.json -> ModelConfig, the rank's ShardSpec, its weight slices.
//
// Thread-safety: free functions; independent calls may run concurrently.
#pragma once

#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/format/checkpoint.h"
#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "common/model/shard_spec.h"
#include "worker/comm/communicator.h"
#include "worker/model/llama_model.h"
#include "worker/model/weight_loader.h"

namespace tessera {

struct LoadedModel {
  ModelConfig config;
  kernels::Backend* backend = nullptr;  // where the model lives (not owned)
  std::unique_ptr<LlamaModel> model;
  int64_t weight_bytes = 0;  // bytes of this rank's weights in memory
  int64_t reused_bytes = 0;  // of weight_bytes: taken from `held`, not read again
  int reused_tensors = 0;
  // FP8 values + scales of the quantized projection slices (StageWeights::
  // quantized_bytes); 0 for a dense model.
  int64_t quantized_bytes = 0;
  double load_seconds = 0.0;
  // The model's tensors, for the `held` argument of the next load (a re-plan).
  HeldWeights held;
};

// Loads rank `rank` of `parallel` from `model_dir`. `tp_comm` is the rank's tp
// group (null when its stage has tp == 1). `backend` (null = CPU) receives the
// weights in its compute dtype and runs the model; it must outlive it.
// `held` (optional): tensors the rank already holds from an earlier plan,
// loaded by this same backend; the slices it still needs are reused instead
// of read (see HeldWeights). `online` kOnlineFp8 (model.quantization =
// "fp8") quantizes a dense checkpoint's projections per output channel at
// load (common/format/quantization.h); a checkpoint that is FP8 already
// keeps its own scales. kNone loads the checkpoint as it is.
// Errors: kUnimplemented naming the model directory and architecture for an
// MoE model on a backend other than the CPU (before anything is read); those
// of LoadModelConfig, Checkpoint::Open, ShardSpec::Make and
// LoadStageWeights, with the model directory in the message.
StatusOr<LoadedModel> LoadModel(const std::string& model_dir, const ParallelConfig& parallel,
                                int rank, Communicator* tp_comm,
                                const LoadProgressFn& progress = {},
                                kernels::Backend* backend = nullptr,
                                const HeldWeights* held = nullptr,
                                QuantMethod online = QuantMethod::kNone);

}  // namespace tessera
