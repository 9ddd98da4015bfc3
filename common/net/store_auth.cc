#include "common/net/store_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>

namespace tessera {

StoreCredentials StoreCredentials::Admin(const std::string& secret) {
  return {kStoreAdminIdentity, secret};
}

StoreCredentials StoreCredentials::Rank(const std::string& secret, uint64_t plan_version,
                                        int rank) {
  std::string id = StoreRankIdentity(plan_version, rank);
  std::string key = StoreKeyFor(secret, id);
  return {std::move(id), std::move(key)};
}

StatusOr<std::string> NewStoreSecret() {
  std::string s(kStoreSecretBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(s.size())) != 1)
    return Internal("store secret: RAND_bytes failed");
  return s;
}

std::string StoreRankIdentity(uint64_t plan_version, int rank) {
  return "plan/" + std::to_string(plan_version) + "/rank/" + std::to_string(rank);
}

namespace {

// Parses a decimal number without sign or leading zeros into *v (<= max).
bool ParseDecimal(const std::string& s, size_t* pos, uint64_t max, uint64_t* v) {
  size_t i = *pos;
  if (i >= s.size() || s[i] < '0' || s[i] > '9') return false;
  if (s[i] == '0' && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') return false;
  uint64_t x = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (x > (max - d) / 10) return false;
    x = x * 10 + d;
  }
  *pos = i;
  *v = x;
  return true;
}

}  // namespace

bool ParseStoreRankIdentity(const std::string& identity, uint64_t* plan_version, int* rank) {
  static const std::string kPlan = "plan/", kRank = "/rank/";
  if (identity.compare(0, kPlan.size(), kPlan) != 0) return false;
  size_t pos = kPlan.size();
  uint64_t v = 0, r = 0;
  if (!ParseDecimal(identity, &pos, uint64_t{1} << 62, &v)) return false;
  if (identity.compare(pos, kRank.size(), kRank) != 0) return false;
  pos += kRank.size();
  if (!ParseDecimal(identity, &pos, (uint64_t{1} << 31) - 1, &r)) return false;
  if (pos != identity.size()) return false;
  *plan_version = v;
  *rank = static_cast<int>(r);
  return true;
}

std::string HmacSha256(const std::string& key, const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string StoreKeyFor(const std::string& secret, const std::string& identity) {
  if (identity == kStoreAdminIdentity) return secret;
  return HmacSha256(secret, identity);
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string HexEncode(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

StatusOr<std::string> HexDecode(const std::string& hex, const std::string& what) {
  if (hex.size() % 2 != 0) return InvalidArgument(what + ": odd number of hex digits");
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0)
      return InvalidArgument(what + ": not a hex digit at offset " +
                             std::to_string(hi < 0 ? i : i + 1));
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

StatusOr<std::string> TakeStoreSecretFromEnv() {
  const char* v = std::getenv(kStoreSecretEnv);
  if (v == nullptr || *v == '\0')
    return InvalidArgument(std::string(kStoreSecretEnv) +
                           " is not set (the launcher hands each rank the store secret)");
  const std::string hex = v;
  unsetenv(kStoreSecretEnv);
  TESSERA_ASSIGN_OR_RETURN(std::string secret, HexDecode(hex, kStoreSecretEnv));
  if (secret.size() != kStoreSecretBytes)
    return InvalidArgument(std::string(kStoreSecretEnv) + " holds " +
                           std::to_string(secret.size()) + " bytes, expected " +
                           std::to_string(kStoreSecretBytes));
  return secret;
}

}  // namespace tessera
