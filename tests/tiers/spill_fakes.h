// Fakes for the executor's tests of what goes to the key-addressed tier (spills, copies
// out): an NVMe tier whose slots' bytes are a map, and a spill tier that holds blocks by
// key and keeps accepted writes in flight until the test completes them.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/block_key.h"
#include "common/status.h"
#include "tests/tiers/test_memory.h"
#include "tiers/block_store.h"
#include "tiers/tier.h"

namespace kvtier::tiers_test::spill_fakes {

using Bytes = std::vector<std::byte>;

constexpr LayoutKey kLayout{1, 0x5b};
constexpr uint64_t kBlockBytes = 4096;
constexpr uint64_t kNvmeBytes = 16 * kBlockBytes;
constexpr uint64_t kWallClockOffsetMs = 1'000'000;  // wall_ms_of(steady) = steady + this
constexpr uint64_t kRecoveredAccessMs = 100;

// Block n's bytes: a pattern no other block shares.
inline Bytes contents_of(uint32_t n) {
  Bytes bytes(kBlockBytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte((n * 131 + i * 7) & 0xff);
  return bytes;
}

// The NVMe tier: slots' bytes in a map by offset, reads answered at once, releases OK.
class FakeNvmeTier final : public StorageTier {
 public:
  Tier id() const override { return Tier::kNvme; }
  uint64_t capacity_bytes() const override { return kNvmeBytes; }
  bool release_is_durable() const override { return true; }

  void read(std::vector<ReadItem> items,
            std::function<void(std::vector<ReadOutcome>)> done) override {
    std::vector<ReadOutcome> outcomes;
    for (const ReadItem& item : items) {
      const auto found = bytes_at_offset.find(item.slot.offset);
      if (unreadable.contains(item.slot.key)) {
        outcomes.push_back({unavailable("injected read failure"), false});
      } else if (found == bytes_at_offset.end() || found->second.size() != item.slot.bytes) {
        outcomes.push_back({not_found("no block at offset {}", item.slot.offset), true});
      } else {
        std::memcpy(item.destination, found->second.data(), item.slot.bytes);
        outcomes.push_back({Status::ok(), false});
      }
    }
    done(std::move(outcomes));
  }
  void release(std::vector<Slot> slots, std::function<void(Status)> done) override {
    released_slots += slots.size();
    done(Status::ok());
  }

  std::unordered_map<uint64_t, Bytes> bytes_at_offset;
  std::unordered_set<BlockKey, BlockKeyHasher> unreadable;
  size_t released_slots = 0;
};

// The spill tier: blocks by key. probe() answers at once; an accepted try_write is held
// in flight (its sources must stay valid) until complete_writes() stores the bytes and
// answers.
class FakeSpillTier final : public StorageTier {
 public:
  Tier id() const override { return Tier::kRemote; }
  uint64_t capacity_bytes() const override { return 0; }
  bool key_addressed() const override { return true; }
  bool reachable() const override { return reachable_now; }

  void probe(std::vector<Slot> slots,
             std::function<void(std::vector<Result<bool>>)> done) override {
    std::vector<Result<bool>> found;
    for (const Slot& slot : slots) {
      probed.push_back(slot.key);
      found.emplace_back(stored.contains(slot.key));
    }
    if (miscount && !found.empty()) found.pop_back();  // a tier that answers short
    done(std::move(found));
  }
  // Reads are held in flight (their destinations must stay reserved) until
  // complete_reads() copies the stored bytes and answers (NotFound for a key not stored).
  bool try_read(std::vector<ReadItem> items,
                std::function<void(std::vector<ReadOutcome>)> done) override {
    if (decline_reads) return false;
    for (const ReadItem& item : items) read_attempts.push_back(item.slot.key);
    reads_in_flight.push_back({std::move(items), std::move(done)});
    return true;
  }
  void complete_reads() {
    auto batches = std::move(reads_in_flight);
    reads_in_flight.clear();
    for (auto& [items, done] : batches) {
      std::vector<ReadOutcome> outcomes;
      for (const ReadItem& item : items) {
        const auto found = stored.find(item.slot.key);
        if (found == stored.end() || found->second.size() != item.slot.bytes) {
          outcomes.push_back({not_found("not in the spill tier"), false});
          continue;
        }
        std::memcpy(item.destination, found->second.data(), item.slot.bytes);
        outcomes.push_back({Status::ok(), false});
      }
      done(std::move(outcomes));
    }
  }
  bool try_write(std::vector<WriteItem> items,
                 std::function<void(std::vector<Status>)> done) override {
    if (decline_writes) return false;
    for (const WriteItem& item : items) write_attempts.push_back(item.slot.key);
    writes_in_flight.push_back({std::move(items), std::move(done)});
    return true;
  }

  void complete_writes() {
    auto batches = std::move(writes_in_flight);
    writes_in_flight.clear();
    for (auto& [items, done] : batches) {
      std::vector<Status> statuses;
      for (const WriteItem& item : items) {
        if (failing_writes.contains(item.slot.key)) {
          statuses.push_back(unavailable("injected write failure"));
          continue;
        }
        stored[item.slot.key] = Bytes(item.source, item.source + item.slot.bytes);
        stored_wall_ms[item.slot.key] = item.last_access_wall_ms;
        statuses.push_back(Status::ok());
      }
      if (miscount) statuses.push_back(Status::ok());  // and long
      done(std::move(statuses));
    }
  }

  bool reachable_now = true;
  bool decline_writes = false;
  bool decline_reads = false;
  bool miscount = false;  // probe answers one short, writes one long
  std::unordered_set<BlockKey, BlockKeyHasher> failing_writes;
  std::unordered_map<BlockKey, Bytes, BlockKeyHasher> stored;
  std::unordered_map<BlockKey, uint64_t, BlockKeyHasher> stored_wall_ms;
  std::vector<BlockKey> probed;
  std::vector<BlockKey> write_attempts;  // every block try_write accepted
  std::vector<BlockKey> read_attempts;   // every block try_read accepted
  std::vector<std::pair<std::vector<ReadItem>, std::function<void(std::vector<ReadOutcome>)>>>
      reads_in_flight;
  std::vector<std::pair<std::vector<WriteItem>, std::function<void(std::vector<Status>)>>>
      writes_in_flight;
};

// The control thread a test drives by hand: what the executor posts waits here.
class ControlThread {
 public:
  // A poster for MoveExecutor::Hooks::control_thread.
  std::function<void(std::function<void()>)> poster() {
    return [this](std::function<void()> fn) { queue_.push_back(std::move(fn)); };
  }
  // Runs what was posted, and what that posts, until none is left.
  void drain() {
    while (!queue_.empty()) {
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      fn();
    }
  }

 private:
  std::deque<std::function<void()>> queue_;
};

// Completes the spill tier's writes and reads, running the control thread after each,
// until nothing is posted or in flight.
inline void run_until_settled(ControlThread& control, FakeSpillTier& spill) {
  control.drain();
  while (!spill.writes_in_flight.empty() || !spill.reads_in_flight.empty()) {
    spill.complete_writes();
    spill.complete_reads();
    control.drain();
  }
}

// Block n, recovered into NVMe slot n of `store` with its bytes in `nvme`.
inline BlockKey recover_on_nvme(BlockStore& store, FakeNvmeTier& nvme, uint32_t n) {
  const BlockKey key = key_of(kLayout, n);
  const uint64_t offset = n * kBlockBytes;
  EXPECT_TRUE(store.insert_recovered(key, {Tier::kNvme, offset}, kRecoveredAccessMs).is_ok());
  nvme.bytes_at_offset[offset] = contents_of(n);
  return key;
}

}  // namespace kvtier::tiers_test::spill_fakes
