"""Every signature of a public function that the docs show equals the real one
(``inspect.signature``), so the two cannot drift apart (issue 39, item 4).

Where the docs show signatures (README.md and docs/*.md):

- a fenced block without a language whose first line starts ``[portattn.]name(``: a full
  signature, possibly over several lines, with ``# comments`` and a ``-> result`` after it;
- an inline code span ``name(arg, ...)`` (it may wrap over lines) of a public function.

A full signature (no ``...`` among its parameters) must list exactly the real parameters in
order, with the real defaults (compared as values), ``*`` where the keyword-only ones start, and
no default where the real one has none. With ``...``, the parameters before it must be the real
leading ones (the rest is elided). A span is a call, not a signature, and is not compared, when
it has no argument or an argument's value is not a literal (``block_table=bt``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import portattn

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Public functions by bare name; a qualified name (portattn.bert_padding.pad_input) is resolved
# by import instead.
PUBLIC = {
    n: getattr(portattn, n)
    for n in portattn.__all__
    if inspect.isfunction(getattr(portattn, n, None))
}
for module, names in {
    "portattn.bert_padding": ("unpad_input", "pad_input"),
    "portattn.distributed": ("context_parallel_attention", "shard_keys", "shard_heads"),
}.items():
    for n in names:
        PUBLIC[n] = getattr(importlib.import_module(module), n)

NAME = r"(?:portattn\.)?(?:(?:[a-z_]+\.)*)(" + "|".join(map(re.escape, PUBLIC)) + r")"
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*(\S*)")
SPAN = re.compile(r"(?<!`)`(?!`)([^`]+)`(?!`)")
START = re.compile(r"^(portattn\.(?:[a-z_]+\.)*)?(\w+)\(")


@dataclass(frozen=True)
class Documented:
    path: Path
    line: int
    qualified: str  # as written, e.g. "portattn.bert_padding.unpad_input" or "pad_input"
    params: tuple[str, ...]  # the text of each parameter, "..." and "*" included

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}:{self.qualified}"


def split_params(text: str) -> tuple[str, ...]:
    """The top-level comma-separated parts of a parameter list (brackets and quotes kept)."""
    parts, depth, cur, quote = [], 0, "", None
    for ch in text:
        if quote:
            cur += ch
            quote = None if ch == quote else quote
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return tuple(parts)


def _inside_parens(text: str, start: int) -> str | None:
    """The text between the parenthesis at ``start`` and its match, or None (unbalanced)."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i]
    return None


def _documented(path: Path, line: int, text: str) -> Documented | None:
    match = START.match(text)
    if not match or match.group(2) not in PUBLIC:
        return None
    inner = _inside_parens(text, match.end() - 1)
    if inner is None:
        return None
    qualified = text[: match.end() - 1]
    return Documented(path, line, qualified, split_params(inner))


