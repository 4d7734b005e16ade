"""The certified head's GPU path in Triton, graph-safe (static shapes, no host sync): the same
ẑ, bounds and candidates as reference.py, then the exact rescoring of the candidates and, for rows
that are not certified, the full exact head.

  `_norm`     n_m ≥ ||h_m||₂ (one program per row)
  `_approx`   the int8 GEMM: ẑ = s (q · h) accumulated in fp32, ub and lb rounded to the model's
              dtype; ub [M, V] stored, and per program the max of its lb (L is the max of those)
  torch       topk of ub (S + 1 per row), L, the certified flags
  `_exact`    the full exact head for rows that are not certified, by blocks of V: each block's
              largest logit and its lowest index (programs of certified rows return at once)
  `_rescore`  one program per row: the S candidates' rows of W dotted with h in fp32, rounded to
              the model's dtype, the largest taken (lowest index among equal ones); a row that is not
              certified takes the `_exact` blocks' winner instead

Dot operands are the model's dtype (an int8 weight is exact in bf16 / fp16), fp32 accumulation;
fp32 models use IEEE fp32 dots (TF32 would break the bound). In Triton's interpreter (on the CPU)
the dots take fp32 operands: its bf16 dot is wrong.
"""

from __future__ import annotations

import os

import torch

from .reference import accumulation, constants

try:
    import triton
    import triton.language as tl
except ImportError:  # the head falls back to the torch reference
    triton = None

BV, BK = 128, 128  # tokens and inputs per `_approx` tile
EXACT_BV = 32  # tokens per `_exact` program
WARPS, STAGES = 4, 4
LAUNCHED = ("_norm", "_approx", "_exact", "_rescore")


def available() -> bool:
    return triton is not None


def runs(head) -> bool:
    """Whether head.argmax takes this path: CUDA, Triton, a bf16 / fp16 / fp32 head."""
    return available() and head.weight.is_cuda and head.weight.dtype != torch.float64


