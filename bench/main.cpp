// kvtier-bench: benchmarks of kvtierd, each measured side by side with its baseline in
// one run (docs/benchmarks.md: each benchmark and its target). A table on stdout, or with --json
// exactly one JSON object. Exit status: 0 when the benchmark ran (targets met or
// not, unless --require-targets), 1 when it could not run or data did not verify,
// 2 on bad flags, 3 when --require-targets is given and a target was missed.
#include <signal.h>

#include <CLI/CLI.hpp>

#include <cstdio>

#include "bench/benchmarks.h"
#ifdef KVTIER_HAVE_CUDA
#include "bench/gpu_bench.h"
#endif
#include "bench/nvme_bench.h"
#include "bench/remote_bench.h"
#include "bench/scale_bench.h"
#include "bench/sim_bench.h"
#include "bench/soak_bench.h"

namespace {

using namespace kvtier::bench;

int finish(const std::string& sub, kvtier::Result<BenchReport> report, bool json,
           bool require_targets) {
  if (!report.is_ok()) {
    std::fprintf(stderr, "kvtier-bench %s: %s\n", sub.c_str(), report.status().to_string().c_str());
    return 1;
  }
  if (json) {
    std::fputs(report->to_json().c_str(), stdout);
  } else {
    report->print_table(stdout);
  }
  std::fflush(stdout);
  return require_targets && !report->all_targets_met() ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  CommonOptions common;
  CopyOptions copy;
  RpcOptions rpc;
  bool json = false;
  bool require_targets = false;

  CLI::App app{
      "kvtier-bench: kvtierd benchmarks, each against a baseline measured in the same run"};
  app.require_subcommand(1);
  app.fallthrough();
  app.add_flag("--json", json, "print one JSON object instead of a table");
  app.add_flag("--require-targets", require_targets, "exit 3 when a performance target is missed");
  app.add_option("--socket", common.socket,
                 "use the kvtierd already listening here instead of starting one");
  app.add_option("--kvtierd", common.kvtierd_path,
                 "kvtierd binary to start (default: next to kvtier-bench)");
  app.add_option("--threads", common.threads, "daemon --copy-threads and memcpy baseline threads")
      ->check(CLI::Range(1, 64));
  app.add_flag("--keep-temp", common.keep_temp_dir,
               "keep the started daemon's temp dir (log, data)");

  CLI::App* copy_app = app.add_subcommand("copy", "save/load throughput of 2 MiB blocks vs memcpy");
  copy_app->add_option("--blocks", copy.blocks, "2 MiB blocks per round")
      ->check(CLI::Range(1u, 1u << 16));
  copy_app->add_option("--rounds", copy.rounds, "rounds (fresh hashes each)")
      ->check(CLI::Range(1u, 1000u));
  copy_app->add_option("--batch", copy.batch, "blocks per Save/Load request")
      ->check(CLI::Range(1u, 4096u));
  copy_app->add_option("--in-flight", copy.in_flight, "requests pipelined")
      ->check(CLI::Range(1u, 64u));
  copy_app
      ->add_option("--verify-every", copy.verify_every, "verify every Nth loaded block bit-exact")
      ->check(CLI::Range(1u, 1u << 16));

  CLI::App* rpc_app =
      app.add_subcommand("rpc", "Lookup round-trip latency vs a socketpair ping-pong");
  rpc_app->add_option("--iterations", rpc.iterations, "timed lookups")
      ->check(CLI::Range(1u, 10'000'000u));
  rpc_app->add_option("--warmup", rpc.warmup, "untimed lookups first")
      ->check(CLI::Range(0u, 10'000'000u));
  rpc_app->add_option("--hashes", rpc.hashes, "hashes per Lookup (all hit)")
      ->check(CLI::Range(1u, 4096u));

  SimOptions sim;
  sim.executable = argv[0];
  CLI::App* sim_app = add_sim_subcommand(app, sim);
  NvmeBenchOptions nvme;
  CLI::App* nvme_app = add_nvme_subcommand(app, nvme);
  ScaleBenchOptions scale;
  CLI::App* scale_app = add_scale_subcommand(app, scale);
  SoakBenchOptions soak;
  CLI::App* soak_app = add_soak_subcommand(app, soak);
  RemoteBenchOptions remote;
  CLI::App* remote_app = add_remote_subcommand(app, remote);
#ifdef KVTIER_HAVE_CUDA
  GpuBenchOptions gpu;
  CLI::App* gpu_app = add_gpu_subcommand(app, gpu);
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int printed = app.exit(e);  // prints help, or the error and a hint
    return printed == 0 ? 0 : 2;
  }
  if (copy_app->parsed())
    return finish("copy", run_copy_bench(common, copy), json, require_targets);
  if (sim_app->parsed()) return finish("sim", run_sim_bench(sim), json, require_targets);
#ifdef KVTIER_HAVE_CUDA
  if (gpu_app->parsed()) return finish("gpu", run_gpu_bench(gpu), json, require_targets);
#endif
  if (scale_app->parsed())
    return finish("scale", run_scale_bench(common, scale), json, require_targets);
  if (soak_app->parsed())
    return finish("soak", run_soak_bench(common, soak), json, require_targets);
  if (remote_app->parsed()) {
    return finish("remote", run_remote_bench(common, remote), json, require_targets);
  }
  if (nvme_app->parsed()) {
    return finish("nvme", run_nvme_bench(common, nvme), json, require_targets);
  }
  return finish("rpc", run_rpc_bench(common, rpc), json, require_targets);
}
