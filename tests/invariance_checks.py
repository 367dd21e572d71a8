"""The invariance checks of design §3 (docs/design.md), shared by the CPU (interpreter, small
shapes) and GPU (larger shapes, both dtypes) test modules. Every comparison is
``torch.equal``."""

from __future__ import annotations

import random

import torch
from helpers import Pack, assert_bitwise_equal, cu_seqlens, make_pack, run_kernel

NAMES = ("out", "lse", "dq", "dk", "dv")


def pack_of(seqs: list[Pack]) -> Pack:
    """Concatenate single-sequence packs into one pack (in list order)."""

    def cat(name):
        return torch.cat([getattr(s, name) for s in seqs])

    lens_q = [s.q.shape[0] for s in seqs]
    lens_k = [s.k.shape[0] for s in seqs]
    device = seqs[0].q.device
    return Pack(
        cat("q"),
        cat("k"),
        cat("v"),
        cu_seqlens(lens_q, device),
        cu_seqlens(lens_k, device),
        cat("do"),
        cat("dlse"),
    )


def rows_of(res: dict, q0: int, q1: int, k0: int, k1: int) -> dict:
    return {
        "out": res["out"][q0:q1],
        "lse": res["lse"][q0:q1],
        "dq": res["dq"][q0:q1],
        "dk": res["dk"][k0:k1],
        "dv": res["dv"][k0:k1],
    }


def check_run_to_run(kernel, causal, lens_q, lens_k, heads, head_dim, dtype, repeats, seed):
    p = make_pack(lens_q, lens_k, heads[0], heads[1], head_dim, dtype, seed=seed)
    first = run_kernel(p, kernel, causal)
    for _ in range(repeats):
        assert_bitwise_equal(first, run_kernel(p, kernel, causal))


