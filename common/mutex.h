// Mutex, MutexLock, CondVar, InterruptibleCondVar, SharedMutex, ReaderLock, WriterLock:
// std::mutex, std::unique_lock, the condition variables and std::shared_mutex carrying the
// annotations of common/thread_annotations.h, so that a clang build checks that a field
// marked KVTIER_GUARDED_BY(mu_) is touched only with mu_ held. Each holds the std type
// and forwards to it: no cost over using it directly.
//
// Locks are taken by scoped objects. A MutexLock may be dropped and taken again inside
// its scope (unlock(), lock()) around work done without the mutex; the analysis follows
// both. The condition variables wait on a MutexLock and have no predicate forms: a
// predicate lambda is analysed as a function of its own, where the lock is not known to
// be held, so callers test their condition in a loop the analysis sees under the lock:
//
//   MutexLock lock(mu_);
//   while (!stopping_ && queue_.empty()) ready_.wait(lock);
//
// Thread-safety: as the std types they wrap. A MutexLock belongs to the thread that made
// it; a condition variable may be notified from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>
#include <stop_token>
#include <utility>

#include "common/thread_annotations.h"

namespace kvtier {

class KVTIER_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() KVTIER_ACQUIRE() { mutex_.lock(); }
  void unlock() KVTIER_RELEASE() { mutex_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mutex_;
};

// Holds a Mutex from construction to destruction, except between unlock() and the
// next lock().
class KVTIER_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) KVTIER_ACQUIRE(mutex) : lock_(mutex.mutex_) {}
  ~MutexLock() KVTIER_RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // REQUIRES: held. Lets the mutex go until lock().
  void unlock() KVTIER_RELEASE() { lock_.unlock(); }
  // REQUIRES: not held (after unlock()). Takes the mutex again.
  void lock() KVTIER_ACQUIRE() { lock_.lock(); }

 private:
  friend class CondVar;
  friend class InterruptibleCondVar;
  std::unique_lock<std::mutex> lock_;
};

// A condition variable for a Mutex. Every wait releases the MutexLock's mutex while it
// blocks and holds it again when it returns; a wait may return spuriously, so callers
// wait in a loop on their condition.
// REQUIRES (every wait): `lock` holds its mutex.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void wait(MutexLock& lock) { cv_.wait(lock.lock_); }
  template <typename Rep, typename Period>
  std::cv_status wait_for(MutexLock& lock, const std::chrono::duration<Rep, Period>& timeout) {
    return cv_.wait_for(lock.lock_, timeout);
  }
  template <typename Clock, typename Duration>
  std::cv_status wait_until(MutexLock& lock,
                            const std::chrono::time_point<Clock, Duration>& deadline) {
    return cv_.wait_until(lock.lock_, deadline);
  }

  void notify_one() noexcept { cv_.notify_one(); }
  void notify_all() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A condition variable whose waits also end when a std::stop_token is stopped (a
// std::jthread's), without a lost wake-up between the caller's look at the token and
// the wait: std::condition_variable_any underneath, which costs a mutex of its own.
// REQUIRES (every wait): `lock` holds its mutex.
class InterruptibleCondVar {
 public:
  InterruptibleCondVar() = default;
  InterruptibleCondVar(const InterruptibleCondVar&) = delete;
  InterruptibleCondVar& operator=(const InterruptibleCondVar&) = delete;

  // Returns when notified, at `deadline`, when `stop` is stopped (at once if it already
  // is), or spuriously: the caller looks at its condition, the token and the clock.
  template <typename Clock, typename Duration>
  void wait_until(MutexLock& lock, std::stop_token stop,
                  const std::chrono::time_point<Clock, Duration>& deadline) {
    // The standard ends a wait on a stop only in its predicate form; this predicate is
    // false once, before the wait, and true after it, so exactly one wait happens.
    bool waited = false;
    cv_.wait_until(lock.lock_, std::move(stop), deadline,
                   [&waited] { return std::exchange(waited, true); });
  }

  void notify_one() noexcept { cv_.notify_one(); }
  void notify_all() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

// A reader-writer mutex: ReaderLock holds it shared, WriterLock exclusively.
class KVTIER_CAPABILITY("shared mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() KVTIER_ACQUIRE() { mutex_.lock(); }
  void unlock() KVTIER_RELEASE() { mutex_.unlock(); }
  void lock_shared() KVTIER_ACQUIRE_SHARED() { mutex_.lock_shared(); }
  void unlock_shared() KVTIER_RELEASE_SHARED() { mutex_.unlock_shared(); }

 private:
  friend class ReaderLock;
  friend class WriterLock;
  std::shared_mutex mutex_;
};

class KVTIER_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mutex) KVTIER_ACQUIRE_SHARED(mutex) : lock_(mutex.mutex_) {}
  ~ReaderLock() KVTIER_RELEASE() = default;
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  std::shared_lock<std::shared_mutex> lock_;
};

class KVTIER_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mutex) KVTIER_ACQUIRE(mutex) : lock_(mutex.mutex_) {}
  ~WriterLock() KVTIER_RELEASE() = default;
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  std::unique_lock<std::shared_mutex> lock_;
};

}  // namespace kvtier
