#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/dispatch.h"
#include "kernels/paged_attention.h"

namespace tessera::kernels {

StatusOr<AttentionBatch> CheckAttentionBatch(std::vector<AttentionSeq> seqs, int64_t num_tokens,
                                             int64_t block_size, int64_t num_blocks) {
  AttentionBatch b;
  b.num_tokens = num_tokens;
  if (block_size <= 0)
    return InvalidArgument("attention batch: block_size " + std::to_string(block_size));
  int64_t next = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const AttentionSeq& s = seqs[i];
    if (s.token_begin != next || s.num_tokens < 0 || s.start_pos < 0)
      return InvalidArgument("attention batch: sequence " + std::to_string(i) + " covers rows [" +
                             std::to_string(s.token_begin) + ", " +
                             std::to_string(s.token_begin + s.num_tokens) +
                             "), expected to start at " + std::to_string(next));
    next += s.num_tokens;
    const int64_t ctx = s.start_pos + s.num_tokens;
    const int64_t need = (ctx + block_size - 1) / block_size;
    if (need > static_cast<int64_t>(s.block_table.size()))
      return OutOfRange("kv cache: position " + std::to_string(ctx - 1) + " of sequence " +
                        std::to_string(i) + " needs block index " + std::to_string(need - 1) +
                        " but the block table has " + std::to_string(s.block_table.size()) +
                        " blocks");
    for (int64_t j = 0; j < need; ++j) {
      const int32_t block = s.block_table[static_cast<size_t>(j)];
      if (block < 0 || block >= num_blocks)
        return OutOfRange("kv cache: block id " + std::to_string(block) + " of sequence " +
                          std::to_string(i) + " outside [0, " + std::to_string(num_blocks) + ")");
    }
    b.max_seq_tokens = std::max(b.max_seq_tokens, s.num_tokens);
    b.max_context = std::max(b.max_context, ctx);
  }
  if (next != num_tokens)
    return InvalidArgument("attention batch: sequences cover " + std::to_string(next) +
                           " rows, the step has " + std::to_string(num_tokens));
  b.seqs = std::move(seqs);
  return b;
}

std::vector<int32_t> PackAttentionMeta(const AttentionBatch& b, int64_t block_size,
                                       int64_t table_stride) {
  const int64_t T = b.num_tokens, S = static_cast<int64_t>(b.seqs.size());
  int64_t tables = 0;
  for (const AttentionSeq& s : b.seqs) {
    const int64_t need = (s.start_pos + s.num_tokens + block_size - 1) / block_size;
    TESSERA_CHECK(table_stride == 0 || need <= table_stride);
    tables += table_stride > 0 ? table_stride : need;
  }
  std::vector<int32_t> meta(static_cast<size_t>(2 * T + 4 * S + tables), 0);
  int32_t* m = meta.data();
  int32_t* seq_info = m + 2 * T;
  int32_t* tab = seq_info + 4 * S;
  int64_t off = 0;
  for (int64_t i = 0; i < S; ++i) {
    const AttentionSeq& s = b.seqs[static_cast<size_t>(i)];
    for (int64_t t = 0; t < s.num_tokens; ++t) {
      m[s.token_begin + t] = static_cast<int32_t>(i);
      m[T + s.token_begin + t] = static_cast<int32_t>(s.start_pos + t);
    }
    const int64_t need = (s.start_pos + s.num_tokens + block_size - 1) / block_size;
    seq_info[4 * i + 0] = static_cast<int32_t>(s.token_begin);
    seq_info[4 * i + 1] = static_cast<int32_t>(s.num_tokens);
    seq_info[4 * i + 2] = s.start_pos;
    seq_info[4 * i + 3] = static_cast<int32_t>(off);
    for (int64_t j = 0; j < need; ++j) tab[off + j] = s.block_table[static_cast<size_t>(j)];
    off += table_stride > 0 ? table_stride : need;
  }
  return meta;
}

int64_t DecodeContextBucket(int64_t max_context) {
  int64_t bucket = 256;
  while (bucket < max_context) bucket *= 2;
  return bucket;
}

StatusOr<AttentionBatch> MakeAttentionBatch(std::vector<AttentionSeq> seqs, int64_t num_tokens,
                                            int64_t block_size, int64_t num_blocks,
                                            Backend& backend) {
  TESSERA_ASSIGN_OR_RETURN(
      AttentionBatch b, CheckAttentionBatch(std::move(seqs), num_tokens, block_size, num_blocks));
  if (backend.device() != Device::kCPU) {
    std::vector<int32_t> meta = PackAttentionMeta(b, block_size);
    Tensor host = Tensor::Wrap(meta.data(), {static_cast<int64_t>(meta.size())}, DType::kI32,
                               Device::kCPU, nullptr);
    TESSERA_ASSIGN_OR_RETURN(b.device_meta, backend.Upload(host));
  }
  return b;
}

Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v, const AttentionBatch& batch) {
  return TESSERA_DISPATCH(k.device(), WriteKv, cache, k, v, batch);
}

Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window) {
  if (sliding_window < 0)
    return InvalidArgument("attention: sliding window " + std::to_string(sliding_window) +
                           " is negative");
  return TESSERA_DISPATCH(q.device(), PagedAttention, q, cache, batch, scale, out, sliding_window);
}

