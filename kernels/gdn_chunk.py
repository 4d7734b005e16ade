"""The chunked gated delta rule as two Triton kernels, forward and backward, for training.

Reference: `engine/gdn.py` `chunked_gated_delta_rule` (same inputs, same outputs; the tests compare
outputs and gradients with it under TRITON_INTERPRET=1). One program per (batch row, head) walks
the chunks in order, keeping the state in registers. Per chunk, with G the cumulative log-decay
from the chunk's start, D_ij = e^{G_i−G_j} (j ≤ i) and h0 the state entering it:

  A = strict-lower(β_i D_ij k_iᵀk_j),  T = (I + A)⁻¹  (`_unit_lower_inverse`)
  U = T(β∘v) − T(β e^G∘k) h0
  o = (e^G∘q) h0 + lower(D∘qkᵀ) U
  h1 = e^{G_C} h0 + (e^{G_C−G}∘k)ᵀ U

The forward stores each chunk's entering state and T; the backward walks the chunks in reverse,
recomputes the chunk from them and carries the state's gradient (derivation in `_bwd`).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the engine falls back to its torch form
    triton = None


WARPS = 4  # warps per program (one program per batch row and head)


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _load_chunk(q, k, v, g, beta, row0, n, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    C: tl.constexpr):
        """Rows of chunk n of one (batch row, head): q, k [C, K]; v [C, V]; g, β [C]; in-range mask."""
        t = n * C + tl.arange(0, C)
        m = t < T
        r = row0 + t * H  # row index into the [B·T·H, D] views
        ok, ov = tl.arange(0, K), tl.arange(0, V)
        qq = tl.load(q + r[:, None] * K + ok[None, :], mask=m[:, None], other=0.0)
        kk = tl.load(k + r[:, None] * K + ok[None, :], mask=m[:, None], other=0.0)
        vv = tl.load(v + r[:, None] * V + ov[None, :], mask=m[:, None], other=0.0)
        gg = tl.load(g + r, mask=m, other=0.0)
        bb = tl.load(beta + r, mask=m, other=0.0)
        return qq, kk, vv, gg, bb, r, m

    @triton.jit
    def _unit_lower_inverse(A, C: tl.constexpr):
        """(I + A)⁻¹ for strictly lower A [C, C], C a power of two from 16 to 256. Its 16 × 16
        diagonal blocks first, by forward substitution in all blocks at once (step i solves row i
        of each block as one product); then, with X that block-diagonal inverse and N = X·A_off
        (A_off: A below the diagonal blocks, so N^(C/16) = 0),
        (I + A)⁻¹ = (I + N)⁻¹ X = (I − N)(I + N²)(I + N⁴)… X. Products in 3 × TF32 (about float32):
        the substitution's errors compound."""
        rows = tl.arange(0, C)
        same = (rows // 16)[:, None] == (rows // 16)[None, :]
        eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
        Ad = tl.where(same, A, 0.0)
        X = eye
        for i in range(16):
            sel = (rows % 16)[:, None] == i
            X = tl.where(sel, eye - tl.dot(tl.where(sel, Ad, 0.0), X, input_precision="tf32x3"), X)
        if C > 16:
            N = tl.dot(X, tl.where(same, 0.0, A), input_precision="tf32x3")
            Y = eye - N
            for j in tl.static_range(1, 4):  # the factors (I + N^(2^j)) while 2^j < C / 16
                if (16 << j) < C:
                    N = tl.dot(N, N, input_precision="tf32x3")
                    Y += tl.dot(Y, N, input_precision="tf32x3")
            X = tl.dot(Y, X, input_precision="tf32x3")
        return X

    @triton.jit
    def _program(T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr):
        """This program's (batch row · head) index, its first row in the [B·T·H, D] views, the
        value range, the chunk's row range, the state's offsets and the chunk's causal masks."""
        bh = tl.program_id(0)
        row0 = (bh // H) * T * H + bh % H
        ov, rows = tl.arange(0, V), tl.arange(0, C)
        kv = tl.arange(0, K)[:, None] * V + ov[None, :]
        return bh, row0, ov, rows, kv, rows[:, None] >= rows[None, :], rows[:, None] > rows[None, :]

    @triton.jit
    def _chunk_terms(kk, gg, bb, rows, lower, strict, C: tl.constexpr):
        """G, e^G, G at the chunk's end, D and k kᵀ of one chunk."""
        G = tl.cumsum(gg, 0)
        D = tl.where(lower, tl.exp(G[:, None] - G[None, :]), 0.0)
        S = tl.dot(kk, tl.trans(kk))
        return G, tl.exp(G), tl.sum(tl.where(rows == C - 1, G, 0.0), 0), D, S

    @triton.jit
    def _fwd(q, k, v, g, beta, h0, o, hs, ts, hT, T, NC: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
             C: tl.constexpr):
        bh, row0, ov, rows, kv, lower, strict = _program(T, H, K, V, C)
        state = tl.load(h0 + bh * K * V + kv)
        for n in range(NC):
            tl.store(hs + (bh * NC + n) * K * V + kv, state)
            qq, kk, vv, gg, bb, r, m = _load_chunk(q, k, v, g, beta, row0, n, T, H, K, V, C)
            G, eG, gl, D, S = _chunk_terms(kk, gg, bb, rows, lower, strict, C)
            Ti = _unit_lower_inverse(tl.where(strict, bb[:, None] * D * S, 0.0), C)
            tl.store(ts + (bh * NC + n) * C * C + rows[:, None] * C + rows[None, :], Ti)
            U = tl.dot(Ti, bb[:, None] * vv) - tl.dot(tl.dot(Ti, (bb * eG)[:, None] * kk), state)
            P = tl.where(lower, D * tl.dot(qq, tl.trans(kk)), 0.0)
            out = tl.dot(eG[:, None] * qq, state) + tl.dot(P, U)
            tl.store(o + r[:, None] * V + ov[None, :], out, mask=m[:, None])
            state = tl.exp(gl) * state + tl.dot(tl.trans(tl.exp(gl - G)[:, None] * kk), U)
        tl.store(hT + bh * K * V + kv, state)

    @triton.jit
    def _bwd(q, k, v, g, beta, hs, ts, do, dhT, dq, dk, dv, dg, dbeta, dh0, T, NC: tl.constexpr, H: tl.constexpr,
             K: tl.constexpr, V: tl.constexpr, C: tl.constexpr):
        """Reverse-mode through one chunk, given dO and dh1 (the gradient of the state leaving it):
        dU = Pᵀ dO + Kd dh1 (Kd = e^{G_C−G}∘k); dh0 = (e^G∘q)ᵀ dO + e^{G_C} dh1 − Wkᵀ dU;
        through P = lower(D∘qkᵀ): dq += (dP∘D) k, dk += (dP∘D)ᵀ q with dP = lower(dO Uᵀ);
        through U = Wv − Wk h0 and W = T R: dR = Tᵀ dW, dA = −strict(Tᵀ (dWv Wvᵀ + dWk Wkᵀ));
        through A = β_i D_ij k_iᵀk_j: dS = dA∘β_i D, dk += (dS + dSᵀ) k. Every e^{G_i−G_j}
        passes its gradient E_ij to dG_i (+) and dG_j (−); dg is the reverse cumulative sum of dG."""
        bh, row0, ov, rows, kv, lower, strict = _program(T, H, K, V, C)
        ok = tl.arange(0, K)
        dstate = tl.load(dhT + bh * K * V + kv)
        for i in range(NC):
            n = NC - 1 - i
            h = tl.load(hs + (bh * NC + n) * K * V + kv)
            qq, kk, vv, gg, bb, r, m = _load_chunk(q, k, v, g, beta, row0, n, T, H, K, V, C)
            dO = tl.load(do + r[:, None] * V + ov[None, :], mask=m[:, None], other=0.0)
            # the chunk again, with the forward's (I + A)⁻¹
            G, eG, gl, D, S = _chunk_terms(kk, gg, bb, rows, lower, strict, C)
            Ti = tl.load(ts + (bh * NC + n) * C * C + rows[:, None] * C + rows[None, :])
            dec = tl.exp(gl - G)
            Rv = bb[:, None] * vv
            Rk = (bb * eG)[:, None] * kk
            Wv = tl.dot(Ti, Rv)
            Wk = tl.dot(Ti, Rk)
            U = Wv - tl.dot(Wk, h)
            QK = tl.dot(qq, tl.trans(kk))
            P = tl.where(lower, D * QK, 0.0)
            Kd = dec[:, None] * kk
            # outputs and the leaving state
            dU = tl.dot(tl.trans(P), dO) + tl.dot(Kd, dstate)
            qh = tl.dot(qq, h)
            dGv = eG * tl.sum(dO * qh, 1)  # o's first term, e^{G_i} (q_i h0)
            dQ = eG[:, None] * tl.dot(dO, tl.trans(h))
            dP = tl.where(lower, tl.dot(dO, tl.trans(U)), 0.0)
            dQ += tl.dot(dP * D, kk)
            dK = tl.dot(tl.trans(dP * D), qq)
            E = dP * QK * D
            dGv += tl.sum(E, 1) - tl.sum(E, 0)
            dKd = tl.dot(U, tl.trans(dstate))  # h1's second term
            dK += dec[:, None] * dKd
            ddec = tl.sum(kk * dKd, 1) * dec
            dgl = tl.sum(ddec, 0) + tl.exp(gl) * tl.sum(tl.sum(h * dstate, 1), 0)
            dGv -= ddec
            dh = tl.dot(tl.trans(eG[:, None] * qq), dO) + tl.exp(gl) * dstate - tl.dot(tl.trans(Wk), dU)
            # U = Wv − Wk h0, W = T R
            dWk = -tl.dot(dU, tl.trans(h))
            dRv = tl.dot(tl.trans(Ti), dU)
            dRk = tl.dot(tl.trans(Ti), dWk)
            dA = tl.where(strict, -tl.dot(tl.trans(Ti), tl.dot(dU, tl.trans(Wv)) + tl.dot(dWk, tl.trans(Wk))), 0.0)
            dV = bb[:, None] * dRv
            dB = tl.sum(dRv * vv, 1) + eG * tl.sum(dRk * kk, 1)
            dK += (bb * eG)[:, None] * dRk
            dGv += bb * eG * tl.sum(dRk * kk, 1)
            # A = β_i D_ij S_ij
            dB += tl.sum(dA * D * S, 1)
            dS = dA * bb[:, None] * D
            dK += tl.dot(dS, kk) + tl.dot(tl.trans(dS), kk)
            E2 = dA * bb[:, None] * S * D
            dGv += tl.sum(E2, 1) - tl.sum(E2, 0)
            dGv += tl.where(rows == C - 1, dgl, 0.0)
            dG = tl.cumsum(dGv, 0, reverse=True)
            tl.store(dq + r[:, None] * K + ok[None, :], dQ, mask=m[:, None])
            tl.store(dk + r[:, None] * K + ok[None, :], dK, mask=m[:, None])
            tl.store(dv + r[:, None] * V + ov[None, :], dV, mask=m[:, None])
            tl.store(dg + r, dG, mask=m)
            tl.store(dbeta + r, dB, mask=m)
            dstate = dh
        tl.store(dh0 + bh * K * V + kv, dstate)


@torch.library.custom_op("specpilot::gdn_chunk_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            h0: torch.Tensor, chunk: int, warps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """→ (outputs, final state, the state entering every chunk, every chunk's (I + A)⁻¹). Float32,
    contiguous inputs."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    NC = -(-T // chunk)
    o = q.new_empty(B, T, H, V)
    hs, ts = q.new_empty(B * H, NC, K, V), q.new_empty(B * H, NC, chunk, chunk)
    hT = q.new_empty(B, H, K, V)
    _fwd[(B * H,)](q, k, v, g, beta, h0, o, hs, ts, hT, T, NC=NC, H=H, K=K, V=V, C=chunk, num_warps=warps)
    return o, hT, hs, ts


@_fwd_op.register_fake
def _(q, k, v, g, beta, h0, chunk, warps):
    B, T, H, K = k.shape
    V, NC = v.shape[-1], -(-T // chunk)
    return (q.new_empty(B, T, H, V), q.new_empty(B, H, K, V), q.new_empty(B * H, NC, K, V),
            q.new_empty(B * H, NC, chunk, chunk))


@torch.library.custom_op("specpilot::gdn_chunk_bwd", mutates_args=())
def _bwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            hs: torch.Tensor, ts: torch.Tensor, do: torch.Tensor, dhT: torch.Tensor, chunk: int, warps: int) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, H, K = k.shape
    V = v.shape[-1]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dg, dbeta, dh0 = torch.empty_like(g), torch.empty_like(beta), torch.empty_like(dhT)
    _bwd[(B * H,)](q, k, v, g, beta, hs, ts, do, dhT, dq, dk, dv, dg, dbeta, dh0, T, NC=hs.shape[1],
                   H=H, K=K, V=V, C=chunk, num_warps=warps, num_stages=1)  # no load pipelining: shared memory
    return dq, dk, dv, dg, dbeta, dh0


@_bwd_op.register_fake
def _(q, k, v, g, beta, hs, ts, do, dhT, chunk, warps):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(g),
            torch.empty_like(beta), torch.empty_like(dhT))


def _setup(ctx, inputs, output):
    q, k, v, g, beta, _, chunk, warps = inputs
    ctx.save_for_backward(q, k, v, g, beta, output[2], output[3])
    ctx.chunk, ctx.warps = chunk, warps


def _backward(ctx, do, dhT, _dhs, _dts):
    q, k, v, g, beta, hs, ts = ctx.saved_tensors
    B, T, H, K = k.shape
    do = q.new_zeros(B, T, H, v.shape[-1]) if do is None else do.contiguous()
    dhT = q.new_zeros(B, H, K, v.shape[-1]) if dhT is None else dhT.contiguous()
    return (*_bwd_op(q, k, v, g, beta, hs, ts, do, dhT, ctx.chunk, ctx.warps), None, None)


_fwd_op.register_autograd(_backward, setup_context=_setup)


def chunked_gated_delta_rule(q, k, v, g, beta, h, chunk: int = 64, warps: int = WARPS):
    """q, k: [B, T, H, K]; v: [B, T, H, V]; g, beta: [B, T, H]; h: [B, H, K, V] → (outputs
    [B, T, H, V], final state), in float32, differentiable in every input. A custom op: compiled
    graphs call the kernels as they are."""
    if triton is None:
        raise RuntimeError("the fused delta rule needs Triton (pip install triton)")
    sizes = {"key head size": k.shape[-1], "value head size": v.shape[-1], "chunk": chunk}
    bad = {name: n for name, n in sizes.items() if n < 16 or n & (n - 1) or n > 256}
    if bad:
        raise ValueError(f"the fused delta rule needs powers of two from 16 to 256; got {bad}: use the torch form")
    o, hT, _, _ = _fwd_op(*(t.float().contiguous() for t in (q, k, v, g, beta, h)), chunk, warps)
    return o, hT
