// kvtier-bench gpu: the CUDA backend's copies against the copy engine's own speed
// (docs/benchmarks.md, its targets; real GPU only — on the fake driver it runs, but
// its figures say nothing about hardware and the report says so).
//
// All in one run, each measured right next to its baseline:
//  * gathered D2H and scattered H2D of 2 MiB blocks through CudaDevice (the daemon's
//    copy path: planes of 8, 16, 32 and 128 KiB at their engine strides, batched into
//    one cuMemcpyBatchAsync per stream where the driver has it) vs ONE cuMemcpyAsync of
//    the same number of bytes between the same GPU and the same pinned pool;
//  * D2D gather of the same planes into the HBM arena vs one cuMemcpyAsync D2D;
//  * a 32K-token session at 128 KiB/token (4 GiB, Llama-3-8B): saved into the arena,
//    demoted to the pinned pool, loaded back into the engine's blocks, in ms each;
//  * the staged path (client/gpu_stager.h) at 4, 8 and 32 KiB planes: the gather
//    kernel into a staging buffer then one copy per 2 MiB block to the pool (a Save),
//    and back with the scatter kernel (a Load), vs one cuMemcpyAsync, with the
//    kernels' share of the copy time; the session loaded in small planes by plane
//    copies and by the staged path;
//  * pinned pool set-up, s/GiB.
// The engine's KV cache is exportable VMM memory made in this process and opened
// through CudaDevice as a region, as kvtierd opens an engine's.
//
// Thread-safety: run_gpu_bench() is called from main only.
#pragma once

#include <cstdint>
#include <string>

#include "bench/report.h"
#include "common/status.h"

namespace CLI {
class App;
}

namespace kvtier::bench {

struct GpuBenchOptions {
  std::string gpu_uuid;             // empty: the first GPU
  uint64_t bytes = 1ull << 30;      // bytes moved per measurement
  uint32_t rounds = 5;              // medians over rounds
  uint64_t session_tokens = 32768;  // the session part (0: skip)
  uint64_t bytes_per_token = 128 << 10;
  uint64_t session_plane_bytes = 4 << 10;  // the small-plane session load (staged vs copies)
  uint64_t pool_bytes = 4ull << 30;        // pinned pool measured for s/GiB
};

Result<BenchReport> run_gpu_bench(const GpuBenchOptions& options);
CLI::App* add_gpu_subcommand(CLI::App& app, GpuBenchOptions& options);

}  // namespace kvtier::bench