if triton is not None:

    @triton.jit
    def _norm(h, n, K: tl.constexpr, INFL: tl.constexpr, BK: tl.constexpr):
        """n_m = max|h| · ||h / max|h|||₂ · INFL (0 for h = 0)."""
        m = tl.program_id(0)
        k = tl.arange(0, BK)
        mx = tl.zeros((BK,), tl.float32)
        for k0 in range(0, K, BK):
            mx = tl.maximum(mx, tl.abs(tl.load(h + m * K + k0 + k, mask=k0 + k < K, other=0.0).to(tl.float32)))
        top = tl.max(mx, 0)
        div = tl.where(top > 0, top, 1.0)
        ss = tl.zeros((BK,), tl.float32)
        for k0 in range(0, K, BK):
            t = tl.load(h + m * K + k0 + k, mask=k0 + k < K, other=0.0).to(tl.float32) / div
            ss += t * t
        tl.store(n + m, top * tl.sqrt(tl.sum(ss, 0)) * INFL)

    @triton.jit
    def _approx(h, q, scale, radius, n, ub, lbmax, zhat, M, V, K: tl.constexpr, U: tl.constexpr, C: tl.constexpr,
                DOT: tl.constexpr, OUT: tl.constexpr, STORE_Z: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr,
                BK: tl.constexpr):
        pv, pm = tl.program_id(0), tl.program_id(1)
        v = pv * BV + tl.arange(0, BV)
        r = pm * BM + tl.arange(0, BM)
        k = tl.arange(0, BK)
        vm, rm = v < V, r < M
        acc = tl.zeros((BM, BV), tl.float32)
        for k0 in range(0, K, BK):
            km = k0 + k < K
            x = tl.load(h + r[:, None] * K + k0 + k[None, :], mask=rm[:, None] & km[None, :], other=0.0)
            w = tl.load(q + v[:, None] * K + k0 + k[None, :], mask=vm[:, None] & km[None, :], other=0)
            acc = tl.dot(x.to(DOT), tl.trans(w.to(DOT)), acc, input_precision="ieee")
        z = acc * tl.load(scale + v, mask=vm, other=0.0)[None, :]
        rad = tl.load(n + r, mask=rm, other=0.0)[:, None] * tl.load(radius + v, mask=vm, other=0.0)[None, :] + C
        wid = rad + 3 * U * (tl.abs(z) + rad)
        hi = (z + wid).to(OUT).to(tl.float32)
        lo = (z - wid).to(OUT).to(tl.float32)
        hi = tl.where(hi != hi, float("inf"), hi)
        lo = tl.where(lo != lo, float("-inf"), lo)
        ok = rm[:, None] & vm[None, :]
        tl.store(ub + r[:, None] * V + v[None, :], hi, mask=ok)
        if STORE_Z:
            tl.store(zhat + r[:, None] * V + v[None, :], z, mask=ok)
        tl.store(lbmax + r * tl.num_programs(0) + pv, tl.max(tl.where(ok, lo, float("-inf")), 1), mask=rm)

    @triton.jit
    def _exact_logits(W, h, m, rows, rm, K: tl.constexpr, OUT: tl.constexpr, R: tl.constexpr, BK: tl.constexpr):
        """Exact logits of hidden row m at the R head rows `rows` (masked by rm; masked ones are -inf): fp32
        sums over K in BK steps, rounded to the output dtype as the dense head rounds them."""
        k = tl.arange(0, BK)
        acc = tl.zeros((R,), tl.float32)
        for k0 in range(0, K, BK):
            km = k0 + k < K
            w = tl.load(W + rows[:, None] * K + k0 + k[None, :], mask=rm[:, None] & km[None, :], other=0.0)
            x = tl.load(h + m * K + k0 + k, mask=km, other=0.0)
            acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
        return tl.where(rm, acc.to(OUT).to(tl.float32), float("-inf"))

    @triton.jit
    def _exact(W, h, cert, pmax, pidx, V, K: tl.constexpr, OUT: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr):
        pv, m = tl.program_id(0), tl.program_id(1)
        if tl.load(cert + m) != 0:
            return
        v = pv * BV + tl.arange(0, BV)
        vm = v < V
        logit = _exact_logits(W, h, m, v, vm, K, OUT, BV, BK)
        best = tl.max(logit, 0)
        tl.store(pmax + m * tl.num_programs(0) + pv, best)
        tl.store(pidx + m * tl.num_programs(0) + pv, tl.min(tl.where(vm & (logit == best), v, V), 0))

    @triton.jit
    def _rescore(W, h, cand, cert, pmax, pidx, out, V, K: tl.constexpr, S, NB, OUT: tl.constexpr, SP: tl.constexpr,
                 BK: tl.constexpr, NBP: tl.constexpr):
        m = tl.program_id(0)
        s = tl.arange(0, SP)
        sm = s < S
        c = tl.load(cand + m * S + s, mask=sm, other=0)
        logit = _exact_logits(W, h, m, c, sm, K, OUT, SP, BK)
        best = tl.max(logit, 0)
        win = tl.min(tl.where(sm & (logit == best), c, V), 0)
        b = tl.arange(0, NBP)
        bm = b < NB
        fmax = tl.load(pmax + m * NB + b, mask=bm, other=float("-inf"))
        fbest = tl.max(fmax, 0)
        fwin = tl.min(tl.where(bm & (fmax == fbest), tl.load(pidx + m * NB + b, mask=bm, other=V), V), 0)
        tl.store(out + m, tl.where(tl.load(cert + m) != 0, win, fwin).to(tl.int64))


_TL = {}


def _tl(dtype: torch.dtype):
    if not _TL:
        _TL.update({torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32})
    return _TL[dtype]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def bounds(head, h: torch.Tensor, store_z: bool = False):
    """(ẑ or None, ub [M, V] fp32, lb's max per `_approx` program [M, V/BV] fp32, n [M]) of h [M, H]."""
    W = head.weight
    M, K = h.shape
    V = W.shape[0]
    D = W.dtype
    u, _, _, c = constants(D, K)
    h = h.contiguous()
    n = torch.empty(M, device=h.device, dtype=torch.float32)
    _norm[(M,)](h, n, K=K, INFL=1 + 2 * (K + 8) * u, BK=BK, num_warps=WARPS)
    BM = 16 if M <= 16 else 32 if M <= 32 else 64
    nbv = triton.cdiv(V, BV)
    ub = torch.empty(M, V, device=h.device, dtype=torch.float32)
    lbmax = torch.empty(M, nbv, device=h.device, dtype=torch.float32)
    zhat = torch.empty(M, V, device=h.device, dtype=torch.float32) if store_z else ub
    dot = tl.float32 if _interpreting() or D == torch.float32 else _tl(D)
    _approx[(nbv, triton.cdiv(M, BM))](h, head.q, head.scale, head.radius, n, ub, lbmax, zhat, M, V, K=K, U=u, C=c,
                                        DOT=dot, OUT=_tl(D), STORE_Z=store_z, BM=BM, BV=BV, BK=BK, num_warps=WARPS,
                                        num_stages=STAGES)
    return (zhat if store_z else None), ub, lbmax, n


