"""The canonical golden cases: a versioned list, small enough to verify in well under a minute.

Bump :data:`CASES_VERSION` whenever a case is added, removed or changed. A case's name is its
identity in the golden files: never redefine a name, add a new one instead (a golden file stores
each case's definition, so old files still verify the cases they recorded).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

# 2: the paged decode / append cases (page_size); 3: the model-feature cases (window_left,
# window_right, softcap, sinks) and a borrowed head dim (d80); 4: v's own head dim (head_dim_v,
# MLA's (192, 128)); 5: a varlen paged append with softcap (decode == prefill bits on sm90);
# 6: paged rows past the sm90 entries' key chunk (the split decode)
CASES_VERSION = 6
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# Tensor ids of the input generator (see portattn.tools.golden.inputs).
TENSOR_IDS = {"q": 1, "k": 2, "v": 3, "do": 4, "dlse": 5, "sinks": 6}
OUTPUTS = ("out", "lse", "dq", "dk", "dv")
SINKS_OUTPUT = "dsinks"  # hashed only for cases with sinks: the others' outputs stay as recorded
# Fields added after version 2 with the value that means "off". A definition leaves out each
# one at that value, so every older case serialises (and hashes its inputs) as it did.
FEATURE_DEFAULTS: dict[str, Any] = {
    "page_size": 0,
    "window_left": -1,
    "window_right": -1,
    "softcap": 0.0,
    "sinks": False,
    "head_dim_v": 0,
}


@dataclass(frozen=True)
class Case:
    """One forward + backward run of ``portattn.varlen_attention``.

    ``lens_q`` / ``lens_k``: per-sequence query / key lengths of the pack. The backward gets
    ``dO`` and (when ``dlse``) a gradient of lse, both from the input generator.
    ``page_size`` > 0: a paged decode / append case (forward only, out and lse): the keys and
    values sit in a paged cache of that page size, pages in reverse order, unused slots NaN.
    ``window_left`` / ``window_right``: ``window_size`` (flash-attn's convention, -1 unbounded);
    ``softcap``: the scores' cap (0: none); ``sinks``: attention sinks [Hq] float32 from the
    input generator (tensor id ``TENSOR_IDS["sinks"]``, twice its values: [-4, 4)), whose
    gradient is then hashed too (``dsinks``, unless the case is paged). ``head_dim_v``: v's
    (and out's, dO's, dV's) own head dim, 0 for q's.
    """

    name: str
    kernel: str
    lens_q: tuple[int, ...]
    lens_k: tuple[int, ...]
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str  # "bf16" or "fp16"
    causal: bool
    seed: int
    dlse: bool = True
    page_size: int = 0
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    sinks: bool = False
    head_dim_v: int = 0

    def __post_init__(self) -> None:
        if len(self.lens_q) != len(self.lens_k):
            raise ValueError(f"{self.name}: lens_q and lens_k differ in length")
        if self.dtype not in DTYPES:
            raise ValueError(f"{self.name}: dtype must be one of {sorted(DTYPES)}")
        if self.heads_kv < 1:
            raise ValueError(f"{self.name}: heads_kv must be >= 1")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"{self.name}: heads_q must be a multiple of heads_kv")
        if min(self.window_left, self.window_right) < -1:
            raise ValueError(f"{self.name}: window_left / window_right must be -1 or >= 0")
        if not (math.isfinite(self.softcap) and self.softcap >= 0):
            raise ValueError(f"{self.name}: softcap must be 0 or a finite float > 0")
        if self.head_dim_v < 0:
            raise ValueError(f"{self.name}: head_dim_v must be 0 (q's) or v's head dim")

    @property
    def value_dim(self) -> int:
        """v's head dim: ``head_dim_v``, or q's."""
        return self.head_dim_v or self.head_dim

    @property
    def entry(self) -> str:
        """The configuration-table entry it runs, labelled as the compile check labels it
        (``varlen/d128/bf16``; with v's own head dim ``varlen/d192v128/bf16``)."""
        dims = f"d{self.head_dim}" + (f"v{self.head_dim_v}" if self.head_dim_v else "")
        return f"{self.kernel}/{dims}/{self.dtype}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def outputs(self) -> tuple[str, ...]:
        """The hashed outputs: all five (and ``dsinks`` with sinks), or out and lse for a
        (forward-only) paged case."""
        if self.page_size:
            return OUTPUTS[:2]
        return (*OUTPUTS, SINKS_OUTPUT) if self.sinks else OUTPUTS

    @property
    def window_size(self) -> tuple[int, int]:
        return (self.window_left, self.window_right)

    def features(self) -> dict[str, Any]:
        """``varlen_attention``'s keyword arguments for the window and the cap (the sinks are
        a tensor: see ``run.make_inputs``); none for a case without them."""
        kwargs: dict[str, Any] = {}
        if self.window_size != (-1, -1):
            kwargs["window_size"] = self.window_size
        if self.softcap:
            kwargs["softcap"] = self.softcap
        return kwargs

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("name")
        for key, off in FEATURE_DEFAULTS.items():  # later fields: older definitions as before
            if data[key] == off:
                data.pop(key)
        data["lens_q"], data["lens_k"] = list(self.lens_q), list(self.lens_k)
        return data

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> Case:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["lens_q"], kwargs["lens_k"] = tuple(data["lens_q"]), tuple(data["lens_k"])
        return cls(name=name, **kwargs)


# A prefill pack with lengths 0, 1 and lengths that are multiples of no tile size.
PACK = (0, 1, 17, 100, 333)
# Decode-style: a few queries against long key sequences (bottom-right causal).
DECODE_Q, DECODE_K = (1, 4, 1), (300, 300, 77)
# Ragged: causal rows that see no key (Sq > Sk), queries without keys, keys without queries.
RAGGED_Q, RAGGED_K = (20, 0, 50, 3), (7, 30, 50, 0)
# Plain multi-head (no GQA) with a partial last tile.
MHA = (64, 129, 5)

# (tag, lens_q, lens_k, heads_q, heads_kv, head_dim, dtype, causal, dlse)
_SHAPES = (
    ("pack-gqa", PACK, PACK, 8, 2, 128, "bf16", True, True),
    ("pack-gqa", PACK, PACK, 8, 2, 128, "bf16", False, True),
    ("pack-mqa", PACK, PACK, 4, 1, 64, "fp16", True, True),
    ("decode-gqa", DECODE_Q, DECODE_K, 8, 2, 128, "bf16", True, True),
    ("decode-mqa", DECODE_Q, DECODE_K, 4, 1, 64, "fp16", True, True),
    ("mha", MHA, MHA, 4, 4, 96, "bf16", False, True),
    ("ragged-mqa-nodlse", RAGGED_Q, RAGGED_K, 4, 1, 64, "fp16", False, False),
    ("ragged-gqa", RAGGED_Q, RAGGED_K, 8, 2, 128, "bf16", True, True),
)


# Paged decode and append (forward only): one row per sequence, or a few, against paged caches.
# (tag, lens_q, lens_k, heads_q, heads_kv, head_dim, dtype, page_size)
_PAGED = (
    ("paged-decode-gqa", (1, 1, 1, 1), (300, 1, 77, 513), 8, 2, 128, "bf16", 16),
    ("paged-append-mqa", (4, 16, 1), (300, 40, 77), 4, 1, 64, "fp16", 64),
    ("paged-decode-gqa", (1, 1, 1), (1000, 256, 3), 8, 2, 96, "bf16", 256),
)


def _canonical() -> tuple[Case, ...]:
    cases = []
    for k_index, kernel in enumerate(("varlen", "fixed_order")):
        for s_index, (tag, lq, lk, hq, hkv, d, dtype, causal, dlse) in enumerate(_SHAPES):
            mask = "causal" if causal else "full"
            name = f"{kernel}-{tag}-d{d}-{dtype}-{mask}"
            seed = 1000 + 100 * k_index + s_index
            cases.append(Case(name, kernel, lq, lk, hq, hkv, d, dtype, causal, seed, dlse))
        for p_index, (tag, lq, lk, hq, hkv, d, dtype, page) in enumerate(_PAGED):
            name = f"{kernel}-{tag}-d{d}-{dtype}-page{page}"
            seed = 2000 + 100 * k_index + p_index
            cases.append(Case(name, kernel, lq, lk, hq, hkv, d, dtype, True, seed, False, page))
    return tuple(cases)


# Version 3: one case per model feature of issue 25, each with its own seed (3000 + i), both
# kernels among them. The window (causal, 37 keys back) skips whole key tiles of the 333 rows;
# the cap (3, at the default scale) bends the scores' tails, without a mask; the sinks meet
# causal rows that see no key (Sq > Sk) and a sequence without keys (lse is the sink there, out
# 0); d80 runs the d96 row (a borrowed head dim); the paged decode / append rows take window,
# cap and sinks together, through pages of 32 in reverse order. Small enough that all five run
# in under a minute under the interpreter too (tests/test_golden_features.py).
FEATURE_PACK = (0, 1, 17, 64, 160)  # an empty and a one-token sequence, partial and full tiles
FEATURE_CASES: tuple[Case, ...] = (
    Case(
        "varlen-window37-mqa-d64-bf16-causal",
        *("varlen", PACK, PACK, 4, 1, 64, "bf16", True, 3000),
        window_left=37,
    ),
    Case(
        "fixed_order-softcap3-gqa-d64-fp16-full",
        *("fixed_order", FEATURE_PACK, FEATURE_PACK, 4, 2, 64, "fp16", False, 3001),
        softcap=3.0,
    ),
    Case(
        "varlen-sinks-ragged-gqa-d128-bf16-causal",
        *("varlen", RAGGED_Q, RAGGED_K, 8, 2, 128, "bf16", True, 3002),
        sinks=True,
    ),
    Case("fixed_order-mha-d80-bf16-causal", "fixed_order", MHA, MHA, 4, 4, 80, "bf16", True, 3003),
    Case(
        "fixed_order-paged-window-softcap-sinks-gqa-d64-fp16-page32",
        *("fixed_order", (1, 1, 1, 4), (300, 1, 77, 513), 8, 2, 64, "fp16", True, 3004),
        dlse=False,
        page_size=32,
        window_left=64,
        softcap=3.0,
        sinks=True,
    ),
    # Version 4: v's own head dim, MLA's (192, 128) (the d256 row, v's blocks 128 wide), in
    # both kernels: varlen causal with GQA, fixed_order full (its split-P rounding with Dv).
    Case(
        "varlen-mla-gqa-d192v128-bf16-causal",
        *("varlen", FEATURE_PACK, FEATURE_PACK, 4, 2, 192, "bf16", True, 3005),
        head_dim_v=128,
    ),
    Case(
        "fixed_order-mla-mha-d192v128-fp16-full",
        *("fixed_order", RAGGED_Q, RAGGED_K, 2, 2, 192, "fp16", False, 3006),
        head_dim_v=128,
    ),
    # Version 5: varlen's paged decode / append rows with a cap, d128 with GQA: the rows whose
    # lse moved by an ulp on sm90 with the tiles that took the mask (the cap was rounded before
    # the mask and contracted after it elsewhere).
    Case(
        "varlen-paged-softcap-gqa-d128-bf16-page64",
        *("varlen", (1, 4, 16, 1), (300, 40, 77, 513), 8, 2, 128, "bf16", True, 3007),
        dlse=False,
        page_size=64,
        softcap=5.0,
    ),
)

# Version 6: the split decode (design §3.1): paged decode / append rows past the sm90 d64 /
# d128 entries' key chunk (C = 16,384 keys), whose chunks then run in programs of their own and
# merge in a combine kernel; both kernels. Not among the feature cases the CPU suite runs
# under the interpreter (20,000 keys there take minutes, and its entries have no chunk).
SPLIT_CASES: tuple[Case, ...] = (
    Case(
        "varlen-paged-split-gqa-d128-bf16-page64",
        *("varlen", (1, 1), (20000, 700), 8, 2, 128, "bf16", True, 3008),
        dlse=False,
        page_size=64,
    ),
    Case(
        "fixed_order-paged-split-gqa-d64-fp16-page256",
        *("fixed_order", (1, 3), (513, 17000), 8, 2, 64, "fp16", True, 3009),
        dlse=False,
        page_size=256,
    ),
)

CASES: tuple[Case, ...] = _canonical() + FEATURE_CASES + SPLIT_CASES
