// CudaDevice: the Device backend for NVIDIA GPUs, on the CUDA driver API only
// (cuda/driver_api.h: libcuda.so.1 loaded at run time, no CUDA runtime).
//
// GPUs: one kvtierd serves every GPU of the node it is told to (`--gpus all` or a list
// of UUIDs). For each it retains the primary context (made current on every thread
// that calls CUDA), creates its own streams and owns a part of the HBM arena. Engines
// name their GPU by UUID in RegisterRegion.
//
// Regions: legacy CUDA IPC handles, opened at the allocation base and offset by the
// engine's `offset_bytes` (checked against the allocation's size), and CUDA VMM
// regions (PyTorch expandable segments): N shareable fds, imported and mapped back to
// back into one reserved address range, access set once, the region starting
// `offset_bytes` into the first chunk. The importer's mapping keeps VMM memory alive
// even if the engine frees it, which legacy IPC does not.
//
// Arena: one reserved address range holding `bytes_per_gpu` of cuMemCreate memory
// from each GPU in turn, so the daemon addresses it as one Memory. RAM pool: mmap on
// the GPUs' NUMA node, faulted in by several threads, then cuMemHostRegister'ed.
//
// Copies: per GPU, one stream per (direction, priority). A batch's segments are
// merged where contiguous and go out per stream as one cuMemcpyBatchAsync (driver
// ≥ 12.8) or one cuMemcpyAsync each; each stream has its own completion thread, so a
// batch completes when its own streams are done and never waits for another stream's
// work (no head-of-line blocking between a Load and a background demotion). Background
// batches are issued in pieces of at most `background_piece_bytes`, each after the
// previous finished, so the copy engines are never queued deep with background work.
//
// Errors: a sticky error (the context is lost) fails the batch with DataLoss and calls
// the fatal-error handler once; every later submit fails with Unavailable.
//
// Thread-safety: as Device. Ownership: regions close their mappings when their last
// shared_ptr goes, which is after every copy that used them completed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device/device.h"

namespace kvtier {

struct CudaDeviceOptions {
  // GPUs to serve: empty = every GPU the driver shows; else their UUIDs ("GPU-…").
  std::vector<std::string> gpu_uuids;
  int pool_touch_threads = 4;                     // parallel first touch of the pinned pool
  uint64_t background_piece_bytes = 64ull << 20;  // at most this much background copying
                                                  // queued per stream at a time
  // Equal-size copies at constant strides (a block's planes) go out as one
  // cuMemcpy2DAsync each instead of one batch entry per plane (copy_lane.h). Off only
  // to measure what it gains (kvtier-bench gpu).
  bool strided_copies = true;
};

// Unavailable ("no CUDA driver: …" / "no CUDA device") when there is no driver or no
// GPU; InvalidArgument when a UUID in `gpu_uuids` is not on this machine.
Result<std::unique_ptr<Device>> make_cuda_device(const CudaDeviceOptions& options);

}  // namespace kvtier
