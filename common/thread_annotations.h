// Thread-safety annotations: attributes that tell clang which mutex guards a field and
// which locks a function needs, takes or gives back, so that a clang build
// (-Wthread-safety, turned on in the top-level CMakeLists.txt) rejects code that touches
// guarded state without holding its lock. Under any other compiler every macro expands
// to nothing.
//
// A capability is what a thread holds: a kvtier::Mutex or SharedMutex (common/mutex.h). A
// scoped capability holds one for its own lifetime: MutexLock, ReaderLock, WriterLock.
// The analysis works one function at a time and sees only what is annotated: a lambda is a
// function of its own (it does not inherit its caller's locks), and a lock taken in one
// function and released in another needs an annotation on each.
//
// Usage:
//   Mutex mu_;
//   std::deque<Job> jobs_ KVTIER_GUARDED_BY(mu_);
//   void pop_locked() KVTIER_REQUIRES(mu_);  // the caller holds mu_
//   void post(Job job) KVTIER_EXCLUDES(mu_);  // takes mu_ itself
#pragma once

#if defined(__clang__)
#define KVTIER_THREAD_ANNOTATION(attribute) __attribute__((attribute))
#else
#define KVTIER_THREAD_ANNOTATION(attribute)
#endif

// ---- on classes ----

// Objects of the class are capabilities; `kind` names them in diagnostics ("mutex").
#define KVTIER_CAPABILITY(kind) KVTIER_THREAD_ANNOTATION(capability(kind))
// Objects of the class hold the capabilities their constructor acquires until they are
// destroyed (or released through a member annotated KVTIER_RELEASE()).
#define KVTIER_SCOPED_CAPABILITY KVTIER_THREAD_ANNOTATION(scoped_lockable)

// ---- on data members ----

// The member is read only with `mutex` held (shared or exclusive), written only with it
// held exclusively.
#define KVTIER_GUARDED_BY(mutex) KVTIER_THREAD_ANNOTATION(guarded_by(mutex))
// The same for what the member points to; the pointer itself is not guarded.
#define KVTIER_PT_GUARDED_BY(mutex) KVTIER_THREAD_ANNOTATION(pt_guarded_by(mutex))
// On a mutex: the order in which it is taken relative to the mutexes named (checked only
// with -Wthread-safety-beta).
#define KVTIER_ACQUIRED_BEFORE(...) KVTIER_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define KVTIER_ACQUIRED_AFTER(...) KVTIER_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))

// ---- on functions ----

// The caller holds the capabilities named, exclusively or at least shared; they are still
// held when the function returns.
#define KVTIER_REQUIRES(...) KVTIER_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define KVTIER_REQUIRES_SHARED(...) \
  KVTIER_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// The function takes the capabilities named (none named, on a member: the object itself)
// and returns holding them.
#define KVTIER_ACQUIRE(...) KVTIER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define KVTIER_ACQUIRE_SHARED(...) KVTIER_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
// The function gives back capabilities the caller held (on a scoped capability's members:
// the ones it holds).
#define KVTIER_RELEASE(...) KVTIER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define KVTIER_RELEASE_SHARED(...) KVTIER_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
// The function takes the capabilities when it returns `success` (the first argument, true
// or false) and does not take them otherwise.
#define KVTIER_TRY_ACQUIRE(...) KVTIER_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define KVTIER_TRY_ACQUIRE_SHARED(...) \
  KVTIER_THREAD_ANNOTATION(try_acquire_shared_capability(__VA_ARGS__))
// The caller must not hold the capabilities named: the function takes them itself.
#define KVTIER_EXCLUDES(...) KVTIER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function returns only if the calling thread holds `capability` (a run-time check,
// or a statement the analysis takes on trust); afterwards the analysis treats it as held.
#define KVTIER_ASSERT_CAPABILITY(capability) KVTIER_THREAD_ANNOTATION(assert_capability(capability))
#define KVTIER_ASSERT_SHARED_CAPABILITY(capability) \
  KVTIER_THREAD_ANNOTATION(assert_shared_capability(capability))
// The function returns a reference to `capability` (an accessor for a private mutex).
#define KVTIER_RETURN_CAPABILITY(capability) KVTIER_THREAD_ANNOTATION(lock_returned(capability))
// The function is not analysed. For what the analysis cannot express; each use says why.
#define KVTIER_NO_THREAD_SAFETY_ANALYSIS KVTIER_THREAD_ANNOTATION(no_thread_safety_analysis)
