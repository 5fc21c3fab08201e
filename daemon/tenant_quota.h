// tenant-quota: what each tenant (a namespace: "uid:1000", or a shared-namespace name)
// keeps of a tier when the tier is full. A quota is a share, not a cap: while a tier
// has room any tenant may use it, and when blocks must leave the tier (a Save needs
// room, a watermark is passed) the blocks of tenants over their quota there go first
// — each such tenant's in its own policy order, until it is back at its quota — and a
// tenant within its quota loses blocks only when no tenant over quota has a block that
// can go (policy/block_order.h). Default: no quotas.
//
// Spec (one per entry, repeatable): "TENANT TIER=SIZE[ TIER=SIZE...]", TIER one of hbm,
// ram, nvme, SIZE bytes ("2GiB") or a share of the tier's capacity ("25%"). TENANT "*"
// is every tenant no entry names.
//
// Thread-safety: values and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/block_key.h"
#include "common/status.h"

namespace kvtier::daemon {

struct TenantQuota {
  struct Limit {
    bool set = false;
    uint64_t bytes = 0;  // when `percent` is 0
    double percent = 0;  // of the tier's capacity, in (0, 100]
  };
  std::string tenant;                         // a namespace name, or "*"
  std::array<Limit, kLocalTierCount> limits;  // by Tier: hbm, ram, nvme
  std::string spec;                           // as written
};

// InvalidArgument naming what is wrong ("'uid:1 hbm=lots': ...").
Result<TenantQuota> parse_tenant_quota(std::string_view spec);

// The quota in bytes of `tenant` in `tier`, whose capacity is `capacity`: from the entry
// naming the tenant, else from "*"; nullopt when neither sets one for the tier.
std::optional<uint64_t> quota_bytes(std::span<const TenantQuota> quotas, std::string_view tenant,
                                    Tier tier, uint64_t capacity);

}  // namespace kvtier::daemon
