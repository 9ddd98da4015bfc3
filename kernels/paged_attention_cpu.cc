#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "common/base/logging.h"
#include "kernels/dispatch.h"
#include "kernels/kv_quant.h"
#include "kernels/paged_attention.h"

namespace tessera::kernels {

StatusOr<AttentionKernels> ParseAttentionKernels(const std::string& name, const char* what) {
  if (name == "flashinfer") return AttentionKernels::kFlashInfer;
  if (name == "tessera") return AttentionKernels::kTessera;
  return InvalidArgument(std::string(what) + ": attention kernels \"" + name +
                         "\" (expected \"flashinfer\" or \"tessera\")");
}

const char* AttentionKernelsName(AttentionKernels kernels) {
  return kernels == AttentionKernels::kFlashInfer ? "flashinfer" : "tessera";
}

bool FlashInferBuilt() {
#ifdef TESSERA_WITH_FLASHINFER
  return true;
#else
  return false;
#endif
}

bool FlashInferTakes(DType dtype, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) return false;
  if (head_dim != 64 && head_dim != 128) return false;
  if (kv_heads <= 0 || heads % kv_heads != 0) return false;
  const int64_t group = heads / kv_heads;
  return group == 1 || group == 2 || group == 3 || group == 4 || group == 6 || group == 8 ||
         group == 16;
}

StatusOr<AttentionKernels> DefaultAttentionKernels() {
  // Read once: the environment does not change under a running worker.
  static const StatusOr<AttentionKernels> chosen = []() -> StatusOr<AttentionKernels> {
    const char* env = std::getenv("TESSERA_ATTENTION");
    if (env == nullptr || *env == '\0')
      return FlashInferBuilt() ? AttentionKernels::kFlashInfer : AttentionKernels::kTessera;
    TESSERA_ASSIGN_OR_RETURN(AttentionKernels k, ParseAttentionKernels(env, "TESSERA_ATTENTION"));
    if (k == AttentionKernels::kFlashInfer && !FlashInferBuilt())
      return FailedPrecondition(
          "TESSERA_ATTENTION=flashinfer, but this build has no FlashInfer "
          "(TESSERA_FLASHINFER=OFF)");
    TESSERA_LOG_INFO("kernels", "TESSERA_ATTENTION={}: CUDA attention uses {} kernels", env,
                     AttentionKernelsName(k));
    return k;
  }();
  return chosen;
}

Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v, const AttentionBatch& batch) {
  return TESSERA_DISPATCH(k.device(), WriteKv, cache, k, v, batch);
}

Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window, float softcap,
                      StepKv step_kv) {
  if (sliding_window < 0)
    return InvalidArgument("attention: sliding window " + std::to_string(sliding_window) +
                           " is negative");
  if (!(softcap >= 0.0f) || !std::isfinite(softcap))
    return InvalidArgument("attention: soft-cap " + std::to_string(softcap) +
                           " is not a finite number >= 0");
  return TESSERA_DISPATCH(q.device(), PagedAttention, q, cache, batch, scale, out, sliding_window,
                          softcap, step_kv);
}

namespace cpu {

namespace {

bool IsFp8(const KvCacheLayer& cache) { return cache.k.dtype() == DType::kF8E4M3; }

Status CheckKvScales(const KvCacheLayer& cache) {
  TESSERA_RETURN_IF_ERROR(CheckKvScale(cache.k_scale, "kv cache K"));
  return CheckKvScale(cache.v_scale, "kv cache V");
}

Status CheckCache(const KvCacheLayer& cache, int64_t kv_heads, int64_t head_dim) {
  // F32 (the compute dtype) or the fp8 KV cache's e4m3 bytes.
  const DType dtype = IsFp8(cache) ? DType::kF8E4M3 : DType::kF32;
  TESSERA_RETURN_IF_ERROR(ExpectTensor(cache.k, 4, dtype, "kv cache K"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(cache.v, 4, dtype, "kv cache V"));
  if (dtype == DType::kF8E4M3) TESSERA_RETURN_IF_ERROR(CheckKvScales(cache));
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
      if (IsFp8(cache)) {
        QuantizeKvRow(k.data<float>() + t * row, cache.k_scale, row, cache.k.data<uint8_t>() + off);
        QuantizeKvRow(v.data<float>() + t * row, cache.v_scale, row, cache.v.data<uint8_t>() + off);
        continue;
      }
      std::memcpy(cache.k.data<float>() + off, k.data<float>() + t * row, sizeof(float) * row);
      std::memcpy(cache.v.data<float>() + off, v.data<float>() + t * row, sizeof(float) * row);
    }
  }
  return Status::Ok();
}

Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window, float softcap,
                      StepKv /*step_kv: the CPU reads the cache*/) {
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
  const int64_t row = kv_heads * head_dim;
  const bool fp8 = IsFp8(cache);
  std::vector<float> scores, k_rows, v_rows;
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
    const float* k_base = fp8 ? nullptr : cache.k.data<float>();
    const float* v_base = fp8 ? nullptr : cache.v.data<float>();
    if (fp8) {
      // The fp8 cache is dequantized once per sequence into fp32 rows
      // (position p at p * row), so the loops below are those of an F32 cache.
      k_rows.resize(static_cast<size_t>(ctx * row));
      v_rows.resize(static_cast<size_t>(ctx * row));
      for (int64_t p = first_seen; p < ctx; ++p) {
        const int64_t off = offsets[static_cast<size_t>(p)];
        DequantizeKvRow(cache.k.data<uint8_t>() + off, cache.k_scale, row, &k_rows[p * row]);
        DequantizeKvRow(cache.v.data<uint8_t>() + off, cache.v_scale, row, &v_rows[p * row]);
        offsets[static_cast<size_t>(p)] = p * row;
      }
      k_base = k_rows.data();
      v_base = v_rows.data();
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
          const float* kv = k_base + offsets[static_cast<size_t>(p)] + g * head_dim;
          float dot = 0.0f;
          for (int64_t d = 0; d < head_dim; ++d) dot += qv[d] * kv[d];
          float s = dot * scale;
          if (softcap > 0.0f) s = std::tanh(s / softcap) * softcap;  // as transformers: /, tanh, *
          scores[static_cast<size_t>(p)] = s;
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
          const float* vv = v_base + offsets[static_cast<size_t>(p)] + g * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) o[d] += w * vv[d];
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
