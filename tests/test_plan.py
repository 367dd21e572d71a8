"""Plan, then launch (portattn/kernels/plan.py): the problem record, the planners' choice of
kernel per stage, and the executor. Planning launches nothing, so these run on the CPU with
the interpreter switched off in the problem record (the planners then choose as on a GPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from portattn import configs
from portattn.kernels import backward, forward
from portattn.kernels.plan import plan_problem, run_launches, splits_p
from portattn.options import AttentionOptions

# Compiles, Triton APIs or the installed Triton's table: nox -s tests_newest runs it too.
pytestmark = pytest.mark.triton_version

SM90 = "sm90"


def _tensors(head_dim: int = 128, dtype=torch.bfloat16):
    q = torch.randn(96, 4, head_dim).to(dtype)
    k = torch.randn(80, 2, head_dim).to(dtype)
    v = torch.randn(80, 2, head_dim).to(dtype)
    cu_q = torch.tensor([0, 40, 96], dtype=torch.int32)
    cu_k = torch.tensor([0, 30, 80], dtype=torch.int32)
    return q, k, v, cu_q, cu_k


def _gpu_problem(cfg, kernel="varlen", head_dim=128):
    q, k, v, cu_q, cu_k = _tensors(head_dim)
    options = AttentionOptions(causal=True, softmax_scale=head_dim**-0.5, kernel=kernel)
    problem = plan_problem(q, k, cu_q, 56, 50, options, cfg)
    return dataclasses.replace(problem, interpret=False), (q, k, v, cu_q, cu_k)


def test_problem_decodes_the_kernel_once():
    q, k, v, cu_q, cu_k = _tensors(64, torch.float16)
    for kernel, split in (("varlen", False), ("fixed_order", True)):
        p = plan_problem(q, k, cu_q, 56, 50, AttentionOptions(False, 0.125, kernel))
        assert p.split_p is split is splits_p(kernel)
        assert (p.total_q, p.total_k, p.n_heads_q, p.n_heads_k, p.head_dim, p.batch) == (
            96,
            80,
            4,
            2,
            64,
            2,
        )
        assert p.group == 2 and p.scale_log2 == 0.125 * 1.4426950408889634
        assert p.cfg == configs.resolve_config(q.device, kernel, 64, q.dtype)


@pytest.mark.parametrize("kernel", configs.KERNELS)
def test_sm90_entries_plan_their_gluon_kernels(kernel):
    """The sm90 d128 entries select the warp-specialised kernels: the planners pick them on
    the descriptor path, and the Triton kernels where the tensors are misaligned."""
    cfg = configs.get_config(SM90, kernel, 128, torch.bfloat16)
    problem, (q, k, v, cu_q, cu_k) = _gpu_problem(cfg, kernel)
    fwd = forward.plan_forward(problem, q, k, v, cu_q, cu_k, store_o32=problem.split_p)
    launch, repair = fwd.launches  # causal: the repair pass follows (design §3.2)
    expected = forward.attn_fwd_ws_kernel if cfg.fwd_ws else forward.attn_fwd_kernel
    assert launch.kernel is expected
    # q, k, v as the launch's ragged descriptors, made on the host: the kernel makes none
    reads, n = {d.position: d[1:3] for d in launch.descriptors}, cfg.fwd.block_n
    assert not launch.tma
    if cfg.fwd_ws:  # the groups' 64 rows, the whole head dim
        assert (reads[0], reads[1], reads[2]) == ((64, 0), (n, 0), (n, 0))
    elif "fwd" in cfg.tma:  # the Triton kernel's tiles, head-first (TMA_HOST)
        m = cfg.fwd.block_m
        assert (reads[0], reads[1], reads[2]) == ((m, 128), (n, 128), (n, 128))
        assert launch.params["TMA"] == 2 and repair.descriptors == launch.descriptors
    else:
        assert not reads
    assert repair.stage == "fwd_repair" and repair.kernel is forward.attn_fwd_kernel
    assert repair.params["REPAIR"] and repair.params["BLOCK_N"] == cfg.fwd.block_n
    # A view starting 2 bytes in: no descriptor path, so the Triton forward.
    q_off = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape).copy_(q)
    launch, _ = forward.plan_forward(problem, q_off, k, v, cu_q, cu_k, False).launches
    assert launch.kernel is forward.attn_fwd_kernel and not launch.tma


def test_the_gluon_forward_parks_its_chunks_in_a_float32_workspace():
    """With a key chunk (design §3.1) the Gluon forward parks each group's running acc in its
    rows of the o32 argument: a float32 workspace of out's shape, carried as the plan's
    ``partials`` (replays allocate it per call), or the float32 copy of out where the call
    keeps one; a call of at most C keys runs the entry's code (no chunk, no workspace). Where
    the installed Triton's entry runs the Triton forward (3.9), nothing is parked."""
    cfg = configs.get_config(SM90, "varlen", 128, torch.bfloat16)
    cfg = dataclasses.replace(cfg, key_chunk=2 * cfg.fwd.block_n)
    gluon = cfg.fwd_ws
    q, k, v, cu_q, cu_k = _tensors()
    options = AttentionOptions(causal=True, softmax_scale=128**-0.5, kernel="varlen")
    for max_k, chunked in ((cfg.key_chunk, False), (cfg.key_chunk + 1, True)):
        problem = plan_problem(q, k, cu_q, 56, max_k, options, cfg)
        problem = dataclasses.replace(problem, interpret=False)
        fwd = forward.plan_forward(problem, q, k, v, cu_q, cu_k, store_o32=False)
        launch = fwd.launches[0]
        assert launch.kernel is (forward.attn_fwd_ws_kernel if gluon else forward.attn_fwd_kernel)
        assert launch.params.get("KEY_CHUNK") == (cfg.key_chunk if chunked else None)
        o32 = launch.args[5]  # (q, k, v, o, lse, o32, ...)
        if chunked and gluon:
            assert fwd.partials is o32 and o32 is not fwd.out
            assert o32.dtype == torch.float32 and o32.shape == fwd.out.shape
            assert launch.args[16:18] == o32.stride()[:2]
        else:
            assert fwd.partials is None and o32 is fwd.out
        kept = forward.plan_forward(problem, q, k, v, cu_q, cu_k, store_o32=True)
        assert kept.partials is None and kept.launches[0].args[5] is kept.out32


