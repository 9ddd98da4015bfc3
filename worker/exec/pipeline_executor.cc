#include "worker/exec/pipeline_executor.h"

#include <cstring>
#include <string>

#include "common/wire/step_codec.h"
#include "worker/exec/nonfinite_check.h"
#include "worker/exec/rank_inputs.h"

namespace tessera {

namespace {

constexpr size_t kMaxMetaBytes = size_t{1} << 30;

int64_t CountWanted(const StepBatch& batch) {
  int64_t n = 0;
  for (const SeqStep& s : batch.seqs) n += s.want_logits ? 1 : 0;
  return n;
}

// The bytes of `t`, copied to the host when it lives on a device.
StatusOr<std::vector<uint8_t>> TensorBytes(kernels::Backend& backend, const Tensor& t) {
  TESSERA_ASSIGN_OR_RETURN(Tensor host, backend.ToHost(t));
  const auto* p = static_cast<const uint8_t*>(host.raw());
  return std::vector<uint8_t>(p, p + host.nbytes());
}

std::string RankName(const PipelineLinks& l) {
  return "stage " + std::to_string(l.stage) + " tp_rank " + std::to_string(l.tp_rank);
}

}  // namespace

StatusOr<std::vector<SampledToken>> SampleOnLastStage(LlamaModel& model, const StepBatch& batch,
                                                      const Tensor& hidden,
                                                      const PipelineLinks& links,
                                                      SequenceSamplers& samplers,
                                                      const LogitsSink& sink) {
  const int64_t wanted = CountWanted(batch);
  const int64_t vocab = model.config().vocab_size;
  // The sampled rows, then the rows of prompt log-probabilities (StepBatch::LogitsRows).
  TESSERA_ASSIGN_OR_RETURN(Tensor logits,
                           model.backend().Allocate({batch.LogitsRows(), vocab}, DType::kF32));
  TESSERA_RETURN_IF_ERROR(model.Logits(batch, hidden, logits));
  std::vector<SampledToken> sampled(static_cast<size_t>(wanted));
  if (links.tp_rank == 0) {
    if (sink) {
      TESSERA_ASSIGN_OR_RETURN(Tensor host, model.backend().ToHost(logits.Slice0(0, wanted)));
      sink(batch, host);
    }
    TESSERA_ASSIGN_OR_RETURN(sampled, samplers.Sample(batch, logits));
    LogNonFiniteLogits(model, batch, sampled, RankName(links));
  }
  std::vector<int32_t> tokens(sampled.size());
  for (size_t i = 0; i < sampled.size(); ++i) tokens[i] = sampled[i].token_id;
  if (links.tp && links.tp->size() > 1 && wanted > 0) {
    const std::string where = "token broadcast on " + RankName(links);
    if (links.tp->device() == Device::kCPU) {
      Status s = links.tp->Broadcast(tokens.data(), tokens.size() * sizeof(int32_t), 0);
      if (!s.ok()) return s.WithContext(where);
    } else {
      // A device communicator (NCCL): the tokens travel through device memory.
      Tensor host = Tensor::Wrap(tokens.data(), {wanted}, DType::kI32, Device::kCPU, nullptr);
      auto dev = model.backend().Upload(host);
      if (!dev.ok()) return dev.status().WithContext(where);
      Status s = links.tp->Broadcast(dev->raw(), tokens.size() * sizeof(int32_t), 0);
      if (s.ok()) s = model.backend().Copy(host, *dev);
      if (!s.ok()) return s.WithContext(where);
    }
    for (size_t i = 0; i < sampled.size(); ++i) sampled[i].token_id = tokens[i];
  }
  return sampled;
}

PipelineExecutor::PipelineExecutor(LlamaModel* model, KvCache* cache, PipelineLinks links,
                                   LogitsSink sink)
    : model_(model), cache_(cache), links_(links), sink_(std::move(sink)) {
  TESSERA_CHECK(links_.stage == 0);
  if (links_.pp > 1) {
    TESSERA_CHECK(links_.ret.size() == 1);
    // Two frames (meta, hidden) per micro-batch, pp micro-batches in flight.
    sender_ = std::make_unique<AsyncSender>(links_.next, 1, static_cast<size_t>(2 * links_.pp + 2));
  }
}

PipelineExecutor::~PipelineExecutor() = default;

Status PipelineExecutor::Submit(const StepBatch& batch) {
  TESSERA_ASSIGN_OR_RETURN(
      std::vector<SampledToken> tokens,
      RunFirstStage(*model_, *cache_, links_, batch, sender_.get(), samplers_, sink_));
  if (links_.pp == 1) {
    ready_.push_back(std::move(tokens));  // every tp rank of stage 0 keeps the broadcast tokens
  } else {
    wanted_.push_back(CountWanted(batch));
  }
  return Status::Ok();
}

StatusOr<std::vector<SampledToken>> PipelineExecutor::Collect() {
  if (links_.pp == 1) {
    if (ready_.empty()) return FailedPrecondition("collect: no step in flight");
    std::vector<SampledToken> t = std::move(ready_.front());
    ready_.pop_front();
    return t;
  }
  if (wanted_.empty()) return FailedPrecondition("collect: no step in flight");
  const int64_t wanted = wanted_.front();
  wanted_.pop_front();
  std::vector<uint8_t> frame;
  Status s = RecvFrame(*links_.ret[0], 1, frame, static_cast<size_t>(wanted) * sizeof(int32_t));
  if (!s.ok()) return s.WithContext("tokens from the last stage to " + RankName(links_));
  if (frame.size() != static_cast<size_t>(wanted) * sizeof(int32_t))
    return Internal("last stage returned " + std::to_string(frame.size() / 4) +
                    " tokens, expected " + std::to_string(wanted));
  std::vector<int32_t> ids(static_cast<size_t>(wanted));
  if (wanted) std::memcpy(ids.data(), frame.data(), frame.size());
  std::vector<SampledToken> tokens(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) tokens[i].token_id = ids[i];
  return tokens;
}

Status PipelineExecutor::Shutdown() { return SendShutdownDownstream(sender_.get()); }

StatusOr<std::vector<SampledToken>> RunFirstStage(LlamaModel& model, KvCache& cache,
                                                  const PipelineLinks& links,
                                                  const StepBatch& batch, AsyncSender* sender,
                                                  SequenceSamplers& samplers,
                                                  const LogitsSink& sink) {
  // The stage-0 tp ranks sum their embedding rows: they must run the same
  // step (one all-gathered hash per prefill step; rank_inputs.h).
  if (links.tp)
    TESSERA_RETURN_IF_ERROR(
        CheckSameStepInputs(*links.tp, model.backend(), batch, RankName(links)));
  TESSERA_ASSIGN_OR_RETURN(Tensor hidden, model.NewHidden(batch.total_tokens()));
  TESSERA_RETURN_IF_ERROR_CTX(model.Forward(batch, Tensor(), cache, hidden), RankName(links));
  TESSERA_RETURN_IF_ERROR(CheckHiddenFinite(model, hidden, RankName(links)));
  if (links.pp == 1) return SampleOnLastStage(model, batch, hidden, links, samplers, sink);
  TESSERA_CHECK(sender != nullptr);
  TESSERA_RETURN_IF_ERROR(sender->Enqueue(EncodeStep(batch)));
  TESSERA_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, TensorBytes(model.backend(), hidden));
  TESSERA_RETURN_IF_ERROR(sender->Enqueue(std::move(bytes)));
  return std::vector<SampledToken>();
}

