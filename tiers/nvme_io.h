// SlabIo: payload I/O on the NVMe tier's slab file — the one place the tier touches
// the disk besides RocksDB. Hidden behind an interface so that tests (and the
// daemon's hidden --fault-nvme flag) can wrap it with FaultInjectingSlabIo and fail
// the Nth write, shorten a read or flip a byte, deterministically.
//
// Implementation: open_uring_slab_io (liburing, one ring per channel, O_DIRECT where
// the file system and the alignment allow it, registered buffers over the memory the
// tier reads into and writes from).
//
// Thread-safety: run() on different channels may proceed at the same time from two
// threads; at most one thread may use a channel at a time. sync() may be called from
// any thread. The caller keeps every op's buffer alive and unchanged (writes) or
// untouched by others (reads) until run() returns.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvtier {

enum class SlabIoKind : uint8_t { kRead, kWrite };
enum class SlabIoChannel : uint8_t { kRead = 0, kWrite = 1 };
inline constexpr int kSlabIoChannels = 2;

struct SlabIoOp {
  SlabIoKind kind;
  uint64_t file_offset;
  std::byte* buffer;  // host memory; read into, or written from
  uint64_t bytes;
};

struct SlabIoResult {
  Status status;
  bool short_transfer = false;  // the file ended before all bytes moved (DataLoss)
};

class SlabIo {
 public:
  virtual ~SlabIo() = default;
  // Runs `ops` with a bounded number in flight, submitting them in batches, and blocks
  // until all completed. results[i] (REQUIRES results.size() == ops.size()) is op i's
  // outcome: OK only when all of its bytes moved; a transfer that hits the end of the
  // file is DataLoss with short_transfer set; I/O errors come through errno_status.
  virtual void run(SlabIoChannel channel, std::span<const SlabIoOp> ops,
                   std::span<SlabIoResult> results) = 0;
  // Makes every write that run() completed so far durable (fdatasync).
  [[nodiscard]] virtual Status sync() = 0;
  // "io_uring, O_DIRECT, queue depth 32, registered buffers", for the log.
  virtual std::string describe() const = 0;
  // Registers host memory that ops' buffers will lie in (fixed buffers), when that was
  // not done at open (SlabFileOptions::buffers) and the kernel lets us; ops outside it
  // still work, unregistered. REQUIRES: no run() in progress or started until it
  // returns. Default: nothing to register.
  virtual void register_buffers(std::vector<std::span<std::byte>> buffers) { (void)buffers; }
};

struct SlabFileOptions {
  std::string path;           // the slab file; created when missing
  uint64_t size_bytes = 0;    // preallocated (fallocate) to at least this size
  unsigned queue_depth = 32;  // ops in flight per channel
  // Host memory the ops' buffers lie in, registered with each ring (fixed buffers)
  // when the kernel lets us; ops outside it still work, unregistered.
  std::vector<std::span<std::byte>> buffers;
  bool allow_direct_io = true;  // false: always buffered (tests, benchmarks)
};

Result<std::unique_ptr<SlabIo>> open_uring_slab_io(const SlabFileOptions& options);

// One fault to inject, parsed from "KIND:N[+|-M][:ERRNO]":
//   write:N:ERR     the Nth write op fails with errno ERR (ENOSPC, EIO, or a number)
//   read:N:ERR      the Nth read op fails with errno ERR
//   shortread:N     the Nth read op reads only half of its bytes and reports a short read
//   flip:N          the Nth read op succeeds but one byte of its buffer is flipped
//   sync:N:ERR      the Nth sync fails with errno ERR
//   index:N:ERR     the Nth index operation (a RocksDB write, or an attempt to heal the
//                   index) fails inside RocksDB's file layer with errno ERR, so RocksDB
//                   itself meets the error (nvme_index.h)
// "N+" instead of N applies the fault to the Nth op and every later one; "N-M" to ops N
// through M, after which the disk works again. Counting starts at 1 and runs over the
// life of the wrapper, across channels.
struct SlabIoFault {
  enum class Kind : uint8_t { kWrite, kRead, kShortRead, kFlip, kSync, kIndex };
  Kind kind;
  uint64_t nth = 1;
  uint64_t last = 1;  // the last op it applies to (UINT64_MAX: every later one)
  int error = 0;      // errno for kWrite, kRead, kSync, kIndex
  bool applies_to(uint64_t count) const { return count >= nth && count <= last; }
};
Result<SlabIoFault> parse_slab_io_fault(const std::string& spec);

// Forwards to `inner` except where a fault says otherwise.
class FaultInjectingSlabIo final : public SlabIo {
 public:
  FaultInjectingSlabIo(std::unique_ptr<SlabIo> inner, std::vector<SlabIoFault> faults)
      : inner_(std::move(inner)), faults_(std::move(faults)) {}

  void run(SlabIoChannel channel, std::span<const SlabIoOp> ops,
           std::span<SlabIoResult> results) override;
  Status sync() override;
  std::string describe() const override { return inner_->describe() + ", with injected faults"; }
  void register_buffers(std::vector<std::span<std::byte>> buffers) override {
    inner_->register_buffers(std::move(buffers));
  }

 private:
  // The fault that applies to the op counted `count` of `kinds`, if any.
  const SlabIoFault* match(std::initializer_list<SlabIoFault::Kind> kinds, uint64_t count) const;

  const std::unique_ptr<SlabIo> inner_;
  const std::vector<SlabIoFault> faults_;
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> reads_{0};
  std::atomic<uint64_t> syncs_{0};
};

}  // namespace kvtier
