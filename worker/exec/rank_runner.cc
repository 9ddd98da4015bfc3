#include "worker/exec/rank_runner.h"

#include <memory>

#include "common/net/tcp_store.h"
#include "kernels/backend.h"
#include "kernels/blas_threads.h"
#include "worker/comm/process_group.h"
#include "worker/exec/rank_inputs.h"
#include "worker/model/kv_cache_scales.h"
#include "worker/model/model_loader.h"

namespace tessera {

StatusOr<RankResult> RunRank(const RankOptions& o, const std::vector<GenerationRequest>& requests,
                             const Tokenizer* tokenizer, const TextCallback& on_text,
                             const LogitsSink& sink) {
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(o.model_dir));
  if (!o.tp_per_stage.empty() && static_cast<int>(o.tp_per_stage.size()) != o.pp)
    return InvalidArgument("tp_per_stage has " + std::to_string(o.tp_per_stage.size()) +
                           " entries but pp=" + std::to_string(o.pp));
  TESSERA_ASSIGN_OR_RETURN(
      ParallelConfig parallel,
      o.tp_per_stage.empty()
          ? ParallelConfig::Make(config, o.tp, o.pp, o.layers_per_stage, o.expert_parallel)
          : ParallelConfig::MakePerStage(config, o.tp_per_stage, o.layers_per_stage,
                                         o.expert_parallel));
  // Every rank of this deployment shares the host's cores.
  kernels::SetBlasThreads(kernels::BlasThreadsForRanks(parallel.world_size()));
  const std::string who = "rank " + std::to_string(o.rank) + " (stage " +
                          std::to_string(parallel.StageOf(o.rank)) + ", tp_rank " +
                          std::to_string(parallel.TpRankOf(o.rank)) + ")";
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store,
                           TcpStore::Connect(o.store_host, o.store_port, o.timeout_seconds,
                                             StoreCredentials::Admin(o.store_secret)));
  ProcessGroupOptions pgo;
  pgo.tp = parallel.tp;
  pgo.pp = parallel.pp;
  pgo.tp_per_stage = parallel.tp_per_stage;
  pgo.world_rank = o.rank;
  pgo.timeout_seconds = o.timeout_seconds;
  // The rendezvous honours --timeout too: a peer that never joins (stopped,
  // or killed before it registered) fails the launch within it.
  pgo.connect_timeout_seconds = o.timeout_seconds;
  pgo.hostname = o.bind_host;
  auto pg = ProcessGroup::Create(*store, pgo);
  if (!pg.ok()) return pg.status().WithContext(who);

  auto loaded =
      LoadModel(o.model_dir, parallel, o.rank, (*pg)->tp(), {}, nullptr, nullptr, o.quantization);
  if (!loaded.ok()) return loaded.status().WithContext(who);
  RankResult result;
  result.load_seconds = loaded->load_seconds;
  result.weight_bytes = loaded->weight_bytes;
  const StageLayout lay = loaded->model->layout();
  auto made = MakeStageKvCache(kernels::CpuBackend(), o.model_dir, lay, o.kv_blocks, o.block_size,
                               config.head_dim, o.kv_cache_dtype);
  if (!made.ok()) return made.status().WithContext(who);
  KvCache& cache = **made;

  PipelineLinks links;
  links.pp = o.pp;
  links.stage = (*pg)->stage();
  links.tp_rank = (*pg)->tp_rank();
  links.tp = (*pg)->tp();
  links.prev = (*pg)->prev_stage();
  links.next = (*pg)->next_stage_links();
  links.ret = (*pg)->return_links();

  if (links.stage > 0) {
    Status s = ServeStage(*loaded->model, cache, links, sink);
    if (!s.ok()) return s.WithContext(who);
    return result;
  }
  result.is_driver = true;
  // The requests come from one place: tp_rank 0's, whatever the other
  // stage-0 ranks were started with.
  std::vector<GenerationRequest> own = requests;
  if (links.tp) {
    Status s = BroadcastRequests(*links.tp, loaded->model->backend(), own);
    if (!s.ok()) return s.WithContext(who);
  }
  PipelineExecutor executor(loaded->model.get(), &cache, links, sink);
  BlockAllocator allocator(o.kv_blocks);
  Engine engine(config, &executor, &allocator, o.block_size, tokenizer, o.engine);
  auto results = engine.Generate(own, on_text);
  if (!results.ok()) return results.status().WithContext(who);
  TESSERA_RETURN_IF_ERROR_CTX(executor.Shutdown(), who);
  result.results = std::move(*results);
  result.stats = engine.stats();
  return result;
}

}  // namespace tessera
