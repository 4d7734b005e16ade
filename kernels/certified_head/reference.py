"""The certified head in plain torch (any device): the int8 copy, the bounds, the candidate set, the
exact rescoring and the argmax, as the package's docstring derives them. The Triton kernels
(kernel.py) compute the same ẑ, bounds and candidates and are tested against these functions."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import CertifiedHeadError

ROWS = 8192  # rows of W turned into int8 at a time (the fp64 work copy of a chunk)
INFLATE = 1 + 2.0 ** -20  # covers the fp64 norms' own rounding in the radius factors
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def accumulation(dtype: torch.dtype) -> torch.dtype:
    """The dtype the head's dots accumulate in: fp64 for fp64 models, fp32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def constants(dtype: torch.dtype, H: int) -> tuple[float, float, float, float]:
    """(u, γ_H, γ_{H+1}, c) of the accumulation dtype of a `dtype` model with H inputs: unit
    roundoff, the accumulation-error factors with u' = 2u, and the absolute underflow term."""
    fi = torch.finfo(accumulation(dtype))
    u = fi.eps / 2
    gamma = lambda k: k * 2 * u / (1 - k * 2 * u)  # noqa: E731
    return u, gamma(H), gamma(H + 1), 2 * (H + 2) * fi.tiny


def _round_up_fp32(a: torch.Tensor) -> torch.Tensor:
    """fp64 values → the smallest fp32 values ≥ them."""
    f = a.float()
    return torch.where(f.double() < a, torch.nextafter(f, torch.full_like(f, float("inf"))), f)


