// RankRunner: everything one rank process of a tp x pp deployment does for a
// batch of generation requests: join the rendezvous store, build its
// communicators, load only its shard, then drive (stage 0) or serve (later
// stages) the pipeline until the batch is done.
//
// Every rank is given the same options; the requests of tp_rank 0 of stage 0
// are broadcast to the other stage-0 ranks (worker/exec/rank_inputs.h), so
// the ranks of stage 0 run identical engines on identical inputs and agree
// on every scheduling decision, and each prefill step's inputs are checked
// across the tp group (a mismatch is an error naming the ranks).
//
// Thread-safety: call from the rank's main thread.
#pragma once

#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/engine/engine.h"
#include "common/format/kv_cache_dtype.h"
#include "common/format/quantization.h"
#include "worker/exec/pipeline_executor.h"

namespace tessera {

struct RankOptions {
  std::string model_dir;
  int tp = 1;
  int pp = 1;
  // Empty: every stage has `tp` ranks. Otherwise pp entries, the tp of each
  // stage (`tp` is ignored), e.g. {2, 1}.
  std::vector<int> tp_per_stage;
  std::vector<int> layers_per_stage;  // empty = even split
  bool expert_parallel = false;       // ParallelConfig::expert_parallel (MoE models)
  int rank = 0;                       // world rank, common/model/parallel_rank.h
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  // The store's deployment secret (common/net/store_auth.h): the launcher's, from
  // TESSERA_STORE_SECRET; the rank authenticates as "admin" with it.
  std::string store_secret;
  std::string bind_host = "127.0.0.1";  // address of this rank's Gloo TCP device
  double timeout_seconds = 30.0;        // bound of every collective, send and receive
  int64_t kv_blocks = 0;                // KV-cache blocks per rank
  int64_t block_size = 16;              // tokens per KV block
  EngineOptions engine;
  // Online quantization at load (model.quantization; LoadModel's `online`).
  QuantMethod quantization = QuantMethod::kNone;
  // The KV cache's element type ([kv_cache] dtype; fp8 reads the checkpoint's scales).
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
};

struct RankResult {
  bool is_driver = false;  // stage 0: results below are filled
  std::vector<GenerationResult> results;
  EngineStats stats;
  double load_seconds = 0.0;
  int64_t weight_bytes = 0;  // this rank's weights in memory
};

// Errors: rendezvous, load and step failures, each naming this rank (stage,
// tp_rank) and, for communication, the peer.
StatusOr<RankResult> RunRank(const RankOptions& options,
                             const std::vector<GenerationRequest>& requests,
                             const Tokenizer* tokenizer, const TextCallback& on_text = {},
                             const LogitsSink& sink = {});

}  // namespace tessera
