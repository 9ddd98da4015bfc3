// Tensor-level CUDA KV writes and attention: checks, the choice of kernels
// (FlashInfer's, kernels/flashinfer_launch.h, or Tessera's decode split-K and
// flash-style prefill, kernels/paged_attention_cuda.cu) and their launch.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "common/base/env_switch.h"
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/kv_quant.h"
#include "kernels/paged_attention.h"
#include "kernels/rope_write_kv.h"
#ifdef TESSERA_WITH_FLASHINFER
#include "kernels/flashinfer_launch.h"
#endif
#ifdef TESSERA_WITH_FLASHINFER_SM90
#include "kernels/prefill_work_plan.h"
#endif

namespace tessera::kernels::cuda {

namespace {

// Sequences with at most this many query tokens in the step use the decode
// kernel (each query token reads its own K/V prefix); larger ones the tiled
// prefill kernel.
constexpr int64_t kDecodeMaxTokens = 8;

// The packed layout's regions (PackAttentionMeta packs at least one work item per sequence).
AttentionMetaLayout LayoutOf(const AttentionBatch& b) {
  const int64_t S = static_cast<int64_t>(b.seqs.size());
  return MetaLayoutFor(b.num_tokens, S, std::max(b.decode_work_items, S));
}

StatusOr<AttentionMetaDev> DeviceMeta(const AttentionBatch& b) {
  if (!b.device_meta.defined() || b.device_meta.device() != Device::kCUDA)
    return FailedPrecondition("attention: the AttentionBatch was not built for a CUDA backend");
  const int64_t T = b.num_tokens, S = static_cast<int64_t>(b.seqs.size());
  const AttentionMetaLayout L = LayoutOf(b);
  const int32_t* m = b.device_meta.data<int32_t>();
  AttentionMetaDev d;
  d.token_seq = m + L.token_seq;
  d.token_pos = m + L.token_pos;
  d.seq_info = m + L.seq_info;
  d.tables = m + L.tables;
  d.num_tokens = static_cast<int32_t>(T);
  d.num_seqs = static_cast<int32_t>(S);
  d.max_seq_tokens = static_cast<int32_t>(b.max_seq_tokens);
  d.max_context = static_cast<int32_t>(b.max_context);
  return d;
}

bool IsFp8(const KvCacheLayer& cache) { return cache.k.dtype() == DType::kF8E4M3; }

// The cache holds `dtype` (the compute dtype), or e4m3 (the fp8 KV cache,
// kernels/kv_quant.h) for BF16/F16 compute with valid scales.
Status CheckCache(const KvCacheLayer& cache, int64_t kv_heads, int64_t head_dim, DType dtype) {
  const bool fp8 = IsFp8(cache);
  if (fp8) {
    if (dtype != DType::kBF16 && dtype != DType::kF16)
      return Unimplemented("kv cache: the fp8 KV cache on CUDA needs BF16 or F16 compute, not " +
                           std::string(DTypeName(dtype)));
    TESSERA_RETURN_IF_ERROR(CheckKvScale(cache.k_scale, "kv cache K"));
    TESSERA_RETURN_IF_ERROR(CheckKvScale(cache.v_scale, "kv cache V"));
    if (cache.k.device() != Device::kCUDA || cache.v.device() != Device::kCUDA ||
        cache.k.rank() != 4)
      return InvalidArgument("kv cache " + cache.k.Describe() + " is not a 4-D CUDA tensor");
  } else {
    TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(cache.k, 4, Device::kCUDA, "kv cache K"));
    TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(cache.v, 4, Device::kCUDA, "kv cache V"));
  }
  const DType stored = fp8 ? DType::kF8E4M3 : dtype;
  if (cache.k.shape() != cache.v.shape() || cache.k.dtype() != stored ||
      cache.v.dtype() != stored || cache.k.dim(2) != kv_heads || cache.k.dim(3) != head_dim)
    return InvalidArgument("kv cache " + cache.k.Describe() + " does not hold " +
                           std::to_string(kv_heads) + " kv heads of dim " +
                           std::to_string(head_dim) + " in " + DTypeName(stored));
  return Status::Ok();
}

