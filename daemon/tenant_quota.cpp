#include "daemon/tenant_quota.h"

#include <charconv>

#include "common/units.h"

namespace kvtier::daemon {

Result<TenantQuota> parse_tenant_quota(std::string_view spec) {
  TenantQuota quota;
  quota.spec = std::string(spec);
  auto next_word = [&spec]() {
    while (!spec.empty() && spec.front() == ' ') spec.remove_prefix(1);
    const size_t end = std::min(spec.find(' '), spec.size());
    std::string_view word = spec.substr(0, end);
    spec.remove_prefix(end);
    return word;
  };
  const std::string whole = quota.spec;
  quota.tenant = std::string(next_word());
  if (quota.tenant.empty() || quota.tenant.find('=') != std::string::npos) {
    return invalid_argument(
        "'{}': expected TENANT TIER=SIZE[ TIER=SIZE...] (TENANT: a namespace "
        "such as uid:1000, or *)",
        whole);
  }
  bool any = false;
  for (std::string_view word = next_word(); !word.empty(); word = next_word()) {
    const size_t eq = word.find('=');
    if (eq == std::string_view::npos) {
      return invalid_argument("'{}': '{}' is not TIER=SIZE", whole, word);
    }
    const std::string_view name = word.substr(0, eq);
    const std::string_view size = word.substr(eq + 1);
    int tier = -1;
    if (name == "hbm") tier = static_cast<int>(Tier::kHbm);
    if (name == "ram") tier = static_cast<int>(Tier::kRam);
    if (name == "nvme") tier = static_cast<int>(Tier::kNvme);
    if (tier < 0) {
      return invalid_argument("'{}': tier '{}' is not hbm, ram or nvme", whole, name);
    }
    TenantQuota::Limit& limit = quota.limits[static_cast<size_t>(tier)];
    if (limit.set) return invalid_argument("'{}': {} is given twice", whole, name);
    limit.set = true;
    if (!size.empty() && size.back() == '%') {
      double percent = 0;
      const std::string_view number = size.substr(0, size.size() - 1);
      auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), percent);
      if (number.empty() || ec != std::errc() || end != number.data() + number.size() ||
          !(percent > 0 && percent <= 100)) {
        return invalid_argument("'{}': '{}' is not a share above 0% and at most 100%", whole, size);
      }
      limit.percent = percent;
    } else {
      auto bytes = parse_bytes(size);
      if (!bytes.is_ok()) {
        return invalid_argument("'{}': {}: {}", whole, name, bytes.status().message());
      }
      limit.bytes = *bytes;
    }
    any = true;
  }
  if (!any) return invalid_argument("'{}': names no tier (expected TIER=SIZE)", whole);
  return quota;
}

std::optional<uint64_t> quota_bytes(std::span<const TenantQuota> quotas, std::string_view tenant,
                                    Tier tier, uint64_t capacity) {
  const size_t t = static_cast<size_t>(tier);
  if (t >= static_cast<size_t>(kLocalTierCount)) return std::nullopt;
  const TenantQuota* named = nullptr;
  const TenantQuota* others = nullptr;
  for (const TenantQuota& quota : quotas) {
    if (quota.tenant == tenant) named = &quota;
    if (quota.tenant == "*") others = &quota;
  }
  const TenantQuota* quota = named != nullptr ? named : others;
  if (quota == nullptr || !quota->limits[t].set) return std::nullopt;
  const TenantQuota::Limit& limit = quota->limits[t];
  if (limit.percent > 0) {
    return static_cast<uint64_t>(static_cast<double>(capacity) * limit.percent / 100.0);
  }
  return limit.bytes;
}

}  // namespace kvtier::daemon
