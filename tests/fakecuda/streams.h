// Streams: in-order queues of copy work, each executed by one worker thread.
//
// A stream belongs to the context that was current when it was made. Work enqueued on
// it runs strictly in order; sequence numbers (1, 2, …) name positions in that order,
// and an event is a stream plus the sequence number it waits for. Each context also has
// a NULL (legacy) stream, made on first use, that the stream handles 0, CU_STREAM_LEGACY
// and CU_STREAM_PER_THREAD name.
//
// Work is skipped, not executed, once the stream's context is broken.
//
// Thread-safety: Stream methods may be called from any thread. The worker holds a
// reference to its Stream, so a destroyed stream's queued work still completes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "tests/fakecuda/memory_table.h"

namespace kvtier::fakecuda {

struct Segment {
  Operand dst;
  Operand src;  // unused by memset
  // cuMemcpyPeerAsync: the devices reading and writing (the contexts named); -1: the
  // stream's device.
  int dst_device = -1;
  int src_device = -1;
};

// One unit of stream work: a copy or batch of copies, or a memset.
struct Work {
  std::vector<Segment> segments;
  int memset_value = -1;            // ≥ 0: set each dst byte to this value
  bool async_copy = true;           // the fault-file switch applies to it
  bool host_pointer_fault = false;  // a batch given a host pointer the device may not use
  bool launch_fault = false;        // a kernel launch that touches memory it may not
  std::vector<std::unique_ptr<std::byte[]>> staging;  // sources read during the API call
  std::shared_ptr<std::promise<CUresult>> done;       // set when a caller waits for it
};

// Resolves a copy's operands (copies.cpp): each side inside one known range, device
// memory where `*_device` says so. INVALID_VALUE otherwise.
CUresult resolve_copy(uint64_t dst, uint64_t src, uint64_t bytes, bool dst_device, bool src_device,
                      Segment* segment);

// Executes `work` for a stream of `context` (copies.cpp). ILLEGAL_ADDRESS on a fault,
// after which the context is broken.
CUresult execute_work(Work& work, Context& context);

class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(Context& context, int priority);
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void start();  // launches the worker; once, right after construction
  Context& context() const { return context_; }

  uint64_t enqueue(Work work);  // its sequence number
  uint64_t last_sequence();     // of the latest work; 0 when none
  bool reached(uint64_t sequence);
  void wait(uint64_t sequence);
  void close();  // the worker exits after the queued work

 private:
  void run();

  Context& context_;
  const int priority_;  // recorded only: one worker per stream needs no scheduling

  std::mutex mu_;  // protects the fields below
  std::condition_variable work_ready_;
  std::condition_variable progress_;
  std::deque<Work> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  bool closing_ = false;
};

// The stream a handle names. The NULL stream handles name the NULL stream of `current`;
// other handles must be live streams (INVALID_HANDLE otherwise).
CUresult find_stream(CUstream handle, Context& current, std::shared_ptr<Stream>* stream);
bool is_null_stream(CUstream handle);

}  // namespace kvtier::fakecuda
