#include "worker/comm/gloo_store_adapter.h"

#include <gloo/common/error.h>

#include <algorithm>

namespace tessera {

void GlooStoreAdapter::Throw(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_error_.ok()) first_error_ = status;
  }
  throw gloo::IoException(status.ToString());
}

Status GlooStoreAdapter::first_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_error_;
}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  Status s = store_.Set(key, std::string(data.begin(), data.end()));
  if (!s.ok()) Throw(s);
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  StatusOr<std::string> v = store_.Get(key, timeout_seconds_);
  if (!v.ok()) Throw(v.status());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  Status s = store_.Wait(keys, timeout_seconds_);
  if (!s.ok()) Throw(s);
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  // Gloo passes its context timeout (or kNoTimeout = 0 for "forever"); never
  // wait longer than the adapter's own bound.
  double seconds =
      timeout.count() > 0 ? std::min(timeout.count() / 1000.0, timeout_seconds_) : timeout_seconds_;
  Status s = store_.Wait(keys, seconds);
  if (!s.ok()) Throw(s);
}

}  // namespace tessera
