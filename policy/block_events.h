// Block events: what happens to blocks where they are held, told by the store that holds
// them (the daemon's BlockStore, the simulator's SimStore) to every subscriber as it
// happens — the pattern of the session table's SessionObserver, for blocks. A peer
// policy is one subscriber (it learns its order of sacrifice from them); whatever else
// must know where blocks are subscribes the same way instead of adding a hook to the
// store.
//
// Thread-safety: a store tells its listeners on the thread that changes it (the daemon's
// control thread), synchronously, from inside its own methods: a listener may read the
// store, never change it from inside a notice.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/block_key.h"

namespace kvtier::policy {

// Why a block is no longer held in a tier.
enum class Departure : uint8_t {
  kPromoted,     // it moved up to a faster tier
  kDemoted,      // it moved down to a slower tier (or onto its copy there)
  kCopyDropped,  // its copy in this tier went to make room; the block stays above
  kEvicted,      // it left the store
  kReleased,     // let go unchosen: its write failed, or its holder gave it back
};

// Whether an order of sacrifice (or room for a Save) sent it away: what a peer policy's
// ghost entries learn from.
constexpr bool sacrificed(Departure why) {
  return why == Departure::kDemoted || why == Departure::kCopyDropped || why == Departure::kEvicted;
}

class BlockListener {
 public:
  virtual ~BlockListener() = default;
  // The block (`bytes` long) is now held in `tier`: a Save's new block (from its
  // reservation on), a move that landed, a copy written below it, a block recovered from
  // disk. A block with a copy is held in both tiers; one that moves back down onto its
  // copy leaves the tier above and enters the copy's tier again (a listener that keeps
  // where blocks are sees no change there).
  virtual void block_entered(const BlockKey& key, Tier tier, uint64_t bytes) = 0;
  // It no longer is, for the reason given.
  virtual void block_left(const BlockKey& key, Tier tier, Departure why) = 0;
};

// A store's listeners, told in the order they subscribed. Each is borrowed: it
// unsubscribes before it goes, or outlives the store.
class BlockListeners {
 public:
  void subscribe(BlockListener& listener) { listeners_.push_back(&listener); }
  void unsubscribe(BlockListener& listener) { std::erase(listeners_, &listener); }

  void entered(const BlockKey& key, Tier tier, uint64_t bytes) const {
    for (BlockListener* listener : listeners_) listener->block_entered(key, tier, bytes);
  }
  void left(const BlockKey& key, Tier tier, Departure why) const {
    for (BlockListener* listener : listeners_) listener->block_left(key, tier, why);
  }

 private:
  std::vector<BlockListener*> listeners_;
};

}  // namespace kvtier::policy
