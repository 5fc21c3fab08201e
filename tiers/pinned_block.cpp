// PinnedBlock and PendingWrite (declared in block_store.h).
#include <memory>
#include <utility>

#include "tiers/block_store.h"

namespace kvtier {
namespace detail {

BlockHandle::BlockHandle(StoreAnchor& anchor, const BlockKey& key, const BlockLocation& location)
    : anchor_(&anchor), key_(key), location_(location) {
  ++anchor.handles;
}

BlockHandle::BlockHandle(BlockHandle&& other) noexcept
    : anchor_(std::exchange(other.anchor_, nullptr)),
      key_(std::move(other.key_)),
      location_(other.location_) {}

BlockHandle& BlockHandle::operator=(BlockHandle&& other) noexcept {
  anchor_ = std::exchange(other.anchor_, nullptr);
  key_ = std::move(other.key_);
  location_ = other.location_;
  return *this;
}

BlockStore* BlockHandle::detach() {
  StoreAnchor* anchor = std::exchange(anchor_, nullptr);
  if (anchor == nullptr) return nullptr;
  --anchor->handles;
  BlockStore* store = anchor->store;
  if (store == nullptr && anchor->handles == 0) {
    // The store went first and gave the anchor up to its handles (~BlockStore); this
    // was the last of them.
    std::unique_ptr<StoreAnchor> orphan(anchor);
  }
  return store;
}

}  // namespace detail

PinnedBlock& PinnedBlock::operator=(PinnedBlock&& other) noexcept {
  if (this != &other) {
    reset();
    BlockHandle::operator=(std::move(other));
  }
  return *this;
}

void PinnedBlock::reset() {
  if (BlockStore* store = detach()) store->unpin(key());
}

PendingWrite& PendingWrite::operator=(PendingWrite&& other) noexcept {
  if (this != &other) {
    abort();
    BlockHandle::operator=(std::move(other));
  }
  return *this;
}

void PendingWrite::commit() {
  if (BlockStore* store = detach()) store->commit_write(key());
}

void PendingWrite::abort() {
  if (BlockStore* store = detach()) store->abort_write(key());
}

PendingMove& PendingMove::operator=(PendingMove&& other) noexcept {
  if (this != &other) {
    abort();
    BlockHandle::operator=(std::move(other));
    from_ = other.from_;
  }
  return *this;
}

void PendingMove::commit() {
  if (BlockStore* store = detach()) store->finish_move(key(), true);
}

void PendingMove::abort() {
  if (BlockStore* store = detach()) store->finish_move(key(), false);
}

}  // namespace kvtier
