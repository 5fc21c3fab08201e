#include "sim/sim_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvtier::bench {
namespace {

constexpr LayoutKey kLayout{0, 1};

}  // namespace

BlockKey SimStore::key_of(uint64_t hash_id) {
  uint8_t bytes[8];
  std::memcpy(bytes, &hash_id, sizeof(bytes));
  return BlockKey{kLayout, BlockHash(std::span<const uint8_t>(bytes, sizeof(bytes)))};
}

uint64_t SimStore::id_of(const BlockKey& key) {
  uint64_t id = UINT64_MAX;
  if (key.hash.size() == sizeof(id) && key.layout == kLayout) {
    std::memcpy(&id, key.hash.bytes().data(), sizeof(id));
  }
  return id;
}

SimStore::SimStore(std::array<uint64_t, kLocalTierCount> capacity,
                   std::array<double, kLocalTierCount> read_bytes_per_s, uint64_t block_bytes,
                   uint64_t distinct_ids, bool inclusive_nvme)
    : capacity_(capacity),
      read_bytes_per_s_(read_bytes_per_s),
      block_bytes_(block_bytes),
      blocks_(distinct_ids),
      inclusive_nvme_(inclusive_nvme) {}

SimStore::Block* SimStore::find(const BlockKey& key) {
  const uint64_t id = id_of(key);
  if (id >= blocks_.size() || blocks_[id].tier == Tier::kNone) return nullptr;
  return &blocks_[id];
}

const SimStore::Block* SimStore::find(const BlockKey& key) const {
  const uint64_t id = id_of(key);
  if (id >= blocks_.size() || blocks_[id].tier == Tier::kNone) return nullptr;
  return &blocks_[id];
}

void SimStore::place(uint64_t id, Tier tier) {
  Block& block = blocks_[id];
  auto& residents = residents_[index(tier)];
  block.tier = tier;
  block.position = static_cast<uint32_t>(residents.size());
  residents.push_back(static_cast<uint32_t>(id));
  listeners_.entered(key_of(id), tier, block_bytes_);
}

namespace {

// Why a block leaves `from` for `to` (kNone: the store).
policy::Departure departure(Tier from, Tier to, bool given_back) {
  if (given_back) return policy::Departure::kReleased;
  if (to == Tier::kNone) return policy::Departure::kEvicted;
  return to > from ? policy::Departure::kDemoted : policy::Departure::kPromoted;
}

}  // namespace

void SimStore::unplace(uint64_t id, Tier to, bool given_back) {
  Block& block = blocks_[id];
  // A promotion out of NVMe that keeps its copy there leaves the block in NVMe's
  // history: a read of the copy is a hit in that tier; it leaves when the copy goes.
  const bool copy_kept = block.tier == Tier::kNvme && block.nvme_copy;
  if (!copy_kept) listeners_.left(key_of(id), block.tier, departure(block.tier, to, given_back));
  auto& residents = residents_[index(block.tier)];
  const uint32_t last = residents.back();
  residents[block.position] = last;
  blocks_[last].position = block.position;
  residents.pop_back();
  block.tier = Tier::kNone;
}

SimStore::BlockPlacement SimStore::to_placement(const Block& block) const {
  return {block.tier, block.moving_to == Tier::kNone && !block.pinned, block_bytes_,
          block.session_refs, block.last_access_ms};
}

SimStore::BlockPlacement SimStore::placement(const BlockKey& key) const {
  return placement_of(id_of(key));
}

SimStore::BlockPlacement SimStore::placement_of(uint64_t id) const {
  if (id >= blocks_.size() || blocks_[id].tier == Tier::kNone) return {Tier::kNone, false, 0, 0, 0};
  return to_placement(blocks_[id]);
}

SimStore::TierSpace SimStore::space(Tier tier) const {
  if (tier == Tier::kNone) return {};
  // Copies are free to the planner: they go first when room is needed.
  const uint64_t copies = tier == Tier::kNvme ? nvme_copy_bytes() : 0;
  return {capacity_[index(tier)], used_[index(tier)] - copies};
}

bool SimStore::make_room(Tier tier) {
  const uint64_t capacity = capacity_[index(tier)];
  if (capacity == 0) return false;
  while (tier == Tier::kNvme && used_[index(tier)] + block_bytes_ > capacity &&
         !copy_order_.empty()) {
    drop_copy(copy_order_.front());
  }
  return used_[index(tier)] + block_bytes_ <= capacity;
}

void SimStore::add_copy(uint64_t id) {
  Block& block = blocks_[id];
  block.nvme_copy = true;
  block.copy_at = copy_order_.insert(copy_order_.end(), static_cast<uint32_t>(id));
}

void SimStore::drop_copy(uint64_t id) {
  Block& block = blocks_[id];
  copy_order_.erase(block.copy_at);
  block.nvme_copy = false;
  used_[index(Tier::kNvme)] -= block_bytes_;
  listeners_.left(key_of(id), Tier::kNvme, policy::Departure::kCopyDropped);
}

void SimStore::for_each_in_tier(
    Tier tier, const std::function<void(const BlockKey&, const BlockPlacement&)>& fn) const {
  if (tier == Tier::kNone) return;
  for (uint32_t id : residents_[index(tier)]) {
    fn(key_of(id), to_placement(blocks_[id]));
  }
}

Tier SimStore::read_tier(const BlockKey& key, uint64_t at_ms) const {
  const Block* block = find(key);
  if (block == nullptr) return Tier::kNone;
  if (block->moving_to != Tier::kNone && block->lands_at_ms <= at_ms) return block->moving_to;
  return block->tier;
}