AttentionShape ShapeOf(const KvCacheLayer& cache, int64_t heads, int64_t kv_heads,
                       int64_t head_dim) {
  AttentionShape shape;
  shape.heads = static_cast<int32_t>(heads);
  shape.kv_heads = static_cast<int32_t>(kv_heads);
  shape.head_dim = static_cast<int32_t>(head_dim);
  shape.block_size = static_cast<int32_t>(cache.k.dim(1));
  shape.k_scale = cache.k_scale;
  shape.v_scale = cache.v_scale;
  return shape;
}

#ifdef TESSERA_WITH_FLASHINFER
// The step's paged cache as FlashInfer reads it: the cache tensors in place, the page arrays
// from the packed layout.
FlashInferPagedKv PagedKvOf(const KvCacheLayer& cache, const AttentionBatch& b) {
  const int64_t S = static_cast<int64_t>(b.seqs.size());
  const AttentionMetaLayout L = LayoutOf(b);
  const int32_t* m = b.device_meta.data<int32_t>();
  FlashInferPagedKv kv;
  kv.k_cache = const_cast<void*>(cache.k.raw());
  kv.v_cache = const_cast<void*>(cache.v.raw());
  kv.indices = m + L.tables;
  kv.indptr = m + L.kv_indptr;
  kv.last_page_len = m + L.kv_last_page_len;
  kv.num_seqs = static_cast<int32_t>(S);
  kv.kv_heads = static_cast<int32_t>(cache.k.dim(2));
  kv.block_size = static_cast<int32_t>(cache.k.dim(1));
  return kv;
}

Status FlashInferStatus(cudaError_t e, const std::string& error, const char* call) {
  if (e == cudaSuccess) return Status::Ok();
  if (!error.empty()) return Unimplemented(std::string(call) + ": " + error);
  return CudaError(e, call, __FILE__, __LINE__);
}

// Decode: one query row per sequence; the work split is the batch's (PackAttentionMeta).
Status FlashInferDecode(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& b,
                        float scale, Tensor& out, Context& ctx) {
  const int64_t S = static_cast<int64_t>(b.seqs.size());
  const int64_t P = std::max(b.decode_work_items, S), heads = q.dim(1), head_dim = q.dim(2);
  const AttentionMetaLayout L = LayoutOf(b);
  const int32_t* m = b.device_meta.data<int32_t>();
  FlashInferDecodeArgs a;
  a.kv = PagedKvOf(cache, b);
  a.q = q.raw();
  a.out = out.raw();
  a.heads = static_cast<int32_t>(heads);
  a.head_dim = static_cast<int32_t>(head_dim);
  a.scale = scale;
  a.request = m + L.decode_request;
  a.kv_tile = m + L.decode_kv_tile;
  a.o_indptr = m + L.decode_o_indptr;
  a.chunk = m + L.decode_chunk;
  a.valid = reinterpret_cast<const uint8_t*>(m + L.decode_valid);
  a.work_items = static_cast<int32_t>(P);
  Tensor tmp_v, tmp_s;
  if (P > S) {
    TESSERA_ASSIGN_OR_RETURN(tmp_v, ctx.Allocate({P, heads, head_dim}, q.dtype()));
    TESSERA_ASSIGN_OR_RETURN(tmp_s, ctx.Allocate({P, heads}, DType::kF32));
    a.tmp_v = tmp_v.raw();
    a.tmp_s = tmp_s.data<float>();
  }
  std::string error;
  return FlashInferStatus(LaunchFlashInferDecode(q.dtype(), a, ctx.stream(), &error), error,
                          "FlashInfer BatchDecodeWithPagedKVCache");
}

#ifdef TESSERA_WITH_FLASHINFER_SM90
// Sequences with at least this many query rows in a step (one full query tile) take the Hopper
// kernel; shorter ones (decode tokens, short chunks) the FA2 kernel, whose tiles pack a GQA
// group's rows and so read each key once per kv head, not once per query head.
constexpr int64_t kSm90MinTokens = kFlashInferSm90TileQ;

// TESSERA_CUDA_FA3 (read once): "0" keeps prefill on FA2; "paged" uses FA3's paged kernel for
// every sequence (not the ragged one over the step's K/V: the A/B of scripts/gpu-run); anything
// else, or unset, both.
enum class Sm90Mode { kOff, kPagedOnly, kOn };
Sm90Mode Sm90ModeFromEnv() {
  static const Sm90Mode mode = [] {
    const char* v = std::getenv("TESSERA_CUDA_FA3");
    if (v != nullptr && std::strcmp(v, "0") == 0) return Sm90Mode::kOff;
    if (v != nullptr && std::strcmp(v, "paged") == 0) return Sm90Mode::kPagedOnly;
    return Sm90Mode::kOn;
  }();
  return mode;
}

