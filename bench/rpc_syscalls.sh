#!/bin/bash
# Syscalls kvtierd makes per Lookup: starts kvtierd as `kvtier-bench rpc` does (host
# device, 64 MiB HBM and RAM), attaches `strace -c -f` to it once it listens, runs
# `kvtier-bench rpc` against it, detaches, and prints the daemon's syscalls of each
# kind divided by the Lookups made. The bench's own setup (Hello, a region, one Save of
# 32 blocks) is in the counts too: a few dozen calls over tens of thousands of
# Lookups. strace slows every call down, so the bench's latencies from this run mean
# nothing; only the counts do.
#   bench/rpc_syscalls.sh [build dir, default build] [lookups, default 20000]
#   KVTIERD=/path/to/kvtierd bench/rpc_syscalls.sh   (another daemon binary)
set -euo pipefail
build="${1:-build}"
lookups="${2:-20000}"
kvtierd="${KVTIERD:-$build/kvtierd}"
command -v strace > /dev/null || { echo "rpc_syscalls: strace is not installed" >&2; exit 2; }
dir=$(mktemp -d /tmp/kvtier-rpc-syscalls-XXXXXX)
daemon=""
tracer=""
cleanup() {
  [ -n "$tracer" ] && kill -INT "$tracer" 2> /dev/null || true
  [ -n "$daemon" ] && kill -TERM "$daemon" 2> /dev/null && wait "$daemon" 2> /dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
"$kvtierd" --socket "$dir/kvtierd.sock" --data-dir "$dir/data" --device host \
  --hbm-bytes 64MiB --ram-bytes 64MiB --hbm-idle-ms 1h --metrics-addr off > "$dir/kvtierd.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$dir/kvtierd.sock" ] && break; sleep 0.1; done
[ -S "$dir/kvtierd.sock" ] || { cat "$dir/kvtierd.log" >&2; exit 1; }
strace -c -f -p "$daemon" -o "$dir/strace.txt" 2> /dev/null &
tracer=$!
sleep 1  # strace attaches to every thread
"$build/kvtier-bench" rpc --socket "$dir/kvtierd.sock" --iterations "$lookups" --warmup 0 \
  > "$dir/bench.txt"
kill -INT "$tracer"
wait "$tracer" 2> /dev/null || true
tracer=""
/usr/bin/python3 - "$dir/strace.txt" "$lookups" <<'PY'
import sys
lookups = int(sys.argv[2])
rows = []
for line in open(sys.argv[1]):
    parts = line.split()
    # strace -c: % time, seconds, usecs/call, calls, [errors], syscall
    if len(parts) >= 5 and parts[3].isdigit() and not line.startswith("100.00"):
        rows.append((parts[-1], int(parts[3])))
total = sum(calls for _, calls in rows)
print(f"kvtierd syscalls per Lookup ({lookups} Lookups of 32 hashes):")
for name, calls in sorted(rows, key=lambda r: -r[1]):
    if calls / lookups >= 0.01:
        print(f"  {name:20} {calls / lookups:6.2f}")
print(f"  {'total':20} {total / lookups:6.2f}")
PY
