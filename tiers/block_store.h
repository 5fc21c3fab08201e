// BlockStore: the block index. It maps (namespace, layout digest, block hash) to where
// the block's bytes live (tier + slot offset), and owns the slot allocators of the
// tiers that hold bytes in daemon memory (HBM arena, RAM pool).
//
// Life of a block:
//   reserve (state kWriting, invisible to lookups, pinned; the caller holds a
//   PendingWrite) → PendingWrite::commit (kReady, visible) … PinnedBlock handles from
//   pin() around reads … begin_move (kMoving: still readable at its old place; the
//   caller holds a PendingMove) → PendingMove::commit (now at the new place; the old
//   slot is freed once no reader pins it) … evict (gone, slot freed).
// Two-phase publish: a block is visible to lookup() only after its PendingWrite
// committed.
//
// Callers' pins are handles (PinnedBlock, PendingWrite, PendingMove, as LevelDB's
// Cache::Handle): each gives its pin up exactly once — reset/commit/abort, destruction,
// or being assigned over — so no path can forget one. Handles belong to the control
// thread, like the store, and should be released before the store is destroyed; see
// PinnedBlock.
//
// Every block also counts session references (sessions hold blocks; blocks with no
// references stay as a prefix cache until evicted).
//
// Persistent tiers (NVMe): a tier may have no Memory, only a capacity; its slots are
// offsets in a slab file that the caller reads and writes. Such a tier is configured
// with confirm_release: a slot it gives up is not reusable until the caller has
// durably deleted the index entry naming it — take_pending_releases() hands out those
// slots, confirm_release() frees them. Blocks found on disk at start-up come back
// with insert_recovered().
//
// Copies (a durable tier configured with keep_copies, i.e. NVMe inclusive below RAM):
// when a block moves up out of such a tier and the move succeeds, its old slot is not
// given up but kept as the block's copy: the slot stays allocated (its index entry
// keeps naming it, so after a crash the block is recovered from there) and counts in
// the tier's used bytes (TierUsage::copy_bytes says how many of them are copies).
// Blocks are immutable, so a copy stays valid for as long as the block exists. The
// rules:
//  - A block has at most one copy, in a tier below the one it lives in. A copy's slot
//    is never handed to another block while the copy exists; it is given up only
//    through the tier's durable release (a PendingRelease, like an evicted block's).
//  - A copy is kept only when no reader pinned the block at its old slot (else that
//    slot goes as it did before copies), so no handle ever names a copy's slot.
//  - demote_onto_copy(): the block's place becomes its copy's slot and its old slot is
//    freed; nothing is written. begin_move() into the copy's tier is refused.
//  - Copies are redundant, so they go first when the tier needs room: drop_copies()
//    gives them up, oldest made first (a copy is made at a promotion, an access, so
//    this is roughly least recently accessed first), pinned blocks' copies too.
//  - evict() gives up the block's copy with its slot.
// Lookups of blocks without a copy cost nothing extra: an Entry flag says whether the
// side table of copies has one.
//
// Thread-safety: none. The control thread owns the store and its handles; copies run
// elsewhere and report back to the control thread, which commits or aborts the
// writes, releases the pins and finishes the moves.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/block_key.h"
#include "common/status.h"
#include "device/device.h"
#include "policy/block_events.h"
#include "tiers/block_table.h"
#include "tiers/slab_allocator.h"

namespace kvtier {

enum class BlockState : uint8_t {
  kWriting,  // slot reserved, bytes being copied in; not visible
  kReady,    // visible and readable
  kMoving,   // readable at its current place while a copy to another tier runs
};

// Where a block's bytes are.
struct BlockLocation {
  Tier tier = Tier::kNone;
  uint64_t offset = 0;  // slot offset within the tier's memory
};

class BlockStore;

namespace detail {

// How a handle reaches its store. The store owns the anchor; when the store is
// destroyed while handles remain, it leaves the anchor to them (store = nullptr) and
// the last of them frees it.
struct StoreAnchor {
  BlockStore* store = nullptr;  // nullptr once the store is destroyed
  uint64_t handles = 0;         // live handles pointing here
};

// What PinnedBlock and PendingWrite share: the store, the block and the place it held
// when the handle was made. Move-only; empty once released or moved from.
class BlockHandle {
 public:
  BlockHandle(const BlockHandle&) = delete;
  BlockHandle& operator=(const BlockHandle&) = delete;

