#include "worker/exec/rank_inputs.h"

#include <fmt/format.h>

#include <cstring>

namespace tessera {

namespace {

// Moves `bytes` of host memory through the communicator's memory: device
// communicators (NCCL) take device pointers.
template <typename Op>
Status OnCommMemory(Communicator& c, kernels::Backend& backend, void* host, size_t bytes, Op op) {
  if (c.device() == Device::kCPU) return op(host);
  const int64_t words = static_cast<int64_t>((bytes + 3) / 4);
  std::vector<float> staging(static_cast<size_t>(words));
  std::memcpy(staging.data(), host, bytes);
  Tensor h = Tensor::Wrap(staging.data(), {words}, DType::kF32, Device::kCPU, nullptr);
  TESSERA_ASSIGN_OR_RETURN(Tensor dev, backend.Upload(h));
  TESSERA_RETURN_IF_ERROR(op(dev.raw()));
  TESSERA_RETURN_IF_ERROR(backend.Copy(h, dev));
  std::memcpy(host, staging.data(), bytes);
  return Status::Ok();
}

template <typename T>
void Put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void PutBytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  Put<uint64_t>(out, n);
  const size_t at = out.size();
  out.resize(at + n);
  if (n) std::memcpy(out.data() + at, p, n);
}

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  template <typename T>
  Status Get(T* v) {
    if (pos_ + sizeof(T) > b_.size()) return InvalidArgument("broadcast requests: truncated");
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status GetBytes(std::string* s) {
    uint64_t n = 0;
    TESSERA_RETURN_IF_ERROR(Get(&n));
    if (n > b_.size() - pos_) return InvalidArgument("broadcast requests: truncated");
    s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return Status::Ok();
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  const std::vector<uint8_t>& b_;
  size_t pos_ = 0;
};

std::vector<uint8_t> Encode(const std::vector<GenerationRequest>& requests) {
  std::vector<uint8_t> out;
  Put<uint64_t>(out, requests.size());
  for (const GenerationRequest& r : requests) {
    PutBytes(out, r.prompt_ids.data(), r.prompt_ids.size() * sizeof(int32_t));
    Put(out, r.sampling.temperature);
    Put(out, r.sampling.top_k);
    Put(out, r.sampling.top_p);
    Put(out, r.sampling.seed);
    Put(out, r.sampling.logprobs);
    Put(out, r.max_tokens);
    Put<uint8_t>(out, r.ignore_eos ? 1 : 0);
    Put<uint64_t>(out, r.stop.size());
    for (const std::string& s : r.stop) PutBytes(out, s.data(), s.size());
    const SamplingParams& p = r.sampling;
    Put(out, p.presence_penalty);
    Put(out, p.frequency_penalty);
    Put(out, p.repetition_penalty);
    Put(out, p.min_p);
    Put(out, p.min_tokens);
    Put<uint64_t>(out, p.logit_bias.size());
    for (const auto& [id, bias] : p.logit_bias) {
      Put(out, id);
      Put(out, bias);
    }
    PutBytes(out, p.min_tokens_blocked.data(), p.min_tokens_blocked.size() * sizeof(int32_t));
    PutBytes(out, p.stop_token_ids.data(), p.stop_token_ids.size() * sizeof(int32_t));
    Put(out, p.prompt_logprobs);
    Put(out, r.share_prompt_of);
    Put<uint8_t>(out, static_cast<uint8_t>(p.grammar.kind));
    PutBytes(out, p.grammar.schema.data(), p.grammar.schema.size());
  }
  return out;
}

Status GetIds(Reader& r, std::vector<int32_t>* ids) {
  std::string bytes;
  TESSERA_RETURN_IF_ERROR(r.GetBytes(&bytes));
  if (bytes.size() % sizeof(int32_t) != 0)
    return InvalidArgument("broadcast requests: bad token id list length");
  ids->resize(bytes.size() / sizeof(int32_t));
  if (!bytes.empty()) std::memcpy(ids->data(), bytes.data(), bytes.size());
  return Status::Ok();
}

StatusOr<std::vector<GenerationRequest>> Decode(const std::vector<uint8_t>& bytes) {
  Reader r(bytes);
  uint64_t n = 0;
  TESSERA_RETURN_IF_ERROR(r.Get(&n));
  if (n > bytes.size()) return InvalidArgument("broadcast requests: bad count");
  std::vector<GenerationRequest> out(n);
  for (GenerationRequest& g : out) {
    std::string ids;
    TESSERA_RETURN_IF_ERROR(r.GetBytes(&ids));
    if (ids.size() % sizeof(int32_t) != 0)
      return InvalidArgument("broadcast requests: bad prompt length");
    g.prompt_ids.resize(ids.size() / sizeof(int32_t));
    if (!ids.empty()) std::memcpy(g.prompt_ids.data(), ids.data(), ids.size());
    TESSERA_RETURN_IF_ERROR(r.Get(&g.sampling.temperature));
    TESSERA_RETURN_IF_ERROR(r.Get(&g.sampling.top_k));
    TESSERA_RETURN_IF_ERROR(r.Get(&g.sampling.top_p));
    TESSERA_RETURN_IF_ERROR(r.Get(&g.sampling.seed));
    TESSERA_RETURN_IF_ERROR(r.Get(&g.sampling.logprobs));
    TESSERA_RETURN_IF_ERROR(r.Get(&g.max_tokens));
    uint8_t ignore = 0;
    TESSERA_RETURN_IF_ERROR(r.Get(&ignore));
    g.ignore_eos = ignore != 0;
    uint64_t stops = 0;
    TESSERA_RETURN_IF_ERROR(r.Get(&stops));
    if (stops > bytes.size()) return InvalidArgument("broadcast requests: bad stop count");
    g.stop.resize(stops);
    for (std::string& s : g.stop) TESSERA_RETURN_IF_ERROR(r.GetBytes(&s));
    SamplingParams& p = g.sampling;
    TESSERA_RETURN_IF_ERROR(r.Get(&p.presence_penalty));
    TESSERA_RETURN_IF_ERROR(r.Get(&p.frequency_penalty));
    TESSERA_RETURN_IF_ERROR(r.Get(&p.repetition_penalty));
    TESSERA_RETURN_IF_ERROR(r.Get(&p.min_p));
    TESSERA_RETURN_IF_ERROR(r.Get(&p.min_tokens));
    uint64_t biases = 0;
    TESSERA_RETURN_IF_ERROR(r.Get(&biases));
    if (biases > bytes.size()) return InvalidArgument("broadcast requests: bad logit_bias count");
    p.logit_bias.resize(biases);
    for (auto& [id, bias] : p.logit_bias) {
      TESSERA_RETURN_IF_ERROR(r.Get(&id));
      TESSERA_RETURN_IF_ERROR(r.Get(&bias));
    }
    TESSERA_RETURN_IF_ERROR(GetIds(r, &p.min_tokens_blocked));
    TESSERA_RETURN_IF_ERROR(GetIds(r, &p.stop_token_ids));
    TESSERA_RETURN_IF_ERROR(r.Get(&p.prompt_logprobs));
    TESSERA_RETURN_IF_ERROR(r.Get(&g.share_prompt_of));
    uint8_t grammar = 0;
    TESSERA_RETURN_IF_ERROR(r.Get(&grammar));
    p.grammar.kind = static_cast<GrammarKind>(grammar);
    TESSERA_RETURN_IF_ERROR(r.GetBytes(&p.grammar.schema));
  }
  if (!r.done()) return InvalidArgument("broadcast requests: trailing bytes");
  return out;
}

void Fnv(uint64_t& h, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
}

}  // namespace

Status BroadcastBytes(Communicator& tp, kernels::Backend& backend, std::vector<uint8_t>& bytes) {
  if (tp.size() <= 1) return Status::Ok();
  uint64_t size = bytes.size();
  Status s = OnCommMemory(tp, backend, &size, sizeof size,
                          [&](void* p) { return tp.Broadcast(p, sizeof size, 0); });
  if (!s.ok()) return s.WithContext("broadcast from tp_rank 0 (size)");
  if (tp.rank() != 0) bytes.resize(size);
  s = OnCommMemory(tp, backend, bytes.data(), bytes.size(),
                   [&](void* p) { return tp.Broadcast(p, bytes.size(), 0); });
  if (!s.ok()) return s.WithContext("broadcast from tp_rank 0");
  return Status::Ok();
}

Status BroadcastRequests(Communicator& tp, kernels::Backend& backend,
                         std::vector<GenerationRequest>& requests) {
  if (tp.size() <= 1) return Status::Ok();
  std::vector<uint8_t> payload;
  if (tp.rank() == 0) payload = Encode(requests);
  TESSERA_RETURN_IF_ERROR_CTX(BroadcastBytes(tp, backend, payload), "the requests");
  if (tp.rank() == 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(requests, Decode(payload));
  return Status::Ok();
}

uint64_t StepInputHash(const StepBatch& batch) {
  uint64_t h = 14695981039346656037ull;
  const uint64_t n = batch.seqs.size();
  Fnv(h, &n, sizeof n);
  for (const SeqStep& s : batch.seqs) {
    Fnv(h, &s.seq_id, sizeof s.seq_id);
    Fnv(h, &s.start_pos, sizeof s.start_pos);
    Fnv(h, &s.num_tokens, sizeof s.num_tokens);
    const uint8_t want = s.want_logits ? 1 : 0;
    Fnv(h, &want, 1);
  }
  const uint64_t t = batch.token_ids.size();
  Fnv(h, &t, sizeof t);
  Fnv(h, batch.token_ids.data(), batch.token_ids.size() * sizeof(int32_t));
  return h;
}

bool HasPromptTokens(const StepBatch& batch) {
  for (const SeqStep& s : batch.seqs)
    if (s.start_pos < s.prompt_len || s.num_tokens > 1) return true;
  return false;
}

Status CheckSameStepInputs(Communicator& tp, kernels::Backend& backend, const StepBatch& batch,
                           const std::string& who) {
  const int n = tp.size();
  if (n <= 1 || !HasPromptTokens(batch)) return Status::Ok();
  const uint64_t mine = StepInputHash(batch);
  // Two floats' worth of bytes per rank (AllGather moves bytes; no arithmetic).
  std::vector<float> all(static_cast<size_t>(2 * n));
  float send[2];
  std::memcpy(send, &mine, sizeof mine);
  Status s;
  if (tp.device() == Device::kCPU) {
    s = tp.AllGather(send, 2, all.data());
  } else {
    Tensor h_send = Tensor::Wrap(send, {2}, DType::kF32, Device::kCPU, nullptr);
    Tensor h_all = Tensor::Wrap(all.data(), {2 * n}, DType::kF32, Device::kCPU, nullptr);
    auto d_send = backend.Upload(h_send);
    auto d_all = backend.Upload(h_all);
    if (!d_send.ok()) return d_send.status();
    if (!d_all.ok()) return d_all.status();
    s = tp.AllGather(d_send->data<float>(), 2, d_all->data<float>());
    if (s.ok()) s = backend.Copy(h_all, *d_all);
  }
  if (!s.ok()) return s.WithContext("step input check on " + who);
  std::vector<uint64_t> hashes(static_cast<size_t>(n));
  std::memcpy(hashes.data(), all.data(), hashes.size() * sizeof(uint64_t));
  std::string differ;
  for (int r = 1; r < n; ++r)
    if (hashes[static_cast<size_t>(r)] != hashes[0])
      differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (differ.empty()) return Status::Ok();
  return FailedPrecondition(fmt::format(
      "step inputs differ across the tp group of stage 0: tp_rank(s) {} were given other token "
      "ids, positions or sequences than tp_rank 0 (hash {:016x}; this is {}, hash {:016x}); the "
      "stage-0 ranks must be fed the same steps",
      differ, hashes[0], who, mine));
}

}  // namespace tessera
