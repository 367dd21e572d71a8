#!/usr/bin/env bash
# CPU CI job: the same thing as .ci/run (fresh virtualenv, `nox -s tests`).
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/../.ci/run" "$@"
