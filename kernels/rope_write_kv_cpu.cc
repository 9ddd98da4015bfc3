// NormRopeWriteKv (kernels/rope_write_kv.h): the checks every backend shares, the dispatch, and
// the CPU's form, which is the separate calls in sequence.
#include <string>

#include "kernels/dispatch.h"
#include "kernels/head_rms_norm.h"
#include "kernels/rope.h"
#include "kernels/rope_write_kv.h"

namespace tessera::kernels {

namespace {

Status CheckNormWeight(const Tensor& w, const Tensor& q, const char* what) {
  if (!w.defined()) return Status::Ok();
  if (w.rank() != 1 || w.dim(0) != q.dim(2) || w.dtype() != q.dtype() || w.device() != q.device())
    return InvalidArgument(std::string("norm+rope+kv write: ") + what + " " + w.Describe() +
                           " for q " + q.Describe() + ": it must be [head_dim] in q's dtype");
  return Status::Ok();
}

// Shapes, dtypes and devices of every argument, before any backend writes anything.
Status CheckArguments(const Tensor& q, const Tensor& k, const Tensor& v, const QkNorms& norms,
                      const Tensor& positions, const Tensor& inv_freq, const KvCacheLayer& cache) {
  const std::string of = " (q " + q.Describe() + ")";
  if (q.rank() != 3 || k.rank() != 3 || k.dtype() != q.dtype() || k.device() != q.device() ||
      k.dim(0) != q.dim(0) || k.dim(2) != q.dim(2) || v.shape() != k.shape() ||
      v.dtype() != k.dtype() || v.device() != k.device())
    return InvalidArgument("norm+rope+kv write: k " + k.Describe() + " and v " + v.Describe() +
                           " must be [tokens, kv_heads, head_dim] beside q " + q.Describe());
  TESSERA_RETURN_IF_ERROR(CheckNormWeight(norms.q_weight, q, "q norm weight"));
  TESSERA_RETURN_IF_ERROR(CheckNormWeight(norms.k_weight, q, "k norm weight"));
  if (positions.rank() != 1 || positions.dim(0) != q.dim(0) || positions.dtype() != DType::kI32 ||
      positions.device() != q.device())
    return InvalidArgument("norm+rope+kv write: positions " + positions.Describe() +
                           " must be [tokens] I32 on q's device" + of);
  if (inv_freq.rank() != 1 || inv_freq.dim(0) != q.dim(2) / 2 || q.dim(2) % 2 != 0 ||
      inv_freq.dtype() != DType::kF32 || inv_freq.device() != q.device())
    return InvalidArgument("norm+rope+kv write: inv_freq " + inv_freq.Describe() +
                           " must be [head_dim / 2] F32 on q's device" + of);
  const bool cache_dtype_ok = cache.k.dtype() == q.dtype() || cache.k.dtype() == DType::kF8E4M3;
  if (cache.k.rank() != 4 || cache.v.shape() != cache.k.shape() ||
      cache.v.dtype() != cache.k.dtype() || !cache_dtype_ok || cache.k.dim(2) != k.dim(1) ||
      cache.k.dim(3) != k.dim(2) || cache.k.device() != q.device() ||
      cache.v.device() != q.device())
    return InvalidArgument("norm+rope+kv write: kv cache " + cache.k.Describe() + " / " +
                           cache.v.Describe() + " does not hold k " + k.Describe() +
                           " (it must be [blocks, block_size, kv_heads, head_dim] in k's dtype "
                           "or F8E4M3, on k's device)");
  return Status::Ok();
}

}  // namespace

Status NormRopeWriteKv(Tensor& q, Tensor& k, const Tensor& v, const QkNorms& norms,
                       const Tensor& positions, const Tensor& inv_freq, KvCacheLayer& cache,
                       const AttentionBatch& batch) {
  TESSERA_RETURN_IF_ERROR(CheckArguments(q, k, v, norms, positions, inv_freq, cache));
  return TESSERA_DISPATCH(q.device(), NormRopeWriteKv, q, k, v, norms, positions, inv_freq, cache,
                          batch);
}

Status NormRopeWriteKvSeparately(Tensor& q, Tensor& k, const Tensor& v, const QkNorms& norms,
                                 const Tensor& positions, const Tensor& inv_freq,
                                 KvCacheLayer& cache, const AttentionBatch& batch) {
  if (norms.q_weight.defined())
    TESSERA_RETURN_IF_ERROR(HeadRmsNorm(q, norms.q_weight, norms.eps, norms.weight_offset));
  if (norms.k_weight.defined())
    TESSERA_RETURN_IF_ERROR(HeadRmsNorm(k, norms.k_weight, norms.eps, norms.weight_offset));
  TESSERA_RETURN_IF_ERROR(ApplyRopeQk(q, k, positions, inv_freq));
  return kernels::WriteKv(cache, k, v, batch);
}

namespace cpu {

Status NormRopeWriteKv(Tensor& q, Tensor& k, const Tensor& v, const QkNorms& norms,
                       const Tensor& positions, const Tensor& inv_freq, KvCacheLayer& cache,
                       const AttentionBatch& batch) {
  return NormRopeWriteKvSeparately(q, k, v, norms, positions, inv_freq, cache, batch);
}

}  // namespace cpu

}  // namespace tessera::kernels
