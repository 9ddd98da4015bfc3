// Mutex and MutexLock: std::mutex and its scoped lock, annotated for Clang's
// thread-safety analysis (common/base/thread_annotations.h), so members
// marked GUARDED_BY(mu_) are checked at compile time.
//
//   Mutex mu_;
//   int n_ GUARDED_BY(mu_);
//   void Add() EXCLUDES(mu_) { MutexLock lock(&mu_); ++n_; }
//
// Waiting: a Mutex is BasicLockable, so std::condition_variable_any waits on
// it (or on a MutexLock) directly:
//
//   std::condition_variable_any cv_;
//   MutexLock lock(&mu_);
//   cv_.wait(mu_, [&]() REQUIRES(mu_) { return ready_; });
//
// (The analysis treats the mutex as held across the wait, which is what the
// predicate sees.)
//
// Thread-safety: a Mutex is a mutex; a MutexLock belongs to one thread.
#pragma once

#include <mutex>

#include "common/base/thread_annotations.h"

namespace tessera {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // For the analysis only: the caller knows the mutex is held here.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  std::mutex mu_;
};

// Holds `mu` from construction to destruction.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  ~MutexLock() RELEASE() { mu_->unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

}  // namespace tessera
