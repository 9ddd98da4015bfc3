#include "common/format/kv_cache_dtype.h"

namespace tessera {

DType KvStorageDType(KvCacheDType kv, DType compute) {
  return kv == KvCacheDType::kFp8 ? DType::kF8E4M3 : compute;
}

const char* KvCacheDTypeName(KvCacheDType kv) { return kv == KvCacheDType::kFp8 ? "fp8" : "auto"; }

std::string KvCacheDTypeWire(KvCacheDType kv) { return kv == KvCacheDType::kFp8 ? "fp8" : ""; }

StatusOr<KvCacheDType> ParseKvCacheDType(std::string_view name, std::string_view what) {
  if (name.empty() || name == "auto") return KvCacheDType::kAuto;
  if (name == "fp8") return KvCacheDType::kFp8;
  return InvalidArgument(std::string(what) + ": KV cache dtype \"" + std::string(name) +
                         "\" (expected \"auto\" or \"fp8\")");
}

}  // namespace tessera