  // Whether the handle holds its block.
  explicit operator bool() const { return anchor_ != nullptr; }
  // REQUIRES: the handle holds its block.
  const BlockKey& key() const { return key_; }
  const BlockLocation& location() const { return location_; }

 protected:
  BlockHandle() = default;
  BlockHandle(StoreAnchor& anchor, const BlockKey& key, const BlockLocation& location);
  BlockHandle(BlockHandle&& other) noexcept;
  // REQUIRES: *this is empty (the derived class released it first).
  BlockHandle& operator=(BlockHandle&& other) noexcept;
  ~BlockHandle() = default;
  // Empties the handle. Returns the store to release the block in, or nullptr when the
  // handle was empty or the store is gone.
  BlockStore* detach();

 private:
  StoreAnchor* anchor_ = nullptr;
  BlockKey key_;
  BlockLocation location_;
};

}  // namespace detail

// A read pin on one visible block, from BlockStore::pin(). While it is held the slot at
// location() is neither freed nor reused: evict() refuses a pinned block, and a block
// moved meanwhile keeps its old slot until its last pin goes. location() is where the
// block was when pinned, so it always names the bytes this pin protects.
//
// Released exactly once: by reset(), destruction, or being assigned over. Moving
// transfers the pin and leaves the source empty; a handle cannot be copied.
//
// Lifetime and threads: a handle belongs to the control thread, like its store, and
// must be released there. Release it before the store is destroyed (the daemon's
// copies release their pins in their completions; Service declares everything that
// holds pins after its store, so those go first). A handle that still outlives its
// store — a completion the event loop dropped unrun when it stopped — releases
// nothing and touches only the anchor it shares with the store, never freed memory.
class PinnedBlock : public detail::BlockHandle {
 public:
  PinnedBlock() = default;
  PinnedBlock(PinnedBlock&&) noexcept = default;
  PinnedBlock& operator=(PinnedBlock&& other) noexcept;
  ~PinnedBlock() { reset(); }

  // Unpins (when the block's last pin goes, an old slot of a move is freed). No-op on
  // an empty handle.
  void reset();

 private:
  friend class BlockStore;
  PinnedBlock(detail::StoreAnchor& anchor, const BlockKey& key, const BlockLocation& location)
      : BlockHandle(anchor, key, location) {}
};

// The writer's hold on a block reserve() inserted: kWriting, invisible to lookups,
// pinned, its slot at location(). commit() publishes it once its bytes have landed;
// abort() removes it and frees its slot. A PendingWrite given up neither way —
// destroyed or assigned over — aborts, so a reserved block is never left unpublished.
// Move-only, with PinnedBlock's lifetime and thread rules.
class PendingWrite : public detail::BlockHandle {
 public:
  PendingWrite() = default;
  PendingWrite(PendingWrite&&) noexcept = default;
  PendingWrite& operator=(PendingWrite&& other) noexcept;
  ~PendingWrite() { abort(); }

  // The copy into the slot completed: the block becomes kReady (visible) and loses the
  // writer's pin. No-op on an empty handle.
  void commit();
  // The copy failed or never ran: the block is removed and its slot freed. No-op on an
  // empty handle.
  void abort();

 private:
  friend class BlockStore;
  PendingWrite(detail::StoreAnchor& anchor, const BlockKey& key, const BlockLocation& location)
      : BlockHandle(anchor, key, location) {}
};

// A move begin_move() started: the block is kMoving, still readable (and pinned by the
// move) at from(), its destination slot reserved at location(). commit() makes the
// destination its place once the bytes landed there; abort() frees the destination and
// leaves the block where it was. A PendingMove given up neither way — destroyed or
// assigned over — aborts, so a block is never left moving. Move-only, with
// PinnedBlock's lifetime and thread rules.
class PendingMove : public detail::BlockHandle {
 public:
  PendingMove() = default;
  PendingMove(PendingMove&& other) noexcept : BlockHandle(std::move(other)), from_(other.from_) {}
  PendingMove& operator=(PendingMove&& other) noexcept;
  ~PendingMove() { abort(); }

