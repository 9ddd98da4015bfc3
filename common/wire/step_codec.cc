#include "common/wire/step_codec.h"

#include <cstring>
#include <string>

namespace tessera {

namespace {

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  template <typename T>
  void PutVec(const std::vector<T>& v) {
    Put<uint64_t>(v.size());
    const size_t at = out.size();
    out.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(T));
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  template <typename T>
  Status Get(T* v, const char* what) {
    if (pos_ + sizeof(T) > b_.size())
      return InvalidArgument(std::string("step message truncated at ") + what);
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  template <typename T>
  Status GetVec(std::vector<T>* v, const char* what) {
    uint64_t n = 0;
    TESSERA_RETURN_IF_ERROR(Get(&n, what));
    if (n > (b_.size() - pos_) / sizeof(T))
      return InvalidArgument(std::string("step message: count of ") + what + " (" +
                             std::to_string(n) + ") exceeds the message");
    v->resize(n);
    if (n) std::memcpy(v->data(), b_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return Status::Ok();
  }

 private:
  const std::vector<uint8_t>& b_;
  size_t pos_ = 0;
};

void PutHeader(Writer& w, StepMessageKind kind) {
  w.Put<uint8_t>('T');
  w.Put<uint8_t>('S');
  w.Put<uint8_t>('B');
  w.Put<uint8_t>(kStepCodecVersion);
  w.Put<uint8_t>(static_cast<uint8_t>(kind));
}

}  // namespace

std::vector<uint8_t> EncodeStep(const StepBatch& batch) {
  Writer w;
  PutHeader(w, StepMessageKind::kStep);
  w.PutVec(batch.token_ids);
  w.PutVec(batch.finished_seq_ids);
  w.Put<uint64_t>(batch.seqs.size());
  for (const SeqStep& s : batch.seqs) {
    w.Put(s.seq_id);
    w.Put(s.start_pos);
    w.Put(s.num_tokens);
    w.Put(s.prompt_len);
    w.PutVec(s.block_table);
    w.Put<uint8_t>(s.want_logits ? 1 : 0);
    w.Put(s.sampling.temperature);
    w.Put(s.sampling.top_k);
    w.Put(s.sampling.top_p);
    w.Put(s.sampling.seed);
    w.Put(s.sampling.logprobs);
    w.Put(s.sampling.presence_penalty);
    w.Put(s.sampling.frequency_penalty);
    w.Put(s.sampling.repetition_penalty);
    w.Put(s.sampling.min_p);
    w.Put(s.sampling.min_tokens);
    w.Put<uint64_t>(s.sampling.logit_bias.size());
    for (const auto& [id, bias] : s.sampling.logit_bias) {
      w.Put(id);
      w.Put(bias);
    }
    w.PutVec(s.sampling.min_tokens_blocked);
    w.Put(s.output_start);
    w.PutVec(s.history);
    w.Put(s.sampling.prompt_logprobs);
    w.Put<uint8_t>(s.want_prompt_logprobs ? 1 : 0);
    w.Put<uint8_t>(static_cast<uint8_t>(s.sampling.grammar.kind));
    w.Put<uint64_t>(s.sampling.grammar.schema.size());
    w.out.insert(w.out.end(), s.sampling.grammar.schema.begin(), s.sampling.grammar.schema.end());
  }
  return std::move(w.out);
}

std::vector<uint8_t> EncodeShutdown() {
  Writer w;
  PutHeader(w, StepMessageKind::kShutdown);
  return std::move(w.out);
}

std::vector<uint8_t> EncodeKeepalive() {
  Writer w;
  PutHeader(w, StepMessageKind::kKeepalive);
  return std::move(w.out);
}

StatusOr<DecodedStep> DecodeStep(const std::vector<uint8_t>& bytes) {
  Reader r(bytes);
  uint8_t m[3], version = 0, kind = 0;
  for (uint8_t& c : m) TESSERA_RETURN_IF_ERROR(r.Get(&c, "magic"));
  if (m[0] != 'T' || m[1] != 'S' || m[2] != 'B') return InvalidArgument("step message: bad magic");
  TESSERA_RETURN_IF_ERROR(r.Get(&version, "version"));
  if (version != kStepCodecVersion)
    return InvalidArgument("step message: version " + std::to_string(version) +
                           ", this build speaks " + std::to_string(kStepCodecVersion));
  TESSERA_RETURN_IF_ERROR(r.Get(&kind, "kind"));
  DecodedStep out;
  if (kind == static_cast<uint8_t>(StepMessageKind::kShutdown)) {
    out.kind = StepMessageKind::kShutdown;
    return out;
  }
  if (kind == static_cast<uint8_t>(StepMessageKind::kKeepalive)) {
    out.kind = StepMessageKind::kKeepalive;
    return out;
  }
  if (kind != static_cast<uint8_t>(StepMessageKind::kStep))
    return InvalidArgument("step message: unknown kind " + std::to_string(kind));
  TESSERA_RETURN_IF_ERROR(r.GetVec(&out.batch.token_ids, "token_ids"));
  TESSERA_RETURN_IF_ERROR(r.GetVec(&out.batch.finished_seq_ids, "finished_seq_ids"));
  uint64_t n = 0;
  TESSERA_RETURN_IF_ERROR(r.Get(&n, "seqs"));
  if (n > bytes.size()) return InvalidArgument("step message: sequence count exceeds the message");
  out.batch.seqs.resize(n);
  int64_t covered = 0;
  for (SeqStep& s : out.batch.seqs) {
    uint8_t want = 0;
    TESSERA_RETURN_IF_ERROR(r.Get(&s.seq_id, "seq_id"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.start_pos, "start_pos"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.num_tokens, "num_tokens"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.prompt_len, "prompt_len"));
    TESSERA_RETURN_IF_ERROR(r.GetVec(&s.block_table, "block_table"));
    TESSERA_RETURN_IF_ERROR(r.Get(&want, "want_logits"));
    s.want_logits = want != 0;
    TESSERA_RETURN_IF_ERROR(r.Get(&s.sampling.temperature, "temperature"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.sampling.top_k, "top_k"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.sampling.top_p, "top_p"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.sampling.seed, "seed"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.sampling.logprobs, "logprobs"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.sampling.presence_penalty, "presence_penalty"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.sampling.frequency_penalty, "frequency_penalty"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.sampling.repetition_penalty, "repetition_penalty"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.sampling.min_p, "min_p"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.sampling.min_tokens, "min_tokens"));
    uint64_t biases = 0;
    TESSERA_RETURN_IF_ERROR(r.Get(&biases, "logit_bias"));
    if (biases > bytes.size())
      return InvalidArgument("step message: logit_bias count exceeds the message");
    s.sampling.logit_bias.resize(biases);
    for (auto& [id, bias] : s.sampling.logit_bias) {
      TESSERA_RETURN_IF_ERROR(r.Get(&id, "logit_bias id"));
      TESSERA_RETURN_IF_ERROR(r.Get(&bias, "logit_bias value"));
    }
    TESSERA_RETURN_IF_ERROR(r.GetVec(&s.sampling.min_tokens_blocked, "min_tokens_blocked"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.output_start, "output_start"));
    TESSERA_RETURN_IF_ERROR(r.GetVec(&s.history, "history"));
    TESSERA_RETURN_IF_ERROR(r.Get(&s.sampling.prompt_logprobs, "prompt_logprobs"));
    uint8_t want_prompt = 0;
    TESSERA_RETURN_IF_ERROR(r.Get(&want_prompt, "want_prompt_logprobs"));
    s.want_prompt_logprobs = want_prompt != 0;
    uint8_t grammar = 0;
    uint64_t schema_bytes = 0;
    TESSERA_RETURN_IF_ERROR(r.Get(&grammar, "grammar kind"));
    TESSERA_RETURN_IF_ERROR(r.Get(&schema_bytes, "grammar schema"));
    if (schema_bytes > kMaxGrammarSchemaBytes)
      return InvalidArgument("step message: grammar schema of " + std::to_string(schema_bytes) +
                             " bytes exceeds " + std::to_string(kMaxGrammarSchemaBytes));
    s.sampling.grammar.kind = static_cast<GrammarKind>(grammar);
    s.sampling.grammar.schema.resize(schema_bytes);
    for (char& c : s.sampling.grammar.schema) {
      uint8_t b = 0;
      TESSERA_RETURN_IF_ERROR(r.Get(&b, "grammar schema"));
      c = static_cast<char>(b);
    }
    if (Status st = s.sampling.Validate(); !st.ok())
      return InvalidArgument("step message: seq_id " + std::to_string(s.seq_id) + ": " +
                             st.message());
    if (!s.history.empty() && s.history.size() != static_cast<size_t>(s.start_pos))
      return InvalidArgument("step message: seq_id " + std::to_string(s.seq_id) + " history of " +
                             std::to_string(s.history.size()) + " tokens for start_pos " +
                             std::to_string(s.start_pos));
    if (s.num_tokens < 0 || s.start_pos < 0)
      return InvalidArgument("step message: negative token count or position");
    if (s.sampling.logprobs < -1 || s.sampling.logprobs > kMaxTopLogprobs)
      return InvalidArgument("step message: seq_id " + std::to_string(s.seq_id) + " logprobs " +
                             std::to_string(s.sampling.logprobs) + " outside -1.." +
                             std::to_string(kMaxTopLogprobs));
    covered += s.num_tokens;
  }
  if (covered != out.batch.total_tokens())
    return InvalidArgument("step message: sequences cover " + std::to_string(covered) +
                           " tokens, batch has " + std::to_string(out.batch.total_tokens()));
  return out;
}

}  // namespace tessera