def check_pack_positions(kernel, causal, target_len, other_lens, heads, head_dim, dtype, seed):
    """A sequence alone == first, middle, last among others; any batch size; any order."""
    tq, tk = target_len
    mk = lambda lq, lk, s: make_pack([lq], [lk], heads[0], heads[1], head_dim, dtype, seed=s)  # noqa: E731
    target = mk(tq, tk, seed)
    others = [mk(lq, lk, seed + 1 + i) for i, (lq, lk) in enumerate(other_lens)]
    alone = run_kernel(target, kernel, causal)
    layouts = [others[:j] + [target] + others[j:] for j in (0, len(others) // 2, len(others))]
    shuffled = others[:]
    random.Random(seed).shuffle(shuffled)
    layouts.append(shuffled[:3] + [target] + shuffled[3:])
    for seqs in layouts:
        j = next(i for i, s in enumerate(seqs) if s is target)
        res = run_kernel(pack_of(seqs), kernel, causal)
        q0 = sum(s.q.shape[0] for s in seqs[:j])
        k0 = sum(s.k.shape[0] for s in seqs[:j])
        assert_bitwise_equal(alone, rows_of(res, q0, q0 + tq, k0, k0 + tk))


def check_batch_size(kernel, causal, lens, heads, head_dim, dtype, seed):
    """Batch of 1 vs batch of len(lens): every sequence gives the same bytes."""
    seqs = [
        make_pack([n], [n], heads[0], heads[1], head_dim, dtype, seed=seed + i)
        for i, n in enumerate(lens)
    ]
    res = run_kernel(pack_of(seqs), kernel, causal)
    q0 = 0
    for s, n in zip(seqs, lens):
        assert_bitwise_equal(run_kernel(s, kernel, causal), rows_of(res, q0, q0 + n, q0, q0 + n))
        q0 += n


def check_head_slices(kernel, causal, lens_q, lens_k, heads, head_dim, dtype, seed, slices):
    """Heads [a, b) (whole GQA groups) alone == those heads of the full call."""
    p = make_pack(lens_q, lens_k, heads[0], heads[1], head_dim, dtype, seed=seed)
    full = run_kernel(p, kernel, causal)
    group = heads[0] // heads[1]
    for a, b in slices:
        ka, kb = a // group, b // group
        part = Pack(
            p.q[:, a:b], p.k[:, ka:kb], p.v[:, ka:kb], p.cu_q, p.cu_k, p.do[:, a:b], p.dlse[:, a:b]
        )
        res = run_kernel(part, kernel, causal)
        for name in ("out", "lse", "dq"):
            assert torch.equal(res[name], full[name][:, a:b]), (name, a, b)
        for name in ("dk", "dv"):
            assert torch.equal(res[name], full[name][:, ka:kb]), (name, a, b)


def check_causal_chunks(kernel, seqlen_q, seqlen_k, heads, head_dim, dtype, seed, chunks):
    """Causal rows [a, b) against keys [0, b + Sk - Sq) == those rows of the full call."""
    p = make_pack([seqlen_q], [seqlen_k], heads[0], heads[1], head_dim, dtype, seed=seed)
    full = run_kernel(p, kernel, causal=True)
    diag = seqlen_k - seqlen_q
    dev = p.q.device
    for a, b in chunks:
        part = Pack(
            p.q[a:b],
            p.k[: b + diag],
            p.v[: b + diag],
            cu_seqlens([b - a], dev),
            cu_seqlens([b + diag], dev),
            p.do[a:b],
            p.dlse[a:b],
        )
        res = run_kernel(part, kernel, causal=True)
        for name in ("out", "lse", "dq"):
            assert torch.equal(res[name], full[name][a:b]), (name, a, b)


def check_decode_steps(kernel, seqlen, steps, heads, head_dim, dtype, seed):
    """Decode (Sq = 1 against the first t + 1 keys) == row t of the Sk x Sk prefill, for the
    last ``steps`` rows, run as one batch of decode sequences."""
    p = make_pack([seqlen], [seqlen], heads[0], heads[1], head_dim, dtype, seed=seed)
    full = run_kernel(p, kernel, causal=True)
    dev = p.q.device
    rows = list(range(seqlen - steps, seqlen))
    dec = pack_of(
        [
            Pack(
                p.q[t : t + 1],
                p.k[: t + 1],
                p.v[: t + 1],
                cu_seqlens([1], dev),
                cu_seqlens([t + 1], dev),
                p.do[t : t + 1],
                p.dlse[t : t + 1],
            )
            for t in rows
        ]
    )
    res = run_kernel(dec, kernel, causal=True)
    for i, t in enumerate(rows):
        for name in ("out", "lse", "dq"):
            assert torch.equal(res[name][i], full[name][t]), (name, t)


def check_dense_vs_varlen(kernel, causal, batch, seqlen_q, seqlen_k, heads, head_dim, dtype, seed):
    """portattn.attention on [B, S, H, D] == varlen_attention on B equal-length sequences."""
    import portattn

    p = make_pack(
        [seqlen_q] * batch, [seqlen_k] * batch, heads[0], heads[1], head_dim, dtype, seed=seed
    )
    var = run_kernel(p, kernel, causal)
    qd = p.q.detach().view(batch, seqlen_q, heads[0], head_dim).requires_grad_()
    kd = p.k.detach().view(batch, seqlen_k, heads[1], head_dim).requires_grad_()
    vd = p.v.detach().view(batch, seqlen_k, heads[1], head_dim).requires_grad_()
    out, lse = portattn.attention(qd, kd, vd, causal=causal, return_lse=True, kernel=kernel)
    dlse = torch.where(
        torch.isinf(lse), 0.0, p.dlse.view(batch, seqlen_q, heads[0]).permute(0, 2, 1)
    )
    dq, dk, dv = torch.autograd.grad(
        [out, lse], (qd, kd, vd), [p.do.view(batch, seqlen_q, heads[0], head_dim), dlse]
    )
    dense = {
        "out": out.reshape(var["out"].shape),
        "lse": lse.permute(0, 2, 1).reshape(-1, heads[0]),
        "dq": dq.reshape(var["dq"].shape),
        "dk": dk.reshape(var["dk"].shape),
        "dv": dv.reshape(var["dv"].shape),
    }
    assert_bitwise_equal(var, dense)
