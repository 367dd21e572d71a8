"""Reports of ``python benchmarks/bench.py``: JSON file, markdown summary, PNG bar chart.

Everything here works on the plain data of a run (the dict that :func:`benchmarks.bench.run`
returns and :func:`write_json` stores), so a report can be rendered on another machine than the
one that measured: this module imports neither torch nor triton, and matplotlib only inside
:func:`plot` (the GPU machine may not have it; render the PNG later with
``python benchmarks/bench.py plot --json PATH --png PATH``). matplotlib comes with the
optional extra ``bench`` of pyproject.toml (``pip install -e '.[bench]'``).

A row is one timing: ``workload``, ``mode`` ("fwd" or "fwd+bwd"), ``impl``, ``pass`` (0 or 1),
``ms`` (median of ``triton.testing.do_bench``), ``tflops`` (useful FLOPs / time), ``peak_gib``
and ``resident_gib`` (``torch.cuda.max_memory_allocated`` over one call, and what was allocated
before it: the inputs and output gradient), ``error`` (None). An implementation that could not
run has rows with ``ms`` None and ``error`` the message. The summary takes, per (workload, mode,
implementation), the better of the two passes' medians.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MODES = ("fwd", "fwd+bwd")
VARLEN = "portattn varlen"
FIXED = "portattn fixed_order"
CUDNN = "SDPA cuDNN"
FLASH = "SDPA flash"
FLEX = "FlexAttention"
FA4_DET = "FA4 deterministic"  # FlashAttention-4 (flash_attn.cute), deterministic=True
FA4 = "FA4"  # its default (atomic dQ accumulation: not bitwise run to run)
TORCH_VARLEN = "torch varlen_attn"  # torch.nn.attention.varlen.varlen_attn (FlashAttention-2)
IMPLS = (VARLEN, FIXED, FA4_DET, FA4, CUDNN, FLASH, FLEX, TORCH_VARLEN)  # columns' order
SHORT = {
    VARLEN: "varlen",
    FIXED: "fixed_order",
    FA4_DET: "FA4 det",
    FA4: "FA4",
    CUDNN: "cuDNN",
    FLASH: "flash",
    FLEX: "Flex",
    TORCH_VARLEN: "torch varlen",
}
# Ratio columns, (title, numerator impl, denominator impl) of *times*. The first five are
# peer time / varlen time: a speedup of portattn varlen over the peer, which is the same number
# as varlen's throughput as a fraction of the peer's (> 1: portattn is faster). The last is
# fixed_order time / varlen time: what the strict kernel costs (> 1: fixed_order is slower).
SPREAD = "varlen spread between passes"
RATIOS = (
    ("varlen / FA4 det throughput", FA4_DET, VARLEN),
    ("varlen speedup vs Flex", FLEX, VARLEN),
    ("varlen / cuDNN throughput", CUDNN, VARLEN),
    ("varlen / flash throughput", FLASH, VARLEN),
    ("varlen / torch varlen_attn throughput", TORCH_VARLEN, VARLEN),
    ("fixed_order / varlen time", FIXED, VARLEN),
)
NOT_RUN = "—"  # the implementation does not apply to this workload (SDPA on a skewed pack)
# No dependency of portattn brings matplotlib; the optional extra `bench` does (pyproject.toml).
MATPLOTLIB_NEEDED = "the chart needs matplotlib: pip install -e '.[bench]' (the bench extra)"
FAILED = "error"  # it applies but failed; the message is listed under the table

Row = dict[str, Any]
Key = tuple[str, str]  # (workload, mode)


# --- JSON -------------------------------------------------------------------------------------


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Write a run's data (metadata and raw rows) as indented JSON with sorted keys."""
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def write_reports(
    data: dict[str, Any], text: str, json_path: str | None, markdown_path: str | None
) -> None:
    """A run's ``--json`` (``data``, :func:`write_json`) and ``--markdown`` (``text``), each
    written where a path is given, then ``wrote PATH`` printed."""
    if json_path:
        write_json(json_path, data)
        print(f"wrote {json_path}")
    if markdown_path:
        Path(markdown_path).write_text(text, encoding="utf-8")
        print(f"wrote {markdown_path}")