// The Hopper prefill runs on compute capability 9.0 exactly (sm_90a code), at head_dim 128.
bool Sm90PrefillOn(const Context& ctx, DType dtype, int64_t head_dim) {
  return Sm90ModeFromEnv() != Sm90Mode::kOff && ctx.props().major == 9 && ctx.props().minor == 0 &&
         head_dim == 128 && (dtype == DType::kBF16 || dtype == DType::kF16);
}

// Whether `step_kv` holds the step's K/V rows as the ragged FA3 kernel reads them:
// [num_tokens, kv_heads, head_dim] in q's dtype, on the GPU.
bool StepKvUsable(const StepKv& step_kv, const Tensor& q, const KvCacheLayer& cache,
                  const AttentionBatch& b) {
  const std::vector<int64_t> shape = {b.num_tokens, cache.k.dim(2), q.dim(2)};
  for (const Tensor* t : {step_kv.k, step_kv.v}) {
    if (t == nullptr || !t->defined() || t->device() != Device::kCUDA || t->dtype() != q.dtype() ||
        t->shape() != shape)
      return false;
  }
  return true;
}

// One Hopper launch over `seqs`: planned over the device's SMs (kernels/prefill_work_plan.h)
// and uploaded per call; ragged (keys from the step's rows) when step_k is set, else paged.
Status LaunchSm90(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& b, float scale,
                  Tensor& out, Context& ctx, std::span<const PrefillWorkSeq> seqs,
                  const StepKv* ragged) {
  if (seqs.empty()) return Status::Ok();
  const PrefillWorkPlan plan =
      PlanPrefillWork(seqs, q.dim(1), ctx.props().multiProcessorCount, kFlashInferSm90TileQ);
  TESSERA_ASSIGN_OR_RETURN(Tensor dev_plan, ctx.UploadI32(plan.values));
  FlashInferPrefillSm90Args a;
  a.kv = PagedKvOf(cache, b);
  a.q = q.raw();
  a.out = out.raw();
  a.num_tokens = static_cast<int32_t>(b.num_tokens);
  a.heads = static_cast<int32_t>(q.dim(1));
  a.head_dim = static_cast<int32_t>(q.dim(2));
  a.scale = scale;
  if (ragged != nullptr) {
    a.step_k = ragged->k->raw();
    a.step_v = ragged->v->raw();
  }
  const int32_t* d = dev_plan.data<int32_t>();
  a.work_indptr = d;
  a.qo_tile = d + plan.Offset(PrefillWorkPlan::kQoTile);
  a.qo_indptr = d + plan.Offset(PrefillWorkPlan::kQoIndptr);
  a.kv_indptr = d + plan.Offset(PrefillWorkPlan::kKvIndptr);
  a.qo_len = d + plan.Offset(PrefillWorkPlan::kQoLen);
  a.kv_len = d + plan.Offset(PrefillWorkPlan::kKvLen);
  a.head = d + plan.Offset(PrefillWorkPlan::kHead);
  a.batch = d + plan.Offset(PrefillWorkPlan::kBatch);
  a.ctas = static_cast<int32_t>(plan.ctas);
  a.works = static_cast<int32_t>(plan.works);
  std::string error;
  return FlashInferStatus(LaunchFlashInferPrefillSm90(q.dtype(), a, ctx.stream(), &error), error,
                          ragged ? "FlashInfer BatchPrefillWithRaggedKVCache (sm90)"
                                 : "FlashInfer BatchPrefillWithPagedKVCache (sm90)");
}