def argmax(head, h: torch.Tensor) -> torch.Tensor:
    """head.argmax on the GPU path: h [M, H] → long [M]."""
    from .reference import certify

    W = head.weight
    M, K = h.shape
    V = W.shape[0]
    if accumulation(W.dtype) != torch.float32:
        raise ValueError(f"the certified head's kernels take bf16 / fp16 / fp32 heads, got {W.dtype}")
    h = h.contiguous()
    _, ub, lbmax, _ = bounds(head, h)
    cert = certify(ub, lbmax, head.candidates)
    S = cert.candidates.shape[1]
    cand = cert.candidates.contiguous()
    flags = cert.certified.contiguous()
    nb = triton.cdiv(V, EXACT_BV)
    pmax = torch.empty(M, nb, device=h.device, dtype=torch.float32)
    pidx = torch.empty(M, nb, device=h.device, dtype=torch.int32)
    _exact[(nb, M)](W, h, flags, pmax, pidx, V, K=K, OUT=_tl(W.dtype), BV=EXACT_BV, BK=BK, num_warps=WARPS)
    out = torch.empty(M, device=h.device, dtype=torch.long)
    _rescore[(M,)](W, h, cand, flags, pmax, pidx, out, V, K=K, S=S, NB=nb, OUT=_tl(W.dtype),
                   SP=triton.next_power_of_2(S), BK=BK, NBP=triton.next_power_of_2(nb), num_warps=WARPS)
    return out


def resources(workdir, H: int = 4096, dtype: torch.dtype = torch.bfloat16, V: int = 128256) -> dict:
    """{(kernel, BM or None): registers, local (spill) bytes, shared bytes} of the kernels as a
    [V, H] `dtype` head launches them, compiled for sm_90 (kernels/aot.py; no GPU needed)."""
    from pathlib import Path

    from .. import aot

    D, u, c = _tl(dtype), *constants(dtype, H)[::3]
    ptr = "*" + {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    dot = tl.float32 if dtype == torch.float32 else D
    out, wd = {}, Path(workdir)
    for BM in (16, 32, 64):
        fn = aot.compile_kernel(_approx, dict(K=H, U=u, C=c, DOT=dot, OUT=D, STORE_Z=False, BM=BM, BV=BV, BK=BK),
                                warps=WARPS, stages=STAGES, ints=("M", "V"), types=dict(h=ptr, q="*i8"))
        out[("_approx", BM)] = aot.resources(fn, wd)
    out[("_norm", None)] = aot.resources(aot.compile_kernel(_norm, dict(K=H, INFL=1.0, BK=BK), warps=WARPS,
                                                            types=dict(h=ptr)), wd)
    out[("_exact", None)] = aot.resources(aot.compile_kernel(
        _exact, dict(K=H, OUT=D, BV=EXACT_BV, BK=BK), warps=WARPS, ints=("V",),
        types=dict(W=ptr, h=ptr, cert="*i1", pidx="*i32")), wd)
    nbp = triton.next_power_of_2(triton.cdiv(V, EXACT_BV))
    out[("_rescore", None)] = aot.resources(aot.compile_kernel(
        _rescore, dict(K=H, OUT=D, SP=32, BK=BK, NBP=nbp), warps=WARPS, ints=("V", "S", "NB"),
        types=dict(W=ptr, h=ptr, cand="*i64", cert="*i1", pidx="*i32", out="*i64")), wd)
    return out
