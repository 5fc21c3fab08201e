#include "tiers/tier.h"

#include <cstdlib>

#include "common/log.h"

namespace kvtier {
namespace {

// What a tier answers for an operation it does not have.
Status declined(std::string_view what, Tier tier) {
  return not_supported("the {} tier is not {}", tier_name(tier), what);
}

}  // namespace

std::shared_ptr<std::byte> allocate_io_buffer(uint64_t bytes) {
  return {static_cast<std::byte*>(std::aligned_alloc(kIoBufferAlignment, bytes)), std::free};
}

void log_tier_miscount(size_t answered, size_t asked) {
  KVTIER_LOG_ERROR("a tier answered {} entries for {} blocks; the rest count as failed", answered,
                   asked);
}

const std::shared_ptr<Memory>& StorageTier::memory() const {
  static const std::shared_ptr<Memory> kNone;
  return kNone;
}

std::byte* StorageTier::host_address(uint64_t offset) const {
  const std::shared_ptr<Memory>& m = memory();
  if (m == nullptr || m->host_data() == nullptr) return nullptr;
  return m->host_data() + offset;
}

void StorageTier::write(std::vector<WriteItem> items,
                        std::function<void(std::vector<Status>)> done) {
  done(std::vector<Status>(items.size(), declined("written from host memory", id())));
}

void StorageTier::read(std::vector<ReadItem> items,
                       std::function<void(std::vector<ReadOutcome>)> done) {
  done(std::vector<ReadOutcome>(items.size(),
                                ReadOutcome{declined("read into host memory", id()), false}));
}

bool StorageTier::try_write(std::vector<WriteItem> items,
                            std::function<void(std::vector<Status>)> done) {
  write(std::move(items), std::move(done));
  return true;
}

bool StorageTier::try_read(std::vector<ReadItem> items,
                           std::function<void(std::vector<ReadOutcome>)> done) {
  read(std::move(items), std::move(done));
  return true;
}

void StorageTier::probe(std::vector<Slot> slots,
                        std::function<void(std::vector<Result<bool>>)> done) {
  done(std::vector<Result<bool>>(slots.size(), declined("probed for blocks", id())));
}

void StorageTier::release(std::vector<Slot> /*slots*/, std::function<void(Status)> done) {
  done(Status::ok());
}

}  // namespace kvtier
