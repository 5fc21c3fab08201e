// How kvtierctl shows what kvtierd reports: human tables (sizes and durations in human
// units) and JSON objects (raw numbers: bytes and milliseconds). Pure functions of the
// client's result types, so the formats are tested without a daemon.
//
// Thread-safety: stateless.
#pragma once

#include <string>
#include <vector>

#include "client/client.h"

namespace kvtier::cli {

std::string status_text(const StatsInfo& stats);
std::string status_json(const StatsInfo& stats);

enum class SessionSort { kIdle, kBytes };
// kIdle: longest idle first (active sessions last); kBytes: largest first. Ties by id.
void sort_sessions(std::vector<SessionInfo>& sessions, SessionSort sort);
std::string sessions_text(const std::vector<SessionInfo>& sessions);
std::string sessions_json(const std::vector<SessionInfo>& sessions);

std::string session_text(const SessionInfo& session);
std::string session_json(const SessionInfo& session);

std::string config_text(const std::vector<ConfigEntryInfo>& entries);
std::string config_json(const std::vector<ConfigEntryInfo>& entries);

// "[##########----------]" for used/capacity, `width` characters between the brackets.
std::string occupancy_bar(uint64_t used, uint64_t capacity, size_t width);

// One screen of `kvtierctl top`: tier bars, rates since `before` (none when null),
// and the `rows` largest sessions.
std::string top_frame(const StatsInfo& now, const StatsInfo* before, double seconds,
                      std::vector<SessionInfo> sessions, size_t rows);
std::string top_json(const StatsInfo& now, const StatsInfo* before, double seconds,
                     std::vector<SessionInfo> sessions, size_t rows);

}  // namespace kvtier::cli
