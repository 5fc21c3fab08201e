// kvtierctl: the operator's view of kvtierd, and its levers.
//
// Read commands (status, sessions, session, top, config) print human tables, or with
// --json one JSON object (top: one per refresh). Admin commands (evict, pin, unpin,
// drain, config, and --all views) need root or the daemon's admin group; the daemon
// refuses others and kvtierctl prints its reason. Exit codes are in kExitCodes.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "cli/format.h"
#include "client/client.h"
#include "common/json.h"
#include "common/units.h"

namespace {

using namespace kvtier;

constexpr int kOk = 0;
constexpr int kFailed = 1;            // the daemon refused the request as invalid, or it failed
constexpr int kUsage = 2;             // bad command line
constexpr int kUnreachable = 3;       // no daemon at the socket, or the connection broke
constexpr int kPermissionDenied = 4;  // an admin command from a non-admin
constexpr int kNotFound = 5;          // no such session

constexpr const char* kExitCodes =
    "\nExit codes: 0 ok; 1 the request failed (the message says why); 2 usage error;\n"
    "3 kvtierd unreachable; 4 permission denied (admin commands need root or the\n"
    "admin group); 5 no such session.\n";

constexpr const char* kServiceSocket = "/run/kvtier/kvtierd.sock";  // kvtierd.socket

// Without --socket: $KVTIER_SOCKET; else the user's own daemon (scripts/run) when its
// socket exists; else the system service's socket when that exists.
std::string default_socket() {
  const std::string user = Client::default_socket_path();
  if (std::getenv("KVTIER_SOCKET") != nullptr || ::access(user.c_str(), F_OK) == 0) return user;
  return ::access(kServiceSocket, F_OK) == 0 ? kServiceSocket : user;
}

struct Options {
  std::string socket = default_socket();
  bool json = false;
  bool all = false;
  std::string sort = "idle";
  std::string session_id;
  std::string namespace_name;
  std::string idle_over;
  std::string interval = "2s";
  unsigned iterations = 0;
  size_t rows = 15;
  uint32_t limit = 0;
};

int fail(std::string_view command, const Status& status) {
  std::fprintf(stderr, "kvtierctl %.*s: %s\n", static_cast<int>(command.size()), command.data(),
               status.to_string().c_str());
  switch (status.code()) {
    case StatusCode::kPermissionDenied:
      return kPermissionDenied;
    case StatusCode::kNotFound:
      return kNotFound;
    case StatusCode::kUnavailable:
      return kUnreachable;
    default:
      return kFailed;
  }
}

void print(const std::string& text) {
  std::fputs(text.c_str(), stdout);
  if (!text.empty() && text.back() != '\n') std::fputc('\n', stdout);
}

int status(Client& client, const Options& o) {
  auto stats = client.stats(o.all);
  if (!stats.is_ok()) return fail("status", stats.status());
  print(o.json ? cli::status_json(*stats) : cli::status_text(*stats));
  return kOk;
}

int sessions(Client& client, const Options& o) {
  // With --limit, the first page of the daemon's order; else every session, page by page.
  auto list = [&]() -> Result<std::vector<SessionInfo>> {
    if (o.limit == 0) return client.list_sessions(o.all);
    ListSessionsOptions options;
    options.all_namespaces = o.all;
    options.limit = o.limit;
    options.order = o.sort == "bytes" ? SessionOrder::kBytes : SessionOrder::kIdle;
    auto page = client.list_sessions_page(options);
    if (!page.is_ok()) return page.status();
    return std::move(page->sessions);
  }();
  if (!list.is_ok()) return fail("sessions", list.status());
  cli::sort_sessions(*list, o.sort == "bytes" ? cli::SessionSort::kBytes : cli::SessionSort::kIdle);
  print(o.json ? cli::sessions_json(*list) : cli::sessions_text(*list));
  return kOk;
}

int session(Client& client, const Options& o) {
  auto info = client.get_session(o.session_id, o.namespace_name);
  if (!info.is_ok()) return fail("session", info.status());
  print(o.json ? cli::session_json(*info) : cli::session_text(*info));
  return kOk;
}

int top(Client& client, const Options& o) {
  auto interval_ms = parse_duration_ms(o.interval);
  if (!interval_ms.is_ok() || *interval_ms == 0) {
    std::fprintf(stderr, "kvtierctl top: --interval: %s\n",
                 interval_ms.is_ok() ? "must be above 0" : interval_ms.status().message().c_str());
    return kUsage;
  }
  // A terminal gets a redrawn screen (ANSI home + clear); a pipe, a file or a dumb
  // terminal gets one frame after another.
  const char* term = std::getenv("TERM");
  const bool redraw =
      !o.json && ::isatty(STDOUT_FILENO) && term != nullptr && std::string_view(term) != "dumb";
  std::optional<StatsInfo> before;
  auto last = std::chrono::steady_clock::now();
  for (unsigned frame = 0; o.iterations == 0 || frame < o.iterations; ++frame) {
    if (frame > 0) std::this_thread::sleep_for(std::chrono::milliseconds(*interval_ms));
    auto stats = client.stats(o.all);
    if (!stats.is_ok()) return fail("top", stats.status());
    auto list = client.list_sessions(o.all);
    if (!list.is_ok()) return fail("top", list.status());
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last).count();
    const StatsInfo* previous = before ? &*before : nullptr;
    if (o.json) {
      print(cli::top_json(*stats, previous, seconds, *list, o.rows));
    } else {
      if (redraw) std::fputs("\x1b[H\x1b[2J", stdout);
      if (!redraw && frame > 0) std::fputs("\n", stdout);
      print(cli::top_frame(*stats, previous, seconds, *list, o.rows));
    }
    std::fflush(stdout);
    before = *stats;
    last = now;
  }
  return kOk;
}

