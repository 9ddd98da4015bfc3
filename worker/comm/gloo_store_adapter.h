// GlooStoreAdapter: presents a Tessera Store (common/net/store.h) as a
// gloo::rendezvous::Store, so Gloo's rendezvous
// (gloo::rendezvous::Context::connectFullMesh, usually through a
// gloo::rendezvous::PrefixStore) runs over Tessera's TcpStore or FileStore.
//
// Gloo expects its store to throw on failure; the adapter throws
// gloo::IoException and also remembers the Tessera Status, so the caller that
// catches the exception (GlooCommunicator::Create) can return the original
// error (e.g. kDeadlineExceeded naming the missing key) instead of a string.
//
// Thread-safety: as the wrapped Store; first_error() is guarded by a mutex.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/store.h"

namespace tessera {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  // `store` must outlive the adapter. `timeout_seconds` bounds get() and the
  // wait() overload without a timeout.
  GlooStoreAdapter(::tessera::Store& store, double timeout_seconds)
      : store_(store), timeout_seconds_(timeout_seconds) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  // Blocks until `key` exists (at most the adapter's timeout).
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The first Status that made a call throw; OK if none did.
  Status first_error() const;

 private:
  // Records `status` (if it is the first error) and throws it as a
  // gloo::IoException.
  [[noreturn]] void Throw(const Status& status);

  ::tessera::Store& store_;
  const double timeout_seconds_;
  mutable std::mutex mu_;
  Status first_error_;  // guarded by mu_
};

}  // namespace tessera
