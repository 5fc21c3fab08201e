// Streams, events, and the context-wide synchronization.
#include "tests/fakecuda/streams.h"

#include <algorithm>
#include <thread>
#include <unordered_map>

namespace kvtier::fakecuda {
namespace {

struct Event {
  Context* context = nullptr;      // current when it was created
  std::shared_ptr<Stream> stream;  // nullptr until recorded
  uint64_t sequence = 0;
};

struct StreamTable {
  std::mutex mu;  // protects the fields below
  std::unordered_map<CUstream, std::shared_ptr<Stream>> streams;
  std::shared_ptr<Stream> null_streams[kMaxDevices];
  std::unordered_map<CUevent, std::unique_ptr<Event>> events;
};

StreamTable& table() {
  static StreamTable* streams = new StreamTable;  // leaked: workers may outlive main()
  return *streams;
}

CUstream stream_handle(Stream* stream) {
  return reinterpret_cast<CUstream>(stream);
}

std::shared_ptr<Stream> null_stream(Context& context) {
  StreamTable& t = table();
  std::lock_guard lock(t.mu);
  std::shared_ptr<Stream>& stream = t.null_streams[context.device];
  if (stream == nullptr) {
    stream = std::make_shared<Stream>(context, kLeastStreamPriority);
    stream->start();
  }
  return stream;
}

// The event behind a handle, copied out under the lock.
CUresult find_event(CUevent handle, Event* event) {
  StreamTable& t = table();
  std::lock_guard lock(t.mu);
  auto it = t.events.find(handle);
  if (it == t.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  *event = *it->second;
  return CUDA_SUCCESS;
}

}  // namespace

Stream::Stream(Context& context, int priority) : context_(context), priority_(priority) {}

void Stream::start() {
  std::thread([self = shared_from_this()] { self->run(); }).detach();
}

uint64_t Stream::enqueue(Work work) {
  uint64_t sequence = 0;
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(work));
    sequence = ++enqueued_;
  }
  work_ready_.notify_one();
  return sequence;
}

uint64_t Stream::last_sequence() {
  std::lock_guard lock(mu_);
  return enqueued_;
}

bool Stream::reached(uint64_t sequence) {
  std::lock_guard lock(mu_);
  return completed_ >= sequence;
}

void Stream::wait(uint64_t sequence) {
  std::unique_lock lock(mu_);
  progress_.wait(lock, [&] { return completed_ >= sequence; });
}

void Stream::close() {
  {
    std::lock_guard lock(mu_);
    closing_ = true;
  }
  work_ready_.notify_one();
}

void Stream::run() {
  while (true) {
    Work work;
    {
      std::unique_lock lock(mu_);
      work_ready_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    const CUresult sticky = context_.sticky.load();
    const CUresult result = sticky != CUDA_SUCCESS ? sticky : execute_work(work, context_);
    if (work.done != nullptr) work.done->set_value(result);
    work = Work();  // staging buffers go before the work counts as done
    {
      std::lock_guard lock(mu_);
      ++completed_;
    }
    progress_.notify_all();
  }
}

bool is_null_stream(CUstream handle) {
  return handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD;
}

CUresult find_stream(CUstream handle, Context& current, std::shared_ptr<Stream>* stream) {
  if (is_null_stream(handle)) {
    *stream = null_stream(current);
    return CUDA_SUCCESS;
  }
  StreamTable& t = table();
  std::lock_guard lock(t.mu);
  auto it = t.streams.find(handle);
  if (it == t.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  *stream = it->second;
  return CUDA_SUCCESS;
}

}  // namespace kvtier::fakecuda

using namespace kvtier::fakecuda;

FAKECUDA_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                                    int priority) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  if (phStream == nullptr || (flags & ~unsigned{CU_STREAM_NON_BLOCKING}) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Out-of-range priorities are clamped, as documented.
  priority = std::clamp(priority, kGreatestStreamPriority, kLeastStreamPriority);
  auto stream = std::make_shared<Stream>(*context, priority);
  stream->start();
  StreamTable& t = table();
  std::lock_guard lock(t.mu);
  *phStream = stream_handle(stream.get());
  t.streams.emplace(*phStream, std::move(stream));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  if (CUresult e = require_init()) return e;
  StreamTable& t = table();
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard lock(t.mu);
    auto it = t.streams.find(hStream);
    if (it == t.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (CUresult e = it->second->context().sticky.load()) return e;
    stream = std::move(it->second);
    t.streams.erase(it);
  }
  stream->close();  // queued work still completes, as documented
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  std::shared_ptr<Stream> stream;
  if (is_null_stream(hStream)) {
    Context* context = nullptr;
    if (CUresult e = require_context(&context)) return e;
    if (CUresult e = find_stream(hStream, *context, &stream)) return e;
  } else {
    if (CUresult e = require_init()) return e;
    StreamTable& t = table();
    std::lock_guard lock(t.mu);
    auto it = t.streams.find(hStream);
    if (it == t.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    stream = it->second;
  }
  stream->wait(stream->last_sequence());
  return stream->context().sticky.load();
}

FAKECUDA_EXPORT CUresult cuCtxSynchronize() {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  std::vector<std::shared_ptr<Stream>> streams{null_stream(*context)};
  {
    StreamTable& t = table();
    std::lock_guard lock(t.mu);
    for (const auto& [handle, stream] : t.streams) {
      if (&stream->context() == context) streams.push_back(stream);
    }
  }
  for (const auto& stream : streams) stream->wait(stream->last_sequence());
  return context->sticky.load();
}

FAKECUDA_EXPORT CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  constexpr unsigned kKnown =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (phEvent == nullptr || (Flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  // An interprocess event must be created with timing disabled.
  if ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto event = std::make_unique<Event>();
  event->context = context;
  StreamTable& t = table();
  std::lock_guard lock(t.mu);
  *phEvent = reinterpret_cast<CUevent>(event.get());
  t.events.emplace(*phEvent, std::move(event));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  Context* current = nullptr;
  if (CUresult e = require_context(&current)) return e;
  std::shared_ptr<Stream> stream;
  if (CUresult e = find_stream(hStream, *current, &stream)) return e;
  if (CUresult e = stream->context().sticky.load()) return e;
  StreamTable& t = table();
  std::lock_guard lock(t.mu);
  auto it = t.events.find(hEvent);
  if (it == t.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  // The event and the stream must belong to the same context.
  if (it->second->context != &stream->context()) return CUDA_ERROR_INVALID_HANDLE;
  it->second->sequence = stream->last_sequence();
  it->second->stream = std::move(stream);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuEventQuery(CUevent hEvent) {
  if (CUresult e = require_init()) return e;
  Event event;
  if (CUresult e = find_event(hEvent, &event)) return e;
  if (CUresult e = event.context->sticky.load()) return e;
  if (event.stream == nullptr) return CUDA_SUCCESS;  // never recorded
  return event.stream->reached(event.sequence) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKECUDA_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  if (CUresult e = require_init()) return e;
  Event event;
  if (CUresult e = find_event(hEvent, &event)) return e;
  if (event.stream != nullptr) event.stream->wait(event.sequence);
  return event.context->sticky.load();
}

FAKECUDA_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
  if (CUresult e = require_init()) return e;
  StreamTable& t = table();
  std::lock_guard lock(t.mu);
  auto it = t.events.find(hEvent);
  if (it == t.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult e = it->second->context->sticky.load()) return e;
  t.events.erase(it);
  return CUDA_SUCCESS;
}