int evict(Client& client, const Options& o) {
  uint64_t idle_over_ms = 0;
  if (o.session_id.empty() == o.idle_over.empty()) {
    std::fprintf(stderr, "kvtierctl evict: give either a SESSION or --idle-over DURATION\n");
    return kUsage;
  }
  if (!o.idle_over.empty()) {
    auto parsed = parse_duration_ms(o.idle_over);
    if (!parsed.is_ok() || *parsed == 0) {
      std::fprintf(stderr, "kvtierctl evict: --idle-over: %s\n",
                   parsed.is_ok() ? "must be above 0" : parsed.status().message().c_str());
      return kUsage;
    }
    idle_over_ms = *parsed;
  }
  auto result = client.evict(o.session_id, o.namespace_name, idle_over_ms);
  if (!result.is_ok()) return fail("evict", result.status());
  if (o.json) {
    print(fmt::format(R"({{"sessions":{},"blocks_evicted":{},"bytes_freed":{},"blocks_kept":{}}})",
                      result->sessions, result->blocks_evicted, result->bytes_freed,
                      result->blocks_kept));
  } else {
    print(fmt::format("evicted {} session{}: {} blocks freed ({}), {} kept (shared or in use)",
                      result->sessions, result->sessions == 1 ? "" : "s", result->blocks_evicted,
                      format_bytes(result->bytes_freed), result->blocks_kept));
  }
  return kOk;
}

int pin(Client& client, const Options& o, bool pinned) {
  auto held = client.pin(o.session_id, o.namespace_name, pinned);
  if (!held.is_ok()) return fail(pinned ? "pin" : "unpin", held.status());
  if (o.json) {
    print(fmt::format(R"({{"session":{},"pinned":{},"pinned_blocks":{}}})",
                      json_quote(o.session_id), pinned ? "true" : "false", *held));
  } else if (pinned) {
    print(fmt::format("pinned session '{}': {} blocks stay where they are until unpinned",
                      o.session_id, *held));
  } else {
    print(fmt::format("unpinned session '{}'", o.session_id));
  }
  return kOk;
}

int drain(Client& client, const Options& o) {
  auto result = client.drain();
  if (!result.is_ok()) return fail("drain", result.status());
  if (o.json) {
    print(fmt::format(R"({{"blocks_queued":{},"bytes_queued":{}}})", result->blocks_queued,
                      result->bytes_queued));
  } else {
    print(fmt::format("draining {} blocks ({}) to NVMe; watch `kvtierctl status`",
                      result->blocks_queued, format_bytes(result->bytes_queued)));
  }
  return kOk;
}

