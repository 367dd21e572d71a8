#!/usr/bin/env bash
# Where a row's time varies between identical processes (issue 36; perf-notes row 108): `python
# ci/variance_probe.py` in PROCS (default 4) processes of the same checkout, one after another
# (the first compiles into the shared Triton cache), each printing per-kernel µs beside the
# flushed (do_bench) and queued times; then the lines sorted by workload and mode. Extra
# arguments go to the probe (default: the two skewed 16k d64 packs, varlen only).
#   bash ci/gpu_variance.sh [--fixed-order] [--workloads W ...]      (~1 min a process, warm)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
for i in $(seq 1 "${PROCS:-4}"); do
  TRITON_CACHE_DIR=/tmp/tc_variance timeout 200 python3 ci/variance_probe.py --tag "p$i" "$@" \
    >"$OUT/variance_$i.log" 2>&1
  echo "process $i rc=$?"
  nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
done
echo "tag | workload | kernel | mode | hashes | do_bench ms (2) | queued ms | host ms (max) | gc passes, ms | kernels ms | µs per kernel (min-max)"
cat "$OUT"/variance_*.log | grep -E "^p[0-9]+ \|" | sort -t'|' -k2,2 -k3,3 -k4,4 -s
grep -h -E "Error|Traceback" "$OUT"/variance_*.log | sort | uniq -c | head
