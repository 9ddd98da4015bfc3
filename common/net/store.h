// Store: the key-value rendezvous that ranks use to find each other before
// they open direct connections (Gloo's connectFullMesh publishes each rank's
// listening addresses under a key and waits for the others').
//
// Implementations: TcpStore (common/net/tcp_store.h, one server, many clients,
// used across processes and hosts) and FileStore (common/net/file_store.h, a
// directory of files, for tests and single-host runs). Later the coordinator
// serves this interface, so it stays small: set, blocking get, wait, add.
//
// Keys and values are arbitrary byte strings. A key, once set, may be
// overwritten by another Set; nothing is ever deleted.
//
// Thread-safety: implementations are safe to call from several threads; see
// each implementation for whether calls run concurrently or one at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tessera {

class Store {
 public:
  virtual ~Store() = default;

  // Stores `value` under `key`, replacing any earlier value, and wakes every
  // Get/Wait blocked on `key`.
  // Errors: kUnavailable (store unreachable), kIoError.
  virtual Status Set(const std::string& key, const std::string& value) = 0;

  // Returns the value of `key`, blocking until some rank sets it or
  // `timeout_seconds` pass (<= 0: look once, do not wait).
  // Errors: kDeadlineExceeded naming the key, kUnavailable, kIoError.
  virtual StatusOr<std::string> Get(const std::string& key, double timeout_seconds) = 0;

  // Blocks until every key in `keys` exists or `timeout_seconds` pass.
  // Errors: kDeadlineExceeded naming the keys still missing, kUnavailable.
  virtual Status Wait(const std::vector<std::string>& keys, double timeout_seconds) = 0;

  // Atomically adds `delta` to the integer stored (as decimal text) under
  // `key`, treating a missing key as 0, and returns the new value. Used as a
  // counter (e.g. "how many ranks have arrived").
  // Errors: kInvalidArgument if the key holds a non-integer value,
  // kUnavailable, kIoError.
  virtual StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
};

}  // namespace tessera