Status SendShutdownDownstream(AsyncSender* sender) {
  if (!sender) return Status::Ok();
  TESSERA_RETURN_IF_ERROR(sender->Enqueue(EncodeShutdown()));
  return sender->Flush();
}

Status ServeStage(LlamaModel& model, KvCache& cache, const PipelineLinks& links,
                  const LogitsSink& sink, const TokenSink& tokens_out, GrammarSource grammar) {
  TESSERA_CHECK(links.stage > 0 && links.prev != nullptr);
  const bool last = links.stage == links.pp - 1;
  std::unique_ptr<AsyncSender> sender;
  if (last && tokens_out) {
    // Tokens leave through tokens_out; nothing is sent downstream.
  } else if (last) {
    // To the stage-0 ranks this rank feeds (possibly none).
    sender = std::make_unique<AsyncSender>(links.ret, 0, 2 * static_cast<size_t>(links.pp) + 2);
  } else {
    // To the next-stage receivers this rank feeds (possibly none).
    sender = std::make_unique<AsyncSender>(links.next, 1, 2 * static_cast<size_t>(links.pp) + 2);
  }
  SequenceSamplers samplers(std::move(grammar));
  std::vector<uint8_t> frame;
  while (true) {
    Status s = RecvFrame(*links.prev, 0, frame, kMaxMetaBytes);
    if (!s.ok()) return s.WithContext("step from the previous stage to " + RankName(links));
    TESSERA_ASSIGN_OR_RETURN(DecodedStep msg, DecodeStep(frame));
    if (msg.kind == StepMessageKind::kShutdown) {
      if (!last) TESSERA_RETURN_IF_ERROR(sender->Enqueue(EncodeShutdown()));
      return sender ? sender->Flush() : Status::Ok();
    }
    if (msg.kind == StepMessageKind::kKeepalive) {
      if (!last) TESSERA_RETURN_IF_ERROR(sender->Enqueue(EncodeKeepalive()));
      continue;
    }
    const StepBatch& batch = msg.batch;
    TESSERA_ASSIGN_OR_RETURN(Tensor hidden, model.NewHidden(batch.total_tokens()));
    s = RecvFrame(*links.prev, 0, frame, hidden.nbytes());
    if (!s.ok())
      return s.WithContext("hidden states from the previous stage to " + RankName(links));
    if (frame.size() != hidden.nbytes())
      return InvalidArgument("hidden states of " + std::to_string(frame.size()) + " bytes for " +
                             hidden.Describe() + " on " + RankName(links));
    const Tensor received =
        Tensor::Wrap(frame.data(), hidden.shape(), hidden.dtype(), Device::kCPU, nullptr);
    TESSERA_RETURN_IF_ERROR(model.backend().Copy(hidden, received));
    TESSERA_RETURN_IF_ERROR_CTX(model.Forward(batch, hidden, cache, hidden), RankName(links));
    TESSERA_RETURN_IF_ERROR(CheckHiddenFinite(model, hidden, RankName(links)));
    if (last) {
      TESSERA_ASSIGN_OR_RETURN(std::vector<SampledToken> tokens,
                               SampleOnLastStage(model, batch, hidden, links, samplers, sink));
      if (tokens_out) {
        if (links.tp_rank == 0) TESSERA_RETURN_IF_ERROR(tokens_out(batch, tokens));
        continue;
      }
      std::vector<uint8_t> out(tokens.size() * sizeof(int32_t));
      for (size_t i = 0; i < tokens.size(); ++i)
        std::memcpy(out.data() + i * sizeof(int32_t), &tokens[i].token_id, sizeof(int32_t));
      TESSERA_RETURN_IF_ERROR(sender->Enqueue(std::move(out)));
    } else {
      TESSERA_RETURN_IF_ERROR(sender->Enqueue(EncodeStep(batch)));
      TESSERA_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, TensorBytes(model.backend(), hidden));
      TESSERA_RETURN_IF_ERROR(sender->Enqueue(std::move(bytes)));
    }
  }
}

}  // namespace tessera
