"""The certified LM head: the greedy argmax of `F.linear(h, W)` from an INT8 copy of W, exactly.

A greedy decode needs only the argmax of the head's logits, and the head is a large part of a
decode step's weight read (Llama-3.1's 128256 × 4096 bf16 head: 1.05 GB). An int8 copy reads half
the bytes. Its approximate logits, with a rigorous bound on their error, rule out every token that
provably is not the argmax; only the few left are scored exactly.

The math. W [V, H] in the model's dtype D (bf16, fp16, fp32 or fp64); the accumulation dtype A is
fp64 for fp64 models, fp32 otherwise, with unit roundoff u (2⁻²⁴ or 2⁻⁵³) and smallest normal η.

  s_v = max_k |W_vk| / 127 (stored in fp32),  q_v = round(W_v / s_v) ∈ [−127, 127]ᴴ (int8),
  e_v = W_v − s_v q_v  (computed in fp64 with the stored s_v).

For a hidden state h [H] (dtype D) the approximate logit is ẑ_v = s_v (q_v · h), accumulated in
A. The exact head's logit is z'_v = fl_D(ỹ_v), ỹ_v the dot W_v · h accumulated in A in whatever
order the exact head uses (cuBLAS, MKL, a gathered GEMV), then rounded to D. With y_v = W_v · h
in exact arithmetic and n ≥ ||h||₂:

  |ỹ_v − y_v|              ≤ γ_H ||W_v||₂ n          (any summation order, FMA or not; Cauchy–Schwarz)
  |y_v − s_v q_v · h|      = |e_v · h| ≤ ||e_v||₂ n
  |ẑ_v − s_v q_v · h|      ≤ γ_{H+1} s_v ||q_v||₂ n  (the dot, then the product with s_v)

with γ_k = k u'/(1 − k u') and u' = 2u: twice the unit roundoff, so that accumulation that
truncates (tensor cores add their products rounding toward zero) is covered too. Underflow, flushed
to zero or gradual, adds at most η per product and per scaling, c = 2(H + 2)η in all. So

  |ỹ_v − ẑ_v| ≤ r_v = a_v n + c,   a_v = (||e_v||₂ + γ_H ||W_v||₂ + γ_{H+1} s_v ||q_v||₂)(1 + 2⁻²⁰),

a_v precomputed per row (in fp64, rounded up to fp32; the factor 1 + 2⁻²⁰ covers the fp64 norms'
own rounding), n computed per hidden state as max|h| · ||h / max|h|||₂ (no underflow for tiny h, no
overflow for huge h) times 1 + 2(H + 8)u. The bounds themselves are computed in A, so they are
widened by w_v = r_v + 3u(|ẑ_v| + r_v), which covers the rounding of r_v, of ẑ_v ± w_v and of w_v:

  ub_v = fl_D(ẑ_v + w_v) ≥ z'_v,   lb_v = fl_D(ẑ_v − w_v) ≤ z'_v,   L = max_v lb_v

(rounding to D is monotone, so bounds on ỹ_v rounded are bounds on z'_v). Token v is discarded when
ub_v < L: with w the token attaining L, z'_v ≤ ub_v < L ≤ z'_w, so z'_v is strictly below another
logit and cannot be the argmax — strict, because argmax ties go to the lowest index, so a token
whose logit could equal the largest one is kept. The comparison is after rounding to D: in bf16
many tokens share a rounded logit, and a token whose bound rounds to the same value as L may tie.

Static shapes. Instead of the data-dependent set {v : ub_v ≥ L}, the S (`candidates`, 32) tokens
with the highest ub are kept; the row is certified iff the (S+1)-th highest ub is < L (and L is
finite): then every token outside the S is discarded by the rule above (the token attaining L is
among the S). The S candidates are rescored exactly: their rows of W gathered, dotted with h in
A, rounded to D, and the largest taken, the lowest index among equal ones. A row that is not
certified takes the full exact head (the fallback). Every row's answer is exact; the certificate
decides only what it costs.

What "exactly" can mean. The certificate holds for any exact head that accumulates in A, whatever
its summation order, so the argmax of F.linear(h, W) is always among the candidates. The rescored
logits are the same dots, but summed in another order than the full head's GEMM, so in floating
point they can differ from it in the last bit, and the argmax among candidates can then differ from
F.linear's when two candidates' logits lie within that rounding of each other (in exact arithmetic
they are equal). Where the full exact head can be called (the reference, on any device), a second
check closes the gap: the rescored winner t is F.linear's too when, with ρ_v = 3γ_H Σ_k |W_vk| |h_k|
+ 2c bounding the difference between any two summation orders, fl_D(z''_v + ρ_v) < fl_D(z''_t − ρ_t)
for every other candidate v (z'' the rescored dots, widened as above); a row that fails it takes
F.linear's own argmax. So on the CPU the reference equals `F.linear(h, W).argmax(-1)` bit for bit,
in every dtype, and the property tests demand that. A CUDA graph cannot branch to cuBLAS, so the
GPU kernel (kernel.py) returns the argmax of its own rescoring (its fallback a full GEMV in the
same arithmetic): equal to cuBLAS's unless cuBLAS's rounding flips a near tie of the top logits —
in bf16, where ties are common, the project judges it by token forcing. The bound assumes cuBLAS
accumulates in fp32; `torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction` lets it
reduce split-K partial sums in bf16, which this bound does not cover (rounding those partials is a
bf16-sized error) — set it to False where the head is compared with cuBLAS.

`CertifiedHead.from_weight(W)` builds the int8 copy and the per-row factors; `head.argmax(h)` takes
h [M, H] (M ≥ 1) on W's device: the Triton kernels on CUDA for bf16 / fp16 / fp32, the torch
reference (reference.py) otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CANDIDATES = 32  # tokens rescored exactly per row


class CertifiedHeadError(ValueError):
    """A weight or hidden state the certified head cannot take."""


@dataclass(frozen=True)
class CertifiedHead:
    """An LM head W [V, H] with its int8 copy: q int8 [V, H], scale fp32 [V], radius fp32 [V]
    (a_v of the module's docstring), W kept for the exact rescoring."""

    weight: torch.Tensor
    q: torch.Tensor
    scale: torch.Tensor
    radius: torch.Tensor
    candidates: int = CANDIDATES

    @classmethod
    def from_weight(cls, weight: torch.Tensor, candidates: int = CANDIDATES) -> CertifiedHead:
        from . import reference

        if not isinstance(candidates, int) or candidates < 1:
            raise CertifiedHeadError(f"certified head: candidates must be an integer ≥ 1, got {candidates!r}")
        q, scale, radius = reference.quantize(weight)
        return cls(weight, q, scale, radius, candidates)

    def argmax(self, h: torch.Tensor) -> torch.Tensor:
        """h [M, H] (the model's dtype, W's device) → LongTensor [M]: F.linear(h, W).argmax(-1)."""
        from . import kernel, reference

        check_hidden(self, h)
        if kernel.runs(self):
            return _argmax(h.contiguous(), self.weight, self.q, self.scale, self.radius, self.candidates)
        return reference.argmax(self, h)


@torch.library.custom_op("specpilot::certified_argmax", mutates_args=())
def _argmax(h: torch.Tensor, weight: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, radius: torch.Tensor,
            candidates: int) -> torch.Tensor:
    """The GPU path as one operator: torch.compile sees its output (below) and leaves the Triton
    launches and the certificate's data-dependent choice to run as they are, so a compiled,
    graph-captured decode step keeps the head whole."""
    from . import kernel

    return kernel.argmax(CertifiedHead(weight, q, scale, radius, candidates), h)


@_argmax.register_fake
def _(h, weight, q, scale, radius, candidates):
    return h.new_empty(h.shape[0], dtype=torch.long)


def check_hidden(head: CertifiedHead, h: torch.Tensor) -> None:
    W = head.weight
    if h.dim() != 2 or h.shape[0] < 1 or h.shape[1] != W.shape[1]:
        raise CertifiedHeadError(f"certified head: hidden states must be [M ≥ 1, {W.shape[1]}], got {tuple(h.shape)}")
    if h.dtype != W.dtype or h.device != W.device:
        raise CertifiedHeadError(f"certified head: hidden states must be {W.dtype} on {W.device} like the head, "
                                 f"got {h.dtype} on {h.device}")
