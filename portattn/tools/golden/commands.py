"""``python -m portattn golden {verify,refresh,fingerprints}`` and the functions behind them.

:func:`run_verify`, :func:`run_refresh` and :func:`run_fingerprints` take the family, the device
and the golden directory as arguments, so tests run them on CPU tensors under Triton's
interpreter with a made-up family; the command-line layer (:func:`main`) adds the hardware
detection and refuses to run anywhere but on a GPU of the family.

Exit codes: 0 match / written; 1 mismatch / refused conflict / fingerprints differ; 2 nothing to
compare (no GPU, wrong hardware, no golden for this family or toolchain, stale hashes) or a
golden file that cannot be used (malformed, unreadable, not writable): one line naming it.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from portattn.tools.golden.cases import CASES, CASES_VERSION, DTYPES, Case, cases_by_name
from portattn.tools.golden.layout import GoldenError
from portattn.tools.golden.provenance import REPO_ROOT, device_name, provenance, toolchain_key
from portattn.tools.golden.records import (
    build_record,
    output_differences,
    stale_outputs,
)
from portattn.tools.golden.run import CaseResult, accuracy, compute_case, make_inputs
from portattn.tools.golden.store import check_writable, golden_path, load, write_record

Printer = Callable[[str], None]
FingerprintFn = Callable[[str], dict[str, dict[str, str | None]]]


def say(line: str) -> None:
    """Progress output: one line, flushed at once."""
    print(line, flush=True)


# The wheel's copy of the checkout's golden/ (pyproject.toml maps the package
# ``portattn.golden_data`` to golden/): an installed portattn verifies without a checkout.
PACKAGED_GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden_data"


def default_golden_dir(write: bool = False) -> Path:
    """``$PORTATTN_GOLDEN_DIR``, else the checkout's ``golden/`` (run from a checkout), else,
    to read (``write=False``), the golden files installed with the package, else ``./golden``.
    A refresh never writes into the installed package: it writes the checkout's or ``./golden``."""
    if os.environ.get("PORTATTN_GOLDEN_DIR"):
        return Path(os.environ["PORTATTN_GOLDEN_DIR"])
    repo = REPO_ROOT / "golden"
    if repo.is_dir():
        return repo
    if not write and PACKAGED_GOLDEN_DIR.is_dir():
        return PACKAGED_GOLDEN_DIR
    return Path.cwd() / "golden"


def parse_entry(entry: str) -> tuple[str, int, torch.dtype, int | None]:
    """``"varlen/d128/bf16"`` -> (kernel, head_dim, dtype, None); ``"varlen/d192v128/bf16"``
    (v's own head dim) -> (kernel, 192, dtype, 128)."""
    kernel, dims, dtype = entry.split("/")
    head_dim, _, head_dim_v = dims.removeprefix("d").partition("v")
    return kernel, int(head_dim), DTYPES[dtype], int(head_dim_v) if head_dim_v else None


def device_config_hash(device: torch.device) -> Callable[[str], str]:
    """entry -> content hash of the configuration ``device`` runs for it."""
    from portattn.configs import resolve_config

    def config_hash(entry: str) -> str:
        return resolve_config(device, *parse_entry(entry)).content_hash()

    return config_hash


def family_config_hash(family: str) -> Callable[[str], str | None]:
    """entry -> content hash of the entry ``family`` runs (None if the table has none): a
    borrowed head dim (d80) has the row it runs with (d96, with the head dim's own tiles where
    it has them), a value-head-dim pair its pair entry, as ``device_config_hash`` does."""
    from portattn.configs import HEAD_DIMS, config_table, entry_config, table_head_dim

    def config_hash(entry: str) -> str | None:
        kernel, head_dim, dtype, head_dim_v = parse_entry(entry)
        widest = max(head_dim, head_dim_v or 0)
        if widest > max(HEAD_DIMS):
            return None
        if (family, kernel, table_head_dim(widest), dtype) not in config_table():
            return None
        return entry_config(family, kernel, head_dim, dtype, head_dim_v).content_hash()

    return config_hash


def compile_fingerprints(family: str) -> dict[str, dict[str, str | None]]:
    """Compile fingerprints of every entry of ``family`` (none for a family not in the table)."""
    from portattn.families import FAMILIES

    if family not in FAMILIES:
        return {}
    from portattn.tools.compilecheck import fingerprints

    return fingerprints(family)