// The Hopper prefill of the step's sequences with at least kSm90MinTokens rows: fresh prompts
// (start_pos 0) read their keys from the step's rows when `step_kv` holds them (the ragged
// kernel, TMA loads), the others from the cache's pages.
Status FlashInferPrefillSm90(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& b,
                             float scale, Tensor& out, Context& ctx, const StepKv& step_kv) {
  const int64_t block = cache.k.dim(1);
  const bool ragged_ok = Sm90ModeFromEnv() == Sm90Mode::kOn && StepKvUsable(step_kv, q, cache, b);
  std::vector<PrefillWorkSeq> paged, ragged;
  int64_t pages = 0;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const AttentionSeq& s = b.seqs[i];
    const int64_t kv_len = s.start_pos + s.num_tokens;
    if (s.num_tokens >= kSm90MinTokens) {
      const bool fresh = ragged_ok && s.start_pos == 0;
      (fresh ? ragged : paged)
          .push_back({static_cast<int32_t>(s.token_begin), static_cast<int32_t>(s.num_tokens),
                      static_cast<int32_t>(fresh ? s.token_begin : pages),
                      static_cast<int32_t>(kv_len), static_cast<int32_t>(i)});
    }
    pages += (kv_len + block - 1) / block;
  }
  TESSERA_RETURN_IF_ERROR(LaunchSm90(q, cache, b, scale, out, ctx, ragged, &step_kv));
  return LaunchSm90(q, cache, b, scale, out, ctx, paged, nullptr);
}
#endif  // TESSERA_WITH_FLASHINFER_SM90

// Prefill: the work items (query tiles of each sequence) are planned here and uploaded. On
// Hopper, sequences of at least kSm90MinTokens rows go to FlashInfer's FA3 kernel (a second
// launch writing their rows of `out`) and the rest here.
Status FlashInferPrefill(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& b,
                         float scale, Tensor& out, Context& ctx,
                         [[maybe_unused]] const StepKv& step_kv) {
  const int64_t S = static_cast<int64_t>(b.seqs.size());
  const int64_t heads = q.dim(1), head_dim = q.dim(2), group = heads / cache.k.dim(2);
  int64_t min_sm90 = INT64_MAX;  // sequences with this many rows or more: the FA3 kernel
#ifdef TESSERA_WITH_FLASHINFER_SM90
  if (Sm90PrefillOn(ctx, q.dtype(), head_dim)) {
    TESSERA_RETURN_IF_ERROR(FlashInferPrefillSm90(q, cache, b, scale, out, ctx, step_kv));
    min_sm90 = kSm90MinTokens;
  }
#endif
  int64_t fa2_tokens = 0, fa2_seqs = 0;
  for (const AttentionSeq& s : b.seqs) {
    if (s.num_tokens >= min_sm90) continue;
    fa2_tokens += s.num_tokens;
    ++fa2_seqs;
  }
  const int32_t tile = FlashInferPrefillTileQ(fa2_tokens, fa2_seqs, group);
  // [chunk][request: N][qo_tile: N][kv_tile: N]
  std::vector<int32_t> request, qo_tile;
  for (int64_t i = 0; i < S; ++i) {
    if (b.seqs[static_cast<size_t>(i)].num_tokens >= min_sm90) continue;
    const int64_t rows = b.seqs[static_cast<size_t>(i)].num_tokens * group;
    for (int64_t t = 0; t * tile < rows; ++t) {
      request.push_back(static_cast<int32_t>(i));
      qo_tile.push_back(static_cast<int32_t>(t));
    }
  }
  const int64_t N = static_cast<int64_t>(request.size());
  if (N == 0) return Status::Ok();
  std::vector<int32_t> plan(static_cast<size_t>(1 + 3 * N), 0);
  plan[0] = static_cast<int32_t>(b.max_context);
  std::copy(request.begin(), request.end(), plan.begin() + 1);
  std::copy(qo_tile.begin(), qo_tile.end(), plan.begin() + 1 + N);
  TESSERA_ASSIGN_OR_RETURN(Tensor dev_plan, ctx.UploadI32(plan));
  const int32_t* pd = dev_plan.data<int32_t>();
  const AttentionMetaLayout L = LayoutOf(b);
  FlashInferPrefillArgs a;
  a.kv = PagedKvOf(cache, b);
  a.q = q.raw();
  a.out = out.raw();
  a.heads = static_cast<int32_t>(heads);
  a.head_dim = static_cast<int32_t>(head_dim);
  a.scale = scale;
  a.q_indptr = b.device_meta.data<int32_t>() + L.q_indptr;
  a.chunk = pd;
  a.request = pd + 1;
  a.qo_tile = pd + 1 + N;
  a.kv_tile = pd + 1 + 2 * N;
  a.work_items = static_cast<int32_t>(N);
  a.cta_tile_q = tile;
  std::string error;
  return FlashInferStatus(LaunchFlashInferPrefill(q.dtype(), a, ctx.stream(), &error), error,
                          "FlashInfer BatchPrefillWithPagedKVCache");
}
#endif  // TESSERA_WITH_FLASHINFER