def extract(path: Path) -> list[Documented]:
    """The signatures ``path`` shows: fenced blocks without a language, inline code spans."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Documented] = []
    prose: list[tuple[int, str]] = []  # (line number, text) outside fenced blocks
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence.group(2)):
            end += 1
        if fence.group(3) in ("", "text"):
            body = [ln.split("#")[0].strip() for ln in lines[i + 1 : end]]
            # one signature per statement: a line that starts a call begins a new one
            starts = [j for j, ln in enumerate(body) if START.match(ln)]
            for a, b in zip(starts, [*starts[1:], len(body)]):
                doc = _documented(path, i + 2 + a, " ".join(body[a:b]))
                if doc:
                    found.append(doc)
        i = end + 1
    # inline spans may wrap: join each paragraph, keep the line where a span starts
    paragraph: list[tuple[int, str]] = []
    for item in [*prose, (0, "")]:
        if item[1].strip():
            paragraph.append(item)
            continue
        text = " ".join(t.strip() for _, t in paragraph)
        offsets, pos = [], 0
        for n, t in paragraph:
            offsets.append((pos, n))
            pos += len(t.strip()) + 1
        for span in SPAN.finditer(text):
            line = max(n for off, n in offsets if off <= span.start())
            doc = _documented(path, line, span.group(1).strip())
            if doc:
                found.append(doc)
        paragraph = []
    return found


def _literal(text: str) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return False, None


def is_call(doc: Documented) -> bool:
    """No argument, or an argument whose value is not a literal: a call in prose."""
    params = [p for p in doc.params if p not in ("...", "*")]
    if not params:
        return True
    return any("=" in p and not _literal(p.split("=", 1)[1].strip())[0] for p in params)


def resolve(doc: Documented):
    parts = doc.qualified.split(".")
    if len(parts) > 2:  # portattn.<module>.name
        return getattr(importlib.import_module(".".join(parts[:-1])), parts[-1])
    return PUBLIC[parts[-1]]


def differences(doc: Documented, real: inspect.Signature) -> list[str]:
    """What the documented parameters get wrong about ``real`` (empty: they agree)."""
    shown = list(doc.params)
    elided = "..." in shown
    if elided:
        shown = shown[: shown.index("...")]
    expected: list[str] = []
    star_done = False
    for p in real.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star_done:
            expected.append("*")
            star_done = True
        if p.kind is p.VAR_POSITIONAL:
            expected.append(f"*{p.name}")
            star_done = True
            continue
        if p.kind is p.VAR_KEYWORD:
            expected.append(f"**{p.name}")
            continue
        expected.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    problems: list[str] = []
    if not elided and len(shown) != len(expected):
        problems.append(f"{len(shown)} parameters shown, the function has {len(expected)}")
    for i, (got, want) in enumerate(zip(shown, expected)):
        name, _, default = got.partition("=")
        name = name.split(":")[0].strip()
        want_name, _, want_default = want.partition("=")
        if name != want_name:
            problems.append(f"parameter {i + 1}: {got!r} shown, {want!r} is the real one")
            break
        if bool(default) != bool(want_default):
            problems.append(f"{name}: shown as {got!r}, the real one is {want!r}")
        elif default:
            ok, value = _literal(default.strip())
            param = real.parameters[name]
            if not ok or value != param.default or type(value) is not type(param.default):
                problems.append(f"{name}: default {default.strip()} shown, real {want_default}")
    if not elided:
        missing = expected[len(shown) :]
        if missing:
            problems.append(f"not shown: {', '.join(missing)}")
    return problems


SIGNATURES = [d for f in FILES for d in extract(f) if not is_call(d)]


@pytest.mark.parametrize("doc", SIGNATURES, ids=[d.id for d in SIGNATURES])
def test_documented_signature_is_the_real_one(doc: Documented):
    real = inspect.signature(resolve(doc))
    problems = differences(doc, real)
    assert not problems, f"{doc.id}: {'; '.join(problems)} (real: {doc.qualified}{real})"


def test_signatures_found():
    """The extractor sees the signatures the issue named (an empty list would pass vacuously)."""
    seen = {(d.path.name, d.qualified.split(".")[-1], "..." in d.params) for d in SIGNATURES}
    for file, name in [
        ("README.md", "varlen_attention"),
        ("README.md", "attention"),
        ("api.md", "varlen_attention"),
        ("api.md", "attention"),
        ("api.md", "flash_attn_varlen_func"),
        ("api.md", "flash_attn_func"),
        ("api.md", "flash_attn_with_kvcache"),
        ("api.md", "merge_attention_states"),
        ("api.md", "family"),
        ("api.md", "unpad_input"),
        ("api.md", "pad_input"),
        ("design.md", "varlen_attention"),
        ("distributed.md", "context_parallel_attention"),
    ]:
        assert (file, name, False) in seen, f"no full signature of {name} found in {file}"


def test_the_comparison_can_fail():
    real = inspect.signature(portattn.varlen_attention)
    doc = Documented(ROOT / "x.md", 1, "varlen_attention", ("q", "k", "v", "*", "causal=False"))
    assert differences(doc, real)  # positional cu_seqlens missing
    short = Documented(ROOT / "x.md", 1, "varlen_attention", ("q", "k", "v", "..."))
    assert not differences(short, real)
    wrong = Documented(ROOT / "x.md", 1, "varlen_attention", ("q", "v", "..."))
    assert differences(wrong, real)
    params = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q=0", "...")
    assert differences(Documented(ROOT / "x.md", 1, "varlen_attention", params), real)
    no_star = tuple(p for p in SIGNATURES[0].params if p != "*")
    assert SIGNATURES[0].qualified == "varlen_attention"  # README's, with its keyword-only mark
    assert differences(Documented(ROOT / "x.md", 1, "varlen_attention", no_star), real)
    assert is_call(Documented(ROOT / "x.md", 1, "varlen_attention", ("...", "block_table=bt")))
    assert is_call(Documented(ROOT / "x.md", 1, "family", ()))
