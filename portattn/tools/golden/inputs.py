"""Counter-based input generator of the golden cases: the same values on every machine.

Element ``i`` (row-major over the tensor's logical shape) of tensor ``tensor_id`` of a case with
seed ``seed`` is the ``(i + 1)``-th output of SplitMix64 started from the state

    base = mix64((mix64(seed + GAMMA) + tensor_id * GAMMA) mod 2**64)

i.e. ``x_i = mix64(base + (i + 1) * GAMMA)`` (all arithmetic mod 2**64; ``mix64`` is SplitMix64's
finaliser). The top 9 bits ``k = x_i >> 55`` give the value ``(k - 256) / 128``: uniform on the
512 multiples of 2**-7 in [-2, 2). Each has at most 8 significant bits, so it is exact in
float32, bfloat16 and float16 alike, and the dtype cast is exact.

The arithmetic uses integer torch ops only (no torch RNG, no numpy): a uint64 is held as two
int64 tensors of 32-bit limbs and products are formed from 16 x 32-bit partial products, so no
intermediate leaves [0, 2**49) and nothing depends on how a platform treats signed overflow.
Integer ops are exact everywhere, so the values can be generated on the GPU directly.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF
GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment (the golden ratio in 64 bits)
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
VALUE_BITS = 9  # 2**9 values ...
VALUE_STEP = 2.0**-7  # ... spaced 2**-7 apart, centred on zero: [-2, 2)

Limbs = tuple[torch.Tensor, torch.Tensor]  # (high 32 bits, low 32 bits), int64 each


# ----------------------------------------------------------------------------- scalar definition


def mix64(z: int) -> int:
    """SplitMix64's output function on a Python int (mod 2**64)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def stream_base(seed: int, tensor_id: int) -> int:
    """The SplitMix64 state that tensor ``tensor_id`` of seed ``seed`` starts from."""
    return mix64((mix64(seed + GAMMA) + tensor_id * GAMMA) & MASK64)


# ----------------------------------------------------------------------------- limb arithmetic


def _mul32(x: torch.Tensor, y: int | torch.Tensor) -> Limbs:
    """Full 64-bit product of 32-bit ``x`` and ``y`` as limbs (partials below 2**49)."""
    p0 = (x & 0xFFFF) * y  # < 2**48
    p1 = (x >> 16) * y  # < 2**48, weight 2**16
    t = p0 + ((p1 & 0xFFFF) << 16)  # < 2**49
    return (p1 >> 16) + (t >> 32), t & MASK32


def _mul_const(a: Limbs, c: int) -> Limbs:
    """``a * c mod 2**64`` for a constant ``c``."""
    a_hi, a_lo = a
    c_hi, c_lo = c >> 32, c & MASK32
    hi, lo = _mul32(a_lo, c_lo)
    cross = _mul32(a_lo, c_hi)[1] + _mul32(a_hi, c_lo)[1]
    return (hi + cross) & MASK32, lo


def _add_const(a: Limbs, c: int) -> Limbs:
    a_hi, a_lo = a
    lo = a_lo + (c & MASK32)
    return (a_hi + (c >> 32) + (lo >> 32)) & MASK32, lo & MASK32


def _xorshift(a: Limbs, s: int) -> Limbs:
    """``z ^ (z >> s)`` for ``0 < s < 32``."""
    a_hi, a_lo = a
    lo = ((a_lo >> s) | (a_hi << (32 - s))) & MASK32
    return a_hi ^ (a_hi >> s), a_lo ^ lo


def _mix64(a: Limbs) -> Limbs:
    a = _mul_const(_xorshift(a, 30), MIX1)
    a = _mul_const(_xorshift(a, 27), MIX2)
    return _xorshift(a, 31)


def splitmix64_words(
    seed: int, tensor_id: int, n: int, device: torch.device | str = "cpu"
) -> Limbs:
    """Raw words of elements ``0 .. n-1`` as (high, low) 32-bit limbs (int64 tensors)."""
    if not 0 <= n < 2**32:
        raise ValueError(f"n must be in [0, 2**32), got {n}")
    counter = torch.arange(1, n + 1, dtype=torch.int64, device=device)
    state = _mul_const((torch.zeros_like(counter), counter), GAMMA)
    return _mix64(_add_const(state, stream_base(seed, tensor_id)))


def generate(
    shape: tuple[int, ...],
    seed: int,
    tensor_id: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` on ``device`` with the generator's values. Integer
    arithmetic and exact conversions only, so every device gives the same values."""
    n = 1
    for size in shape:
        n *= size
    hi, _ = splitmix64_words(seed, tensor_id, n, device)
    k = (hi >> (32 - VALUE_BITS)) - 2 ** (VALUE_BITS - 1)
    values = k.to(torch.float32) * VALUE_STEP
    return values.reshape(shape).to(dtype)
