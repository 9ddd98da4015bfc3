// FlashInfer's batch decode over the paged KV cache (kernels/flashinfer_launch.h), instantiated
// for BF16 and F16 at head_dim 64 and 128. FlashInfer's dispatcher instantiates its own GQA
// groups (1, 2, 3, 4, 6, 8, 16) for each. The work split is planned on the host
// (kernels/attention_meta.h), not by FlashInfer's DecodePlan, so no workspace round trip is
// needed and a decode graph replays with fresh plans in its fixed input buffer. The decode and
// merge kernels launch with PDL where Tessera's kernels do (kernels/pdl.cuh): both wait on
// griddepcontrol before reading q, and read only the host-planned work lists before that.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <exception>
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/variants.cuh>

#include "kernels/cuda_launch.h"
#include "kernels/flashinfer_launch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

namespace fi = ::flashinfer;
using Variant = fi::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                     /*logits_soft_cap=*/false, /*alibi=*/false>;

template <typename T, uint32_t kHeadDim>
cudaError_t Decode(const FlashInferDecodeArgs& a, cudaStream_t stream) {
  using Params = fi::BatchDecodeParams<T, T, T, int32_t>;
  fi::paged_kv_t<T, int32_t> kv(
      static_cast<uint32_t>(a.kv.kv_heads), static_cast<uint32_t>(a.kv.block_size), kHeadDim,
      static_cast<uint32_t>(a.kv.num_seqs), fi::QKVLayout::kNHD, static_cast<T*>(a.kv.k_cache),
      static_cast<T*>(a.kv.v_cache), const_cast<int32_t*>(a.kv.indices),
      const_cast<int32_t*>(a.kv.indptr), const_cast<int32_t*>(a.kv.last_page_len));
  Params p(const_cast<T*>(static_cast<const T*>(a.q)), /*q_rope_offset=*/nullptr, kv,
           static_cast<T*>(a.out), /*lse=*/nullptr, /*maybe_alibi_slopes=*/nullptr,
           static_cast<uint32_t>(a.heads), /*q_stride_n=*/a.heads * a.head_dim,
           /*q_stride_h=*/a.head_dim, /*window_left=*/-1, /*logits_soft_cap=*/0.0f, a.scale,
           /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
  const bool split = a.work_items > a.kv.num_seqs;
  p.request_indices = const_cast<int32_t*>(a.request);
  p.kv_tile_indices = const_cast<int32_t*>(a.kv_tile);
  p.o_indptr = const_cast<int32_t*>(a.o_indptr);
  p.kv_chunk_size_ptr = const_cast<int32_t*>(a.chunk);
  p.block_valid_mask = split ? reinterpret_cast<bool*>(const_cast<uint8_t*>(a.valid)) : nullptr;
  p.padded_batch_size = static_cast<uint32_t>(a.work_items);
  return fi::BatchDecodeWithPagedKVCacheDispatched<kHeadDim, fi::PosEncodingMode::kNone, Variant>(
      p, split ? static_cast<T*>(a.tmp_v) : nullptr, split ? a.tmp_s : nullptr,
      /*enable_pdl=*/a.kv.num_seqs <= kPdlMaxTokens && PdlEnabled(), stream);
}

template <typename T>
cudaError_t DecodeHeadDim(const FlashInferDecodeArgs& a, cudaStream_t stream) {
  if (a.head_dim == 64) return Decode<T, 64>(a, stream);
  if (a.head_dim == 128) return Decode<T, 128>(a, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchFlashInferDecode(DType dtype, const FlashInferDecodeArgs& args,
                                   cudaStream_t stream, std::string* error) {
  if (args.kv.num_seqs == 0) return cudaSuccess;
  try {
    if (dtype == DType::kBF16) return DecodeHeadDim<__nv_bfloat16>(args, stream);
    if (dtype == DType::kF16) return DecodeHeadDim<__half>(args, stream);
    return cudaErrorInvalidValue;
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    return cudaErrorNotSupported;
  }
}

}  // namespace tessera::kernels::cuda
