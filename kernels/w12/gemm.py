"""Few-row GEMMs that stream the weight once: `w12_linear` over W12 records, `bf16_linear` over a
plain bf16 matrix. Reference: reference.py (`w12_linear_ref`, `bf16_linear_ref`).

At 1–64 rows a linear layer is the read of its weight, so a program owns one tile of 128 output
channels and one run of K (a split) and streams that part of the weight in order; it computes the
transposed product out[:, tile]ᵀ = W_tile · xᵀ, so the weight is the dot's left operand (on sm_90
wgmma can take it from registers, where the W12 decode leaves it) and the rows of x, padded to BM ≥ 16,
are the narrow right one.

W12 decode. A step reads R records: their views as int16 (two inputs each: the even one in the low
byte) and their low bytes (two nibbles, the even input in the low one), so the even and the odd
inputs of a step come out as two [128, 32·R] tiles without any shuffle, each multiplied by its own
half of x (`x[:, k0::2]`, `x[:, k0+1::2]`). Escape slots hold code 0, which decodes to
dec0_n = 2^(lo_n − 127); a program adds, for each escape (n, k) given to it, x[m, k]·val − x[m, k]·dec0_n
as one more small dot: a [128, EB] matrix with val (and one with −dec0_n) in the escape's channel row
against x's escape columns [EB, BM]. Every product is exact in float32 (bf16 × bf16), as in the
main dot, so an escape costs what EB more inputs cost. The escape blocks of a tile are dealt
round-robin to its splits.

Split K. Where N/128 tiles cannot fill the GPU, `splits` programs share a tile: each writes its
float32 partial [128, M] to a workspace, takes a ticket from the tile's counter (atomic, acq_rel), and
the program that takes the last ticket sums the partials in split order, rounds once to bf16, writes
the rows below M and resets the counter for the next call. The sum's order is fixed, so equal inputs
give bit-identical outputs; the hot path allocates nothing once a `Workspace` is passed (CUDA graphs).

The view-only pass (`quick=True`, two-level verification's Q pass) reads the first 8 KB of each
record and decodes every slot with the low bits at their midpoint (format.quick), code 0 included,
so its escape correction subtracts that code's value instead.

Under TRITON_INTERPRET=1 the dots take float32 operands (bf16 dots are wrong in the interpreter);
compiled, bf16 operands with float32 accumulation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from .format import MIDPOINT, RECORD_BYTES, RECORD_K, RECORD_N, VIEW_BYTES, W12

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

MAX_BM = 64  # rows one launch takes at most; more rows are taken bm at a time
EB = 16  # escapes per correction dot
LAUNCHED = ("_w12_gemm", "_bf16_gemm")
# the kernels spell the record layout out (12288 bytes a record, its 8192 view bytes first, 64 inputs;
# the view-only pass's low nibbles 0x8)
assert (RECORD_BYTES, VIEW_BYTES, RECORD_K, RECORD_N, MIDPOINT) == (12288, 8192, 64, 128, 0x8)


# The W12 decode of four view pairs and their low bytes, two weights a 32-bit operation (`_decode_pairs`,
# whose docstring has the arithmetic; tests/unit/test_kernels_w12_gemm.py runs this text in a small PTX
# interpreter against format.decode). For view pair j ($4 + j): its low bytes ($6 bytes 2j, 2j + 1) spread into
# 16-bit lanes (l; h: their high nibbles); then its even views (bytes 0 and 2) give output j with the
# nibbles of l, its odd views (bytes 1 and 3) output 2 + j with those of h, each with lo7 = $7 + j.
def _decode_asm() -> str:
    lines = ["{", ".reg .b32 p, s, l, h;"]
    for j, low in enumerate(("0x4140", "0x4342")):
        lines += [f"prmt.b32 l, $6, 0, {low};", "shr.u32 h, l, 4;"]
        for nibble, view, dst in (("l", "0x4240", j), ("h", "0x4341", 2 + j)):
            lines += [f"prmt.b32 p, ${4 + j}, 0, {view};", "and.b32 s, p, 0x00800080;",
                      f"mad.lo.u32 p, p, 16, ${7 + j};", "mad.lo.u32 p, s, 240, p;",
                      f"lop3.b32 ${dst}, {nibble}, 0x000F000F, p, 0xEA;"]
    return "\n" + "\n".join([*lines, "}"]) + "\n"


DECODE_ASM = _decode_asm()


def available() -> bool:
    return triton is not None


@dataclass(frozen=True)
class Config:
    """Launch parameters: rows padded to `bm` (16, 32 or 64), `bk` inputs a step (a multiple of 64:
    bk / 64 records), `splits` programs per 128-channel tile, warps and software-pipelining stages."""

    bm: int
    bk: int
    splits: int
    warps: int = 4
    stages: int = 3


def heuristic(m: int, n: int, k: int, sms: int, decode: bool = False) -> Config:
    """A config for an [m, k] × [n, k]ᵀ product on a GPU of `sms` multiprocessors: enough splits that
    the programs fill about two of them a multiprocessor (each split ≥ 8 steps of 128 inputs), a
    128-input step; a kernel that decodes W12 records (`decode`: the full and the view-only pass)
    takes 64-input steps at 64 rows, where the H100 sweep found them faster on every decode shape
    (gate_up 90.1 against 104.5 µs; the bf16 kernel there is faster at 128)."""
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    tiles, steps = -(-n // RECORD_N), -(-k // 128)
    splits = 1
    while tiles * splits * 2 < 2 * sms and steps // (splits * 2) >= 8 and splits < 16:
        splits *= 2
    return Config(bm, 64 if decode and bm == 64 else 128, splits)


def _check(cfg: Config):
    if cfg.bm not in (16, 32, 64) or cfg.bk % RECORD_K or cfg.bk <= 0 or cfg.splits < 1 or cfg.warps not in (4, 8) \
            or cfg.stages < 1:
        raise ValueError(f"gemm config {cfg}: bm must be 16, 32 or 64, bk a positive multiple of {RECORD_K}, "
                         "splits ≥ 1, warps 4 or 8, stages ≥ 1")


class Workspace:
    """The split-K partials (float32) and per-tile tickets (int32, zero between calls) of one device,
    grown on demand. Pass one to every call of a captured CUDA graph, after one call outside capture
    (growing allocates)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.part = torch.empty(0, dtype=torch.float32, device=self.device)
        self.count = torch.zeros(0, dtype=torch.int32, device=self.device)

    def get(self, part_numel: int, tiles: int):
        if self.part.numel() < part_numel:
            self.part = torch.empty(part_numel, dtype=torch.float32, device=self.device)
        if self.count.numel() < tiles:
            self.count = torch.zeros(tiles, dtype=torch.int32, device=self.device)
        return self.part, self.count


