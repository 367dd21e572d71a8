"""The fixed key split (design §3.1, ``KernelConfig.key_chunk``): the entries of the family
in use patched to a chunk of two key tiles (the interpreter's: 32 keys), every row's keys are
loops of C keys from its sequence's first, merged in order (``row_state.merge_partial``). The
design's invariances hold bitwise with it (decode == prefill, packed and paged, causal query
chunks, pack positions), a row of at most one chunk keeps the unsplit bits, longer rows take
the split's, and the accuracy rule holds against float64. On a GPU the patched entries run
the Triton forward (``fwd_ws`` off; the Gluon forward's merge has a test of its own)."""

from __future__ import annotations

import dataclasses

import invariance_checks as checks
import pytest
import torch
import unseen_checks
from helpers import (
    DEVICE,
    KERNELS,
    assert_outputs_accurate,
    cu_seqlens,
    make_pack,
    patch_key_chunk,
    run_kernel,
    spy_decode_stages,
    table_family,
)

import portattn
from portattn import configs, forward_replay
from portattn.kernels import decode, forward, plan

F16 = torch.float16
D = 32


@pytest.fixture
def chunk(monkeypatch) -> int:
    """The entries of the family in use split (for this test); the chunk C in keys."""
    patch_key_chunk(monkeypatch, True)
    size = configs.get_config(table_family(), "varlen", D, F16).key_chunk
    yield size
    plan.forget_problems()


@pytest.fixture
def stages(monkeypatch) -> list[str]:
    """The stages of the decode launches planned from here on (``forward.plan_decode``'s)."""
    return spy_decode_stages(monkeypatch)


def no_grad_call(p, kernel, **features) -> tuple[torch.Tensor, torch.Tensor]:
    """``varlen_attention`` of pack ``p``, causal, without autograd (the decode kernel takes
    every call whose query rows fit its tile, either kernel): (out, lse)."""
    max_q = int((p.cu_q[1:] - p.cu_q[:-1]).max())
    max_k = int((p.cu_k[1:] - p.cu_k[:-1]).max())
    with torch.no_grad():
        return portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, max_q, max_k,
                                         causal=True, kernel=kernel, return_lse=True,
                                         **features)  # fmt: skip


def unchunked(p, kernel, causal, **kw):
    """``run_kernel`` with the family's entries unsplit (the Triton forward, as the split)."""
    mp = pytest.MonkeyPatch()
    patch_key_chunk(mp, False)
    try:
        return run_kernel(p, kernel, causal, **kw)
    finally:
        mp.undo()
        plan.forget_problems()


def test_entry_rejects_a_chunk_that_cuts_a_key_tile():
    cfg = configs.config_table()[("interpreter", "varlen", 64, F16)]
    with pytest.raises(ValueError, match="key_chunk must be 0 or a multiple of block_n"):
        dataclasses.replace(cfg, key_chunk=24)
    assert dataclasses.replace(cfg, key_chunk=0).content_hash() == cfg.content_hash()
    assert dataclasses.replace(cfg, key_chunk=32).content_hash() != cfg.content_hash()


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_steps(chunk, kernel):
    checks.check_decode_steps(kernel, 3 * chunk + 4, 5, (4, 2), D, F16, 41)


@pytest.mark.parametrize("kernel", KERNELS)
def test_causal_chunks(chunk, kernel):
    chunks = [(0, 32), (32, 70), (5, 38), (17, 18), (69, 70), (1, 64)]
    checks.check_causal_chunks(kernel, 70, 70 + 2 * chunk - 29, (2, 1), D, F16, 40, chunks)


@pytest.mark.parametrize("kernel", KERNELS)
def test_pack_positions(chunk, kernel):
    checks.check_pack_positions(kernel, True, (40, 3 * chunk + 1), [(17, 17), (5, 63), (33, 1)],
                                (2, 1), D, F16, 43)  # fmt: skip


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("features", [{}, {"window_size": (40, 0)}, {"softcap": 5.0}],
                         ids=["plain", "window", "softcap"])  # fmt: skip
