#!/usr/bin/env bash
# GPU CI job for one family: ci/gpu.sh sm80|sm90|sm100|sm120|cdna2|cdna3|cdna4
#
# Runs `nox -s "gpu(family='<family>')"` in the current environment: the machine's preinstalled
# torch + Triton (CUDA or ROCm) are used as they are, nothing is installed. Needs nox, pytest and
# hypothesis in that environment (carry their wheels to machines without network). The session
# fails when the GPU in front of it is not of the family asked for.
set -euo pipefail

case "${1:-}" in
  sm80|sm90|sm100|sm120|cdna2|cdna3|cdna4) family="$1" ;;
  *)
    echo "usage: ci/gpu.sh FAMILY   (FAMILY: sm80, sm90, sm100, sm120, cdna2, cdna3, cdna4)" >&2
    exit 2
    ;;
esac
shift

cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec python -m nox -s "gpu(family='${family}')" "$@"
