"""attn_implementation="portattn" / "portattn_fixed_order" in Hugging Face transformers
(portattn.integrations.transformers): tiny Llama, Qwen2 and Gemma 2 models, float16, random
weights.

- logits and every parameter gradient against sdpa under the accuracy rule (portattn-fp16 and
  sdpa-fp16 both measured against an sdpa float64 copy of the model);
- sliding windows and softcapping (Qwen2, Gemma 2) against eager attention, same rule;
- left padding: the real tokens of a padded batch get the logits of the unpadded run;
- packing (position_ids that restart, or cu_seq_lens kwargs): each sequence's attention output
  is bitwise its output alone, and so are its logits;
- generate with a KV cache equals a no-cache recomputation's argmax;
- what portattn cannot honour raises a ValueError.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    Gemma2Config,
    GptOssConfig,
    LlamaConfig,
    Qwen2Config,
)
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

import portattn.integrations.transformers as pt_hf  # noqa: E402
from portattn import accuracy  # noqa: E402
from portattn.validation import DTypeError  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: Triton's interpreter
IMPLS = ("portattn", "portattn_fixed_order")
_FORWARD = pt_hf._forward  # the attention function, also while a test records its calls
VOCAB = 96


@pytest.fixture(autouse=True, scope="module")
def _registered():
    pt_hf.register()


# Tiny models: head_dim 32 (not hidden / heads = 16, which is not a portattn head dim); a
# larger initializer range than the default, so the attention is far from uniform.
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=64,
    initializer_range=0.1,
)


def llama_config(**kw) -> LlamaConfig:
    return LlamaConfig(**{**TINY, **kw})


def qwen2_config(**kw) -> Qwen2Config:
    return Qwen2Config(**{**TINY, **kw})


CONFIGS = {"llama": llama_config, "qwen2": qwen2_config}


def make_models(cfg, impls, seed: int = 0) -> list:
    """One model per (attn_implementation, dtype), all with the same random weights. Each gets
    its own copy of the config (from_config writes the implementation into it)."""
    torch.manual_seed(seed)
    master = AutoModelForCausalLM.from_config(
        copy.deepcopy(cfg), attn_implementation="eager", dtype=torch.float64
    )
    state = master.state_dict()
    models = []
    for impl, dtype in impls:
        model = AutoModelForCausalLM.from_config(
            copy.deepcopy(cfg), attn_implementation=impl, dtype=dtype
        )
        model.load_state_dict(state)
        models.append(model.to(DEVICE).eval())
    return models


def assert_rule(name: str, got: torch.Tensor, eager: torch.Tensor, ref: torch.Tensor):
    """The accuracy rule: error against float64 at most 2x that of sdpa in the same dtype."""
    err, base = accuracy.rel_err(got, ref), accuracy.rel_err(eager, ref)
    bound = accuracy.limit(name, base)
    assert err <= bound, f"{name}: error {err:.3g} > {bound:.3g} (2 x sdpa-fp16 {base:.3g} + 1e-4)"


def assert_same_logits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Logits of one sequence from two batch shapes: bitwise on the CPU, where the attention is
    (portattn) and so are torch's linear layers; on a GPU the linear layers may pick other
    matrix-product kernels for another batch shape, so only close there."""
    if DEVICE == "cpu":
        assert torch.equal(a, b), f"{what}: not bitwise equal"
    else:
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2, msg=what)


def ids(batch: int, length: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=gen).to(DEVICE)


def test_register_and_lazy_import():
    assert pt_hf.register() == IMPLS  # idempotent
    for name in IMPLS:
        assert name in ALL_ATTENTION_FUNCTIONS.valid_keys()
        assert name in ALL_MASK_ATTENTION_FUNCTIONS  # else padding would be ignored silently
    code = "import sys, portattn, portattn.integrations; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_logits_and_grads_match_sdpa(family, impl):
    cfg = CONFIGS[family]()
    models = make_models(
        cfg, [(impl, torch.float16), ("sdpa", torch.float16), ("sdpa", torch.float64)]
    )
    assert_model_rule(models, ids(2, 20, seed=1))