def load_json(path: str | Path) -> dict[str, Any]:
    """Read a file written by :func:`write_json`. Rows of earlier versions of the tool, which
    called the pass ``pass_`` and had no ``error`` field, are read as well."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    for row in data.get("rows", []):
        if "pass" not in row and "pass_" in row:
            row["pass"] = row.pop("pass_")
        row.setdefault("error", None)
    return data


# --- summary ----------------------------------------------------------------------------------


def _ordered(items: Iterable[str], canonical: tuple[str, ...]) -> list[str]:
    """Distinct items: the canonical ones in canonical order, then the others as first seen."""
    seen = list(dict.fromkeys(items))
    return [x for x in canonical if x in seen] + [x for x in seen if x not in canonical]


def summarize(rows: list[Row]) -> dict[Key, dict[str, Row]]:
    """Per (workload, mode), per implementation: the row of its best (lowest) median over the
    passes; an implementation with no successful pass maps to its first failed row."""
    out: dict[Key, dict[str, Row]] = {}
    for row in rows:
        cell = out.setdefault((row["workload"], row["mode"]), {})
        have = cell.get(row["impl"])
        faster = row.get("ms") is not None and (
            have is None or have.get("ms") is None or row["ms"] < have["ms"]
        )
        if have is None or faster:
            cell[row["impl"]] = row
    return out


def time_ratio(cell: dict[str, Row], numerator: str, denominator: str) -> float | None:
    """``ms(numerator) / ms(denominator)`` of one (workload, mode), None if either is missing."""
    a, b = cell.get(numerator), cell.get(denominator)
    if a is None or b is None or a.get("ms") is None or b.get("ms") is None or b["ms"] <= 0:
        return None
    return a["ms"] / b["ms"]


def ratios(cell: dict[str, Row]) -> dict[str, float | None]:
    """The ratio columns (see ``RATIOS``) of one (workload, mode)."""
    return {title: time_ratio(cell, num, den) for title, num, den in RATIOS}


def pass_spread(rows: list[Row], key: Key, impl: str = VARLEN) -> float | None:
    """How much ``impl``'s medians of one (workload, mode) differ between the passes: the
    slowest over the fastest, minus 1 (issue 36: at most 5% between identical calls); None
    with fewer than two timed passes."""
    times = [
        r["ms"]
        for r in rows
        if (r["workload"], r["mode"]) == key and r["impl"] == impl and r.get("ms") is not None
    ]
    return max(times) / min(times) - 1 if len(times) > 1 and min(times) > 0 else None


def _heat_text(data: dict[str, Any]) -> str:
    heat_s = data.get("heat_s")
    return f", after {heat_s:g} s of untimed calls of all of them" if heat_s else ""


def _cell_text(row: Row | None, field: str, fmt: str) -> str:
    if row is None:
        return NOT_RUN
    value = row.get(field)
    if row.get("ms") is None or value is None or not math.isfinite(value):
        return FAILED
    return format(value, fmt)


def _keys(data: dict[str, Any], table: dict[Key, dict[str, Row]]) -> list[Key]:
    """(workload, mode) in the run's workload order (metadata), modes fwd then fwd+bwd."""
    names = [w["name"] for w in data.get("workloads", [])] + [k[0] for k in table]
    names = list(dict.fromkeys(names))
    modes = _ordered((k[1] for k in table), MODES)
    return [(w, m) for w in names for m in modes if (w, m) in table]


