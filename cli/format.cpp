#include "cli/format.h"

#include <algorithm>

#include "common/json.h"
#include "common/units.h"

namespace kvtier::cli {
namespace {

uint32_t tier_count(const SessionInfo& s, size_t tier) {
  return tier < s.blocks_per_tier.size() ? s.blocks_per_tier[tier] : 0u;
}

std::string idle_text(const SessionInfo& s) {
  return s.active ? "-" : format_duration_ms(s.idle_ms);
}

double percent(uint64_t used, uint64_t capacity) {
  return capacity ? 100.0 * static_cast<double>(used) / static_cast<double>(capacity) : 0.0;
}

std::string rate(uint64_t now, uint64_t before, double seconds) {
  if (seconds <= 0 || now < before) return "-";
  return format_bytes(static_cast<uint64_t>(static_cast<double>(now - before) / seconds)) + "/s";
}

// The predicted return: "-" while active, "71% ~45s" (chance it comes back at all, and
// the median time until it does), "3% never" when it is not expected back.
std::string return_text(const SessionInfo& s) {
  if (s.active) return "-";
  const std::string when =
      s.return_in_ms == UINT64_MAX ? "never" : "~" + format_duration_ms(s.return_in_ms);
  return fmt::format("{:.0f}% {}", 100 * s.return_probability, when);
}

// The retention priority: "35", or "90 for 2m" while a timed one lasts.
std::string priority_text(const SessionInfo& s) {
  if (s.priority_remaining_ms == 0) return std::to_string(s.priority);
  return fmt::format("{} for {}", s.priority, format_duration_ms(s.priority_remaining_ms));
}

std::string session_object(const SessionInfo& s) {
  const std::string return_in =
      s.return_in_ms == UINT64_MAX ? "null" : std::to_string(s.return_in_ms);
  return fmt::format(
      R"({{"id":{},"namespace":{},"state":"{}","idle_ms":{},"turns":{},"blocks":{},"bytes":{},)"
      R"("blocks_per_tier":{{"hbm":{},"ram":{},"nvme":{},"none":{}}},"pinned":{},)"
      R"("return_probability":{:.4f},"return_in_ms":{},"priority":{},)"
      R"("priority_remaining_ms":{},"layout_digest":"{:016x}"}})",
      json_quote(s.session_id), json_quote(s.namespace_name), s.active ? "active" : "idle",
      s.idle_ms, s.turns, s.blocks, s.bytes, tier_count(s, 0), tier_count(s, 1), tier_count(s, 2),
      tier_count(s, 3), s.pinned ? "true" : "false", s.return_probability, return_in, s.priority,
      s.priority_remaining_ms, s.layout_digest);
}

std::string recent_moves_json(const StatsInfo& s) {
  std::string out;
  for (const auto& m : s.recent_moves) {
    out += fmt::format(
        R"({}{{"ago_ms":{},"kind":"{}","from":"{}","to":"{}","reason":{},"blocks":{},"bytes":{}}})",
        out.empty() ? "" : ",", m.ago_ms, m.kind, tier_name(m.from), tier_name(m.to),
        json_quote(m.reason), m.blocks, m.bytes);
  }
  return "[" + out + "]";
}

std::string remote_json(const StatsInfo::RemoteStatsInfo& r) {
  if (!r.configured) return "null";
  return fmt::format(
      R"({{"connected":{},"degraded":{},"masters":{},"stored_bytes":{},"budget_bytes":{},)"
      R"("in_flight_bytes":{},"write_lag_ms":{},"written_blocks":{},"fetched_blocks":{},)"
      R"("lookup_hits":{},"corrupt_values":{},"errors":{},"resumed_sessions":{},)"
      R"("deferred_blocks":{},"spilled_blocks":{},"spill_unwritten":{}}})",
      r.connected, r.degraded, r.masters, r.stored_bytes, r.budget_bytes, r.in_flight_bytes,
      r.write_lag_ms, r.written_blocks, r.fetched_blocks, r.lookup_hits, r.corrupt_values, r.errors,
      r.resumed_sessions, r.deferred_blocks, r.spilled_blocks, r.spill_unwritten);
}

std::string nvme_json(const StatsInfo::NvmeStatsInfo& n) {
  if (!n.configured) return "null";
  return fmt::format(R"({{"degraded":{},"reason":{},"degraded_ms":{},"degradations":{},"heals":{},)"
                     R"("heal_attempts":{}}})",
                     n.degraded, json_quote(n.reason), n.degraded_ms, n.degradations, n.heals,
                     n.heal_attempts);
}

std::string tenants_json(const StatsInfo& s) {
  std::string out;
  auto bytes = [](const std::array<uint64_t, 3>& values, bool quota) {
    std::string list;
    for (uint64_t v : values) {
      list += (list.empty() ? "" : ",") +
              (quota && v == UINT64_MAX ? std::string("null") : std::to_string(v));
    }
    return "[" + list + "]";
  };
  for (const auto& t : s.tenants) {
    out +=
        fmt::format(R"({}{{"tenant":{},"used_bytes":{},"quota_bytes":{}}})", out.empty() ? "" : ",",
                    json_quote(t.tenant), bytes(t.used_bytes, false), bytes(t.quota_bytes, true));
  }
  return "[" + out + "]";
}

std::string engines_json(const StatsInfo& s) {
  std::string out;
  for (const auto& e : s.engines) {
    out += fmt::format(
        R"({}{{"engine":{},"pid":{},"namespace":{},"model_id":{},"layout_digest":"{:016x}",)"
        R"("tp_rank":{},"tp_size":{},"data_path":{}}})",
        out.empty() ? "" : ",", json_quote(e.engine_name), e.pid, json_quote(e.namespace_name),
        json_quote(e.model_id), e.layout_digest, e.tp_rank, e.tp_size, json_quote(e.data_path));
  }
  return "[" + out + "]";
}

// The tier table, with each GPU's part of the HBM arena under it.
std::string tiers_text(const StatsInfo& s) {
  std::string out = fmt::format("{:<6} {:>12} {:>12} {:>6} {:>10} {:>12} {:>12}\n", "TIER",
                                "CAPACITY", "USED", "USE%", "BLOCKS", "COPIES", "WRITTEN");
  for (const auto& t : s.tiers) {
    out += fmt::format("{:<6} {:>12} {:>12} {:>5.1f}% {:>10} {:>12} {:>12}\n", tier_name(t.tier),
                       format_bytes(t.capacity_bytes), format_bytes(t.used_bytes),
                       percent(t.used_bytes, t.capacity_bytes), t.blocks,
                       format_bytes(t.copy_bytes), format_bytes(t.written_bytes));
  }
  for (const auto& g : s.gpus) {
    out += fmt::format("  hbm on {} ({}): {} of {} ({:.1f}%)\n", g.uuid, g.name,
                       format_bytes(g.hbm_used_bytes), format_bytes(g.hbm_capacity_bytes),
                       percent(g.hbm_used_bytes, g.hbm_capacity_bytes));
  }
  return out;
}

// What each tenant holds of each tier, and its quota there (tenant-quota).
std::string tenants_text(const StatsInfo& s) {
  std::string out = fmt::format("\n{:<20} {:>22} {:>22} {:>22}\n", "TENANT", "HBM (QUOTA)",
                                "RAM (QUOTA)", "NVME (QUOTA)");
  for (const auto& t : s.tenants) {
    std::string line = fmt::format("{:<20}", t.tenant);
    for (size_t i = 0; i < t.used_bytes.size(); ++i) {
      const std::string quota =
          t.quota_bytes[i] == UINT64_MAX ? "-" : format_bytes(t.quota_bytes[i]);
      line += fmt::format(" {:>22}", format_bytes(t.used_bytes[i]) + " (" + quota + ")");
    }
    out += line + "\n";
  }
  return out;
}

// Who is connected, and what each one's blocks are keyed by (its layout's model id:
// engines share blocks only when model id and layout are equal).
std::string engines_text(const StatsInfo& s) {
  std::string out = fmt::format("\n{:<24} {:>8} {:<12} {:<6} {:<16} {}\n", "ENGINE", "PID",
                                "NAMESPACE", "TP", "LAYOUT", "MODEL");
  for (const auto& e : s.engines) {
    out += fmt::format("{:<24} {:>8} {:<12} {:<6} {:016x} {}\n", e.engine_name, e.pid,
                       e.namespace_name, fmt::format("{}/{}", e.tp_rank, e.tp_size),
                       e.layout_digest, e.model_id);
  }
  return out;
}

// The counters: sessions, lookups, bytes moved, copies in flight, blocks dropped, and
// partial Saves when there were any.
std::string counters_text(const StatsInfo& s) {
  std::string out = fmt::format("\nsessions   {} active, {} idle, {} pinned\n", s.sessions_active,
                                s.sessions_idle, s.pinned_sessions);
  out += fmt::format("lookups    {} hits, {} misses\n", s.lookup_hits, s.lookup_misses);
  out += fmt::format("moved      {} saved, {} loaded, {} demoted, {} promoted\n",
                     format_bytes(s.bytes_saved), format_bytes(s.bytes_loaded),
                     format_bytes(s.bytes_demoted), format_bytes(s.bytes_promoted));
  out += fmt::format("in flight  {} copies, {} pinned blocks; {} blocks held by admin pins\n",
                     s.copies_in_flight, s.pinned_blocks, s.admin_pinned_blocks);
  out += fmt::format("dropped    {} evicted, {} lost to corruption\n", s.blocks_evicted,
                     s.data_loss_blocks);
  if (s.partial_saves > 0) {
    out += fmt::format("partial    {} Saves kept a prefix ({} blocks not saved: no room)\n",
                       s.partial_saves, s.blocks_not_saved);
  }
  return out;
}

// The NVMe tier's health, for a tier that has degraded at least once.
std::string nvme_text(const StatsInfo::NvmeStatsInfo& n) {
  std::string out;
  if (n.degraded) {
    out += fmt::format("nvme       DEGRADED for {}: read-only until it heals ({})\n",
                       format_duration_ms(n.degraded_ms), n.reason);
  } else {
    out += "nvme       healthy\n";
  }
  out += fmt::format("           degraded {} times, healed {} times ({} tries)\n", n.degradations,
                     n.heals, n.heal_attempts);
  return out;
}

// The remote tier: its cluster, what it stores, and what went there and back.
std::string remote_text(const StatsInfo::RemoteStatsInfo& r) {
  std::string out = fmt::format(
      "remote     {}, {} masters{}; {} of {} stored, write-behind lag {}\n",
      r.connected ? "connected" : "not connected", r.masters,
      r.degraded ? ", DEGRADED (a node is down or failing)" : "", format_bytes(r.stored_bytes),
      format_bytes(r.budget_bytes), format_duration_ms(r.write_lag_ms));
  out += fmt::format(
      "           {} blocks written, {} read, {} lookup hits, {} sessions resumed, {} corrupt "
      "values, {} errors, {} blocks deferred\n",
      r.written_blocks, r.fetched_blocks, r.lookup_hits, r.resumed_sessions, r.corrupt_values,
      r.errors, r.deferred_blocks);
  out += fmt::format("           NVMe evictions: {} written there on their way out, {} not\n",
                     r.spilled_blocks, r.spill_unwritten);
  return out;
}

// The policy and the planner's recent moves, newest last.
std::string planner_text(const StatsInfo& s) {
  std::string out = fmt::format("\nplanner    {} policy; recent moves, newest last:\n",
                                s.policy.empty() ? "?" : s.policy);
  if (s.recent_moves.empty()) out += "  (none yet)\n";
  for (const auto& m : s.recent_moves) {
    out += fmt::format("  {:>8} ago  {:<7} {:>4} -> {:<4} {:>6} blocks {:>10}  {}\n",
                       format_duration_ms(m.ago_ms), m.kind, tier_name(m.from), tier_name(m.to),
                       m.blocks, format_bytes(m.bytes), m.reason);
  }
  return out;
}

}  // namespace

std::string status_json(const StatsInfo& s) {
  std::string tiers;
  for (const auto& t : s.tiers) {
    if (!tiers.empty()) tiers += ",";
    tiers += fmt::format(
        R"({{"tier":"{}","capacity_bytes":{},"used_bytes":{},"blocks":{},"copy_bytes":{},)"
        R"("written_bytes":{}}})",
        tier_name(t.tier), t.capacity_bytes, t.used_bytes, t.blocks, t.copy_bytes, t.written_bytes);
  }
  std::string gpus;
  for (const auto& g : s.gpus) {
    if (!gpus.empty()) gpus += ",";
    gpus +=
        fmt::format(R"({{"uuid":{},"name":{},"hbm_capacity_bytes":{},"hbm_used_bytes":{}}})",
                    json_quote(g.uuid), json_quote(g.name), g.hbm_capacity_bytes, g.hbm_used_bytes);
  }
  return fmt::format(
      R"({{"device":{},"uptime_ms":{},"starting":{},"fill_bytes":{},"tiers":[{}],"gpus":[{}],)"
      R"("sessions":{{"active":{},"idle":{},"pinned":{}}},)"
      R"("lookups":{{"hits":{},"misses":{}}},)"
      R"("bytes":{{"saved":{},"loaded":{},"demoted":{},"promoted":{}}},)"
      R"("pinned_blocks":{},"admin_pinned_blocks":{},"copies_in_flight":{},"connections":{},)"
      R"("blocks_evicted":{},"data_loss_blocks":{},"policy":{},"recent_moves":{},"remote":{},)"
      R"("nvme":{},"tenants":{},"partial_saves":{},"blocks_not_saved":{},"engines":{}}})",
      json_quote(s.device_name), s.uptime_ms, s.starting ? "true" : "false", s.fill_bytes, tiers,
      gpus, s.sessions_active, s.sessions_idle, s.pinned_sessions, s.lookup_hits, s.lookup_misses,
      s.bytes_saved, s.bytes_loaded, s.bytes_demoted, s.bytes_promoted, s.pinned_blocks,
      s.admin_pinned_blocks, s.copies_in_flight, s.connections, s.blocks_evicted,
      s.data_loss_blocks, json_quote(s.policy), recent_moves_json(s), remote_json(s.remote),
      nvme_json(s.nvme), tenants_json(s), s.partial_saves, s.blocks_not_saved, engines_json(s));
}

std::string status_text(const StatsInfo& s) {
  std::string out = fmt::format("kvtierd on {}, up {}, {} connections\n", s.device_name,
                                format_duration_ms(s.uptime_ms), s.connections);
  if (s.starting) {
    out += fmt::format(
        "starting: filling {} of memory pools; Save/Load/BeginTurn/Drain wait until it is done\n",
        format_bytes(s.fill_bytes));
  }
  out += "\n";
  out += tiers_text(s);
  if (!s.tenants.empty()) out += tenants_text(s);
  if (!s.engines.empty()) out += engines_text(s);
  out += counters_text(s);
  if (s.nvme.configured && (s.nvme.degraded || s.nvme.degradations > 0)) out += nvme_text(s.nvme);
  if (s.remote.configured) out += remote_text(s.remote);
  out += planner_text(s);
  return out;
}

void sort_sessions(std::vector<SessionInfo>& sessions, SessionSort sort) {
  std::sort(sessions.begin(), sessions.end(), [sort](const SessionInfo& a, const SessionInfo& b) {
    if (sort == SessionSort::kBytes && a.bytes != b.bytes) return a.bytes > b.bytes;
    if (sort == SessionSort::kIdle) {
      if (a.active != b.active) return !a.active;
      if (a.idle_ms != b.idle_ms) return a.idle_ms > b.idle_ms;
    }
    if (a.namespace_name != b.namespace_name) return a.namespace_name < b.namespace_name;
    return a.session_id < b.session_id;
  });
}

std::string sessions_json(const std::vector<SessionInfo>& sessions) {
  std::string out;
  for (const auto& s : sessions) out += (out.empty() ? "" : ",") + session_object(s);
  return "{\"sessions\":[" + out + "]}";
}

std::string sessions_text(const std::vector<SessionInfo>& sessions) {
  if (sessions.empty()) return "(no sessions)\n";
  size_t id_width = 7, ns_width = 9;
  for (const auto& s : sessions) {
    id_width = std::max(id_width, s.session_id.size());
    ns_width = std::max(ns_width, s.namespace_name.size());
  }
  id_width = std::min<size_t>(id_width, 48);
  std::string out = fmt::format(
      "{:<{}} {:<{}} {:<6} {:>9} {:>12} {:>10} {:>5} {:>6} {:>10} {:>5} {:>5} {:>5} {:>5} {}\n",
      "SESSION", id_width, "NAMESPACE", ns_width, "STATE", "IDLE", "RETURN", "PRIORITY", "TURNS",
      "BLOCKS", "SIZE", "HBM", "RAM", "NVME", "GONE", "PIN");
  for (const auto& s : sessions) {
    out += fmt::format(
        "{:<{}} {:<{}} {:<6} {:>9} {:>12} {:>10} {:>5} {:>6} {:>10} {:>5} {:>5} {:>5} {:>5} {}\n",
        s.session_id, id_width, s.namespace_name, ns_width, s.active ? "active" : "idle",
        idle_text(s), return_text(s), priority_text(s), s.turns, s.blocks, format_bytes(s.bytes),
        tier_count(s, 0), tier_count(s, 1), tier_count(s, 2), tier_count(s, 3),
        s.pinned ? "yes" : "-");
  }
  return out;
}

std::string session_json(const SessionInfo& session) {
  return session_object(session);
}

std::string session_text(const SessionInfo& s) {
  std::string out = fmt::format("session    {}\nnamespace  {}\n", s.session_id, s.namespace_name);
  out += s.active ? "state      active (a turn is in progress)\n"
                  : fmt::format("state      idle for {}\n", format_duration_ms(s.idle_ms));
  out += fmt::format("turns      {}\n", s.turns);
  out += fmt::format("priority   {} (retention, 1..100; 35 is the default)\n", priority_text(s));
  if (!s.active)
    out += fmt::format("return     {} (chance it comes back; median wait)\n", return_text(s));
  out += fmt::format("blocks     {} ({} held)\n", s.blocks, format_bytes(s.bytes));
  out += fmt::format("  hbm      {}\n  ram      {}\n  nvme     {}\n  gone     {}\n",
                     tier_count(s, 0), tier_count(s, 1), tier_count(s, 2), tier_count(s, 3));
  out += fmt::format("pinned     {}\n", s.pinned ? "yes (kvtierctl unpin releases it)" : "no");
  out += fmt::format("layout     {:016x}\n", s.layout_digest);
  return out;
}

std::string config_text(const std::vector<ConfigEntryInfo>& entries) {
  size_t width = 0;
  for (const auto& e : entries) width = std::max(width, e.key.size() + 3 + e.value.size());
  std::string out = "# kvtierd effective configuration ([reload]: SIGHUP applies changes)\n";
  for (const auto& e : entries) {
    std::string line = e.key + " = " + e.value;
    out += e.reloadable ? fmt::format("{:<{}}  # [reload]\n", line, width) : line + "\n";
  }
  return out;
}

std::string config_json(const std::vector<ConfigEntryInfo>& entries) {
  std::string out;
  for (const auto& e : entries) {
    out += fmt::format(R"({}{{"key":{},"value":{},"reloadable":{}}})", out.empty() ? "" : ",",
                       json_quote(e.key), json_quote(e.value), e.reloadable ? "true" : "false");
  }
  return "{\"config\":[" + out + "]}";
}

std::string occupancy_bar(uint64_t used, uint64_t capacity, size_t width) {
  size_t filled = capacity ? static_cast<size_t>(static_cast<double>(width) * used / capacity) : 0;
  filled = std::min(filled, width);
  return "[" + std::string(filled, '#') + std::string(width - filled, '-') + "]";
}

std::string top_frame(const StatsInfo& now, const StatsInfo* before, double seconds,
                      std::vector<SessionInfo> sessions, size_t rows) {
  std::string out = fmt::format(
      "kvtierd on {}, up {}, {} connections, {} sessions ({} active, {} pinned)\n\n",
      now.device_name, format_duration_ms(now.uptime_ms), now.connections,
      now.sessions_active + now.sessions_idle, now.sessions_active, now.pinned_sessions);
  for (const auto& t : now.tiers) {
    out += fmt::format("{:<5} {} {:>5.1f}%  {:>10} / {:<10} {:>8} blocks\n", tier_name(t.tier),
                       occupancy_bar(t.used_bytes, t.capacity_bytes, 40),
                       percent(t.used_bytes, t.capacity_bytes), format_bytes(t.used_bytes),
                       format_bytes(t.capacity_bytes), t.blocks);
  }
  const bool rates = before != nullptr && seconds > 0;
  auto r = [&](uint64_t StatsInfo::*field) {
    return rates ? rate(now.*field, before->*field, seconds) : std::string("-");
  };
  out += fmt::format("\nsave {}  load {}  demote {}  promote {}\n", r(&StatsInfo::bytes_saved),
                     r(&StatsInfo::bytes_loaded), r(&StatsInfo::bytes_demoted),
                     r(&StatsInfo::bytes_promoted));
  const uint64_t lookups = now.lookup_hits + now.lookup_misses;
  out += fmt::format("hit rate {:.1f}% of {} blocks asked for; {} evicted, {} lost\n\n",
                     percent(now.lookup_hits, lookups), lookups, now.blocks_evicted,
                     now.data_loss_blocks);
  sort_sessions(sessions, SessionSort::kBytes);
  if (sessions.size() > rows) sessions.resize(rows);
  out += sessions_text(sessions);
  return out;
}

std::string top_json(const StatsInfo& now, const StatsInfo* before, double seconds,
                     std::vector<SessionInfo> sessions, size_t rows) {
  auto per_second = [&](uint64_t StatsInfo::*field) -> uint64_t {
    if (before == nullptr || seconds <= 0 || now.*field < before->*field) return 0;
    return static_cast<uint64_t>(static_cast<double>(now.*field - before->*field) / seconds);
  };
  sort_sessions(sessions, SessionSort::kBytes);
  if (sessions.size() > rows) sessions.resize(rows);
  std::string list;
  for (const auto& s : sessions) list += (list.empty() ? "" : ",") + session_object(s);
  return fmt::format(
      R"({{"status":{},"bytes_per_second":{{"saved":{},"loaded":{},"demoted":{},"promoted":{}}},)"
      R"("top_sessions":[{}]}})",
      status_json(now), per_second(&StatsInfo::bytes_saved), per_second(&StatsInfo::bytes_loaded),
      per_second(&StatsInfo::bytes_demoted), per_second(&StatsInfo::bytes_promoted), list);
}

}  // namespace kvtier::cli
