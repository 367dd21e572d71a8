"""A key a row does not see never changes that row (issue 35, item 4).

Masked score entries are exact zeros in P and dS, but 0 times NaN or inf is NaN: without care a
NaN/inf in the value (or key, or a query row's dO) of a key that some rows of a tile do not see
reaches those rows through the tile's second product. These checks put non-finite values in one
key (or one dO row) and compare, bitwise, everything that does not see it with a clean run.
Shared by the CPU tests (``test_unseen_keys.py``) and their GPU forms (the same file, marked
``gpu``).
"""

from __future__ import annotations

import dataclasses

import torch
from helpers import make_pack, run_kernel


def sees(
    rows: torch.Tensor,
    key: int,
    seqlen_q: int,
    seqlen_k: int,
    causal: bool,
    window: tuple[int, int],
) -> torch.Tensor:
    """Which query rows (positions ``rows``) of one sequence see key ``key`` (design §2:
    bottom-right aligned causal mask and window)."""
    diag = seqlen_k - seqlen_q
    vis = torch.ones_like(rows, dtype=torch.bool)
    left, right = window
    if causal:
        vis &= key <= rows + diag
    if right >= 0:
        vis &= key <= rows + diag + right
    if left >= 0:
        vis &= key >= rows + diag - left
    return vis


def _equal_rows(name: str, a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor) -> None:
    assert torch.equal(a[rows], b[rows]), f"{name}: rows that do not see the bad key changed"


@dataclasses.dataclass(frozen=True)
class Setup:
    """One sequence of ``seqlen_q`` query rows against ``seqlen_k`` keys and how it is run."""

    seqlen_q: int
    seqlen_k: int
    heads: tuple[int, int] = (4, 2)
    head_dim: int = 64
    dtype: torch.dtype = torch.float16
    causal: bool = True
    window: tuple[int, int] = (-1, -1)
    seed: int = 0

    def runs(self, kernel: str, field: str, index: int, bad: float, head: int | None = None):
        """The clean pack and both runs' results: clean, and with row ``index`` of the pack's
        ``field`` (k, v or do) set to ``bad`` (in every head, or in ``head`` alone)."""
        clean = make_pack(
            [self.seqlen_q], [self.seqlen_k], *self.heads, self.head_dim, self.dtype, self.seed
        )
        poisoned = getattr(clean, field).detach().clone()
        if head is None:
            poisoned[index] = bad
        else:
            poisoned[index, head] = bad
        dirty = dataclasses.replace(clean, **{field: poisoned})
        opts = dict(causal=self.causal, window_size=self.window)
        return clean, run_kernel(clean, kernel, **opts), run_kernel(dirty, kernel, **opts)


def check_unseen_key(
    kernel: str, setup: Setup, key: int, target: str, bad: float, kv_head: int | None = None
) -> None:
    """``target`` ('k' or 'v') of key ``key`` (every head, or kv head ``kv_head`` alone, every
    column) set to ``bad``: out, lse and dQ of the rows that do not see the key equal a clean
    run's bits; rows that see a NaN value are NaN (in ``kv_head``'s query heads); the query
    heads of the other kv heads equal a clean run's in every row."""
    clean, want, got = setup.runs(kernel, target, key, bad, kv_head)
    if kv_head is not None:
        group = setup.heads[0] // setup.heads[1]
        others = [h for h in range(setup.heads[0]) if h // group != kv_head]
        for name in ("out", "lse", "dq"):
            assert torch.equal(got[name][:, others], want[name][:, others]), (
                f"{name}: a query head of another kv head changed"
            )
        mine = slice(kv_head * group, (kv_head + 1) * group)
        got = {name: got[name][:, mine] for name in ("out", "lse", "dq")}
        want = {name: want[name][:, mine] for name in ("out", "lse", "dq")}
    rows = torch.arange(setup.seqlen_q, device=clean.q.device)
    seen = sees(rows, key, setup.seqlen_q, setup.seqlen_k, setup.causal, setup.window)
    assert (~seen).any(), "the case has no row that does not see the key"
    for name in ("out", "lse", "dq"):
        _equal_rows(name, got[name], want[name], ~seen)
    if target == "v" and bad != bad and seen.any():  # NaN values: the rows that see them
        assert torch.isnan(got["out"][seen]).all(), "a row that sees a NaN value is not NaN"


def check_unseen_grad_row(kernel: str, setup: Setup, row: int, bad: float) -> None:
    """dO of query row ``row`` (every head) set to ``bad``: dK and dV of the keys that row does
    not see, and dQ of every other row, equal a clean run's bits."""
    clean, want, got = setup.runs(kernel, "do", row, bad)
    seqlen_q, seqlen_k, causal, window = setup.seqlen_q, setup.seqlen_k, setup.causal, setup.window
    keys = torch.arange(seqlen_k, device=clean.q.device)
    unseen = torch.tensor(
        [
            not bool(sees(torch.tensor([row]), int(j), seqlen_q, seqlen_k, causal, window)[0])
            for j in keys.tolist()
        ],
        device=keys.device,
    )
    assert unseen.any(), "the case has no key the row does not see"
    for name in ("dk", "dv"):
        _equal_rows(name, got[name], want[name], unseen)
    others = torch.arange(seqlen_q, device=clean.q.device) != row
    for name in ("out", "lse", "dq"):
        _equal_rows(name, got[name], want[name], others)


def check_unseen_append(
    kernel: str,
    page_size: int,
    bad: float,
    heads=(4, 2),
    head_dim: int = 64,
    dtype=torch.float16,
    window=(-1, -1),
    softcap: float = 0.0,
    seed: int = 0,
) -> None:
    """``flash_attn_with_kvcache`` appending 4 rows per sequence to a paged cache, causal:
    the value of sequence 0's last new key is ``bad``; the three rows before it do not see it
    and get a clean run's bits (out and lse), sequence 1 too."""
    from portattn import flash_attn_with_kvcache

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    lens, new, pages_per_seq = [30, 17], 4, 64 // page_size + 1

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    n_pages = 2 * pages_per_seq
    k_cache, v_cache = (
        rand(n_pages, page_size, hkv, head_dim),
        rand(n_pages, page_size, hkv, head_dim),
    )
    perm = torch.randperm(n_pages, generator=gen).to(torch.int32).to(device)
    table = perm.view(2, pages_per_seq)
    q, k, v = rand(2, new, hq, head_dim), rand(2, new, hkv, head_dim), rand(2, new, hkv, head_dim)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)

    def run(values):
        out, lse = flash_attn_with_kvcache(
            q,
            k_cache.clone(),
            v_cache.clone(),
            k,
            values,
            cache_seqlens=seqlens,
            block_table=table,
            causal=True,
            window_size=window,
            softcap=softcap,
            return_softmax_lse=True,
            kernel=kernel,
        )
        return out, lse

    v_bad = v.clone()
    v_bad[0, new - 1] = bad
    (out, lse), (out_bad, lse_bad) = run(v), run(v_bad)
    assert torch.equal(out_bad[0, : new - 1], out[0, : new - 1]), "rows before the bad key changed"
    assert torch.equal(lse_bad[0, :, : new - 1], lse[0, :, : new - 1])
    assert torch.equal(out_bad[1], out[1]) and torch.equal(lse_bad[1], lse[1])
    if bad != bad:
        assert torch.isnan(out_bad[0, new - 1]).all(), "the row that sees a NaN value is not NaN"