def test_accuracy_and_the_split_in_effect(chunk, kernel, features):
    """Against float64, the accuracy rule; rows of at most one chunk of keys have the unsplit
    bits, and the split moves some longer row (it is in effect)."""
    lens = [1, 17, chunk - 1, chunk, 3 * chunk + 17, 2 * chunk + 6]
    p = make_pack(lens, lens, 4, 2, D, F16, seed=7)
    got = run_kernel(p, kernel, True, **features)
    assert_outputs_accurate(got, p, True, **features)
    plain = unchunked(p, kernel, True, **features)
    bos = 0
    moved = False
    for n in lens:
        rows = slice(bos, bos + n)
        short = n <= chunk
        for name in ("out", "lse"):
            same = torch.equal(got[name][rows], plain[name][rows])
            assert same or not short, (name, n)
            moved |= not same
        bos += n
    assert moved


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("page", [16, 64, 256])
def test_paged_decode_equals_prefill(chunk, stages, kernel, page):
    """``flash_attn_with_kvcache`` on a paged cache, split: each sequence's new row has the
    prefill's bits (its last row), sequences of 1 to 130 keys (up to five chunks)."""
    lens = [1, chunk + 1, 2 * chunk, 4 * chunk + 2]
    p = make_pack(lens, lens, 4, 2, D, F16, seed=9)
    full = run_kernel(p, kernel, True)
    pages_per = -(-max(lens) // page)
    k_cache = torch.zeros(len(lens) * pages_per, page, 2, D, dtype=F16, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    order = torch.randperm(len(lens) * pages_per, generator=torch.Generator().manual_seed(3))
    table = order.view(len(lens), pages_per).to(torch.int32).to(DEVICE)
    bos, last = 0, []
    for b, n in enumerate(lens):
        for j in range(n):
            page_id, slot = table[b, j // page], j % page
            k_cache[page_id, slot] = p.k[bos + j]
            v_cache[page_id, slot] = p.v[bos + j]
        last.append(bos + n - 1)
        bos += n
    q = p.q[last][:, None]  # [B, 1, Hq, D]
    lengths = torch.tensor([n - 1 for n in lens], dtype=torch.int32, device=DEVICE)
    new_k, new_v = p.k[last][:, None], p.v[last][:, None]
    with torch.no_grad():
        out, lse = portattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, new_k, new_v, cache_seqlens=lengths, block_table=table,
            causal=True, kernel=kernel, return_softmax_lse=True,
        )  # fmt: skip
    assert torch.equal(out[:, 0], full["out"][last])
    assert torch.equal(lse[:, :, 0], full["lse"][last])
    assert "decode_combine" in stages  # the split decode (a small grid)


@pytest.mark.parametrize("kernel", KERNELS)
def test_windowed_decode_steps(chunk, kernel):
    """With a window a row's first key tile depends on its query tile (the prefill's 32 rows,
    a decode's one): the chunks are anchored at the sequence's first key, not at the tile's
    first, so decode and prefill rows still merge the same chunks."""
    window = dict(window_size=(chunk + 13, 0))
    n = 5 * chunk - 10
    p = make_pack([n], [n], 4, 2, D, F16, seed=44)
    full = run_kernel(p, kernel, True, **window)
    rows = [3 * chunk + 4, 4 * chunk - 1, 4 * chunk, n - 1]
    dec = checks.pack_of([
        checks.Pack(p.q[t:t + 1], p.k[:t + 1], p.v[:t + 1], cu_seqlens([1]), cu_seqlens([t + 1]),
                    p.do[t:t + 1], p.dlse[t:t + 1])
        for t in rows
    ])  # fmt: skip
    res = run_kernel(dec, kernel, True, **window)
    for i, t in enumerate(rows):
        for name in ("out", "lse", "dq"):
            assert torch.equal(res[name][i], full[name][t]), (name, t)


@pytest.mark.parametrize("kernel", KERNELS)
def test_calls_of_one_chunk_run_without_the_merge(chunk, monkeypatch, kernel):
    """A call whose sequences have at most C keys (``max_seqlen_k`` <= C) launches the kernels
    without the chunk merge (no ``KEY_CHUNK``: the machine code of an entry without a chunk),
    and its rows have the bits they have in a call that merges chunks (a longer sequence
    beside them): the forward and backward, and a decode step."""
    key_chunks: list[int] = []
    real = forward_replay.plan_forward

    def spy(*args, **kw):
        planned = real(*args, **kw)
        key_chunks.extend(launch.params.get("KEY_CHUNK", 0) for launch in planned.launches
                          if not launch.stage.endswith("_repair"))  # fmt: skip
        return planned

    monkeypatch.setattr(forward_replay, "plan_forward", spy)
    target = make_pack([chunk], [chunk], 4, 2, D, F16, seed=46)
    longer = make_pack([9], [3 * chunk + 2], 4, 2, D, F16, seed=47)
    alone = run_kernel(target, kernel, True)
    assert key_chunks == [0]
    mixed = run_kernel(checks.pack_of([target, longer]), kernel, True)
    assert key_chunks[1:] == [chunk]
    for name in ("out", "lse", "dq", "dk", "dv"):
        assert torch.equal(alone[name], mixed[name][:chunk]), name
    key_chunks.clear()
    step = checks.Pack(target.q[-1:], target.k, target.v, cu_seqlens([1]), cu_seqlens([chunk]),
                       target.do[:1], target.dlse[:1])  # fmt: skip
    one = no_grad_call(step, kernel)
    assert key_chunks == [0]
    both = no_grad_call(checks.pack_of([step, longer]), kernel)
    assert key_chunks[1:] and set(key_chunks[1:]) == {chunk}
    assert torch.equal(one[0], both[0][:1]) and torch.equal(one[1], both[1][:1])


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("features", ["plain", "window", "softcap", "sinks"])
def test_split_decode_is_the_prefill(chunk, stages, monkeypatch, kernel, features):
    """The split decode (each key chunk's partial in a program of its own, then the combine)
    gives the bits of the unsplit decode and of the prefill's rows, rows of one to five
    chunks, with windows, softcap and sinks; the split ran, and did not where the grid is
    large enough (``decode.SPLIT_BELOW_PROGRAMS``)."""
    kw = {
        "plain": {},
        "window": {"window_size": (chunk + 13, 0)},
        "softcap": {"softcap": 5.0},
        "sinks": {"sinks": torch.tensor([0.5, -1.0, 2.0, -30.0], device=DEVICE)},
    }[features]
    lens = [4 * chunk + 3, chunk + 5, 7]
    p = make_pack(lens, lens, 4, 2, D, F16, seed=45)
    full_out, full_lse = no_grad_call(p, kernel, **kw)
    rows = [(0, 4 * chunk + 2), (0, 2 * chunk), (0, chunk - 1), (1, chunk + 4), (2, 6)]
    starts = [0, lens[0], lens[0] + lens[1]]
    dec = checks.pack_of([
        checks.Pack(p.q[starts[b] + t:starts[b] + t + 1], p.k[starts[b]:starts[b] + t + 1],
                    p.v[starts[b]:starts[b] + t + 1], cu_seqlens([1]), cu_seqlens([t + 1]),
                    p.do[:1], p.dlse[:1])
        for b, t in rows
    ])  # fmt: skip
    monkeypatch.setattr(decode, "SPLIT_BELOW_PROGRAMS", 1 << 30)
    split = no_grad_call(dec, kernel, **kw)
    assert "decode_split" in stages and "decode_combine" in stages
    stages.clear()
    monkeypatch.setattr(decode, "SPLIT_BELOW_PROGRAMS", 0)
    plan.forget_problems()
    whole = no_grad_call(dec, kernel, **kw)
    assert stages and "decode_split" not in stages
    assert torch.equal(split[0], whole[0]) and torch.equal(split[1], whole[1])
    for i, (b, t) in enumerate(rows):
        assert torch.equal(split[0][i], full_out[starts[b] + t]), (b, t)
        assert torch.equal(split[1][i], full_lse[starts[b] + t]), (b, t)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("setup", ["causal", "window"])
def test_unseen_key_with_chunks(chunk, kernel, setup):
    """A NaN value no row of the other rows sees leaves them a clean run's bits with the split
    (rows of three chunks: the repair passes recompute their tiles through the same chunk
    loop, parking included)."""
    if setup == "causal":
        unseen_checks.check_unseen_key(kernel, unseen_checks.Setup(77, 77), 40, "v", float("nan"))
    else:
        window = unseen_checks.Setup(90, 90, window=(chunk + 9, 0))
        unseen_checks.check_unseen_key(kernel, window, 5, "v", float("nan"))


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_tiles", [1, 2])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gluon_forward_merges_chunks_as_the_triton_forward(monkeypatch, causal, chunk_tiles):
    """The warp-specialised Gluon forward (``fwd_ws``, no CPU interpreter; sm90's varlen d128
    bf16 entry as it ships, the running accumulator parked in a float32 workspace) with the key
    chunk gives the Triton forward's bits (both at C = one or two key tiles), rows of one to
    twelve chunks, sequences of 1 (a group without rows) to 1500 rows, GQA; the Gluon kernel
    ran."""
    head_dim = 128
    used: list[bool] = []
    real = forward.use_warp_specialized

    def spy(problem, tma):
        used.append(real(problem, tma))
        return used[-1]

    monkeypatch.setattr(forward, "use_warp_specialized", spy)
    table = configs.config_table()
    entry = (table_family(), "varlen", head_dim, torch.bfloat16)
    cfg = table[entry]
    lens = [1, 300, 777, 1500]
    p = make_pack(lens, lens, 8, 2, head_dim, torch.bfloat16, seed=12)
    outputs = []
    for fwd_ws in (cfg.fwd_ws, False):
        chunked = dataclasses.replace(cfg, fwd_ws=fwd_ws, key_chunk=chunk_tiles * cfg.fwd.block_n)
        monkeypatch.setitem(table, entry, chunked)
        plan.forget_problems()
        with torch.no_grad():
            outputs.append(portattn.varlen_attention(p.q, p.k, p.v, p.cu_q, p.cu_k, 1500, 1500,
                                                     causal=causal, return_lse=True))  # fmt: skip
    plan.forget_problems()
    assert used and used[0], "the entry does not run the Gluon forward"
    assert torch.equal(outputs[0][0], outputs[1][0])
    assert torch.equal(outputs[0][1], outputs[1][1])


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_one_long_sequence_decodes_as_its_prefill(monkeypatch, stages, kernel):
    """Issue 37's B1 row: one sequence of 32k keys (GQA 32/8, d128, bf16), the device's
    entries patched to C = 2048 (the Triton forward): its paged decode row, split into 16
    chunks, has the bits of its prefill's last row."""
    n = 32768
    patch_key_chunk(monkeypatch, True, 2048)
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    q, k, v = (torch.randn(n, h, 128, device=DEVICE, dtype=torch.bfloat16, generator=gen)
               for h in (32, 8, 8))  # fmt: skip
    cu = torch.tensor([0, n], dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        full, lse = portattn.varlen_attention(q, k, v, cu, cu, n, n, causal=True, kernel=kernel,
                                              return_lse=True)  # fmt: skip
        pages = torch.arange(n // 64, dtype=torch.int32, device=DEVICE)[None]
        lengths = torch.tensor([n], dtype=torch.int32, device=DEVICE)
        out, lse_d = portattn.flash_attn_with_kvcache(
            q[-1:][None], k.view(-1, 64, 8, 128), v.view(-1, 64, 8, 128), cache_seqlens=lengths,
            block_table=pages, causal=True, return_softmax_lse=True, kernel=kernel,
        )  # fmt: skip
    plan.forget_problems()
    assert "decode_split" in stages
    assert torch.equal(out[0, 0], full[-1])
    assert torch.equal(lse_d[0, :, 0], lse[-1])


PAGED_FEATURES = ({}, {"softcap": 5.0}, {"window_size": (4000, 0)})
PAGED_FEATURE_IDS = ("plain", "softcap", "window")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    ("features", "page"),
    [
        *((features, page) for features in PAGED_FEATURES for page in (16, 64, 256)),
        ({"sinks": True}, None),  # no sinks in flash-attn's kvcache call: the packed decode
    ],
    ids=[*(f"{f}-page{p}" for f in PAGED_FEATURE_IDS for p in (16, 64, 256)), "sinks"],
)
def test_sm90_chunk_splits_a_long_decode_with_the_prefill_bits(
    monkeypatch, stages, kernel, head_dim, features, page
):
    """The device's entries with the sm90 key chunk (C = 16,384 keys, perf-notes row 116:
    the entry's own where it has one, else patched to it, the Gluon forward kept, so the
    prefill parks its accumulator as it would ship): one sequence of 20,000 keys (GQA 32/8,
    bf16), its paged decode row split over its two chunks, has the bits of its prefill's last
    row, features included (the window crosses the chunk boundary)."""
    plan.forget_problems()
    if not configs.get_config(table_family(), kernel, head_dim, torch.bfloat16).key_chunk:
        patch_key_chunk(monkeypatch, True, 16384, ws=True)
    n = 20000
    assert n > configs.get_config(table_family(), kernel, head_dim, torch.bfloat16).key_chunk > 0
    gen = torch.Generator(device=DEVICE).manual_seed(11)
    q, k, v = (torch.randn(n, h, head_dim, device=DEVICE, dtype=torch.bfloat16, generator=gen)
               for h in (32, 8, 8))  # fmt: skip
    if features.get("sinks"):
        sinks = torch.randn(32, device=DEVICE, generator=gen) * 2
        features = dict(features, sinks=sinks)
    cu = torch.tensor([0, n], dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        full, lse = portattn.varlen_attention(q, k, v, cu, cu, n, n, causal=True, kernel=kernel,
                                              return_lse=True, **features)  # fmt: skip
        if page is None:  # the packed decode: one query row against the sequence's keys
            cu_q = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
            out, lse_d = portattn.varlen_attention(
                q[-1:], k, v, cu_q, cu, 1, n, causal=True, kernel=kernel, return_lse=True,
                **features,
            )  # fmt: skip
            out, lse_d = out[None], lse_d.T[None]
        else:  # pages in reverse order, the last one's unused slots NaN
            n_pages = -(-n // page)
            k_pages = torch.full((n_pages * page, 8, head_dim), float("nan"), device=DEVICE,
                                 dtype=torch.bfloat16)  # fmt: skip
            v_pages = torch.full_like(k_pages, float("nan"))
            k_pages[:n], v_pages[:n] = k, v
            order = torch.arange(n_pages - 1, -1, -1, dtype=torch.int32, device=DEVICE)
            k_cache = torch.empty_like(k_pages).view(n_pages, page, 8, head_dim)
            v_cache = torch.empty_like(k_cache)
            k_cache[order.long()] = k_pages.view(n_pages, page, 8, head_dim)
            v_cache[order.long()] = v_pages.view(n_pages, page, 8, head_dim)
            lengths = torch.tensor([n], dtype=torch.int32, device=DEVICE)
            out, lse_d = portattn.flash_attn_with_kvcache(
                q[-1:][None], k_cache, v_cache, cache_seqlens=lengths, block_table=order[None],
                causal=True, return_softmax_lse=True, kernel=kernel, **features,
            )  # fmt: skip
    plan.forget_problems()
    assert "decode_split" in stages
    assert torch.equal(out[0, 0], full[-1])
    assert torch.equal(lse_d[0, :, 0], lse[-1])
