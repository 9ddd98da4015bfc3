// Clang thread-safety analysis attributes (-Wthread-safety): a member says
// which mutex guards it (GUARDED_BY), a function which mutexes it needs held
// (REQUIRES) or not held (EXCLUDES), and the compiler checks every access.
// On other compilers the macros expand to nothing. The mutex type they
// name is tessera::Mutex (common/base/mutex.h), a CAPABILITY.
//
// Build with the checks: cmake -DTESSERA_THREAD_SAFETY=ON (clang only), or
// scripts/thread-safety.
//
// Thread-safety: compile-time annotations only.
#pragma once

#if defined(__clang__)
#define TESSERA_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TESSERA_THREAD_ANNOTATION(x)
#endif

// A type that is a lockable capability ("mutex").
#define CAPABILITY(x) TESSERA_THREAD_ANNOTATION(capability(x))
// An RAII type that holds a capability for its lifetime.
#define SCOPED_CAPABILITY TESSERA_THREAD_ANNOTATION(scoped_lockable)
// The member is read and written only with `x` held.
#define GUARDED_BY(x) TESSERA_THREAD_ANNOTATION(guarded_by(x))
// The pointee of the member is accessed only with `x` held.
#define PT_GUARDED_BY(x) TESSERA_THREAD_ANNOTATION(pt_guarded_by(x))
// The caller holds `...` (exclusively).
#define REQUIRES(...) TESSERA_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The caller does not hold `...` (the function takes it).
#define EXCLUDES(...) TESSERA_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function acquires / releases `...`.
#define ACQUIRE(...) TESSERA_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) TESSERA_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) TESSERA_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// The function returns a reference to the capability `x`.
#define RETURN_CAPABILITY(x) TESSERA_THREAD_ANNOTATION(lock_returned(x))
// Asserts at run time (to the analysis: from here on) that `x` is held.
#define ASSERT_CAPABILITY(x) TESSERA_THREAD_ANNOTATION(assert_capability(x))
// Opts one function out of the analysis (say why next to it).
#define NO_THREAD_SAFETY_ANALYSIS TESSERA_THREAD_ANNOTATION(no_thread_safety_analysis)
