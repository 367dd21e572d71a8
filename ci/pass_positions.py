"""How a benchmark run's medians move with the pass and the place in the order (perf-notes row
111): per implementation and mode, each pass's median over the implementation's best (mean and
largest over the run's workloads), and the same by place in the pass's order. A row without a
``position`` (runs before session 42) gets its place from the order the rows were written in.

Usage: python ci/pass_positions.py docs/bench-h100.json [more.json ...]
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

if not __package__:  # run as `python ci/pass_positions.py`: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_report import load_json, summarize


def _positions(rows: list[dict]) -> list[dict]:
    """The timed rows, each with its place in its pass's order."""
    seen: dict[tuple, int] = defaultdict(int)  # (workload, mode, pass) -> rows so far
    timed = []
    for row in rows:
        if row.get("ms") is None or row.get("pass") is None:
            continue
        key = (row["workload"], row["mode"], row["pass"])
        row = dict(row)
        row.setdefault("position", seen[key])
        seen[key] += 1
        timed.append(row)
    return timed


def table(rows: list[dict], by: str) -> list[str]:
    """Lines ``impl mode by=value: mean (max) of median / best`` for ``by`` "pass" or
    "position"."""
    best = summarize(rows)  # (workload, mode) -> impl -> its best row, as the reports take it
    ratios: dict[tuple, list[float]] = defaultdict(list)
    for r in _positions(rows):
        ratios[(r["impl"], r["mode"], r[by])].append(
            r["ms"] / best[(r["workload"], r["mode"])][r["impl"]]["ms"]
        )
    return [
        f"{impl:22s} {mode:8s} {by} {value}: {statistics.mean(v):.3f} (max {max(v):.3f}, "
        f"n {len(v)})"
        for (impl, mode, value), v in sorted(ratios.items())
    ]


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    for path in paths:
        data = load_json(path)  # rows of older runs read as well
        rows = data.get("rows", [])
        print(f"# {path}: {data.get('device')}, commit {str(data.get('git_commit'))[:7]}, "
              f"{data.get('passes', 2)} passes, heat {data.get('heat_s', 0)} s")  # fmt: skip
        for by in ("pass", "position"):
            print("\n".join(table(rows, by)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
