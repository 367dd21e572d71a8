#!/usr/bin/env bash
# Where the warps of the forward wait (issue 36, perf-notes rows 97 and 102; carry .fa4):
# Nsight Compute's warp-state sampling per SASS instruction of portattn's Gluon forward and of
# FA4 deterministic's SM90 forward, one call each (ci/ncu_peers.py) on WORKLOAD (default equal
# 2x8192 h16 d128 causal), exported as CSV source pages under $OUT, with the launch statistics
# printed (at most 8 files come back from a device call).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup fa4
WORKLOAD=${WORKLOAD:-equal 2x8192 h16 d128 causal}
for tag in portattn fa4; do
  step "ncu_$tag" 200 ncu --clock-control none --nvtx --nvtx-include "$tag.fwd/" \
    --section SourceCounters --section WarpStateStats --section LaunchStats -f -o "/tmp/$tag" \
    python3 ci/ncu_peers.py --only "$tag" --modes fwd --workloads "$WORKLOAD"
  tail -n 2 "$OUT/ncu_$tag.log"
  ncu --import "/tmp/$tag.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/sass_$tag.csv" 2>/dev/null
  ncu --import "/tmp/$tag.ncu-rep" --page details 2>&1 \
    | grep -E "^  [a-z]|Grid Size|Block Size|Registers Per|Waves|Warp Cycles|excessive" | head -n 24
done
printf '%s\n' "${summary[@]}"
