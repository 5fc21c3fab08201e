// LocalRedisCluster: a Redis Cluster for the remote tier's tests and `kvtier-bench remote` —
// six redis-server processes from Debian (3 masters, 3 replicas) on free loopback
// ports, state in a temporary directory, joined with `redis-cli --cluster create`, and
// killed with the object. Header-only: each test binary that starts one includes it.
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "tests/support/process.h"
#include "tiers/remote_cluster.h"

namespace kvtier::remote {

using std::chrono::milliseconds;

// A claim on a client port among the processes of this machine that start clusters: an
// exclusive lock on /tmp/kvtier-redis-ports/<port>.lock, held while the returned fd is
// open. Seeing a port free and binding it are two steps, so two tests starting clusters
// side by side could both pick one; one node would then fail to bind, and the other
// test's node would answer in its place (and go away with that test). nullopt when
// another process holds the claim; an invalid fd where no lock file can be made (the
// bind check alone, as before).
inline std::optional<UniqueFd> claim_port(int port) {
  static constexpr const char* kDir = "/tmp/kvtier-redis-ports";
  (void)::mkdir(kDir, 0777);
  const std::string path = fmt::format("{}/{}.lock", kDir, port);
  UniqueFd fd(::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666));
  if (!fd.valid()) return UniqueFd();
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return std::nullopt;
  return fd;
}

inline bool port_free(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  return ::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
}

// Six redis-server processes (3 masters, 3 replicas) made into a cluster with
// `redis-cli --cluster create`; each node's cluster bus is its port + 10000.
class LocalRedisCluster {
 public:
  static constexpr int kNodes = 6;

  ~LocalRedisCluster() { stop_all(); }

  // Picks the ports (free now) without starting anything: a test can point a client at
  // the cluster before it exists. start() calls it when no ports were picked.
  Status choose_ports() {
    std::mt19937 rng(std::random_device{}());
    // Below Linux's ephemeral range (32768..60999), bus ports (+10000) included, so no
    // outgoing connection of another process takes one between the check and the bind;
    // and client ports (10000..19999) apart from bus ports (20000..29999), so clusters
    // of tests running side by side never want one port for both.
    std::uniform_int_distribution<int> base_of(10000, 19999);
    for (int attempt = 0; ports_.size() < kNodes && attempt < 200; ++attempt) {
      const int port = base_of(rng);
      if (std::find(ports_.begin(), ports_.end(), port) != ports_.end()) continue;
      std::optional<UniqueFd> claim = claim_port(port);
      if (claim && port_free(port) && port_free(port + 10000)) {
        ports_.push_back(port);
        port_claims_.push_back(std::move(*claim));
      }
    }
    if (ports_.size() < kNodes) return unavailable("no free loopback ports for Redis");
    return Status::ok();
  }

  // Starts the cluster; once more from scratch if the first try fails (a node that lost
  // its port to another process between the check and its bind, a replica that did not
  // sync in time on a loaded machine), on new ports unless the caller chose them.
  Status start() {
    const bool own_ports = ports_.empty();
    Status started = start_once();
    if (started.is_ok()) return started;
    stop_all();
    if (own_ports) {
      ports_.clear();
      port_claims_.clear();
    }
    Status again = start_once();
    if (again.is_ok()) return again;
    return unavailable("{}; tried again: {}", started.to_string(), again.to_string());
  }

