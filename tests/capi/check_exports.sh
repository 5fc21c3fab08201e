#!/bin/sh
# libkvtier.so exports the C interface and nothing else: every defined dynamic symbol
# is kvtier_* in version node KVTIER_0 or a later KVTIER_0.N node (nm also lists each
# node itself, an absolute symbol), and the soname is libkvtier.so.0.
# Usage: check_exports.sh PATH/TO/libkvtier.so
set -eu
library="$1"
symbols=$(nm -D --defined-only "$library")
unexpected=$(printf '%s\n' "$symbols" | awk '
  $3 ~ /^KVTIER_0(\.[0-9]+)?$/ && $2 == "A" { next }
  $3 ~ /^kvtier_[a-z0-9_]+@@KVTIER_0(\.[0-9]+)?$/ { next }
  { print }')
if [ -n "$unexpected" ]; then
  echo "libkvtier exports symbols outside kvtier_*@@KVTIER_0:" >&2
  printf '%s\n' "$unexpected" >&2
  exit 1
fi
# Functions added after ABI version 0 shipped live in their own node, so a program
# linked against them fails to load on an older libkvtier.so.0 instead of crashing.
if ! printf '%s\n' "$symbols" | grep -q ' kvtier_last_error_retryable@@KVTIER_0\.2$'; then
  echo "kvtier_last_error_retryable is not in version node KVTIER_0.2" >&2
  exit 1
fi
for name in kvtier_save_with_retention kvtier_save_with_retention_async; do
  if ! printf '%s\n' "$symbols" | grep -q " $name@@KVTIER_0\.4\$"; then
    echo "$name is not in version node KVTIER_0.4" >&2
    exit 1
  fi
done
for name in kvtier_load_planes kvtier_load_planes_async; do
  if ! printf '%s\n' "$symbols" | grep -q " $name@@KVTIER_0\.5\$"; then
    echo "$name is not in version node KVTIER_0.5" >&2
    exit 1
  fi
done
for name in kvtier_hello_with_data_path kvtier_gpu_stager_probe kvtier_gpu_stager_create \
    kvtier_gpu_stager_save kvtier_gpu_stager_load kvtier_gpu_stager_begin_load \
    kvtier_gpu_stager_finish_range kvtier_gpu_stager_end_load kvtier_gpu_stager_destroy; do
  if ! printf '%s\n' "$symbols" | grep -q " $name@@KVTIER_0\.6\$"; then
    echo "$name is not in version node KVTIER_0.6" >&2
    exit 1
  fi
done
for name in kvtier_watch_tiers_async kvtier_pending_wait_tier_notices; do
  if ! printf '%s\n' "$symbols" | grep -q " $name@@KVTIER_0\.9\$"; then
    echo "$name is not in version node KVTIER_0.9" >&2
    exit 1
  fi
done
count=$(printf '%s\n' "$symbols" | grep -c ' T kvtier_')
if [ "$count" -lt 20 ]; then
  echo "only $count kvtier_* functions exported:" >&2
  printf '%s\n' "$symbols" >&2
  exit 1
fi
soname=$(readelf -d "$library" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
if [ "$soname" != "libkvtier.so.0" ]; then
  echo "soname is '$soname', expected libkvtier.so.0" >&2
  exit 1
fi
echo "$count kvtier_* functions, soname $soname"
