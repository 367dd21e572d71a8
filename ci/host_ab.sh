#!/usr/bin/env bash
# Host time per eager call, A/B in one process tree: the tree under ab_base/ (a git archive of
# an earlier commit's portattn/ and benchmarks/, untracked) against this checkout, alternating,
# two runs each, on the GPU (benchmarks/host_overhead.py --gpu).
set -uo pipefail
OUT=${OUT:-/tmp/portattn-out}; mkdir -p "$OUT"
CASES=${CASES:-paged,dense,paged_append_t,varlen_nograd,varlen_grad,paged_append_step}
for round in 1 2; do
  for side in base head; do
    if [ "$side" = base ]; then root=ab_base; else root=$PWD; fi
    PYTHONPATH=$root python3 "$root/benchmarks/host_overhead.py" --gpu --n 1000 --cases "$CASES" \
      2>/dev/null | grep -E "^\| [a-z]" | sed "s/^/$side$round /" | tee -a "$OUT/host_ab.log"
  done
done