 private:
  Status start_once() {
    if (ports_.empty()) KVTIER_RETURN_IF_ERROR(choose_ports());
    char tmpl[] = "/tmp/kvtier-redis-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return errno_status(errno, "mkdtemp");
    dir_ = tmpl;
    for (int port : ports_) {
      const std::string node_dir = fmt::format("{}/{}", dir_, port);
      std::filesystem::create_directories(node_dir);
      auto pid = support::spawn(
          {"/usr/bin/redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1",
           "--cluster-enabled", "yes", "--cluster-config-file", node_dir + "/nodes.conf",
           "--cluster-node-timeout", "2000",
           // Replicas sync at once, not after 5 s.
           "--repl-diskless-sync-delay", "0", "--dir", node_dir, "--save", "", "--appendonly", "no",
           "--daemonize", "no", "--logfile", node_dir + "/redis.log"},
          -1, -1);
      if (!pid.is_ok()) return pid.status();
      pids_.push_back(*pid);
    }
    for (int port : ports_) KVTIER_RETURN_IF_ERROR(wait_for_ping(port));
    std::vector<std::string> create = {"/usr/bin/redis-cli", "--cluster", "create"};
    for (int port : ports_) create.push_back(fmt::format("127.0.0.1:{}", port));
    create.insert(create.end(), {"--cluster-replicas", "1", "--cluster-yes"});
    support::ProcessResult made = support::run_process(create, milliseconds(60'000));
    if (!made.status.ok()) return unavailable("redis-cli --cluster create: {}", made.describe());
    for (int port : ports_) KVTIER_RETURN_IF_ERROR(wait_for_state_ok(port));
    // Replicas that have their master's data: a replica still syncing cannot be
    // promoted, and a test that kills a master would wait for a failover in vain.
    for (int port : ports_) KVTIER_RETURN_IF_ERROR(wait_for_replica_synced(port));
    return Status::ok();
  }

 public:
  const std::vector<int>& ports() const { return ports_; }
  std::vector<Endpoint> seeds() const {
    std::vector<Endpoint> out;
    for (int port : ports_) out.push_back({"127.0.0.1", port});
    return out;
  }
  // redis-cli -p port args...: its stdout, trimmed.
  std::string cli(int port, std::vector<std::string> args) const {
    std::vector<std::string> argv = {"/usr/bin/redis-cli", "-p", std::to_string(port)};
    argv.insert(argv.end(), args.begin(), args.end());
    support::ProcessResult r = support::run_process(argv, milliseconds(10'000));
    std::string out = r.stdout_text;
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out;
  }
  // SIGSTOP / SIGCONT: a node that hangs (accepts connections, answers nothing) rather
  // than one that is gone.
  void pause_node(int port, bool paused) {
    for (size_t i = 0; i < ports_.size(); ++i) {
      if (ports_[i] == port && pids_[i] > 0) ::kill(pids_[i], paused ? SIGSTOP : SIGCONT);
    }
  }
  // Waits until every master's replicas have acknowledged all it has written (their
  // offsets in INFO replication equal the master's), so a measurement that follows does
  // not share the CPUs with replication still streaming.
  Status wait_for_replication(milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int port : ports_) {
      for (;;) {
        const std::string info = cli(port, {"info", "replication"});
        if (info.find("role:master") == std::string::npos) break;
        const auto field = [&](std::string_view name, size_t from) -> std::optional<long long> {
          const size_t at = info.find(name, from);
          if (at == std::string::npos) return std::nullopt;
          return std::atoll(info.c_str() + at + name.size());
        };
        const auto master = field("master_repl_offset:", 0);
        bool caught_up = master.has_value();
        for (size_t at = info.find("slave0:"); caught_up && at != std::string::npos;
             at = info.find("\nslave", at + 1)) {
          const auto offset = field("offset=", at);
          caught_up = offset.has_value() && *offset >= *master;
        }
        if (caught_up) break;
        if (std::chrono::steady_clock::now() > deadline) {
          return unavailable("the replicas of {} did not catch up: {}", port, info);
        }
        std::this_thread::sleep_for(milliseconds(5));
      }
    }
    return Status::ok();
  }
  void kill_node(int port) {
    for (size_t i = 0; i < ports_.size(); ++i) {
      if (ports_[i] == port && pids_[i] > 0) {
        ::kill(pids_[i], SIGKILL);
        (void)support::wait_for_exit(pids_[i], milliseconds(5000));
        pids_[i] = -1;
      }
    }
  }

 private:
  void stop_all() {
    for (pid_t& pid : pids_) {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        (void)support::wait_for_exit(pid, milliseconds(5000));
      }
    }
    pids_.clear();
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
    dir_.clear();
  }
  // The last lines of a node's log, for an error that names it.
  std::string log_tail(int port) const {
    std::ifstream log(fmt::format("{}/{}/redis.log", dir_, port));
    std::vector<std::string> lines;
    for (std::string line; std::getline(log, line);) {
      lines.push_back(line);
      if (lines.size() > 5) lines.erase(lines.begin());
    }
    std::string out;
    for (const std::string& line : lines) out += "\n  " + line;
    return out;
  }
  Status wait_for_ping(int port) const {
    for (int i = 0; i < 500; ++i) {
      if (cli(port, {"ping"}) == "PONG") return Status::ok();
      std::this_thread::sleep_for(milliseconds(20));
    }
    return unavailable("redis-server on {} does not answer; its log ends:{}", port, log_tail(port));
  }
  Status wait_for_replica_synced(int port) const {
    for (int i = 0; i < 1000; ++i) {
      const std::string info = cli(port, {"info", "replication"});
      if (info.find("role:slave") == std::string::npos ||
          info.find("master_link_status:up") != std::string::npos) {
        return Status::ok();
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    return unavailable("the replica on {} never synced with its master; its log ends:{}", port,
                       log_tail(port));
  }
  Status wait_for_state_ok(int port) const {
    for (int i = 0; i < 1000; ++i) {
      if (cli(port, {"cluster", "info"}).find("cluster_state:ok") != std::string::npos) {
        return Status::ok();
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    return unavailable("the cluster is not ok on {}", port);
  }

  std::string dir_;
  std::vector<int> ports_;
  std::vector<UniqueFd> port_claims_;  // claim_port's, one per port, for the object's life
  std::vector<pid_t> pids_;
};

}  // namespace kvtier::remote