def markdown(data: dict[str, Any]) -> str:
    """The summary of a run in markdown: how it was measured, one throughput table with ratio
    columns, one table of peak memory and FlexAttention compile time, and the failures."""
    rows = data.get("rows", [])
    table = summarize(rows)
    keys = _keys(data, table)
    impls = _ordered((r["impl"] for r in rows), IMPLS)
    short = [SHORT.get(i, i) for i in impls]
    # A ratio column where the run has its peer (FA4 only where it imports).
    shown = [t for t, num, den in RATIOS if num in impls and den in impls]
    spread = [SPREAD] if VARLEN in impls else []  # the varlen medians' spread between passes
    meta = [
        ("device", data.get("device")),
        ("torch", data.get("torch")),
        ("triton", data.get("triton")),
        ("commit", data.get("git_commit")),
        ("date", data.get("date")),
        ("command", f"`{data['command']}`" if data.get("command") else None),
    ]
    out = [f"- {k}: {v}" for k, v in meta if v is not None]
    if data.get("git_dirty"):
        out.append("- the working tree had uncommitted changes")
    out += [
        "",
        "TFLOP/s of useful FLOPs (forward `4·Sq·Sk·D` per query head and sequence, halved for "
        "causal; forward+backward 3.5× forward); each figure is the best of "
        f"{data.get('passes', 2)} medians of `triton.testing.do_bench` (implementations timed in "
        f"alternating order{_heat_text(data)}). Ratios are of "
        "times: peer time / varlen time (> 1: portattn varlen is faster), and fixed_order time "
        f"/ varlen time; the spread is varlen's slowest median over its fastest, minus 1. "
        f"{NOT_RUN}: not run on this workload; {FAILED}: failed (listed below).",
        "",
        "| workload | mode | "
        + " | ".join(f"{s} TF/s" for s in short)
        + " | "
        + " | ".join(shown + spread)
        + " |",
        "| --- | --- |" + " ---: |" * (len(impls) + len(shown) + len(spread)),
    ]
    for key in keys:
        cell = table[key]
        tf = [_cell_text(cell.get(i), "tflops", ".0f") for i in impls]
        rt = [NOT_RUN if r is None else f"{r:.2f}x" for t, r in ratios(cell).items() if t in shown]
        if spread:
            gap = pass_spread(rows, key)
            rt.append(NOT_RUN if gap is None else f"{100 * gap:.1f}%")
        out.append(f"| {key[0]} | {key[1]} | " + " | ".join(tf + rt) + " |")

    compile_s = data.get("flex_compile_s", {})
    out += [
        "",
        "Peak memory (GiB, `torch.cuda.max_memory_allocated` over one call, inputs and output "
        "gradient included) and FlexAttention's compile time (seconds of its first call, "
        "excluded from the timings above; Inductor's caches apply, so shapes compiled before "
        "take little more than a cache lookup).",
        "",
        "| workload | mode | "
        + " | ".join([f"{s} GiB" for s in short] + ["Flex compile s"] * (FLEX in impls))
        + " |",
        "| --- | --- |" + " ---: |" * (len(impls) + (FLEX in impls)),
    ]
    for key in keys:
        cell = table[key]
        mem = [_cell_text(cell.get(i), "peak_gib", ".2f") for i in impls]
        secs = compile_s.get(key[0], {}).get(key[1])
        if FLEX in impls:  # a run without FlexAttention (--impls) has no compile column
            mem.append(NOT_RUN if secs is None else f"{secs:.1f}")
        out.append(f"| {key[0]} | {key[1]} | " + " | ".join(mem) + " |")

    failures = [
        (key, impl, row["error"])
        for key in keys
        for impl, row in table[key].items()
        if row.get("ms") is None and row.get("error")
    ]
    if failures:
        out += ["", "Failed (recorded as missing):", ""]
        for (wname, mode), impl, error in failures:
            first = " ".join(str(error).split())[:300]
            out.append(f"- {wname} / {mode} / {impl}: {first}")
    return "\n".join(out) + "\n"


# --- chart ------------------------------------------------------------------------------------


def plot(data: dict[str, Any], png: str | Path) -> None:
    """Bar chart of TFLOP/s by workload, one bar per implementation, one panel per mode (fwd
    above, fwd+bwd below), written to ``png``. Raises ImportError without matplotlib."""
    # Imported here, not at the top: the GPU machine may lack matplotlib; the run's JSON is then
    # rendered elsewhere. Figure + savefig need no pyplot, hence no GUI backend and no globals.
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise ImportError(f"{MATPLOTLIB_NEEDED} ({exc})") from exc

    table = summarize(data.get("rows", []))
    keys = _keys(data, table)
    workloads = list(dict.fromkeys(k[0] for k in keys))
    modes = _ordered((k[1] for k in keys), MODES) or list(MODES)
    impls = _ordered((r["impl"] for r in data.get("rows", [])), IMPLS)
    colors = {impl: f"C{i}" for i, impl in enumerate(impls)}  # one color per impl, every panel
    width = 0.8 / max(1, len(impls))
    size = (max(10.0, 1.1 * len(workloads) + 4), 4.5 * len(modes) + 1.5)
    try:  # constrained layout keeps rotated labels, titles and the legend apart
        fig = Figure(figsize=size, layout="constrained")
    except TypeError:  # matplotlib < 3.6
        fig = Figure(figsize=size, constrained_layout=True)
    axes = fig.subplots(len(modes), 1, squeeze=False)[:, 0]
    for ax, mode in zip(axes, modes):
        for j, impl in enumerate(impls):
            xs, ys = [], []
            for i, wname in enumerate(workloads):
                row = table.get((wname, mode), {}).get(impl)
                if row is not None and row.get("tflops") is not None:
                    xs.append(i + (j - (len(impls) - 1) / 2) * width)
                    ys.append(row["tflops"])
            ax.bar(xs, ys, width, label=impl, color=colors[impl])
        ax.set_title(mode)
        ax.set_ylabel("TFLOP/s (useful)")
        ax.set_xticks(range(len(workloads)))
        ax.set_xticklabels(workloads, rotation=30, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(workloads) - 0.4)
        ax.grid(axis="y", alpha=0.3)
    handles = [Patch(color=colors[impl], label=impl) for impl in impls]  # missing bars too
    fig.legend(handles=handles, loc="outside lower center", ncol=len(impls), fontsize=9)
    fig.suptitle(f"portattn bench, {data.get('device', 'unknown device')}, bfloat16")
    fig.savefig(str(png), dpi=110)
