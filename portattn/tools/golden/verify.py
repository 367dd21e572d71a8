"""``python -m portattn golden verify``: run the recorded cases on this GPU and compare them
bitwise with ``golden/<family>.json`` (docs/golden.md, "Verify").

:func:`run_verify` takes the family, the device and the golden directory as arguments, so tests
run it on CPU tensors under Triton's interpreter with a made-up family; the command line
(:mod:`.cli`) adds the hardware detection. Exit codes: 0 match; 1 mismatch; 2 nothing to compare
or a golden file that cannot be used (one line naming it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from portattn.tools.golden.cases import CASES, CASES_VERSION, DTYPES, Case
from portattn.tools.golden.layout import GoldenError, golden_path, load
from portattn.tools.golden.records import output_differences, stale_outputs
from portattn.tools.golden.run import accuracy, compute_case

Printer = Callable[[str], None]

REPO_ROOT = Path(__file__).resolve().parents[3]  # portattn/tools/golden/ -> the checkout
# The wheel's copy of the checkout's golden/ (pyproject.toml maps the package
# ``portattn.golden_data`` to golden/): an installed portattn verifies without a checkout.
PACKAGED_GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden_data"


def say(line: str) -> None:
    """Progress output: one line, flushed at once."""
    print(line, flush=True)


def toolchain_key() -> str:
    """The key golden output hashes are stored under: the Triton version that made them."""
    import triton

    return f"triton-{triton.__version__}"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} (Triton interpreter)"


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


def emulated_family(device: torch.device) -> str | None:
    """The family ``device`` runs as its PTX under ``$PORTATTN_FAMILY_OVERRIDE``, or None."""
    if device.type != "cuda":
        return None
    from portattn.families import family_override

    return family_override(device)


def no_hashes_message(doc: dict, path: Path, family: str, toolchain: str) -> str:
    """The one line verify prints when ``doc`` holds no output hashes for ``toolchain``: what
    is held instead, and the two ways on (another Triton's bits may differ, so its hashes are
    never compared with this one's)."""
    recorded = sorted(t for t, s in doc.get("toolchains", {}).items() if s.get("outputs"))
    command = (
        f"nox -s \"golden_refresh(family='{family}')\" "
        f"(= python -m ci.golden_dev refresh --family {family}, in a checkout)"
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
        diffs = output_differences(name, outputs[name], result.output_record())
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