_WORKSPACES: dict = {}


def workspace(device) -> Workspace:
    """The shared workspace of a device (calls on one stream may share it: the tickets are reset by
    each call's last programs)."""
    key = str(torch.device(device))
    if key not in _WORKSPACES:
        _WORKSPACES[key] = Workspace(device)
    return _WORKSPACES[key]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


if triton is not None:
    _DECODE_ASM = tl.constexpr(DECODE_ASM)  # a jitted function reads only constexpr globals

    @triton.jit
    def _finish(acc, out, part, count, t, s, M, N, stride_om, TILES, BM: tl.constexpr, S: tl.constexpr):
        """acc: this program's float32 [128, BM] of out[:, tile]ᵀ. Alone on its tile it writes it; in a
        split, the program with the last ticket sums all partials in split order and writes the sum."""
        c = tl.arange(0, 128)
        m = tl.arange(0, BM)
        rows_ok = (m < M)[None, :]
        n = t * 128 + c
        dst = out + m[None, :] * stride_om + n[:, None]
        ok = rows_ok & (n < N)[:, None]
        if S == 1:
            tl.store(dst, acc.to(tl.bfloat16), mask=ok)
        else:
            at = part + (t * 128 + c)[:, None] * BM + m[None, :]  # split s's block starts at s·TILES·128·BM
            tl.store(at + s * TILES * 128 * BM, acc, mask=rows_ok)
            tl.debug_barrier()  # every thread's partial is written before the ticket is taken
            ticket = tl.atomic_add(count + t, 1, sem="acq_rel")
            if ticket == S - 1:
                tot = tl.zeros((128, BM), tl.float32)
                for i in tl.static_range(S):
                    tot += tl.load(at + i * TILES * 128 * BM, mask=rows_ok, other=0.0, cache_modifier=".cg")
                tl.store(dst, tot.to(tl.bfloat16), mask=ok)
                tl.store(count + t, 0)

    @triton.jit
    def _dot(a, b, acc, INTERPRET: tl.constexpr):
        if INTERPRET:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        return tl.dot(a, b, acc)

    @triton.jit
    def _decode_pairs(v, b, lo7):
        """The even and the odd weights (bf16 bits, int16) of view pairs v (int16: even view in the low
        byte) with their low bytes b (uint8: even nibble low) and lo7 = lo << 7 (int16), two weights
        a 32-bit operation. Four elements an instance: the views spread to 16-bit lanes (prmt), then in
        each lane bits = view·16 + lo7 + (view & 0x80)·240 + low nibble, which is format.py's decode
        (the sign moved from bit 11 to bit 15) with no carry across lanes (the sum stays under 2^16).
        $0–$3 out, $4 $5 the views, $6 the low bytes, $7 $8 lo7."""
        return tl.inline_asm_elementwise(
            asm=_DECODE_ASM,
            constraints="=r,=r,=r,=r,r,r,r,r,r",
            args=[v, b, lo7], dtype=(tl.int16, tl.int16), is_pure=True, pack=4)

    @triton.jit
    def _w12_step(acc, r, tile16, tile8, in16, in8, lo7, xm32, m_ok, j, K, TK, R: tl.constexpr,
                  INTERPRET: tl.constexpr, QUICK: tl.constexpr):
        """acc + the product of records r … r + R − 1 of a tile with their inputs of x. A record's view,
        read as int16, is one contiguous [128, 32] block (even input in the low byte); its low bytes
        another (even input in the low nibble). QUICK: the views alone, the low bits at their
        midpoint (format.MIDPOINT in both nibbles), the low bytes never read."""
        for q in tl.static_range(R):
            ok = r + q < TK
            v = tl.load(tile16 + (r + q) * 6144 + in16, mask=ok, other=0)
            if QUICK:
                b = tl.full((128, 32), 0x88, tl.uint8)
            else:
                b = tl.load(tile8 + (r + q) * 12288 + in8, mask=ok, other=0)
            if INTERPRET:  # the interpreter runs no assembly: the same decode, one weight at a time
                v, b = v.to(tl.int32), b.to(tl.int32)
                ve, vo = v & 0xFF, (v >> 8) & 0xFF
                we = (((ve & 0x80) << 8) | (((ve & 0x7F) << 4) + lo7) | (b & 0xF)).to(tl.int16)
                wo = (((vo & 0x80) << 8) | (((vo & 0x7F) << 4) + lo7) | ((b >> 4) & 0xF)).to(tl.int16)
            else:
                we, wo = _decode_pairs(v, b, lo7.to(tl.int16))
            pair = (r + q) * 32 + j  # x's inputs 2·pair, 2·pair + 1 as one int32
            xx = tl.load(xm32 + pair[:, None], mask=m_ok & (2 * pair < K)[:, None], other=0)
            xe = (xx & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
            xo = (xx >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
            acc = _dot(we.to(tl.bfloat16, bitcast=True), xe, acc, INTERPRET)
            acc = _dot(wo.to(tl.bfloat16, bitcast=True), xo, acc, INTERPRET)
        return acc

    @triton.jit
    def _bf16_step(acc, k, wt, xt, n_ok, m_ok, kb, K, INTERPRET: tl.constexpr):
        """acc + the product of inputs k … k + BK of a tile of w with x."""
        k_ok = k + kb < K
        ww = tl.load(wt + k, mask=n_ok & k_ok[None, :], other=0.0)
        xx = tl.load(xt + k, mask=m_ok & k_ok[:, None], other=0.0)
        return _dot(ww, xx, acc, INTERPRET)

    @triton.jit
    def _w12_gemm(x, x32, rec16, rec8, lo, esc_idx, esc_val, tile_ptr, out, part, count,
                  M, N, K, TK, TILES, SPLIT_RECS, stride_xm, stride_om,
                  BM: tl.constexpr, R: tl.constexpr, S: tl.constexpr, EB: tl.constexpr, INTERPRET: tl.constexpr,
                  QUICK: tl.constexpr):
        """Program (tile t, split s): records [s·SPLIT_RECS, (s+1)·SPLIT_RECS) ∩ [0, TK) of tile t, R a
        step, then its share of the tile's escapes, then `_finish`."""
        t = tl.program_id(0)
        s = tl.program_id(1)
        c = tl.arange(0, 128)
        j = tl.arange(0, 32)  # even (or odd) inputs of a record
        m = tl.arange(0, BM)
        lo7 = (tl.load(lo + t * 128 + c).to(tl.int32) << 7)[:, None]
        in16 = c[:, None] * 32 + j[None, :]  # a record's views as int16 [128, 32]
        in8 = 8192 + c[:, None] * 32 + j[None, :]  # its low bytes [128, 32]
        tile16 = rec16 + t.to(tl.int64) * TK * 6144
        tile8 = rec8 + t.to(tl.int64) * TK * 12288
        xm = x + m[None, :] * stride_xm
        xm32 = x32 + m[None, :] * (stride_xm // 2)  # x's rows as int32 pairs (an even row stride)
        m_ok = (m < M)[None, :]
        r = s * SPLIT_RECS
        r1 = tl.minimum(r + SPLIT_RECS, TK)
        acc = tl.zeros((128, BM), tl.float32)
        if INTERPRET:  # the interpreter's scalars are 1-element arrays, which `range` does not take
            while r < r1:
                acc = _w12_step(acc, r, tile16, tile8, in16, in8, lo7, xm32, m_ok, j, K, TK, R, INTERPRET, QUICK)
                r += R
        else:
            for rr in range(r, r1, R):
                acc = _w12_step(acc, rr, tile16, tile8, in16, in8, lo7, xm32, m_ok, j, K, TK, R, INTERPRET, QUICK)
        # escapes: out[m, n] += x[m, k]·val − x[m, k]·dec0_n, EB at a time, blocks s, s + S, …
        p0 = tl.load(tile_ptr + t)
        p1 = tl.load(tile_ptr + t + 1)
        e = tl.arange(0, EB)
        # [128, 1]: code 0 of each channel. (Bitcast values are taken to float32 before any arithmetic:
        # the interpreter keeps a bitcast tensor's raw bits.)
        code0 = lo7
        if QUICK:  # a view-only pass decodes code 0 with the midpoint's low bits
            code0 = lo7 | 0x8
        dec0 = code0.to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32)
        q = p0 + s * EB
        while q < p1:
            ok = q + e < p1
            idx = tl.load(esc_idx + q + e, mask=ok, other=0)
            val = tl.load(esc_val + q + e, mask=ok, other=0).to(tl.bfloat16, bitcast=True).to(tl.float32)
            nn = idx // K
            kk = idx - nn * K
            mine = (c[:, None] == (nn - t * 128)[None, :]) & ok[None, :]  # [128, EB]
            xk = tl.load(xm + kk[:, None], mask=m_ok & ok[:, None], other=0.0)  # [EB, BM]: x[m, k_e]
            acc = _dot(tl.where(mine, val[None, :], 0.0).to(tl.bfloat16), xk, acc, INTERPRET)
            acc = _dot(tl.where(mine, -dec0, 0.0).to(tl.bfloat16), xk, acc, INTERPRET)
            q += S * EB
        _finish(acc, out, part, count, t, s, M, N, stride_om, TILES, BM, S)

    @triton.jit
    def _bf16_gemm(x, w, out, part, count, M, N, K, TK, TILES, SPLIT_RECS, stride_xm, stride_wn, stride_om,
                   BM: tl.constexpr, BK: tl.constexpr, S: tl.constexpr, INTERPRET: tl.constexpr):
        """Program (tile t, split s): inputs [s·SPLIT_RECS·64, (s+1)·SPLIT_RECS·64) ∩ [0, K) of the
        tile's 128 rows of w, BK a step, then `_finish`."""
        t = tl.program_id(0)
        s = tl.program_id(1)
        c = tl.arange(0, 128)
        kb = tl.arange(0, BK)
        m = tl.arange(0, BM)
        n = t * 128 + c
        wt = w + n.to(tl.int64)[:, None] * stride_wn + kb[None, :]
        xt = x + m[None, :] * stride_xm + kb[:, None]
        n_ok = (n < N)[:, None]
        m_ok = (m < M)[None, :]
        k = s * SPLIT_RECS * 64
        k1 = tl.minimum(k + SPLIT_RECS * 64, K)
        acc = tl.zeros((128, BM), tl.float32)
        if INTERPRET:
            while k < k1:
                acc = _bf16_step(acc, k, wt, xt, n_ok, m_ok, kb, K, INTERPRET)
                k += BK
        else:
            for kk in range(k, k1, BK):
                acc = _bf16_step(acc, kk, wt, xt, n_ok, m_ok, kb, K, INTERPRET)
        _finish(acc, out, part, count, t, s, M, N, stride_om, TILES, BM, S)


def _launch_shape(x: torch.Tensor, n: int, k: int, config: Config | None, decode: bool = False):
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x of shape {tuple(x.shape)} does not fit a weight of {k} inputs: expected [M, {k}]")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"x must be bfloat16, got {x.dtype}")
    cfg = config or heuristic(min(x.shape[0], MAX_BM), n, k, _sms(x.device), decode)
    _check(cfg)
    tk = -(-k // RECORD_K)
    steps = -(-tk // (cfg.bk // RECORD_K))
    per = -(-steps // cfg.splits) * (cfg.bk // RECORD_K)  # records a split: whole steps
    return cfg, tk, per, -(-tk // per)  # the splits that get records


def _run(x, out, n, bm, workspace_, launch):
    """Calls launch(x_rows, out_rows, workspace) for every bm rows of x (into out, or a new [M, N])."""
    m = x.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    elif out.shape != (m, n) or out.dtype != torch.bfloat16 or out.stride(1) != 1:
        raise ValueError(f"out must be a bfloat16 [{m}, {n}] tensor with unit column stride, got "
                         f"{out.dtype} {tuple(out.shape)} strides {out.stride()}")
    for r in range(0, m, bm):
        launch(x[r:r + bm], out[r:r + bm], workspace_ or workspace(x.device))
    return out


def w12_linear(x: torch.Tensor, w: W12, config: Config | None = None, out: torch.Tensor | None = None,
               ws: Workspace | None = None, quick: bool = False) -> torch.Tensor:
    """x [M, K] bf16 @ unpack(w)ᵀ → [M, N] bf16 (float32 accumulation, one rounding); with `quick`,
    x @ format.quick(w)ᵀ, reading only the records' views (two-level verification's Q pass)."""
    if triton is None:
        raise RuntimeError("w12_linear needs Triton (pip install triton)")
    n, k = w.shape
    cfg, tk, per, splits = _launch_shape(x, n, k, config, decode=True)
    tiles = w.records.shape[0]
    if k % 2 or x.stride(1) != 1 or x.stride(0) % 2 or x.data_ptr() % 4:  # x is also read as int32 pairs
        xp = torch.zeros(x.shape[0], k + k % 2, dtype=x.dtype, device=x.device)
        xp[:, :k] = x
        x = xp
    rec8 = w.records
    rec16 = rec8.view(torch.int16)

    def launch(xr, outr, wsp):
        part, count = wsp.get(splits * tiles * RECORD_N * cfg.bm, tiles)
        _w12_gemm[(tiles, splits)](xr, xr.view(torch.int32), rec16, rec8, w.lo, w.esc_idx, w.esc_val, w.tile_ptr, outr, part, count,
                                   xr.shape[0], n, k, tk, tiles, per, xr.stride(0), outr.stride(0),
                                   BM=cfg.bm, R=cfg.bk // RECORD_K, S=splits, EB=EB, INTERPRET=_interpreting(), QUICK=quick,
                                   num_warps=cfg.warps, num_stages=cfg.stages)

    return _run(x, out, n, cfg.bm, ws, launch)


def bf16_linear(x: torch.Tensor, w: torch.Tensor, config: Config | None = None, out: torch.Tensor | None = None,
                ws: Workspace | None = None) -> torch.Tensor:
    """x [M, K] bf16 @ w [N, K]ᵀ bf16 → [M, N] bf16 (float32 accumulation, one rounding)."""
    if triton is None:
        raise RuntimeError("bf16_linear needs Triton (pip install triton)")
    if w.dim() != 2 or w.dtype != torch.bfloat16 or w.stride(1) != 1:
        raise ValueError(f"w must be a bfloat16 [N, K] matrix with unit column stride, got {w.dtype} "
                         f"{tuple(w.shape)} strides {w.stride()}")
    n, k = w.shape
    cfg, tk, per, splits = _launch_shape(x, n, k, config)
    tiles = -(-n // RECORD_N)
    if x.stride(1) != 1:
        x = x.contiguous()

    def launch(xr, outr, wsp):
        part, count = wsp.get(splits * tiles * RECORD_N * cfg.bm, tiles)
        _bf16_gemm[(tiles, splits)](xr, w, outr, part, count, xr.shape[0], n, k, tk, tiles, per, xr.stride(0),
                                    w.stride(0), outr.stride(0), BM=cfg.bm, BK=cfg.bk, S=splits,
                                    INTERPRET=_interpreting(), num_warps=cfg.warps, num_stages=cfg.stages)

    return _run(x, out, n, cfg.bm, ws, launch)


def configs(m: int, n: int, k: int, sms: int, decode: bool = False) -> list[Config]:
    """A few configs around the heuristic's, for a sweep: splits halved and doubled, 64-, 128- and
    256-input steps (the latter in 8 warps, 2 stages: shared memory), 8 warps, 4 and 5 stages, and
    twice the splits with 4 stages (more bytes in flight a multiprocessor)."""
    base = heuristic(m, n, k, sms, decode)
    out = [base, replace(base, splits=max(1, base.splits // 2)), replace(base, splits=base.splits * 2),
           replace(base, bk=64), replace(base, bk=128), replace(base, bk=256, warps=8, stages=2),
           replace(base, stages=4), replace(base, warps=8),
           replace(base, stages=5), replace(base, splits=base.splits * 2, stages=4)]
    return list(dict.fromkeys(out))
