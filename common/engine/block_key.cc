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

// SHA-256, fetched from the default provider once: with EVP_sha256()
// EVP_Digest fetches it again on every call (OpenSSL 3), a lookup that was
// half of each call's time in the coordinator's profile (the router keys
// every request's first block). Kept for the process.
const EVP_MD* Sha256() {
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  TESSERA_CHECK(md != nullptr);
  return md;
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
  const int ok = EVP_Digest(buf.data(), buf.size(), key.digest.data(), &len, Sha256(), nullptr);
  TESSERA_CHECK(ok == 1 && len == key.digest.size());
  return key;
}

}  // namespace tessera
