"""The chunked gated delta rule as Triton kernels, forward and backward, for training.

Reference: `engine/gdn.py` `chunked_gated_delta_rule` (same inputs, same outputs; the tests compare
outputs and gradients with it under TRITON_INTERPRET=1). Per chunk, with G the cumulative log-decay
from the chunk's start, D_ij = e^{G_i−G_j} (j ≤ i) and h0 the state entering it:

  A = strict-lower(β_i D_ij k_iᵀk_j),  T = (I + A)⁻¹  (`_unit_lower_inverse`)
  Wv = T(β∘v),  Wk = T(β e^G∘k),  U = Wv − Wk h0
  o = (e^G∘q) h0 + lower(D∘qkᵀ) U
  h1 = e^{G_C} h0 + (e^{G_C−G}∘k)ᵀ U

Only the state is sequential. So the terms that do not depend on it are made for every chunk at
once (one program per batch row, head and chunk), a walk over the chunks carries the state (one
program per batch row and head, two products a chunk), and what needs the state is again made for
every chunk at once:

  forward:  `_fwd_prep` T, Wv, Wk → `_fwd_walk` the state entering each chunk → `_fwd_out` o
  backward: `_bwd_prep` Pᵀ dO, (e^G∘q)ᵀ dO → `_bwd_walk` dU and the gradient of the state leaving
            each chunk → `_bwd_dqk` dq and parts of dk, dg → `_bwd_dwy` the rest, dv, dβ

The forward keeps every chunk's entering state, T, Wv and Wk for the backward. Tiles are read
through block pointers (no per-element address tiles in registers).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the engine falls back to its torch form
    triton = None


WARPS = 4  # warps per program
MAX_SIZE = 64  # largest head size and chunk: at 64 / 64 / 64 the kernels fit sm_90's shared memory (tested)
LAUNCHED = ("_fwd_prep", "_fwd_walk", "_fwd_out", "_bwd_prep", "_bwd_walk", "_bwd_dqk", "_bwd_dwy")  # in order


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _tile(x, row0, n, T, H: tl.constexpr, D: tl.constexpr, C: tl.constexpr):
        """Rows of chunk n of one (batch row, head) of a [B·T·H, D] view: the [C, D] tile (zero past
        T), its row indices and in-range mask."""
        t = n * C + tl.arange(0, C)
        m = t < T
        r = row0 + t * H
        blk = tl.make_block_ptr(x + row0 * D, (T, D), (H * D, 1), (n * C, 0), (C, D), (1, 0))
        return tl.load(blk, boundary_check=(0,), padding_option="zero"), r, m

    @triton.jit
    def _vec(x, row0, n, T, H: tl.constexpr, C: tl.constexpr):
        """Chunk n of one (batch row, head) of a [B·T·H] view (g or β): [C], zero past T."""
        t = n * C + tl.arange(0, C)
        return tl.load(x + row0 + t * H, mask=t < T, other=0.0)

    @triton.jit
    def _at(x, bh, n, NC, R: tl.constexpr, D: tl.constexpr):
        """The [R, D] block of chunk n of a [B·H, NC, R, D] buffer, as a block pointer."""
        return tl.make_block_ptr(x + (bh * NC + n) * R * D, (R, D), (D, 1), (0, 0), (R, D), (1, 0))

    @triton.jit
    def _state(x, bh, K: tl.constexpr, V: tl.constexpr):
        """Offsets of one (batch row, head)'s state in a [B·H, K, V] buffer. (Plain offsets: a walk's
        state read through a block pointer took a layout that spilled registers on sm_90.)"""
        return x + bh * K * V + tl.arange(0, K)[:, None] * V + tl.arange(0, V)[None, :]

    @triton.jit
    def _cumulative(gg, C: tl.constexpr):
        """G, the cumulative log-decay from the chunk's start, and G_C, its value at the chunk's end."""
        G = tl.cumsum(gg, 0)
        return G, tl.sum(tl.where(tl.arange(0, C) == C - 1, G, 0.0), 0)

    @triton.jit
    def _decays(gg, C: tl.constexpr):
        """G, e^G, G_C, D (lower) and the causal masks (lower, strictly lower)."""
        rows = tl.arange(0, C)
        lower, strict = rows[:, None] >= rows[None, :], rows[:, None] > rows[None, :]
        G, gl = _cumulative(gg, C)
        return G, tl.exp(G), gl, tl.where(lower, tl.exp(G[:, None] - G[None, :]), 0.0), lower, strict

    @triton.jit
    def _intra(qq, kk, D, lower):
        """P = lower(D∘qkᵀ): how a chunk's rows read the chunk's own U."""
        return tl.where(lower, D * tl.dot(qq, tl.trans(kk)), 0.0)

    @triton.jit
    def _ids(T, H: tl.constexpr):
        """This program's (batch row · head) index, its first row in the [B·T·H, D] views, its chunk (0 in a walk)."""
        bh = tl.program_id(0)
        return bh, (bh // H) * T * H + bh % H, tl.program_id(1)

    @triton.jit
    def _unit_lower_inverse(A, out, C: tl.constexpr):
        """(I + A)⁻¹ for strictly lower A [C, C] (C a power of two, 16 or more), written to `out`
        (this chunk's [C, C] block, which it also works in) and returned. By 16 × 16 blocks, all
        products in plain float32: first each diagonal block's inverse X_bb, by forward substitution
        in all of them at once (step i makes row i of each block from the rows above it); then the
        blocks below the diagonal, block row by block row, X_bc = −X_bb Σ_{c ≤ j < b} A_bj X_jc, each
        over A_bc in `out` (what is still to be read of A lies to its right)."""
        NB: tl.constexpr = C // 16
        rows = tl.arange(0, C)
        same = (rows // 16)[:, None] == (rows // 16)[None, :]
        # the diagonal blocks, [NB, 16, 16]: entry (b, i, j) is A[16b + i, 16b + j]
        Ad = tl.reshape(tl.sum(tl.reshape(tl.where(same, A, 0.0), (C, NB, 16)), 1), (NB, 16, 16))
        i16 = tl.arange(0, 16)
        ri = i16[None, :, None]  # a row's index inside its block
        Xd = tl.where(ri == i16[None, None, :], 1.0, 0.0) + tl.zeros((NB, 16, 16), tl.float32)
        for i in range(1, 16):
            a = tl.sum(tl.where(ri == i, Ad, 0.0), 1)  # [NB, 16]: row i of each block (zero from column i on)
            Xd = tl.where(ri == i, Xd - tl.sum(a[:, :, None] * Xd, 1)[:, None, :], Xd)  # e_i − Σ_j a_ij X_j
        # back to [C, C]: row r of the stacked [C, 16] inverse, repeated along the row, kept in r's block
        Xs = tl.reshape(Xd, (C, 16))
        X = tl.where(same, tl.reshape(tl.broadcast_to(Xs[:, None, :], (C, NB, 16)), (C, C)), 0.0)
        at = out + rows[:, None] * C + rows[None, :]
        tl.store(at, tl.where(same, X, A))
        if NB > 1:
            tl.debug_barrier()
            blk = i16[:, None] * C + i16[None, :]  # a 16 × 16 block's offsets from its top left corner
            for b in range(1, NB):
                Xbb = tl.load(out + (b * 16) * (C + 1) + blk)
                for c in range(0, b):
                    acc = tl.zeros((16, 16), tl.float32)
                    for j in range(c, b):
                        acc += tl.dot(tl.load(out + (b * 16) * C + j * 16 + blk),
                                      tl.load(out + (j * 16) * C + c * 16 + blk), input_precision="ieee")
                    Xbc = -tl.dot(Xbb, acc, input_precision="ieee")
                    tl.debug_barrier()  # every thread has read A_bc
                    tl.store(out + (b * 16) * C + c * 16 + blk, Xbc)
                    tl.debug_barrier()  # and sees X_bc
            X = tl.load(at)
        return X

    @triton.jit
    def _fwd_prep(k, v, g, beta, ts, wv, wk, T, NC: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  C: tl.constexpr):
        bh, row0, n = _ids(T, H)
        kk, _, _ = _tile(k, row0, n, T, H, K, C)
        vv, _, _ = _tile(v, row0, n, T, H, V, C)
        gg, bb = _vec(g, row0, n, T, H, C), _vec(beta, row0, n, T, H, C)
        G, eG, gl, D, lower, strict = _decays(gg, C)
        Ti = _unit_lower_inverse(tl.where(strict, bb[:, None] * D * tl.dot(kk, tl.trans(kk)), 0.0),
                                 ts + (bh * NC + n) * C * C, C)
        tl.store(_at(wv, bh, n, NC, C, V), tl.dot(Ti, bb[:, None] * vv))
        tl.store(_at(wk, bh, n, NC, C, K), tl.dot(Ti, (bb * eG)[:, None] * kk))

    @triton.jit
    def _fwd_walk(k, g, h0, wv, wk, hs, hT, T, NC: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  C: tl.constexpr):
        bh, row0, _ = _ids(T, H)
        state = tl.load(_state(h0, bh, K, V))
        for n in range(NC):
            tl.store(_at(hs, bh, n, NC, K, V), state)
            kk = _tile(k, row0, n, T, H, K, C)[0]
            G, gl = _cumulative(_vec(g, row0, n, T, H, C), C)
            U = tl.load(_at(wv, bh, n, NC, C, V)) - tl.dot(tl.load(_at(wk, bh, n, NC, C, K)), state)
            state = tl.exp(gl) * state + tl.dot(tl.trans(tl.exp(gl - G)[:, None] * kk), U)
        tl.store(_state(hT, bh, K, V), state)

    @triton.jit
    def _fwd_out(q, k, g, wv, wk, hs, o, T, NC: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 C: tl.constexpr):
        bh, row0, n = _ids(T, H)
        qq, r, m = _tile(q, row0, n, T, H, K, C)
        kk, _, _ = _tile(k, row0, n, T, H, K, C)
        gg = _vec(g, row0, n, T, H, C)
        G, eG, gl, D, lower, strict = _decays(gg, C)
        h = tl.load(_at(hs, bh, n, NC, K, V))
        U = tl.load(_at(wv, bh, n, NC, C, V)) - tl.dot(tl.load(_at(wk, bh, n, NC, C, K)), h)
        P = _intra(qq, kk, D, lower)
        out = tl.dot(eG[:, None] * qq, h) + tl.dot(P, U)
        tl.store(o + r[:, None] * V + tl.arange(0, V)[None, :], out, mask=m[:, None])

    @triton.jit
    def _bwd_prep(q, k, g, do, du, qdo, T, NC: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  C: tl.constexpr):
        """The state-free parts of two gradients: Pᵀ dO (of U) and (e^G∘q)ᵀ dO (of h0)."""
        bh, row0, n = _ids(T, H)
        qq, _, _ = _tile(q, row0, n, T, H, K, C)
        kk, _, _ = _tile(k, row0, n, T, H, K, C)
        dO, _, _ = _tile(do, row0, n, T, H, V, C)
        gg = _vec(g, row0, n, T, H, C)
        G, eG, gl, D, lower, strict = _decays(gg, C)
        P = _intra(qq, kk, D, lower)
        tl.store(_at(du, bh, n, NC, C, V), tl.dot(tl.trans(P), dO))
        tl.store(_at(qdo, bh, n, NC, K, V), tl.dot(tl.trans(eG[:, None] * qq), dO))

    @triton.jit
    def _bwd_walk(k, g, wk, du, qdo, dhT, dhs, dh0, T, NC: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  C: tl.constexpr):
        """From the last chunk back, with dh1 the gradient of the state leaving a chunk:
        dU = Pᵀ dO + (e^{G_C−G}∘k) dh1 (written over du), dh0 = (e^G∘q)ᵀ dO + e^{G_C} dh1 − Wkᵀ dU."""
        bh, row0, _ = _ids(T, H)
        dstate = tl.load(_state(dhT, bh, K, V))
        for i in range(NC):
            n = NC - 1 - i
            tl.store(_at(dhs, bh, n, NC, K, V), dstate)
            kk = _tile(k, row0, n, T, H, K, C)[0]
            G, gl = _cumulative(_vec(g, row0, n, T, H, C), C)
            dU = tl.load(_at(du, bh, n, NC, C, V)) + tl.dot(tl.exp(gl - G)[:, None] * kk, dstate)
            tl.store(_at(du, bh, n, NC, C, V), dU)
            dstate = (tl.load(_at(qdo, bh, n, NC, K, V)) + tl.exp(gl) * dstate
                      - tl.dot(tl.trans(tl.load(_at(wk, bh, n, NC, C, K))), dU))
        tl.store(_state(dh0, bh, K, V), dstate)

    @triton.jit
    def _bwd_dqk(q, k, g, hs, wv, wk, do, dhs, dq, dk, dg, T, NC: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
                 V: tl.constexpr, C: tl.constexpr):
        """Reverse-mode through o = (e^G∘q) h0 + P U and h1 = e^{G_C} h0 + (e^{G_C−G}∘k)ᵀ U of one
        chunk, given dO and dh1 (the gradient of the state leaving it): through P = lower(D∘qkᵀ),
        dq += (dP∘D) k and dk += (dP∘D)ᵀ q with dP = lower(dO Uᵀ). Every e^{G_i−G_j} passes its
        gradient E_ij to dG_i (+) and dG_j (−). Writes dq, and its parts of dk and dG (into dg)."""
        bh, row0, n = _ids(T, H)
        rows = tl.arange(0, C)
        qq, r, m = _tile(q, row0, n, T, H, K, C)
        kk, _, _ = _tile(k, row0, n, T, H, K, C)
        dO, _, _ = _tile(do, row0, n, T, H, V, C)
        gg = _vec(g, row0, n, T, H, C)
        G, eG, gl, D, lower, strict = _decays(gg, C)
        h = tl.load(_at(hs, bh, n, NC, K, V))
        dstate = tl.load(_at(dhs, bh, n, NC, K, V))
        U = tl.load(_at(wv, bh, n, NC, C, V)) - tl.dot(tl.load(_at(wk, bh, n, NC, C, K)), h)
        dGv = eG * tl.sum(dO * tl.dot(qq, h), 1)  # o's first term, e^{G_i} (q_i h0)
        dQ = eG[:, None] * tl.dot(dO, tl.trans(h))
        dP = tl.where(lower, tl.dot(dO, tl.trans(U)), 0.0)
        dQ += tl.dot(dP * D, kk)
        dK = tl.dot(tl.trans(dP * D), qq)
        E = dP * tl.dot(qq, tl.trans(kk)) * D
        dGv += tl.sum(E, 1) - tl.sum(E, 0)
        dec = tl.exp(gl - G)
        dKd = tl.dot(U, tl.trans(dstate))  # h1's second term
        dK += dec[:, None] * dKd
        ddec = tl.sum(kk * dKd, 1) * dec
        dgl = tl.sum(ddec, 0) + tl.exp(gl) * tl.sum(tl.sum(h * dstate, 1), 0)
        last = tl.minimum(C - 1, T - 1 - n * C)  # G_C is G at the chunk's last row inside T (rows past it add nothing)
        dGv += tl.where(rows == last, dgl, 0.0) - ddec
        ok = tl.arange(0, K)
        tl.store(dq + r[:, None] * K + ok[None, :], dQ, mask=m[:, None])
        tl.store(dk + r[:, None] * K + ok[None, :], dK, mask=m[:, None])
        tl.store(dg + r, dGv, mask=m)

    @triton.jit
    def _bwd_dwy(k, v, g, beta, hs, ts, wv, wk, dhs, du, dk, dv, dg, dbeta, T, NC: tl.constexpr, H: tl.constexpr,
                 K: tl.constexpr, V: tl.constexpr, C: tl.constexpr):
        """The rest of one chunk, given dU: through U = Wv − Wk h0 and W = T R (Rv = β∘v,
        Rk = β e^G∘k): dR = Tᵀ dW, dA = −strict(Tᵀ (dWv Wvᵀ + dWk Wkᵀ)); through A = β_i D_ij k_iᵀk_j:
        dS = dA∘β_i D, dk += (dS + dSᵀ) k. Adds `_bwd_dqk`'s parts of dk and dG; dg is the reverse
        cumulative sum of dG."""
        bh, row0, n = _ids(T, H)
        kk, r, m = _tile(k, row0, n, T, H, K, C)
        vv, _, _ = _tile(v, row0, n, T, H, V, C)
        gg, bb = _vec(g, row0, n, T, H, C), _vec(beta, row0, n, T, H, C)
        G, eG, gl, D, lower, strict = _decays(gg, C)
        h = tl.load(_at(hs, bh, n, NC, K, V))
        dU = tl.load(_at(du, bh, n, NC, C, V))
        Ti = tl.load(_at(ts, bh, n, NC, C, C))
        dWk = -tl.dot(dU, tl.trans(h))
        dRv = tl.dot(tl.trans(Ti), dU)
        dRk = tl.dot(tl.trans(Ti), dWk)
        dA = tl.where(strict, -tl.dot(tl.trans(Ti), tl.dot(dU, tl.trans(tl.load(_at(wv, bh, n, NC, C, V))))
                                      + tl.dot(dWk, tl.trans(tl.load(_at(wk, bh, n, NC, C, K))))), 0.0)
        dRkk = tl.sum(dRk * kk, 1)
        dB = tl.sum(dRv * vv, 1) + eG * dRkk
        dGv = bb * eG * dRkk
        S = tl.dot(kk, tl.trans(kk))
        dB += tl.sum(dA * D * S, 1)
        dS = dA * bb[:, None] * D
        E2 = dS * S
        dGv += tl.sum(E2, 1) - tl.sum(E2, 0)
        dK, _, _ = _tile(dk, row0, n, T, H, K, C)
        dK += (bb * eG)[:, None] * dRk + tl.dot(dS, kk) + tl.dot(tl.trans(dS), kk)
        dGv += tl.load(dg + r, mask=m, other=0.0)
        ok, ov = tl.arange(0, K), tl.arange(0, V)
        tl.store(dk + r[:, None] * K + ok[None, :], dK, mask=m[:, None])
        tl.store(dv + r[:, None] * V + ov[None, :], bb[:, None] * dRv, mask=m[:, None])
        tl.store(dg + r, tl.cumsum(dGv, 0, reverse=True), mask=m)
        tl.store(dbeta + r, dB, mask=m)


def _per_chunk(x: torch.Tensor, BH: int, NC: int, R: int, D: int) -> torch.Tensor:
    return x.new_empty(BH, NC, R, D)


@torch.library.custom_op("specpilot::gdn_chunk_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            h0: torch.Tensor, chunk: int, warps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                               torch.Tensor, torch.Tensor]:
    """→ (outputs, final state, and for the backward: the state entering every chunk, every chunk's
    (I + A)⁻¹, Wv and Wk). Float32, contiguous inputs."""
    B, T, H, K = k.shape
    V, C = v.shape[-1], chunk
    NC, BH = -(-T // C), B * H
    o, hT = q.new_empty(B, T, H, V), q.new_empty(B, H, K, V)
    hs, ts = _per_chunk(q, BH, NC, K, V), _per_chunk(q, BH, NC, C, C)
    wv, wk = _per_chunk(q, BH, NC, C, V), _per_chunk(q, BH, NC, C, K)
    sizes = dict(H=H, K=K, V=V, C=C, num_warps=warps)
    _fwd_prep[(BH, NC)](k, v, g, beta, ts, wv, wk, T, NC=NC, **sizes)
    _fwd_walk[(BH,)](k, g, h0, wv, wk, hs, hT, T, NC=NC, **sizes)
    _fwd_out[(BH, NC)](q, k, g, wv, wk, hs, o, T, NC=NC, **sizes)
    return o, hT, hs, ts, wv, wk


@_fwd_op.register_fake
def _(q, k, v, g, beta, h0, chunk, warps):
    B, T, H, K = k.shape
    V, C = v.shape[-1], chunk
    NC, BH = -(-T // C), B * H
    return (q.new_empty(B, T, H, V), q.new_empty(B, H, K, V), _per_chunk(q, BH, NC, K, V),
            _per_chunk(q, BH, NC, C, C), _per_chunk(q, BH, NC, C, V), _per_chunk(q, BH, NC, C, K))


@torch.library.custom_op("specpilot::gdn_chunk_bwd", mutates_args=())
def _bwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            hs: torch.Tensor, ts: torch.Tensor, wv: torch.Tensor, wk: torch.Tensor, do: torch.Tensor, dhT: torch.Tensor,
            chunk: int, warps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                             torch.Tensor]:
    B, T, H, K = k.shape
    V, C = v.shape[-1], chunk
    NC, BH = hs.shape[1], B * H
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dg, dbeta, dh0 = torch.empty_like(g), torch.empty_like(beta), torch.empty_like(dhT)
    du, qdo, dhs = _per_chunk(q, BH, NC, C, V), _per_chunk(q, BH, NC, K, V), _per_chunk(q, BH, NC, K, V)
    sizes = dict(H=H, K=K, V=V, C=C, num_warps=warps)
    _bwd_prep[(BH, NC)](q, k, g, do, du, qdo, T, NC=NC, **sizes)
    _bwd_walk[(BH,)](k, g, wk, du, qdo, dhT, dhs, dh0, T, NC=NC, **sizes)
    _bwd_dqk[(BH, NC)](q, k, g, hs, wv, wk, do, dhs, dq, dk, dg, T, NC=NC, **sizes)
    _bwd_dwy[(BH, NC)](k, v, g, beta, hs, ts, wv, wk, dhs, du, dk, dv, dg, dbeta, T, NC=NC, **sizes)
    return dq, dk, dv, dg, dbeta, dh0


@_bwd_op.register_fake
def _(q, k, v, g, beta, hs, ts, wv, wk, do, dhT, chunk, warps):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(g),
            torch.empty_like(beta), torch.empty_like(dhT))


def _setup(ctx, inputs, output):
    q, k, v, g, beta, _, chunk, warps = inputs
    ctx.save_for_backward(q, k, v, g, beta, *output[2:])
    ctx.chunk, ctx.warps = chunk, warps


def _backward(ctx, do, dhT, *_):
    q, k, v, g, beta, hs, ts, wv, wk = ctx.saved_tensors
    B, T, H, K = k.shape
    do = q.new_zeros(B, T, H, v.shape[-1]) if do is None else do.contiguous()
    dhT = q.new_zeros(B, H, K, v.shape[-1]) if dhT is None else dhT.contiguous()
    return (*_bwd_op(q, k, v, g, beta, hs, ts, wv, wk, do, dhT, ctx.chunk, ctx.warps), None, None)


_fwd_op.register_autograd(_backward, setup_context=_setup)

def chunked_gated_delta_rule(q, k, v, g, beta, h, chunk: int = 64, warps: int = WARPS):
    """q, k: [B, T, H, K]; v: [B, T, H, V]; g, beta: [B, T, H]; h: [B, H, K, V] → (outputs
    [B, T, H, V], final state), in float32, differentiable in every input. A custom op: compiled
    graphs call the kernels as they are."""
    if triton is None:
        raise RuntimeError("the fused delta rule needs Triton (pip install triton)")
    sizes = {"key head size": k.shape[-1], "value head size": v.shape[-1], "chunk": chunk}
    bad = {name: n for name, n in sizes.items() if n < 16 or n & (n - 1) or n > MAX_SIZE}
    if bad:
        raise ValueError(f"the fused delta rule needs powers of two from 16 to {MAX_SIZE} (larger ones need more "
                         f"shared memory than an H100 / H200 program has); got {bad}: use the torch form")
    o, hT, *_ = _fwd_op(*(t.float().contiguous() for t in (q, k, v, g, beta, h)), chunk, warps)
    return o, hT
