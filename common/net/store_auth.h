// Authentication of the rendezvous store (common/net/tcp_store.h).
//
// A deployment has one random secret (NewStoreSecret), made by whoever runs
// the TcpStoreServer: the coordinator at start, or the `tessera generate`
// launcher. It never goes on a command line or into a file another user can
// read. A client proves it holds a key derived from that secret:
//
//   identity "admin":             key = the secret itself; every key of the
//                                 store is open to it (the launcher's ranks,
//                                 tests).
//   identity "plan/<v>/rank/<r>": key = HMAC-SHA256(secret, identity); only
//                                 keys under plan v's prefix are open to it,
//                                 and only while plan v is the store's
//                                 current plan (TcpStoreServer::OpenPlan).
//
// The coordinator hands each rank its own plan key inside AssignShard (over
// the control plane), so a worker never learns the secret, a rank of one
// plan cannot write another plan's keys, and a key stops working when its
// plan is replaced.
#pragma once

#include <cstdint>
#include <string>

#include "common/base/status.h"

namespace tessera {

// Bytes of a deployment secret, of a derived key, of a nonce and of an
// HMAC-SHA256 tag.
inline constexpr size_t kStoreSecretBytes = 32;
inline constexpr size_t kStoreNonceBytes = 32;
inline constexpr size_t kStoreTagBytes = 32;

inline constexpr char kStoreAdminIdentity[] = "admin";

// What a TcpStore client authenticates with.
struct StoreCredentials {
  std::string identity;  // "admin" or StoreRankIdentity(v, r)
  std::string key;       // kStoreSecretBytes bytes, see StoreKeyFor

  // The deployment's full access: identity "admin", key = `secret`.
  static StoreCredentials Admin(const std::string& secret);
  // Rank `rank` of plan `plan_version`: its derived key.
  static StoreCredentials Rank(const std::string& secret, uint64_t plan_version, int rank);
};

// kStoreSecretBytes random bytes (OpenSSL RAND_bytes).
// Errors: kInternal when the random generator fails.
StatusOr<std::string> NewStoreSecret();

// "plan/<plan_version>/rank/<rank>".
std::string StoreRankIdentity(uint64_t plan_version, int rank);

// Parses StoreRankIdentity's form; false for anything else (leading zeros,
// signs, trailing bytes, numbers past 2^63 or 2^31).
bool ParseStoreRankIdentity(const std::string& identity, uint64_t* plan_version, int* rank);

// The key of `identity`: the secret for "admin", else HMAC-SHA256(secret,
// identity).
std::string StoreKeyFor(const std::string& secret, const std::string& identity);

// HMAC-SHA256(key, data): kStoreTagBytes bytes.
std::string HmacSha256(const std::string& key, const std::string& data);

// Compares two byte strings in time independent of where they differ.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

// Lower-case hex and back (TESSERA_STORE_SECRET, the launcher's ranks).
std::string HexEncode(const std::string& bytes);
// Errors: kInvalidArgument naming `what` for odd length or a non-hex digit.
StatusOr<std::string> HexDecode(const std::string& hex, const std::string& what);

// The environment variable through which the `tessera generate` launcher
// hands its ranks the store secret (hex); a rank reads it once and removes
// it from its environment.
inline constexpr char kStoreSecretEnv[] = "TESSERA_STORE_SECRET";

// Reads kStoreSecretEnv, unsets it and returns the decoded secret.
// Errors: kInvalidArgument when it is missing or not kStoreSecretBytes of hex.
StatusOr<std::string> TakeStoreSecretFromEnv();

}  // namespace tessera
