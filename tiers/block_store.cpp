#include "tiers/block_store.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "common/log.h"

namespace kvtier {

namespace {

std::string tier_list(std::span<const Tier> tiers) {
  std::string out;
  for (Tier tier : tiers) {
    if (!out.empty()) out += ",";
    out += tier_name(tier);
  }
  return out.empty() ? "none" : out;
}

}  // namespace

BlockStore::BlockStore(std::vector<TierMemory> tiers)
    : anchor_(std::make_unique<detail::StoreAnchor>()) {
  anchor_->store = this;
  // Reserve and the usage list rely on tiers_ being fastest first; the Tier enum is
  // numbered in that order, so sort rather than trust the caller's order.
  std::stable_sort(tiers.begin(), tiers.end(), [](const TierMemory& a, const TierMemory& b) {
    return static_cast<int>(a.tier) < static_cast<int>(b.tier);
  });
  tiers_.reserve(tiers.size());
  for (TierMemory& tier : tiers) {
    const bool sized = tier.memory != nullptr || tier.capacity_bytes > 0;
    if (!sized || tier.tier == Tier::kNone || tier_state(tier.tier) != nullptr) {
      KVTIER_LOG_WARN("block store: ignoring tier {} (no memory, none, or configured twice)",
                      tier_name(tier.tier));
      continue;
    }
    const uint64_t capacity_bytes =
        tier.memory != nullptr ? tier.memory->size_bytes() : tier.capacity_bytes;
    tiers_.push_back(TierState{tier.tier,
                               std::move(tier.memory),
                               SlabAllocator(capacity_bytes, tier.slab_bytes, tier.parts),
                               0,
                               tier.confirm_release,
                               0,
                               0,
                               0,
                               0,
                               {},
                               tier.keep_copies && tier.confirm_release,
                               {},
                               0});
  }
}

BlockStore::~BlockStore() {
  if (anchor_->handles == 0) return;
  // A handle that outlives the store would otherwise reach freed memory when it is
  // released; the anchor stays with the handles, and the last of them frees it.
  KVTIER_LOG_WARN("block store destroyed while {} pin handles are held; they release nothing",
                  anchor_->handles);
  anchor_->store = nullptr;
  (void)anchor_.release();
}

const std::shared_ptr<Memory>& BlockStore::memory(Tier tier) const {
  static const std::shared_ptr<Memory> kNoMemory;
  const TierState* state = tier_state(tier);
  return state == nullptr ? kNoMemory : state->memory;
}

Status BlockStore::register_layout(const LayoutKey& layout, uint64_t block_bytes) {
  if (block_bytes == 0) return invalid_argument("block_bytes must be positive");
  auto [it, inserted] = layouts_.try_emplace(layout);
  if (inserted) {
    it->second.block_bytes = block_bytes;
    it->second.number = static_cast<uint32_t>(numbered_layouts_.size());
    numbered_layouts_.emplace_back(&it->first, &it->second);
    return Status::ok();
  }
  if (it->second.block_bytes != block_bytes) {
    return invalid_argument(
        "layout {:016x} in namespace {} is registered with block_bytes {}, not {}",
        layout.layout_digest, layout.namespace_id, it->second.block_bytes, block_bytes);
  }
  return Status::ok();
}

uint64_t BlockStore::block_bytes(const LayoutKey& layout) const {
  auto it = layouts_.find(layout);
  return it == layouts_.end() ? 0 : it->second.block_bytes;
}

Result<std::optional<PendingWrite>> BlockStore::reserve(const BlockKey& key,
                                                        std::span<const Tier> allowed,
                                                        uint64_t now_ms, int preferred_part) {
  auto layout = layouts_.find(key.layout);
  if (layout == layouts_.end()) {
    return invalid_argument("layout {:016x} in namespace {} is not registered",
                            key.layout.layout_digest, key.layout.namespace_id);
  }
  LayoutTable& table = layout->second;
  if (table.blocks.contains(key.hash)) return std::optional<PendingWrite>();

  for (TierState& tier : tiers_) {
    if (std::find(allowed.begin(), allowed.end(), tier.tier) == allowed.end()) continue;
    if (!tier.slabs.can_allocate(table.block_bytes)) continue;
    Result<uint64_t> offset = tier.slabs.allocate(table.block_bytes, preferred_part);
    if (!offset.is_ok()) return offset.status();  // can_allocate said yes: a bug
    Entry& entry = *table.blocks.try_emplace(key.hash, relocated(layout->second)).first;
    entry.set_location(BlockLocation{tier.tier, *offset});
    entry.last_access_ms = now_ms;
    entry.state = BlockState::kWriting;
    tier.writing_bytes += table.block_bytes;
    add_resident(table, entry);
    entered(key, tier.tier);
    change_pins(entry, +1);  // the writer's pin
    ++tier.blocks;
    ++block_count_;
    return std::optional<PendingWrite>(PendingWrite(*anchor_, key, entry.location()));
  }
  return resource_exhausted("no room for a {}-byte block in allowed tiers [{}]", table.block_bytes,
                            tier_list(allowed));
}

void BlockStore::commit_write(const BlockKey& key) {
  Entry* entry = find(key);
  if (entry == nullptr || entry->state != BlockState::kWriting) {
    KVTIER_LOG_ERROR("block store: commit_write of {} which is not being written",
                     key.hash.to_hex());
    return;
  }
  entry->state = BlockState::kReady;
  tier_state(entry->tier)->writing_bytes -= block_bytes(key.layout);
  change_pins(*entry, -1);
}

void BlockStore::abort_write(const BlockKey& key) {
  Entry* entry = find(key);
  if (entry == nullptr || entry->state != BlockState::kWriting) {
    KVTIER_LOG_ERROR("block store: abort_write of {} which is not being written",
                     key.hash.to_hex());
    return;
  }
  change_pins(*entry, -static_cast<int>(entry->pins));
  auto layout = layouts_.find(key.layout);
  tier_state(entry->tier)->writing_bytes -= layout->second.block_bytes;
  release_slot(key, entry->location(), layout->second.block_bytes);
  --tier_state(entry->tier)->blocks;
  --block_count_;
  left(key, entry->tier, policy::Departure::kReleased);
  remove_resident(*entry);
  layout->second.blocks.erase(entry, relocated(layout->second));
}

void BlockStore::prefetch(const LayoutKey& layout, std::span<const BlockHash> hashes) const {
  auto it = layouts_.find(layout);
  if (it == layouts_.end()) return;
  // Two passes: the slots of every hash, then (those arrived meanwhile) their values.
  for (const BlockHash& hash : hashes) it->second.blocks.prefetch(hash);
  for (const BlockHash& hash : hashes) it->second.blocks.prefetch_value(hash);
}

std::optional<BlockInfo> BlockStore::lookup(const BlockKey& key) const {
  const Entry* entry = find(key);
  if (entry == nullptr || entry->state == BlockState::kWriting) return std::nullopt;
  return BlockInfo{entry->state,        entry->location(),     entry->pins,
                   entry->session_refs, entry->last_access_ms, entry->has_copy};
}

bool BlockStore::being_written(const BlockKey& key) const {
  const Entry* entry = find(key);
  return entry != nullptr && entry->state == BlockState::kWriting;
}

PinnedBlock BlockStore::pin(const BlockKey& key, uint64_t now_ms) {
  return pin_entry(key, now_ms);
}

PinnedBlock BlockStore::pin_in_background(const BlockKey& key) {
  return pin_entry(key, std::nullopt);
}

PinnedBlock BlockStore::pin_entry(const BlockKey& key, std::optional<uint64_t> now_ms) {
  Entry* entry = find(key);
  if (entry == nullptr || entry->state == BlockState::kWriting) return {};
  // A full pin counter refuses the read rather than wrap (a wrapped count would free a
  // slot under a reader).
  if (entry->pins == std::numeric_limits<decltype(entry->pins)>::max()) return {};
  change_pins(*entry, +1);
  if (now_ms) entry->last_access_ms = *now_ms;
  return PinnedBlock(*anchor_, key, entry->location());
}

void BlockStore::unpin(const BlockKey& key) {
  Entry* entry = find(key);
  // A kWriting block's only pin is the writer's, released by commit/abort_write.
  if (entry == nullptr || entry->state == BlockState::kWriting || entry->pins == 0) {
    KVTIER_LOG_ERROR("block store: unpin of {} which is not read-pinned", key.hash.to_hex());
    return;
  }
  change_pins(*entry, -1);
  if (entry->pins > 0 || deferred_frees_.empty()) return;
  auto deferred = deferred_frees_.find(key);
  if (deferred == deferred_frees_.end()) return;
  const BlockLocation old = deferred->second;
  deferred_frees_.erase(deferred);
  // The old slot of a promotion out of a tier that keeps copies becomes the block's copy
  // once its last reader is gone, as it would have at once without readers (finish_move):
  // otherwise a block read while it was promoted would lose its copy below.
  const TierState* below = tier_state(old.tier);
  if (below->keep_copies && old.tier > entry->tier && !entry->has_copy &&
      entry->state == BlockState::kReady) {
    add_copy(key, *entry, old, block_bytes(key.layout));
    entered(key, old.tier);
    return;
  }
  release_slot(key, old, block_bytes(key.layout));
}

Result<PendingMove> BlockStore::begin_move(const BlockKey& key, Tier to, int preferred_part) {
  Entry* entry = find(key);
  if (entry == nullptr) return invalid_argument("block {} is not stored", key.hash.to_hex());
  if (entry->state != BlockState::kReady) {
    return invalid_argument("block {} is not ready (being written or moved)", key.hash.to_hex());
  }
  if (entry->tier == to) {
    return invalid_argument("block {} is already in tier {}", key.hash.to_hex(), tier_name(to));
  }
  if (entry->has_copy && copies_.at(key).location.tier == to) {
    return invalid_argument("block {} has a copy in tier {}: it moves onto it", key.hash.to_hex(),
                            tier_name(to));
  }
  if (deferred_frees_.contains(key)) {
    return invalid_argument("block {}: the old slot of its previous move is still pinned",
                            key.hash.to_hex());
  }
  if (entry->pins == std::numeric_limits<decltype(entry->pins)>::max()) {
    return resource_exhausted("block {} has too many pins to move", key.hash.to_hex());
  }
  TierState* destination = tier_state(to);
  if (destination == nullptr) {
    return invalid_argument("tier {} is not configured", tier_name(to));
  }
  const uint64_t bytes = block_bytes(key.layout);
  if (!destination->slabs.can_allocate(bytes)) {
    return resource_exhausted("tier {} has no room for a {}-byte block: {} of {} bytes used",
                              tier_name(to), bytes, destination->slabs.used_bytes(),
                              destination->slabs.capacity_bytes());
  }
  Result<uint64_t> offset = destination->slabs.allocate(bytes, preferred_part);
  if (!offset.is_ok()) return offset.status();  // can_allocate said yes: a bug

  const BlockLocation target{to, *offset};
  tier_state(entry->tier)->moving_out_bytes += bytes;
  destination->moving_in_bytes += bytes;
  entry->state = BlockState::kMoving;
  change_pins(*entry, +1);  // the mover's pin keeps the source slot alive
  move_targets_[key] = target;
  return PendingMove(*anchor_, key, target, entry->location());
}

Result<PendingMove> BlockStore::begin_copy_down(const BlockKey& key, Tier to) {
  const Entry* entry = find(key);
  if (entry == nullptr) return invalid_argument("block {} is not stored", key.hash.to_hex());
  const TierState* destination = tier_state(to);
  if (destination == nullptr || !destination->keep_copies || to <= entry->tier) {
    return invalid_argument("block {}: tier {} keeps no copies of blocks in tier {}",
                            key.hash.to_hex(), tier_name(to), tier_name(entry->tier));
  }
  if (entry->has_copy) {
    return invalid_argument("block {} has a copy already", key.hash.to_hex());
  }
  Result<PendingMove> move = begin_move(key, to);
  if (!move.is_ok()) return move;
  // A copy relieves nothing: the block's tier keeps its slot.
  tier_state(find(key)->tier)->moving_out_bytes -= block_bytes(key.layout);
  copying_down_.insert(key);
  return move;
}

void BlockStore::finish_move(const BlockKey& key, bool ok) {
  Entry* entry = find(key);
  auto target_it = move_targets_.find(key);
  if (entry == nullptr || entry->state != BlockState::kMoving || target_it == move_targets_.end()) {
    KVTIER_LOG_ERROR("block store: finish_move of {} which is not moving", key.hash.to_hex());
    return;
  }
  const BlockLocation target = target_it->second;
  move_targets_.erase(target_it);
  const uint64_t bytes = block_bytes(key.layout);
  const bool copy_down = copying_down_.erase(key) > 0;
  if (!copy_down) tier_state(entry->tier)->moving_out_bytes -= bytes;
  tier_state(target.tier)->moving_in_bytes -= bytes;
  change_pins(*entry, -1);
  entry->state = BlockState::kReady;
  if (!ok) {
    release_slot(key, target, bytes);
    return;
  }
  if (copy_down) {
    // The block stays where it is; the written slot (and the index entry naming it)
    // is its copy from now on (for the observer it is there too, as a promotion's copy).
    add_copy(key, *entry, target, bytes);
    entered(key, target.tier);
    return;
  }
  const BlockLocation old = entry->location();
  TierState* old_tier = tier_state(old.tier);
  --old_tier->blocks;
  ++tier_state(target.tier)->blocks;
  remove_resident(*entry);
  entry->set_location(target);
  add_resident(layouts_.find(key.layout)->second, *entry);
  const bool copy_kept =
      old_tier->keep_copies && target.tier < old.tier && !entry->has_copy && entry->pins == 0;
  if (!copy_kept) {
    left(key, old.tier,
         target.tier > old.tier ? policy::Departure::kDemoted : policy::Departure::kPromoted);
  }
  entered(key, target.tier);
  // A copy is kept only when no reader pins the old slot: then no handle ever names a
  // copy's slot (pins taken from now on name the new place), and a copy may be dropped
  // whenever room is needed, also while its block is pinned up above (an admin's pin
  // holds a block for as long as it likes). With readers, the slot goes as before.
  if (copy_kept) {
    // The old slot and the index entry naming it stay: the block is immutable, so they
    // hold its bytes for as long as it exists.
    add_copy(key, *entry, old, bytes);
    return;
  }
  // Readers that pinned the block before the switch still read the old slot.
  if (entry->pins > 0) {
    deferred_frees_[key] = old;
  } else {
    release_slot(key, old, bytes);
  }
}

bool BlockStore::evict(const BlockKey& key) {
  auto layout = layouts_.find(key.layout);
  if (layout == layouts_.end()) return false;
  Entry* entry = layout->second.blocks.find(key.hash);
  if (entry == nullptr) return false;
  if (entry->state != BlockState::kReady || entry->pins > 0) return false;
  release_slot(key, entry->location(), layout->second.block_bytes);
  if (entry->has_copy) {
    const BlockLocation copy = take_copy(key, *entry, layout->second.block_bytes);
    left(key, copy.tier, policy::Departure::kEvicted);
    release_slot(key, copy, layout->second.block_bytes);
  }
  --tier_state(entry->tier)->blocks;
  --block_count_;
  left(key, entry->tier, policy::Departure::kEvicted);
  remove_resident(*entry);
  layout->second.blocks.erase(entry, relocated(layout->second));
  return true;
}

std::optional<BlockLocation> BlockStore::copy_of(const BlockKey& key) const {
  const Entry* entry = find(key);
  if (entry == nullptr || !entry->has_copy) return std::nullopt;
  return copies_.at(key).location;
}

Result<BlockLocation> BlockStore::demote_onto_copy(const BlockKey& key) {
  Entry* entry = find(key);
  if (entry == nullptr) return invalid_argument("block {} is not stored", key.hash.to_hex());
  if (!entry->has_copy) return invalid_argument("block {} has no copy", key.hash.to_hex());
  if (entry->state != BlockState::kReady) {
    return invalid_argument("block {} is not ready (being written or moved)", key.hash.to_hex());
  }
  if (deferred_frees_.contains(key)) {
    return invalid_argument("block {}: the old slot of its previous move is still pinned",
                            key.hash.to_hex());
  }
  const uint64_t bytes = block_bytes(key.layout);
  const BlockLocation old = entry->location();
  const BlockLocation copy = take_copy(key, *entry, bytes);
  --tier_state(old.tier)->blocks;
  ++tier_state(copy.tier)->blocks;
  remove_resident(*entry);
  entry->set_location(copy);
  add_resident(layouts_.find(key.layout)->second, *entry);
  left(key, old.tier, policy::Departure::kDemoted);
  entered(key, copy.tier);
  if (entry->pins > 0) {
    deferred_frees_[key] = old;
  } else {
    release_slot(key, old, bytes);
  }
  return copy;
}

uint64_t BlockStore::drop_copies(Tier tier, uint64_t bytes) {
  TierState* state = tier_state(tier);
  if (state == nullptr) return 0;
  uint64_t dropped = 0;
  for (auto it = state->copies.begin(); it != state->copies.end() && dropped < bytes;) {
    const BlockKey key = *it++;  // take_copy erases the node
    Entry* entry = find(key);
    const uint64_t block = block_bytes(key.layout);
    release_slot(key, take_copy(key, *entry, block), block);
    left(key, tier, policy::Departure::kCopyDropped);
    dropped += block;
  }
  return dropped;
}

Status BlockStore::insert_recovered(const BlockKey& key, const BlockLocation& location,
                                    uint64_t last_access_ms) {
  auto layout = layouts_.find(key.layout);
  if (layout == layouts_.end()) {
    return invalid_argument("layout {:016x} in namespace {} is not registered",
                            key.layout.layout_digest, key.layout.namespace_id);
  }
  if (layout->second.blocks.contains(key.hash)) {
    return invalid_argument("block {} is already stored", key.hash.to_hex());
  }
  TierState* tier = tier_state(location.tier);
  if (tier == nullptr)
    return invalid_argument("tier {} is not configured", tier_name(location.tier));
  KVTIER_RETURN_IF_ERROR(tier->slabs.allocate_at(location.offset, layout->second.block_bytes));
  Entry& entry = *layout->second.blocks.try_emplace(key.hash, relocated(layout->second)).first;
  entry.set_location(location);
  entry.last_access_ms = last_access_ms;
  entry.state = BlockState::kReady;
  add_resident(layout->second, entry);
  entered(key, location.tier);
  ++tier->blocks;
  ++block_count_;
  return Status::ok();
}

void BlockStore::reserve_blocks(const LayoutKey& layout, size_t blocks) {
  auto it = layouts_.find(layout);
  if (it != layouts_.end()) it->second.blocks.reserve(blocks, relocated(it->second));
}

std::vector<BlockStore::PendingRelease> BlockStore::take_pending_releases() {
  return std::exchange(pending_releases_, {});
}

void BlockStore::confirm_release(const BlockLocation& location, uint64_t bytes) {
  TierState* tier = tier_state(location.tier);
  tier->unconfirmed_bytes -= bytes;
  tier->slabs.free(location.offset, bytes);
}

uint64_t BlockStore::moving_in_bytes(Tier tier) const {
  const TierState* state = tier_state(tier);
  return state == nullptr ? 0 : state->moving_in_bytes;
}

uint64_t BlockStore::moving_out_bytes(Tier tier) const {
  const TierState* state = tier_state(tier);
  return state == nullptr ? 0 : state->moving_out_bytes;
}

uint64_t BlockStore::unconfirmed_release_bytes(Tier tier) const {
  const TierState* state = tier_state(tier);
  return state == nullptr ? 0 : state->unconfirmed_bytes;
}

void BlockStore::add_session_ref(const BlockKey& key) {
  if (Entry* entry = find(key)) ++entry->session_refs;
}

void BlockStore::drop_session_ref(const BlockKey& key) {
  Entry* entry = find(key);
  if (entry != nullptr && entry->session_refs > 0) --entry->session_refs;
}

void BlockStore::for_each_in_tier(
    Tier tier, const std::function<void(const BlockKey&, const BlockInfo&)>& fn) const {
  const TierState* state = tier_state(tier);
  if (state == nullptr) return;
  for (const TierState::Resident& resident : state->residents) {
    const Entry& entry = entry_of(resident);
    if (entry.state == BlockState::kWriting) continue;
    fn(BlockKey{layout_of(resident), entry.hash},
       BlockInfo{entry.state, entry.location(), entry.pins, entry.session_refs,
                 entry.last_access_ms, entry.has_copy});
  }
}

void BlockStore::add_resident(const LayoutTable& table, Entry& entry) {
  TierState* state = tier_state(entry.tier);
  entry.resident_at = static_cast<uint32_t>(state->residents.size());
  state->residents.push_back({table.number, table.blocks.number_of(entry)});
  const LayoutKey& layout = *numbered_layouts_[table.number].first;
  if (layout.namespace_id >= namespace_bytes_.size())
    namespace_bytes_.resize(layout.namespace_id + 1);
  namespace_bytes_[layout.namespace_id][static_cast<size_t>(entry.tier)] += block_bytes(layout);
}

void BlockStore::remove_resident(Entry& entry) {
  std::vector<TierState::Resident>& residents = tier_state(entry.tier)->residents;
  const uint32_t at = entry.resident_at;
  const LayoutKey& layout = layout_of(residents[at]);
  namespace_bytes_[layout.namespace_id][static_cast<size_t>(entry.tier)] -= block_bytes(layout);
  residents[at] = residents.back();
  entry_of(residents[at]).resident_at = at;
  residents.pop_back();
}

void BlockStore::add_copy(const BlockKey& key, Entry& entry, const BlockLocation& location,
                          uint64_t bytes) {
  TierState* tier = tier_state(location.tier);
  tier->copies.push_back(key);
  copies_.emplace(key, Copy{location, std::prev(tier->copies.end())});
  tier->copy_bytes += bytes;
  entry.has_copy = true;
}

BlockLocation BlockStore::take_copy(const BlockKey& key, Entry& entry, uint64_t bytes) {
  auto it = copies_.find(key);
  const Copy copy = it->second;
  copies_.erase(it);
  TierState* tier = tier_state(copy.location.tier);
  tier->copies.erase(copy.in_tier);
  tier->copy_bytes -= bytes;
  entry.has_copy = false;
  return copy.location;
}

std::vector<TierUsage> BlockStore::usage() const {
  std::vector<TierUsage> out;
  out.reserve(tiers_.size());
  for (const TierState& tier : tiers_) out.push_back(usage(tier.tier));
  return out;
}

TierUsage BlockStore::usage(Tier tier) const {
  const TierState* state = tier_state(tier);
  if (state == nullptr) return TierUsage{tier, 0, 0, 0};
  return TierUsage{tier,
                   state->slabs.capacity_bytes(),
                   state->slabs.used_bytes(),
                   state->blocks,
                   state->copy_bytes,
                   state->copies.size(),
                   state->writing_bytes};
}

bool BlockStore::has_room(Tier tier, uint64_t slot_bytes) const {
  const TierState* state = tier_state(tier);
  return state != nullptr && state->slabs.can_allocate(slot_bytes);
}

std::vector<uint64_t> BlockStore::part_used_bytes(Tier tier) const {
  const TierState* state = tier_state(tier);
  std::vector<uint64_t> used;
  if (state == nullptr) return used;
  for (uint32_t part = 0; part < state->slabs.parts(); ++part) {
    used.push_back(state->slabs.used_bytes(part));
  }
  return used;
}

uint64_t BlockStore::part_capacity_bytes(Tier tier) const {
  const TierState* state = tier_state(tier);
  return state == nullptr ? 0 : state->slabs.part_capacity_bytes();
}

uint32_t BlockStore::part_of(const BlockLocation& location) const {
  const TierState* state = tier_state(location.tier);
  return state == nullptr ? 0 : state->slabs.part_of(location.offset);
}

BlockStore::Entry* BlockStore::find(const BlockKey& key) {
  return const_cast<Entry*>(std::as_const(*this).find(key));
}

const BlockStore::Entry* BlockStore::find(const BlockKey& key) const {
  auto layout = layouts_.find(key.layout);
  if (layout == layouts_.end()) return nullptr;
  return layout->second.blocks.find(key.hash);
}

BlockStore::TierState* BlockStore::tier_state(Tier tier) {
  return const_cast<TierState*>(std::as_const(*this).tier_state(tier));
}

const BlockStore::TierState* BlockStore::tier_state(Tier tier) const {
  for (const TierState& state : tiers_) {
    if (state.tier == tier) return &state;
  }
  return nullptr;
}

void BlockStore::release_slot(const BlockKey& key, const BlockLocation& location,
                              uint64_t block_bytes) {
  TierState* tier = tier_state(location.tier);
  if (tier->confirm_release) {
    // An index entry may still name this slot: it is reused only after the caller
    // deleted that entry durably (confirm_release).
    tier->unconfirmed_bytes += block_bytes;
    pending_releases_.push_back({key, location, block_bytes});
    return;
  }
  tier->slabs.free(location.offset, block_bytes);
}

void BlockStore::change_pins(Entry& entry, int delta) {
  const bool was_pinned = entry.pins > 0;
  entry.pins = static_cast<uint16_t>(static_cast<int>(entry.pins) + delta);
  const bool is_pinned = entry.pins > 0;
  if (!was_pinned && is_pinned) ++pinned_blocks_;
  if (was_pinned && !is_pinned) --pinned_blocks_;
}

}  // namespace kvtier