// What every KV write launches with: k's rows checked against the step and the cache against k,
// the step's packed layout on the device, the shape (q_heads query heads beside k's kv heads).
struct KvWriteLaunch {
  AttentionMetaDev meta;
  AttentionShape shape;
  cudaStream_t stream;
};
StatusOr<KvWriteLaunch> PrepareKvWrite(const KvCacheLayer& cache, const Tensor& k, const Tensor& v,
                                       int64_t q_heads, const AttentionBatch& batch,
                                       const char* what) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(k, 3, Device::kCUDA, what));
  if (v.shape() != k.shape() || v.dtype() != k.dtype() || v.device() != k.device())
    return InvalidArgument(std::string(what) + ": K " + k.Describe() + " vs V " + v.Describe());
  if (k.dim(0) != batch.num_tokens)
    return InvalidArgument(std::string(what) + ": K " + k.Describe() + " for a step of " +
                           std::to_string(batch.num_tokens) + " tokens");
  TESSERA_RETURN_IF_ERROR(CheckCache(cache, k.dim(1), k.dim(2), k.dtype()));
  TESSERA_ASSIGN_OR_RETURN(AttentionMetaDev meta, DeviceMeta(batch));
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  return KvWriteLaunch{meta, ShapeOf(cache, q_heads, k.dim(1), k.dim(2)), ctx->stream()};
}

}  // namespace

Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v, const AttentionBatch& batch) {
  TESSERA_ASSIGN_OR_RETURN(KvWriteLaunch l,
                           PrepareKvWrite(cache, k, v, k.dim(1), batch, "kv write"));
  TESSERA_CUDA_LAUNCH_CHECK(LaunchWriteKv(k.dtype(), l.meta, l.shape, k.raw(), v.raw(),
                                          cache.k.raw(), cache.v.raw(), cache.k.dtype(), l.stream),
                            "WriteKvKernel");
  return Status::Ok();
}

