#!/usr/bin/env bash
# One GPU call that says whether a patch set of ci/patches can land (when device time allows
# one call, not three): an A/B of main and the patch set (ci/gpu_fwd_variant.sh: bits and
# times, FWD_BWD=1 by default), then, on a patched copy of the tree in /tmp/patched, `golden
# verify` of the family (the recorded outputs, bitwise) and the GPU tests of the warp-
# specialised kernels and their launch paths. Each step has its own time limit, so that the
# whole stays under one 600-s call: AB_LIMIT (default 250), VERIFY_LIMIT (130), TESTS_LIMIT
# (190). The A/B runs first and alone in the checkout (it applies and reverts the patches
# itself); the copy is made before it, so a killed A/B leaves the copy intact.
# Usage: WORKLOADS=... bash ci/gpu_patch_land.sh PATCH[+PATCH...]   (carry .fa4 for FA4=1)
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: bash ci/gpu_patch_land.sh PATCH[+PATCH...]"; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup
patched_copy /tmp/patched "$1" || exit 2
FWD_BWD=${FWD_BWD:-1} FA4=${FA4:-0} TESTS=0 SMOKE_LIMIT=${SMOKE_LIMIT:-120} \
  timeout "${AB_LIMIT:-250}" bash ci/gpu_fwd_variant.sh "$1" >"$OUT/ab.log" 2>&1
echo "== A/B rc=$?"; grep -E "^== |^\|" "$OUT/ab.log" | grep -v "^== smoke" | sort -u
cd /tmp/patched || exit 2
export PYTHONPATH=/tmp/patched
step verify "${VERIFY_LIMIT:-130}" python3 -m portattn golden verify --family "${FAMILY:-sm90}"
tail -n 4 "$OUT/verify.log"
step tests "${TESTS_LIMIT:-190}" python3 -m pytest tests/test_table_variants.py tests/test_ws_variants.py \
  tests/test_key_chunk.py tests/test_launcher.py tests/test_descriptors.py -n 15 \
  -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
tail -n 4 "$OUT/tests.log"
printf '%s\n' "${summary[@]}"
