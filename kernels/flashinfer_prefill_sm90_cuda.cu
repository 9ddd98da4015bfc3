// FlashInfer's Hopper causal prefill (kernels/flashinfer_launch.h, LaunchFlashInferPrefillSm90),
// over the paged KV cache or the step's own K/V rows (ragged): the FlashAttention-3 kernels of
// flashinfer-python 0.7.4's attention/hopper/prefill_sm90.cuh, at head_dim 128 for BF16 and
// F16, with the persistent tile scheduler fed by Tessera's plan (kernels/prefill_work_plan.h,
// planned by the caller). Compiled for sm_90a only (wgmma and register reallocation): CMake
// builds this file alone in tessera_kernels_sm90.
#include <cuda_runtime.h>

#include <cstdint>
#include <exception>
#include <flashinfer/attention/hopper/default_params.cuh>
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>

#include "kernels/flashinfer_launch.h"

namespace tessera::kernels::cuda {

namespace {

namespace fi = ::flashinfer;

// The fields both kinds of params share (FlashInfer's hopper/default_params.cuh).
template <typename T, typename Params>
void FillCommon(const FlashInferPrefillSm90Args& a, int64_t kv_row, Params& p) {
  constexpr int64_t kHeadDim = 128;
  p.q_ptr = static_cast<T*>(const_cast<void*>(a.q));
  p.o_ptr = static_cast<T*>(a.out);
  p.lse_ptr = nullptr;
  p.work_indptr = const_cast<int32_t*>(a.work_indptr);
  p.qo_tile_indices = const_cast<int32_t*>(a.qo_tile);
  p.qo_indptr = const_cast<int32_t*>(a.qo_indptr);
  p.kv_indptr = const_cast<int32_t*>(a.kv_indptr);
  p.qo_lens = const_cast<int32_t*>(a.qo_len);
  p.kv_lens = const_cast<int32_t*>(a.kv_len);
  p.head_indices = const_cast<int32_t*>(a.head);
  p.batch_indices = const_cast<int32_t*>(a.batch);
  p.additional_params.logits_soft_cap = 0.0f;
  p.additional_params.sm_scale = a.scale;
  p.additional_params.maybe_prefix_len_ptr = nullptr;
  p.additional_params.maybe_token_pos_in_items_ptr = nullptr;
  p.additional_params.token_pos_in_items_len = 0;
  p.additional_params.maybe_max_item_len_ptr = nullptr;
  // q [tokens, heads, head_dim] and out [tokens, heads * head_dim], contiguous; K/V rows of
  // kv_heads * head_dim (a cache page [block_size, kv_heads, head_dim], NHD, or the step's rows).
  p.q_stride_n = p.o_stride_n = static_cast<int64_t>(a.heads) * kHeadDim;
  p.q_stride_h = p.o_stride_h = kHeadDim;
  p.k_stride_n = p.v_stride_n = kv_row;
  p.k_stride_h = p.v_stride_h = kHeadDim;
  p.nnz_qo = a.num_tokens;
  p.num_qo_heads = a.heads;
  p.num_kv_heads = a.kv.kv_heads;
  p.group_size = a.heads / a.kv.kv_heads;
  p.window_left = -1;
  p.causal = true;
}

template <typename T>
cudaError_t PrefillSm90(const FlashInferPrefillSm90Args& a, cudaStream_t stream) {
  constexpr uint32_t kHeadDim = 128;
  const int64_t kv_row = static_cast<int64_t>(a.kv.kv_heads) * kHeadDim;
  if (a.step_k != nullptr) {
    fi::BatchPrefillRaggedParams<T, T, T, int32_t> p{};
    FillCommon<T>(a, kv_row, p);
    p.k_ptr = static_cast<T*>(const_cast<void*>(a.step_k));
    p.v_ptr = static_cast<T*>(const_cast<void*>(a.step_v));
    p.nnz_kv = a.num_tokens;
    return fi::BatchPrefillWithRaggedKVCacheDispatched<
        kHeadDim, kHeadDim, fi::MaskMode::kCausal, /*LEFT_SLIDING_WINDOW=*/false,
        /*SAME_SCHEDULE_FOR_ALL_HEADS=*/false, fi::StandardAttention>(p, /*enable_pdl=*/false,
                                                                      stream);
  }
  fi::BatchPrefillPagedParams<T, T, T, int32_t> p{};
  FillCommon<T>(a, kv_row, p);
  p.k_ptr = static_cast<T*>(a.kv.k_cache);
  p.v_ptr = static_cast<T*>(a.kv.v_cache);
  p.kv_indices = const_cast<int32_t*>(a.kv.indices);
  p.k_page_stride = p.v_page_stride = static_cast<int64_t>(a.kv.block_size) * kv_row;
  p.page_size = a.kv.block_size;
  return fi::BatchPrefillWithPagedKVCacheDispatched<
      kHeadDim, kHeadDim, fi::MaskMode::kCausal, /*LEFT_SLIDING_WINDOW=*/false,
      /*SAME_SCHEDULE_FOR_ALL_HEADS=*/false, fi::StandardAttention>(p, /*enable_pdl=*/false,
                                                                    stream);
}

}  // namespace

cudaError_t LaunchFlashInferPrefillSm90(DType dtype, const FlashInferPrefillSm90Args& args,
                                        cudaStream_t stream, std::string* error) {
  if (args.works == 0) return cudaSuccess;
  if (args.head_dim != 128 || args.kv.kv_heads <= 0 || args.heads % args.kv.kv_heads != 0)
    return cudaErrorInvalidValue;
  // The kernel's grid is one CTA per SM of the current device: the plan must be for as many.
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  if (sms != args.ctas) return cudaErrorInvalidValue;
  try {
    if (dtype == DType::kBF16) return PrefillSm90<cutlass::bfloat16_t>(args, stream);
    if (dtype == DType::kF16) return PrefillSm90<cutlass::half_t>(args, stream);
    return cudaErrorInvalidValue;
  } catch (const std::exception& ex) {
    if (error) *error = ex.what();
    return cudaErrorNotSupported;
  }
}

}  // namespace tessera::kernels::cuda