  // Where the block is until the move commits.
  const BlockLocation& from() const { return from_; }
  // The bytes landed at location(): the block lives there now. No-op on an empty handle.
  void commit();
  // The copy failed or never ran: the destination is freed. No-op on an empty handle.
  void abort();

 private:
  friend class BlockStore;
  PendingMove(detail::StoreAnchor& anchor, const BlockKey& key, const BlockLocation& to,
              const BlockLocation& from)
      : BlockHandle(anchor, key, to), from_(from) {}
  BlockLocation from_;
};

// A read-only view of one block for callers outside the store.
struct BlockInfo {
  BlockState state;
  BlockLocation location;
  uint32_t pins;
  uint32_t session_refs;
  uint64_t last_access_ms;
  bool has_copy = false;  // a copy in a durable tier below (BlockStore::copy_of)
};

struct TierUsage {
  Tier tier;
  uint64_t capacity_bytes;
  uint64_t used_bytes;  // copies included
  uint64_t blocks;      // blocks living here (copies not included)
  uint64_t copy_bytes = 0;
  uint64_t copies = 0;
  uint64_t writing_bytes = 0;  // of used_bytes: blocks reserve() placed, still being written
};

class BlockStore {
 public:
  struct TierMemory {
    Tier tier;
    std::shared_ptr<Memory> memory;  // the arena or pool from the Device; null for NVMe
    uint64_t slab_bytes;             // carving unit (clamped to the memory size)
    uint64_t capacity_bytes = 0;     // size of a tier without memory (NVMe)
    bool confirm_release = false;    // freed slots wait for confirm_release()
    uint32_t parts = 1;              // equal parts (the arena: one per GPU; SlabAllocator)
    bool keep_copies = false;        // a block moving up keeps its slot here as a copy
                                     // (only with confirm_release)
  };
  // Tiers in order from fastest (HBM) to slowest.
  explicit BlockStore(std::vector<TierMemory> tiers);
  // Handles still held are cut loose (logged): they release nothing afterwards.
  ~BlockStore();
  // Handles point at the store: it stays where it was made.
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // The memory behind a tier, or nullptr when that tier is not configured or has no
  // memory (NVMe).
  const std::shared_ptr<Memory>& memory(Tier tier) const;
  bool configured(Tier tier) const { return tier_state(tier) != nullptr; }

  // Declares a layout's block size. REQUIRES before any block of `layout` is reserved.
  // Re-registering with the same size is a no-op; another size is InvalidArgument.
  Status register_layout(const LayoutKey& layout, uint64_t block_bytes);
  uint64_t block_bytes(const LayoutKey& layout) const;  // 0 when unknown

  // ---- writes (two-phase publish) ----

  // If `key` is already present (in any state), returns nullopt: the caller dedups.
  // Otherwise reserves a slot in the fastest tier in `allowed` that has room, inserts
  // the block as kWriting with the writer's pin, and returns the PendingWrite holding
  // it (location(): the slot to copy into; commit() once the bytes landed).
  // ResourceExhausted when no allowed tier has a free slot. In a tier made of parts,
  // `preferred_part` (the writer's GPU) is tried first.
  Result<std::optional<PendingWrite>> reserve(const BlockKey& key, std::span<const Tier> allowed,
                                              uint64_t now_ms,
                                              int preferred_part = SlabAllocator::kAnyPart);

  // ---- reads ----

