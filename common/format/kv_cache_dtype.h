// The element type of the paged KV cache ([kv_cache] dtype, issue #35 "FP8 on
// Hopper"), shared by the coordinator (the planner's KV bytes per token, the
// block count) and the workers (the cache's storage and its per-layer scales).
//
//   kAuto: the KV cache holds K and V in the backend's compute dtype (F32 on
//          the CPU, the model's bf16/f16/f32 on CUDA), as before.
//   kFp8:  float8 e4m3fn (common/base/dtype.h), one byte per element, with one
//          fp32 scale per layer for K and one for V: stored = e4m3(x / scale)
//          (saturating to +-448, round to nearest even), read back as
//          F8E4M3ToF32(stored) * scale. The scheme of vLLM's fp8 KV cache
//          (kv_cache_dtype="fp8", per-tensor k_scale/v_scale, 1.0 by default).
//
// On the wire (control.proto AssignShard.kv_cache_dtype): "" for kAuto (what a
// coordinator that predates the key sends) and "fp8".
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/dtype.h"
#include "common/base/status.h"

namespace tessera {

enum class KvCacheDType : uint8_t { kAuto, kFp8 };

// The dtype the KV cache stores for a backend computing in `compute`:
// `compute` for kAuto, kF8E4M3 for kFp8.
DType KvStorageDType(KvCacheDType kv, DType compute);

// "auto" or "fp8": the config spelling.
const char* KvCacheDTypeName(KvCacheDType kv);

// The wire spelling: "" (kAuto) or "fp8".
std::string KvCacheDTypeWire(KvCacheDType kv);

// Parses the wire or command-line spelling: "", "auto" or "fp8".
// Errors: kInvalidArgument naming `what` and the value.
StatusOr<KvCacheDType> ParseKvCacheDType(std::string_view name, std::string_view what);

}  // namespace tessera
