#include "tiers/remote_tier.h"

#include <utility>

namespace kvtier {
namespace {

Status declined_in_flight() {
  return resource_exhausted("the remote tier has as many bytes in flight as it may; retry");
}

}  // namespace

bool RemoteStorageTier::try_write(std::vector<WriteItem> items,
                                  std::function<void(std::vector<Status>)> done) {
  std::vector<remote::RemoteStore::BlockWrite> writes;
  writes.reserve(items.size());
  for (const WriteItem& item : items) {
    writes.push_back({id_of_(item.slot.key), {item.source, item.slot.bytes}});
  }
  return worker_.put_borrowed(std::move(writes), std::move(done));
}

void RemoteStorageTier::write(std::vector<WriteItem> items,
                              std::function<void(std::vector<Status>)> done) {
  const size_t count = items.size();
  if (!try_write(std::move(items), done)) done(std::vector<Status>(count, declined_in_flight()));
}

bool RemoteStorageTier::try_read(std::vector<ReadItem> items,
                                 std::function<void(std::vector<ReadOutcome>)> done) {
  std::vector<remote::RemoteWorker::ReadInto> reads;
  reads.reserve(items.size());
  for (const ReadItem& item : items) {
    reads.push_back({id_of_(item.slot.key), {item.destination, item.slot.bytes}});
  }
  return worker_.get_into(std::move(reads), [done = std::move(done)](std::vector<Status> statuses) {
    std::vector<ReadOutcome> outcomes;
    outcomes.reserve(statuses.size());
    for (Status& status : statuses) {
      // A value that did not verify was deleted: it is gone.
      const bool corrupt = status.code() == StatusCode::kDataLoss;
      outcomes.push_back({std::move(status), corrupt});
    }
    done(std::move(outcomes));
  });
}

void RemoteStorageTier::read(std::vector<ReadItem> items,
                             std::function<void(std::vector<ReadOutcome>)> done) {
  const size_t count = items.size();
  if (!try_read(std::move(items), done)) {
    done(std::vector<ReadOutcome>(count, ReadOutcome{declined_in_flight(), false}));
  }
}

void RemoteStorageTier::probe(std::vector<Slot> slots,
                              std::function<void(std::vector<Result<bool>>)> done) {
  std::vector<remote::RemoteBlockId> ids;
  ids.reserve(slots.size());
  for (const Slot& slot : slots) ids.push_back(id_of_(slot.key));
  // Existence checks carry no payload: the worker never declines them.
  (void)worker_.exists_blocks(std::move(ids), std::move(done));
}

}  // namespace kvtier
