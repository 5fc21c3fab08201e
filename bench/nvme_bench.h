// kvtier-bench nvme: the NVMe tier against the drive (docs/benchmarks.md has its
// targets), in one run:
//  * write and read of 2 MiB blocks through NvmeTier — io_uring, O_DIRECT from/to a
//    pool prepared like the daemon's RAM pool, checksums, fdatasync and the RocksDB
//    commit per job of 32 blocks, checksum verified on every read — side by side with
//    fio (direct=1, io_uring with fixed buffers and registered files, same directory,
//    same queue depth, same bytes; fio syncs nothing, the tier does). Without
//    fio on PATH the baseline is skipped and said so (no ratio targets then);
//  * recovery: kvtierd's start-up with an index of `recovery_blocks` small blocks,
//    time to accept connections (and the index reload alone, from its log);
//  * daemon memory per indexed block: RSS with that index minus RSS with an empty one,
//    divided by the number of blocks.
//
// Thread-safety: run_nvme_bench() is called from main only.
#pragma once

#include <cstdint>
#include <string>

#include "bench/benchmarks.h"
#include "bench/report.h"
#include "common/status.h"

namespace CLI {
class App;
}

namespace kvtier::bench {

struct NvmeBenchOptions {
  std::string dir;                       // where the files go; empty: a temp dir in ./var
  uint32_t blocks = 256;                 // 2 MiB blocks per round (512 MiB)
  uint32_t rounds = 3;                   // medians over rounds
  uint32_t queue_depth = 32;             // tier and fio
  uint64_t recovery_blocks = 1'000'000;  // 0: skip recovery and memory
  bool keep_files = false;
};

Result<BenchReport> run_nvme_bench(const CommonOptions& common, const NvmeBenchOptions& options);
CLI::App* add_nvme_subcommand(CLI::App& app, NvmeBenchOptions& options);

// nvme_recovery_bench.cpp: the recovery and memory part, adding to `report`.
Status run_nvme_recovery_bench(const CommonOptions& common, const NvmeBenchOptions& options,
                               const std::string& dir, BenchReport& report);

}  // namespace kvtier::bench
