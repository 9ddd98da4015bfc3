// FlashInfer's causal batch prefill over the paged KV cache (kernels/flashinfer_launch.h): the
// FA2 kernel on tensor cores (mma.sync, sm80 and later), instantiated for BF16 and F16 at
// head_dim 64 and 128 with query tiles of 16 and 128 packed rows. FlashInfer picks the key tile
// (NUM_MMA_KV) at run time from the device's shared memory. No split of the context: each work
// item (a query tile of one sequence) walks its whole causal range.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <exception>
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>

#include "kernels/flashinfer_launch.h"

namespace tessera::kernels::cuda {

namespace {

namespace fi = ::flashinfer;
using Variant = fi::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                     /*logits_soft_cap=*/false, /*alibi=*/false>;

template <typename T, uint32_t kHeadDim, uint32_t kTileQ>
cudaError_t Prefill(const FlashInferPrefillArgs& a, cudaStream_t stream) {
  using Params = fi::BatchPrefillPagedParams<T, T, T, int32_t>;
  fi::paged_kv_t<T, int32_t> kv(
      static_cast<uint32_t>(a.kv.kv_heads), static_cast<uint32_t>(a.kv.block_size), kHeadDim,
      static_cast<uint32_t>(a.kv.num_seqs), fi::QKVLayout::kNHD, static_cast<T*>(a.kv.k_cache),
      static_cast<T*>(a.kv.v_cache), const_cast<int32_t*>(a.kv.indices),
      const_cast<int32_t*>(a.kv.indptr), const_cast<int32_t*>(a.kv.last_page_len));
  int32_t* q_indptr = const_cast<int32_t*>(a.q_indptr);
  Params p(const_cast<T*>(static_cast<const T*>(a.q)), kv, /*maybe_custom_mask=*/nullptr, q_indptr,
           /*maybe_mask_indptr=*/nullptr, /*maybe_q_rope_offset=*/nullptr, static_cast<T*>(a.out),
           /*lse=*/nullptr, /*maybe_alibi_slopes=*/nullptr, static_cast<uint32_t>(a.heads),
           /*q_stride_n=*/a.heads * a.head_dim,
           /*q_stride_h=*/a.head_dim, /*window_left=*/-1, /*logits_soft_cap=*/0.0f, a.scale,
           /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
  p.request_indices = const_cast<int32_t*>(a.request);
  p.qo_tile_indices = const_cast<int32_t*>(a.qo_tile);
  p.kv_tile_indices = const_cast<int32_t*>(a.kv_tile);
  p.o_indptr = q_indptr;  // unsplit: output rows are the query rows
  p.kv_chunk_size_ptr = const_cast<int32_t*>(a.chunk);
  p.padded_batch_size = static_cast<uint32_t>(a.work_items);
  return fi::BatchPrefillWithPagedKVCacheDispatched<
      /*SAME_KV_STRIDES=*/true, kTileQ, kHeadDim, kHeadDim, fi::PosEncodingMode::kNone,
      /*USE_FP16_QK_REDUCTION=*/false, fi::MaskMode::kCausal, /*USE_TOKEN_HEAD_SF=*/false, Variant>(
      p, /*tmp_v=*/nullptr, /*tmp_s=*/nullptr, /*enable_pdl=*/false, stream);
}

template <typename T, uint32_t kHeadDim>
cudaError_t PrefillTile(const FlashInferPrefillArgs& a, cudaStream_t stream) {
  if (a.cta_tile_q == 128) return Prefill<T, kHeadDim, 128>(a, stream);
  if (a.cta_tile_q == 16) return Prefill<T, kHeadDim, 16>(a, stream);
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t PrefillHeadDim(const FlashInferPrefillArgs& a, cudaStream_t stream) {
  if (a.head_dim == 64) return PrefillTile<T, 64>(a, stream);
  if (a.head_dim == 128) return PrefillTile<T, 128>(a, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchFlashInferPrefill(DType dtype, const FlashInferPrefillArgs& args,
                                    cudaStream_t stream, std::string* error) {
  if (args.work_items == 0) return cudaSuccess;
  try {
    if (dtype == DType::kBF16) return PrefillHeadDim<__nv_bfloat16>(args, stream);
    if (dtype == DType::kF16) return PrefillHeadDim<__half>(args, stream);
    return cudaErrorInvalidValue;
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    return cudaErrorNotSupported;
  }
}

}  // namespace tessera::kernels::cuda
