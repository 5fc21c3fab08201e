// StorageTier: one level of the hierarchy as the move executor (move_executor.h) sees
// it, whether its bytes are memory the Device copies (the HBM arena, the RAM pool) or
// a file a worker reads and writes (NVMe). In the spirit of RocksDB's SecondaryCache:
// asynchronous writes that may decline, asynchronous reads whose completion says
// whether the bytes are good, a capacity, and optional operations that default to
// NotSupported.
//
// Slots are not the tier's in the local tiers: BlockStore allocates them in HBM, RAM and
// NVMe, and the executor names the slot each write or read uses. What a tier decides is
// how bytes get in and out, and when a slot it gave up may be handed out again
// (release_is_durable). A key-addressed tier (the remote tier, tiers/remote_tier.h)
// has no slots: it stores each block under its key, Slot::offset means nothing there,
// and the block store does not index it.
//
// Thread-safety: methods are called on the control thread; `done` callbacks may run
// on any thread (a worker) and must only hand the result back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/block_key.h"
#include "common/status.h"
#include "device/device.h"

namespace kvtier {

// Blocks read out of a tier that is not memory into host buffers of their own (to be
// written to another tier) go into O_DIRECT-friendly buffers, in reads of at most
// kBlocksPerBufferedRead blocks.
constexpr uint64_t kIoBufferAlignment = 4096;
constexpr size_t kBlocksPerBufferedRead = 32;
// The size of such a buffer for `bytes` of blocks (rounded up to the alignment).
constexpr uint64_t io_buffer_bytes(uint64_t bytes) {
  return (bytes + kIoBufferAlignment - 1) / kIoBufferAlignment * kIoBufferAlignment;
}
// A buffer of `bytes` (an io_buffer_bytes() size); null when memory is short.
std::shared_ptr<std::byte> allocate_io_buffer(uint64_t bytes);

// A tier's answer made one entry per item asked, whatever the tier sent: entries missing
// become `missing` and extra ones are dropped (and the mismatch is logged), so a tier
// that miscounts can neither leave blocks waiting for good nor be read past its end.
void log_tier_miscount(size_t answered, size_t asked);
template <typename T>
void fit_answer(std::vector<T>& answer, size_t asked, const T& missing) {
  if (answer.size() == asked) return;
  log_tier_miscount(answer.size(), asked);
  answer.resize(asked, missing);
}

class StorageTier {
 public:
  struct Slot {
    BlockKey key;
    uint64_t offset = 0;  // in the tier (BlockLocation::offset)
    uint64_t bytes = 0;
  };
  struct WriteItem {
    Slot slot;
    const std::byte* source;       // the block's bytes in host memory
    uint64_t last_access_wall_ms;  // kept with the block where the tier persists it
  };
  struct ReadItem {
    Slot slot;
    std::byte* destination;  // host memory
  };
  struct ReadOutcome {
    Status status;
    // The stored bytes are known bad or gone (checksum mismatch, short read, no
    // record of the slot): the block must be dropped. False for errors that may pass.
    bool corrupt = false;
  };

  virtual ~StorageTier() = default;

  virtual Tier id() const = 0;
  virtual uint64_t capacity_bytes() const = 0;

  // The memory behind the tier when the Device copies its bytes (HBM, RAM); nullptr
  // for a tier that is not memory.
  virtual const std::shared_ptr<Memory>& memory() const;
  // A slot's bytes where the CPU can address them (RAM; HBM on the host backend), or
  // nullptr (GPU memory, files).
  std::byte* host_address(uint64_t offset) const;

  // Addressed by key rather than by a slot the block store allocated.
  virtual bool key_addressed() const { return false; }
  // Whether the tier can be reached now (a remote tier's connection); work for one
  // that cannot is not started.
  virtual bool reachable() const { return true; }

  // Writes blocks from host memory into their slots; `done` gets one status per item.
  // An OK item is readable (in a persistent tier: it survives a crash). The sources
  // must stay valid and unchanged until `done`. Default: every item NotSupported
  // (memory tiers are written by Device copies).
  virtual void write(std::vector<WriteItem> items, std::function<void(std::vector<Status>)> done);
  // Reads blocks into host memory; a block whose bytes do not verify is DataLoss with
  // `corrupt` set, and its destination must not be used; one that is not there is
  // NotFound. Default: NotSupported.
  virtual void read(std::vector<ReadItem> items,
                    std::function<void(std::vector<ReadOutcome>)> done);
  // The same, for a tier that may decline (a bound on the bytes in flight): false when
  // it did, and then nothing was queued and `done` never runs. Default: write()/read(),
  // never declined.
  virtual bool try_write(std::vector<WriteItem> items,
                         std::function<void(std::vector<Status>)> done);
  virtual bool try_read(std::vector<ReadItem> items,
                        std::function<void(std::vector<ReadOutcome>)> done);
  // Whether each block is stored (true), is not (false), or why that is not known.
  // Never declined. Default: every item NotSupported.
  virtual void probe(std::vector<Slot> slots, std::function<void(std::vector<Result<bool>>)> done);

  // False while the tier refuses writes for a while (a degraded NVMe tier, read-only
  // until it heals): moves into it are not started, and room is made by other means.
  // Reads go on. Default: true.
  virtual bool writable() const { return true; }

  // Whether a slot this tier gave up may be reused only after release() (a persistent
  // index may still name it until then). False: reusable at once.
  virtual bool release_is_durable() const { return false; }
  // Forgets the blocks in `slots` durably; after `done` with OK the slots may be
  // reused. Default: nothing to forget.
  virtual void release(std::vector<Slot> slots, std::function<void(Status)> done);
};

// The HBM arena or the RAM pool: memory from the Device, copied by the Device.
class MemoryTier final : public StorageTier {
 public:
  MemoryTier(Tier id, std::shared_ptr<Memory> memory) : id_(id), memory_(std::move(memory)) {}
  Tier id() const override { return id_; }
  uint64_t capacity_bytes() const override { return memory_->size_bytes(); }
  const std::shared_ptr<Memory>& memory() const override { return memory_; }

 private:
  Tier id_;
  std::shared_ptr<Memory> memory_;
};

}  // namespace kvtier
