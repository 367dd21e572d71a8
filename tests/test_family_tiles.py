"""Every family's configuration entries run for correctness on the CPU.

The interpreter normally runs its own small-tile row (``configs.INTERPRETER``); here its table
entry is replaced by a real family's (sm80, sm90, sm100, sm120, cdna2, cdna3, cdna4, the rows of
the installed Triton), so the launchers plan exactly that entry's tiles, warps, stages, dK/dV
passes, forward chunks and descriptor reads (a launch recorder checks it), and the kernels run
under Triton's interpreter through the public API. What the interpreter cannot run falls back as
on a GPU without it: the warp-specialised Gluon kernels (``fwd_ws``, ``bwd_ws``, ``dq_ws``) run
as the Triton kernels at the same tiles; warps, stages and the AMD knobs do not change what the
interpreter computes. So this checks the tiling logic at each entry's tile sizes (masks, tile
counts, causal tile ranges, splits), not the family's machine code (that is the GPU suite's and
the golden files' job).

Sizes are chosen per entry to cross every tile boundary of it: with ``T`` its largest tile side,
sequences of ``T + 1`` and ``2T - 1`` rows end one row into and one row short of a tile of every
(power-of-two) size, beside a 1-row sequence, an empty query sequence and queries without keys.
float16 only (the interpreter multiplies bfloat16 as raw bits, triton-lang/triton#11584). The
default run takes one head dim per family and kernel (:data:`DEFAULT_HEAD_DIMS`, which together
cover every head dim and every split field); ``PORTATTN_ALL_FAMILY_TILES=1`` runs all of them.
"""

from __future__ import annotations

import os

import pytest
import torch
import triton
from helpers import HAS_GPU, KERNELS, assert_accurate, make_pack, run_reference

import portattn
from portattn import configs
from portattn.configs import HEAD_DIMS, INTERPRETER
from portattn.families import FAMILIES
from portattn.kernels import backward, forward
from portattn.tools import harness
from portattn.tools.compile_launches import WS_KERNELS, _bind, table_mismatches

pytestmark = pytest.mark.skipif(HAS_GPU, reason="interpreter runs; a GPU runs its own family")

DTYPE = torch.float16
ALL = os.environ.get("PORTATTN_ALL_FAMILY_TILES", "") not in ("", "0")
# (family, kernel) -> the head dim of the default run: every head dim appears, and so do the
# entries with split fields (sm100 varlen d256: two dK/dV passes; sm90 fixed_order d256: four
# passes and two forward chunks) and sm90's descriptor and Gluon entry (varlen d128).
DEFAULT_HEAD_DIMS = {
    ("sm80", "varlen"): 32,
    ("sm80", "fixed_order"): 96,
    ("sm90", "varlen"): 128,
    ("sm90", "fixed_order"): 256,
    ("sm100", "varlen"): 256,
    ("sm100", "fixed_order"): 64,
    ("sm120", "varlen"): 96,
    ("sm120", "fixed_order"): 128,
    ("cdna2", "varlen"): 64,
    ("cdna2", "fixed_order"): 32,
    ("cdna3", "varlen"): 128,
    ("cdna3", "fixed_order"): 256,
    ("cdna4", "varlen"): 96,
    ("cdna4", "fixed_order"): 64,
}
ENTRIES = [
    (family, kernel, head_dim)
    for family in FAMILIES
    for kernel in KERNELS
    for head_dim in (HEAD_DIMS if ALL else (DEFAULT_HEAD_DIMS[(family, kernel)],))
]
HEADS_Q, HEADS_K = 4, 2  # GQA: two query heads per kv head


def _entry_id(entry) -> str:
    family, kernel, head_dim = entry
    return f"{family}-{kernel}-d{head_dim}"


def test_default_run_covers_every_family_and_head_dim():
    """The default selection names every (family, kernel), each head dim at least once, and
    entries with each split and descriptor field."""
    assert set(DEFAULT_HEAD_DIMS) == {(f, k) for f in FAMILIES for k in KERNELS}
    assert set(DEFAULT_HEAD_DIMS.values()) == set(HEAD_DIMS)
    chosen = [configs.get_config(f, k, d, DTYPE) for (f, k), d in DEFAULT_HEAD_DIMS.items()]
    assert {c.dkdv_passes for c in chosen} == {1, 2, 4}
    assert {c.fwd_chunks for c in chosen} == {1, 2}
    gluon = [c for c in chosen if c.fwd_ws or c.bwd_ws or c.dq_ws]  # Triton 3.9: dq_ws only
    assert any(set(c.tma) == set(configs.TMA_KERNELS) for c in gluon)