  // Ready or moving blocks only (kWriting is invisible). nullopt when absent.
  std::optional<BlockInfo> lookup(const BlockKey& key) const;
  // Reserved, its bytes still being written (lookup() does not see it yet).
  bool being_written(const BlockKey& key) const;
  // Starts loading what lookup/pin of these blocks read first, so a request naming many
  // blocks waits for its cache misses together rather than one after another.
  void prefetch(const LayoutKey& layout, std::span<const BlockHash> hashes) const;
  // Read-pins a visible block (its slot will not be freed or reused while the handle
  // is held) and refreshes its access time. An empty handle when the block is not
  // visible, or already holds as many pins as it can count.
  PinnedBlock pin(const BlockKey& key, uint64_t now_ms);
  // The same without refreshing the access time: a copy made in the background (written
  // to another tier) is not a use, and must not make the block look recently used.
  PinnedBlock pin_in_background(const BlockKey& key);

  // ---- moves between tiers ----

  // Starts moving a kReady block to `to`: reserves the destination slot, marks the
  // block kMoving and pins it; the PendingMove says where it is and where it goes, and
  // finishes the move (commit, or abort). InvalidArgument when the block is absent, not
  // kReady, already in `to`, has its copy in `to` (use demote_onto_copy), or its
  // previous move's old slot is still pinned by readers; ResourceExhausted when `to`
  // has no room.
  //
  // When the move commits the block lives at the destination, and the old slot is
  // freed as soon as no reader pins it, or, when the block moved up out of a
  // keep_copies tier and no reader pins it, kept as the block's copy. When it aborts
  // the destination slot is freed and the block stays where it was.
  Result<PendingMove> begin_move(const BlockKey& key, Tier to,
                                 int preferred_part = SlabAllocator::kAnyPart);

  // ---- copies in durable tiers (see the top of this file) ----

  // Starts writing a copy of a kReady block into `to`, a keep_copies tier below the one
  // it lives in, where it has no copy: reserves the slot, marks the block kMoving and
  // pins it (it stays readable, and where it is; its tier is not relieved). The
  // PendingMove's commit() makes the slot the block's copy; abort() gives the slot back
  // (durably, as an evicted block's). Errors as begin_move's, and InvalidArgument when
  // `to` keeps no copies, is not below the block, or it has a copy already.
  Result<PendingMove> begin_copy_down(const BlockKey& key, Tier to);

  // Where the block's copy is; nullopt when it has none (or is absent).
  std::optional<BlockLocation> copy_of(const BlockKey& key) const;
  // Moves a kReady block onto its copy at once: it now lives at the copy's slot (no
  // bytes move; the slot's index entry already names the block), and its old slot is
  // freed as soon as no reader pins it. Returns the new location. InvalidArgument when
  // the block is absent, has no copy, is not kReady, or its previous move's old slot is
  // still pinned by readers.
  Result<BlockLocation> demote_onto_copy(const BlockKey& key);
  // Gives up copies in `tier`, oldest made first, until `bytes` are given up or none is
  // left. Their slots become pending releases. Returns the bytes given up.
  uint64_t drop_copies(Tier tier, uint64_t bytes);

  // Removes a kReady, unpinned block and frees its slot (and gives up its copy).
  // Returns false (and does nothing) when the block is absent, pinned, or not kReady.
  bool evict(const BlockKey& key);

  // ---- persistent tiers ----

  // Inserts a block found in a persistent tier's index at start-up as kReady, unpinned,
  // at `location`. InvalidArgument when the layout is unknown, the key is present,
  // the tier is not configured, or the slot is unusable (SlabAllocator::allocate_at).
  Status insert_recovered(const BlockKey& key, const BlockLocation& location,
                          uint64_t last_access_ms);
  // Makes room in the index of a registered layout for `blocks` blocks (recovery).
  void reserve_blocks(const LayoutKey& layout, size_t blocks);
  struct PendingRelease {
    BlockKey key;  // the block that held the slot
    BlockLocation location;
    uint64_t bytes;
  };
  // Slots of confirm_release tiers given up since the last call; they stay allocated
  // (counted as used) until confirm_release().
  std::vector<PendingRelease> take_pending_releases();
  void confirm_release(const BlockLocation& location, uint64_t bytes);
  // Bytes of `tier` given up but not yet confirmed (taken or not).
  uint64_t unconfirmed_release_bytes(Tier tier) const;
  // Bytes of the blocks moving out of `tier` (begin_move until finish_move): room that
  // comes back when their copies land (unless a reader still pins the old slot).
  uint64_t moving_out_bytes(Tier tier) const;
  // The block moved while a reader pinned its old slot, which is not free yet: it cannot
  // move again (nor get a copy) until that reader lets go.
  bool old_slot_pinned(const BlockKey& key) const { return deferred_frees_.contains(key); }
  // Bytes of the blocks moving into `tier`: movable there once they land.
  uint64_t moving_in_bytes(Tier tier) const;

