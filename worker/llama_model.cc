#include "worker/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/paged_attention.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace tessera {

LlamaModel::LlamaModel(const ModelConfig& config, StageWeights weights, Communicator* tp_comm)
    : config_(config), weights_(std::move(weights)), tp_comm_(tp_comm) {
  TESSERA_CHECK(weights_.layout.tp == 1 || tp_comm_ != nullptr);
  default_inv_freq_ = kernels::RopeInvFreq(config_, config_.max_position_embeddings);
}

Status LlamaModel::AllReduce(Tensor& t, const char* what, int layer) {
  if (weights_.layout.tp == 1) return Status::Ok();
  Status s = tp_comm_->AllReduceSum(t.data<float>(), static_cast<size_t>(t.numel()));
  if (!s.ok())
    return s.WithContext(std::string(what) + " all-reduce in layer " + std::to_string(layer));
  return Status::Ok();
}

Status LlamaModel::Forward(const StepBatch& batch, const Tensor& hidden_in, KvCache& cache,
                           Tensor& hidden_out) {
  const StageLayout& lay = weights_.layout;
  const int64_t tokens = batch.total_tokens();
  const int64_t hidden = config_.hidden_size;
  if (hidden_out.rank() != 2 || hidden_out.dim(0) != tokens || hidden_out.dim(1) != hidden)
    return InvalidArgument("forward: hidden_out " + hidden_out.Describe() + " for " +
                           std::to_string(tokens) + " tokens");
  if (lay.is_first) {
    TESSERA_RETURN_IF_ERROR(kernels::EmbeddingLookup(batch.token_ids, weights_.embed_tokens,
                                                     lay.vocab_begin, hidden_out));
    for (size_t i = 0; i < batch.token_ids.size(); ++i) {
      if (batch.token_ids[i] >= config_.vocab_size)
        return OutOfRange("forward: token id " + std::to_string(batch.token_ids[i]) +
                          " at position " + std::to_string(i) + " is outside the vocab of " +
                          std::to_string(config_.vocab_size));
    }
    TESSERA_RETURN_IF_ERROR(AllReduce(hidden_out, "embedding", -1));
  } else {
    if (hidden_in.shape() != hidden_out.shape())
      return InvalidArgument("forward: hidden_in " + hidden_in.Describe() + " vs hidden_out " +
                             hidden_out.Describe());
    if (hidden_in.raw() != hidden_out.raw())
      std::memcpy(hidden_out.raw(), hidden_in.raw(), hidden_in.nbytes());
  }
  const std::vector<int32_t> positions = batch.Positions();
  for (int l = 0; l < lay.num_layers(); ++l) {
    TESSERA_RETURN_IF_ERROR(Layer(l, batch, positions, cache, hidden_out));
  }
  return Status::Ok();
}