int config(Client& client, const Options& o) {
  auto entries = client.get_config();
  if (!entries.is_ok()) return fail("config", entries.status());
  print(o.json ? cli::config_json(*entries) : cli::config_text(*entries));
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"kvtierctl: watch and operate kvtierd"};
  app.footer(kExitCodes);
  app.add_option("--socket", o.socket,
                 "kvtierd socket (default: $KVTIER_SOCKET, your own daemon's, or /run/kvtier's)")
      ->type_name("PATH");
  app.add_flag("--json", o.json, "JSON instead of a table");
  app.require_subcommand(1);
  auto* status_cmd = app.add_subcommand("status", "tier occupancy, sessions, hits and bytes moved");
  auto* sessions_cmd = app.add_subcommand("sessions", "sessions with idle time and placement");
  sessions_cmd->add_option("--sort", o.sort, "idle (longest first) or bytes (largest first)")
      ->check(CLI::IsMember({"idle", "bytes"}));
  sessions_cmd->add_option("--limit", o.limit,
                           "only the first N in that order (0: all; the daemon sorts by the "
                           "bytes sessions reference)");
  auto* session_cmd = app.add_subcommand("session", "one session: blocks per tier, turns, idle");
  session_cmd->add_option("ID", o.session_id, "session id")->required();
  auto* top_cmd = app.add_subcommand("top", "live view: tier bars, rates, largest sessions");
  top_cmd->add_option("--interval", o.interval, "refresh period (e.g. 1s)")->type_name("DURATION");
  top_cmd->add_option("--iterations", o.iterations, "frames to show, then exit (0: until ^C)");
  top_cmd->add_option("--rows", o.rows, "sessions shown");
  auto* evict_cmd = app.add_subcommand("evict", "admin: drop a session, or all idle over a time");
  evict_cmd->add_option("SESSION", o.session_id, "session id");
  evict_cmd->add_option("--idle-over", o.idle_over, "every session idle longer (e.g. 30m)")
      ->type_name("DURATION");
  auto* pin_cmd = app.add_subcommand("pin", "admin: keep a session's blocks where they are");
  auto* unpin_cmd = app.add_subcommand("unpin", "admin: release a pin");
  for (auto* command : {pin_cmd, unpin_cmd})
    command->add_option("SESSION", o.session_id, "session id")->required();
  auto* drain_cmd = app.add_subcommand("drain", "admin: push every RAM/HBM block to NVMe");
  auto* config_cmd = app.add_subcommand("config", "admin: the daemon's effective configuration");
  for (auto* command : app.get_subcommands({})) {
    command->add_flag("--json", o.json, "JSON instead of a table");
  }
  for (auto* command : {status_cmd, sessions_cmd, top_cmd}) {
    command->add_flag("--all", o.all, "every namespace (admin)");
  }
  for (auto* command : {session_cmd, evict_cmd, pin_cmd, unpin_cmd}) {
    command->add_option("--namespace", o.namespace_name,
                        "the session's namespace (default: yours for `session`, any for admin)");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kOk : kUsage;
  }
  ::signal(SIGPIPE, SIG_DFL);
  auto client = Client::connect(o.socket);
  if (!client.is_ok()) return fail(app.get_subcommands().front()->get_name(), client.status());
  Client& c = **client;
  if (status_cmd->parsed()) return status(c, o);
  if (sessions_cmd->parsed()) return sessions(c, o);
  if (session_cmd->parsed()) return session(c, o);
  if (top_cmd->parsed()) return top(c, o);
  if (evict_cmd->parsed()) return evict(c, o);
  if (pin_cmd->parsed()) return pin(c, o, true);
  if (unpin_cmd->parsed()) return pin(c, o, false);
  if (drain_cmd->parsed()) return drain(c, o);
  if (config_cmd->parsed()) return config(c, o);
  return kUsage;
}
