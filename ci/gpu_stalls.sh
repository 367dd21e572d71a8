#!/usr/bin/env bash
# Where the consumer warps of the d128 forward wait (issue 36, perf-notes row 97; carry .fa4):
# Nsight Compute's warp-state sampling per SASS instruction of portattn's Gluon forward and of
# FA4 deterministic's SM90 forward, one call each on equal 2x8192 h16 d128 causal
# (ci/ncu_peers.py), exported as CSV source pages. Logs go to $OUT.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup fa4
for tag in portattn fa4; do
  step "ncu_$tag" 200 ncu --clock-control none --nvtx --nvtx-include "$tag.fwd/" \
    --section SourceCounters --section WarpStateStats -f -o "/tmp/$tag" \
    python3 ci/ncu_peers.py --only "$tag" --modes fwd --workloads "equal 2x8192 h16 d128 causal"
  tail -n 3 "$OUT/ncu_$tag.log"
  ncu --import "/tmp/$tag.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/sass_$tag.csv" 2>"$OUT/sass_$tag.err"
  ls -la "$OUT/sass_$tag.csv"; head -c 600 "$OUT/sass_$tag.csv"; echo; cat "$OUT/sass_$tag.err" | head -5
done
printf '%s\n' "${summary[@]}"