Tier SimStore::insert(const BlockKey& key, uint64_t now_ms, Tier lowest) {
  const uint64_t id = id_of(key);
  if (id >= blocks_.size() || blocks_[id].tier != Tier::kNone) return Tier::kNone;
  for (Tier tier : {Tier::kHbm, Tier::kRam, Tier::kNvme}) {
    if (tier > lowest) break;
    if (!make_room(tier)) continue;
    used_[index(tier)] += block_bytes_;
    if (tier == Tier::kNvme) nvme_written_bytes_ += block_bytes_;
    blocks_[id] = Block{};
    blocks_[id].last_access_ms = now_ms;
    place(id, tier);
    return tier;
  }
  return Tier::kNone;
}

void SimStore::touch(const BlockKey& key, uint64_t now_ms) {
  if (Block* block = find(key)) block->last_access_ms = now_ms;
}

void SimStore::set_pinned(const BlockKey& key, bool pinned) {
  if (Block* block = find(key)) block->pinned = pinned;
}

void SimStore::add_ref(const BlockKey& key) {
  if (Block* block = find(key)) ++block->session_refs;
}

void SimStore::drop_ref(const BlockKey& key) {
  if (Block* block = find(key); block != nullptr && block->session_refs > 0) {
    --block->session_refs;
  }
}

bool SimStore::evict(const BlockKey& key, bool given_back) {
  Block* block = find(key);
  if (block == nullptr || block->moving_to != Tier::kNone || block->pinned) return false;
  used_[index(block->tier)] -= block_bytes_;
  if (block->nvme_copy) drop_copy(id_of(key));
  unplace(id_of(key), Tier::kNone, given_back);
  return true;
}

size_t SimStore::link_of(Tier a, Tier b) const {
  // A copy between two tiers runs at the slower one's speed, on that tier's link.
  return read_bytes_per_s_[index(a)] <= read_bytes_per_s_[index(b)] ? index(a) : index(b);
}

bool SimStore::begin_move(const BlockKey& key, Tier to, uint64_t now_ms) {
  Block* block = find(key);
  if (block == nullptr || to == Tier::kNone) return false;
  if (block->moving_to != Tier::kNone || block->pinned || block->tier == to) return false;
  if (to == Tier::kNvme && block->nvme_copy) {
    // Onto its copy: nothing to write, no link time; the copy's room becomes its place.
    const uint64_t id = id_of(key);
    copy_order_.erase(block->copy_at);
    block->nvme_copy = false;
    used_[index(block->tier)] -= block_bytes_;
    unplace(id, to);
    place(id, to);
    demoted_onto_copy_bytes_ += block_bytes_;
    return true;
  }
  if (!make_room(to)) return false;
  used_[index(to)] += block_bytes_;
  if (to == Tier::kNvme) nvme_written_bytes_ += block_bytes_;
  const size_t link = link_of(block->tier, to);
  double& free_at = link_free_at_ms_[link][to > block->tier ? 1 : 0];
  const double start = std::max(static_cast<double>(now_ms), free_at);
  const double end = start + static_cast<double>(block_bytes_) / read_bytes_per_s_[link] * 1000.0;
  free_at = end;
  block->moving_to = to;
  block->lands_at_ms = static_cast<uint64_t>(std::ceil(end));
  ++moving_out_[index(block->tier)];
  ++moving_in_[index(to)];
  landings_.push(Landing{block->lands_at_ms, sequence_++, id_of(key)});
  return true;
}

bool SimStore::move_now(const BlockKey& key, Tier to, uint64_t now_ms) {
  Block* block = find(key);
  if (block == nullptr || to == Tier::kNone) return false;
  if (block->moving_to != Tier::kNone || block->pinned || block->tier == to) return false;
  if (to == Tier::kNvme && block->nvme_copy) return begin_move(key, to, now_ms);  // at once
  if (!make_room(to)) return false;
  used_[index(to)] += block_bytes_;
  if (to == Tier::kNvme) nvme_written_bytes_ += block_bytes_;
  const Tier from = block->tier;
  const size_t link = link_of(from, to);
  double& free_at = link_free_at_ms_[link][to > from ? 1 : 0];
  free_at = std::max(static_cast<double>(now_ms), free_at) +
            static_cast<double>(block_bytes_) / read_bytes_per_s_[link] * 1000.0;
  land(id_of(key), to);
  return true;
}

void SimStore::land(uint64_t id, Tier to) {
  Block& block = blocks_[id];
  if (block.moving_to != Tier::kNone) {
    --moving_out_[index(block.tier)];
    --moving_in_[index(block.moving_to)];
  }
  if (block.tier == Tier::kNvme && inclusive_nvme_) {
    add_copy(id);  // its NVMe room stays, as the copy's
  } else {
    used_[index(block.tier)] -= block_bytes_;
  }
  unplace(id, to);
  place(id, to);
  block.moving_to = Tier::kNone;
}

void SimStore::finish_moves(uint64_t now_ms) {
  while (!landings_.empty() && landings_.top().at_ms <= now_ms) {
    const uint64_t id = landings_.top().id;
    landings_.pop();
    const Block& block = blocks_[id];
    if (block.tier == Tier::kNone || block.moving_to == Tier::kNone) continue;
    land(id, block.moving_to);
  }
}

double SimStore::link_free_at_ms(Tier from, Tier to) const {
  const size_t link = link_of(from, to);
  return std::max(static_cast<double>(now_ms_), link_free_at_ms_[link][to > from ? 1 : 0]);
}

Tier SimStore::slowest_tier() const {
  for (Tier tier : {Tier::kNvme, Tier::kRam, Tier::kHbm}) {
    if (capacity_[index(tier)] > 0) return tier;
  }
  return Tier::kNone;
}

}  // namespace kvtier::bench
