#include "common/engine/block_key.h"

#include <openssl/evp.h>

#include <string>

#include "common/base/status.h"

namespace tessera {

namespace {

// Bumped when the layout of the hashed bytes changes.
constexpr char kKeyTag[] = "tessera-kv-block-v1";

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

BlockKey ChainBlockKey(const BlockKey* parent, std::string_view model_id, uint64_t plan_version,
                       std::span<const int32_t> tokens) {
  // Every field is length-prefixed or fixed-size, so no two inputs share bytes.
  std::string buf(kKeyTag, sizeof kKeyTag);
  buf.push_back(parent ? 1 : 0);
  if (parent)
    buf.append(reinterpret_cast<const char*>(parent->digest.data()), parent->digest.size());
  PutU64(buf, model_id.size());
  buf.append(model_id);
  PutU64(buf, plan_version);
  PutU64(buf, tokens.size());
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  BlockKey key;
  unsigned int len = 0;
  TESSERA_CHECK(
      EVP_Digest(buf.data(), buf.size(), key.digest.data(), &len, EVP_sha256(), nullptr) == 1 &&
      len == key.digest.size());
  return key;
}

}  // namespace tessera
