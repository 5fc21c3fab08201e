#include "tiers/remote_worker.h"

#include <algorithm>
#include <cstring>

#include "common/log.h"

namespace kvtier::remote {

std::unique_ptr<RemoteWorker> RemoteWorker::start(RemoteWorkerOptions options, Post post) {
  return std::unique_ptr<RemoteWorker>(new RemoteWorker(std::move(options), std::move(post)));
}

RemoteWorker::RemoteWorker(RemoteWorkerOptions options, Post post)
    : options_(std::move(options)),
      post_(std::move(post)),
      thread_([this](std::stop_token stop) { loop(stop); }) {}

RemoteWorker::~RemoteWorker() {
  thread_.request_stop();
  wake_.notify_all();
  thread_.join();
  // What was still queued completes as if the cluster were unreachable. Taken out
  // first: a completion `post` runs inline may queue more (which then also fails).
  std::deque<Job> left;
  {
    MutexLock lock(mu_);
    left.swap(jobs_);
  }
  for (Job& job : left) {
    std::function<void()> completion = job.run(nullptr);
    job.run = nullptr;
    post_(std::move(completion));
  }
}

bool RemoteWorker::enqueue(Job job, bool bounded) {
  {
    MutexLock lock(mu_);
    // Reads and writes each have the bound: a backlog of write-behind never declines
    // the reads an engine waits on.
    uint64_t& in_flight = job.write ? in_flight_write_bytes_ : in_flight_read_bytes_;
    if (bounded && in_flight + job.bytes > options_.max_in_flight_bytes) return false;
    in_flight += job.bytes;
    job.queued_at = std::chrono::steady_clock::now();
    if (job.write) {
      pending_writes_.push_back(job.queued_at);
      jobs_.push_back(std::move(job));
    } else {
      // A read has an engine waiting on it: ahead of the queued writes, behind other reads.
      auto first_write =
          std::find_if(jobs_.begin(), jobs_.end(), [](const Job& queued) { return queued.write; });
      jobs_.insert(first_write, std::move(job));
    }
  }
  wake_.notify_one();
  return true;
}

bool RemoteWorker::put_blocks(std::vector<OwnedBlock> blocks,
                              std::function<void(std::vector<Status>)> done) {
  Job job;
  for (const OwnedBlock& block : blocks) job.bytes += block.payload.size();
  job.write = true;
  job.run = [blocks = std::move(blocks),
             done = std::move(done)](RemoteStore* store) mutable -> std::function<void()> {
    std::vector<Status> statuses;
    if (store == nullptr) {
      statuses.assign(blocks.size(), unavailable("the remote tier is not connected"));
    } else {
      std::vector<RemoteStore::BlockWrite> writes;
      writes.reserve(blocks.size());
      for (const OwnedBlock& block : blocks) writes.push_back({block.id, block.payload});
      statuses = store->put_blocks(writes);
    }
    return [done = std::move(done), statuses = std::move(statuses)]() mutable {
      done(std::move(statuses));
    };
  };
  return enqueue(std::move(job), true);
}

bool RemoteWorker::put_borrowed(std::vector<RemoteStore::BlockWrite> blocks,
                                std::function<void(std::vector<Status>)> done) {
  Job job;
  for (const RemoteStore::BlockWrite& block : blocks) job.bytes += block.payload.size();
  job.write = true;
  job.run = [blocks = std::move(blocks),
             done = std::move(done)](RemoteStore* store) mutable -> std::function<void()> {
    std::vector<Status> statuses =
        store == nullptr
            ? std::vector<Status>(blocks.size(), unavailable("the remote tier is not connected"))
            : store->put_blocks(blocks);
    return [done = std::move(done), statuses = std::move(statuses)]() mutable {
      done(std::move(statuses));
    };
  };
  return enqueue(std::move(job), true);
}

bool RemoteWorker::get_blocks(std::vector<RemoteStore::BlockRead> reads,
                              std::function<void(std::vector<Result<std::string>>)> done) {
  Job job;
  for (const RemoteStore::BlockRead& read : reads) job.bytes += read.bytes;
  job.run = [reads = std::move(reads),
             done = std::move(done)](RemoteStore* store) mutable -> std::function<void()> {
    std::vector<Result<std::string>> got;
    if (store == nullptr) {
      got.assign(reads.size(), unavailable("the remote tier is not connected"));
    } else {
      got = store->get_blocks(reads);
    }
    return [done = std::move(done), got = std::move(got)]() mutable { done(std::move(got)); };
  };
  return enqueue(std::move(job), true);
}

bool RemoteWorker::get_into(std::vector<ReadInto> reads,
                            std::function<void(std::vector<Status>)> done) {
  Job job;
  for (const ReadInto& read : reads) job.bytes += read.into.size();
  job.run = [reads = std::move(reads),
             done = std::move(done)](RemoteStore* store) mutable -> std::function<void()> {
    std::vector<Status> statuses(reads.size(), unavailable("the remote tier is not connected"));
    if (store != nullptr) {
      std::vector<RemoteStore::BlockRead> gets;
      gets.reserve(reads.size());
      for (const ReadInto& read : reads) gets.push_back({read.id, read.into.size()});
      std::vector<Result<std::string>> got = store->get_blocks(gets);
      for (size_t i = 0; i < reads.size(); ++i) {
        if (!got[i].is_ok()) {
          statuses[i] = got[i].status();
        } else if (got[i]->size() != reads[i].into.size()) {  // verified against `bytes` above
          statuses[i] = data_loss("a remote value of {} bytes for a {}-byte block", got[i]->size(),
                                  reads[i].into.size());
        } else {
          std::memcpy(reads[i].into.data(), got[i]->data(), got[i]->size());
          statuses[i] = Status::ok();
        }
      }
    }
    return [done = std::move(done), statuses = std::move(statuses)]() mutable {
      done(std::move(statuses));
    };
  };
  return enqueue(std::move(job), true);
}

bool RemoteWorker::exists_blocks(std::vector<RemoteBlockId> ids,
                                 std::function<void(std::vector<Result<bool>>)> done) {
  Job job;
  job.run = [ids = std::move(ids),
             done = std::move(done)](RemoteStore* store) mutable -> std::function<void()> {
    std::vector<Result<bool>> found;
    if (store == nullptr) {
      found.assign(ids.size(), unavailable("the remote tier is not connected"));
    } else {
      found = store->exists_blocks(ids);
    }
    return [done = std::move(done), found = std::move(found)]() mutable { done(std::move(found)); };
  };
  return enqueue(std::move(job), false);  // no payload: never declined
}

void RemoteWorker::put_session(std::string namespace_name, std::string session_id,
                               std::string record, std::function<void(Status)> done) {
  Job job;
  job.write = true;
  job.run = [ns = std::move(namespace_name), id = std::move(session_id), record = std::move(record),
             done = std::move(done)](RemoteStore* store) mutable -> std::function<void()> {
    Status status = store == nullptr ? unavailable("the remote tier is not connected")
                                     : store->put_session(ns, id, record);
    return [done = std::move(done), status]() { done(status); };
  };
  (void)enqueue(std::move(job), false);  // records are small: never declined
}

void RemoteWorker::delete_session(std::string namespace_name, std::string session_id,
                                  std::function<void(Status)> done) {
  Job job;
  job.write = true;
  job.run = [ns = std::move(namespace_name), id = std::move(session_id),
             done = std::move(done)](RemoteStore* store) mutable -> std::function<void()> {
    Status status = store == nullptr ? unavailable("the remote tier is not connected")
                                     : store->delete_session(ns, id);
    return [done = std::move(done), status]() { done(status); };
  };
  (void)enqueue(std::move(job), false);
}

void RemoteWorker::get_session(std::string namespace_name, std::string session_id,
                               std::function<void(Result<std::string>)> done) {
  Job job;
  job.run = [ns = std::move(namespace_name), id = std::move(session_id),
             done = std::move(done)](RemoteStore* store) mutable -> std::function<void()> {
    Result<std::string> record =
        store == nullptr ? Result<std::string>(unavailable("the remote tier is not connected"))
                         : store->get_session(ns, id);
    return
        [done = std::move(done), record = std::move(record)]() mutable { done(std::move(record)); };
  };
  (void)enqueue(std::move(job), false);
}

RemoteWorker::Snapshot RemoteWorker::snapshot() const {
  MutexLock lock(mu_);
  Snapshot out = snapshot_;
  out.in_flight_bytes = in_flight_read_bytes_ + in_flight_write_bytes_;
  out.queued = jobs_.size();
  if (!pending_writes_.empty()) {
    out.write_lag = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - pending_writes_.front());
  }
  return out;
}