  // ---- session references ----
  void add_session_ref(const BlockKey& key);
  void drop_session_ref(const BlockKey& key);

  // ---- enumeration and stats ----

  // Calls fn for every visible block in `tier` (any order). O(blocks in the tier): each
  // tier keeps a list of the blocks it holds.
  void for_each_in_tier(Tier tier,
                        const std::function<void(const BlockKey&, const BlockInfo&)>& fn) const;
  // Bytes of the blocks living in each tier, indexed by namespace id (ids are small and
  // dense; copies not counted; a namespace past the end, or all zeros, holds nothing).
  using NamespaceBytes = std::array<uint64_t, kLocalTierCount>;
  const std::vector<NamespaceBytes>& namespace_bytes() const { return namespace_bytes_; }

  // `listener` (borrowed: it unsubscribes before it goes) hears of every block entering
  // and leaving a tier from now on, with why it left (policy/block_events.h): a peer
  // policy learns its order from them. A block with a copy is held in both tiers: a
  // promotion that keeps the block's copy in the tier below leaves it there for the
  // listeners, until the copy goes.
  void subscribe(policy::BlockListener& listener) { listeners_.subscribe(listener); }
  void unsubscribe(policy::BlockListener& listener) { listeners_.unsubscribe(listener); }
  std::vector<TierUsage> usage() const;  // configured tiers, fastest first
  TierUsage usage(Tier tier) const;
  bool has_room(Tier tier, uint64_t slot_bytes) const;
  // The part of `tier` holding a block at `location` (0 for tiers of one part).
  uint32_t part_of(const BlockLocation& location) const;
  // Used bytes of each part of `tier` (one entry for tiers of one part; empty when the
  // tier is not configured), and the capacity of one part.
  std::vector<uint64_t> part_used_bytes(Tier tier) const;
  uint64_t part_capacity_bytes(Tier tier) const;
  uint64_t pinned_blocks() const { return pinned_blocks_; }
  uint64_t block_count() const { return block_count_; }

 private:
  friend class PinnedBlock;
  friend class PendingWrite;
  friend class PendingMove;

  // pin() and pin_in_background(): refreshes the access time when `now_ms` is given.
  PinnedBlock pin_entry(const BlockKey& key, std::optional<uint64_t> now_ms);

  // What the handles call, each once per handle.
  void unpin(const BlockKey& key);
  void commit_write(const BlockKey& key);
  void abort_write(const BlockKey& key);
  void finish_move(const BlockKey& key, bool ok);

  // One block of the index. 64 bytes, so a value of the BlockTable is one cache line.
  struct Entry {
    uint64_t offset = 0;  // of its slot in `tier`
    uint64_t last_access_ms = 0;
    uint32_t session_refs = 0;
    uint32_t resident_at = 0;  // index in its tier's residents
    uint16_t pins = 0;
    BlockState state = BlockState::kWriting;
    Tier tier = Tier::kNone;
    BlockHash hash;         // the key
    bool has_copy = false;  // copies_ holds its copy

