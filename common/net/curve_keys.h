// CURVE keys for the control plane (ZeroMQ's CurveZMQ: Curve25519 key pairs,
// written as Z85 text, 40 characters per 32-byte key).
//
// Files: a secret key file holds the Z85 secret key on one line (lines that
// start with '#' and blank lines are ignored); it must not be readable by
// group or others (like ssh keys). A public key file holds the Z85 public
// key the same way. `tessera keygen` writes both; the public key is what the
// coordinator's config lists (control.worker_public_keys) or what workers are
// given (control.coordinator_public_key).
//
// Thread-safety: free functions, safe from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace tessera {

// One Curve25519 key pair, both halves Z85 (40 characters).
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};

// True when `key` is 40 Z85 characters (a 32-byte key).
bool IsZ85Key(std::string_view key);

// A fresh key pair (libzmq's zmq_curve_keypair, libsodium's random source).
// Errors: kUnimplemented when libzmq was built without CURVE.
StatusOr<CurveKeyPair> GenerateCurveKeyPair();

// The public half of a Z85 secret key. Errors: kInvalidArgument (not a Z85
// key), kUnimplemented (libzmq without CURVE).
StatusOr<std::string> CurvePublicKey(std::string_view secret_key);

// Reads a secret key file and derives its public key. Errors (naming the
// file): kNotFound, kIoError, kFailedPrecondition when
// group or others may read it, kInvalidArgument when it holds no single Z85
// key.
StatusOr<CurveKeyPair> LoadCurveSecretKeyFile(const std::string& path);

// Writes `pair` as `<base>.key` (secret, mode 0600) and `<base>.pub` (public,
// 0644), refusing to overwrite either. Errors:
// kFailedPrecondition naming the file, kIoError.
Status WriteCurveKeyPair(const CurveKeyPair& pair, const std::string& base);

// The keys of one deployment on one host (what `tessera up` makes): a
// coordinator pair and one pair per worker (one key, one worker), written
// by WriteCurveKeyPair under `dir` as coordinator.{key,pub} and
// worker<i>.{key,pub}.
struct DeploymentKeys {
  std::string coordinator_secret_file;
  std::string coordinator_public_key;
  std::vector<std::string> worker_secret_files;
  std::vector<std::string> worker_public_keys;

  // Config overrides ("table.key=value", as --set takes them): the
  // coordinator's [control] keys, and worker i's.
  std::vector<std::string> CoordinatorOverrides() const;
  std::vector<std::string> WorkerOverrides(int i) const;
};

// Errors: those of GenerateCurveKeyPair and WriteCurveKeyPair.
StatusOr<DeploymentKeys> MakeDeploymentKeys(const std::string& dir, int workers);

}  // namespace tessera
