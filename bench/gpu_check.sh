#!/bin/bash
# The GPU check, for a machine with an NVIDIA GPU, in one go: builds what it needs, runs
# the real-GPU tests with KVTIER_REQUIRE_GPU=1 (a test that cannot run fails), then
# kvtier-bench gpu. Results go to $OUT (default ./gpu-check): tests.log, bench.json and
# bench.txt (its results and targets). Run from the repository root after scripts/setup (or on a machine whose
# build/ is already made):
#   OUT=/tmp/gpu bash bench/gpu_check.sh
set -uo pipefail
out="${OUT:-gpu-check}"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
if [ ! -x build/kvtierd ] || [ ! -x build/kvtier-bench ]; then
  cmake -S . -B build > "$out/cmake.log" 2>&1
  cmake --build build -j"$(nproc)" > "$out/build.log" 2>&1 || { echo "build failed"; exit 1; }
fi
status=0
(cd build && KVTIER_REQUIRE_GPU=1 ctest --output-on-failure --timeout 300 \
   -R 'cuda_device_gpu|gpu_integration_gpu|python_tests' ) > "$out/tests.log" 2>&1 || status=1
tail -5 "$out/tests.log"
build/kvtier-bench gpu --json > "$out/bench.json" 2> "$out/bench.err" || status=1
/usr/bin/python3 - "$out/bench.json" <<'PY' | tee "$out/bench.txt"
import json, sys
report = json.load(open(sys.argv[1]))
for name, value in sorted(report["results"].items()):
    print(f"{name:48} {value:10.4g}")
for t in report["targets"]:
    print(f'{t["metric"]:48} {t["value"]:10.4g} {t["op"]} {t["target"]:<6} {"met" if t["met"] else "MISSED"}')
PY
exit $status