@pytest.fixture
def family_entry(monkeypatch):
    """``force(family, kernel, head_dim)``: the interpreter's float16 entry becomes that
    family's (for the test's duration); returns the entry. Launches are recorded in
    ``force.launches`` as (stage, kernel name, BLOCK_M, BLOCK_N) after a table check."""
    table = configs.config_table()
    launches: list = []
    # The interpreter's product (``primitives.mma`` under INTERPRET) forms the [M, K, N] float32
    # products before summing over K; at the families' tiles (128 x 128 x 128: 2M elements)
    # that exceeds Triton's cap on a block's elements (2^20), which stands for a GPU's limits
    # and no GPU ever builds this tensor (it runs tl.dot). The cap is raised for these tests.
    monkeypatch.setattr(triton._utils, "TRITON_MAX_TENSOR_NUMEL", 1 << 24)

    def recording(run):
        def run_launches(planned, device, *args, **kwargs):
            for launch in planned:
                launches.append(launch)
            return run(planned, device, *args, **kwargs)

        return run_launches

    monkeypatch.setattr(forward, "run_launches", recording(forward.run_launches))
    monkeypatch.setattr(backward, "run_launches", recording(backward.run_launches))

    def force(family: str, kernel: str, head_dim: int) -> configs.KernelConfig:
        cfg = configs.get_config(family, kernel, head_dim, DTYPE)
        monkeypatch.setitem(table, (INTERPRETER, kernel, head_dim, DTYPE), cfg)
        assert configs.resolve_config(torch.device("cpu"), kernel, head_dim, DTYPE) is cfg
        return cfg

    force.launches = launches
    return force


def _check_launches(launches, cfg: configs.KernelConfig, expected: set[str]) -> None:
    """Every launch ran with the entry's tiles and options (as the compile check compiles them),
    and the stages run are ``expected``."""
    assert {launch.stage for launch in launches} == expected
    for planned in launches:
        launch = _bind(planned.stage, planned.kernel, planned.args, planned.params)
        assert table_mismatches(launch, cfg) == [], planned.stage
        assert planned.kernel.__name__ not in WS_KERNELS  # no Gluon on the interpreter


def _largest_tile(cfg: configs.KernelConfig) -> int:
    tiles = [cfg.stage_tiles(s) for s in ("fwd", "bwd_pre", "bwd_dkdv", "bwd_dq", "decode")]
    tiles += [cfg.bwd_dv] if cfg.bwd_dv is not None else []
    return max(max(t.block_m, t.block_n) for t in tiles)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("entry", ENTRIES, ids=_entry_id)
def test_family_entry_forward_backward(entry, causal, family_entry):
    """Forward and backward at the entry's tiles meet the accuracy rule against float64 (every
    output written: the buffers start as NaN), with sequences that cross each tile boundary:
    ``T + 1`` (one row into the next tile), ``2T - 1`` (one short of it) against fewer and more
    keys, 1 query row, 0 query rows, and 3 queries without keys (causal: bottom-right, so the
    ``2T - 1`` queries against ``T - 1`` keys start with rows that see no key)."""
    family, kernel, head_dim = entry
    cfg = family_entry(family, kernel, head_dim)
    t = _largest_tile(cfg)
    lens_q = [t + 1, 1, 0, 2 * t - 1, 3]
    lens_k = [t + 1, 2 * t - 1, 5, t - 1, 0]
    p = make_pack(lens_q, lens_k, HEADS_Q, HEADS_K, head_dim, DTYPE, seed=head_dim + t)
    assert_accurate(p, kernel, causal=causal)
    stages = {"fwd", "bwd_pre", "bwd_dkdv", "bwd_dq"}
    _check_launches(family_entry.launches, cfg, stages)
    passes = sum(launch.stage == "bwd_dkdv" for launch in family_entry.launches)
    assert passes == (2 if cfg.dkdv_passes > 1 else 1)


@pytest.mark.parametrize("entry", ENTRIES, ids=_entry_id)
def test_family_entry_decode(entry, family_entry):
    """The decode kernel at the entry's decode tiles (a forward without gradients whose query
    sequences fit one tile takes it): out and lse meet the accuracy rule and equal, bit for bit,
    the prefill forward's rows (the same call with a larger ``max_seqlen_q``, which runs the
    forward kernel at the entry's forward tiles). Key lengths cross the key tile."""
    family, kernel, head_dim = entry
    cfg = family_entry(family, kernel, head_dim)
    n = cfg.fwd.block_n
    lens_q, lens_k = [1, 4, 1, 0, 2], [2 * n - 1, n + 1, 1, 3, 0]
    p = make_pack(lens_q, lens_k, HEADS_Q, HEADS_K, head_dim, DTYPE, seed=head_dim + n)

    def forward_only(max_seqlen_q: int):
        with torch.no_grad():
            return portattn.varlen_attention(
                *(p.q, p.k, p.v, p.cu_q, p.cu_k, max_seqlen_q, max(lens_k)),
                causal=True,
                return_lse=True,
                kernel=kernel,
            )

    out, lse = forward_only(max(lens_q))
    _check_launches(family_entry.launches, cfg, {"decode"})
    family_entry.launches.clear()
    prefill_out, prefill_lse = forward_only(cfg.decode_tiles().block_m + 1)
    _check_launches(family_entry.launches, cfg, {"fwd"})
    assert torch.equal(out, prefill_out) and torch.equal(lse, prefill_lse)
    ref = run_reference(p, causal=True)
    eager = run_reference(p, causal=True, compute_dtype=DTYPE)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref["lse"]))
    for name, got in (("out", out), ("lse", lse)):
        err, base, bound = harness.measure(name, got, ref[name], eager[name])
        assert err <= bound, f"{name}: error {err:.3g} > {bound:.3g} (2 x eager {base:.3g})"