Status LlamaModel::Layer(int local, const StepBatch& batch, const std::vector<int32_t>& positions,
                         KvCache& cache, Tensor& h) {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(local)];
  const StageLayout& lay = weights_.layout;
  const int layer = lay.first_layer + local;
  const int64_t tokens = batch.total_tokens();
  const int64_t hidden = config_.hidden_size, head_dim = config_.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);

  Tensor x = Tensor::Empty({tokens, hidden});
  TESSERA_RETURN_IF_ERROR(kernels::RmsNorm(h, w.input_norm, eps, x));
  Tensor q = Tensor::Empty({tokens, lay.heads_local * head_dim});
  Tensor k = Tensor::Empty({tokens, lay.kv_heads_local * head_dim});
  Tensor v = Tensor::Empty({tokens, lay.kv_heads_local * head_dim});
  TESSERA_RETURN_IF_ERROR(kernels::Linear(x, w.q_proj, w.q_bias, q));
  TESSERA_RETURN_IF_ERROR(kernels::Linear(x, w.k_proj, w.k_bias, k));
  TESSERA_RETURN_IF_ERROR(kernels::Linear(x, w.v_proj, w.v_bias, v));
  Tensor q3 = q.Reshape({tokens, lay.heads_local, head_dim});
  Tensor k3 = k.Reshape({tokens, lay.kv_heads_local, head_dim});
  Tensor v3 = v.Reshape({tokens, lay.kv_heads_local, head_dim});

  std::vector<kernels::AttentionSeq> seqs;
  seqs.reserve(batch.seqs.size());
  int64_t begin = 0;
  for (const SeqStep& s : batch.seqs) {
    const int64_t end = begin + s.num_tokens;
    const int64_t seq_len =
        std::max<int64_t>(static_cast<int64_t>(s.start_pos) + s.num_tokens, s.prompt_len);
    // Dynamic NTK rope changes inv_freq once a sequence outgrows
    // max_position_embeddings; every other type uses the fixed table.
    std::vector<float> dyn;
    const std::vector<float>* inv = &default_inv_freq_;
    if (config_.rope_scaling.type == RopeType::kDynamic &&
        seq_len > config_.max_position_embeddings) {
      dyn = kernels::RopeInvFreq(config_, seq_len);
      inv = &dyn;
    }
    TESSERA_RETURN_IF_ERROR(kernels::ApplyRope(q3, begin, end, positions.data() + begin, *inv));
    TESSERA_RETURN_IF_ERROR(kernels::ApplyRope(k3, begin, end, positions.data() + begin, *inv));
    seqs.push_back({begin, s.num_tokens, s.start_pos,
                    std::span<const int32_t>(s.block_table.data(), s.block_table.size())});
    begin = end;
  }
  if (begin != tokens)
    return InvalidArgument("forward: sequences cover " + std::to_string(begin) +
                           " tokens, batch has " + std::to_string(tokens));
  TESSERA_RETURN_IF_ERROR(kernels::WriteKv(cache.layer(local), k3, v3, seqs));
  Tensor attn = Tensor::Empty({tokens, lay.heads_local * head_dim});
  TESSERA_RETURN_IF_ERROR(kernels::PagedAttention(
      q3, cache.layer(local), seqs, 1.0f / std::sqrt(static_cast<float>(head_dim)), attn));
  Tensor o = Tensor::Empty({tokens, hidden});
  TESSERA_RETURN_IF_ERROR(kernels::Linear(attn, w.o_proj, Tensor(), o));
  TESSERA_RETURN_IF_ERROR(AllReduce(o, "attention", layer));
  // Row-parallel bias (Llama attention_bias): added once, after the all-reduce.
  if (w.o_bias.defined()) {
    float* op = o.data<float>();
    const float* ob = w.o_bias.data<float>();
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < hidden; ++i) op[t * hidden + i] += ob[i];
  }
  TESSERA_RETURN_IF_ERROR(kernels::AddRmsNorm(h, o, w.post_norm, eps, x));

  Tensor gate = Tensor::Empty({tokens, lay.inter_local});
  Tensor up = Tensor::Empty({tokens, lay.inter_local});
  TESSERA_RETURN_IF_ERROR(kernels::Linear(x, w.gate_proj, w.gate_bias, gate));
  TESSERA_RETURN_IF_ERROR(kernels::Linear(x, w.up_proj, w.up_bias, up));
  TESSERA_RETURN_IF_ERROR(kernels::SiluMul(gate, up, gate));
  Tensor down = Tensor::Empty({tokens, hidden});
  TESSERA_RETURN_IF_ERROR(kernels::Linear(gate, w.down_proj, Tensor(), down));
  TESSERA_RETURN_IF_ERROR(AllReduce(down, "mlp", layer));
  float* hp = h.data<float>();
  const float* dp = down.data<float>();
  const float* db = w.down_bias.defined() ? w.down_bias.data<float>() : nullptr;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < hidden; ++i)
      hp[t * hidden + i] += dp[t * hidden + i] + (db ? db[i] : 0.0f);
  return Status::Ok();
}

Status LlamaModel::Logits(const StepBatch& batch, const Tensor& hidden, Tensor& logits) {
  const StageLayout& lay = weights_.layout;
  if (!lay.is_last) return FailedPrecondition("logits: this rank is not on the last stage");
  const int64_t hsize = config_.hidden_size;
  std::vector<int64_t> rows;
  int64_t begin = 0;
  for (const SeqStep& s : batch.seqs) {
    begin += s.num_tokens;
    if (s.want_logits) rows.push_back(begin - 1);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  if (logits.rank() != 2 || logits.dim(0) != n || logits.dim(1) != lay.vocab_size)
    return InvalidArgument("logits: output " + logits.Describe() + " for " + std::to_string(n) +
                           " rows of vocab " + std::to_string(lay.vocab_size));
  if (n == 0) return Status::Ok();
  Tensor picked = Tensor::Empty({n, hsize});
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(picked.data<float>() + i * hsize,
                hidden.data<float>() + rows[static_cast<size_t>(i)] * hsize, sizeof(float) * hsize);
  Tensor normed = Tensor::Empty({n, hsize});
  TESSERA_RETURN_IF_ERROR(kernels::RmsNorm(picked, weights_.final_norm,
                                           static_cast<float>(config_.rms_norm_eps), normed));
  Tensor local = Tensor::Empty({n, lay.vocab_local});
  TESSERA_RETURN_IF_ERROR(kernels::Linear(normed, weights_.lm_head, Tensor(), local));
  if (lay.tp == 1) {
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(logits.data<float>() + i * lay.vocab_size,
                  local.data<float>() + i * lay.vocab_local, sizeof(float) * lay.vocab_size);
    return Status::Ok();
  }
  // Vocab-parallel lm_head: gather [tp, n, vocab_local] and interleave to
  // [n, tp * vocab_local], dropping the padded tail.
  Tensor gathered = Tensor::Empty({lay.tp, n, lay.vocab_local});
  Status s = tp_comm_->AllGather(local.data<float>(), static_cast<size_t>(local.numel()),
                                 gathered.data<float>());
  if (!s.ok()) return s.WithContext("lm_head all-gather");
  for (int64_t i = 0; i < n; ++i) {
    float* out = logits.data<float>() + i * lay.vocab_size;
    for (int r = 0; r < lay.tp; ++r) {
      const int64_t col0 = r * lay.vocab_local;
      if (col0 >= lay.vocab_size) break;
      const int64_t cols = std::min(lay.vocab_local, lay.vocab_size - col0);
      std::memcpy(out + col0, gathered.data<float>() + (r * n + i) * lay.vocab_local,
                  sizeof(float) * cols);
    }
  }
  return Status::Ok();
}

}  // namespace tessera