@pytest.mark.parametrize(
    ("field", "stage", "bad_tiles"),
    [
        ("fwd_ws", "fwd", configs.Tiles(64, 64, 4, 3)),
        ("bwd_ws", "bwd_dkdv", configs.Tiles(32, 64, 4, 3)),
        ("dq_ws", "bwd_dq", configs.Tiles(128, 32, 8, 3)),
    ],
)
def test_gluon_entry_that_does_not_fit_raises(field, stage, bad_tiles):
    """An entry selecting a Gluon kernel for tiles it is not written for is an error, not a
    quiet fallback to the Triton kernel."""
    cfg = dataclasses.replace(
        configs.get_config(SM90, "varlen", 128, torch.bfloat16),
        tma=configs.TMA_KERNELS,
        dkdv_passes=1,
        bwd_dv=None,
        **{field: True, stage: bad_tiles},
    )
    problem, (q, k, v, cu_q, cu_k) = _gpu_problem(cfg)
    with pytest.raises(ValueError, match=field):
        fwd = forward.plan_forward(problem, q, k, v, cu_q, cu_k, False)
        backward.plan_backward(problem, q, q, k, v, fwd.out, fwd.lse, None, cu_q, cu_k)


def test_backward_plan_order_and_stages():
    """Preprocess, then dK/dV (a dV and a dK launch with split passes), then dQ."""
    cfg = configs.get_config("sm80", "fixed_order", 128, torch.bfloat16)
    problem, (q, k, v, cu_q, cu_k) = _gpu_problem(cfg, "fixed_order")
    fwd = forward.plan_forward(problem, q, k, v, cu_q, cu_k, True)
    bwd = backward.plan_backward(problem, q, q, k, v, fwd.out32, fwd.lse, None, cu_q, cu_k)
    # causal: each pass's repair, one launch per gradient (a dK/dV pass: dV's, then dK's)
    one_pass = ["bwd_dkdv", "bwd_dkdv_repair", "bwd_dkdv_repair"]
    dkdv = one_pass if cfg.dkdv_passes == 1 else ["bwd_dkdv", "bwd_dkdv_repair"] * 2
    stages = ["bwd_pre", *dkdv, "bwd_dq", "bwd_dq_repair"]
    assert [launch.stage for launch in bwd.launches] == stages


@pytest.mark.parametrize(
    ("causal", "max_seqlen_q", "window", "repairs"),
    [
        (True, 56, (-1, -1), True),
        (False, 56, (-1, -1), False),
        (True, 1, (-1, -1), False),
        (False, 56, (8, -1), True),
        (False, 1, (-1, 4), True),
    ],
)
def test_repair_passes_only_where_a_tile_holds_unseen_keys(causal, max_seqlen_q, window, repairs):
    """Design §3.2: a repair launch follows each pass when a visited key tile can hold keys
    some of its rows do not see (causal with more than one query row, or a window); none for
    non-causal calls and for causal decode of one row per sequence."""
    q, k, v, cu_q, cu_k = _tensors(64, torch.float16)
    options = AttentionOptions(
        causal, 0.125, "varlen", window_left=window[0], window_right=window[1]
    )
    problem = plan_problem(q, k, cu_q, max_seqlen_q, 50, options)
    fwd = forward.plan_forward(problem, q, k, v, cu_q, cu_k, False)
    bwd = backward.plan_backward(problem, q, q, k, v, fwd.out, fwd.lse, None, cu_q, cu_k)
    stages = [launch.stage for launch in (*fwd.launches, *bwd.launches)]
    assert problem.has_unseen_keys is repairs
    assert any(stage.endswith("_repair") for stage in stages) is repairs


def test_empty_pack_plans_nothing_and_still_checks():
    q, k, v, _, _ = _tensors(64, torch.float16)
    cu = torch.zeros(1, dtype=torch.int32)  # no sequence
    problem = plan_problem(q[:0], k[:0], cu, 0, 0, AttentionOptions(False, 0.125, "varlen"))
    plan = forward.plan_forward(problem, q[:0], k[:0], v[:0], cu, cu, False)
    assert plan.launches == () and plan.out.shape == (0, 4, 64)
    checked = []
    run_launches(plan.launches, q.device, lambda: checked.append(True))
    assert checked == [True]
    with pytest.raises(ValueError, match="boom"):
        run_launches((), q.device, lambda: (_ for _ in ()).throw(ValueError("boom")))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(dkdv_passes=3), "dkdv_passes must be 1, 2 or 4"),
        (dict(fwd_chunks=4), "fwd_chunks must be 1 or 2"),
        (dict(tma=("fwd", "bwd_pre")), "tma must name kernels"),
        (dict(fwd_ws=True, fwd_chunks=2), "fwd_ws needs fwd_chunks == 1"),
        (dict(bwd_ws=True, dkdv_passes=2), "bwd_ws needs dkdv_passes == 1"),
    ],
)
def test_bad_entry_is_refused_when_made(fields, message):
    base = configs.get_config(SM90, "varlen", 64, torch.bfloat16)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(base, **fields)
