"""Golden output hashes per GPU family: canonical cases, a counter-based input generator,
hashing, reading golden files, and the verify / fingerprints checks (docs/golden.md; design §5).
Recording them is the checkout's ``ci/golden_dev``.

``import portattn.tools.golden`` does no GPU work.
"""

from portattn.tools.golden.cases import CASES, CASES_VERSION, Case, cases_by_name
from portattn.tools.golden.fingerprints import run_fingerprints, run_key_check
from portattn.tools.golden.inputs import generate
from portattn.tools.golden.layout import SCHEMA, GoldenError, golden_path, load
from portattn.tools.golden.records import output_differences, stale_outputs
from portattn.tools.golden.run import CaseResult, accuracy, compute_case, make_inputs
from portattn.tools.golden.verify import run_verify, toolchain_key

__all__ = [
    "CASES",
    "CASES_VERSION",
    "SCHEMA",
    "Case",
    "CaseResult",
    "GoldenError",
    "accuracy",
    "cases_by_name",
    "compute_case",
    "generate",
    "golden_path",
    "load",
    "make_inputs",
    "output_differences",
    "run_fingerprints",
    "run_key_check",
    "run_verify",
    "stale_outputs",
    "toolchain_key",
]