namespace cpu {

namespace {

Status CheckCache(const KvCacheLayer& cache, int64_t kv_heads, int64_t head_dim) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(cache.k, 4, DType::kF32, "kv cache K"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(cache.v, 4, DType::kF32, "kv cache V"));
  if (cache.k.shape() != cache.v.shape() || cache.k.dim(2) != kv_heads ||
      cache.k.dim(3) != head_dim)
    return InvalidArgument("kv cache " + cache.k.Describe() + " does not hold " +
                           std::to_string(kv_heads) + " kv heads of dim " +
                           std::to_string(head_dim));
  return Status::Ok();
}

// Offset in floats of (position p) in the cache for a sequence, or an error.
StatusOr<int64_t> SlotOffset(const KvCacheLayer& cache, const AttentionSeq& s, int64_t p) {
  const int64_t block_size = cache.k.dim(1);
  const int64_t idx = p / block_size;
  if (idx >= static_cast<int64_t>(s.block_table.size()))
    return OutOfRange("kv cache: position " + std::to_string(p) + " needs block index " +
                      std::to_string(idx) + " but the block table has " +
                      std::to_string(s.block_table.size()) + " blocks");
  const int64_t block = s.block_table[static_cast<size_t>(idx)];
  if (block < 0 || block >= cache.k.dim(0))
    return OutOfRange("kv cache: block id " + std::to_string(block) + " outside [0, " +
                      std::to_string(cache.k.dim(0)) + ")");
  const int64_t row = cache.k.dim(2) * cache.k.dim(3);
  return (block * block_size + p % block_size) * row;
}

}  // namespace

Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v, const AttentionBatch& batch) {
  const std::vector<AttentionSeq>& seqs = batch.seqs;
  TESSERA_RETURN_IF_ERROR(ExpectTensor(k, 3, DType::kF32, "kv write K"));
  if (v.shape() != k.shape())
    return InvalidArgument("kv write: K " + k.Describe() + " vs V " + v.Describe());
  TESSERA_RETURN_IF_ERROR(CheckCache(cache, k.dim(1), k.dim(2)));
  const int64_t row = k.dim(1) * k.dim(2);
  for (const AttentionSeq& s : seqs) {
    for (int64_t i = 0; i < s.num_tokens; ++i) {
      TESSERA_ASSIGN_OR_RETURN(int64_t off, SlotOffset(cache, s, s.start_pos + i));
      const int64_t t = s.token_begin + i;
      std::memcpy(cache.k.data<float>() + off, k.data<float>() + t * row, sizeof(float) * row);
      std::memcpy(cache.v.data<float>() + off, v.data<float>() + t * row, sizeof(float) * row);
    }
  }
  return Status::Ok();
}

Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window) {
  const std::vector<AttentionSeq>& seqs = batch.seqs;
  TESSERA_RETURN_IF_ERROR(ExpectTensor(q, 3, DType::kF32, "attention query"));
  const int64_t heads = q.dim(1), head_dim = q.dim(2);
  const int64_t kv_heads = cache.k.rank() == 4 ? cache.k.dim(2) : 0;
  TESSERA_RETURN_IF_ERROR(CheckCache(cache, kv_heads, head_dim));
  if (kv_heads == 0 || heads % kv_heads != 0)
    return InvalidArgument("attention: " + std::to_string(heads) + " query heads over " +
                           std::to_string(kv_heads) + " kv heads");
  if (out.rank() != 2 || out.dim(0) != q.dim(0) || out.dim(1) != heads * head_dim)
    return InvalidArgument("attention: out " + out.Describe() + " for q " + q.Describe());
  const int64_t group = heads / kv_heads;
  std::vector<float> scores;
  std::vector<int64_t> offsets;
  for (const AttentionSeq& s : seqs) {
    const int64_t ctx = s.start_pos + s.num_tokens;
    // Positions no token of the step sees (before the first token's window)
    // are skipped; their blocks may already be reused.
    const int64_t first_seen =
        sliding_window > 0 ? std::max<int64_t>(0, s.start_pos - sliding_window + 1) : 0;
    offsets.resize(static_cast<size_t>(ctx));
    for (int64_t p = first_seen; p < ctx; ++p) {
      TESSERA_ASSIGN_OR_RETURN(offsets[static_cast<size_t>(p)], SlotOffset(cache, s, p));
    }
    scores.resize(static_cast<size_t>(ctx));
    for (int64_t i = 0; i < s.num_tokens; ++i) {
      const int64_t t = s.token_begin + i;
      const int64_t pos = s.start_pos + i;
      const int64_t visible = pos + 1;  // causal: positions 0..pos
      // Sliding window: positions (pos - W, pos].
      const int64_t lo = sliding_window > 0 ? std::max<int64_t>(0, pos - sliding_window + 1) : 0;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = h / group;
        const float* qv = q.data<float>() + (t * heads + h) * head_dim;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t p = lo; p < visible; ++p) {
          const float* kv = cache.k.data<float>() + offsets[static_cast<size_t>(p)] + g * head_dim;
          float dot = 0.0f;
          for (int64_t d = 0; d < head_dim; ++d) dot += qv[d] * kv[d];
          scores[static_cast<size_t>(p)] = dot * scale;
          max_score = std::max(max_score, scores[static_cast<size_t>(p)]);
        }
        float denom = 0.0f;
        for (int64_t p = lo; p < visible; ++p) {
          float& sc = scores[static_cast<size_t>(p)];
          sc = std::exp(sc - max_score);
          denom += sc;
        }
        float* o = out.data<float>() + t * heads * head_dim + h * head_dim;
        std::fill(o, o + head_dim, 0.0f);
        for (int64_t p = lo; p < visible; ++p) {
          const float w = scores[static_cast<size_t>(p)] / denom;
          const float* vv = cache.v.data<float>() + offsets[static_cast<size_t>(p)] + g * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) o[d] += w * vv[d];
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
