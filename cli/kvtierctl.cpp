// kvtierctl: the admin's view of kvtierd. `status` shows each tier's occupancy and
// the counters; `sessions` lists sessions with idle time and placement. Human tables
// by default, one JSON object with --json.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "client/client.h"
#include "common/json.h"
#include "common/units.h"

namespace {

using namespace kvtier;

int print_status(Client& client, bool json, bool all) {
  auto stats = client.stats(all);
  if (!stats.is_ok()) {
    std::fprintf(stderr, "kvtierctl: status: %s\n", stats.status().to_string().c_str());
    return stats.status().code() == StatusCode::kPermissionDenied ? 4 : 1;
  }
  const StatsInfo& s = *stats;
  if (json) {
    std::string tiers;
    for (const auto& t : s.tiers) {
      if (!tiers.empty()) tiers += ",";
      tiers += fmt::format(R"({{"tier":"{}","capacity_bytes":{},"used_bytes":{},"blocks":{}}})",
                           tier_name(t.tier), t.capacity_bytes, t.used_bytes, t.blocks);
    }
    std::printf(
        R"({"device":%s,"uptime_ms":%llu,"tiers":[%s],"sessions":{"active":%llu,"idle":%llu},)"
        R"("lookups":{"hits":%llu,"misses":%llu},)"
        R"("bytes":{"saved":%llu,"loaded":%llu,"demoted":%llu,"promoted":%llu},)"
        R"("pinned_blocks":%llu,"copies_in_flight":%llu,"connections":%u,"blocks_evicted":%llu,"data_loss_blocks":%llu})"
        "\n",
        json_quote(s.device_name).c_str(), static_cast<unsigned long long>(s.uptime_ms),
        tiers.c_str(), static_cast<unsigned long long>(s.sessions_active),
        static_cast<unsigned long long>(s.sessions_idle),
        static_cast<unsigned long long>(s.lookup_hits),
        static_cast<unsigned long long>(s.lookup_misses),
        static_cast<unsigned long long>(s.bytes_saved),
        static_cast<unsigned long long>(s.bytes_loaded),
        static_cast<unsigned long long>(s.bytes_demoted),
        static_cast<unsigned long long>(s.bytes_promoted),
        static_cast<unsigned long long>(s.pinned_blocks),
        static_cast<unsigned long long>(s.copies_in_flight), s.connections,
        static_cast<unsigned long long>(s.blocks_evicted),
        static_cast<unsigned long long>(s.data_loss_blocks));
    return 0;
  }
  std::printf("kvtierd on %s, up %s, %u connections\n\n", s.device_name.c_str(),
              format_duration_ms(s.uptime_ms).c_str(), s.connections);
  std::printf("%-6s %12s %12s %6s %10s\n", "TIER", "CAPACITY", "USED", "USE%", "BLOCKS");
  for (const auto& t : s.tiers) {
    double percent = t.capacity_bytes ? 100.0 * t.used_bytes / t.capacity_bytes : 0;
    std::printf("%-6s %12s %12s %5.1f%% %10llu\n", std::string(tier_name(t.tier)).c_str(),
                format_bytes(t.capacity_bytes).c_str(), format_bytes(t.used_bytes).c_str(), percent,
                static_cast<unsigned long long>(t.blocks));
  }
  std::printf("\nsessions   %llu active, %llu idle\n",
              static_cast<unsigned long long>(s.sessions_active),
              static_cast<unsigned long long>(s.sessions_idle));
  std::printf("lookups    %llu hits, %llu misses\n", static_cast<unsigned long long>(s.lookup_hits),
              static_cast<unsigned long long>(s.lookup_misses));
  std::printf("moved      %s saved, %s loaded, %s demoted, %s promoted\n",
              format_bytes(s.bytes_saved).c_str(), format_bytes(s.bytes_loaded).c_str(),
              format_bytes(s.bytes_demoted).c_str(), format_bytes(s.bytes_promoted).c_str());
  std::printf("in flight  %llu copies, %llu pinned blocks\n",
              static_cast<unsigned long long>(s.copies_in_flight),
              static_cast<unsigned long long>(s.pinned_blocks));
  std::printf("dropped    %llu evicted, %llu lost to corruption\n",
              static_cast<unsigned long long>(s.blocks_evicted),
              static_cast<unsigned long long>(s.data_loss_blocks));
  return 0;
}

int print_sessions(Client& client, bool json, bool all) {
  auto sessions = client.list_sessions(all);
  if (!sessions.is_ok()) {
    std::fprintf(stderr, "kvtierctl: sessions: %s\n", sessions.status().to_string().c_str());
    return sessions.status().code() == StatusCode::kPermissionDenied ? 4 : 1;
  }
  if (json) {
    std::string out;
    for (const auto& s : *sessions) {
      if (!out.empty()) out += ",";
      auto tier = [&](size_t i) {
        return i < s.blocks_per_tier.size() ? s.blocks_per_tier[i] : 0u;
      };
      out += fmt::format(
          R"({{"id":{},"namespace":{},"state":"{}","idle_ms":{},"turns":{},"blocks":{},)"
          R"("blocks_per_tier":{{"hbm":{},"ram":{},"nvme":{},"none":{}}},"layout_digest":"{:016x}"}})",
          json_quote(s.session_id), json_quote(s.namespace_name), s.active ? "active" : "idle",
          s.idle_ms, s.turns, s.blocks, tier(0), tier(1), tier(2), tier(3), s.layout_digest);
    }
    std::printf("{\"sessions\":[%s]}\n", out.c_str());
    return 0;
  }
  std::printf("%-32s %-14s %-7s %9s %6s %7s %6s %6s %6s\n", "SESSION", "NAMESPACE", "STATE", "IDLE",
              "TURNS", "BLOCKS", "HBM", "RAM", "GONE");
  for (const auto& s : *sessions) {
    auto tier = [&](size_t i) { return i < s.blocks_per_tier.size() ? s.blocks_per_tier[i] : 0u; };
    std::printf("%-32s %-14s %-7s %9s %6u %7u %6u %6u %6u\n", s.session_id.c_str(),
                s.namespace_name.c_str(), s.active ? "active" : "idle",
                s.active ? "-" : format_duration_ms(s.idle_ms).c_str(), s.turns, s.blocks, tier(0),
                tier(1), tier(3));
  }
  if (sessions->empty()) std::printf("(no sessions)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket = Client::default_socket_path();
  bool json = false, all = false;
  CLI::App app{"kvtierctl: inspect kvtierd"};
  app.add_option("--socket", socket, "kvtierd socket path");
  app.require_subcommand(1);
  auto* status = app.add_subcommand("status", "tier occupancy, sessions, hits and bytes moved");
  auto* sessions = app.add_subcommand("sessions", "sessions with idle time and blocks per tier");
  for (auto* command : {status, sessions}) {
    command->add_flag("--json", json, "one JSON object instead of a table");
    command->add_flag("--all", all, "every namespace (root or the admin group)");
  }
  CLI11_PARSE(app, argc, argv);
  auto client = Client::connect(socket);
  if (!client.is_ok()) {
    std::fprintf(stderr, "kvtierctl: %s\n", client.status().message().c_str());
    return 3;
  }
  if (status->parsed()) return print_status(**client, json, all);
  return print_sessions(**client, json, all);
}
