#!/usr/bin/env bash
# A/B of a forward kernel patch against main (issue 36; perf-notes rows 99-101): the probe
# (ci/wait_barrier_probe.py --fwd-only: out's bits hashed, forward ms best of two do_bench
# medians) in alternating processes, each version with its own Triton cache, FA4
# deterministic beside main in the first round (carry .fa4); then the patched tree's GPU
# tests of the Gluon forward; the patch is reverted at the end.
#   bash ci/gpu_fwd_variant.sh ci/patches/gluon_pingpong.diff       # row 99 (ROUND=row99-d64
#                                                                   # adds ci/tune_sm90.py's round)
#   bash ci/gpu_fwd_variant.sh ci/patches/gluon_compact_grid.diff   # row 100 (behind
#                                                                   # PORTATTN_COMPACT=1, set here)
#   bash ci/gpu_fwd_variant.sh ci/patches/gluon_persistent.diff     # row 101
# WORKLOADS (one name per line) replaces the default list below.
set -uo pipefail
PATCH=${1:?usage: bash ci/gpu_fwd_variant.sh PATCH}
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup fa4
export PORTATTN_COMPACT=1
nvidia-smi --query-gpu=name --format=csv,noheader
DEFAULT_W="small 4x256 gqa32/8 d128 causal
rl 64x(32..2048) gqa32/8 d128 causal
rl 64x(32..2048) h16 d128 full
skewed 32k h16 d128 causal
skewed 32k h16 d128 full
skewed 32k gqa32/8 d128 causal
equal 2x8192 h16 d128 causal
equal 2x8192 h16 d128 full"
W=()
while IFS= read -r name; do [ -n "$name" ] && W+=(--workloads "$name"); done <<<"${WORKLOADS:-$DEFAULT_W}"
use() {  # use main|patched
  if [ "$1" = patched ]; then patch -s -p1 --forward <"$PATCH"; else patch -s -R -p1 <"$PATCH" 2>/dev/null; fi
}
use patched
step smoke "${SMOKE_LIMIT:-90}" python3 ci/wait_barrier_probe.py --fwd-only --workloads "${W[1]}"
rc=$?
echo "== smoke (patched)"; tail -n 3 "$OUT/smoke.log"
if [ "$rc" != 0 ]; then use main; printf '%s\n' "${summary[@]}"; exit 1; fi
for round in 1 2; do
  for v in main patched; do
    [ "$round" = 2 ] && v=$([ "$v" = main ] && echo patched || echo main)
    fa4=(); [ "$round$v" = 1main ] && fa4=(--fa4)
    use "$v"
    TRITON_CACHE_DIR=/tmp/tc_$v step "${v}_$round" 150 python3 ci/wait_barrier_probe.py \
      --fwd-only "${fa4[@]}" "${W[@]}"
    echo "== $v round $round"; grep -E "^\||Error" "$OUT/${v}_$round.log" | sort
  done
done
if [ -n "${ROUND:-}" ]; then
  for v in main patched; do
    use "$v"
    TRITON_CACHE_DIR=/tmp/tc_$v step "round_$v" 150 python3 ci/tune_sm90.py --round "$ROUND" \
      --forward-only
    echo "== $ROUND $v"; grep -E "^\||rror" "$OUT/round_$v.log"
  done
fi
use patched
step tests 150 python3 -m pytest tests/test_table_variants.py tests/test_key_chunk.py -n 8 \
  -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
tail -n 3 "$OUT/tests.log"
use main
printf '%s\n' "${summary[@]}"
