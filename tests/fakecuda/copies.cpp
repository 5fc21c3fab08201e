// Copies and memset: validated when enqueued, executed by the stream's worker.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "tests/fakecuda/memfd.h"
#include "tests/fakecuda/streams.h"

namespace kvtier::fakecuda {
namespace {

bool fault_file_exists() {
  const std::string& path = config().fault_file;
  return !path.empty() && ::access(path.c_str(), F_OK) == 0;
}

void sleep_for_bytes(uint64_t bytes) {
  const uint64_t us = config().copy_us_per_mib * bytes / (uint64_t{1} << 20);
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

CUresult execute_segment(const Segment& segment, int memset_value, Context& context) {
  MemoryTable& memory = memory_table();
  std::vector<Range*> pinned;
  std::vector<Exporter> exporters;
  {
    auto lock = memory.lock();
    const int dst_device = segment.dst_device >= 0 ? segment.dst_device : context.device;
    const int src_device = segment.src_device >= 0 ? segment.src_device : context.device;
    CUresult e = memory.pin(segment.dst, dst_device, true, &pinned, &exporters);
    if (e == CUDA_SUCCESS && memset_value < 0) {
      e = memory.pin(segment.src, src_device, false, &pinned, &exporters);
    }
    if (e != CUDA_SUCCESS) {
      memory.unpin(&pinned);
      return e;
    }
  }
  CUresult result = CUDA_SUCCESS;
  if (config().poison_orphans) {
    // The real driver leaves memory whose exporter died undefined; here it faults.
    for (const Exporter& exporter : exporters) {
      if (process_start_time(exporter.pid) != exporter.start_time)
        result = CUDA_ERROR_ILLEGAL_ADDRESS;
    }
  }
  if (result == CUDA_SUCCESS) {
    sleep_for_bytes(segment.dst.bytes);
    auto* dst = reinterpret_cast<void*>(segment.dst.address);
    if (memset_value >= 0) {
      std::memset(dst, memset_value, segment.dst.bytes);
    } else {
      std::memmove(dst, reinterpret_cast<const void*>(segment.src.address), segment.dst.bytes);
    }
  }
  auto lock = memory.lock();
  memory.unpin(&pinned);
  return result;
}

// Resolves both sides of one copy. INVALID_VALUE when a device side leaves its memory.

// Runs `work` on the NULL stream of `context` and waits for it: the synchronous calls.
CUresult run_synchronously(Context& context, Work work) {
  std::shared_ptr<Stream> stream;
  if (CUresult e = find_stream(nullptr, context, &stream)) return e;
  work.async_copy = false;
  work.done = std::make_shared<std::promise<CUresult>>();
  std::future<CUresult> result = work.done->get_future();
  stream->enqueue(std::move(work));
  return result.get();
}

CUresult check_attributes(size_t count, const CUmemcpyAttributes* attrs, const size_t* attrsIdxs,
                          size_t numAttrs) {
  // Every copy needs attributes: attrsIdxs starts at 0, increases strictly, stays below
  // count, and there are at most count entries.
  if (attrs == nullptr || attrsIdxs == nullptr || numAttrs == 0 || numAttrs > count ||
      attrsIdxs[0] != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t k = 0; k < numAttrs; ++k) {
    if (k > 0 && attrsIdxs[k] <= attrsIdxs[k - 1]) return CUDA_ERROR_INVALID_VALUE;
    if (attrsIdxs[k] >= count) return CUDA_ERROR_INVALID_VALUE;
    const CUmemcpySrcAccessOrder order = attrs[k].srcAccessOrder;
    if (order != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM &&
        order != CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
        order != CU_MEMCPY_SRC_ACCESS_ORDER_ANY) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if ((attrs[k].flags & ~unsigned{CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE}) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

CUresult memcpy_batch(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                      CUmemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs,
                      size_t* failIdx, CUstream hStream, int abi_version) {
  if (failIdx != nullptr) *failIdx = SIZE_MAX;  // the error is not about one copy
  // Reached through dlsym on a driver too old to have it.
  if (config().driver_version < abi_version) return CUDA_ERROR_NOT_SUPPORTED;
  Context* current = nullptr;
  if (CUresult e = require_context(&current)) return e;
  // The legacy NULL stream is refused, as documented; the per-thread one too, since
  // this fake has none (and kvtier never uses a default stream).
  if (is_null_stream(hStream)) return CUDA_ERROR_INVALID_VALUE;
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult e = check_attributes(count, attrs, attrsIdxs, numAttrs)) return e;
  std::shared_ptr<Stream> stream;
  if (find_stream(hStream, *current, &stream) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = stream->context().sticky.load()) return e;
  Work work;
  work.segments.resize(count);
  size_t attribute = 0;
  const bool host_pointers_ok = config().host_pointer_for_registered;
  for (size_t i = 0; i < count; ++i) {
    while (attribute + 1 < numAttrs && attrsIdxs[attribute + 1] <= i) ++attribute;
    Segment& segment = work.segments[i];
    if (CUresult e = resolve_copy(dsts[i], srcs[i], sizes[i], false, false, &segment)) {
      if (failIdx != nullptr) *failIdx = i;
      return e;
    }
    if (!host_pointers_ok && (segment.src.range_ids.empty() || segment.dst.range_ids.empty())) {
      work.host_pointer_fault = true;
    }
    // A host source read "during the API call" may be gone when the copy runs: stage it.
    if (attrs[attribute].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
        segment.src.range_ids.empty() && sizes[i] > 0) {
      auto staged = std::make_unique<std::byte[]>(sizes[i]);
      std::memcpy(staged.get(), reinterpret_cast<const void*>(srcs[i]), sizes[i]);
      segment.src.address = reinterpret_cast<uint64_t>(staged.get());
      work.staging.push_back(std::move(staged));
    }
  }
  stream->enqueue(std::move(work));
  return CUDA_SUCCESS;
}

}  // namespace

CUresult resolve_copy(uint64_t dst, uint64_t src, uint64_t bytes, bool dst_device, bool src_device,
                      Segment* segment) {
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  if (CUresult e = memory.resolve(dst, bytes, dst_device, &segment->dst)) return e;
  return memory.resolve(src, bytes, src_device, &segment->src);
}

CUresult execute_work(Work& work, Context& context) {
  if ((work.async_copy && fault_file_exists()) || work.host_pointer_fault || work.launch_fault) {
    break_context(context, CUDA_ERROR_ILLEGAL_ADDRESS);
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  for (const Segment& segment : work.segments) {
    if (CUresult e = execute_segment(segment, work.memset_value, context)) {
      break_context(context, e);
      return e;
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace kvtier::fakecuda

using namespace kvtier::fakecuda;

FAKECUDA_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                       CUstream hStream) {
  Context* current = nullptr;
  if (CUresult e = require_context(&current)) return e;
  std::shared_ptr<Stream> stream;
  if (CUresult e = find_stream(hStream, *current, &stream)) return e;
  if (CUresult e = stream->context().sticky.load()) return e;
  Work work;
  work.segments.resize(1);
  if (CUresult e = resolve_copy(dst, src, ByteCount, false, false, &work.segments[0])) return e;
  stream->enqueue(std::move(work));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                                           CUdeviceptr srcDevice, CUcontext srcContext,
                                           size_t ByteCount, CUstream hStream) {
  Context* current = nullptr;
  if (CUresult e = require_context(&current)) return e;
  Context* dst_context = find_context(dstContext);
  Context* src_context = find_context(srcContext);
  if (dst_context == nullptr || src_context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::shared_ptr<Stream> stream;
  if (CUresult e = find_stream(hStream, *current, &stream)) return e;
  if (CUresult e = stream->context().sticky.load()) return e;
  Work work;
  work.segments.resize(1);
  // Both sides must be device memory; each is accessed by its own context's device,
  // whatever the peer access between them (the driver stages when there is none).
  if (CUresult e = resolve_copy(dstDevice, srcDevice, ByteCount, true, true, &work.segments[0])) {
    return e;
  }
  work.segments[0].dst_device = dst_context->device;
  work.segments[0].src_device = src_context->device;
  stream->enqueue(std::move(work));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                            size_t count, CUmemcpyAttributes* attrs,
                                            size_t* attrsIdxs, size_t numAttrs, size_t* failIdx,
                                            CUstream hStream) {
  return memcpy_batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream,
                      12080);
}

FAKECUDA_EXPORT CUresult cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                               size_t count, CUmemcpyAttributes* attrs,
                                               size_t* attrsIdxs, size_t numAttrs,
                                               CUstream hStream) {
  return memcpy_batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, nullptr, hStream,
                      13000);
}

FAKECUDA_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost,
                                         size_t ByteCount) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  if (ByteCount > 0 && srcHost == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Work work;
  work.segments.resize(1);
  if (CUresult e = resolve_copy(dstDevice, reinterpret_cast<uint64_t>(srcHost), ByteCount, true,
                                false, &work.segments[0])) {
    return e;
  }
  return run_synchronously(*context, std::move(work));
}

FAKECUDA_EXPORT CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  if (ByteCount > 0 && dstHost == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Work work;
  work.segments.resize(1);
  if (CUresult e = resolve_copy(reinterpret_cast<uint64_t>(dstHost), srcDevice, ByteCount, false,
                                true, &work.segments[0])) {
    return e;
  }
  return run_synchronously(*context, std::move(work));
}

FAKECUDA_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  Context* context = nullptr;
  if (CUresult e = require_context(&context)) return e;
  Work work;
  work.segments.resize(1);
  work.memset_value = uc;
  {
    MemoryTable& memory = memory_table();
    auto lock = memory.lock();
    if (CUresult e = memory.resolve(dstDevice, N, true, &work.segments[0].dst)) return e;
  }
  return run_synchronously(*context, std::move(work));
}

namespace {

// One side of a strided copy: its base address for its memory type. INVALID_VALUE for
// a type the fake does not know; NOT_SUPPORTED for arrays (it has none).
CUresult strided_base(CUmemorytype type, const void* host, CUdeviceptr device, uint64_t* base) {
  switch (type) {
    case CU_MEMORYTYPE_HOST:
      *base = reinterpret_cast<uint64_t>(host);
      return CUDA_SUCCESS;
    case CU_MEMORYTYPE_DEVICE:
    case CU_MEMORYTYPE_UNIFIED:
      *base = device;
      return CUDA_SUCCESS;
    case CU_MEMORYTYPE_ARRAY:
      return CUDA_ERROR_NOT_SUPPORTED;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// Resolves one row of a strided copy's side: a HOST side must be host memory (pageable
// or registered), a DEVICE side device memory, a UNIFIED side either.
CUresult resolve_row(CUmemorytype type, uint64_t address, uint64_t bytes, Operand* operand) {
  MemoryTable& memory = memory_table();
  auto lock = memory.lock();
  if (CUresult e = memory.resolve(address, bytes, type == CU_MEMORYTYPE_DEVICE, operand)) return e;
  if (type == CU_MEMORYTYPE_HOST && !operand->range_ids.empty()) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

}  // namespace

// Rows of WidthInBytes at their pitches, each resolved like a copy of its own: every
// row must lie inside memory of its side's type (the gaps between rows are not read).
FAKECUDA_EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  Context* current = nullptr;
  if (CUresult e = require_context(&current)) return e;
  if (pCopy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> stream;
  if (CUresult e = find_stream(hStream, *current, &stream)) return e;
  if (CUresult e = stream->context().sticky.load()) return e;
  const CUDA_MEMCPY2D& c = *pCopy;
  uint64_t src_base = 0, dst_base = 0;
  if (CUresult e = strided_base(c.srcMemoryType, c.srcHost, c.srcDevice, &src_base)) return e;
  if (CUresult e = strided_base(c.dstMemoryType, c.dstHost, c.dstDevice, &dst_base)) return e;
  // A row may not run past its pitch, and no pitch past the device's maximum.
  if (c.srcXInBytes + c.WidthInBytes > c.srcPitch || c.dstXInBytes + c.WidthInBytes > c.dstPitch ||
      c.srcPitch > static_cast<size_t>(kMaxPitch) || c.dstPitch > static_cast<size_t>(kMaxPitch)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Work work;
  if (c.WidthInBytes > 0) work.segments.resize(c.Height);
  for (size_t row = 0; row < work.segments.size(); ++row) {
    Segment& segment = work.segments[row];
    const uint64_t src = src_base + (c.srcY + row) * c.srcPitch + c.srcXInBytes;
    const uint64_t dst = dst_base + (c.dstY + row) * c.dstPitch + c.dstXInBytes;
    if (CUresult e = resolve_row(c.dstMemoryType, dst, c.WidthInBytes, &segment.dst)) return e;
    if (CUresult e = resolve_row(c.srcMemoryType, src, c.WidthInBytes, &segment.src)) return e;
  }
  stream->enqueue(std::move(work));
  return CUDA_SUCCESS;
}
