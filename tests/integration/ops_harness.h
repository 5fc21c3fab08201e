// Helpers for the operations tests (ops_*_test.cpp): run a command as another uid,
// scrape /metrics over HTTP, read metric samples, parse JSON, and edit files — on top
// of daemon_harness.h, which starts the real kvtierd.
//
// Thread-safety: none; one test thread (run_as forks, so call it single-threaded).
#pragma once

#include <sys/types.h>

#include <boost/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tests/integration/daemon_harness.h"

namespace kvtier::integration {

// Runs `argv` in a forked child that first becomes `uid`/`gid` (no supplementary
// groups), capturing its output. REQUIRES: root, one thread.
ProcessResult run_as(uid_t uid, gid_t gid, const std::vector<std::string>& argv);

// The address kvtierd logged for /metrics ("127.0.0.1:PORT"), waiting for the line.
Result<std::string> metrics_address(const Daemon& daemon);
// GET http://address/path; the body, or an error with the HTTP status.
Result<std::string> http_get(const std::string& address, const std::string& path);
// The value of the sample whose name and labels are exactly `series`
// (`kvtier_tier_blocks{tier="hbm"}`); nullopt when absent.
std::optional<double> metric(const std::string& text, const std::string& series);

// Parses JSON; InvalidArgument (with the text) when it is not JSON.
Result<boost::json::value> parse_json(const std::string& text);
// Every non-empty line of `text` parsed as JSON (for `kvtierctl top --json`).
Result<std::vector<boost::json::value>> parse_json_lines(const std::string& text);

Status write_file(const std::string& path, const std::string& text);

}  // namespace kvtier::integration