// kernels/rope_write_kv.h (the dispatcher has checked shapes and devices): one kernel, or with
// TESSERA_CUDA_FUSED_ROPE_KV=0 the separate ones.
Status NormRopeWriteKv(Tensor& q, Tensor& k, const Tensor& v, const QkNorms& norms,
                       const Tensor& positions, const Tensor& inv_freq, KvCacheLayer& cache,
                       const AttentionBatch& batch) {
  static const bool fused = EnvSwitchOn("TESSERA_CUDA_FUSED_ROPE_KV");
  if (!fused) return NormRopeWriteKvSeparately(q, k, v, norms, positions, inv_freq, cache, batch);
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(q, 3, Device::kCUDA, "norm+rope+kv write q"));
  TESSERA_ASSIGN_OR_RETURN(KvWriteLaunch l,
                           PrepareKvWrite(cache, k, v, q.dim(1), batch, "norm+rope+kv write"));
  const auto raw = [](const Tensor& w) { return w.defined() ? w.raw() : nullptr; };
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchNormRopeWriteKv(q.dtype(), l.meta, l.shape, q.raw(), k.raw(), v.raw(),
                            raw(norms.q_weight), raw(norms.k_weight), norms.eps,
                            norms.weight_offset, positions.data<int32_t>(), inv_freq.data<float>(),
                            cache.k.raw(), cache.v.raw(), cache.k.dtype(), l.stream),
      "NormRopeWriteKvKernel");
  return Status::Ok();
}

Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window, float softcap,
                      StepKv step_kv) {
  TESSERA_ASSIGN_OR_RETURN(AttentionKernels kernels, DefaultAttentionKernels());
  return PagedAttention(q, cache, batch, scale, out, sliding_window, softcap, kernels, step_kv);
}

Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window, float softcap,
                      AttentionKernels kernels, StepKv step_kv) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(q, 3, Device::kCUDA, "attention query"));
  const int64_t heads = q.dim(1), head_dim = q.dim(2);
  const int64_t kv_heads = cache.k.rank() == 4 ? cache.k.dim(2) : 0;
  TESSERA_RETURN_IF_ERROR(CheckCache(cache, kv_heads, head_dim, q.dtype()));
  if (kv_heads == 0 || heads % kv_heads != 0)
    return InvalidArgument("attention: " + std::to_string(heads) + " query heads over " +
                           std::to_string(kv_heads) + " kv heads");
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(out, 2, Device::kCUDA, "attention output"));
  if (out.dim(0) != q.dim(0) || out.dim(1) != heads * head_dim || out.dtype() != q.dtype() ||
      q.dim(0) != batch.num_tokens)
    return InvalidArgument("attention: out " + out.Describe() + " for q " + q.Describe() +
                           " in a step of " + std::to_string(batch.num_tokens) + " tokens");
  if (head_dim > 256)
    return Unimplemented("attention: head_dim " + std::to_string(head_dim) +
                         " (the CUDA kernels take <= 256)");
  if (batch.num_tokens == 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(AttentionMetaDev meta, DeviceMeta(batch));
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
#ifdef TESSERA_WITH_FLASHINFER
  // (Sliding windows, soft-capping and the fp8 KV cache run Tessera's kernels:
  // FlashInfer's are instantiated without them.)
  if (kernels == AttentionKernels::kFlashInfer && sliding_window == 0 && softcap == 0.0f &&
      !IsFp8(cache) && FlashInferTakes(q.dtype(), heads, kv_heads, head_dim)) {
    const int64_t S = static_cast<int64_t>(batch.seqs.size());
    if (batch.max_seq_tokens == 1 && batch.num_tokens == S)
      return FlashInferDecode(q, cache, batch, scale, out, *ctx);
    // The prefill plan is uploaded per call, which a CUDA graph cannot replay: a step being
    // recorded (decode graphs record decode steps only) takes Tessera's kernels.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(ctx->stream(), &capture));
    if (capture == cudaStreamCaptureStatusNone)
      return FlashInferPrefill(q, cache, batch, scale, out, *ctx, step_kv);
  }
#else
  (void)kernels;
  (void)step_kv;
#endif
  AttentionShape shape = ShapeOf(cache, heads, kv_heads, head_dim);
  // A window at least the longest context masks nothing.
  shape.window = static_cast<int32_t>(std::min<int64_t>(sliding_window, INT32_MAX));
  shape.softcap = softcap;
  const int64_t group = heads / kv_heads;

  if (batch.max_seq_tokens > kDecodeMaxTokens || group > 16) {
    if (group > 64)
      return Unimplemented("attention: " + std::to_string(group) +
                           " query heads per kv head (the CUDA kernels take <= 64)");
    TESSERA_CUDA_LAUNCH_CHECK(
        LaunchPrefillAttention(q.dtype(), meta, shape, q.raw(), cache.k.raw(), cache.v.raw(),
                               cache.k.dtype(), out.raw(), scale, ctx->stream()),
        "PrefillAttentionKernel");
    return Status::Ok();
  }
  // Decode: split the context so that the grid covers about two waves of
  // SMs (flash-decoding), at least 32 positions per split. The split is
  // chosen for the context bucket, not the exact context, so decode graphs
  // (recorded per bucket) and eager steps reduce in the same order.
  const int64_t ctas = batch.num_tokens * kv_heads;
  const int64_t target = 2 * static_cast<int64_t>(ctx->props().multiProcessorCount);
  const int64_t max_ctx = DecodeContextBucket(batch.max_context);
  int64_t splits = 1;
  if (ctas < target) splits = std::min((target + ctas - 1) / ctas, (max_ctx + 31) / 32);
  int64_t partition = (max_ctx + splits - 1) / splits;
  partition = (partition + 31) / 32 * 32;
  const int64_t max_partition =
      std::max<int64_t>(32, (16384 / group) / 32 * 32);  // <= 64 KiB of scores
  if (partition > max_partition) partition = max_partition;
  splits = (max_ctx + partition - 1) / partition;
  Tensor partials;
  if (splits > 1) {
    TESSERA_ASSIGN_OR_RETURN(
        partials, ctx->Allocate({batch.num_tokens * heads * splits * (head_dim + 2)}, DType::kF32));
  }
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchDecodeAttention(q.dtype(), meta, shape, q.raw(), cache.k.raw(), cache.v.raw(),
                            cache.k.dtype(), out.raw(), scale, static_cast<int>(partition),
                            static_cast<int>(splits), splits > 1 ? partials.data<float>() : nullptr,
                            ctx->stream()),
      "DecodeAttentionKernel");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