void RemoteWorker::maybe_connect() {
  if (store_) return;
  const auto now = std::chrono::steady_clock::now();
  if (last_attempt_.time_since_epoch().count() != 0 &&
      now - last_attempt_ < options_.reconnect_interval) {
    return;
  }
  auto store = RemoteStore::open(options_.store);
  // From the end of the attempt: one that took longer than the interval (seeds that
  // hang) is not followed by another at once.
  last_attempt_ = std::chrono::steady_clock::now();
  if (store.is_ok()) {
    store_ = std::move(*store);
    KVTIER_LOG_INFO("remote tier: connected to the Redis Cluster ({} masters)",
                    store_->cluster().slots().masters().size());
    failed_attempts_ = 0;
  } else if (++failed_attempts_ == 1 || failed_attempts_ % 60 == 0) {
    // The first failure and then one line a minute or so, not one per attempt.
    KVTIER_LOG_WARN("remote tier: {}; retrying every {} ms ({} attempts so far)",
                    store.status().message(), options_.reconnect_interval.count(),
                    failed_attempts_);
  }
}

void RemoteWorker::publish() {
  MutexLock lock(mu_);
  snapshot_.connected = store_ != nullptr;
  connected_.store(snapshot_.connected, std::memory_order_relaxed);
  snapshot_.degraded = store_ == nullptr || store_->degraded();
  if (store_) {
    snapshot_.store = store_->stats();
    snapshot_.masters = store_->cluster().slots().masters().size();
  }
}

void RemoteWorker::loop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    maybe_connect();
    publish();
    Job job;
    {
      MutexLock lock(mu_);
      // Wakes for work, for a stop, or to retry connecting.
      const auto deadline = std::chrono::steady_clock::now() + options_.reconnect_interval;
      while (jobs_.empty() && !stop.stop_requested() &&
             std::chrono::steady_clock::now() < deadline) {
        wake_.wait_until(lock, stop, deadline);
      }
      if (jobs_.empty()) continue;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    // Not connected: the job fails at once; connecting happens between jobs, on the
    // retry interval, never on a job's time.
    std::function<void()> completion = job.run(store_.get());
    // The job's captures (the caller's objects: connections, timers, slots) go with
    // the completion to the caller's thread, never released here.
    job.run = nullptr;
    {
      MutexLock lock(mu_);
      (job.write ? in_flight_write_bytes_ : in_flight_read_bytes_) -= job.bytes;
      if (job.write && !pending_writes_.empty()) pending_writes_.pop_front();
    }
    publish();
    post_(std::move(completion));
  }
}

}  // namespace kvtier::remote
