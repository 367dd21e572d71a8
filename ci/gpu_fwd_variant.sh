#!/usr/bin/env bash
# A/B of forward kernel patches against main (issue 36; perf-notes rows 99-102): the probe
# (ci/wait_barrier_probe.py --fwd-only: out's bits hashed, forward ms best of two do_bench
# medians) in alternating processes, each version with its own Triton cache, FA4
# deterministic beside main in the first round (carry .fa4); then the GPU tests of the Gluon
# forward on the last version. A version is a patch of ci/patches or several joined by '+';
# every patch is reverted at the end. Each version first runs one small call alone
# (SMOKE_LIMIT seconds), so that a hang costs one limit and nothing else runs.
#   bash ci/gpu_fwd_variant.sh ci/patches/gluon_pingpong.diff       # row 99 (ROUND=row99-d64
#                                                                   # adds ci/tune_sm90.py's round)
#   (rows 100-102's patches, ci/patches/gluon_compact_grid.diff, gluon_persistent.diff and the
#   ablations, were made before the host descriptors landed, row 105: they apply to 5eac7bc)
#   FA4=0 FWD_BWD=1 TESTS=0 bash ci/gpu_fwd_variant.sh PATCH   # row 105's A/B (session 37)
# WORKLOADS (one name per line, or `short`: four of them) replaces the default list below.
# FWD_BWD=1: the gradients' bits too, and forward+backward times (for backward patches).
# TESTS=0: no GPU tests on the last version (a call that times only). FA4=0: no FA4 row
# (its compiles take minutes with FWD_BWD=1).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash ci/gpu_fwd_variant.sh PATCH[+PATCH...] ..."; exit 2; }
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
SHORT_W="rl 64x(32..2048) gqa32/8 d128 causal
rl 64x(32..2048) h16 d128 full
skewed 32k h16 d128 causal
equal 2x8192 h16 d128 causal"
[ "${WORKLOADS:-}" = short ] && WORKLOADS=$SHORT_W
MODE=(--fwd-only)
[ "${FWD_BWD:-0}" = 1 ] && MODE=()
W=()
while IFS= read -r name; do [ -n "$name" ] && W+=(--workloads "$name"); done <<<"${WORKLOADS:-$DEFAULT_W}"
APPLIED=()
use() {  # use main | use SPEC: revert what is applied, then apply SPEC's patches in order
  local i
  for ((i = ${#APPLIED[@]} - 1; i >= 0; i--)); do patch -s -R -p1 --no-backup-if-mismatch <"${APPLIED[i]}"; done
  APPLIED=()
  [ "$1" = main ] && return 0
  local p
  IFS=+ read -ra parts <<<"$1"
  for p in "${parts[@]}"; do patch -s -p1 --forward --no-backup-if-mismatch -r - <"$p" && APPLIED+=("$p"); done
}
tag() { local t=${1//ci\/patches\//}; t=${t//.diff/}; echo "${t//+/_and_}"; }  # for file names
VERSIONS=(main "$@")
OK=(main)
for v in "$@"; do
  use "$v"
  TRITON_CACHE_DIR=/tmp/tc_$(tag "$v") step "smoke_$(tag "$v")" "${SMOKE_LIMIT:-90}" \
    python3 ci/wait_barrier_probe.py "${MODE[@]}" --workloads "${W[1]}"
  rc=$?
  echo "== smoke $v rc=$rc"; grep -E "^\||Error" "$OUT/smoke_$(tag "$v").log" | tail -n 3
  [ "$rc" = 0 ] && OK+=("$v")
done
for round in 1 2; do
  order=("${OK[@]}")
  if [ "$round" = 2 ]; then order=(); for ((i = ${#OK[@]} - 1; i >= 0; i--)); do order+=("${OK[i]}"); done; fi
  for v in "${order[@]}"; do
    fa4=(); [ "$round$v" = 1main ] && [ "${FA4:-1}" = 1 ] && fa4=(--fa4)
    use "$v"
    name="$(tag "$v")_$round"
    TRITON_CACHE_DIR=/tmp/tc_$(tag "$v") step "$name" 150 python3 ci/wait_barrier_probe.py \
      "${MODE[@]}" "${fa4[@]}" "${W[@]}"
    echo "== $v round $round"; grep -E "^\||Error" "$OUT/$name.log" | sort
  done
done
if [ -n "${ROUND:-}" ]; then
  for v in "${OK[@]}"; do
    use "$v"
    TRITON_CACHE_DIR=/tmp/tc_$(tag "$v") step "round_$(tag "$v")" 150 python3 ci/tune_sm90.py \
      --round "$ROUND" --forward-only
    echo "== $ROUND $v"; grep -E "^\||rror" "$OUT/round_$(tag "$v").log"
  done
fi
last=${OK[${#OK[@]}-1]}
if [ "$last" != main ] && [ "${TESTS:-1}" = 1 ]; then
  use "$last"
  step tests 200 python3 -m pytest tests/test_table_variants.py tests/test_ws_variants.py tests/test_key_chunk.py \
    tests/test_launcher.py -n 8 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  echo "== tests on $last"; tail -n 3 "$OUT/tests.log"
fi
use main
git status --short portattn 2>/dev/null | head -n 5
printf '%s\n' "${summary[@]}"
