// Pipeline-parallel execution of a model split into pp stages of tp ranks.
//
// Stage 0 ranks drive: each runs the same Engine (the same deterministic
// scheduling decisions on every tp rank) over a PipelineExecutor. Submit runs
// stage 0's layers and hands (StepBatch, hidden [tokens, hidden]) to the next
// stage through an AsyncSender; ranks of later stages run ServeStage: receive,
// run their layers, pass on. The last stage computes the vocab-parallel
// logits (all-gathered across its tp group), tp rank 0 samples and
// broadcasts the tokens inside the group, and every last-stage tp rank sends
// them back to the stage-0 ranks it feeds over the return links. Up to pp
// micro-batches are in flight, so stages overlap.
//
// Links (ProcessGroup): tp() collectives; prev_stage() / next_stage_links()
// pipes; return_links(): last stage (rank 1) -> stage 0 (rank 0), pp > 1
// only. Stages may have different tp: each rank receives from exactly one
// sender and sends to the receivers common/model/stage_handoff.h pairs it with
// (one with equal tp, none or several otherwise).
//
// Failure: every communicator call is bounded by the group's timeout; an
// error names the op, this rank and the peer, and ends the loop on this rank
// (the caller exits non-zero so its peers' waits fail too).
//
// Thread-safety: one owner thread per rank, plus its AsyncSender thread.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "common/base/tensor.h"
#include "common/engine/step_executor.h"
#include "worker/comm/async_sender.h"
#include "worker/model/kv_cache.h"
#include "worker/model/llama_model.h"
#include "worker/model/sampler.h"

namespace tessera {

struct PipelineLinks {
  int pp = 1;
  int stage = 0;
  int tp_rank = 0;
  Communicator* tp = nullptr;    // this stage's tp group (may be null when tp == 1)
  Communicator* prev = nullptr;  // pipe from stage - 1 (null on stage 0)
  // Pipes to the stage + 1 receivers this rank feeds (ProcessGroup::
  // next_stage_links()); empty on the last stage.
  std::vector<Communicator*> next;
  // Return links (ProcessGroup::return_links()): on stage 0 the one link the
  // tokens come back on; on the last stage those it sends them on; empty
  // when pp == 1 and on middle stages.
  std::vector<Communicator*> ret;
};

// Receives every batch's logits [num_wanted, vocab] on the last stage's tp
// rank 0, before sampling (used by equivalence tests and debugging).
using LogitsSink = std::function<void(const StepBatch& batch, const Tensor& logits)>;

// The last stage's work on one batch: full-vocab logits (the vocab-parallel
// lm_head's shards all-gathered), sampling on tp rank 0, broadcast of the
// token ids in the tp group. Returns the tokens (one per want_logits
// sequence) on every rank of the stage; log-probabilities (where asked)
// only on tp rank 0, the rank that reports results.
StatusOr<std::vector<SampledToken>> SampleOnLastStage(LlamaModel& model, const StepBatch& batch,
                                                      const Tensor& hidden,
                                                      const PipelineLinks& links,
                                                      SequenceSamplers& samplers,
                                                      const LogitsSink& sink);

class PipelineExecutor : public StepExecutor {
 public:
  // On stage 0 ranks. `model` holds stage 0's layers.
  PipelineExecutor(LlamaModel* model, KvCache* cache, PipelineLinks links, LogitsSink sink = {});
  ~PipelineExecutor() override;

  Status Submit(const StepBatch& batch) override;
  // With pp > 1 the return link carries token ids only: no log-probabilities.
  StatusOr<std::vector<SampledToken>> Collect() override;
  int max_in_flight() const override { return links_.pp; }
  int64_t vocab_size() const override { return model_->config().vocab_size; }

  // Tells later stages to stop (their ServeStage returns OK) and waits for
  // the message to leave. Call once, after the last Generate.
  Status Shutdown();

 private:
  LlamaModel* model_;
  KvCache* cache_;
  PipelineLinks links_;
  LogitsSink sink_;
  std::unique_ptr<AsyncSender> sender_;
  SequenceSamplers samplers_;                    // used when pp == 1
  std::deque<std::vector<SampledToken>> ready_;  // tokens of finished steps when pp == 1
  std::deque<int64_t> wanted_;                   // want_logits count per in-flight batch
};

// Where the last stage's sampled tokens go when they do not return to a
// stage-0 driver over the return link (a worker daemon sends them to the
// coordinator). Called on tp rank 0 of the last stage only.
using TokenSink =
    std::function<Status(const StepBatch& batch, const std::vector<SampledToken>& tokens)>;

// Stage 0's work on one micro-batch: run the layers, then pass (batch,
// hidden) on to stage 1 through `sender` (the AsyncSender on links.next), or
// with pp == 1 sample and return the tokens (on every tp rank: they are
// broadcast). Returns an empty vector when pp > 1.
StatusOr<std::vector<SampledToken>> RunFirstStage(LlamaModel& model, KvCache& cache,
                                                  const PipelineLinks& links,
                                                  const StepBatch& batch, AsyncSender* sender,
                                                  SequenceSamplers& samplers,
                                                  const LogitsSink& sink = {});

// Sends the shutdown message down the pipeline and waits until it has left.
// `sender` may be null (pp == 1).
Status SendShutdownDownstream(AsyncSender* sender);

// The loop of a rank on stage > 0: returns OK on shutdown, or the first error.
// Keepalive messages (EncodeKeepalive) are passed on and otherwise ignored.
// The last stage returns tokens over links.ret, or to `tokens_out` when set.
// `grammar` is the last stage's structured-output engine source (SequenceSamplers).
Status ServeStage(LlamaModel& model, KvCache& cache, const PipelineLinks& links,
                  const LogitsSink& sink = {}, const TokenSink& tokens_out = {},
                  GrammarSource grammar = {});

}  // namespace tessera
