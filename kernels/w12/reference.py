"""Plain-torch references of the GEMMs of gemm.py: float32 products of the exact weights, rounded to
bf16 once."""

from __future__ import annotations

import torch

from .format import W12, quick, unpack


def bf16_linear_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w [N, K]ᵀ in float32, rounded to bf16."""
    return (x.float() @ w.float().T).bfloat16()


def w12_linear_ref(x: torch.Tensor, w: W12) -> torch.Tensor:
    """x [M, K] @ unpack(w)ᵀ in float32, rounded to bf16."""
    return bf16_linear_ref(x, unpack(w))


def w12_quick_ref(x: torch.Tensor, w: W12) -> torch.Tensor:
    """x [M, K] @ quick(w)ᵀ (the views alone, low bits at their midpoint) in float32, rounded to bf16."""
    return bf16_linear_ref(x, quick(w))


def ulps(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> int:
    """The largest distance between bf16 tensors a and b (the reference) in units in the last place
    (bf16 values ordered by their bits; +0 and −0 are one value; two NaNs agree), over the entries
    where |b| ≥ floor. A floor matters on the GPU: an output that cancels to near zero carries the
    float32 sum's ordering error, which is many of its own ulps (cuBLAS shows the same)."""
    def key(t):
        i = t.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -(i & 0x7FFF), i)  # sign-magnitude → a monotone integer line
    both = torch.isnan(a) & torch.isnan(b)
    d = (key(a) - key(b)).abs().masked_fill(both, 0).masked_fill(b.float().abs() < floor, 0)
    return int(d.max()) if d.numel() else 0


def scale_floor(ref: torch.Tensor) -> float:
    """The floor `ulps` uses on the GPU: 2^-10 of the largest finite |reference| (an output above it
    has bf16 ulps far above a K ≤ 16384 float32 sum's ordering error)."""
    r = ref.float().abs()
    r = r[torch.isfinite(r)]
    return float(r.max()) / 1024 if r.numel() else 0.0