    BlockLocation location() const { return {tier, offset}; }
    void set_location(const BlockLocation& location) {
      tier = location.tier;
      offset = location.offset;
    }
  };
  static_assert(sizeof(Entry) == 64, "an index entry is one cache line");
  struct LayoutTable {
    uint64_t block_bytes = 0;
    BlockTable<Entry> blocks;
    uint32_t number = 0;  // its place in numbered_layouts_
  };
  struct TierState {
    Tier tier;
    std::shared_ptr<Memory> memory;
    SlabAllocator slabs;
    uint64_t blocks = 0;
    bool confirm_release = false;
    uint64_t unconfirmed_bytes = 0;
    uint64_t moving_out_bytes = 0;
    uint64_t moving_in_bytes = 0;
    uint64_t writing_bytes = 0;  // slots of kWriting blocks (reserve → commit/abort_write)
    // The blocks (any state) whose location is in this tier, in no order: enumeration
    // by tier costs what the tier holds, not what the store holds. 8 bytes a block: the
    // layout's number and the entry's in its BlockTable, which renumbers an entry when
    // another is erased; it reports each move (relocated) and the number is updated.
    struct Resident {
      uint32_t layout;  // LayoutTable::number
      uint32_t entry;   // in that layout's BlockTable
    };
    std::vector<Resident> residents;
    bool keep_copies = false;
    // Blocks with a copy here, oldest made first (drop_copies takes from the front).
    std::list<BlockKey> copies;
    uint64_t copy_bytes = 0;
  };
  // A block's copy: where it is and its place in the tier's list.
  struct Copy {
    BlockLocation location;
    std::list<BlockKey>::iterator in_tier;
  };

  Entry* find(const BlockKey& key);
  const Entry* find(const BlockKey& key) const;
  TierState* tier_state(Tier tier);
  const TierState* tier_state(Tier tier) const;
  void release_slot(const BlockKey& key, const BlockLocation& location, uint64_t block_bytes);
  void change_pins(Entry& entry, int delta);
  void add_copy(const BlockKey& key, Entry& entry, const BlockLocation& location, uint64_t bytes);
  // Forgets the entry's copy and returns where it was; its slot stays allocated.
  BlockLocation take_copy(const BlockKey& key, Entry& entry, uint64_t bytes);
  // Keep TierState::residents in step with Entry::location.tier.
  void add_resident(const LayoutTable& table, Entry& entry);
  void remove_resident(Entry& entry);
  // What the index calls for each entry it moved: the entry's resident follows it.
  auto relocated(const LayoutTable& table) {
    return [this, &table](Entry& entry) {
      tier_state(entry.tier)->residents[entry.resident_at] = {table.number,
                                                              table.blocks.number_of(entry)};
    };
  }
  // A resident's layout and entry.
  const LayoutKey& layout_of(const TierState::Resident& resident) const {
    return *numbered_layouts_[resident.layout].first;
  }
  Entry& entry_of(const TierState::Resident& resident) const {
    return numbered_layouts_[resident.layout].second->blocks.at(resident.entry);
  }

  std::vector<TierState> tiers_;
  std::unordered_map<LayoutKey, LayoutTable, LayoutKeyHasher> layouts_;
  // Each of layouts_ by its number (pointers into its nodes: layouts are never erased).
  std::vector<std::pair<const LayoutKey*, LayoutTable*>> numbered_layouts_;
  // kMoving blocks: where they are going.
  std::unordered_map<BlockKey, BlockLocation, BlockKeyHasher> move_targets_;
  // The kMoving blocks of move_targets_ that begin_copy_down started: they stay where
  // they are, and their target becomes their copy.
  std::unordered_set<BlockKey, BlockKeyHasher> copying_down_;
  // Old slots of moved blocks still pinned by readers: freed when pins reach 0.
  std::unordered_map<BlockKey, BlockLocation, BlockKeyHasher> deferred_frees_;
  std::vector<PendingRelease> pending_releases_;
  // The copies of the blocks whose Entry::has_copy is set.
  std::unordered_map<BlockKey, Copy, BlockKeyHasher> copies_;
  uint64_t pinned_blocks_ = 0;
  std::vector<NamespaceBytes> namespace_bytes_;
  policy::BlockListeners listeners_;
  void entered(const BlockKey& key, Tier tier) const {
    listeners_.entered(key, tier, block_bytes(key.layout));
  }
  void left(const BlockKey& key, Tier tier, policy::Departure why) const {
    listeners_.left(key, tier, why);
  }  // kept by add/remove_resident
  uint64_t block_count_ = 0;
  // Shared with the handles; handed to them if the store goes first (~BlockStore).
  std::unique_ptr<detail::StoreAnchor> anchor_;
};

}  // namespace kvtier