def results_fingerprints(path: str | os.PathLike) -> FingerprintFn:
    """Fingerprints read from a compile check's results (``python -m portattn compile --json
    PATH``: family -> entry -> kernel -> record) instead of compiling every entry again: the
    same compiles give the same fingerprints. A family or entry the results lack counts as
    missing, so it differs from what golden/ stores. A file that cannot be read or is not such
    results raises :class:`GoldenError` naming it, before anything is compared."""
    results = _read_results(path)

    def fingerprints(family: str) -> dict[str, dict[str, str | None]]:
        return {
            label: {stage: record["fingerprint"] for stage, record in stages.items()}
            for label, stages in results.get(family, {}).items()
        }

    return fingerprints


def _read_results(path: str | os.PathLike) -> dict:
    """A compile check's results (family -> entry -> kernel -> record with its
    ``fingerprint``), checked whole: GoldenError naming the file and where it departs."""
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    except OSError as exc:
        raise GoldenError(f"{path} cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise GoldenError(f"{path} is not valid JSON: {exc}") from None
    where = _results_problem(results)
    if where is not None:
        raise GoldenError(
            f"{path} is not a compile check's results (python -m portattn compile --json): {where}"
        )
    return results


def _results_problem(results) -> str | None:
    """Where ``results`` departs from family -> entry -> kernel -> {"fingerprint": str}."""
    if not isinstance(results, dict):
        return f"the top level is {'an array' if isinstance(results, list) else 'no object'}"
    for family, entries in results.items():
        if not isinstance(entries, dict):
            return f"{family} is not an object of entries"
        for label, stages in entries.items():
            if not isinstance(stages, dict):
                return f"{family} / {label} is not an object of kernels"
            for stage, record in stages.items():
                if not _has_fingerprint(record):
                    return f"{family} / {label} / {stage} has no fingerprint"
    return None


def _has_fingerprint(record) -> bool:
    """A kernel's record holds its fingerprint: a string, or null where it did not compile."""
    if not isinstance(record, dict) or "fingerprint" not in record:
        return False
    return record["fingerprint"] is None or isinstance(record["fingerprint"], str)


def case_definition(case: Case) -> dict:
    """A case's stored definition: its fields and the SHA-256 of its generated inputs."""
    return case.to_json() | {"inputs_sha256": _inputs_sha256(case)}


@functools.cache
def _inputs_sha256(case: Case) -> str:
    return make_inputs(case).sha256()


def _output_record(result: CaseResult) -> dict:
    return {"inputs_sha256": result.inputs_sha256, "tensors": result.tensors}


def _digest_line(result: CaseResult) -> str:
    return " ".join(f"{name} {rec['sha256'][:8]}" for name, rec in result.tensors.items())


# ----------------------------------------------------------------------------- verify


def no_hashes_message(doc: dict, path: Path, family: str, toolchain: str) -> str:
    """The one line verify prints when ``doc`` holds no output hashes for ``toolchain``: what
    is held instead, and the two ways on (another Triton's bits may differ, so its hashes are
    never compared with this one's)."""
    recorded = sorted(t for t, s in doc.get("toolchains", {}).items() if s.get("outputs"))
    command = (
        f"nox -s \"golden_refresh(family='{family}')\" "
        f"(= python -m portattn golden refresh --family {family})"
    )
    if not recorded:
        return (
            f"no output hashes recorded for {toolchain} in {path} (it holds compile "
            f"fingerprints only; no Triton's hashes exist for {family} yet); nothing compared: "
            f"record them on {family} hardware: {command}"
        )
    versions = ", ".join(t.removeprefix("triton-") for t in recorded)
    return (
        f"no output hashes recorded for {toolchain} in {path} (recorded toolchains: "
        f"{', '.join(recorded)}); nothing compared: {family}'s hashes exist for Triton "
        f"{versions} only, and another Triton's machine code can give other bits. Verify in an "
        f"environment with triton=={recorded[-1].removeprefix('triton-')}, or record "
        f"{toolchain}'s hashes on {family} hardware (a section beside the others): {command}"
    )


def run_verify(
    family: str,
    device: torch.device | str,
    golden_dir: str | os.PathLike,
    case_names: Iterable[str] | None = None,
    out: Printer = say,
    toolchain: str | None = None,
    config_hash_of: Callable[[str], str | None] | None = None,
) -> int:
    """Run the recorded cases of ``golden/<family>.json`` on ``device`` and compare bitwise."""
    device = torch.device(device)
    toolchain = toolchain or toolchain_key()
    try:
        path = golden_path(golden_dir, family)
        doc = load(path, family)
    except GoldenError as exc:
        out(f"error: {exc}")
        return 2
    if doc is None:
        out(
            f"no golden file for family {family}: {path} does not exist; pass --golden-dir DIR "
            f"(a folder holding {family}.json, e.g. a checkout's golden/) or set "
            "$PORTATTN_GOLDEN_DIR"
        )
        return 2
    section = doc.get("toolchains", {}).get(toolchain, {})
    outputs = section.get("outputs", {})
    if not outputs:
        out(no_hashes_message(doc, path, family, toolchain))
        return 2
    names = sorted(outputs) if not case_names else list(case_names)
    missing = [n for n in names if n not in outputs or n not in doc.get("cases", {})]
    if missing:
        out(f"no recorded outputs for case(s) {', '.join(missing)} in {path} [{toolchain}]")
        return 2
    stale = stale_outputs(doc, toolchain, config_hash_of or device_config_hash(device))
    stale = {n: why for n, why in stale.items() if n in names}
    if stale:
        reasons = sorted(set(stale.values()))
        out(f"stale: re-record on {family} hardware ({len(stale)} case(s): {'; '.join(reasons)})")
        return 2

    out(f"verifying {len(names)} case(s) of {path} [{toolchain}] on {device_name(device)}")
    prov = section.get("provenance", {})
    if prov:
        seen = ", ".join(prov.get("devices", [])) or "?"
        drivers = ", ".join(prov.get("drivers", [])) or "?"
        out(
            f"  recorded on {seen} ({drivers}; torch {', '.join(prov.get('torch', []))}; "
            f"portattn {prov.get('portattn', '?')} {prov.get('commit', '')}; {prov.get('date')})"
        )
    provisional = bool(prov.get("provisional")) and emulated_family(device) is None
    if prov.get("provisional"):
        out(f"  provisional hashes: {prov['provisional']}")
    failed: list[str] = []
    for i, name in enumerate(names, 1):
        result = compute_case(Case.from_json(name, doc["cases"][name]), device)
        diffs = output_differences(name, outputs[name], _output_record(result))
        status = "ok" if not diffs else f"MISMATCH ({len(diffs)})"
        out(f"[{i:2d}/{len(names)}] {name:44s} {status}  ({result.seconds:.1f} s)")
        if not diffs:
            continue
        failed.append(name)
        for line in diffs:
            out(f"    {line}")
        if not diffs[0].startswith(f"case {name}: INPUTS"):
            tensors = [t for t in result.tensors if any(f": {t}:" in d for d in diffs)]
            for acc in accuracy(result, tensors):
                out(f"    {acc.describe()}")
    unrecorded = sorted({c.name for c in CASES} - set(outputs))
    if unrecorded and not case_names:
        out(
            f"note: {len(unrecorded)} canonical case(s) of version {CASES_VERSION} have no hashes "
            f"for {toolchain} yet (refresh to add them): {', '.join(unrecorded)}"
        )
    if provisional:  # on the family's own hardware: evidence confirmed or refuted, no failure
        if failed:
            out(
                f"provisional hashes differ: refresh on this hardware ({len(failed)} of "
                f"{len(names)} case(s) differ: {', '.join(failed)}); "
                f"nox -s \"golden_refresh(family='{family}')\""
            )
            return 2
        out(f"provisional hashes confirmed: all {len(names)} case(s) match bitwise")
        return 0
    if failed:
        out(
            f"{len(failed)} of {len(names)} case(s) differ from the golden hashes: "
            f"{', '.join(failed)}"
        )
        return 1
    out(f"all {len(names)} case(s) match bitwise")
    return 0


# ----------------------------------------------------------------------------- refresh


def device_problem(family: str, device: torch.device) -> str | None:
    """Why hashes of ``family`` cannot be recorded from ``device``: for a family of the table
    the device must be one of its GPUs (another device runs another configuration, and its
    hashes would replace the family's as "stale"). A family outside the table (the tests'
    made-up one) has no hardware to match."""
    from portattn.families import FAMILIES
    from portattn.families import family as family_of

    if family not in FAMILIES:
        return None
    found = family_of(device) if device.type == "cuda" else None
    if found == family or emulated_family(device) == family:
        return None
    return (
        f"{device} ({device_name(device)}, family {found or 'none'}) is not a {family} GPU: "
        f"{family} hashes are recorded on {family} hardware only; nothing computed or written"
    )


def emulated_family(device: torch.device) -> str | None:
    """The family ``device`` runs as its PTX under ``$PORTATTN_FAMILY_OVERRIDE``, or None."""
    if device.type != "cuda":
        return None
    from portattn.families import family_override

    return family_override(device)


def provisional_mark(family: str, device: torch.device) -> str:
    """The provenance note of hashes recorded under the family override."""
    return (
        f"{family} code (its PTX, JIT-compiled by the NVIDIA driver) run on "
        f"{device_name(device)} under $PORTATTN_FAMILY_OVERRIDE; not yet seen on {family} "
        "hardware, where golden verify confirms or refutes them"
    )


def _check_target(path: Path, family: str) -> None:
    """Before any work: the golden file can be written, and what it holds now (if anything)
    is a well-formed golden file of ``family`` (GoldenError otherwise)."""
    check_writable(path)
    load(path, family)


def run_refresh(
    family: str,
    device: torch.device | str,
    golden_dir: str | os.PathLike,
    force: bool = False,
    case_names: list[str] | None = None,
    out: Printer = say,
    toolchain: str | None = None,
    fingerprint_fn: FingerprintFn | None = compile_fingerprints,
    repeat: int = 2,
    config_hash_of: Callable[[str], str] | None = None,
    cases: list[Case] | None = None,
) -> int:
    """Run the canonical cases (or those named in ``case_names``, or ``cases`` given outright)
    ``repeat`` times on ``device``, then merge their hashes into ``golden/<family>.json`` under
    the file lock. Refuses (exit 2, before computing anything) a device outside ``family``
    (:func:`device_problem`; ``force`` does not override it) and a golden file that is
    malformed or not writable."""
    device = torch.device(device)
    toolchain = toolchain or toolchain_key()
    try:
        path = golden_path(golden_dir, family)  # before anything: a name, not a path
    except GoldenError as exc:
        out(f"error: {exc}")
        return 2
    problem = device_problem(family, device)
    if problem:
        out(f"error: {problem}")
        return 2
    if cases is None:
        try:
            cases = cases_by_name(case_names)
        except ValueError as exc:
            out(f"error: {exc}")
            return 2
    try:
        _check_target(path, family)
    except GoldenError as exc:
        out(f"error: {exc}")
        return 2
    provisional = emulated_family(device) == family
    if provisional and _held_hashes(path, toolchain) == "recorded":
        out(
            f"error: {path} holds {toolchain} hashes recorded on {family} hardware; hashes made "
            "under $PORTATTN_FAMILY_OVERRIDE never replace them; nothing computed or written"
        )
        return 2
    out(f"refreshing {path} [{toolchain}]: {len(cases)} case(s) x {repeat} run(s) on {device}")
    if provisional:
        out(f"  provisional: {provisional_mark(family, device)}")
    results = []
    for i, case in enumerate(cases, 1):
        result = compute_case(case, device)
        for _ in range(repeat - 1):
            again = compute_case(case, device)
            diffs = output_differences(case.name, _output_record(result), _output_record(again))
            if diffs:
                out(
                    f"error: {case.name} is not run-to-run deterministic on this machine; "
                    f"nothing written: {diffs[0]}"
                )
                return 1
        results.append(result)
        out(
            f"[{i:2d}/{len(cases)}] {case.name:44s} {_digest_line(result)}  "
            f"({result.seconds:.1f} s)"
        )
    fingerprints = None
    if fingerprint_fn is not None:
        out(f"compile fingerprints of {family} (Triton compiles every entry) ...")
        start = time.perf_counter()
        try:
            fingerprints = fingerprint_fn(family)
        except Exception as exc:  # noqa: BLE001 - recorded without fingerprints, loudly
            out(
                f"warning: compile fingerprints failed ({type(exc).__name__}: {exc}); "
                "outputs are recorded without them"
            )
        else:
            out(f"  {len(fingerprints)} entries ({time.perf_counter() - start:.0f} s)")
    config_hash = config_hash_of or device_config_hash(device)
    config_hashes = {c.entry: config_hash(c.entry) for c in cases}
    origin = provenance(device)
    if provisional:
        origin["provisional"] = provisional_mark(family, device)
    record = build_record(
        family, toolchain, results, origin, fingerprints, config_hashes, CASES_VERSION
    )
    return write_record(path, record, force, out, toolchain)


def _held_hashes(path: Path, toolchain: str) -> str | None:
    """``"provisional"`` or ``"recorded"`` for the output hashes ``path`` holds for
    ``toolchain``; None when it holds none."""
    section = ((load(path) or {}).get("toolchains") or {}).get(toolchain) or {}
    if not section.get("outputs"):
        return None
    return "provisional" if (section.get("provenance") or {}).get("provisional") else "recorded"
