#!/bin/bash
# Syscalls kvtierd makes per Lookup: starts kvtierd as `kvtier-bench rpc` does (host
# device, 64 MiB HBM and RAM), counts its syscalls with `perf stat` on the kernel's
# syscall tracepoints while `kvtier-bench rpc` runs against it, and prints each kind of
# interest and the total divided by the Lookups made. The bench's own setup (Hello, a
# region, one Save of 32 blocks) is in the counts too: a few dozen calls over tens of
# thousands of Lookups. Tracepoint counting barely slows the daemon (strace would: a
# slower daemon finds the engine's next request already waiting more often, which
# changes the very counts measured). The bench's latencies from this run are not kept.
#   bench/rpc_syscalls.sh [build dir, default build] [lookups, default 20000]
#   KVTIERD=/path/to/kvtierd bench/rpc_syscalls.sh   (another daemon binary)
set -euo pipefail
build="${1:-build}"
lookups="${2:-20000}"
kvtierd="${KVTIERD:-$build/kvtierd}"
command -v perf > /dev/null || { echo "rpc_syscalls: perf is not installed (Debian: linux-perf)" >&2; exit 2; }
kinds=(epoll_wait epoll_ctl recvmsg sendto sendmsg)
events="raw_syscalls:sys_enter"
for kind in "${kinds[@]}"; do events+=",syscalls:sys_enter_$kind"; done
dir=$(mktemp -d /tmp/kvtier-rpc-syscalls-XXXXXX)
daemon=""
counter=""
cleanup() {
  [ -n "$counter" ] && kill -INT "$counter" 2> /dev/null || true
  [ -n "$daemon" ] && kill -TERM "$daemon" 2> /dev/null && wait "$daemon" 2> /dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
"$kvtierd" --socket "$dir/kvtierd.sock" --data-dir "$dir/data" --device host \
  --hbm-bytes 64MiB --ram-bytes 64MiB --hbm-idle-ms 1h --metrics-addr off > "$dir/kvtierd.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$dir/kvtierd.sock" ] && break; sleep 0.1; done
[ -S "$dir/kvtierd.sock" ] || { cat "$dir/kvtierd.log" >&2; exit 1; }
perf stat -x, -e "$events" -p "$daemon" -o "$dir/counts.csv" &
counter=$!
sleep 0.5  # perf attaches to every thread
"$build/kvtier-bench" rpc --socket "$dir/kvtierd.sock" --iterations "$lookups" --warmup 0 \
  > "$dir/bench.txt"
kill -INT "$counter"
wait "$counter" 2> /dev/null || true
counter=""
/usr/bin/python3 - "$dir/counts.csv" "$lookups" <<'PY'
import sys
lookups = int(sys.argv[2])
counts = {}
for line in open(sys.argv[1]):
    fields = line.strip().split(",")
    # perf stat -x,: value, unit, event, ...
    if len(fields) >= 3 and fields[0].isdigit():
        counts[fields[2].split(":")[-1].removeprefix("sys_enter_")] = int(fields[0])
total = counts.pop("sys_enter", None)
if total is None:
    sys.exit("rpc_syscalls: perf counted nothing (are the syscall tracepoints readable?)")
print(f"kvtierd syscalls per Lookup ({lookups} Lookups of 32 hashes):")
for name, calls in sorted(counts.items(), key=lambda r: -r[1]):
    if calls / lookups >= 0.01:
        print(f"  {name:20} {calls / lookups:6.2f}")
print(f"  {'all syscalls':20} {total / lookups:6.2f}")
PY