def assert_model_rule(models: list, x: torch.Tensor) -> torch.Tensor:
    """Logits and every parameter gradient of ``models`` = (portattn, yardstick in its dtype,
    float64 reference) on ``x`` under the accuracy rule; returns (portattn's logits, the
    reference's)."""
    results = []
    for model in models:
        out = model(x, labels=x)
        out.loss.backward()
        results.append((out.logits, {n: p.grad for n, p in model.named_parameters()}))
    (got, got_g), (eager, eager_g), (ref, ref_g) = results
    assert_rule("out", got, eager, ref)
    assert got_g.keys() == ref_g.keys()
    for name in ref_g:
        assert_rule(name, got_g[name], eager_g[name], ref_g[name])
    return got, ref


def gemma2_config(**kw) -> Gemma2Config:
    """Two layers: one with a sliding window of 6, one global; scores capped at 4."""
    base = dict(
        query_pre_attn_scalar=32,
        sliding_window=6,
        attn_logit_softcapping=4.0,
        final_logit_softcapping=None,
    )
    return Gemma2Config(**{**TINY, **base, **kw})


def gpt_oss_config(**kw) -> GptOssConfig:
    """Two layers (sliding window of 6, then global), per-head sinks, two experts."""
    base = dict(
        num_local_experts=2,
        experts_implementation="eager",  # grouped_mm has no float64 (the reference)
        num_experts_per_tok=1,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    return GptOssConfig(**{**TINY, **base, **kw})


WINDOWED = {
    "qwen2-window": lambda: qwen2_config(
        use_sliding_window=True, sliding_window=6, max_window_layers=0
    ),
    "gemma2-window-softcap": gemma2_config,
    "gpt-oss-window-sinks": gpt_oss_config,
}

UNWINDOWED = {
    "qwen2-window": qwen2_config,
    "gemma2-window-softcap": lambda: gemma2_config(sliding_window=64, attn_logit_softcapping=None),
    "gpt-oss-window-sinks": lambda: gpt_oss_config(sliding_window=64),  # sinks stay: see below
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_sliding_window_and_softcap_match_eager(family, impl):
    """Layers with a sliding window (Qwen2, Gemma 2) and softcapped scores (Gemma 2): logits
    and every gradient against transformers' eager attention (which applies both) under the
    accuracy rule, sequences of 20 tokens against windows of 6."""
    cfg = WINDOWED[family]()
    models = make_models(
        cfg, [(impl, torch.float16), ("eager", torch.float16), ("eager", torch.float64)]
    )
    x = ids(2, 20, seed=3)
    got, ref = assert_model_rule(models, x)
    # the windows (and the cap) must matter, or this test could not fail: the same weights
    # without them give other logits
    (plain,) = make_models(UNWINDOWED[family](), [("eager", torch.float64)])
    with torch.no_grad():
        assert accuracy.rel_err(plain(x).logits, ref) > 10 * accuracy.rel_err(got, ref)


def _left_padded(lengths: list[int], seed: int):
    """A left-padded batch: ids, 2-D mask and the position_ids transformers' generate uses."""
    width = max(lengths)
    rows = [ids(1, n, seed + i)[0] for i, n in enumerate(lengths)]
    x = torch.zeros(len(lengths), width, dtype=torch.long, device=DEVICE)
    mask = torch.zeros(len(lengths), width, dtype=torch.long, device=DEVICE)
    for i, row in enumerate(rows):
        x[i, width - len(row) :] = row
        mask[i, width - len(row) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return rows, x, mask, positions


@pytest.mark.parametrize("impl", IMPLS)
def test_left_padding(impl):
    """The real tokens of a left-padded batch get the logits of each sequence run alone, within
    the accuracy rule (and bitwise: the same attention bits, see test_packed_*)."""
    got_m, eager_m, ref_m = make_models(
        llama_config(), [(impl, torch.float16), ("sdpa", torch.float16), ("sdpa", torch.float64)]
    )
    rows, x, mask, positions = _left_padded([16, 9, 12], seed=10)
    with torch.no_grad():
        padded = got_m(x, attention_mask=mask, position_ids=positions).logits
        assert not torch.isnan(padded).any()
        for i, row in enumerate(rows):
            real = padded[i, x.shape[1] - len(row) :]
            alone = got_m(row[None]).logits[0]
            eager, ref = (m(row[None]).logits[0] for m in (eager_m, ref_m))
            assert_rule(f"sequence {i}", real, eager, ref)
            assert_rule(f"sequence {i} alone", alone, eager, ref)
            assert_same_logits(real, alone, f"sequence {i}: padded vs alone")


def _record_attention(monkeypatch) -> list:
    """Record (kernel, module, q, k, v, args, kwargs, out) of every call of the attention
    function (``pt_hf._forward`` stays callable as ``_FORWARD``, unrecorded)."""
    calls = []
    forward = _FORWARD

    def spy(kernel, module, query, key, value, attention_mask, *args, **kwargs):
        out = forward(kernel, module, query, key, value, attention_mask, *args, **kwargs)
        calls.append((kernel, module, query, key, value, args, kwargs, out[0]))
        return out

    monkeypatch.setattr(pt_hf, "_forward", spy)
    return calls


@pytest.mark.parametrize("impl", IMPLS)
def test_packed_position_ids_bitwise(impl, monkeypatch):
    """Packed sequences (position_ids restarting at 0): in every layer, each sequence's rows
    of the attention output are bitwise those of the same q, k, v attended alone; the packed
    logits are bitwise the logits of each sequence run alone; and the cu_seq_lens kwargs
    (0-d tensor max_length) give the same bits as position_ids."""
    (model,) = make_models(llama_config(), [(impl, torch.float16)])
    lengths = [7, 12, 5]
    seqs = [ids(1, n, 20 + i)[0] for i, n in enumerate(lengths)]
    packed_ids = torch.cat(seqs)[None]
    positions = torch.cat([torch.arange(n, device=DEVICE) for n in lengths])[None]
    calls = _record_attention(monkeypatch)
    with torch.no_grad():
        packed = model(packed_ids, position_ids=positions).logits
    assert len(calls) == 2
    starts = [0, 7, 19, 24]
    for kernel, module, q, k, v, args, kwargs, out in calls:
        for a, b in zip(starts, starts[1:]):
            qkv = (x[:, :, a:b] for x in (q, k, v))
            alone, _ = _FORWARD(kernel, module, *qkv, None, *args, scaling=kwargs["scaling"])
            assert torch.equal(out[:, a:b], alone), f"attention rows {a}:{b} differ"
    calls.clear()
    cu = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        for a, b, seq in zip(starts, starts[1:], seqs):
            alone = model(seq[None]).logits[0]
            assert_same_logits(packed[0, a:b], alone, f"logits {a}:{b}: packed vs alone")
        by_kwargs = model(
            packed_ids,
            position_ids=positions,
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu.long(),
            max_length_q=torch.tensor(12, device=DEVICE),
            max_length_k=12,
        ).logits
    assert torch.equal(by_kwargs, packed)


@pytest.mark.parametrize("impl", IMPLS)
def test_generate_with_kv_cache(impl):
    """Greedy generate with a KV cache (decode rows: bottom-right causal, the padded path for
    a left-padded batch) equals the argmax of a no-cache recomputation of the whole text."""
    (model,) = make_models(llama_config(), [(impl, torch.float16)])
    new = 4
    for lengths in ([8], [8, 5]):
        _, x, mask, _ = _left_padded(lengths, seed=30)
        with torch.no_grad():
            out = model.generate(
                x, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0
            )
            full_mask = torch.cat([mask, torch.ones_like(mask[:, :new])], 1)
            positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(
                out, attention_mask=full_mask, position_ids=positions, use_cache=False
            ).logits
        width = x.shape[1]
        assert out.shape == (len(lengths), width + new)
        assert torch.equal(out[:, width:], logits[:, width - 1 : -1].argmax(-1))


@pytest.mark.parametrize("impl", IMPLS)
def test_generate_reads_the_kv_cache_in_place(impl, monkeypatch):
    """Greedy generate of an unpadded batch of two (an all-ones mask): every decode step runs
    the dense call with the cache's [B, H, S, D] memory folded into heads, k and v read in
    place (no copy of the cache), and the decode rows' attention output is bitwise what the
    gathered (unpadded varlen) path gives; the tokens equal a no-cache recomputation's argmax."""
    from portattn.dense_layout import dense_layout

    (model,) = make_models(llama_config(), [(impl, torch.float16)])
    x = ids(2, 8, 31)
    mask = torch.ones_like(x)
    dense_calls = []
    real_attention = pt_hf.attention

    def spy(q, k, v, **kw):
        out = real_attention(q, k, v, **kw)
        dense_calls.append((q, k, v, kw, out))
        return out

    monkeypatch.setattr(pt_hf, "attention", spy)
    new = 3
    with torch.no_grad():
        out = model.generate(x, attention_mask=mask, max_new_tokens=new, do_sample=False)
    decode = [c for c in dense_calls if c[0].shape[1] == 1]
    assert len(decode) == 2 * (new - 1)  # two layers, every step after the prefill
    for q, k, v, kw, got in decode:
        layout = dense_layout(q, k, v, None)
        assert layout.heads
        for t in (k, v):
            assert layout.packed(t).untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        batch, seqlen_k = k.shape[:2]
        steps = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE)
        gathered = pt_hf.varlen_attention(
            q.reshape(batch, *q.shape[2:]),
            *(t.reshape(batch * seqlen_k, *t.shape[2:]) for t in (k, v)),
            steps,
            steps * seqlen_k,
            1,
            seqlen_k,
            **kw,
        )
        assert torch.equal(got.reshape(gathered.shape), gathered)
    with torch.no_grad():
        logits = model(out, use_cache=False).logits
    assert torch.equal(out[:, 8:], logits[:, 7:-1].argmax(-1))


def test_unsupported_raise():
    (model,) = make_models(llama_config(attention_dropout=0.1), [("portattn", torch.float16)])
    x = ids(1, 8, seed=40)
    model.train()
    with pytest.raises(ValueError, match="attention dropout"):
        model(x)
    model.eval()
    with torch.no_grad():
        plain = model(x).logits
        # a 4-D mask that is the causal pattern is honoured (bool and additive float) ...
        causal = torch.ones(8, 8, dtype=torch.bool, device=DEVICE).tril()[None, None]
        assert torch.equal(model(x, attention_mask=causal).logits, plain)
        additive = torch.zeros_like(causal, dtype=torch.float16).masked_fill(~causal, -65504.0)
        assert torch.equal(model(x, attention_mask=additive).logits, plain)
        # ... any other 4-D mask is not
        with pytest.raises(ValueError, match="custom 4-D attention mask"):
            model(x, attention_mask=torch.ones_like(causal))
        with pytest.raises(ValueError, match="additive bias"):
            model(x, attention_mask=torch.randn_like(additive))
        with pytest.raises(ValueError, match="not both"):
            cu = torch.tensor([0, 4, 8], dtype=torch.int32, device=DEVICE)
            pad = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1]], device=DEVICE)
            model(x, attention_mask=pad, cu_seq_lens_q=cu, cu_seq_lens_k=cu)

    attn = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 8, 32, dtype=torch.float16, device=DEVICE)
    kv = torch.randn(1, 2, 8, 32, dtype=torch.float16, device=DEVICE)
    for kwargs, error, match in (
        (dict(s_aux=torch.zeros(3, device=DEVICE)), ValueError, r"sinks must be \[Hq\]"),
        (dict(sliding_window=0), ValueError, "sliding_window must be at least 1"),
        (dict(sliding_window=4.0), TypeError, "sliding_window must be an int"),
        (dict(softcap=-1.0), ValueError, "softcap must be 0"),
    ):
        with pytest.raises(error, match=match):
            pt_hf.portattn_attention_forward(attn, q, kv, kv, None, **kwargs)
    with pytest.raises(ValueError, match="value head dim"):
        pt_hf.portattn_attention_forward(attn, q, kv, kv[..., :16].contiguous(), None)

    (fp32,) = make_models(llama_config(), [("portattn", torch.float32)])
    with pytest.raises(DTypeError, match="float16 or bfloat16"), torch.no_grad():
        fp32(x)


def test_compile_fullgraph():
    """The dense path (a batch of two, no padding) and a packed batch given by cu_seq_lens
    kwargs with int max_length compile into one graph (no host reads), same bits as eager.
    (Unpadding and the position_ids packing check read host values: graph breaks.)"""
    (model,) = make_models(llama_config(), [("portattn", torch.float16)])
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=DEVICE)
    packed = dict(
        position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]], device=DEVICE),
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=7,
        max_length_k=7,
    )
    with torch.no_grad():
        for x, kwargs in ((ids(2, 12, seed=50), {}), (ids(1, 12, seed=51), packed)):
            torch._dynamo.reset()
            compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
            assert torch.equal(compiled(x, **kwargs).logits, model(x, **kwargs).logits)
    torch._dynamo.reset()
