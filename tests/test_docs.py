"""Every Python example in README.md and docs/*.md runs, as its own script, in a subprocess.

A fenced block that starts with a ```python line is an example. Each one is run with the
repository on PYTHONPATH and, without a GPU, under Triton's interpreter (TRITON_INTERPRET=1 in
the child's environment), so examples must pick
``device = "cuda" if torch.cuda.is_available() else "cpu"`` and use float16 and small shapes.
The test id is ``file:line`` of the opening fence.

A block that cannot run in one CPU process (GPU-only, several processes) is skipped only when
the line right before its fence (blank lines aside) is ``<!-- not-run: reason -->`` with a
reason; it is still compiled, so it must be valid Python.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
FILES = [ROOT / "README.md", *DOCS]
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*(\S*)")
NOT_RUN = re.compile(r"^\s*<!--\s*not-run:(.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    not_run: str | None  # the reason, when marked not-run

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"


def extract_blocks(path: Path) -> list[Block]:
    """The ```python blocks of a Markdown file, with the not-run reason of each, if any."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.groups()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if lang == "python":
            body = [x[len(indent) :] if x.startswith(indent) else x for x in lines[i + 1 : end]]
            prev = i - 1
            while prev >= 0 and not lines[prev].strip():
                prev -= 1
            marker = NOT_RUN.match(lines[prev]) if prev >= 0 else None
            reason = marker.group(1).strip() if marker else None
            blocks.append(Block(path, i + 1, "\n".join(body) + "\n", reason))
        i = end + 1
    return blocks


BLOCKS = [b for path in FILES for b in extract_blocks(path)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_example_runs(block: Block, tmp_path: Path):
    if block.not_run is not None:
        assert block.not_run, f"{block.id}: a not-run marker must give a reason"
        compile(block.code, block.id, "exec")  # it must at least be valid Python
        pytest.skip(f"not-run: {block.not_run}")
    script = tmp_path / (block.id.replace("/", "_").replace(":", "_L") + ".py")
    script.write_text(block.code, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"{block.id}: example exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
            f"--- stderr\n{proc.stderr[-6000:]}",
            pytrace=False,
        )


def test_examples_found():
    """The extractor sees the examples (an empty list would make the test above vacuous)."""
    ids = {b.id.split(":")[0] for b in BLOCKS}
    assert {"README.md", "docs/index.md", "docs/api.md"} <= ids


def test_readme_links_every_doc():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in DOCS if f"](docs/{p.name})" not in readme]
    assert not missing, f"README.md does not link {missing}"


def test_index_example_is_short():
    first = next(b for b in BLOCKS if b.path.name == "index.md")
    assert first.not_run is None
    assert len(first.code.strip().splitlines()) <= 15


def test_extractor(tmp_path: Path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "text\n```python\nprint(1)\n```\n\n<!-- not-run: needs 2 GPUs -->\n\n```python\nx = 1\n"
        "```\n  ```python\n  y = 2\n  ```\n```bash\necho\n```\n",
        encoding="utf-8",
    )
    blocks = extract_blocks(doc)
    assert [(b.line, b.code, b.not_run) for b in blocks] == [
        (2, "print(1)\n", None),
        (8, "x = 1\n", "needs 2 GPUs"),
        (11, "y = 2\n", None),
    ]


SCRIPT_PATH = re.compile(r"\b((?:benchmarks|ci)/[\w./-]+\.(?:py|sh))\b")
# Spellings of commands that moved out of the package (benchmarks/): no runnable block gives them.
REMOVED = ("python -m portattn bench", "python -m portattn.distributed")


def test_documented_scripts_exist():
    """Every ``benchmarks/...`` and ``ci/...`` script that the pages (README.md, docs/*.md,
    ci/README.md), the nox sessions and the CI shell scripts name is a file of the checkout, and
    no ```bash block runs a command that moved into ``benchmarks/``."""
    pages = [*FILES, ROOT / "ci" / "README.md", ROOT / "noxfile.py", *(ROOT / "ci").glob("*.sh")]
    missing, removed = [], []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        where = page.relative_to(ROOT).as_posix()
        missing += [f"{where}: {m}" for m in SCRIPT_PATH.findall(text) if not (ROOT / m).is_file()]
        in_bash = False
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip().startswith("```"):
                in_bash = not in_bash and line.strip() in ("```bash", "```sh", "```shell")
            elif in_bash and line.strip().startswith(REMOVED):
                removed.append(f"{where}:{number}: {line.strip()}")
    assert not missing, missing
    assert not removed, removed
    assert any("benchmarks/bench.py" in p.read_text(encoding="utf-8") for p in FILES)