def quantize(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W [V, H] → (q int8 [V, H], scale fp32 [V], radius fp32 [V]) on W's device."""
    if not isinstance(W, torch.Tensor) or W.dim() != 2 or W.numel() == 0:
        raise CertifiedHeadError(f"certified head: the weight must be a non-empty [V, H] matrix, "
                                 f"got {tuple(W.shape) if isinstance(W, torch.Tensor) else type(W).__name__}")
    if W.dtype not in DTYPES:
        raise CertifiedHeadError(f"certified head: the weight's dtype must be one of bf16, fp16, fp32, fp64, got {W.dtype}")
    if 2 * 2 * constants(W.dtype, W.shape[1])[0] * (W.shape[1] + 1) >= 1:
        raise CertifiedHeadError(f"certified head: H = {W.shape[1]} inputs are too many for {W.dtype}'s accumulation bound")
    _, g1, g2, _ = constants(W.dtype, W.shape[1])
    qs, scales, radii = [], [], []
    for chunk in W.split(ROWS):
        w = chunk.double()
        if not torch.isfinite(w).all():
            raise CertifiedHeadError("certified head: the weight has non-finite entries (inf or nan)")
        s = (w.abs().amax(1) / 127).float()
        sd = s.double()[:, None]
        q = torch.where(sd > 0, w / sd.clamp_min(torch.finfo(torch.float64).tiny), 0).round().clamp(-127, 127)
        e = w - sd * q
        a = (e.norm(dim=1) + g1 * w.norm(dim=1) + g2 * sd[:, 0] * q.norm(dim=1)) * INFLATE
        qs.append(q.to(torch.int8))
        scales.append(s)
        radii.append(_round_up_fp32(a))
    return torch.cat(qs), torch.cat(scales), torch.cat(radii)


def hidden_norm(h: torch.Tensor) -> torch.Tensor:
    """h [M, H] → n [M] ≥ ||h_m||₂ in the accumulation dtype: max|h| · ||h / max|h|||₂, inflated by
    1 + 2(H + 8)u (0 for h = 0; inf or nan for a non-finite h)."""
    A = accumulation(h.dtype)
    u = torch.finfo(A).eps / 2
    x = h.to(A)
    m = x.abs().amax(1, keepdim=True)
    t = torch.where(m > 0, x / torch.where(m > 0, m, 1), 0)
    return (m[:, 0] * t.square().sum(1).sqrt()) * (1 + 2 * (h.shape[1] + 8) * u)


def _widen(z: torch.Tensor, r: torch.Tensor, u: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(fl_D(z + w), fl_D(z − w)) with w = r + 3u(|z| + r), held in z's dtype; nan → (+inf, −inf)."""
    w = r + 3 * u * (z.abs() + r)
    hi, lo = (z + w).to(dtype).to(z.dtype), (z - w).to(dtype).to(z.dtype)
    return hi.nan_to_num(nan=float("inf")), lo.nan_to_num(nan=float("-inf"))


def bounds(head, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ẑ, ub, lb), each [M, V] in the accumulation dtype; ub and lb rounded to the model's dtype."""
    D, A = head.weight.dtype, accumulation(head.weight.dtype)
    u, _, _, c = constants(D, head.weight.shape[1])
    zhat = (h.to(A) @ head.q.to(A).T) * head.scale.to(A)
    r = hidden_norm(h)[:, None] * head.radius.to(A) + c
    ub, lb = _widen(zhat, r, u, D)
    return zhat, ub, lb


@dataclass(frozen=True)
class Certificate:
    """Per row of h: the S candidates (highest ub first), whether they certainly hold the argmax,
    L and the (S+1)-th highest ub (−inf when S covers the vocabulary)."""

    candidates: torch.Tensor  # long [M, S]
    certified: torch.Tensor  # bool [M]
    L: torch.Tensor  # [M]
    next_ub: torch.Tensor  # [M]


def certify(ub: torch.Tensor, lb: torch.Tensor, S: int) -> Certificate:
    """The candidate set of `bounds` output: the S highest ub of each row; certified iff the
    (S+1)-th highest ub is < L = max lb and L is finite."""
    M, V = ub.shape
    L = lb.amax(1)
    if S >= V:
        cand = torch.arange(V, device=ub.device).expand(M, V)
        nxt = torch.full_like(L, float("-inf"))
    else:
        vals, idx = ub.topk(S + 1, dim=1)
        cand, nxt = idx[:, :S], vals[:, S]
    return Certificate(cand, (nxt < L) & torch.isfinite(L), L, nxt)


def rescore(head, h: torch.Tensor, cand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidates' logits as the exact head computes them — rows of W gathered, dotted with h in
    the accumulation dtype — → (unrounded dots [M, S], and ρ [M, S] bounding how far any other
    summation order's dots lie from them)."""
    D, A = head.weight.dtype, accumulation(head.weight.dtype)
    M, S = cand.shape
    _, g1, _, c = constants(D, head.weight.shape[1])
    rows = head.weight.index_select(0, cand.reshape(-1)).view(M, S, -1).to(A)
    x = h.to(A)
    dots = torch.einsum("msk,mk->ms", rows, x)
    return dots, 3 * g1 * torch.einsum("msk,mk->ms", rows.abs(), x.abs()) + 2 * c


def winner(logits: torch.Tensor, cand: torch.Tensor, V: int) -> torch.Tensor:
    """The candidate with the largest logit, the lowest token index among equal ones → long [M]."""
    best = logits.amax(1, keepdim=True)
    return torch.where(logits == best, cand, V).amin(1)


def argmax(head, h: torch.Tensor) -> torch.Tensor:
    """F.linear(h, W).argmax(-1), bit for bit: certified rows from their rescored candidates where
    the winner's margin exceeds ρ, every other row from the full exact head."""
    W, D = head.weight, head.weight.dtype
    _, ub, lb = bounds(head, h)
    cert = certify(ub, lb, head.candidates)
    dots, rho = rescore(head, h, cert.candidates)
    u = constants(D, W.shape[1])[0]
    logits = dots.to(D).to(dots.dtype)
    best = winner(logits, cert.candidates, W.shape[0])
    hi, lo = _widen(dots, rho, u, D)
    is_best = cert.candidates == best[:, None]
    order_ok = torch.where(is_best, float("-inf"), hi).amax(1) < torch.where(is_best, lo, float("inf")).amin(1)
    ok = cert.certified & order_ok
    if bool(ok.all()):
        return best
    return torch.where(ok, best, F.linear(h, W).argmax(-1))
