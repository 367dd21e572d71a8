"""Golden output hashes per GPU family: canonical cases, a counter-based input generator,
hashing, the golden files and the verify / refresh / fingerprints commands (design §5 in
docs/design.md).

``import portattn.tools.golden`` does no GPU work; see ``docs/golden.md`` for the workflow.
"""

from portattn.tools.golden.cases import CASES, CASES_VERSION, Case, cases_by_name
from portattn.tools.golden.commands import run_refresh, run_verify
from portattn.tools.golden.fingerprints import run_fingerprints, run_key_check
from portattn.tools.golden.inputs import generate
from portattn.tools.golden.layout import SCHEMA, GoldenConflict, GoldenError
from portattn.tools.golden.merging import merge
from portattn.tools.golden.records import build_record, output_differences, stale_outputs
from portattn.tools.golden.run import CaseResult, accuracy, compute_case, make_inputs


def verify_against(expected: dict, result: CaseResult) -> list[str]:
    """Differences of ``result`` from a stored output record (empty when bitwise equal): each
    line names the case, the tensor, the sequence and the heads."""
    got = {"inputs_sha256": result.inputs_sha256, "tensors": result.tensors}
    return output_differences(result.case.name, expected, got)


__all__ = [
    "CASES",
    "CASES_VERSION",
    "SCHEMA",
    "Case",
    "CaseResult",
    "GoldenConflict",
    "GoldenError",
    "accuracy",
    "build_record",
    "cases_by_name",
    "compute_case",
    "generate",
    "make_inputs",
    "merge",
    "output_differences",
    "run_fingerprints",
    "run_key_check",
    "run_refresh",
    "run_verify",
    "stale_outputs",
    "verify_against",
]
